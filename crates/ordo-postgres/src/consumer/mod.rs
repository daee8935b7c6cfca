//! The consumer store: the inbox, the per-flow apply cursor, the prune
//! fingerprints and watermarks and the repair log in ordo's consumer
//! schema, beside the application's own tables.
//!
//! - `receive`: durable custody, dedup and conflict detection;
//! - `apply`: the application's handler run in order per flow;
//! - `ops`: listing, repairs, status and pruning.
//!
//! Invariant: this module never reads or writes the application's tables;
//! only the handler does, through the [`PgTx`] it is handed.

mod apply;
mod effects;
pub use apply::ApplyTx;
mod ops;
mod receive;

pub(crate) use ops::inbox_entry;

use std::sync::Arc;

use ordo_core::ops::{whole_read, whole_read_limit, WHOLE_READ_ROWS_MAX};
use ordo_core::{Clock, Envelope, InboxRecord, StoreError};

use crate::browse;
use crate::conn::{open, Opened, PgOptions, PgTx, Role, Tables};
use crate::producer::stored_envelope;
use crate::wake::Wake;

/// ordo's consumer tables, version by version.
pub(crate) const TABLES: Tables = Tables {
    role: Role::Consumer,
    ddl: DDL,
    migrations: &[
        // 2: an apply cursor row for every flow with a stored event, even
        // before its first apply (at 0), so that appliers lock the flow's
        // row.
        "ALTER TABLE {s}.inbox_cursor DROP CONSTRAINT inbox_cursor_applied_seq_check;
         ALTER TABLE {s}.inbox_cursor ADD CONSTRAINT inbox_cursor_applied_seq_check
             CHECK (applied_seq >= 0);
         INSERT INTO {s}.inbox_cursor (flow_id, applied_seq)
             SELECT DISTINCT flow_id, 0 FROM {s}.inbox ON CONFLICT (flow_id) DO NOTHING;",
        // 3: nothing for the consumer (the producer's leases name their
        // holder's server session).
        "SELECT 1;",
        // 4: room on each page of the apply cursors for the applies that
        // move them to stay on their page (HOT updates: no new index
        // entries).
        "ALTER TABLE {s}.inbox_cursor SET (fillfactor = 50);",
        // 5: nothing for the consumer (the producer's leases moved into
        // its heads).
        "SELECT 1;",
        // 6: the store's identity.
        crate::conn::STORE_ID_MIGRATION,
        // 7: each row, and its fingerprint after pruning, keeps the
        // producer store that delivered it.
        "ALTER TABLE {s}.inbox ADD COLUMN IF NOT EXISTS store_id text;
         ALTER TABLE {s}.inbox_fingerprint ADD COLUMN IF NOT EXISTS store_id text;",
        // 8: nothing of the consumer's (the producer's destinations).
        "SELECT 1;",
        // 9: each identity in the namespace of the producer that appended
        // the event (PROTOCOL.md section 12); every row stored before is
        // the default producer's. The event id, then the flow id, leads
        // each key, so the reads by either stay on their index.
        "ALTER TABLE {s}.inbox ADD COLUMN producer text COLLATE \"C\" NOT NULL DEFAULT 'default';
         ALTER TABLE {s}.inbox ALTER COLUMN producer DROP DEFAULT;
         ALTER TABLE {s}.inbox DROP CONSTRAINT inbox_pkey;
         ALTER TABLE {s}.inbox ADD PRIMARY KEY (event_id, producer);
         ALTER TABLE {s}.inbox DROP CONSTRAINT inbox_flow_id_seq_key;
         ALTER TABLE {s}.inbox ADD CONSTRAINT inbox_flow_id_producer_seq_key
             UNIQUE (flow_id, producer, seq);
         DROP INDEX {s}.inbox_pending;
         CREATE INDEX inbox_pending ON {s}.inbox (flow_id, producer) WHERE status = 'pending';
         DROP INDEX {s}.inbox_blocked;
         CREATE INDEX inbox_blocked ON {s}.inbox (flow_id, producer) WHERE status = 'blocked';
         ALTER TABLE {s}.inbox_cursor ADD COLUMN producer text COLLATE \"C\" NOT NULL DEFAULT 'default';
         ALTER TABLE {s}.inbox_cursor ALTER COLUMN producer DROP DEFAULT;
         ALTER TABLE {s}.inbox_cursor DROP CONSTRAINT inbox_cursor_pkey;
         ALTER TABLE {s}.inbox_cursor ADD PRIMARY KEY (flow_id, producer);
         ALTER TABLE {s}.inbox_fingerprint ADD COLUMN producer text COLLATE \"C\" NOT NULL DEFAULT 'default';
         ALTER TABLE {s}.inbox_fingerprint ALTER COLUMN producer DROP DEFAULT;
         ALTER TABLE {s}.inbox_fingerprint DROP CONSTRAINT inbox_fingerprint_pkey;
         ALTER TABLE {s}.inbox_fingerprint ADD PRIMARY KEY (flow_id, producer, seq);
         ALTER TABLE {s}.inbox_fingerprint DROP CONSTRAINT inbox_fingerprint_event_id_key;
         ALTER TABLE {s}.inbox_fingerprint ADD CONSTRAINT inbox_fingerprint_event_id_producer_key
             UNIQUE (event_id, producer);
         ALTER TABLE {s}.inbox_watermark ADD COLUMN producer text COLLATE \"C\" NOT NULL DEFAULT 'default';
         ALTER TABLE {s}.inbox_watermark ALTER COLUMN producer DROP DEFAULT;
         ALTER TABLE {s}.inbox_watermark ADD COLUMN store_id text;
         ALTER TABLE {s}.inbox_watermark DROP CONSTRAINT inbox_watermark_pkey;
         ALTER TABLE {s}.inbox_watermark ADD PRIMARY KEY (flow_id, producer);
         ALTER TABLE {s}.repair_log ADD COLUMN producer text COLLATE \"C\" NOT NULL DEFAULT 'default';
         ALTER TABLE {s}.repair_log ADD COLUMN store_id text;",
        // 10: nothing of the consumer's (the producer's custody per
        // destination).
        "SELECT 1;",
        // 11: effect intents (EFFECTS.md), recorded in the apply
        // transaction of their event; the repair log names the intent an
        // operator acted on.
        EFFECTS_MIGRATION,
    ],
};

