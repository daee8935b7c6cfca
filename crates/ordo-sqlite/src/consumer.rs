//! The consumer store: inbox, apply cursor, projection and effects in one
//! SQLite file.

use std::path::Path;
use std::sync::Arc;

use ordo_core::crash;
use ordo_core::ops::{
    decide_skip, ConsumerStatus, GapWait, InboxEntry, Pruned, RepairRecord, SkipRefused,
    SkipRequest, GAPS_LISTED_MAX,
};
use ordo_core::reservation::{decide_apply, parse_state};
use ordo_core::store::{decide_receive, plan_apply, ApplyPlan, NextRow, StoredIdentities};
use ordo_core::{
    ApplyOptions, BlockReason, BodyHash, Clock, ConsumerStore, Drain, DrainStop, EffectRecord,
    Envelope, ErrorKind, EventId, FlowId, InboxRecord, InboxStatus, Projection, Quantity, Receipt,
    Seq, Step, StoreError, SystemClock,
};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::conn::{
    collect_rows, corrupt, exec_cached, open, row_cached, sql_error, OpenOptions, Role,
};
use crate::producer::stored_envelope;

const SCHEMA: &str = "
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

/// The consumer's SQLite file: the inbox (every received event, durably,
/// with its status), the per-flow apply cursor, and the reservation domain's
/// projection and effect records.
///
/// Every write runs in a `BEGIN IMMEDIATE` transaction on a file in WAL mode
/// with `synchronous=FULL`.
pub struct ConsumerDb {
    conn: Connection,
    clock: Arc<dyn Clock>,
    commits: u64,
}

/// Applies one event inside the consumer's apply transaction.
///
/// The handler writes its own projection and effect through `tx`, inside
/// the apply transaction; the store
/// marks the inbox row applied and moves the flow's cursor in the same
/// transaction, so all of it commits together or not at all. Returning
/// `Ok(Err(reason))` blocks the event: everything the handler wrote for it is
/// rolled back and the row is marked `blocked` with the reason, its body
/// unchanged.
///
/// A handler may be called for an event whose writes never commit: after a
/// crash or an error, and in a batch, where a block rolls the whole batch
/// back and runs it again with a savepoint around each event (see
/// [`ConsumerDb::apply_batch_with`]). Anything it keeps outside `tx` must
/// allow for that.
///
/// The inbox and the cursor are the store's: a batch moves a flow's cursor
/// once, after the flow's run, so a handler must not read them to learn
/// where the flow stands; the event it is given is the next one.
pub trait ApplyHandler {
    /// Applies `event`, the flow's next event after its applied seq.
    fn apply(
        &mut self,
        tx: &Connection,
        event: &Envelope,
        options: ApplyOptions,
    ) -> Result<Result<(), BlockReason>, StoreError>;
}

/// The reference domain's handler: validates the event against the flow's
/// projection, then updates the projection and inserts one effect record.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReservationHandler;

impl ApplyHandler for ReservationHandler {
    fn apply(
        &mut self,
        tx: &Connection,
        event: &Envelope,
        options: ApplyOptions,
    ) -> Result<Result<(), BlockReason>, StoreError> {
        let current = read_projection(tx, &event.flow_id)?;
        let next = match decide_apply(&current, event, options) {
            Ok(next) => next,
            Err(reason) => return Ok(Err(reason)),
        };
        let quantity = next.quantity.expect("an applied step has a quantity");
        exec_cached(tx,
            "INSERT INTO projection (flow_id, state, quantity, applied_seq) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (flow_id) DO UPDATE SET state = excluded.state, quantity = excluded.quantity,
                 applied_seq = excluded.applied_seq",
            params![next.flow_id.as_str(), next.state.as_str(), quantity.get(), next.applied_seq],
        )
        .map_err(|e| sql_error("consumer: cannot write the projection", e))?;
        crash::point(crash::CONSUMER_APPLY_AFTER_PROJECTION);
        exec_cached(
            tx,
            "INSERT INTO effect (flow_id, seq, event_id) VALUES (?1, ?2, ?3)",
            params![
                event.flow_id.as_str(),
                event.seq.get(),
                event.event_id.as_str()
            ],
        )
        .map_err(|e| sql_error("consumer: cannot insert the effect", e))?;
        crash::point(crash::CONSUMER_APPLY_AFTER_EFFECT);
        Ok(Ok(()))
    }
}

