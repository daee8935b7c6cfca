//! The consumer's own tables and how their rows are read back.

use ordo_core::ops::{whole_read, whole_read_limit, InboxEntry, WHOLE_READ_ROWS_MAX};
use ordo_core::{InboxFlow, InboxRecord, StoreError, StoreId};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::conn::{collect_rows, sql_error, Tables};
use crate::producer::stored_envelope;

/// The consumer's tables and indexes (`IF NOT EXISTS`): each identity is
/// in the namespace of the producer that appended the event (PROTOCOL.md
/// section 12), `(producer, event_id)` and `(producer, flow_id, seq)`, with
/// the flow id first in every key so that a flow id range stays one range.
macro_rules! consumer_ddl {
    () => {
        "
-- A table with a rowid: each row, its body included, is stored once, in
-- receive order, and the two identities are indexes of it; keyed by an
-- identity (WITHOUT ROWID) a row's body sat in the key's b-tree, which
-- every lookup and insert walked.
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
);
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
"
    };
}

const SCHEMA: &str = consumer_ddl!();

/// Version 6 of an earlier consumer file: its rows, cursors, fingerprints
/// and watermarks become the default producer's, in tables keyed by
/// producer (rebuilt: SQLite cannot change a primary key in place).
const UPGRADE_FROM_5: &str = concat!(
    "
DROP INDEX IF EXISTS inbox_pending;
DROP INDEX IF EXISTS inbox_blocked;
ALTER TABLE inbox RENAME TO inbox_v5;
ALTER TABLE inbox_cursor RENAME TO inbox_cursor_v5;
ALTER TABLE inbox_fingerprint RENAME TO inbox_fingerprint_v5;
ALTER TABLE inbox_watermark RENAME TO inbox_watermark_v5;
ALTER TABLE repair_log ADD COLUMN producer TEXT NOT NULL DEFAULT 'default';
ALTER TABLE repair_log ADD COLUMN store_id TEXT;
",
    consumer_ddl!(),
    "
INSERT INTO inbox (producer, event_id, flow_id, seq, schema_version, type, body, body_hash,
        status, reason, detail, received_at_ms, settled_at_ms, store_id)
    SELECT 'default', event_id, flow_id, seq, schema_version, type, body, body_hash,
        status, reason, detail, received_at_ms, settled_at_ms, store_id FROM inbox_v5;
INSERT INTO inbox_cursor (flow_id, producer, applied_seq)
    SELECT flow_id, 'default', applied_seq FROM inbox_cursor_v5;
INSERT INTO inbox_fingerprint (flow_id, producer, seq, event_id, body_hash, status, store_id)
    SELECT flow_id, 'default', seq, event_id, body_hash, status, store_id FROM inbox_fingerprint_v5;
INSERT INTO inbox_watermark (flow_id, producer, pruned_seq, store_id)
    SELECT flow_id, 'default', pruned_seq, NULL FROM inbox_watermark_v5;
DROP TABLE inbox_v5;
DROP TABLE inbox_cursor_v5;
DROP TABLE inbox_fingerprint_v5;
DROP TABLE inbox_watermark_v5;
"
);

/// Version 8 of an earlier consumer file: the inbox rebuilt as a table with
/// a rowid (SQLite cannot drop `WITHOUT ROWID` in place), its rows in the
/// order they were received.
const UPGRADE_FROM_7: &str = concat!(
    "
DROP INDEX IF EXISTS inbox_pending;
DROP INDEX IF EXISTS inbox_blocked;
ALTER TABLE inbox RENAME TO inbox_v7;
",
    consumer_ddl!(),
    "
INSERT INTO inbox (producer, event_id, flow_id, seq, schema_version, type, body, body_hash,
        status, reason, detail, received_at_ms, settled_at_ms, store_id)
    SELECT producer, event_id, flow_id, seq, schema_version, type, body, body_hash,
        status, reason, detail, received_at_ms, settled_at_ms, store_id FROM inbox_v7
    ORDER BY received_at_ms, flow_id, producer, seq;
DROP TABLE inbox_v7;
"
);

pub(super) const TABLES: Tables = Tables {
    role: ordo_core::Role::Consumer,
    create: SCHEMA,
    upgrade_from_1: "ALTER TABLE inbox ADD COLUMN detail TEXT;",
    upgrade_from_3: "ALTER TABLE inbox ADD COLUMN store_id TEXT;
        ALTER TABLE inbox_fingerprint ADD COLUMN store_id TEXT;",
    upgrade_from_4: "",
    upgrade_from_5: UPGRADE_FROM_5,
    // Version 7: effect intents; the repair log names the intent acted on.
    upgrade_from_6: "ALTER TABLE repair_log ADD COLUMN key TEXT;",
    upgrade_from_7: UPGRADE_FROM_7,
    upgrade_from_8: "",
};

pub(super) use ordo_core::apply::stored_status as inbox_status;