/// Version 11: the effect intents and which effects run in order.
const EFFECTS_MIGRATION: &str = "
CREATE TABLE {s}.effect_intent (
    key                 text    COLLATE \"C\" PRIMARY KEY,
    name                text    COLLATE \"C\" NOT NULL,
    producer            text    COLLATE \"C\" NOT NULL,
    flow_id             text    COLLATE \"C\" NOT NULL,
    seq                 bigint  NOT NULL CHECK (seq >= 1),
    position            integer NOT NULL CHECK (position >= 0),
    event_id            text    COLLATE \"C\" NOT NULL,
    request             text    NOT NULL,
    state               text    NOT NULL CHECK (state IN ('pending', 'in_flight', 'succeeded',
                                   'failed', 'outcome_unknown', 'skipped')),
    attempts            integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    attempts_base       integer NOT NULL DEFAULT 0 CHECK (attempts_base >= 0),
    unknown_seen        boolean NOT NULL DEFAULT false,
    reconciling         boolean NOT NULL DEFAULT false,
    lease_owner         text,
    lease_until_ms      bigint,
    first_attempt_at_ms bigint,
    next_attempt_at_ms  bigint  NOT NULL,
    result              text,
    last_error          text,
    recorded_at_ms      bigint  NOT NULL,
    updated_at_ms       bigint  NOT NULL,
    settled_at_ms       bigint,
    UNIQUE (flow_id, producer, seq, position),
    CHECK ((state = 'in_flight') = (lease_until_ms IS NOT NULL))
);
CREATE INDEX effect_intent_due ON {s}.effect_intent (name, next_attempt_at_ms)
    WHERE state = 'pending';
CREATE INDEX effect_intent_leased ON {s}.effect_intent (name, lease_until_ms)
    WHERE state = 'in_flight';
CREATE INDEX effect_intent_settled ON {s}.effect_intent (settled_at_ms)
    WHERE settled_at_ms IS NOT NULL;
CREATE TABLE {s}.effect_order (
    name    text    COLLATE \"C\" PRIMARY KEY,
    ordered boolean NOT NULL
);
ALTER TABLE {s}.repair_log ADD COLUMN key text;
";

/// ordo's consumer tables as version 1 created them (`{s}` is the schema).
const DDL: &str = "
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
";

/// The consumer's store on PostgreSQL: the inbox (every received event,
/// durably, with its status), the per-flow apply cursor, and the
/// application's own tables (declared by its [`Schema`](crate::Schema), written by its
/// [`ApplyHandler`](ordo_core::ApplyHandler) through [`PgTx`]), over one connection.
pub struct PgConsumer {
    conn: PgTx,
    domain: String,
    store_id: ordo_core::StoreId,
    clock: Arc<dyn Clock>,
    commits: u64,
    wake: Wake,
}

impl PgConsumer {
    ordo_core::open_constructors!(PgConsumer, url: &str, PgOptions, TABLES, open);
    crate::conn::store_accessors!(Role::Consumer);

