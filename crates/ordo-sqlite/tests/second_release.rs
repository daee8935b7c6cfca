//! A file pair of the second release, built by that release's schema (its
//! tables, header and meta rows, copied below), mid-flight: one event
//! applied, one committed but not yet delivered, one quarantined. This
//! release opens both unchanged in meaning (producer `default`, a store
//! identity given at the first open, the old rows' delivering store
//! unknown) and goes on relaying and applying (PROTOCOL.md section 12).

use std::path::Path;

use ordo_core::envelope::EventType;
use ordo_core::{
    process_all, relay, ApplyContext, ApplyHandler, ConsumerOps, Envelope, EventId, FlowId,
    InboxStatus, ProducerName, ProducerOps, Receipt, Receive, RelayOptions, SchemaVersion, Seq,
    StoreError, SystemClock, Verdict, CONFLICT_REASON,
};
use ordo_sqlite::rusqlite::{params, Connection};
use ordo_sqlite::{ConsumerDb, ProducerDb, Schema, SCHEMA_VERSION};
use serde_json::json;

/// The second release's producer tables (schema version 2).
const PRODUCER_V2: &str = "
CREATE TABLE outbox (
    position INTEGER PRIMARY KEY, event_id TEXT NOT NULL UNIQUE, flow_id TEXT NOT NULL,
    seq INTEGER NOT NULL CHECK (seq >= 1), schema_version INTEGER NOT NULL, type TEXT NOT NULL,
    body TEXT NOT NULL, created_at_ms INTEGER NOT NULL,
    accepted INTEGER NOT NULL DEFAULT 0 CHECK (accepted IN (0, 1)), accepted_at_ms INTEGER,
    quarantined INTEGER NOT NULL DEFAULT 0 CHECK (quarantined IN (0, 1)), quarantine_reason TEXT,
    attempts INTEGER NOT NULL DEFAULT 0, last_outcome TEXT, last_error TEXT,
    next_attempt_at_ms INTEGER NOT NULL DEFAULT 0,
    UNIQUE (flow_id, seq), CHECK (NOT (accepted = 1 AND quarantined = 1)));
CREATE INDEX outbox_unaccepted ON outbox (position) WHERE accepted = 0;
CREATE TABLE outbox_head (
    flow_id TEXT PRIMARY KEY, last_seq INTEGER NOT NULL CHECK (last_seq >= 1),
    relay_seq INTEGER, relay_due_ms INTEGER NOT NULL DEFAULT 0,
    relay_turn INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE INDEX outbox_head_relay ON outbox_head (relay_turn, flow_id) WHERE relay_seq IS NOT NULL;
INSERT INTO ordo_meta (key, value) VALUES ('relay_turn', 0);
";

/// The second release's consumer tables (schema version 2).
const CONSUMER_V2: &str = "
CREATE TABLE inbox (
    event_id TEXT PRIMARY KEY, flow_id TEXT NOT NULL, seq INTEGER NOT NULL CHECK (seq >= 1),
    schema_version INTEGER NOT NULL, type TEXT NOT NULL, body TEXT NOT NULL,
    body_hash TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status = 'pending' OR status = 'applied'
                                OR status = 'blocked' OR status = 'skipped'),
    reason TEXT, detail TEXT, received_at_ms INTEGER NOT NULL, settled_at_ms INTEGER,
    UNIQUE (flow_id, seq), CHECK ((status = 'blocked') = (reason IS NOT NULL))) WITHOUT ROWID;
CREATE INDEX inbox_pending ON inbox (flow_id) WHERE status = 'pending';
CREATE INDEX inbox_blocked ON inbox (flow_id) WHERE status = 'blocked';
CREATE TABLE inbox_cursor (
    flow_id TEXT PRIMARY KEY, applied_seq INTEGER NOT NULL CHECK (applied_seq >= 1)) WITHOUT ROWID;
CREATE TABLE inbox_fingerprint (
    flow_id TEXT NOT NULL, seq INTEGER NOT NULL, event_id TEXT NOT NULL UNIQUE,
    body_hash BLOB NOT NULL CHECK (length(body_hash) = 32),
    status TEXT NOT NULL CHECK (status IN ('applied', 'skipped')),
    PRIMARY KEY (flow_id, seq)) WITHOUT ROWID;