fn read_projection(conn: &Connection, flow_id: &FlowId) -> Result<Projection, StoreError> {
    let row: Option<(String, i64, i64)> = row_cached(
        conn,
        "SELECT state, quantity, applied_seq FROM projection WHERE flow_id = ?1",
        [flow_id.as_str()],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
    )
    .optional()
    .map_err(|e| sql_error("consumer: cannot read the projection", e))?;
    match row {
        None => Ok(Projection::empty(flow_id.clone())),
        Some((state, quantity, applied_seq)) => {
            projection(flow_id.as_str(), &state, quantity, applied_seq)
        }
    }
}

fn projection(
    flow_id: &str,
    state: &str,
    quantity: i64,
    applied_seq: i64,
) -> Result<Projection, StoreError> {
    let context = "consumer: stored projection";
    Ok(Projection {
        flow_id: FlowId::new(flow_id).map_err(|e| corrupt(context, e))?,
        state: parse_state(state).map_err(|e| corrupt(context, e))?,
        quantity: Some(Quantity::new(quantity).map_err(|e| corrupt(context, e))?),
        applied_seq,
    })
}

fn inbox_status(status: &str, reason: Option<&str>) -> Result<InboxStatus, StoreError> {
    let context = "consumer: stored inbox status";
    match (status, reason) {
        ("pending", None) => Ok(InboxStatus::Pending),
        ("applied", None) => Ok(InboxStatus::Applied),
        ("skipped", None) => Ok(InboxStatus::Skipped),
        ("blocked", Some(reason)) => BlockReason::parse(reason)
            .map(InboxStatus::Blocked)
            .ok_or_else(|| corrupt(context, format!("unknown reason {reason:?}"))),
        _ => Err(corrupt(
            context,
            format!("{status:?} with reason {reason:?}"),
        )),
    }
}

impl ConsumerDb {
    /// Opens or creates the consumer file with the system clock and default
    /// options. Existing state is never reset.
    pub fn open(path: impl AsRef<Path>) -> Result<ConsumerDb, StoreError> {
        ConsumerDb::open_with(path, Arc::new(SystemClock), &OpenOptions::default())
    }

    /// Refuses an existing file that is not an ordo consumer file (a foreign
    /// SQLite file, the other role, a newer schema), reading only; a missing
    /// file passes. Lets a caller check every file before creating any.
    pub fn check_existing(path: impl AsRef<Path>) -> Result<(), StoreError> {
        crate::conn::check_existing(path.as_ref(), Role::Consumer)
    }

    /// Opens or creates the consumer file with the given clock and options.
    pub fn open_with(
        path: impl AsRef<Path>,
        clock: Arc<dyn Clock>,
        options: &OpenOptions,
    ) -> Result<ConsumerDb, StoreError> {
        let conn = open(path.as_ref(), Role::Consumer, SCHEMA, options)?;
        Ok(ConsumerDb {
            conn,
            clock,
            commits: 0,
        })
    }

    /// The underlying connection, for reading pragmas and for the caller's
    /// own reads.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Applies the flow's next event through `handler` (see [`ApplyHandler`]).
    /// Looks only at `(flow_id, applied_seq + 1)`: never skips a gap, never
    /// passes a blocked event.
    pub fn apply_next_with<H: ApplyHandler + ?Sized>(
        &mut self,
        flow_id: &FlowId,
        handler: &mut H,
        options: ApplyOptions,
    ) -> Result<Step, StoreError> {
        let now_ms = self.clock.now_ms();
        let mut tx = begin_write(&mut self.conn)?;
        let applied_seq = read_cursor(&tx, flow_id)?;
        let (step, wrote) = step_in_tx(
            &mut tx,
            flow_id,
            applied_seq,
            handler,
            options,
            now_ms,
            Guard::Savepoint,
        )?
        .expect("a guarded step always ends");
        if let Step::Applied { seq } = step {
            write_cursor(&tx, flow_id, seq.get())?;
        }
        if wrote {
            self.commits += 1;
            tx.commit()
                .map_err(|e| sql_error("consumer: apply commit failed", e))?;
            if matches!(step, Step::Applied { .. }) {
                crash::point(crash::CONSUMER_APPLY_AFTER_COMMIT);
            }
        }
        Ok(step)
    }

    /// Drains the given flows, in order, each up to its own limit, in ONE
    /// transaction applying at most `events_max` events in all. Each event's
    /// projection change, effect and inbox mark commit together with the rest
    /// of the batch, still strictly in order per flow. Returns one drain per
    /// visited flow; when `events_max` runs out, the flow in progress stops
    /// with `limit` and the flows after it are not visited.
    ///
    /// The batch first runs without a savepoint around each event. When an
    /// event blocks, what the handler wrote for it cannot be told apart from
    /// the rest of the batch, so the whole transaction is rolled back and the
    /// batch runs again with a savepoint around each event; blocks are rare,
    /// and a handler must already expect a call whose writes never commit.
    pub fn apply_batch_with<H: ApplyHandler + ?Sized>(
        &mut self,
        flows: &[(FlowId, Option<u64>)],
        events_max: u64,
        handler: &mut H,
        options: ApplyOptions,
    ) -> Result<Vec<Drain>, StoreError> {
        if let Some(drains) =
            self.apply_batch_once(flows, events_max, handler, options, Guard::None)?
        {
            return Ok(drains);
        }
        Ok(self
            .apply_batch_once(flows, events_max, handler, options, Guard::Savepoint)?
            .expect("a guarded batch runs to its end"))
    }

