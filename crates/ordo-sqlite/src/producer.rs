//! The producer store: flows and the outbox in one SQLite file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use ordo_core::crash;
use ordo_core::ops::{
    whole_read, whole_read_limit, OutboxEntry, ProducerStatus, Pruned, RetryRefused,
    WHOLE_READ_ROWS_MAX,
};
use ordo_core::store::sql_limit;
use ordo_core::{
    AppendError, Backoff, Clock, Envelope, EventId, FlowId, OutboxRecord, OutboxTx, ProducerName,
    ProducerOps, ProducerStore, Receipt, StoreError,
};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::browse;
use crate::conn::{
    collect_rows, corrupt, exec_cached, row_cached, sql_error, OpenOptions, Opened, Role, Tables,
};
use crate::watch::DataVersion;

const SCHEMA: &str = "
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
    relay_turn   INTEGER NOT NULL DEFAULT 0,
    -- A flow rewound at this seq (a receipt of cause producer_rewound):
    -- nothing of it from there on is relayed.
    relay_stop_seq INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS outbox_head_relay ON outbox_head (relay_turn, flow_id) WHERE relay_seq IS NOT NULL;
INSERT OR IGNORE INTO ordo_meta (key, value) VALUES ('relay_turn', 0);
";

const TABLES: Tables = Tables {
    role: Role::Producer,
    create: SCHEMA,
    upgrade_from_1: "",
    upgrade_from_3: "ALTER TABLE outbox_head ADD COLUMN relay_stop_seq INTEGER;",
};

/// The producer's SQLite file: the outbox, the per-flow head of the outbox
/// sequence, and the application's own tables (declared by its [`Schema`](crate::Schema)).
///
/// Every write runs in a `BEGIN IMMEDIATE` transaction on a file in WAL mode
/// with `synchronous=FULL`, so a returned commit is durable. The one
/// exception is the relay's delivery bookkeeping (accepted marks, attempts,
/// backoff, relay heads): it is a hint, committed with `synchronous=NORMAL`,
/// see [`ProducerDb::record_receipts`](ordo_core::ProducerStore::record_receipts).
pub struct ProducerDb {
    conn: Connection,
    domain: String,
    store_id: ordo_core::StoreId,
    producer_name: ProducerName,
    wake: ordo_core::Signal,
    data_version: DataVersion,
    clock: Arc<dyn Clock>,
    commits: u64,
    synced_commits: u64,
    synced: bool,
}

/// A write transaction on the producer file, in which the caller changes its
/// own state and appends events: both commit together or not at all.
pub struct ProducerTx<'c> {
    tx: rusqlite::Transaction<'c>,
    producer_name: &'c ProducerName,
    now_ms: i64,
    appended: u64,
}

impl ProducerDb {
    crate::conn::open_constructors!(ProducerDb, Role::Producer, TABLES);

    fn from_opened(opened: Opened, clock: Arc<dyn Clock>, _: &OpenOptions) -> ProducerDb {
        ProducerDb {
            conn: opened.conn,
            domain: opened.domain,
            store_id: opened.store_id,
            producer_name: opened.producer_name,
            wake: opened.wake,
            data_version: DataVersion::default(),
            clock,
            commits: 0,
            synced_commits: 0,
            synced: true,
        }
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction and commits if it
    /// returns `Ok`; on `Err` nothing it wrote is kept.
    pub fn write<T, E>(
        &mut self,
        f: impl FnOnce(&mut ProducerTx<'_>) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        self.write_synced(true, f)
    }

    /// Runs `f` in one write transaction whose commit waits for the disk
    /// (`synced`, `synchronous=FULL`) or not (`synchronous=NORMAL`: the
    /// commit survives a crash of the process but may be lost with the
    /// machine's power, never torn, and the next synced commit makes it
    /// durable too, since the WAL is flushed in order). The mode is set
    /// before every transaction, so an unsynced commit never leaves a later
    /// one unsynced.
    fn write_synced<T, E>(
        &mut self,
        synced: bool,
        f: impl FnOnce(&mut ProducerTx<'_>) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        if self.synced != synced {
            let pragma = if synced {
                "PRAGMA synchronous=FULL"
            } else {
                "PRAGMA synchronous=NORMAL"
            };
            exec_cached(&self.conn, pragma, [])
                .map_err(|e| sql_error(&format!("producer: cannot set {pragma}"), e))?;
            self.synced = synced;
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| sql_error("producer: cannot begin a write transaction", e))?;
        // Read under the write lock, so times recorded by one writer after
        // another are in commit order.
        let now_ms = self.clock.now_ms();
        let mut ptx = ProducerTx {
            tx,
            producer_name: &self.producer_name,
            now_ms,
            appended: 0,
        };
        let value = f(&mut ptx)?;
        let appended = ptx.appended;
        ptx.tx
            .commit()
            .map_err(|e| sql_error("producer: commit failed", e))?;
        self.commits += 1;
        if synced {
            self.synced_commits += 1;
        }
        if appended > 0 {
            self.wake.raise();
        }
        Ok(value)
    }

    /// How many of those commits waited for the disk (`synchronous=FULL`);
    /// the others are delivery bookkeeping.
    pub fn synced_commits(&self) -> u64 {
        self.synced_commits
    }
}

impl ProducerTx<'_> {
    /// The transaction, for the caller's own reads and writes of its state.
    pub fn sql(&self) -> &rusqlite::Transaction<'_> {
        &self.tx
    }
}