CREATE TABLE inbox_watermark (flow_id TEXT PRIMARY KEY, pruned_seq INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE repair_log (
    id INTEGER PRIMARY KEY, action TEXT NOT NULL, flow_id TEXT NOT NULL, seq INTEGER NOT NULL,
    event_id TEXT NOT NULL, reason TEXT NOT NULL, decided_by TEXT NOT NULL, at_ms INTEGER NOT NULL);
";

/// The `application_id` ordo writes in the header of every file it creates.
const APPLICATION_ID: i32 = 0x6F72_646F;

/// A file as the second release created it for `role` in the domain
/// `ledger`: its header, its meta rows, then its `tables`.
fn second_release_file(path: &Path, role: &str, tables: &str) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
        .unwrap();
    conn.execute_batch(&format!(
        "CREATE TABLE ordo_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
         INSERT INTO ordo_meta (key, value) VALUES ('role', '{role}'),
             ('domain', 'ledger'), ('domain_version', '0');
         PRAGMA user_version = 2; PRAGMA application_id = {APPLICATION_ID};"
    ))
    .unwrap();
    conn.execute_batch(tables).unwrap();
    conn
}

fn event(flow: &str, seq: i64, amount: i64) -> Envelope {
    let flow_id = FlowId::new(flow).unwrap();
    let seq = Seq::new(seq).unwrap();
    Envelope {
        event_id: EventId::for_seq(&flow_id, seq),
        flow_id,
        seq,
        schema_version: SchemaVersion::V1,
        event_type: EventType::new("placed").unwrap(),
        payload: json!({ "amount": amount }).as_object().unwrap().clone(),
        producer: ProducerName::default(),
        headers: Default::default(),
    }
}

/// Writes the producer's outbox row and head for `e` as the second release
/// did, with its custody marks.
fn outbox_row(conn: &Connection, e: &Envelope, accepted: bool, quarantined: bool) {
    conn.execute(
        "INSERT INTO outbox (event_id, flow_id, seq, schema_version, type, body, created_at_ms,
             accepted, quarantined, quarantine_reason, attempts, last_outcome)
         VALUES (?1, ?2, ?3, 1, 'placed', ?4, 1000, ?5, ?6, ?7, ?8, ?9)",
        params![
            e.event_id.as_str(),
            e.flow_id.as_str(),
            e.seq.get(),
            e.stored_text(),
            accepted,
            quarantined,
            quarantined.then_some(CONFLICT_REASON),
            i64::from(accepted || quarantined),
            (accepted || quarantined).then_some(if accepted { "accepted" } else { "conflict" }),
        ],
    )
    .unwrap();
    let relay_seq = (!accepted && !quarantined).then_some(e.seq.get());
    conn.execute(
        "INSERT INTO outbox_head (flow_id, last_seq, relay_seq) VALUES (?1, ?2, ?3)
         ON CONFLICT (flow_id) DO UPDATE SET last_seq = excluded.last_seq,
             relay_seq = coalesce(outbox_head.relay_seq, excluded.relay_seq)",
        params![e.flow_id.as_str(), e.seq.get(), relay_seq],
    )
    .unwrap();
}

/// Writes the consumer's inbox row for `e` as the second release did.
fn inbox_row(conn: &Connection, e: &Envelope, status: &str) {
    conn.execute(
        "INSERT INTO inbox (event_id, flow_id, seq, schema_version, type, body, body_hash,
             status, received_at_ms, settled_at_ms)
         VALUES (?1, ?2, ?3, 1, 'placed', ?4, ?5, ?6, 1000, ?7)",
        params![
            e.event_id.as_str(),
            e.flow_id.as_str(),
            e.seq.get(),
            e.stored_text(),
            e.body_hash().as_str(),
            status,
            (status == "applied").then_some(1000),
        ],
    )
    .unwrap();
}

/// The ledger's handler: applies every event, writing nothing of its own.
struct Counting(Vec<String>);

impl ApplyHandler<Connection> for Counting {
    fn apply(
        &mut self,
        _: &mut ApplyContext<'_, Connection>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        self.0.push(event.event_id.as_str().to_owned());
        Ok(Verdict::Apply)
    }
}