    /// One run of [`ConsumerDb::apply_batch_with`]; `None` when an event
    /// blocked under [`Guard::None`] (the transaction is rolled back).
    fn apply_batch_once<H: ApplyHandler + ?Sized>(
        &mut self,
        flows: &[(FlowId, Option<u64>)],
        events_max: u64,
        handler: &mut H,
        options: ApplyOptions,
        guard: Guard,
    ) -> Result<Option<Vec<Drain>>, StoreError> {
        let now_ms = self.clock.now_ms();
        let mut tx = begin_write(&mut self.conn)?;
        let mut drains = Vec::new();
        let mut total = 0u64;
        let mut wrote_any = false;
        for (flow_id, limit) in flows {
            // The cursor is read once per flow and written once after its
            // run, in the same transaction as every event of the run.
            let mut applied_seq = read_cursor(&tx, flow_id)?;
            let mut applied = 0u64;
            let stop = loop {
                if total >= events_max || limit.is_some_and(|limit| applied >= limit) {
                    break DrainStop::Limit;
                }
                let Some((step, wrote)) = step_in_tx(
                    &mut tx,
                    flow_id,
                    applied_seq,
                    handler,
                    options,
                    now_ms,
                    guard,
                )?
                else {
                    return Ok(None);
                };
                wrote_any |= wrote;
                match step {
                    Step::Applied { seq } => {
                        applied_seq = seq.get();
                        applied += 1;
                        total += 1;
                    }
                    Step::Gap { .. } => break DrainStop::Gap,
                    Step::Blocked { reason, .. } => break DrainStop::Blocked(reason),
                    Step::Idle => break DrainStop::Idle,
                }
            };
            if applied > 0 {
                write_cursor(&tx, flow_id, applied_seq)?;
            }
            drains.push(Drain {
                flow_id: flow_id.clone(),
                applied,
                stop,
            });
            if total >= events_max && stop == DrainStop::Limit {
                break;
            }
        }
        if wrote_any {
            self.commits += 1;
            tx.commit()
                .map_err(|e| sql_error("consumer: apply commit failed", e))?;
            if total > 0 {
                crash::point(crash::CONSUMER_APPLY_AFTER_COMMIT);
            }
        }
        Ok(Some(drains))
    }

    /// How many write transactions this handle has committed.
    pub fn commits(&self) -> u64 {
        self.commits
    }

    /// The inbox, projections and effects read in one read transaction.
    #[allow(clippy::type_complexity)]
    pub fn snapshot(
        &mut self,
    ) -> Result<(Vec<InboxRecord>, Vec<Projection>, Vec<EffectRecord>), StoreError> {
        let tx = self
            .conn
            .transaction()
            .map_err(|e| sql_error("consumer: cannot begin a read transaction", e))?;
        Ok((read_inbox(&tx)?, read_projections(&tx)?, read_effects(&tx)?))
    }
}

fn begin_write(conn: &mut Connection) -> Result<rusqlite::Transaction<'_>, StoreError> {
    conn.transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| sql_error("consumer: cannot begin a write transaction", e))
}

/// Up to `limit` flow ids from `sql` (parameters: after, limit).
fn flow_page(
    conn: &Connection,
    sql: &str,
    after: &str,
    limit: usize,
) -> Result<Vec<FlowId>, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    collect_rows(
        conn,
        "consumer: cannot list flows with work",
        sql,
        params![after, limit],
        |row| row.get::<_, String>(0),
        |id| FlowId::new(id).map_err(|e| corrupt("consumer: stored flow id", e)),
    )
}

/// The flow's apply cursor: the last applied (or skipped) seq, 0 if none.
fn read_cursor(tx: &Connection, flow_id: &FlowId) -> Result<i64, StoreError> {
    Ok(row_cached(
        tx,
        "SELECT applied_seq FROM inbox_cursor WHERE flow_id = ?1",
        [flow_id.as_str()],
        |row| row.get(0),
    )
    .optional()
    .map_err(|e| sql_error("consumer: cannot read the apply cursor", e))?
    .unwrap_or(0))
}

