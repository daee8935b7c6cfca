//! A file pair of schema version 7, built by that version's statements (its
//! header, meta rows and tables, copied below as it ran them on a new
//! file), mid-flight: rows of two producers under one flow id, applied,
//! pending, blocked and skipped rows, fingerprints and a watermark left by
//! a prune, effect intents, the repair log, and an outbox with accepted,
//! pending and quarantined rows. Version 8 rebuilds the consumer's inbox as
//! a table with a rowid, its rows in the order they were received; every
//! row and every other table stays as it was, and the pair goes on
//! receiving, relaying, applying and running effects. Version 9 rebuilds
//! the producer's outbox, heads and relay heads with integer flow keys; a
//! producer file of version 8 (the same tables as version 7's) is the same
//! file under another header, and is tested here too.

use std::path::Path;
use std::sync::Arc;

use ordo_core::effect::{
    self, EffectFilter, EffectKey, EffectName, EffectOps, EffectPolicy, EffectState, Policies,
};
use ordo_core::envelope::EventType;
use ordo_core::ops::InboxScope;
use ordo_core::{
    process_all, relay, ApplyContext, ApplyHandler, BlockCode, BlockReason, Clock, ConsumerOps,
    Envelope, EventId, FlowId, InboxStatus, ProducerName, ProducerOps, ProducerStore, Receipt,
    Receive, RelayOptions, SchemaVersion, Seq, StoreError, StoreId, SystemClock, Verdict,
    CONFLICT_REASON,
};
use ordo_sqlite::rusqlite::types::Value;
use ordo_sqlite::rusqlite::{params, Connection};
use ordo_sqlite::{ConsumerDb, OpenOptions, ProducerDb, Schema, SCHEMA_VERSION};
use serde_json::json;

/// The version-7 producer tables, as it created them in a new file (after
/// the header [`seventh_version_file`] writes): the outbox, its heads, and
/// custody per destination with its one destination, `default`.
const PRODUCER_V7: &str = "
CREATE TABLE IF NOT EXISTS outbox (
    position           INTEGER PRIMARY KEY,
    event_id           TEXT    NOT NULL UNIQUE,
    flow_id            TEXT    NOT NULL,
    seq                INTEGER NOT NULL CHECK (seq >= 1),
    schema_version     INTEGER NOT NULL,
    type               TEXT    NOT NULL,
    body               TEXT    NOT NULL,
    created_at_ms      INTEGER NOT NULL,
    -- Settled: every destination of its flow holds it or abandoned it.
    accepted           INTEGER NOT NULL DEFAULT 0 CHECK (accepted IN (0, 1)),
    accepted_at_ms     INTEGER,
    UNIQUE (flow_id, seq)
);
CREATE TABLE IF NOT EXISTS outbox_head (
    flow_id      TEXT    PRIMARY KEY,
    last_seq     INTEGER NOT NULL CHECK (last_seq >= 1)
) WITHOUT ROWID;
INSERT OR IGNORE INTO ordo_meta (key, value) VALUES ('relay_turn', 0);

