//! The producer file's own tables: the outbox, its heads, and (from
//! [`crate::custody`]) custody per destination; how a new file gets them
//! and how an earlier one is brought to the current version.

use crate::conn::{Role, Tables};
use crate::custody;

/// The outbox and its heads at version 9: a flow has an integer key in
/// this file (`outbox_head.flow`), which the outbox's `(flow, seq)` index
/// and the relay heads use in place of its text id.
macro_rules! outbox_ddl {
    () => {
        "
CREATE TABLE IF NOT EXISTS outbox (
    position           INTEGER PRIMARY KEY,
    event_id           TEXT    NOT NULL UNIQUE,
    flow_id            TEXT    NOT NULL,
    -- The flow's key in this file: outbox_head.flow.
    flow               INTEGER NOT NULL,
    seq                INTEGER NOT NULL CHECK (seq >= 1),
    schema_version     INTEGER NOT NULL,
    type               TEXT    NOT NULL,
    body               TEXT    NOT NULL,
    created_at_ms      INTEGER NOT NULL,
    -- Settled: every destination of its flow holds it or abandoned it.
    accepted           INTEGER NOT NULL DEFAULT 0 CHECK (accepted IN (0, 1)),
    accepted_at_ms     INTEGER,
    UNIQUE (flow, seq)
);
-- One row per flow ever appended to, never deleted once committed.
CREATE TABLE IF NOT EXISTS outbox_head (
    flow         INTEGER PRIMARY KEY,
    flow_id      TEXT    NOT NULL UNIQUE,
    last_seq     INTEGER NOT NULL CHECK (last_seq >= 1)
);
"
    };
}

const SCHEMA: &str = concat!(
    outbox_ddl!(),
    "INSERT OR IGNORE INTO ordo_meta (key, value) VALUES ('relay_turn', 0);",
    custody::custody_ddl!(),
    custody::relay_head_ddl!(),
    "
INSERT INTO destination (name, start, consumer_store_id, created_at_ms)
    SELECT 'default', 'start', NULL, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
    WHERE NOT EXISTS (SELECT 1 FROM destination);
"
);

/// Version 9 of an earlier producer file: the outbox, its heads and the
/// relay heads rebuilt with the flows' integer keys (in the order of their
/// text ids), every row kept; the outbox's and heads' columns unused since
/// version 5 are left behind. A row whose flow has no head fails the
/// upgrade (`outbox.flow` is NOT NULL), which then changes nothing.
const UPGRADE_FROM_8: &str = concat!(
    "
ALTER TABLE outbox_head RENAME TO outbox_head_v8;
ALTER TABLE outbox RENAME TO outbox_v8;
ALTER TABLE relay_head RENAME TO relay_head_v8;
DROP INDEX relay_head_turn;
",
    outbox_ddl!(),
    custody::relay_head_ddl!(),
    "
INSERT INTO outbox_head (flow_id, last_seq)
    SELECT flow_id, last_seq FROM outbox_head_v8 ORDER BY flow_id;
INSERT INTO outbox (position, event_id, flow_id, flow, seq, schema_version, type, body,
        created_at_ms, accepted, accepted_at_ms)
    SELECT o.position, o.event_id, o.flow_id, h.flow, o.seq, o.schema_version, o.type, o.body,
        o.created_at_ms, o.accepted, o.accepted_at_ms
    FROM outbox_v8 o LEFT JOIN outbox_head h ON h.flow_id = o.flow_id ORDER BY o.position;
INSERT INTO relay_head (flow, destination, relay_seq, relay_due_ms, relay_turn, relay_stop_seq,
        abandoned_seq)
    SELECT h.flow, r.destination, r.relay_seq, r.relay_due_ms, r.relay_turn, r.relay_stop_seq,
        r.abandoned_seq
    FROM relay_head_v8 r LEFT JOIN outbox_head h ON h.flow_id = r.flow_id;
DROP TABLE relay_head_v8;
DROP TABLE outbox_v8;
DROP TABLE outbox_head_v8;
"
);

pub(crate) const TABLES: Tables = Tables {
    role: Role::Producer,
    create: SCHEMA,
    upgrade_from_1: "",
    upgrade_from_3: "ALTER TABLE outbox_head ADD COLUMN relay_stop_seq INTEGER;",
    upgrade_from_4: custody::UPGRADE_FROM_4,
    upgrade_from_5: "",
    upgrade_from_6: "",
    upgrade_from_7: "",
    upgrade_from_8: UPGRADE_FROM_8,
};