fn write_cursor(tx: &Connection, flow_id: &FlowId, applied_seq: i64) -> Result<(), StoreError> {
    exec_cached(
        tx,
        "INSERT INTO inbox_cursor (flow_id, applied_seq) VALUES (?1, ?2)
         ON CONFLICT (flow_id) DO UPDATE SET applied_seq = excluded.applied_seq",
        params![flow_id.as_str(), applied_seq],
    )
    .map_err(|e| sql_error("consumer: cannot move the apply cursor", e))?;
    Ok(())
}

/// How a step keeps a blocked event's handler writes apart from the rest of
/// its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guard {
    /// Nothing: a block leaves the transaction unusable, and the step
    /// returns `None` for the caller to roll it back.
    None,
    /// A savepoint around the handler, rolled back on a block.
    Savepoint,
}

/// One apply step of `flow_id`, whose cursor is at `applied_seq`, inside
/// `tx`. Returns the step and whether it wrote anything (an application or a
/// new block); the caller moves the cursor when the step applied, in the
/// same transaction. Returns `None` when the event blocked under
/// [`Guard::None`]: the handler may have written, so the caller must roll
/// the transaction back.
fn step_in_tx<H: ApplyHandler + ?Sized>(
    tx: &mut rusqlite::Transaction<'_>,
    flow_id: &FlowId,
    applied_seq: i64,
    handler: &mut H,
    options: ApplyOptions,
    now_ms: i64,
    guard: Guard,
) -> Result<Option<(Step, bool)>, StoreError> {
    let err = |e| sql_error("consumer: apply failed", e);
    let Some(next) = Seq::after(applied_seq) else {
        return Ok(Some((Step::Idle, false)));
    };
    // The flow's first stored row at or after `next`: the next event itself,
    // or one past a gap, or none.
    let row: Option<(i64, String, String, Option<String>)> = row_cached(
        tx,
        "SELECT seq, body, status, reason FROM inbox WHERE flow_id = ?1 AND seq >= ?2
         ORDER BY seq LIMIT 1",
        params![flow_id.as_str(), next.get()],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
    )
    .optional()
    .map_err(err)?;
    let (next_row, body) = match row {
        Some((seq, body, status, reason)) if seq == next.get() => (
            NextRow::Stored(inbox_status(&status, reason.as_deref())?),
            Some(body),
        ),
        Some(_) => (NextRow::Missing { later_stored: true }, None),
        None => (
            NextRow::Missing {
                later_stored: false,
            },
            None,
        ),
    };
    if matches!(
        next_row,
        NextRow::Stored(InboxStatus::Applied | InboxStatus::Skipped)
    ) {
        return Err(corrupt(
            "consumer: inbox",
            format!("flow {flow_id} seq {next} is settled but the cursor is at {applied_seq}"),
        ));
    }
    let body = match plan_apply(next_row, options) {
        ApplyPlan::Report(kind) => return Ok(Some((kind.into_step(next), false))),
        ApplyPlan::Evaluate => body.expect("an evaluated row is stored"),
    };
    let event = stored_envelope("consumer: stored inbox body", &body)?;
    // Guarded, the handler's writes sit in a savepoint: a block undoes them.
    // An error undoes the whole transaction (the caller drops it).
    // A row already blocked is being evaluated again (schema 2 support), and
    // is likely to block again: it always gets its savepoint, so a block
    // that stays does not throw the whole batch away at every pass.
    let guarded =
        guard == Guard::Savepoint || matches!(next_row, NextRow::Stored(InboxStatus::Blocked(_)));
    if guarded {
        exec_cached(tx, "SAVEPOINT ordo_apply_event", []).map_err(err)?;
    }
    let verdict = handler.apply(tx, &event, options)?;
    if tx.is_autocommit() {
        // SQLite ended the transaction under the handler (an `ON CONFLICT
        // ROLLBACK` constraint, a full disk) and the handler went on:
        // nothing written since BEGIN stands, so nothing after it may be.
        return Err(StoreError::new(
            ErrorKind::Other,
            format!(
                "consumer: the transaction ended while the handler applied flow {flow_id} seq {next}; nothing was applied"
            ),
        ));
    }
    match verdict {
        Ok(()) => {
            if guarded {
                exec_cached(tx, "RELEASE ordo_apply_event", []).map_err(err)?;
            }
            // By the primary key: the row's event id is the body's, at this
            // flow and seq (anything else is a corrupt file).
            let marked = exec_cached(
                tx,
                "UPDATE inbox SET status = 'applied', reason = NULL, settled_at_ms = ?4
                 WHERE event_id = ?1 AND flow_id = ?2 AND seq = ?3",
                params![
                    event.event_id.as_str(),
                    flow_id.as_str(),
                    next.get(),
                    now_ms
                ],
            )
            .map_err(err)?;
            if marked != 1 {
                return Err(corrupt(
                    "consumer: inbox",
                    format!(
                        "the body stored at flow {flow_id} seq {next} names event {}",
                        event.event_id
                    ),
                ));
            }
            Ok(Some((Step::Applied { seq: next }, true)))
        }
        Err(_) if !guarded => Ok(None),
        Err(reason) => {
            exec_cached(tx, "ROLLBACK TO ordo_apply_event", []).map_err(err)?;
            exec_cached(tx, "RELEASE ordo_apply_event", []).map_err(err)?;
            if next_row == NextRow::Stored(InboxStatus::Blocked(reason)) {
                // Evaluated again (schema 2 support) and blocked for the same
                // reason: nothing to write.
                return Ok(Some((Step::Blocked { seq: next, reason }, false)));
            }
            exec_cached(
                tx,
                "UPDATE inbox SET status = 'blocked', reason = ?3 WHERE flow_id = ?1 AND seq = ?2",
                params![flow_id.as_str(), next.get(), reason.as_str()],
            )
            .map_err(err)?;
            Ok(Some((Step::Blocked { seq: next, reason }, true)))
        }
    }
}