#[test]
fn a_second_release_file_pair_opens_unchanged_and_goes_on_relaying_and_applying() {
    let dir = tempfile::tempdir().unwrap();
    let (p, c) = (dir.path().join("p.db"), dir.path().join("c.db"));
    let (f1, f2, g1) = (event("f", 1, 1), event("f", 2, 2), event("g", 1, 3));
    let held = Envelope {
        payload: json!({ "amount": 30 }).as_object().unwrap().clone(),
        ..g1.clone()
    };
    {
        let producer = second_release_file(&p, "producer", PRODUCER_V2);
        outbox_row(&producer, &f1, true, false);
        outbox_row(&producer, &g1, false, true);
        outbox_row(&producer, &f2, false, false);
        let consumer = second_release_file(&c, "consumer", CONSUMER_V2);
        inbox_row(&consumer, &f1, "applied");
        inbox_row(&consumer, &held, "pending");
        consumer
            .execute(
                "INSERT INTO inbox_cursor (flow_id, applied_seq) VALUES ('f', 1)",
                [],
            )
            .unwrap();
    }
    let ledger = Schema::new("ledger").unwrap();
    let mut producer = ProducerDb::open(&p, &ledger).unwrap();
    let mut consumer = ConsumerDb::open(&c, &ledger).unwrap();
    let version: i64 = (producer.connection())
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    assert_eq!(producer.producer_name(), &ProducerName::default());
    assert_ne!(producer.store_id(), consumer.store_id());
    let outbox = producer.outbox_entries(false, 10).unwrap();
    let marks: Vec<(&str, bool, bool)> = (outbox.iter())
        .map(|e| (e.envelope.event_id.as_str(), e.accepted, e.quarantined))
        .collect();
    assert_eq!(
        marks,
        [
            ("f-1", true, false),
            ("g-1", false, true),
            ("f-2", false, false)
        ]
    );
    // One destination, default, holding those marks.
    let destinations = producer.destinations(0).unwrap();
    let names: Vec<&str> = destinations.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["default"]);
    assert_eq!(destinations[0].status.backlog, 2);
    assert_eq!(destinations[0].status.quarantined, 1);
    for entry in &outbox {
        let custody: Vec<(&str, bool, bool)> = (entry.destinations.iter())
            .map(|c| (c.destination.as_str(), c.accepted, c.quarantined))
            .collect();
        assert_eq!(custody, [("default", entry.accepted, entry.quarantined)]);
    }
    assert_eq!(outbox[1].quarantine_reason.as_deref(), Some("conflict"));
    assert_eq!(
        outbox[1].quarantine_detail.as_deref(),
        Some(CONFLICT_REASON)
    );

    let report = relay(
        &mut producer,
        &mut consumer,
        &RelayOptions::default(),
        &SystemClock,
    )
    .unwrap();
    let delivered: Vec<(&str, Receipt)> = (report.deliveries.iter())
        .map(|d| (d.event_id.as_str(), d.receipt))
        .collect();
    assert_eq!(delivered, [("f-2", Receipt::Accepted)], "{report:?}");
    let mut handler = Counting(Vec::new());
    process_all(&mut consumer, None, &mut handler, 64).unwrap();
    assert_eq!(
        handler.0,
        ["f-2", "g-1"],
        "the new f-2 and the held g-1, in flow order"
    );
    let statuses: Vec<(String, InboxStatus)> = (consumer.inbox().unwrap().into_iter())
        .map(|r| (r.envelope.event_id.as_str().to_owned(), r.status))
        .collect();
    assert_eq!(
        statuses,
        [
            ("f-1".to_owned(), InboxStatus::Applied),
            ("f-2".to_owned(), InboxStatus::Applied),
            ("g-1".to_owned(), InboxStatus::Applied),
        ]
    );
    // A row stored before this release has no known delivering store: a
    // collision with it from the producer is an ordinary conflict, never
    // `producer_rewound`.
    let again = consumer
        .receive_from(Some(producer.store_id()), std::slice::from_ref(&g1))
        .unwrap();
    assert_eq!(again[0].receipt, Receipt::Conflict);
    assert_eq!(consumer.receive(&f1).unwrap(), Receipt::Duplicate);
}
