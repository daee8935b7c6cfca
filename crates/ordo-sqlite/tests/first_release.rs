//! A file pair of the first release (schema version 1, the reservation
//! domain built in), built by that release's own statements (its header,
//! meta rows and tables, copied below as it ran them on a new file),
//! mid-flight: one event accepted and applied, one committed but not yet
//! delivered, one quarantined by a conflict, and one quarantined whose
//! head `first-pending` handed over again and failed. This release opens
//! both unchanged in meaning (producer `default`, a store identity given at
//! the first open, one destination `default` holding the old custody marks,
//! the old inbox rows' delivering store unknown) and goes on relaying and
//! applying (PROTOCOL.md section 12).

use std::path::Path;

use ordo_core::destination::DestinationStart;
use ordo_core::envelope::EventType;
use ordo_core::ops::InboxScope;
use ordo_core::{
    relay, Clock, ConsumerOps, Envelope, EventId, FlowId, InboxStatus, ProducerName, ProducerOps,
    Receipt, Receive, RelayOptions, SchemaVersion, Seq, StoreId, SystemClock,
};
use ordo_reservation::{FlowState, ReservationConsumer, ReservationProducer};
use ordo_sqlite::rusqlite::{params, Connection};
use ordo_sqlite::{ConsumerDb, ProducerDb, SCHEMA_VERSION};
use serde_json::json;