fn read_inbox(conn: &Connection) -> Result<Vec<InboxRecord>, StoreError> {
    collect_rows(
        conn,
        "consumer: cannot read the inbox",
        "SELECT body, status, reason FROM inbox ORDER BY flow_id, seq",
        [],
        |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, Option<String>>(2)?,
            ))
        },
        |(body, status, reason)| {
            Ok(InboxRecord {
                envelope: stored_envelope("consumer: stored inbox body", &body)?,
                status: inbox_status(&status, reason.as_deref())?,
            })
        },
    )
}

fn read_projections(conn: &Connection) -> Result<Vec<Projection>, StoreError> {
    collect_rows(
        conn,
        "consumer: cannot read projections",
        "SELECT flow_id, state, quantity, applied_seq FROM projection ORDER BY flow_id",
        [],
        |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get(2)?,
                row.get(3)?,
            ))
        },
        |(flow_id, state, quantity, applied_seq)| {
            projection(&flow_id, &state, quantity, applied_seq)
        },
    )
}

fn read_effects(conn: &Connection) -> Result<Vec<EffectRecord>, StoreError> {
    let context = "consumer: stored effect";
    collect_rows(
        conn,
        "consumer: cannot read effects",
        "SELECT flow_id, seq, event_id FROM effect ORDER BY flow_id, seq",
        [],
        |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, String>(2)?,
            ))
        },
        |(flow_id, seq, event_id)| {
            Ok(EffectRecord {
                flow_id: FlowId::new(flow_id).map_err(|e| corrupt(context, e))?,
                seq: Seq::new(seq).map_err(|e| corrupt(context, e))?,
                event_id: EventId::new(event_id).map_err(|e| corrupt(context, e))?,
            })
        },
    )
}