/// The columns an inbox listing reads, in this order: `body, status,
/// reason, received_at_ms, settled_at_ms, detail, store_id`.
pub(super) type EntryRow = (
    String,
    String,
    Option<String>,
    i64,
    Option<i64>,
    Option<String>,
    Option<String>,
);

/// Reads the columns of an [`EntryRow`] from `row`.
pub(super) fn entry_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<EntryRow> {
    row.try_into()
}

/// The inbox entry of a row read by [`entry_row`].
pub(super) fn inbox_entry(row: EntryRow) -> Result<InboxEntry, StoreError> {
    let (body, status, reason, received_at_ms, settled_at_ms, detail, store_id) = row;
    Ok(InboxEntry {
        envelope: stored_envelope("consumer: stored inbox body", &body)?,
        status: inbox_status(&status, reason.as_deref(), detail)?,
        received_at_ms,
        settled_at_ms,
        store_id: StoreId::stored_sender(store_id)?,
    })
}

pub(super) fn begin_write(conn: &mut Connection) -> Result<rusqlite::Transaction<'_>, StoreError> {
    conn.transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| sql_error("consumer: cannot begin a write transaction", e))
}

/// The flow's apply cursor: the last applied (or skipped) seq, 0 if none.
pub(super) fn read_cursor(tx: &Connection, flow: &InboxFlow) -> Result<i64, StoreError> {
    let mut statement = tx.prepare_cached(READ_CURSOR).map_err(read_cursor_error)?;
    read_cursor_with(&mut statement, flow)
}

/// The statement of [`read_cursor`].
pub(super) const READ_CURSOR: &str =
    "SELECT applied_seq FROM inbox_cursor WHERE flow_id = ?1 AND producer = ?2";

/// [`read_cursor`] through `statement`, [`READ_CURSOR`] prepared.
pub(super) fn read_cursor_with(
    statement: &mut rusqlite::Statement<'_>,
    flow: &InboxFlow,
) -> Result<i64, StoreError> {
    Ok(statement
        .query_row([flow.flow_id.as_str(), flow.producer.as_str()], |row| {
            row.get(0)
        })
        .optional()
        .map_err(read_cursor_error)?
        .unwrap_or(0))
}

pub(super) fn read_cursor_error(e: rusqlite::Error) -> StoreError {
    sql_error("consumer: cannot read the apply cursor", e)
}

/// Moves the flow's apply cursor forward to `applied_seq`: a cursor never
/// moves back nor stays, so a move that would is refused as a corrupt store
/// and nothing is written.
pub(super) fn write_cursor(tx: &Connection, flow: &InboxFlow, seq: i64) -> Result<(), StoreError> {
    let mut statement = tx
        .prepare_cached(WRITE_CURSOR)
        .map_err(write_cursor_error)?;
    write_cursor_with(&mut statement, flow, seq)
}

/// The statement of [`write_cursor`].
pub(super) const WRITE_CURSOR: &str =
    "INSERT INTO inbox_cursor (flow_id, producer, applied_seq) VALUES (?1, ?2, ?3)
         ON CONFLICT (flow_id, producer) DO UPDATE SET applied_seq = excluded.applied_seq
         WHERE excluded.applied_seq > inbox_cursor.applied_seq";

/// [`write_cursor`] through `statement`, [`WRITE_CURSOR`] prepared.
pub(super) fn write_cursor_with(
    statement: &mut rusqlite::Statement<'_>,
    flow: &InboxFlow,
    applied_seq: i64,
) -> Result<(), StoreError> {
    let moved = statement
        .execute(params![
            flow.flow_id.as_str(),
            flow.producer.as_str(),
            applied_seq
        ])
        .map_err(write_cursor_error)?;
    ordo_core::apply::check_cursors_moved(moved as u64, 1, flow, applied_seq)
}

pub(super) fn write_cursor_error(e: rusqlite::Error) -> StoreError {
    sql_error("consumer: cannot move the apply cursor", e)
}

pub(super) fn read_inbox(conn: &Connection) -> Result<Vec<InboxRecord>, StoreError> {
    read_inbox_at_most(conn, WHOLE_READ_ROWS_MAX)
}

pub(crate) fn read_inbox_at_most(
    conn: &Connection,
    rows_max: usize,
) -> Result<Vec<InboxRecord>, StoreError> {
    let rows = collect_rows(
        conn,
        "consumer: cannot read the inbox",
        "SELECT body, status, reason, detail FROM inbox ORDER BY flow_id, producer, seq LIMIT ?1",
        [whole_read_limit(rows_max)],
        |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, Option<String>>(2)?,
                row.get::<_, Option<String>>(3)?,
            ))
        },
        |(body, status, reason, detail)| {
            Ok(InboxRecord {
                envelope: stored_envelope("consumer: stored inbox body", &body)?,
                status: inbox_status(&status, reason.as_deref(), detail)?,
            })
        },
    )?;
    whole_read("the inbox", rows_max, rows)
}