impl OutboxTx for ProducerTx<'_> {
    fn producer_name(&self) -> &ProducerName {
        self.producer_name
    }

    fn last_seq(&self, flow_id: &FlowId) -> Result<i64, StoreError> {
        row_cached(
            &self.tx,
            "SELECT last_seq FROM outbox_head WHERE flow_id = ?1",
            [flow_id.as_str()],
            |row| row.get(0),
        )
        .optional()
        .map(|seq| seq.unwrap_or(0))
        .map_err(|e| sql_error("producer: cannot read the outbox head", e))
    }

    /// Read once, under the write lock.
    fn now_ms(&self) -> i64 {
        self.now_ms
    }

    fn append_envelope(&mut self, event: &Envelope) -> Result<(), AppendError> {
        ordo_core::store::check_appended(event, self.producer_name)?;
        let err = |e| sql_error("producer: cannot append to the outbox", e);
        let seq = event.seq.get();
        // The row first: a used event id or (flow, seq) fails here, before
        // anything is written.
        let inserted = exec_cached(
            &self.tx,
            "INSERT INTO outbox (event_id, flow_id, seq, schema_version, type, body, created_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                event.event_id.as_str(),
                event.flow_id.as_str(),
                seq,
                event.schema_version.get(),
                event.event_type.as_str(),
                event.stored_text(),
                self.now_ms,
            ],
        );
        if let Err(e) = inserted {
            // A seq already used is a contiguity refusal like any other, a
            // used event id at the right seq is its own refusal; any other
            // error is returned as it is.
            if e.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation) {
                let last = self.last_seq(&event.flow_id)?;
                if last.checked_add(1) != Some(seq) {
                    return Err(not_next(event, last));
                }
                return Err(AppendError::EventIdUsed(event.event_id.clone()));
            }
            return Err(err(e).into());
        }
        // Then the head, which moves only from exactly seq - 1 (or is
        // created at seq 1): that is the contiguity check, without a read.
        let mut moved = exec_cached(
            &self.tx,
            "UPDATE outbox_head SET last_seq = ?2,
                 relay_seq = CASE WHEN relay_stop_seq IS NULL THEN coalesce(relay_seq, ?2) ELSE relay_seq END,
                 relay_due_ms = CASE WHEN relay_seq IS NULL THEN 0 ELSE relay_due_ms END
             WHERE flow_id = ?1 AND last_seq = ?2 - 1",
            params![event.flow_id.as_str(), seq],
        )
        .map_err(err)?;
        if moved == 0 && seq == 1 {
            moved = exec_cached(
                &self.tx,
                "INSERT INTO outbox_head (flow_id, last_seq, relay_seq, relay_due_ms)
                 VALUES (?1, 1, 1, 0) ON CONFLICT (flow_id) DO NOTHING",
                [event.flow_id.as_str()],
            )
            .map_err(err)?;
        }
        if moved != 1 {
            // Refused: take the row back, so nothing is written.
            exec_cached(
                &self.tx,
                "DELETE FROM outbox WHERE event_id = ?1",
                [event.event_id.as_str()],
            )
            .map_err(err)?;
            return Err(not_next(event, self.last_seq(&event.flow_id)?));
        }
        debug_assert_eq!(self.last_seq(&event.flow_id).ok(), Some(seq));
        self.appended += 1;
        Ok(())
    }
}

