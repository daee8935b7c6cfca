//! A PostgreSQL store pair of the second release (schema version 5),
//! built by that release's own statements (its version-1 tables and its
//! migrations 2 to 5, copied below as it ran them on a new store),
//! mid-flight: one event applied, one committed but not yet delivered, one
//! quarantined by a conflict, and one quarantined as too large whose head
//! `first-pending` handed over again and failed. This release opens both
//! unchanged in meaning (producer `default`, a store identity given at the
//! first open, one destination `default` holding the old custody marks,
//! each quarantine's code apart from its old text, the old rows' delivering
//! store unknown) and goes on relaying and applying (PROTOCOL.md section
//! 12).

mod support;

use std::sync::Arc;

use ordo_core::envelope::EventType;
use ordo_core::ops::InboxScope;
use ordo_core::{
    process_all, relay, ApplyContext, ApplyHandler, ConsumerOps, Envelope, EventId, FlowId,
    InboxStatus, ProducerName, ProducerOps, Receipt, Receive, RelayOptions, SchemaVersion, Seq,
    StoreError, StoreId, SystemClock, Verdict, CONFLICT_REASON,
};
use ordo_postgres::postgres::Client;
use ordo_postgres::{PgConsumer, PgOptions, PgProducer, PgTx, Schema, SCHEMA_VERSION};
use serde_json::json;
use support::{admin_client, fresh_database};

/// The second release's producer tables: version 1, then migrations 2 to 5.
const PRODUCER_V5: &str = "
CREATE TABLE {s}.outbox (
    position           bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id           text    COLLATE \"C\" NOT NULL UNIQUE,
    flow_id            text    COLLATE \"C\" NOT NULL,
    seq                bigint  NOT NULL CHECK (seq >= 1),
    schema_version     bigint  NOT NULL,
    type               text    NOT NULL,
    body               text    NOT NULL,
    created_at_ms      bigint  NOT NULL,
    accepted           boolean NOT NULL DEFAULT false,
    accepted_at_ms     bigint,
    quarantined        boolean NOT NULL DEFAULT false,
    quarantine_reason  text,
    attempts           bigint  NOT NULL DEFAULT 0,
    last_outcome       text,
    last_error         text,
    next_attempt_at_ms bigint  NOT NULL DEFAULT 0,
    UNIQUE (flow_id, seq),
    CHECK (NOT (accepted AND quarantined))
);
CREATE INDEX outbox_unaccepted ON {s}.outbox (position) WHERE NOT accepted;
CREATE TABLE {s}.outbox_head (
    flow_id      text   COLLATE \"C\" PRIMARY KEY,
    last_seq     bigint NOT NULL CHECK (last_seq >= 0),
    relay_seq    bigint,
    relay_due_ms bigint NOT NULL DEFAULT 0,
    relay_turn   bigint NOT NULL DEFAULT 0
);
CREATE INDEX outbox_head_relay ON {s}.outbox_head (relay_turn, flow_id) WHERE relay_seq IS NOT NULL;
CREATE SEQUENCE {s}.relay_turn;

CREATE TABLE {s}.relay_lease (
             flow_id       text   COLLATE \"C\" PRIMARY KEY,
             owner         text,
             fence         bigint NOT NULL DEFAULT 0,
             expires_at_ms bigint NOT NULL DEFAULT 0
         );
         CREATE INDEX relay_lease_owner ON {s}.relay_lease (owner) WHERE owner IS NOT NULL;
         INSERT INTO {s}.relay_lease (flow_id) SELECT flow_id FROM {s}.outbox_head;
ALTER TABLE {s}.relay_lease ADD COLUMN backend_pid integer;
ALTER TABLE {s}.relay_lease SET (fillfactor = 50);
         ALTER TABLE {s}.outbox_head SET (fillfactor = 50);
         ALTER TABLE {s}.outbox SET (fillfactor = 50);
         DROP INDEX {s}.outbox_unaccepted;
         CREATE TABLE {s}.outbox_pending (position bigint PRIMARY KEY);
         INSERT INTO {s}.outbox_pending (position)
             SELECT position FROM {s}.outbox WHERE NOT accepted;
ALTER TABLE {s}.outbox_head
             ADD COLUMN lease_owner text,
             ADD COLUMN lease_fence bigint NOT NULL DEFAULT 0,
             ADD COLUMN lease_expires_at_ms bigint NOT NULL DEFAULT 0,
             ADD COLUMN lease_backend_pid integer;
         UPDATE {s}.outbox_head h SET lease_owner = l.owner, lease_fence = l.fence,
                lease_expires_at_ms = l.expires_at_ms, lease_backend_pid = l.backend_pid
             FROM {s}.relay_lease l WHERE l.flow_id = h.flow_id;
         DROP TABLE {s}.relay_lease;