    fn from_opened(opened: Opened, clock: Arc<dyn Clock>, _: &PgOptions) -> PgConsumer {
        PgConsumer {
            conn: opened.conn,
            domain: opened.domain,
            store_id: opened.store_id,
            clock,
            commits: 0,
            wake: opened.wake,
        }
    }

    /// Runs `f` in one write transaction; commits on `Ok`.
    fn write<T>(
        &mut self,
        context: &str,
        f: impl FnOnce(&PgTx, i64) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let clock = &self.clock;
        let value = self.conn.in_tx(context, |tx| f(tx, clock.now_ms()))?;
        self.commits += 1;
        Ok(value)
    }
}

pub(crate) use ordo_core::apply::stored_status as inbox_status;

/// Every inbox row, ordered by flow id then seq, read through `conn` (for
/// reads inside [`PgConsumer::read`] beside the application's own tables).
pub fn read_inbox(conn: &PgTx) -> Result<Vec<InboxRecord>, StoreError> {
    read_inbox_at_most(conn, WHOLE_READ_ROWS_MAX)
}

pub(crate) fn read_inbox_at_most(
    conn: &PgTx,
    rows_max: usize,
) -> Result<Vec<InboxRecord>, StoreError> {
    let rows = conn.rows(
        "consumer: cannot read the inbox",
        "SELECT body, status, reason, detail FROM {s}.inbox ORDER BY flow_id, producer, seq LIMIT $1",
        &[&whole_read_limit(rows_max)],
    )?;
    let records = rows
        .iter()
        .map(|row| {
            Ok(InboxRecord {
                envelope: stored_envelope("consumer: stored inbox body", row.get(0))?,
                status: inbox_status(row.get(1), row.get(2), row.get(3))?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    whole_read("the inbox", rows_max, records)
}

// The signal is raised by every commit of this process that stores a new
// event in this store (through any handle on the same URL and schema).
// Another process's receive (or one of this process on another URL) is
// heard on [`PgConsumer::notify_channel`] by a listening connection of the
// handle's own, opened by the first call (which says yes) and read by a
// thread of its own: no I/O in the call. A failed listening connection is
// that call's error once; a later call opens a new one.
ordo_core::run_store_impl!(PgConsumer, |db|
    signal: db.wake.signal(),
    changed_elsewhere: db.wake.changed_elsewhere(),
);

impl ordo_core::RunConsumer for PgConsumer {
    fn received_at_ms(tx: &PgTx, event: &Envelope) -> Result<Option<i64>, StoreError> {
        let row = tx.row(
            "consumer: cannot read when an event was received",
            "SELECT received_at_ms FROM {s}.inbox WHERE flow_id = $1 AND producer = $3 AND seq = $2",
            &[
                &event.flow_id.as_str(),
                &event.seq.get(),
                &event.producer.as_str(),
            ],
        )?;
        Ok(row.map(|row| row.get(0)))
    }
}

ordo_core::consumer_store_impls! {
    store: PgConsumer, tx: PgTx, inbox: read_inbox,
    receive: receive, ops: ops, browse: browse, apply: apply,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::plans::{Filled, FLOWS};
    use crate::{PgConsumer, PgOptions, PgProducer};

    /// The whole-table reads stop at their bound with an error instead of
    /// reading on: the outbox and the inbox of [`FLOWS`] rows read whole at
    /// that bound, and refused one row below it.
    #[test]
    fn whole_table_reads_are_bounded() {
        let filled = Filled::new("bounded");
        let options = |schema: &str| PgOptions {
            schema: Some(schema.to_owned()),
            ..PgOptions::default()
        };
        let clock = Arc::new(ordo_core::SystemClock);
        let rows = usize::try_from(FLOWS).unwrap();
        let producer =
            PgProducer::open_existing(&filled.url, clock.clone(), &options(&filled.p)).unwrap();
        let outbox = crate::producer::read_outbox_at_most(producer.connection(), rows).unwrap();
        assert_eq!(outbox.len(), rows);
        let past = crate::producer::read_outbox_at_most(producer.connection(), rows - 1);
        let past = past.unwrap_err().to_string();
        assert!(
            past.contains(&format!("more than {} rows", rows - 1)),
            "{past}"
        );

        let consumer = PgConsumer::open_existing(&filled.url, clock, &options(&filled.c)).unwrap();
        let conn = &consumer.conn;
        assert_eq!(super::read_inbox_at_most(conn, rows).unwrap().len(), rows);
        let past = super::read_inbox_at_most(conn, rows - 1).unwrap_err();
        assert!(past.to_string().contains("more than"), "{past}");
        assert!(super::ops::repairs_at_most(conn, 0).unwrap().is_empty());
    }
}