/// The refusal of an event whose seq is not its flow's last plus one.
fn not_next(event: &Envelope, last_seq: i64) -> AppendError {
    AppendError::NotNext {
        flow_id: event.flow_id.clone(),
        seq: event.seq,
        last_seq,
    }
}

/// Every outbox row in commit order, read through `conn` (for reads inside
/// [`ProducerDb::read`] beside the application's own tables); at most
/// [`WHOLE_READ_ROWS_MAX`] rows.
pub fn read_outbox(conn: &Connection) -> Result<Vec<OutboxRecord>, StoreError> {
    read_outbox_at_most(conn, WHOLE_READ_ROWS_MAX)
}

pub(crate) fn read_outbox_at_most(
    conn: &Connection,
    rows_max: usize,
) -> Result<Vec<OutboxRecord>, StoreError> {
    let sql = "SELECT body, accepted FROM outbox ORDER BY position LIMIT ?1";
    let rows = collect_rows(
        conn,
        "producer: cannot read the outbox",
        sql,
        [whole_read_limit(rows_max)],
        |row| Ok((row.get::<_, String>(0)?, row.get::<_, bool>(1)?)),
        |(body, accepted)| {
            Ok(OutboxRecord {
                envelope: stored_envelope("producer: stored outbox body", &body)?,
                accepted,
            })
        },
    )?;
    whole_read("the outbox", rows_max, rows)
}

/// Parses a stored body (see [`Envelope::stored_text`]) back into its
/// envelope; anything else is a damaged file.
pub(crate) fn stored_envelope(context: &str, body: &str) -> Result<Envelope, StoreError> {
    Envelope::from_stored(body).map_err(|e| corrupt(context, e))
}

// The signal is raised by every commit of this process that appends to
// this file (whichever handle made it); another process's commit (the
// application's appends) is seen by the file's `data_version`.
ordo_core::run_store_impl!(ProducerDb, |db|
    signal: db.wake.clone(),
    changed_elsewhere: db.data_version.changed(&db.conn),
);

impl ProducerOps for ProducerDb {
    fn outbox(&mut self) -> Result<Vec<OutboxRecord>, StoreError> {
        read_outbox(&self.conn)
    }