impl ConsumerStore for ConsumerDb {
    fn receive_batch(&mut self, envelopes: &[Envelope]) -> Result<Vec<Receipt>, StoreError> {
        let now_ms = self.clock.now_ms();
        let tx = begin_write(&mut self.conn)?;
        let err = |e| sql_error("consumer: receive failed", e);
        let mut receipts = Vec::with_capacity(envelopes.len());
        {
            // Both identities, in the inbox or remembered after pruning, and
            // the prune watermark, in one statement.
            let mut identities = tx
                .prepare_cached(
                    "SELECT coalesce((SELECT body_hash FROM inbox WHERE event_id = ?1),
                                     (SELECT lower(hex(body_hash)) FROM inbox_fingerprint WHERE event_id = ?1)),
                            coalesce((SELECT event_id FROM inbox WHERE flow_id = ?2 AND seq = ?3),
                                     (SELECT event_id FROM inbox_fingerprint WHERE flow_id = ?2 AND seq = ?3)),
                            EXISTS (SELECT 1 FROM inbox_watermark WHERE flow_id = ?2 AND pruned_seq >= ?3)",
                )
                .map_err(err)?;
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO inbox (event_id, flow_id, seq, schema_version, type, body, body_hash, status, received_at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', ?8)",
                )
                .map_err(err)?;
            for envelope in envelopes {
                let body = envelope.stored_text();
                let hash = envelope.body_hash();
                let (hash_hex, id_at_seq, below_watermark) = identities
                    .query_row(
                        params![
                            envelope.event_id.as_str(),
                            envelope.flow_id.as_str(),
                            envelope.seq.get()
                        ],
                        |row| {
                            Ok((
                                row.get::<_, Option<String>>(0)?,
                                row.get::<_, Option<String>>(1)?,
                                row.get::<_, bool>(2)?,
                            ))
                        },
                    )
                    .map_err(err)?;
                let stored = StoredIdentities {
                    by_event_id: hash_hex
                        .map(|hex| {
                            BodyHash::from_hex(&hex)
                                .map_err(|e| corrupt("consumer: stored body hash", e))
                        })
                        .transpose()?,
                    by_flow_seq: id_at_seq
                        .map(|id| {
                            EventId::new(id).map_err(|e| corrupt("consumer: stored event id", e))
                        })
                        .transpose()?,
                    below_watermark,
                };
                let receipt = decide_receive(&envelope.event_id, &hash, &stored);
                if receipt == Receipt::Accepted {
                    insert
                        .execute(params![
                            envelope.event_id.as_str(),
                            envelope.flow_id.as_str(),
                            envelope.seq.get(),
                            envelope.schema_version.get(),
                            envelope.event_type.as_str(),
                            body,
                            hash.as_str(),
                            now_ms,
                        ])
                        .map_err(err)?;
                }
                receipts.push(receipt);
            }
        }
        crash::point(crash::CONSUMER_RECEIVE_BEFORE_COMMIT);
        self.commits += 1;
        tx.commit()
            .map_err(|e| sql_error("consumer: receive commit failed", e))?;
        crash::point(crash::CONSUMER_RECEIVE_AFTER_COMMIT);
        Ok(receipts)
    }

    fn apply_next(&mut self, flow_id: &FlowId, options: ApplyOptions) -> Result<Step, StoreError> {
        self.apply_next_with(flow_id, &mut ReservationHandler, options)
    }

    fn apply_batch(
        &mut self,
        flows: &[(FlowId, Option<u64>)],
        events_max: u64,
        options: ApplyOptions,
    ) -> Result<Vec<Drain>, StoreError> {
        self.apply_batch_with(flows, events_max, &mut ReservationHandler, options)
    }

    fn flows_with_work_page(
        &mut self,
        after: Option<&FlowId>,
        limit: usize,
        options: ApplyOptions,
    ) -> Result<Vec<FlowId>, StoreError> {
        let after = after.map(FlowId::as_str).unwrap_or("");
        // Each list walks its own partial index from `after` and stops at
        // `limit`, so a page costs O(limit) however many flows have work.
        let mut flows = flow_page(
            &self.conn,
            "SELECT DISTINCT flow_id FROM inbox WHERE status = 'pending' AND flow_id > ?1
             ORDER BY flow_id LIMIT ?2",
            after,
            limit,
        )?;
        if options.support_v2 {
            flows.extend(flow_page(
                &self.conn,
                "SELECT DISTINCT flow_id FROM inbox
                 WHERE status = 'blocked' AND reason = 'unsupported_schema' AND flow_id > ?1
                 ORDER BY flow_id LIMIT ?2",
                after,
                limit,
            )?);
            flows.sort_unstable();
            flows.dedup();
            flows.truncate(limit);
        }
        Ok(flows)
    }

    fn flows_with_work(&mut self, options: ApplyOptions) -> Result<Vec<FlowId>, StoreError> {
        collect_rows(
            &self.conn,
            "consumer: cannot list flows with work",
            "SELECT flow_id FROM inbox WHERE status = 'pending'
             UNION
             SELECT flow_id FROM inbox WHERE ?1 AND status = 'blocked' AND reason = 'unsupported_schema'
             ORDER BY flow_id",
            [options.support_v2],
            |row| row.get::<_, String>(0),
            |id| FlowId::new(id).map_err(|e| corrupt("consumer: stored flow id", e)),
        )
    }

    fn inbox_entries(
        &mut self,
        blocked_only: bool,
        flow_id: Option<&FlowId>,
        limit: usize,
    ) -> Result<Vec<InboxEntry>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        collect_rows(
            &self.conn,
            "consumer: cannot list the inbox",
            "SELECT body, status, reason, received_at_ms, settled_at_ms FROM inbox
             WHERE (NOT ?1 OR status = 'blocked') AND (?2 IS NULL OR flow_id = ?2)
             ORDER BY flow_id, seq LIMIT ?3",
            params![blocked_only, flow_id.map(FlowId::as_str), limit],
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, Option<String>>(2)?,
                    row.get::<_, i64>(3)?,
                    row.get::<_, Option<i64>>(4)?,
                ))
            },
            |(body, status, reason, received_at_ms, settled_at_ms)| {
                Ok(InboxEntry {
                    envelope: stored_envelope("consumer: stored inbox body", &body)?,
                    status: inbox_status(&status, reason.as_deref())?,
                    received_at_ms,
                    settled_at_ms,
                })
            },
        )
    }

    fn reopen_blocked(&mut self, flow_id: &FlowId) -> Result<u64, StoreError> {
        let tx = begin_write(&mut self.conn)?;
        let n = exec_cached(&tx,
                "UPDATE inbox SET status = 'pending', reason = NULL WHERE flow_id = ?1 AND status = 'blocked'",
                [flow_id.as_str()],
            )
            .map_err(|e| sql_error("consumer: cannot reopen blocked rows", e))?;
        self.commits += 1;
        tx.commit()
            .map_err(|e| sql_error("consumer: reopen commit failed", e))?;
        Ok(n as u64)
    }

    fn skip(
        &mut self,
        request: &SkipRequest,
        now_ms: i64,
    ) -> Result<Result<RepairRecord, SkipRefused>, StoreError> {
        let tx = begin_write(&mut self.conn)?;
        let err = |e| sql_error("consumer: skip failed", e);
        let flow = request.flow_id.as_str();
        let applied_seq: i64 = row_cached(
            &tx,
            "SELECT applied_seq FROM inbox_cursor WHERE flow_id = ?1",
            [flow],
            |row| row.get(0),
        )
        .optional()
        .map_err(err)?
        .unwrap_or(0);
        let event_id: Option<String> = row_cached(
            &tx,
            "SELECT event_id FROM inbox WHERE flow_id = ?1 AND seq = ?2",
            params![flow, request.seq.get()],
            |row| row.get(0),
        )
        .optional()
        .map_err(err)?;
        if let Err(refused) = decide_skip(request, applied_seq, event_id.is_some()) {
            return Ok(Err(refused));
        }
        let event_id = event_id.expect("decide_skip checked that the row is stored");
        exec_cached(&tx,
            "UPDATE inbox SET status = 'skipped', reason = NULL, settled_at_ms = ?3 WHERE flow_id = ?1 AND seq = ?2",
            params![flow, request.seq.get(), now_ms],
        )
        .map_err(err)?;
        exec_cached(
            &tx,
            "INSERT INTO inbox_cursor (flow_id, applied_seq) VALUES (?1, ?2)
             ON CONFLICT (flow_id) DO UPDATE SET applied_seq = excluded.applied_seq",
            params![flow, request.seq.get()],
        )
        .map_err(err)?;
        let id = row_cached(
            &tx,
            "INSERT INTO repair_log (action, flow_id, seq, event_id, reason, decided_by, at_ms)
                 VALUES ('skip', ?1, ?2, ?3, ?4, ?5, ?6) RETURNING id",
            params![
                flow,
                request.seq.get(),
                event_id,
                request.reason,
                request.by,
                now_ms
            ],
            |row| row.get(0),
        )
        .map_err(err)?;
        self.commits += 1;
        tx.commit()
            .map_err(|e| sql_error("consumer: skip commit failed", e))?;
        Ok(Ok(RepairRecord {
            id,
            action: "skip".into(),
            flow_id: request.flow_id.clone(),
            seq: request.seq,
            event_id: EventId::new(event_id)
                .map_err(|e| corrupt("consumer: stored event id", e))?,
            reason: request.reason.clone(),
            by: request.by.clone(),
            at_ms: now_ms,
        }))
    }

    fn repairs(&mut self) -> Result<Vec<RepairRecord>, StoreError> {
        let context = "consumer: repair log";
        collect_rows(
            &self.conn,
            "consumer: cannot read the repair log",
            "SELECT id, action, flow_id, seq, event_id, reason, decided_by, at_ms FROM repair_log ORDER BY id",
            [],
            |row| {
                Ok((
                    (row.get::<_, i64>(0)?, row.get::<_, String>(1)?),
                    (row.get::<_, String>(2)?, row.get::<_, i64>(3)?, row.get::<_, String>(4)?),
                    (row.get::<_, String>(5)?, row.get::<_, String>(6)?, row.get::<_, i64>(7)?),
                ))
            },
            |((id, action), (flow_id, seq, event_id), (reason, by, at_ms))| {
                Ok(RepairRecord {
                    id,
                    action,
                    flow_id: FlowId::new(flow_id).map_err(|e| corrupt(context, e))?,
                    seq: Seq::new(seq).map_err(|e| corrupt(context, e))?,
                    event_id: EventId::new(event_id).map_err(|e| corrupt(context, e))?,
                    reason,
                    by,
                    at_ms,
                })
            },
        )
    }

    fn consumer_status(&mut self) -> Result<ConsumerStatus, StoreError> {
        let tx = self
            .conn
            .transaction()
            .map_err(|e| sql_error("consumer: cannot begin a read transaction", e))?;
        let err = |e| sql_error("consumer: cannot read the status", e);
        let mut status = ConsumerStatus::default();
        {
            let mut stmt = tx
                .prepare("SELECT status, coalesce(reason, ''), count(*) FROM inbox GROUP BY status, reason")
                .map_err(err)?;
            let rows = stmt
                .query_map([], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, i64>(2)?,
                    ))
                })
                .map_err(err)?;
            for row in rows {
                let (state, reason, n) = row.map_err(err)?;
                let n = n.max(0) as u64;
                match state.as_str() {
                    "pending" => status.pending += n,
                    "applied" => status.applied += n,
                    "skipped" => status.skipped += n,
                    _ => *status.blocked.entry(reason).or_default() += n,
                }
            }
            let mut stmt = tx
                .prepare("SELECT status, count(*) FROM inbox_fingerprint GROUP BY status")
                .map_err(err)?;
            let rows = stmt
                .query_map([], |row| {
                    Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
                })
                .map_err(err)?;
            for row in rows {
                let (state, n) = row.map_err(err)?;
                if state == "applied" {
                    status.applied += n.max(0) as u64;
                } else {
                    status.skipped += n.max(0) as u64;
                }
            }
            let mut stmt = tx
                .prepare(
                    "SELECT i.flow_id, coalesce(c.applied_seq, 0) + 1, min(i.received_at_ms)
                     FROM inbox i LEFT JOIN inbox_cursor c ON c.flow_id = i.flow_id
                     WHERE i.status = 'pending' AND i.seq > coalesce(c.applied_seq, 0) + 1
                       AND NOT EXISTS (SELECT 1 FROM inbox j
                                       WHERE j.flow_id = i.flow_id AND j.seq = coalesce(c.applied_seq, 0) + 1)
                     GROUP BY i.flow_id ORDER BY i.flow_id",
                )
                .map_err(err)?;
            let rows = stmt
                .query_map([], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, i64>(1)?,
                        row.get::<_, i64>(2)?,
                    ))
                })
                .map_err(err)?;
            for row in rows {
                let (flow_id, missing, since_ms) = row.map_err(err)?;
                status.gaps_total += 1;
                if status.gaps.len() >= GAPS_LISTED_MAX {
                    continue;
                }
                status.gaps.push(GapWait {
                    flow_id: FlowId::new(flow_id)
                        .map_err(|e| corrupt("consumer: stored flow id", e))?,
                    missing: Seq::new(missing).map_err(|e| corrupt("consumer: cursor", e))?,
                    since_ms,
                });
            }
        }
        Ok(status)
    }

    fn prune_inbox(&mut self, cutoff_ms: i64) -> Result<Pruned, StoreError> {
        let tx = begin_write(&mut self.conn)?;
        let err = |e| sql_error("consumer: cannot prune the inbox", e);
        let fingerprints = exec_cached(
            &tx,
            "INSERT INTO inbox_fingerprint (flow_id, seq, event_id, body_hash, status)
                 SELECT flow_id, seq, event_id, unhex(body_hash), status FROM inbox
                 WHERE status IN ('applied', 'skipped') AND settled_at_ms < ?1",
            [cutoff_ms],
        )
        .map_err(err)?;
        exec_cached(
            &tx,
            "INSERT INTO inbox_watermark (flow_id, pruned_seq)
             SELECT flow_id, max(seq) FROM inbox
             WHERE status IN ('applied', 'skipped') AND settled_at_ms < ?1 GROUP BY flow_id
             ON CONFLICT (flow_id) DO UPDATE SET pruned_seq = max(pruned_seq, excluded.pruned_seq)",
            [cutoff_ms],
        )
        .map_err(err)?;
        let rows = exec_cached(
            &tx,
            "DELETE FROM inbox WHERE status IN ('applied', 'skipped') AND settled_at_ms < ?1",
            [cutoff_ms],
        )
        .map_err(err)?;
        debug_assert_eq!(rows, fingerprints, "one fingerprint per pruned row");
        self.commits += 1;
        tx.commit()
            .map_err(|e| sql_error("consumer: prune commit failed", e))?;
        Ok(Pruned {
            rows: rows as u64,
            fingerprints: fingerprints as u64,
        })
    }

    fn inbox(&mut self) -> Result<Vec<InboxRecord>, StoreError> {
        read_inbox(&self.conn)
    }

    fn projections(&mut self) -> Result<Vec<Projection>, StoreError> {
        read_projections(&self.conn)
    }

    fn effects(&mut self) -> Result<Vec<EffectRecord>, StoreError> {
        read_effects(&self.conn)
    }
}