";

/// The second release's consumer tables: version 1, then migrations 2 to 5.
const CONSUMER_V5: &str = "
CREATE TABLE {s}.inbox (
    event_id       text   COLLATE \"C\" PRIMARY KEY,
    flow_id        text   COLLATE \"C\" NOT NULL,
    seq            bigint NOT NULL CHECK (seq >= 1),
    schema_version bigint NOT NULL,
    type           text   NOT NULL,
    body           text   NOT NULL,
    body_hash      text   NOT NULL,
    status         text   NOT NULL CHECK (status IN ('pending', 'applied', 'blocked', 'skipped')),
    reason         text,
    detail         text,
    received_at_ms bigint NOT NULL,
    settled_at_ms  bigint,
    UNIQUE (flow_id, seq),
    CHECK ((status = 'blocked') = (reason IS NOT NULL))
);
CREATE INDEX inbox_pending ON {s}.inbox (flow_id) WHERE status = 'pending';
CREATE INDEX inbox_blocked ON {s}.inbox (flow_id) WHERE status = 'blocked';
CREATE TABLE {s}.inbox_cursor (
    flow_id     text   COLLATE \"C\" PRIMARY KEY,
    applied_seq bigint NOT NULL CHECK (applied_seq >= 1)
);
CREATE TABLE {s}.inbox_fingerprint (
    flow_id   text   COLLATE \"C\" NOT NULL,
    seq       bigint NOT NULL,
    event_id  text   COLLATE \"C\" NOT NULL UNIQUE,
    body_hash bytea  NOT NULL CHECK (length(body_hash) = 32),
    status    text   NOT NULL CHECK (status IN ('applied', 'skipped')),
    PRIMARY KEY (flow_id, seq)
);
CREATE TABLE {s}.inbox_watermark (
    flow_id    text   COLLATE \"C\" PRIMARY KEY,
    pruned_seq bigint NOT NULL
);
CREATE TABLE {s}.repair_log (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action     text   NOT NULL,
    flow_id    text   COLLATE \"C\" NOT NULL,
    seq        bigint NOT NULL,
    event_id   text   NOT NULL,
    reason     text   NOT NULL,
    decided_by text   NOT NULL,
    at_ms      bigint NOT NULL
);
CREATE FUNCTION {s}.repair_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'repair_log is append-only'; END $$;
CREATE TRIGGER repair_log_append_only BEFORE UPDATE OR DELETE ON {s}.repair_log
    FOR EACH ROW EXECUTE FUNCTION {s}.repair_log_append_only();
CREATE TRIGGER repair_log_no_truncate BEFORE TRUNCATE ON {s}.repair_log
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.repair_log_append_only();

ALTER TABLE {s}.inbox_cursor DROP CONSTRAINT inbox_cursor_applied_seq_check;
         ALTER TABLE {s}.inbox_cursor ADD CONSTRAINT inbox_cursor_applied_seq_check
             CHECK (applied_seq >= 0);
         INSERT INTO {s}.inbox_cursor (flow_id, applied_seq)
             SELECT DISTINCT flow_id, 0 FROM {s}.inbox ON CONFLICT (flow_id) DO NOTHING;
SELECT 1;
ALTER TABLE {s}.inbox_cursor SET (fillfactor = 50);
SELECT 1;
";

const PRODUCER_SCHEMA: &str = "second_p";
const CONSUMER_SCHEMA: &str = "second_c";

/// A store as the second release created it for `role` in `schema`, of
/// the domain `ledger` (no tables of its own): its meta rows, then its
/// `tables` (`{s}` stands for the schema).
fn second_release_store(admin: &mut Client, schema: &str, role: &str, tables: &str) {
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA {schema};
             CREATE TABLE {schema}.ordo_meta (key text PRIMARY KEY, value text NOT NULL);
             {tables}
             INSERT INTO {schema}.ordo_meta (key, value) VALUES ('role', '{role}'),
                 ('schema_version', '5'), ('domain', 'ledger'), ('domain_version', '0');",
            tables = tables.replace("{s}", schema),
        ))
        .unwrap();
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

/// The text the second release recorded on an event the consumer refused
/// as too large: the code, then the transport's message.
const TOO_LARGE_TEXT: &str =
    "too_large: the envelope is 2000000 bytes, more than the consumer takes (1048576)";