    fn outbox_event(&mut self, event_id: &EventId) -> Result<Option<OutboxRecord>, StoreError> {
        let row: Option<(String, bool)> = row_cached(
            &self.conn,
            "SELECT body, accepted FROM outbox WHERE event_id = ?1",
            [event_id.as_str()],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()
        .map_err(|e| sql_error("producer: cannot read the outbox", e))?;
        row.map(|(body, accepted)| {
            Ok(OutboxRecord {
                envelope: stored_envelope("producer: stored outbox body", &body)?,
                accepted,
            })
        })
        .transpose()
    }

    fn outbox_entries(
        &mut self,
        quarantined_only: bool,
        limit: usize,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        collect_rows(
            &self.conn,
            "producer: cannot list the outbox",
            "SELECT body, accepted, quarantined, quarantine_reason, attempts, last_outcome, last_error,
                    next_attempt_at_ms, created_at_ms, accepted_at_ms
             FROM outbox WHERE (NOT ?1 OR quarantined = 1) ORDER BY position LIMIT ?2",
            params![quarantined_only, sql_limit(limit)],
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    OutboxEntryRow {
                        accepted: row.get(1)?,
                        quarantined: row.get(2)?,
                        quarantine_reason: row.get(3)?,
                        attempts: row.get(4)?,
                        last_outcome: row.get(5)?,
                        last_error: row.get(6)?,
                        next_attempt_at_ms: row.get(7)?,
                        created_at_ms: row.get(8)?,
                        accepted_at_ms: row.get(9)?,
                    },
                ))
            },
            |(body, r)| {
                Ok(OutboxEntry {
                    envelope: stored_envelope("producer: stored outbox body", &body)?,
                    accepted: r.accepted,
                    quarantined: r.quarantined,
                    quarantine_reason: r.quarantine_reason,
                    attempts: u64::try_from(r.attempts).unwrap_or(0),
                    last_outcome: r.last_outcome,
                    last_error: r.last_error,
                    next_attempt_at_ms: r.next_attempt_at_ms,
                    created_at_ms: r.created_at_ms,
                    accepted_at_ms: r.accepted_at_ms,
                })
            },
        )
    }

    fn retry_quarantined(
        &mut self,
        event_id: &EventId,
    ) -> Result<Result<(), RetryRefused>, StoreError> {
        self.write(|ptx| {
            let tx = &ptx.tx;
            let err = |e| sql_error("producer: cannot retry a quarantined event", e);
            let row: Option<(String, i64, bool)> = row_cached(
                tx,
                "SELECT flow_id, seq, quarantined FROM outbox WHERE event_id = ?1",
                [event_id.as_str()],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .optional()
            .map_err(err)?;
            let (flow, seq) = match row {
                None => return Ok(Err(RetryRefused::Unknown(event_id.clone()))),
                Some((_, _, false)) => {
                    return Ok(Err(RetryRefused::NotQuarantined(event_id.clone())))
                }
                Some((flow, seq, true)) => (flow, seq),
            };
            exec_cached(tx,
                "UPDATE outbox SET quarantined = 0, quarantine_reason = NULL, next_attempt_at_ms = 0
                 WHERE event_id = ?1",
                [event_id.as_str()],
            )
            .map_err(err)?;
            // A retried rewound event lifts its flow's stop.
            exec_cached(
                tx,
                "UPDATE outbox_head SET relay_stop_seq = NULL WHERE flow_id = ?1 AND relay_stop_seq = ?2",
                params![flow, seq],
            )
            .map_err(err)?;
            refresh_heads(tx, &[flow], None, Some(seq))?;
            Ok(Ok(()))
        })
    }

    fn producer_status(&mut self, now_ms: i64) -> Result<ProducerStatus, StoreError> {
        row_cached(
            &self.conn,
            "SELECT count(*), min(created_at_ms), coalesce(sum(quarantined), 0),
                        coalesce(sum(quarantined = 0 AND next_attempt_at_ms > ?1), 0),
                        coalesce(sum(quarantined = 1 AND last_outcome = 'producer_rewound'), 0)
                 FROM outbox WHERE accepted = 0",
            [now_ms],
            |row| {
                Ok(ProducerStatus {
                    backlog: row.get::<_, i64>(0)?.max(0) as u64,
                    oldest_pending_created_at_ms: row.get(1)?,
                    quarantined: row.get::<_, i64>(2)?.max(0) as u64,
                    rewound: row.get::<_, i64>(4)?.max(0) as u64,
                    backing_off: row.get::<_, i64>(3)?.max(0) as u64,
                })
            },
        )
        .map_err(|e| sql_error("producer: cannot read the status", e))
    }

    fn prune_outbox(&mut self, cutoff_ms: i64) -> Result<Pruned, StoreError> {
        self.write(|ptx| {
            let rows = exec_cached(
                &ptx.tx,
                "DELETE FROM outbox WHERE accepted = 1 AND accepted_at_ms < ?1",
                [cutoff_ms],
            )
            .map_err(|e| sql_error("producer: cannot prune the outbox", e))?;
            Ok(Pruned {
                rows: rows as u64,
                fingerprints: 0,
            })
        })
    }

    ordo_core::producer_ops_methods!(ProducerDb, browse);
}

impl ProducerStore for ProducerDb {
    fn append_events(&mut self, events: &[Envelope]) -> Result<(), AppendError> {
        self.write(|ptx| {
            events
                .iter()
                .try_for_each(|event| ptx.append_envelope(event))
        })
    }

    fn pending(&mut self, limit: usize) -> Result<Vec<Envelope>, StoreError> {
        collect_rows(
            &self.conn,
            "producer: cannot read pending events",
            "SELECT body FROM outbox WHERE accepted = 0 ORDER BY position LIMIT ?1",
            [sql_limit(limit)],
            |row| row.get::<_, String>(0),
            |body| stored_envelope("producer: stored outbox body", &body),
        )
    }