/// The first release's producer tables, as it created them in a new file
/// (after the header [`first_release_file`] writes).
const PRODUCER_V1: &str = "
CREATE TABLE IF NOT EXISTS outbox (
    position           INTEGER PRIMARY KEY,
    event_id           TEXT    NOT NULL UNIQUE,
    flow_id            TEXT    NOT NULL,
    seq                INTEGER NOT NULL CHECK (seq >= 1),
    schema_version     INTEGER NOT NULL,
    type               TEXT    NOT NULL,
    body               TEXT    NOT NULL,
    created_at_ms      INTEGER NOT NULL,
    accepted           INTEGER NOT NULL DEFAULT 0 CHECK (accepted IN (0, 1)),
    accepted_at_ms     INTEGER,
    quarantined        INTEGER NOT NULL DEFAULT 0 CHECK (quarantined IN (0, 1)),
    quarantine_reason  TEXT,
    attempts           INTEGER NOT NULL DEFAULT 0,
    last_outcome       TEXT,
    last_error         TEXT,
    next_attempt_at_ms INTEGER NOT NULL DEFAULT 0,
    UNIQUE (flow_id, seq),
    CHECK (NOT (accepted = 1 AND quarantined = 1))
);
CREATE INDEX IF NOT EXISTS outbox_unaccepted ON outbox (position) WHERE accepted = 0;
CREATE TABLE IF NOT EXISTS outbox_head (
    flow_id      TEXT    PRIMARY KEY,
    last_seq     INTEGER NOT NULL CHECK (last_seq >= 1),
    relay_seq    INTEGER,
    relay_due_ms INTEGER NOT NULL DEFAULT 0,
    relay_turn   INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS outbox_head_relay ON outbox_head (relay_turn, flow_id) WHERE relay_seq IS NOT NULL;
CREATE TABLE IF NOT EXISTS flow (
    flow_id  TEXT    PRIMARY KEY,
    state    TEXT    NOT NULL,
    quantity INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO ordo_meta (key, value) VALUES ('relay_turn', 0);
";

/// The first release's consumer tables, as it created them in a new file
/// (after the header [`first_release_file`] writes).
const CONSUMER_V1: &str = "
CREATE TABLE IF NOT EXISTS inbox (
    event_id       TEXT    PRIMARY KEY,
    flow_id        TEXT    NOT NULL,
    seq            INTEGER NOT NULL CHECK (seq >= 1),
    schema_version INTEGER NOT NULL,
    type           TEXT    NOT NULL,
    body           TEXT    NOT NULL,
    body_hash      TEXT    NOT NULL,
    -- Spelled as comparisons: SQLite evaluates an IN list of more than two
    -- constants through a temporary index built at every insert and update.
    status         TEXT    NOT NULL CHECK (status = 'pending' OR status = 'applied'
                                           OR status = 'blocked' OR status = 'skipped'),
    reason         TEXT,
    received_at_ms INTEGER NOT NULL,
    settled_at_ms  INTEGER,
    UNIQUE (flow_id, seq),
    CHECK ((status = 'blocked') = (reason IS NOT NULL))
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS inbox_pending ON inbox (flow_id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS inbox_blocked ON inbox (flow_id) WHERE status = 'blocked';
CREATE TABLE IF NOT EXISTS inbox_cursor (
    flow_id     TEXT    PRIMARY KEY,
    applied_seq INTEGER NOT NULL CHECK (applied_seq >= 1)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS projection (
    flow_id     TEXT    PRIMARY KEY,
    state       TEXT    NOT NULL,
    quantity    INTEGER NOT NULL,
    applied_seq INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inbox_fingerprint (
    flow_id   TEXT    NOT NULL,
    seq       INTEGER NOT NULL,
    event_id  TEXT    NOT NULL UNIQUE,
    body_hash BLOB    NOT NULL CHECK (length(body_hash) = 32),
    status    TEXT    NOT NULL CHECK (status IN ('applied', 'skipped')),
    PRIMARY KEY (flow_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inbox_watermark (
    flow_id    TEXT    PRIMARY KEY,
    pruned_seq INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS repair_log (
    id         INTEGER PRIMARY KEY,
    action     TEXT    NOT NULL,
    flow_id    TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    event_id   TEXT    NOT NULL,
    reason     TEXT    NOT NULL,
    decided_by TEXT    NOT NULL,
    at_ms      INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS repair_log_append_only_update BEFORE UPDATE ON repair_log
BEGIN SELECT RAISE(ABORT, 'repair_log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS repair_log_append_only_delete BEFORE DELETE ON repair_log
BEGIN SELECT RAISE(ABORT, 'repair_log is append-only'); END;
-- One effect per (flow_id, seq); its event id is the inbox's at that place,
-- which no other place can hold (inbox and fingerprint keys), so a second
-- index on it would only cost a page at every apply.
CREATE TABLE IF NOT EXISTS effect (
    flow_id  TEXT    NOT NULL,
    seq      INTEGER NOT NULL,
    event_id TEXT    NOT NULL,
    PRIMARY KEY (flow_id, seq)
) WITHOUT ROWID;
";

/// The text the first release recorded as the reason of a conflict's
/// quarantine.
const FIRST_RELEASE_CONFLICT_REASON: &str =
    "conflict: the consumer holds a different body under this event id, or another event id at this (flow_id, seq)";

/// A file as the first release created it for `role`: its meta table with
/// the role alone, `user_version` 1 and no `application_id`, then its
/// `tables`.
fn first_release_file(path: &Path, role: &str, tables: &str) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
        .unwrap();
    conn.execute_batch(&format!(
        "CREATE TABLE ordo_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
         INSERT INTO ordo_meta (key, value) VALUES ('role', '{role}');
         PRAGMA user_version = 1;"
    ))
    .unwrap();
    conn.execute_batch(tables).unwrap();
    conn
}

/// A reservation event as the first release wrote it (schema 1).
fn event(flow: &str, seq: i64, kind: &str, amount: i64) -> Envelope {
    let flow_id = FlowId::new(flow).unwrap();
    let seq = Seq::new(seq).unwrap();
    Envelope {
        event_id: EventId::for_seq(&flow_id, seq),
        flow_id,
        seq,
        schema_version: SchemaVersion::V1,
        event_type: EventType::new(kind).unwrap(),
        payload: json!({ "amount": amount }).as_object().unwrap().clone(),
        producer: ProducerName::default(),
        headers: Default::default(),
    }
}

/// The delivery bookkeeping the first release left on an outbox row.
#[derive(Clone, Copy)]
enum Marks {
    /// Accepted by the consumer at its first attempt.
    Accepted,
    /// Committed, never handed over.
    Pending,
    /// Quarantined by a conflict receipt.
    Conflict,
    /// Quarantined by a conflict receipt, then handed over once more by
    /// the `first-pending` policy (which hands over the oldest unaccepted
    /// event, quarantined or not), and that delivery failed.
    ConflictThenFailed,
}

/// Writes the producer's outbox row and head for `e` as the first release
/// did, with its delivery bookkeeping.
fn outbox_row(conn: &Connection, e: &Envelope, marks: Marks) {
    let (accepted, quarantined, attempts, outcome, error) = match marks {
        Marks::Accepted => (true, false, 1, Some("accepted"), None),
        Marks::Pending => (false, false, 0, None, None),
        Marks::Conflict => (false, true, 1, Some("conflict"), None),
        Marks::ConflictThenFailed => (false, true, 2, Some("error"), Some("consumer busy")),
    };
    conn.execute(
        "INSERT INTO outbox (event_id, flow_id, seq, schema_version, type, body, created_at_ms,
             accepted, accepted_at_ms, quarantined, quarantine_reason, attempts, last_outcome,
             last_error)
         VALUES (?1, ?2, ?3, 1, ?4, ?5, 1000, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            e.event_id.as_str(),
            e.flow_id.as_str(),
            e.seq.get(),
            e.event_type.as_str(),
            e.stored_text(),
            accepted,
            accepted.then_some(1_001),
            quarantined,
            quarantined.then_some(FIRST_RELEASE_CONFLICT_REASON),
            attempts,
            outcome,
            error,
        ],
    )
    .unwrap();
    // The head's relay seq is the flow's lowest seq neither accepted nor
    // quarantined (none: NULL).
    let relay_seq = (!accepted && !quarantined).then_some(e.seq.get());
    conn.execute(
        "INSERT INTO outbox_head (flow_id, last_seq, relay_seq) VALUES (?1, ?2, ?3)
         ON CONFLICT (flow_id) DO UPDATE SET last_seq = excluded.last_seq,
             relay_seq = coalesce(outbox_head.relay_seq, excluded.relay_seq)",
        params![e.flow_id.as_str(), e.seq.get(), relay_seq],
    )
    .unwrap();
}

/// Writes the consumer's inbox row for `e` as the first release did.
fn inbox_row(conn: &Connection, e: &Envelope, status: &str) {
    conn.execute(
        "INSERT INTO inbox (event_id, flow_id, seq, schema_version, type, body, body_hash,
             status, received_at_ms, settled_at_ms)
         VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6, ?7, 1000, ?8)",
        params![
            e.event_id.as_str(),
            e.flow_id.as_str(),
            e.seq.get(),
            e.event_type.as_str(),
            e.stored_text(),
            e.body_hash().as_str(),
            status,
            (status == "applied").then_some(1_001),
        ],
    )
    .unwrap();
}

/// The identity a file records in `ordo_meta`.
fn recorded_store_id(path: &Path) -> String {
    Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT value FROM ordo_meta WHERE key = 'store_id'",
            [],
            |row| row.get(0),
        )
        .unwrap()
}

#[test]
fn a_first_release_file_pair_opens_unchanged_and_goes_on_relaying_and_applying() {
    let dir = tempfile::tempdir().unwrap();
    let (p, c) = (
        dir.path().join("producer.db"),
        dir.path().join("consumer.db"),
    );
    let r1_1 = event("r1", 1, "reserved", 5);
    let r1_2 = event("r1", 2, "confirmed", 5);
    let r2_1 = event("r2", 1, "reserved", 7);
    let r3_1 = event("r3", 1, "reserved", 8);
    // What the consumer holds in r2's and r3's places: other bodies.
    let held_r2 = event("r2", 1, "reserved", 3);
    let held_r3 = event("r3", 1, "reserved", 4);
    {
        let producer = first_release_file(&p, "producer", PRODUCER_V1);
        outbox_row(&producer, &r1_1, Marks::Accepted);
        outbox_row(&producer, &r2_1, Marks::Conflict);
        outbox_row(&producer, &r3_1, Marks::ConflictThenFailed);
        outbox_row(&producer, &r1_2, Marks::Pending);
        producer
            .execute_batch(
                "INSERT INTO flow VALUES ('r1', 'confirmed', 5), ('r2', 'reserved', 7),
                     ('r3', 'reserved', 8);",
            )
            .unwrap();
        let consumer = first_release_file(&c, "consumer", CONSUMER_V1);
        inbox_row(&consumer, &r1_1, "applied");
        inbox_row(&consumer, &held_r2, "pending");
        inbox_row(&consumer, &held_r3, "pending");
        consumer
            .execute_batch(
                "INSERT INTO inbox_cursor VALUES ('r1', 1);
                 INSERT INTO projection VALUES ('r1', 'reserved', 5, 1);
                 INSERT INTO effect VALUES ('r1', 1, 'r1-1');",
            )
            .unwrap();
    }

    let mut producer = ProducerDb::open(&p, &ordo_reservation::producer_schema()).unwrap();
    let mut consumer = ConsumerDb::open(&c, &ordo_reservation::consumer_schema()).unwrap();
    for db in [producer.connection(), consumer.connection()] {
        let version: i64 = db
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
    }
    assert_eq!(producer.domain(), "reservation");
    assert_eq!(consumer.domain(), "reservation");

    // Named `default`, each store given an identity of its own, recorded.
    assert_eq!(producer.producer_name(), &ProducerName::default());
    assert_eq!(producer.producer_name().as_str(), "default");
    let (producer_id, consumer_id) = (producer.store_id().clone(), consumer.store_id().clone());
    assert_ne!(producer_id, consumer_id);
    for (path, id) in [(&p, &producer_id), (&c, &consumer_id)] {
        let recorded = recorded_store_id(path);
        assert_eq!(recorded.len(), 32, "{recorded}");
        assert!(
            recorded
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
            "{recorded}"
        );
        assert_eq!(StoreId::new(recorded).unwrap(), *id);
    }

    // The old custody marks, held by one destination, `default`.
    let outbox = producer.outbox_entries(false, 10).unwrap();
    let marks: Vec<(&str, bool, bool, u64)> = (outbox.iter())
        .map(|e| {
            let id = e.envelope.event_id.as_str();
            (id, e.accepted, e.quarantined, e.attempts)
        })
        .collect();
    assert_eq!(
        marks,
        [
            ("r1-1", true, false, 1),
            ("r2-1", false, true, 1),
            ("r3-1", false, true, 2),
            ("r1-2", false, false, 0)
        ]
    );
    assert_eq!(outbox[0].accepted_at_ms, Some(1_001));
    let destinations = producer.destinations(2_000).unwrap();
    let names: Vec<&str> = destinations.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["default"]);
    let default = &destinations[0];
    assert_eq!(default.from, DestinationStart::Start);
    assert_eq!(default.consumer_store_id, None, "no delivery since");
    assert_eq!(
        (
            default.status.backlog,
            default.status.quarantined,
            default.status.rewound
        ),
        (3, 2, 0),
        "{default:?}"
    );
    for entry in &outbox {
        let custody: Vec<(&str, bool, bool)> = (entry.destinations.iter())
            .map(|c| (c.destination.as_str(), c.accepted, c.quarantined))
            .collect();
        assert_eq!(custody, [("default", entry.accepted, entry.quarantined)]);
    }
    // A quarantine's reason is now a code, the old text its detail, even
    // where the last outcome was a failed delivery after the quarantine.
    for entry in &outbox[1..3] {
        assert_eq!(
            (
                entry.quarantine_reason.as_deref(),
                entry.quarantine_detail.as_deref()
            ),
            (Some("conflict"), Some(FIRST_RELEASE_CONFLICT_REASON)),
            "{entry:?}"
        );
    }
    assert_eq!(
        (
            outbox[2].last_outcome.as_deref(),
            outbox[2].last_error.as_deref()
        ),
        (Some("error"), Some("consumer busy"))
    );

    // The old inbox rows: producer `default`, delivering store unknown.
    let inbox = consumer.inbox_entries(false, InboxScope::All, 10).unwrap();
    let rows: Vec<(&str, &str, Option<&StoreId>, &InboxStatus)> = (inbox.iter())
        .map(|r| {
            let e = &r.envelope;
            (
                e.event_id.as_str(),
                e.producer.as_str(),
                r.store_id.as_ref(),
                &r.status,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("r1-1", "default", None, &InboxStatus::Applied),
            ("r2-1", "default", None, &InboxStatus::Pending),
            ("r3-1", "default", None, &InboxStatus::Pending),
        ]
    );
    assert_eq!(
        inbox[1].envelope, held_r2,
        "stored bodies read back as they were"
    );

    // Relaying goes on: r1-2 only (r2 and r3 stay quarantined).
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
    assert_eq!(delivered, [("r1-2", Receipt::Accepted)], "{report:?}");
    let destinations = producer.destinations(SystemClock.now_ms()).unwrap();
    assert_eq!(destinations[0].consumer_store_id, Some(consumer_id.clone()));
    assert_eq!(destinations[0].status.backlog, 2);
    let r1_2_row = consumer
        .inbox_entry_of_event(&ProducerName::default(), &r1_2.event_id)
        .unwrap()
        .unwrap();
    assert_eq!(r1_2_row.store_id, Some(producer_id.clone()));

    // Applying goes on, in each flow's order, onto the old projection.
    let drains = consumer.process_all(None, Default::default(), 64).unwrap();
    let applied: u64 = drains.iter().map(|d| d.applied).sum();
    assert_eq!(applied, 3, "{drains:?}");
    let statuses: Vec<(String, InboxStatus)> = (consumer.inbox().unwrap().into_iter())
        .map(|r| (r.envelope.event_id.as_str().to_owned(), r.status))
        .collect();
    assert_eq!(
        statuses,
        [
            ("r1-1".to_owned(), InboxStatus::Applied),
            ("r1-2".to_owned(), InboxStatus::Applied),
            ("r2-1".to_owned(), InboxStatus::Applied),
            ("r3-1".to_owned(), InboxStatus::Applied),
        ]
    );
    let projections: Vec<(String, FlowState, Option<i64>, i64)> =
        (consumer.projections().unwrap().into_iter())
            .map(|p| {
                let quantity = p.quantity.map(|q| q.get());
                (p.flow_id.to_string(), p.state, quantity, p.applied_seq)
            })
            .collect();
    assert_eq!(
        projections,
        [
            ("r1".to_owned(), FlowState::Confirmed, Some(5), 2),
            ("r2".to_owned(), FlowState::Reserved, Some(3), 1),
            ("r3".to_owned(), FlowState::Reserved, Some(4), 1),
        ]
    );
    let effects: Vec<String> = (consumer.effects().unwrap().into_iter())
        .map(|e| e.event_id.as_str().to_owned())
        .collect();
    assert_eq!(effects, ["r1-1", "r1-2", "r2-1", "r3-1"]);

    // A row stored by the first release has no known delivering store: a
    // collision with it from this producer is an ordinary conflict, never
    // `producer_rewound`; the old applied row is still a duplicate.
    let again = consumer
        .receive_from(Some(&producer_id), std::slice::from_ref(&r2_1))
        .unwrap();
    assert_eq!(again[0].receipt, Receipt::Conflict);
    assert_eq!(
        again[0].held_event_id.as_ref(),
        Some(&held_r2.event_id),
        "{again:?}"
    );
    assert_eq!(consumer.receive(&r1_1).unwrap(), Receipt::Duplicate);

    // The producer's flows go on from where the first release left them.
    let flows = producer.flows().unwrap();
    let last: Vec<(String, i64)> = (flows.iter())
        .map(|f| (f.flow_id.to_string(), f.last_seq))
        .collect();
    assert_eq!(
        last,
        [
            ("r1".to_owned(), 2),
            ("r2".to_owned(), 1),
            ("r3".to_owned(), 1)
        ]
    );

    // Reopened, the identities stay what the first open gave.
    drop((producer, consumer));
    let producer = ProducerDb::open(&p, &ordo_reservation::producer_schema()).unwrap();
    let consumer = ConsumerDb::open(&c, &ordo_reservation::consumer_schema()).unwrap();
    assert_eq!(producer.store_id(), &producer_id);
    assert_eq!(consumer.store_id(), &consumer_id);
}