/// The delivery bookkeeping the second release left on an outbox row.
#[derive(Clone, Copy)]
enum Marks {
    /// Accepted by the consumer at its first attempt.
    Accepted,
    /// Committed, never handed over.
    Pending,
    /// Quarantined by a conflict receipt.
    Conflict,
    /// Quarantined as too large, then handed over once more by the
    /// `first-pending` policy (which hands over the oldest unaccepted
    /// event, quarantined or not), and that delivery failed.
    TooLargeThenFailed,
}

/// Writes the producer's outbox row and head for `e` as the second release
/// did, with its custody marks: an event not accepted is listed pending,
/// and the head's relay seq is the flow's first event still to deliver.
fn outbox_row(admin: &mut Client, e: &Envelope, marks: Marks) {
    let s = PRODUCER_SCHEMA;
    let (accepted, quarantine, attempts, outcome, error) = match marks {
        Marks::Accepted => (true, None, 1_i64, Some("accepted"), None),
        Marks::Pending => (false, None, 0, None, None),
        Marks::Conflict => (false, Some(CONFLICT_REASON), 1, Some("conflict"), None),
        Marks::TooLargeThenFailed => (
            false,
            Some(TOO_LARGE_TEXT),
            2,
            Some("error"),
            Some("consumer busy"),
        ),
    };
    let quarantined = quarantine.is_some();
    admin
        .execute(
            &format!(
                "WITH appended AS (
                     INSERT INTO {s}.outbox (event_id, flow_id, seq, schema_version, type, body,
                         created_at_ms, accepted, quarantined, quarantine_reason, attempts,
                         last_outcome, last_error)
                     VALUES ($1, $2, $3, 1, 'placed', $4, 1000, $5, $6, $7, $8, $9, $10)
                     RETURNING position, accepted)
                 INSERT INTO {s}.outbox_pending (position)
                     SELECT position FROM appended WHERE NOT accepted"
            ),
            &[
                &e.event_id.as_str(),
                &e.flow_id.as_str(),
                &e.seq.get(),
                &e.stored_text(),
                &accepted,
                &quarantined,
                &quarantine,
                &attempts,
                &outcome,
                &error,
            ],
        )
        .unwrap();
    let relay_seq = (!accepted && !quarantined).then_some(e.seq.get());
    admin
        .execute(
            &format!(
                "INSERT INTO {s}.outbox_head (flow_id, last_seq, relay_seq) VALUES ($1, $2, $3)
                 ON CONFLICT (flow_id) DO UPDATE SET last_seq = excluded.last_seq,
                     relay_seq = coalesce({s}.outbox_head.relay_seq, excluded.relay_seq)"
            ),
            &[&e.flow_id.as_str(), &e.seq.get(), &relay_seq],
        )
        .unwrap();
}

/// Writes the consumer's inbox row for `e` as the second release did, with
/// its flow's apply cursor row (at 0 until the flow's first apply).
fn inbox_row(admin: &mut Client, e: &Envelope, status: &str) {
    let s = CONSUMER_SCHEMA;
    let applied = status == "applied";
    admin
        .execute(
            &format!(
                "INSERT INTO {s}.inbox (event_id, flow_id, seq, schema_version, type, body,
                     body_hash, status, received_at_ms, settled_at_ms)
                 VALUES ($1, $2, $3, 1, 'placed', $4, $5, $6, 1000, $7)"
            ),
            &[
                &e.event_id.as_str(),
                &e.flow_id.as_str(),
                &e.seq.get(),
                &e.stored_text(),
                &e.body_hash().as_str(),
                &status,
                &applied.then_some(1000_i64),
            ],
        )
        .unwrap();
    admin
        .execute(
            &format!(
                "INSERT INTO {s}.inbox_cursor (flow_id, applied_seq) VALUES ($1, $2)
                 ON CONFLICT (flow_id) DO UPDATE SET
                     applied_seq = greatest({s}.inbox_cursor.applied_seq, excluded.applied_seq)"
            ),
            &[&e.flow_id.as_str(), &if applied { e.seq.get() } else { 0 }],
        )
        .unwrap();
}

/// The ledger's handler: applies every event, writing nothing of its own.
struct Counting(Vec<String>);

impl ApplyHandler<PgTx> for Counting {
    fn apply(
        &mut self,
        _: &mut ApplyContext<'_, PgTx>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        self.0.push(event.event_id.as_str().to_owned());
        Ok(Verdict::Apply)
    }
}