CREATE TABLE IF NOT EXISTS destination (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    name              TEXT    NOT NULL UNIQUE,
    start             TEXT    NOT NULL CHECK (start IN ('start', 'now')),
    consumer_store_id TEXT,
    created_at_ms     INTEGER NOT NULL
);
-- One destination's marks on one outbox row; a row appended to a flow
-- abandoned for a destination has none there.
CREATE TABLE IF NOT EXISTS custody (
    position           INTEGER NOT NULL,
    destination        INTEGER NOT NULL,
    accepted           INTEGER NOT NULL DEFAULT 0 CHECK (accepted IN (0, 1)),
    accepted_at_ms     INTEGER,
    quarantined        INTEGER NOT NULL DEFAULT 0 CHECK (quarantined IN (0, 1)),
    quarantine_reason  TEXT,
    quarantine_detail  TEXT,
    attempts           INTEGER NOT NULL DEFAULT 0,
    last_outcome       TEXT,
    last_error         TEXT,
    next_attempt_at_ms INTEGER NOT NULL DEFAULT 0,
    abandoned          INTEGER NOT NULL DEFAULT 0 CHECK (abandoned IN (0, 1)),
    PRIMARY KEY (position, destination),
    CHECK (NOT (accepted = 1 AND quarantined = 1))
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS custody_unaccepted ON custody (destination, position)
    WHERE accepted = 0 AND abandoned = 0;
-- A flow delivered to a destination: that destination's relay head of it.
CREATE TABLE IF NOT EXISTS relay_head (
    flow_id        TEXT    NOT NULL,
    destination    INTEGER NOT NULL,
    relay_seq      INTEGER,
    relay_due_ms   INTEGER NOT NULL DEFAULT 0,
    relay_turn     INTEGER NOT NULL DEFAULT 0,
    -- Rewound at this seq (a receipt of cause producer_rewound): nothing
    -- of the flow from there on is relayed to the destination.
    relay_stop_seq INTEGER,
    -- Abandoned from this seq on for the destination.
    abandoned_seq  INTEGER,
    PRIMARY KEY (flow_id, destination)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS relay_head_turn ON relay_head (destination, relay_turn, flow_id)
    WHERE relay_seq IS NOT NULL;
CREATE TABLE IF NOT EXISTS producer_repair (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    action      TEXT    NOT NULL,
    destination TEXT,
    flow_id     TEXT,
    seq         INTEGER,
    event_id    TEXT,
    reason      TEXT    NOT NULL,
    by          TEXT    NOT NULL,
    at_ms       INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS producer_repair_append_only_update BEFORE UPDATE ON producer_repair
BEGIN SELECT RAISE(ABORT, 'producer_repair is append-only'); END;
CREATE TRIGGER IF NOT EXISTS producer_repair_append_only_delete BEFORE DELETE ON producer_repair
BEGIN SELECT RAISE(ABORT, 'producer_repair is append-only'); END;

INSERT INTO destination (name, start, consumer_store_id, created_at_ms)
    SELECT 'default', 'start', NULL, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
    WHERE NOT EXISTS (SELECT 1 FROM destination);
";

/// The version-7 consumer tables, as it created them in a new file (after
/// the header [`seventh_version_file`] writes): the inbox `WITHOUT ROWID`,
/// keyed by `(producer, event_id)`.
const CONSUMER_V7: &str = "
CREATE TABLE IF NOT EXISTS inbox (
    producer       TEXT    NOT NULL,
    event_id       TEXT    NOT NULL,
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
    detail         TEXT,
    received_at_ms INTEGER NOT NULL,
    settled_at_ms  INTEGER,
    -- The producer store that delivered the row (its store_id), if known.
    store_id       TEXT,
    PRIMARY KEY (producer, event_id),
    UNIQUE (flow_id, producer, seq),
    CHECK ((status = 'blocked') = (reason IS NOT NULL))
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS inbox_pending ON inbox (flow_id, producer) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS inbox_blocked ON inbox (flow_id, producer) WHERE status = 'blocked';
CREATE TABLE IF NOT EXISTS inbox_cursor (
    flow_id     TEXT    NOT NULL,
    producer    TEXT    NOT NULL,
    applied_seq INTEGER NOT NULL CHECK (applied_seq >= 1),
    PRIMARY KEY (flow_id, producer)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inbox_fingerprint (
    flow_id   TEXT    NOT NULL,
    producer  TEXT    NOT NULL,
    seq       INTEGER NOT NULL,
    event_id  TEXT    NOT NULL,
    body_hash BLOB    NOT NULL CHECK (length(body_hash) = 32),
    status    TEXT    NOT NULL CHECK (status IN ('applied', 'skipped')),
    store_id  TEXT,
    PRIMARY KEY (flow_id, producer, seq),
    UNIQUE (producer, event_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inbox_watermark (
    flow_id    TEXT    NOT NULL,
    producer   TEXT    NOT NULL,
    pruned_seq INTEGER NOT NULL,
    -- The producer store that delivered the last row pruned, if known.
    store_id   TEXT,
    PRIMARY KEY (flow_id, producer)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS repair_log (
    id         INTEGER PRIMARY KEY,
    action     TEXT    NOT NULL,
    flow_id    TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    event_id   TEXT    NOT NULL,
    reason     TEXT    NOT NULL,
    decided_by TEXT    NOT NULL,
    at_ms      INTEGER NOT NULL,
    producer   TEXT    NOT NULL DEFAULT 'default',
    store_id   TEXT,
    -- The effect intent acted on, for an action on one.
    key        TEXT
);
-- Effect intents (EFFECTS.md), recorded in the apply transaction of their
-- event; `key` is STORE_ID/PRODUCER/FLOW_ID/SEQ/NAME.
CREATE TABLE IF NOT EXISTS effect_intent (
    key                 TEXT    NOT NULL PRIMARY KEY,
    name                TEXT    NOT NULL,
    producer            TEXT    NOT NULL,
    flow_id             TEXT    NOT NULL,
    seq                 INTEGER NOT NULL CHECK (seq >= 1),
    position            INTEGER NOT NULL CHECK (position >= 0),
    event_id            TEXT    NOT NULL,
    request             TEXT    NOT NULL,
    state               TEXT    NOT NULL CHECK (state = 'pending' OR state = 'in_flight'
                                   OR state = 'succeeded' OR state = 'failed'
                                   OR state = 'outcome_unknown' OR state = 'skipped'),
    attempts            INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    attempts_base       INTEGER NOT NULL DEFAULT 0 CHECK (attempts_base >= 0),
    unknown_seen        INTEGER NOT NULL DEFAULT 0,
    reconciling         INTEGER NOT NULL DEFAULT 0,
    lease_owner         TEXT,
    lease_until_ms      INTEGER,
    first_attempt_at_ms INTEGER,
    next_attempt_at_ms  INTEGER NOT NULL,
    result              TEXT,
    last_error          TEXT,
    recorded_at_ms      INTEGER NOT NULL,
    updated_at_ms       INTEGER NOT NULL,
    settled_at_ms       INTEGER,
    UNIQUE (flow_id, producer, seq, position),
    CHECK ((state = 'in_flight') = (lease_until_ms IS NOT NULL))
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS effect_intent_due ON effect_intent (name, next_attempt_at_ms)
    WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS effect_intent_leased ON effect_intent (name, lease_until_ms)
    WHERE state = 'in_flight';
CREATE INDEX IF NOT EXISTS effect_intent_settled ON effect_intent (settled_at_ms)
    WHERE settled_at_ms IS NOT NULL;
-- Which effects run in order per flow, as their executors' policies say.
CREATE TABLE IF NOT EXISTS effect_order (
    name    TEXT    NOT NULL PRIMARY KEY,
    ordered INTEGER NOT NULL CHECK (ordered = 0 OR ordered = 1)
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS repair_log_append_only_update BEFORE UPDATE ON repair_log
BEGIN SELECT RAISE(ABORT, 'repair_log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS repair_log_append_only_delete BEFORE DELETE ON repair_log
BEGIN SELECT RAISE(ABORT, 'repair_log is append-only'); END;
";

/// The `application_id` ordo writes in the header of every file it creates.
const APPLICATION_ID: i32 = 0x6F72_646F;

/// The producer store's identity, recorded by version 7 at its creation.
const PRODUCER_ID: &str = "0123456789abcdef0123456789abcdef";
/// The consumer store's identity.
const CONSUMER_ID: &str = "fedcba9876543210fedcba9876543210";
/// The identity of the producer store named `billing`.
const BILLING_ID: &str = "b111b111b111b111b111b111b111b111";

/// A file as version 7 created it for `role` in the domain `ledger`: its
/// meta table with the role (and a producer's name), its identity, the
/// header, its `tables`, then the domain (no migrations).
fn seventh_version_file(path: &Path, role: &str, store_id: &str, tables: &str) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
        .unwrap();
    let name = if role == "producer" {
        "INSERT INTO ordo_meta (key, value) VALUES ('producer_name', 'default');"
    } else {
        ""
    };
    conn.execute_batch(&format!(
        "BEGIN IMMEDIATE;
         CREATE TABLE ordo_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
         INSERT INTO ordo_meta (key, value) VALUES ('role', '{role}');
         {name}
         INSERT OR IGNORE INTO ordo_meta (key, value) VALUES ('store_id', '{store_id}');
         PRAGMA user_version = 7; PRAGMA application_id = {APPLICATION_ID};
         {tables}
         INSERT INTO ordo_meta (key, value) VALUES ('domain', 'ledger'), ('domain_version', '0')
             ON CONFLICT (key) DO UPDATE SET value = excluded.value;
         COMMIT;"
    ))
    .unwrap();
    conn
}

fn event_of(producer: &str, flow: &str, seq: i64, amount: i64) -> Envelope {
    let flow_id = FlowId::new(flow).unwrap();
    let seq = Seq::new(seq).unwrap();
    Envelope {
        event_id: EventId::for_seq(&flow_id, seq),
        flow_id,
        seq,
        schema_version: SchemaVersion::V1,
        event_type: EventType::new("placed").unwrap(),
        payload: json!({ "amount": amount }).as_object().unwrap().clone(),
        producer: ProducerName::new(producer).unwrap(),
        headers: Default::default(),
    }
}

fn event(flow: &str, seq: i64, amount: i64) -> Envelope {
    event_of("default", flow, seq, amount)
}

/// The delivery bookkeeping version 7 left on an outbox row for
/// `default`.
#[derive(Clone, Copy, PartialEq)]
enum Marks {
    /// Accepted at its first delivery.
    Accepted,
    /// Committed; one delivery failed.
    Failed,
    /// Committed, never handed over.
    Pending,
    /// Quarantined by a conflict receipt.
    Conflict,
}

/// Writes the outbox row of `e` at `at_ms` with its custody for
/// `default` (destination 1), as version 7's append and receipts did.
fn outbox_row(conn: &Connection, e: &Envelope, at_ms: i64, marks: Marks) {
    let accepted = marks == Marks::Accepted;
    conn.execute(
        "INSERT INTO outbox (event_id, flow_id, seq, schema_version, type, body, created_at_ms,
             accepted, accepted_at_ms)
         VALUES (?1, ?2, ?3, 1, 'placed', ?4, ?5, ?6, ?7)",
        params![
            e.event_id.as_str(),
            e.flow_id.as_str(),
            e.seq.get(),
            e.stored_text(),
            at_ms,
            accepted,
            accepted.then_some(at_ms + 1),
        ],
    )
    .unwrap();
    let position = conn.last_insert_rowid();
    let (code, detail) = Receipt::Conflict.quarantine().unwrap();
    let (quarantined, attempts, outcome, error, due) = match marks {
        Marks::Accepted => (false, 1, Some("accepted"), None, 0),
        Marks::Failed => (false, 1, Some("error"), Some("consumer busy"), 1_500),
        Marks::Pending => (false, 0, None, None, 0),
        Marks::Conflict => (true, 1, Some("conflict"), None, 0),
    };
    conn.execute(
        "INSERT INTO custody (position, destination, accepted, accepted_at_ms, quarantined,
             quarantine_reason, quarantine_detail, attempts, last_outcome, last_error,
             next_attempt_at_ms)
         VALUES (?1, 1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            position,
            accepted,
            accepted.then_some(at_ms + 1),
            quarantined,
            quarantined.then_some(code),
            quarantined.then_some(detail),
            attempts,
            outcome,
            error,
            due,
        ],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO outbox_head (flow_id, last_seq) VALUES (?1, ?2)
         ON CONFLICT (flow_id) DO UPDATE SET last_seq = excluded.last_seq",
        params![e.flow_id.as_str(), e.seq.get()],
    )
    .unwrap();
}

/// One inbox row as version 7 left it.
struct Row<'a> {
    envelope: &'a Envelope,
    status: &'a str,
    reason: Option<&'a str>,
    detail: Option<&'a str>,
    received_at_ms: i64,
    settled_at_ms: Option<i64>,
    store_id: Option<&'a str>,
}

fn inbox_row(conn: &Connection, row: &Row<'_>) {
    let e = row.envelope;
    conn.execute(
        "INSERT INTO inbox (producer, event_id, flow_id, seq, schema_version, type, body,
             body_hash, status, reason, detail, received_at_ms, settled_at_ms, store_id)
         VALUES (?1, ?2, ?3, ?4, 1, 'placed', ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            e.producer.as_str(),
            e.event_id.as_str(),
            e.flow_id.as_str(),
            e.seq.get(),
            e.stored_text(),
            e.body_hash().as_str(),
            row.status,
            row.reason,
            row.detail,
            row.received_at_ms,
            row.settled_at_ms,
            row.store_id,
        ],
    )
    .unwrap();
}

/// The events of the pair: the producer's (`default`), what the consumer
/// holds of `billing`, and the body the consumer holds at o-3's seq 1.
struct Events {
    o1: Vec<Envelope>,
    o2_1: Envelope,
    o3_1: Envelope,
    o3_2: Envelope,
    held_o3_1: Envelope,
    billing_o1_1: Envelope,
}

fn events() -> Events {
    Events {
        o1: (1..=5).map(|seq| event("o-1", seq, seq * 10)).collect(),
        o2_1: event("o-2", 1, 21),
        o3_1: event("o-3", 1, 31),
        o3_2: event("o-3", 2, 32),
        held_o3_1: event("o-3", 1, 99),
        billing_o1_1: event_of("billing", "o-1", 1, 7),
    }
}

/// The key of the consumer's intent `name` of `producer`'s `flow`, `seq`.
fn key(producer: &str, flow: &str, seq: i64, name: &str) -> String {
    format!("{CONSUMER_ID}/{producer}/{flow}/{seq}/{name}")
}

/// Builds the version-7 pair at `p` and `c`. The producer appended o-1
/// (seqs 1 to 5), o-2 and o-3 (seqs 1 and 2); o-3's first event was
/// quarantined by a conflict, o-1's fifth failed once, o-3's second was
/// never handed over. The consumer pruned o-1's seqs 1 and 2 (the second
/// skipped), applied o-1's seq 3 and `billing`'s o-1 seq 1, holds o-1's
/// seq 4 pending, o-2's blocked, and o-3's seq 1 (another body) skipped.
fn build_pair(p: &Path, c: &Path, ev: &Events) {
    let producer = seventh_version_file(p, "producer", PRODUCER_ID, PRODUCER_V7);
    producer
        .execute(
            "UPDATE destination SET consumer_store_id = ?1, created_at_ms = 900",
            [CONSUMER_ID],
        )
        .unwrap();
    let o1 = &ev.o1;
    let outbox = [
        (&o1[0], 1_000, Marks::Accepted),
        (&o1[1], 1_001, Marks::Accepted),
        (&o1[2], 1_002, Marks::Accepted),
        (&ev.o2_1, 1_003, Marks::Accepted),
        (&ev.o3_1, 1_004, Marks::Conflict),
        (&o1[3], 1_005, Marks::Accepted),
        (&ev.o3_2, 1_006, Marks::Pending),
        (&o1[4], 1_007, Marks::Failed),
    ];
    for (e, at_ms, marks) in outbox {
        outbox_row(&producer, e, at_ms, marks);
    }
    producer
        .execute_batch(
            "INSERT INTO relay_head (flow_id, destination, relay_seq, relay_due_ms, relay_turn)
             VALUES ('o-1', 1, 5, 1500, 3), ('o-2', 1, NULL, 0, 2), ('o-3', 1, 2, 0, 3);
             UPDATE ordo_meta SET value = '3' WHERE key = 'relay_turn';",
        )
        .unwrap();
    drop(producer);

    let consumer = seventh_version_file(c, "consumer", CONSUMER_ID, CONSUMER_V7);
    let rows = [
        Row {
            envelope: &o1[2],
            status: "applied",
            reason: None,
            detail: None,
            received_at_ms: 1_003,
            settled_at_ms: Some(1_004),
            store_id: Some(PRODUCER_ID),
        },
        Row {
            envelope: &ev.billing_o1_1,
            status: "applied",
            reason: None,
            detail: None,
            received_at_ms: 1_020,
            settled_at_ms: Some(1_021),
            store_id: Some(BILLING_ID),
        },
        Row {
            envelope: &ev.o2_1,
            status: "blocked",
            reason: Some("refused"),
            detail: Some("out of stock"),
            received_at_ms: 1_005,
            settled_at_ms: None,
            store_id: Some(PRODUCER_ID),
        },
        Row {
            envelope: &ev.held_o3_1,
            status: "skipped",
            reason: None,
            detail: None,
            received_at_ms: 1_005,
            settled_at_ms: Some(1_030),
            store_id: None,
        },
        Row {
            envelope: &o1[3],
            status: "pending",
            reason: None,
            detail: None,
            received_at_ms: 1_010,
            settled_at_ms: None,
            store_id: Some(PRODUCER_ID),
        },
    ];
    for row in &rows {
        inbox_row(&consumer, row);
    }
    // What a prune of o-1's seqs 1 and 2 left.
    for (e, status) in [(&o1[0], "applied"), (&o1[1], "skipped")] {
        consumer
            .execute(
                "INSERT INTO inbox_fingerprint (flow_id, producer, seq, event_id, body_hash,
                     status, store_id)
                 VALUES (?1, 'default', ?2, ?3, unhex(?4), ?5, ?6)",
                params![
                    e.flow_id.as_str(),
                    e.seq.get(),
                    e.event_id.as_str(),
                    e.body_hash().as_str(),
                    status,
                    PRODUCER_ID,
                ],
            )
            .unwrap();
    }
    consumer
        .execute(
            "INSERT INTO inbox_watermark (flow_id, producer, pruned_seq, store_id)
             VALUES ('o-1', 'default', 2, ?1)",
            [PRODUCER_ID],
        )
        .unwrap();
    consumer
        .execute_batch(
            "INSERT INTO inbox_cursor (flow_id, producer, applied_seq)
             VALUES ('o-1', 'default', 3), ('o-1', 'billing', 1), ('o-3', 'default', 1);",
        )
        .unwrap();
    let intents = [
        // o-1 seq 3's first intent succeeded; its second timed out after
        // sending; billing's waits for its first attempt.
        (
            key("default", "o-1", 3, "notify"),
            "notify",
            "default",
            3,
            0,
            "succeeded",
            1,
            1,
            Some(1_040),
            Some(r#"{"sent":true}"#),
            None,
            Some(1_041),
        ),
        (
            key("default", "o-1", 3, "mail"),
            "mail",
            "default",
            3,
            1,
            "outcome_unknown",
            1,
            1,
            Some(1_042),
            None,
            Some("timed out after sending"),
            None,
        ),
        (
            key("billing", "o-1", 1, "notify"),
            "notify",
            "billing",
            1,
            0,
            "pending",
            0,
            0,
            None,
            None,
            None,
            None,
        ),
    ];
    for (
        k,
        name,
        producer,
        seq,
        position,
        state,
        attempts,
        unknown,
        first,
        result,
        error,
        settled,
    ) in intents
    {
        consumer
            .execute(
                "INSERT INTO effect_intent (key, name, producer, flow_id, seq, position, event_id,
                     request, state, attempts, unknown_seen, first_attempt_at_ms,
                     next_attempt_at_ms, result, last_error, recorded_at_ms, updated_at_ms,
                     settled_at_ms)
                 VALUES (?1, ?2, ?3, 'o-1', ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 1051, ?12, ?13,
                     1051, coalesce(?11, 1051), ?14)",
                params![
                    k,
                    name,
                    producer,
                    seq,
                    position,
                    format!("o-1-{seq}"),
                    format!(r#"{{"seq":{seq}}}"#),
                    state,
                    attempts,
                    unknown,
                    first,
                    result,
                    error,
                    settled,
                ],
            )
            .unwrap();
    }
    consumer
        .execute_batch(
            "INSERT INTO effect_order (name, ordered) VALUES ('mail', 1), ('notify', 1);",
        )
        .unwrap();
    consumer
        .execute(
            "INSERT INTO repair_log (action, flow_id, seq, event_id, reason, decided_by, at_ms,
                 producer, store_id, key)
             VALUES ('skip', 'o-1', 2, 'o-1-2', 'duplicate order', 'ops', 1_002, 'default', ?1, NULL),
                 ('skip', 'o-3', 1, 'o-3-1', 'held a stale body', 'ops', 1_030, 'default', NULL, NULL),
                 ('effect_retry', 'o-1', 3, 'o-1-3', 'mail server back', 'ops', 1_043, 'default',
                  NULL, ?2)",
            params![PRODUCER_ID, key("default", "o-1", 3, "mail")],
        )
        .unwrap();
}

/// A version 7 file pair built in a directory of its own (kept as long as
/// the directory), with the events it holds.
fn built_pair() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    std::path::PathBuf,
    Events,
) {
    let dir = tempfile::tempdir().unwrap();
    let (p, c) = (dir.path().join("p.db"), dir.path().join("c.db"));
    let ev = events();
    build_pair(&p, &c, &ev);
    (dir, p, c, ev)
}

/// Runs `sql` on the file at `path` through a connection of its own.
fn execute(path: &Path, sql: &str) {
    Connection::open(path).unwrap().execute_batch(sql).unwrap();
}

/// Every row `sql` reads, each as its columns' values.
fn rows(conn: &Connection, sql: &str) -> Vec<Vec<Value>> {
    let mut statement = conn.prepare(sql).unwrap();
    let n = statement.column_count();
    statement
        .query_map([], |row| (0..n).map(|i| row.get::<_, Value>(i)).collect())
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The inbox's rows, every column, by key.
const INBOX_ROWS: &str = "SELECT producer, event_id, flow_id, seq, schema_version, type, body,
    body_hash, status, reason, detail, received_at_ms, settled_at_ms, store_id
    FROM inbox ORDER BY producer, event_id";

/// Every other table of the consumer whose rows the upgrade leaves alone.
const CONSUMER_TABLES: [&str; 7] = [
    "SELECT * FROM ordo_meta ORDER BY key",
    "SELECT * FROM inbox_cursor ORDER BY flow_id, producer",
    "SELECT * FROM inbox_fingerprint ORDER BY flow_id, producer, seq",
    "SELECT * FROM inbox_watermark ORDER BY flow_id, producer",
    "SELECT * FROM repair_log ORDER BY id",
    "SELECT * FROM effect_intent ORDER BY key",
    "SELECT * FROM effect_order ORDER BY name",
];

/// Every row of the producer at version 7 (and 8), each table's columns.
const PRODUCER_TABLES_V7: [&str; 7] = [
    "SELECT * FROM ordo_meta ORDER BY key",
    "SELECT * FROM outbox ORDER BY position",
    "SELECT * FROM outbox_head ORDER BY flow_id",
    "SELECT * FROM destination ORDER BY id",
    "SELECT * FROM custody ORDER BY position, destination",
    "SELECT * FROM relay_head ORDER BY flow_id, destination",
    "SELECT * FROM producer_repair ORDER BY id",
];

/// The same rows at version 9, where the outbox and the relay heads name
/// each flow by its integer key: read back by its text id, they must be
/// those of [`PRODUCER_TABLES_V7`].
const PRODUCER_TABLES: [&str; 7] = [
    "SELECT * FROM ordo_meta ORDER BY key",
    "SELECT position, event_id, flow_id, seq, schema_version, type, body, created_at_ms,
         accepted, accepted_at_ms FROM outbox ORDER BY position",
    "SELECT flow_id, last_seq FROM outbox_head ORDER BY flow_id",
    "SELECT * FROM destination ORDER BY id",
    "SELECT * FROM custody ORDER BY position, destination",
    "SELECT f.flow_id, r.destination, r.relay_seq, r.relay_due_ms, r.relay_turn,
         r.relay_stop_seq, r.abandoned_seq
     FROM relay_head r JOIN outbox_head f ON f.flow = r.flow ORDER BY f.flow_id, r.destination",
    "SELECT * FROM producer_repair ORDER BY id",
];

/// Asserts that the producer file of `conn`, upgraded to version 9 from
/// the rows `before` ([`PRODUCER_TABLES_V7`]) and the objects `objects`,
/// keeps every row, keys its flows in the order of their text ids and
/// kept no table of the rebuild; its other objects are as they were.
#[track_caller]
fn assert_producer_upgraded(
    conn: &Connection,
    before: &[Vec<Vec<Value>>],
    objects_before: &[Vec<Value>],
) {
    assert_eq!(snapshot(conn, &PRODUCER_TABLES), before);
    let by_key = rows(conn, "SELECT flow_id FROM outbox_head ORDER BY flow");
    let by_id = rows(conn, "SELECT flow_id FROM outbox_head ORDER BY flow_id");
    assert_eq!(by_key, by_id);
    let keys = rows(conn, "SELECT flow FROM outbox_head ORDER BY flow");
    let expected: Vec<Vec<Value>> = (1..=keys.len() as i64)
        .map(|k| vec![Value::Integer(k)])
        .collect();
    assert_eq!(keys, expected);
    let strays = rows(
        conn,
        "SELECT o.position FROM outbox o JOIN outbox_head f ON f.flow = o.flow
         WHERE f.flow_id <> o.flow_id",
    );
    assert!(strays.is_empty(), "{strays:?}");
    let leftovers = rows(
        conn,
        "SELECT name FROM sqlite_schema WHERE name LIKE '%v8%' OR tbl_name LIKE '%v8%'",
    );
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let rebuilt = ["outbox", "outbox_head", "relay_head"];
    let untouched = |all: Vec<Vec<Value>>| -> Vec<Vec<Value>> {
        all.into_iter()
            .filter(|o| !matches!(&o[2], Value::Text(t) if rebuilt.contains(&t.as_str())))
            .collect()
    };
    assert_eq!(
        untouched(objects(conn, "")),
        untouched(objects_before.to_vec())
    );
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

/// The schema objects of the file other than `except`'s, with their SQL.
fn objects(conn: &Connection, except: &str) -> Vec<Vec<Value>> {
    let sql = format!(
        "SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE tbl_name <> '{except}'
         ORDER BY name"
    );
    rows(conn, &sql)
}

/// Everything `tables` read.
fn snapshot(conn: &Connection, tables: &[&str]) -> Vec<Vec<Vec<Value>>> {
    tables.iter().map(|sql| rows(conn, sql)).collect()
}

fn header(conn: &Connection) -> (i64, i64) {
    let version = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .unwrap();
    let id = conn
        .query_row("PRAGMA application_id", [], |row| row.get(0))
        .unwrap();
    (version, id)
}

fn inbox_sql(conn: &Connection) -> String {
    conn.query_row(
        "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'inbox'",
        [],
        |row| row.get(0),
    )
    .unwrap()
}

/// The inbox rows' identities in rowid order.
fn by_rowid(conn: &Connection) -> Vec<(String, String)> {
    let mut statement = conn
        .prepare("SELECT producer, event_id FROM inbox ORDER BY rowid")
        .unwrap();
    statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn ids(list: &[(&str, &str)]) -> Vec<(String, String)> {
    (list.iter())
        .map(|(p, e)| (p.to_string(), e.to_string()))
        .collect()
}

/// An intent as the test lists it: its key, state, attempts, result, and
/// the key it waits for.
type Listed = (String, EffectState, u32, Option<String>, Option<String>);

/// Applies every event, recording one `notify` intent for each.
struct Notifying(Vec<String>);

impl ApplyHandler<Connection> for Notifying {
    fn apply(
        &mut self,
        cx: &mut ApplyContext<'_, Connection>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        self.0.push(event.event_id.as_str().to_owned());
        cx.effect("notify", &json!({ "seq": event.seq.get() }))?;
        Ok(Verdict::Apply)
    }
}

/// An executor of `notify`.
struct Notify;

impl Policies for Notify {
    fn of(&self, _: &EffectName) -> Option<(EffectPolicy, bool)> {
        Some((EffectPolicy::default(), false))
    }

    fn names(&self) -> Vec<EffectName> {
        vec![EffectName::new("notify").unwrap()]
    }
}

#[test]
fn a_seventh_version_file_pair_keeps_every_row_and_goes_on_receiving_relaying_and_applying() {
    let (dir, p, c, ev) = built_pair();
    let (inbox_before, consumer_before, consumer_objects, producer_before, producer_objects) = {
        let consumer = Connection::open(&c).unwrap();
        let producer = Connection::open(&p).unwrap();
        assert_eq!(header(&consumer), (7, i64::from(APPLICATION_ID)));
        assert!(inbox_sql(&consumer).ends_with(") WITHOUT ROWID"));
        (
            rows(&consumer, INBOX_ROWS),
            snapshot(&consumer, &CONSUMER_TABLES),
            objects(&consumer, "inbox"),
            snapshot(&producer, &PRODUCER_TABLES_V7),
            objects(&producer, ""),
        )
    };
    assert_eq!(inbox_before.len(), 5);
    assert_eq!(consumer_before[4].len(), 3, "three repair_log rows");
    assert_eq!(consumer_before[5].len(), 3, "three intents");

    let ledger = Schema::new("ledger").unwrap();
    let mut producer = ProducerDb::open(&p, &ledger).unwrap();
    let mut consumer = ConsumerDb::open(&c, &ledger).unwrap();
    for conn in [producer.connection(), consumer.connection()] {
        assert_eq!(header(conn), (SCHEMA_VERSION, i64::from(APPLICATION_ID)));
    }
    assert_eq!(SCHEMA_VERSION, 9);
    assert_eq!(producer.store_id().as_str(), PRODUCER_ID);
    assert_eq!(consumer.store_id().as_str(), CONSUMER_ID);

    // The inbox: a table with a rowid now, every row as it was, in the
    // order received (ties by flow, producer and seq), its indexes back.
    {
        let conn = consumer.connection();
        let sql = inbox_sql(conn);
        assert!(!sql.to_uppercase().contains("WITHOUT ROWID"), "{sql}");
        assert_eq!(rows(conn, INBOX_ROWS), inbox_before);
        assert_eq!(
            by_rowid(conn),
            ids(&[
                ("default", "o-1-3"),
                ("default", "o-2-1"),
                ("default", "o-3-1"),
                ("default", "o-1-4"),
                ("billing", "o-1-1"),
            ])
        );
        let rowids: Vec<i64> = rows(conn, "SELECT rowid FROM inbox ORDER BY rowid")
            .into_iter()
            .map(|r| match r[0] {
                Value::Integer(id) => id,
                ref other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(rowids, [1, 2, 3, 4, 5]);
        let indexes = rows(
            conn,
            "SELECT name, sql FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'inbox'
                 AND sql IS NOT NULL ORDER BY name",
        );
        let text = |s: &str| Value::Text(s.to_owned());
        assert_eq!(
            indexes,
            [
                vec![
                    text("inbox_blocked"),
                    text("CREATE INDEX inbox_blocked ON inbox (flow_id, producer) WHERE status = 'blocked'"),
                ],
                vec![
                    text("inbox_pending"),
                    text("CREATE INDEX inbox_pending ON inbox (flow_id, producer) WHERE status = 'pending'"),
                ],
            ]
        );
        let leftovers = rows(
            conn,
            "SELECT name FROM sqlite_schema WHERE name LIKE '%v7%' OR tbl_name LIKE '%v7%'",
        );
        assert!(leftovers.is_empty(), "{leftovers:?}");
        // Every other object and row of the consumer as it was.
        assert_eq!(objects(conn, "inbox"), consumer_objects);
        assert_eq!(snapshot(conn, &CONSUMER_TABLES), consumer_before);
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .unwrap();
        assert_eq!(check, "ok");
    }
    // The producer's file: every row kept, each flow keyed by an integer
    // in the order of the text ids, and the objects of a new store.
    assert_producer_upgraded(producer.connection(), &producer_before, &producer_objects);
    {
        let fresh = ProducerDb::open(dir.path().join("fresh-p.db"), &ledger).unwrap();
        assert_eq!(
            objects(producer.connection(), ""),
            objects(fresh.connection(), "")
        );
    }

    // The upgraded file's objects are those of a store this build creates.
    {
        let fresh_path = dir.path().join("fresh.db");
        let fresh = ConsumerDb::open(&fresh_path, &ledger).unwrap();
        assert_eq!(
            objects(consumer.connection(), ""),
            objects(fresh.connection(), "")
        );
    }

    // The library reads the rows back as they were.
    let statuses: Vec<(String, String, InboxStatus, Option<String>)> = (consumer
        .inbox_entries(false, InboxScope::All, 10)
        .unwrap()
        .into_iter())
    .map(|r| {
        let e = r.envelope;
        let store = r.store_id.map(|s| s.as_str().to_owned());
        (
            e.producer.as_str().to_owned(),
            e.event_id.as_str().to_owned(),
            r.status,
            store,
        )
    })
    .collect();
    let blocked = InboxStatus::Blocked(BlockReason {
        code: BlockCode::from_static("refused"),
        detail: Some("out of stock".to_owned()),
    });
    let from = |id: &str| Some(id.to_owned());
    assert_eq!(
        statuses,
        [
            (
                "billing".into(),
                "o-1-1".into(),
                InboxStatus::Applied,
                from(BILLING_ID)
            ),
            (
                "default".into(),
                "o-1-3".into(),
                InboxStatus::Applied,
                from(PRODUCER_ID)
            ),
            (
                "default".into(),
                "o-1-4".into(),
                InboxStatus::Pending,
                from(PRODUCER_ID)
            ),
            (
                "default".into(),
                "o-2-1".into(),
                blocked.clone(),
                from(PRODUCER_ID)
            ),
            ("default".into(), "o-3-1".into(), InboxStatus::Skipped, None),
        ]
    );

    // Receiving: the applied rows and the fingerprints answer as before.
    let producer_id = StoreId::new(PRODUCER_ID).unwrap();
    let other = StoreId::new("99999999999999999999999999999999").unwrap();
    let o1 = &ev.o1;
    assert_eq!(consumer.receive(&o1[2]).unwrap(), Receipt::Duplicate);
    assert_eq!(
        consumer.receive(&ev.billing_o1_1).unwrap(),
        Receipt::Duplicate
    );
    assert_eq!(consumer.receive(&o1[0]).unwrap(), Receipt::Duplicate);
    assert_eq!(consumer.receive(&o1[3]).unwrap(), Receipt::Duplicate);
    let changed = |e: &Envelope| Envelope {
        payload: json!({ "amount": 1 }).as_object().unwrap().clone(),
        ..e.clone()
    };
    // A changed body at a fingerprinted seq, and at an applied row: a
    // conflict, or from the store that delivered the row, a rewind.
    for e in [&o1[0], &o1[1], &o1[2]] {
        let answers = consumer.receive_from(Some(&other), &[changed(e)]).unwrap();
        assert_eq!(answers[0].receipt, Receipt::Conflict, "{e:?}");
        assert_eq!(answers[0].held_event_id.as_ref(), Some(&e.event_id));
        let answers = consumer
            .receive_from(Some(&producer_id), &[changed(e)])
            .unwrap();
        assert_eq!(answers[0].receipt, Receipt::ProducerRewound, "{e:?}");
    }
    // The named producer's namespace is its own: same flow id, same seq.
    let answers = consumer
        .receive_from(Some(&producer_id), &[changed(&ev.billing_o1_1)])
        .unwrap();
    assert_eq!(answers[0].receipt, Receipt::Conflict);
    assert_eq!(
        consumer.receive(&ev.held_o3_1).unwrap(),
        Receipt::Duplicate,
        "the skipped row"
    );
    assert_eq!(consumer.receive(&ev.o3_1).unwrap(), Receipt::Conflict);
    assert_eq!(
        rows(consumer.connection(), INBOX_ROWS),
        inbox_before,
        "nothing of this was stored"
    );

    // The effect intents, listed and claimed through the effect API.
    let listed: Vec<Listed> = consumer
        .effects(&EffectFilter::default(), 100)
        .unwrap()
        .into_iter()
        .map(|e| {
            let waiting = e.waiting_on.map(|k| k.as_str().to_owned());
            (
                e.key.as_str().to_owned(),
                e.state,
                e.attempts,
                e.result,
                waiting,
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            (
                key("billing", "o-1", 1, "notify"),
                EffectState::Pending,
                0,
                None,
                None
            ),
            (
                key("default", "o-1", 3, "notify"),
                EffectState::Succeeded,
                1,
                Some(r#"{"sent":true}"#.to_owned()),
                None
            ),
            (
                key("default", "o-1", 3, "mail"),
                EffectState::OutcomeUnknown,
                1,
                None,
                None
            ),
        ]
    );
    let now_ms = SystemClock.now_ms();
    let round = effect::claim(&mut consumer, &Notify, "exec", now_ms, 8).unwrap();
    let claimed: Vec<(&str, u32)> = (round.claimed.iter())
        .map(|c| (c.row.key.as_str(), c.attempt))
        .collect();
    assert_eq!(claimed, [(key("billing", "o-1", 1, "notify").as_str(), 1)]);
    let billing_key = EffectKey::new(key("billing", "o-1", 1, "notify")).unwrap();
    let entry = consumer.effect(&billing_key).unwrap().unwrap();
    assert_eq!((entry.state, entry.attempts), (EffectState::InFlight, 1));

    // The pending row applies; the blocked one holds.
    let mut handler = Notifying(Vec::new());
    process_all(&mut consumer, None, &mut handler, 64).unwrap();
    assert_eq!(handler.0, ["o-1-4"]);

    // Relaying the outbox's undelivered events, then applying them.
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
            ("o-1-1", true, false, 1),
            ("o-1-2", true, false, 1),
            ("o-1-3", true, false, 1),
            ("o-2-1", true, false, 1),
            ("o-3-1", false, true, 1),
            ("o-1-4", true, false, 1),
            ("o-3-2", false, false, 0),
            ("o-1-5", false, false, 1),
        ]
    );
    assert_eq!(
        (
            outbox[4].quarantine_reason.as_deref(),
            outbox[4].quarantine_detail.as_deref()
        ),
        (Some("conflict"), Some(CONFLICT_REASON))
    );
    let destinations = producer.destinations(2_000).unwrap();
    let names: Vec<&str> = destinations.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["default"]);
    assert_eq!(
        destinations[0]
            .consumer_store_id
            .as_ref()
            .map(StoreId::as_str),
        Some(CONSUMER_ID)
    );
    assert_eq!(
        (
            destinations[0].status.backlog,
            destinations[0].status.quarantined
        ),
        (3, 1)
    );
    let report = relay(
        &mut producer,
        &mut consumer,
        &RelayOptions::default(),
        &SystemClock,
    )
    .unwrap();
    let mut delivered: Vec<(&str, Receipt)> = (report.deliveries.iter())
        .map(|d| (d.event_id.as_str(), d.receipt))
        .collect();
    delivered.sort_by_key(|d| d.0);
    assert_eq!(
        delivered,
        [("o-1-5", Receipt::Accepted), ("o-3-2", Receipt::Accepted)],
        "{report:?}"
    );
    let mut handler = Notifying(Vec::new());
    process_all(&mut consumer, None, &mut handler, 64).unwrap();
    assert_eq!(handler.0, ["o-1-5", "o-3-2"]);
    let destinations = producer.destinations(SystemClock.now_ms()).unwrap();
    assert_eq!(
        (
            destinations[0].status.backlog,
            destinations[0].status.quarantined
        ),
        (1, 1)
    );

    let statuses: Vec<(String, InboxStatus)> = (consumer.inbox().unwrap().into_iter())
        .map(|r| (r.envelope.event_id.as_str().to_owned(), r.status))
        .collect();
    assert_eq!(
        statuses,
        [
            ("o-1-1".to_owned(), InboxStatus::Applied),
            ("o-1-3".to_owned(), InboxStatus::Applied),
            ("o-1-4".to_owned(), InboxStatus::Applied),
            ("o-1-5".to_owned(), InboxStatus::Applied),
            ("o-2-1".to_owned(), blocked),
            ("o-3-1".to_owned(), InboxStatus::Skipped),
            ("o-3-2".to_owned(), InboxStatus::Applied),
        ]
    );
    // The new rows after the old ones, in the order received.
    assert_eq!(
        by_rowid(consumer.connection()),
        ids(&[
            ("default", "o-1-3"),
            ("default", "o-2-1"),
            ("default", "o-3-1"),
            ("default", "o-1-4"),
            ("billing", "o-1-1"),
            ("default", "o-1-5"),
            ("default", "o-3-2"),
        ])
    );
    let cursors = rows(
        consumer.connection(),
        "SELECT flow_id, producer, applied_seq FROM inbox_cursor ORDER BY flow_id, producer",
    );
    let cursor = |f: &str, p: &str, s: i64| {
        vec![
            Value::Text(f.to_owned()),
            Value::Text(p.to_owned()),
            Value::Integer(s),
        ]
    };
    assert_eq!(
        cursors,
        [
            cursor("o-1", "billing", 1),
            cursor("o-1", "default", 5),
            cursor("o-3", "default", 2),
        ]
    );

    // The new intents: o-1's wait for the intent whose outcome is unknown
    // (both effects ordered); o-3's waits for nothing.
    let mail = key("default", "o-1", 3, "mail");
    let new: Vec<(String, EffectState, Option<String>)> = consumer
        .effects(
            &EffectFilter {
                state: Some(EffectState::Pending),
                ..Default::default()
            },
            100,
        )
        .unwrap()
        .into_iter()
        .map(|e| {
            let waiting = e.waiting_on.map(|k| k.as_str().to_owned());
            (e.key.as_str().to_owned(), e.state, waiting)
        })
        .collect();
    assert_eq!(
        new,
        [
            (
                key("default", "o-1", 4, "notify"),
                EffectState::Pending,
                Some(mail.clone())
            ),
            (
                key("default", "o-1", 5, "notify"),
                EffectState::Pending,
                Some(mail)
            ),
            (
                key("default", "o-3", 2, "notify"),
                EffectState::Pending,
                None
            ),
        ]
    );
    let round = effect::claim(&mut consumer, &Notify, "exec", SystemClock.now_ms(), 8).unwrap();
    let claimed: Vec<&str> = round.claimed.iter().map(|c| c.row.key.as_str()).collect();
    assert_eq!(claimed, [key("default", "o-3", 2, "notify").as_str()]);
}

#[test]
fn a_seventh_version_file_is_upgraded_once_and_reopened_unchanged() {
    let (_dir, p, c, _ev) = built_pair();
    let ledger = Schema::new("ledger").unwrap();
    let all = |conn: &Connection| {
        let mut tables = vec![
            rows(conn, "SELECT rowid, * FROM inbox ORDER BY rowid"),
            rows(conn, "SELECT * FROM sqlite_schema ORDER BY name"),
            rows(conn, "PRAGMA schema_version"),
        ];
        tables.extend(snapshot(conn, &CONSUMER_TABLES));
        tables
    };
    let first = {
        let consumer = ConsumerDb::open(&c, &ledger).unwrap();
        all(consumer.connection())
    };
    let producer_first = {
        let producer = ProducerDb::open(&p, &ledger).unwrap();
        snapshot(producer.connection(), &PRODUCER_TABLES)
    };
    for _ in 0..2 {
        let consumer = ConsumerDb::open(&c, &ledger).unwrap();
        assert_eq!(header(consumer.connection()).0, SCHEMA_VERSION);
        assert_eq!(all(consumer.connection()), first);
        let producer = ProducerDb::open(&p, &ledger).unwrap();
        assert_eq!(
            snapshot(producer.connection(), &PRODUCER_TABLES),
            producer_first
        );
    }
    // The read-only check passes it, and an open that creates nothing changes nothing.
    ConsumerDb::check_existing(&c).unwrap();
    let options = OpenOptions {
        create: false,
        ..OpenOptions::default()
    };
    let consumer = ConsumerDb::open_with(&c, &ledger, Arc::new(SystemClock), &options).unwrap();
    assert_eq!(all(consumer.connection()), first);
}

#[test]
fn a_failed_upgrade_leaves_the_seventh_version_file_as_it_was() {
    let (_dir, _p, c, _ev) = built_pair();
    // A table in the way of the rebuild's temporary name.
    execute(&c, "CREATE TABLE inbox_v7 (note TEXT);");
    let before = |conn: &Connection| {
        let mut all = vec![
            rows(conn, INBOX_ROWS),
            rows(
                conn,
                "SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY name",
            ),
        ];
        all.extend(snapshot(conn, &CONSUMER_TABLES));
        all
    };
    let was = before(&Connection::open(&c).unwrap());
    let ledger = Schema::new("ledger").unwrap();
    let error = ConsumerDb::open(&c, &ledger)
        .err()
        .expect("the rebuild fails");
    assert!(error.to_string().contains("inbox_v7"), "{error}");
    {
        let conn = Connection::open(&c).unwrap();
        assert_eq!(header(&conn), (7, i64::from(APPLICATION_ID)));
        assert!(inbox_sql(&conn).ends_with(") WITHOUT ROWID"));
        assert_eq!(before(&conn), was);
        conn.execute_batch("DROP TABLE inbox_v7;").unwrap();
    }
    // Out of the way, the same file upgrades.
    let consumer = ConsumerDb::open(&c, &ledger).unwrap();
    assert_eq!(header(consumer.connection()).0, SCHEMA_VERSION);
    assert_eq!(rows(consumer.connection(), INBOX_ROWS), was[0]);
}

/// Reads every producer row of `p` at version 7 or 8, with its objects.
fn producer_before(p: &Path) -> (Vec<Vec<Vec<Value>>>, Vec<Vec<Value>>) {
    let conn = Connection::open(p).unwrap();
    (snapshot(&conn, &PRODUCER_TABLES_V7), objects(&conn, ""))
}

#[test]
fn an_eighth_version_producer_file_gets_integer_flow_keys_and_goes_on_relaying() {
    let (_dir, p, _c, ev) = built_pair();
    execute(&p, "PRAGMA user_version = 8;");
    let (rows_before, objects_before) = producer_before(&p);
    let ledger = Schema::new("ledger").unwrap();
    let mut producer = ProducerDb::open(&p, &ledger).unwrap();
    assert_eq!(
        header(producer.connection()),
        (9, i64::from(APPLICATION_ID))
    );
    assert_producer_upgraded(producer.connection(), &rows_before, &objects_before);
    // A new flow, first in text order, gets the next key; every flow's
    // next seq follows on from its head.
    let new_flow = event("a-0", 1, 7);
    producer
        .append_events(std::slice::from_ref(&new_flow))
        .unwrap();
    producer.append_events(&[event("o-3", 3, 7)]).unwrap();
    let keys = rows(
        producer.connection(),
        "SELECT flow_id, flow, last_seq FROM outbox_head ORDER BY flow",
    );
    let text = |s: &str| Value::Text(s.to_owned());
    let int = Value::Integer;
    assert_eq!(
        keys,
        [
            vec![text("o-1"), int(1), int(5)],
            vec![text("o-2"), int(2), int(1)],
            vec![text("o-3"), int(3), int(3)],
            vec![text("a-0"), int(4), int(1)],
        ]
    );
    let refused = producer.append_events(&[event("o-1", 5, 7)]).unwrap_err();
    assert!(refused.to_string().contains("seq"), "{refused}");
    // The relay hands the due heads, the new flow's among them, by the
    // rebuilt relay heads.
    let round = producer
        .fair_round(16, &Default::default(), i64::MAX)
        .unwrap();
    let ids: Vec<&str> = round.iter().map(|e| e.event_id.as_str()).collect();
    assert!(ids.contains(&new_flow.event_id.as_str()), "{ids:?}");
    assert!(ids.contains(&ev.o1[4].event_id.as_str()), "{ids:?}");
}

#[test]
fn a_failed_producer_upgrade_leaves_the_file_as_it_was() {
    let (_dir, p, _c, _ev) = built_pair();
    let ledger = Schema::new("ledger").unwrap();
    let whole = |p: &Path| {
        let conn = Connection::open(p).unwrap();
        let mut all = snapshot(&conn, &PRODUCER_TABLES_V7);
        all.push(rows(
            &conn,
            "SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY name",
        ));
        all.push(vec![vec![Value::Integer(header(&conn).0)]]);
        all
    };
    // Each damage is refused with a message naming it, nothing changed:
    // a table in the way of the rebuild's temporary names, then an outbox
    // row whose flow has no head (it cannot be given a key).
    for (damage, named) in [
        ("CREATE TABLE outbox_v8 (note TEXT);", "outbox_v8"),
        (
            "DROP TABLE outbox_v8; DELETE FROM outbox_head WHERE flow_id = 'o-2';",
            "outbox.flow",
        ),
    ] {
        execute(&p, damage);
        let was = whole(&p);
        let error = ProducerDb::open(&p, &ledger)
            .err()
            .expect("the rebuild fails");
        assert!(error.to_string().contains(named), "{error}");
        assert_eq!(whole(&p), was);
    }
}