    fn oldest_unaccepted(&mut self, now_ms: i64) -> Result<Option<Envelope>, StoreError> {
        let row: Option<(String, i64)> = row_cached(&self.conn,
                "SELECT body, next_attempt_at_ms FROM outbox WHERE accepted = 0 ORDER BY position LIMIT 1",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()
            .map_err(|e| sql_error("producer: cannot read the oldest unaccepted event", e))?;
        match row {
            Some((body, due_ms)) if due_ms <= now_ms => Ok(Some(stored_envelope(
                "producer: stored outbox body",
                &body,
            )?)),
            _ => Ok(None),
        }
    }

    fn fair_round(
        &mut self,
        limit: usize,
        skip: &BTreeSet<FlowId>,
        now_ms: i64,
    ) -> Result<Vec<Envelope>, StoreError> {
        let limit = sql_limit(limit);
        let body = |row: &rusqlite::Row<'_>| row.get::<_, String>(0);
        let envelope = |body: String| stored_envelope("producer: stored outbox body", &body);
        if skip.is_empty() {
            // Without the skip list, which SQLite would build into a
            // temporary table even when it is empty.
            return collect_rows(
                &self.conn,
                "producer: cannot pick a fair round",
                "SELECT o.body FROM outbox_head h
                 JOIN outbox o ON o.flow_id = h.flow_id AND o.seq = h.relay_seq
                 WHERE h.relay_seq IS NOT NULL AND h.relay_due_ms <= ?1
                 ORDER BY h.relay_turn, h.flow_id
                 LIMIT ?2",
                params![now_ms, limit],
                body,
                envelope,
            );
        }
        let skip_json = serde_json::to_string(&skip.iter().map(FlowId::as_str).collect::<Vec<_>>())
            .expect("a list of strings serializes");
        collect_rows(
            &self.conn,
            "producer: cannot pick a fair round",
            "SELECT o.body FROM outbox_head h
             JOIN outbox o ON o.flow_id = h.flow_id AND o.seq = h.relay_seq
             WHERE h.relay_seq IS NOT NULL AND h.relay_due_ms <= ?1
               AND h.flow_id NOT IN (SELECT value FROM json_each(?2))
             ORDER BY h.relay_turn, h.flow_id
             LIMIT ?3",
            params![now_ms, skip_json, limit],
            body,
            envelope,
        )
    }

    /// Committed without waiting for the disk: an accepted mark lost with
    /// the machine's power only makes the relay hand the event over again,
    /// and the consumer, whose receive commit is synced, answers duplicate.
    fn record_receipts(
        &mut self,
        receipts: &[(EventId, Receipt)],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.write_synced(false, |ptx| {
            let tx = &ptx.tx;
            let err = |e| sql_error("producer: cannot record receipts", e);
            // Statement by statement, each through the cache: set-based
            // forms (`IN (SELECT value FROM json_each(?))`, `RETURNING`)
            // build a temporary table per statement, which cost a
            // single-event round more than the writes themselves.
            let turn: i64 = row_cached(
                tx,
                "SELECT CAST(value AS INTEGER) + 1 FROM ordo_meta WHERE key = 'relay_turn'",
                [],
                |row| row.get(0),
            )
            .map_err(err)?;
            exec_cached(
                tx,
                "UPDATE ordo_meta SET value = ?1 WHERE key = 'relay_turn'",
                [turn],
            )
            .map_err(err)?;
            let mut latest: BTreeMap<&str, Receipt> = BTreeMap::new();
            for (event_id, receipt) in receipts {
                latest.insert(event_id.as_str(), *receipt);
            }
            let mut flows = BTreeSet::new();
            for (event_id, receipt) in &latest {
                let row: Option<(i64, String, i64)> = row_cached(
                    tx,
                    "SELECT position, flow_id, seq FROM outbox WHERE event_id = ?1",
                    [event_id],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
                )
                .optional()
                .map_err(err)?;
                // An event no longer in the outbox was settled and pruned
                // meanwhile (another relay recorded its receipt first):
                // there is nothing left to mark.
                let Some((position, flow, seq)) = row else {
                    continue;
                };
                mark_receipt(tx, (position, &flow, seq), *receipt, ptx.now_ms.max(now_ms))?;
                flows.insert(flow);
            }
            let flows: Vec<String> = flows.into_iter().collect();
            refresh_heads(tx, &flows, Some(turn), None)?;
            crash::point(crash::RELAY_MARK_BEFORE_COMMIT);
            Ok(())
        })
    }

    fn record_failure(
        &mut self,
        event_ids: &[EventId],
        error: &str,
        now_ms: i64,
        backoff: &Backoff,
    ) -> Result<(), StoreError> {
        // Bookkeeping like the receipts: a lost attempt count only retries
        // sooner.
        self.write_synced(false, |ptx| {
            let tx = &ptx.tx;
            let err = |e| sql_error("producer: cannot record a delivery failure", e);
            let mut flows = BTreeSet::new();
            for event_id in event_ids {
                let row: Option<(String, i64)> = row_cached(tx,
                        "UPDATE outbox SET attempts = attempts + 1, last_outcome = 'error', last_error = ?2
                         WHERE event_id = ?1 AND accepted = 0 RETURNING flow_id, attempts",
                        params![event_id.as_str(), error],
                        |row| Ok((row.get(0)?, row.get(1)?)),
                    )
                    .optional()
                    .map_err(err)?;
                let Some((flow, attempts)) = row else { continue };
                let delay_ms = backoff.delay_ms(u32::try_from(attempts).unwrap_or(u32::MAX), fastrand::f64());
                exec_cached(tx,
                    "UPDATE outbox SET next_attempt_at_ms = ?2 WHERE event_id = ?1",
                    // Strictly later than the failure, whatever the jitter drew.
                    params![event_id.as_str(), now_ms.saturating_add(1).saturating_add(delay_ms as i64)],
                )
                .map_err(err)?;
                flows.insert(flow);
            }
            let flows: Vec<String> = flows.into_iter().collect();
            refresh_heads(tx, &flows, None, None)
        })
    }

    /// Bookkeeping like the receipts: a lost quarantine only makes the
    /// relay offer the event again, and the consumer refuses it again.
    fn quarantine(
        &mut self,
        event_id: &EventId,
        outcome: &str,
        reason: &str,
        _now_ms: i64,
    ) -> Result<(), StoreError> {
        self.write_synced(false, |ptx| {
            let tx = &ptx.tx;
            let err = |e| sql_error("producer: cannot quarantine an event", e);
            let flow: Option<String> = row_cached(
                tx,
                "UPDATE outbox SET quarantined = 1, quarantine_reason = ?2,
                     attempts = attempts + 1, last_outcome = ?3, last_error = ?2
                 WHERE event_id = ?1 AND accepted = 0 RETURNING flow_id",
                params![event_id.as_str(), reason, outcome],
                |row| row.get(0),
            )
            .optional()
            .map_err(err)?;
            refresh_heads(tx, &flow.into_iter().collect::<Vec<_>>(), None, None)
        })
    }
}

/// Bookkeeping columns of one outbox row.
struct OutboxEntryRow {
    accepted: bool,
    quarantined: bool,
    quarantine_reason: Option<String>,
    attempts: i64,
    last_outcome: Option<String>,
    last_error: Option<String>,
    next_attempt_at_ms: i64,
    created_at_ms: i64,
    accepted_at_ms: Option<i64>,
}

pub use ordo_core::CONFLICT_REASON;

/// Records one receipt on the outbox row at `position` (of `flow`, `seq`):
/// custody for `accepted` and `duplicate`, a quarantine for a conflict, and
/// for `producer_rewound` a stop of the flow there: nothing of it from that
/// seq on is relayed.
fn mark_receipt(
    tx: &Connection,
    (position, flow, seq): (i64, &str, i64),
    receipt: Receipt,
    now_ms: i64,
) -> Result<(), StoreError> {
    let err = |e| sql_error("producer: cannot record receipts", e);
    if receipt == Receipt::ProducerRewound {
        exec_cached(
            tx,
            "UPDATE outbox_head SET relay_stop_seq = min(coalesce(relay_stop_seq, ?2), ?2)
             WHERE flow_id = ?1",
            params![flow, seq],
        )
        .map_err(err)?;
    }
    let marked = match receipt.quarantine() {
        Some((outcome, reason)) => exec_cached(
            tx,
            "UPDATE outbox SET quarantined = 1 - accepted,
                 quarantine_reason = CASE WHEN accepted = 1 THEN NULL ELSE ?2 END,
                 attempts = attempts + 1, last_outcome = ?3
             WHERE position = ?1",
            params![position, reason, outcome],
        ),
        None => exec_cached(
            tx,
            "UPDATE outbox SET accepted = 1, quarantined = 0, quarantine_reason = NULL,
                 accepted_at_ms = coalesce(accepted_at_ms, ?2),
                 attempts = attempts + 1, last_outcome = ?3, last_error = NULL
             WHERE position = ?1",
            params![position, now_ms, receipt.as_str()],
        ),
    }
    .map_err(err)?;
    assert_eq!(marked, 1, "a receipt marks its one outbox row");
    Ok(())
}

/// Moves each flow's relay head to its lowest seq neither accepted nor
/// quarantined, with that event's next attempt time, in one statement; records
/// the round in which the flows were served when `turn` is given. Accepting,
/// quarantining or failing events never makes an earlier seq eligible, so the
/// search walks the `(flow_id, seq)` index from the current head, or from
/// `reopened` (a seq whose quarantine was cleared) when that is earlier. A
/// flow with nothing eligible keeps a NULL head.
fn refresh_heads<S: AsRef<str>>(
    conn: &Connection,
    flows: &[S],
    turn: Option<i64>,
    reopened: Option<i64>,
) -> Result<(), StoreError> {
    let err = |e| sql_error("producer: cannot move the relay heads", e);
    // One lookup per head: the aggregate over at most one row gives the next
    // seq or NULL, and its due time or 0. One execution per flow of a cached
    // statement, without a temporary table for the list.
    let mut statement = conn
        .prepare_cached(
            "UPDATE outbox_head SET
                 (relay_seq, relay_due_ms) = (SELECT max(seq), coalesce(max(due), 0) FROM (
                     SELECT o.seq AS seq, o.next_attempt_at_ms AS due FROM outbox o
                     WHERE o.flow_id = ?1 AND o.accepted = 0 AND o.quarantined = 0
                       AND o.seq >= coalesce(min(outbox_head.relay_seq, ?3), outbox_head.relay_seq, ?3)
                       AND o.seq < coalesce(outbox_head.relay_stop_seq, 9223372036854775807)
                     ORDER BY o.seq LIMIT 1)),
                 relay_turn = coalesce(?2, relay_turn)
             WHERE flow_id = ?1",
        )
        .map_err(err)?;
    for flow in flows {
        statement
            .execute(params![flow.as_ref(), turn, reopened])
            .map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod whole_reads {
    use std::sync::Arc;

    use ordo_core::{FlowId, Receive, SchemaVersion, SystemClock};

    use super::*;
    use crate::{ConsumerDb, OpenOptions, Schema};

    /// A whole-table read past its bound fails whole, on a real file; at
    /// its bound it returns every row.
    #[test]
    fn whole_table_reads_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Schema::new("bounded").unwrap();
        let options = OpenOptions::default();
        let clock = Arc::new(SystemClock);
        let path = dir.path().join("p.db");
        let mut producer = ProducerDb::open_with(&path, &schema, clock.clone(), &options).unwrap();
        let flow = FlowId::new("f").unwrap();
        producer
            .write(|tx| {
                for _ in 0..3 {
                    tx.append(
                        &flow,
                        "noted",
                        SchemaVersion::new(1).unwrap(),
                        &serde_json::json!({}),
                    )?;
                }
                Ok::<_, AppendError>(())
            })
            .unwrap();
        let outbox = read_outbox_at_most(producer.connection(), 3).unwrap();
        assert_eq!(outbox.len(), 3);
        let past = read_outbox_at_most(producer.connection(), 2).unwrap_err();
        assert!(past.to_string().contains("more than 2 rows"), "{past}");

        let path = dir.path().join("c.db");
        let mut consumer = ConsumerDb::open_with(&path, &schema, clock, &options).unwrap();
        let events: Vec<_> = outbox.into_iter().map(|r| r.envelope).collect();
        consumer.receive_batch(&events).unwrap();
        let conn = consumer.connection();
        assert_eq!(
            crate::consumer::schema::read_inbox_at_most(conn, 3)
                .unwrap()
                .len(),
            3
        );
        assert!(crate::consumer::schema::read_inbox_at_most(conn, 2).is_err());
        assert!(crate::consumer::ops::repairs_at_most(conn, 0)
            .unwrap()
            .is_empty());
    }
}