fn options(schema: &str) -> PgOptions {
    PgOptions {
        schema: Some(schema.to_owned()),
        ..PgOptions::default()
    }
}

#[test]
fn a_second_release_store_pair_opens_unchanged_and_goes_on_relaying_and_applying() {
    let (_dir, target) = fresh_database();
    let (f1, f2, g1) = (event("f", 1, 1), event("f", 2, 2), event("g", 1, 3));
    let h1 = event("h", 1, 4);
    let held = Envelope {
        payload: json!({ "amount": 30 }).as_object().unwrap().clone(),
        ..g1.clone()
    };
    let mut admin = admin_client(&target);
    second_release_store(&mut admin, PRODUCER_SCHEMA, "producer", PRODUCER_V5);
    outbox_row(&mut admin, &f1, Marks::Accepted);
    outbox_row(&mut admin, &g1, Marks::Conflict);
    outbox_row(&mut admin, &h1, Marks::TooLargeThenFailed);
    outbox_row(&mut admin, &f2, Marks::Pending);
    second_release_store(&mut admin, CONSUMER_SCHEMA, "consumer", CONSUMER_V5);
    inbox_row(&mut admin, &f1, "applied");
    inbox_row(&mut admin, &held, "pending");

    let (ledger, clock) = (Schema::new("ledger").unwrap(), Arc::new(SystemClock));
    let mut producer =
        PgProducer::open_with(&target, &ledger, clock.clone(), &options(PRODUCER_SCHEMA)).unwrap();
    let mut consumer =
        PgConsumer::open_with(&target, &ledger, clock, &options(CONSUMER_SCHEMA)).unwrap();
    for schema in [PRODUCER_SCHEMA, CONSUMER_SCHEMA] {
        let version: String = admin
            .query_one(
                &format!("SELECT value FROM {schema}.ordo_meta WHERE key = 'schema_version'"),
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(version, SCHEMA_VERSION.to_string(), "{schema}");
    }
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
            ("h-1", false, true),
            ("f-2", false, false)
        ]
    );
    // One destination, default, holding those marks.
    let destinations = producer.destinations(0).unwrap();
    let names: Vec<&str> = destinations.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["default"]);
    assert_eq!(
        (
            destinations[0].status.backlog,
            destinations[0].status.quarantined,
            destinations[0].status.rewound
        ),
        (3, 2, 0),
        "{destinations:?}"
    );
    assert_eq!(destinations[0].consumer_store_id, None);
    for entry in &outbox {
        let custody: Vec<(&str, bool, bool, u64)> = (entry.destinations.iter())
            .map(|c| {
                (
                    c.destination.as_str(),
                    c.accepted,
                    c.quarantined,
                    c.attempts,
                )
            })
            .collect();
        let expected = ("default", entry.accepted, entry.quarantined, entry.attempts);
        assert_eq!(custody, [expected]);
    }
    // A quarantine's reason became its code, the old text its detail, even
    // where the last outcome was a failed delivery after the quarantine.
    let quarantines: Vec<(Option<&str>, Option<&str>, Option<&str>)> = (outbox[1..3].iter())
        .map(|e| {
            (
                e.quarantine_reason.as_deref(),
                e.quarantine_detail.as_deref(),
                e.last_outcome.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        quarantines,
        [
            (Some("conflict"), Some(CONFLICT_REASON), Some("conflict")),
            (Some("too_large"), Some(TOO_LARGE_TEXT), Some("error"))
        ]
    );
    // The old inbox rows: producer `default`, delivering store unknown.
    let inbox = consumer.inbox_entries(false, InboxScope::All, 10).unwrap();
    let rows: Vec<(&str, &str, Option<&StoreId>)> = (inbox.iter())
        .map(|r| {
            let e = &r.envelope;
            (
                e.event_id.as_str(),
                e.producer.as_str(),
                r.store_id.as_ref(),
            )
        })
        .collect();
    assert_eq!(rows, [("f-1", "default", None), ("g-1", "default", None)]);

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
    let mut applied = handler.0.clone();
    applied.sort();
    assert_eq!(applied, ["f-2", "g-1"], "the new f-2 and the held g-1");
    let mut statuses: Vec<(String, InboxStatus)> = (consumer.inbox().unwrap().into_iter())
        .map(|r| (r.envelope.event_id.as_str().to_owned(), r.status))
        .collect();
    statuses.sort_by(|a, b| a.0.cmp(&b.0));
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
