//! The producer store: flows and the outbox in one SQLite file.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use ordo_core::crash;
use ordo_core::destination::{Destination, DestinationRefused, DestinationStart};
use ordo_core::ops::{
    whole_read, whole_read_limit, OutboxEntry, ProducerStatus, Pruned, RetryRefused,
    WHOLE_READ_ROWS_MAX,
};
use ordo_core::store::sql_limit;
use ordo_core::{
    AppendError, Backoff, Clock, DestinationName, Envelope, EventId, FlowId, OutboxRecord,
    OutboxTx, ProducerName, ProducerOps, ProducerStore, Receipt, StoreError,
};
use rusqlite::{params, Connection, OptionalExtension};

use crate::browse;
use crate::conn::{
    begin_immediate, collect_rows, corrupt, exec_cached, row_cached, sql_error, Held, OpenOptions,
    Opened, Role, Text,
};
use crate::custody;
use crate::outbox_schema;
use crate::round;
use crate::watch::DataVersion;

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
    /// The destination the relay's calls act on, once chosen.
    destination: Option<i64>,
}

/// A write transaction on the producer file, in which the caller changes its
/// own state and appends events: both commit together or not at all.
pub struct ProducerTx<'c> {
    tx: rusqlite::Transaction<'c>,
    /// The hot statements (appends, receipts), each prepared at its first
    /// use and held for the transaction's others; in a cell for the reads
    /// made through a shared borrow ([`OutboxTx::last_seq`]).
    held: RefCell<Held<'c>>,
    producer_name: &'c ProducerName,
    now_ms: i64,
    appended: u64,
    /// The stored body of the event being appended, in a buffer reused
    /// for the transaction's others.
    text: Vec<u8>,
    /// The flow id and key of the head [`OutboxTx::last_seq`] read last,
    /// for the append that follows it (the id's buffer reused): a hint,
    /// checked by the head's update.
    last_head: RefCell<(String, Option<i64>)>,
}

impl ProducerDb {
    crate::conn::open_constructors!(ProducerDb, Role::Producer, outbox_schema::TABLES);

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
            destination: None,
        }
    }

    /// The destination the relay's calls act on: the one chosen, or the
    /// store's only one.
    fn destination_id(&mut self) -> Result<i64, StoreError> {
        if let Some(id) = self.destination {
            return Ok(id);
        }
        let id = custody::only(&self.conn)?;
        self.destination = Some(id);
        Ok(id)
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
        let conn = &self.conn;
        let tx = begin_immediate(conn, "producer")?;
        // Read under the write lock, so times recorded by one writer after
        // another are in commit order.
        let now_ms = self.clock.now_ms();
        let mut ptx = ProducerTx {
            tx,
            held: RefCell::new(Held::new(conn)),
            producer_name: &self.producer_name,
            now_ms,
            appended: 0,
            text: Vec::new(),
            last_head: RefCell::new((String::new(), None)),
        };
        let value = f(&mut ptx)?;
        let ProducerTx {
            tx, held, appended, ..
        } = ptx;
        drop(held);
        tx.commit()
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

    /// Runs `sql`, one of ordo's statements without parameters, held for
    /// the transaction's other runs of it.
    pub(crate) fn run_held(&mut self, sql: &'static str) -> rusqlite::Result<()> {
        self.held.get_mut().get(sql)?.execute([]).map(drop)
    }
}

impl OutboxTx for ProducerTx<'_> {
    fn producer_name(&self) -> &ProducerName {
        self.producer_name
    }

    fn last_seq(&self, flow_id: &FlowId) -> Result<i64, StoreError> {
        let head = self.head(flow_id)?;
        let mut last_head = self.last_head.borrow_mut();
        last_head.0.clear();
        last_head.0.push_str(flow_id.as_str());
        last_head.1 = head.map(|(flow, _)| flow);
        Ok(head.map_or(0, |(_, seq)| seq))
    }

    /// Read once, under the write lock.
    fn now_ms(&self) -> i64 {
        self.now_ms
    }

    fn append_envelope(&mut self, event: &Envelope) -> Result<(), AppendError> {
        ordo_core::store::check_appended(event, self.producer_name)?;
        let err = |e| sql_error("producer: cannot append to the outbox", e);
        let seq = event.seq.get();
        // The head first: it moves only from exactly seq - 1, which is the
        // contiguity check, and gives the flow's key for the row.
        let Some(flow) = self.move_head(event).map_err(err)? else {
            return Err(not_next(event, self.head_seq(&event.flow_id)?));
        };
        self.text.clear();
        event.write_stored_text(&mut self.text);
        let inserted = self.held.get_mut().get(
            "INSERT INTO outbox (event_id, flow_id, flow, seq, schema_version, type, body, created_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )
        .and_then(|statement| {
            statement.execute(params![
                event.event_id.as_str(),
                event.flow_id.as_str(),
                flow,
                seq,
                event.schema_version.get(),
                event.event_type.as_str(),
                Text(&self.text),
                self.now_ms,
            ])
        });
        if let Err(e) = inserted {
            // Refused: take the head back, so nothing is written. A used
            // event id is its own refusal; any other error is returned as
            // it is.
            self.move_head_back(flow, seq).map_err(err)?;
            if e.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation)
                && self.event_id_used(&event.event_id).map_err(err)?
            {
                return Err(AppendError::EventIdUsed(event.event_id.clone()));
            }
            return Err(err(e).into());
        }
        let position = self.tx.last_insert_rowid();
        self.hand_to_destinations(event, flow, position)
            .map_err(err)?;
        debug_assert_eq!(self.head_seq(&event.flow_id).ok(), Some(seq));
        self.appended += 1;
        Ok(())
    }
}

impl ProducerTx<'_> {
    /// The key and last seq of the flow's outbox head, if it has one.
    fn head(&self, flow_id: &FlowId) -> Result<Option<(i64, i64)>, StoreError> {
        self.held
            .borrow_mut()
            .get("SELECT flow, last_seq FROM outbox_head WHERE flow_id = ?1")
            .and_then(|statement| {
                statement.query_row([flow_id.as_str()], |row| Ok((row.get(0)?, row.get(1)?)))
            })
            .optional()
            .map_err(|e| sql_error("producer: cannot read the outbox head", e))
    }

    /// The flow's last seq, 0 if it has none, read without touching the
    /// hint [`OutboxTx::last_seq`] leaves for the next append.
    fn head_seq(&self, flow_id: &FlowId) -> Result<i64, StoreError> {
        Ok(self.head(flow_id)?.map_or(0, |(_, seq)| seq))
    }

    /// Moves the flow's outbox head to `event`'s seq, only from exactly
    /// seq - 1 (or creates it at seq 1): that is the contiguity check,
    /// without a read. The flow's key, `None` when refused.
    fn move_head(&mut self, event: &Envelope) -> rusqlite::Result<Option<i64>> {
        let (flow_id, seq) = (event.flow_id.as_str(), event.seq.get());
        let held = self.held.get_mut();
        if seq == 1 {
            // No head is at 0 (`last_seq >= 1`): only a new one can be made.
            let made = held
                .get(
                    "INSERT INTO outbox_head (flow_id, last_seq) VALUES (?1, 1)
                     ON CONFLICT (flow_id) DO NOTHING",
                )?
                .execute([flow_id])?;
            return Ok((made == 1).then(|| self.tx.last_insert_rowid()));
        }
        // The key of the head just read for this flow, checked by the
        // update itself; else read, then moved by its key (`RETURNING`
        // would build a temporary table at every append).
        let last_key = {
            let (last_id, last_key) = &*self.last_head.borrow();
            last_key.filter(|_| last_id == flow_id)
        };
        if let Some(flow) = last_key {
            let moved = held
                .get(
                    "UPDATE outbox_head SET last_seq = ?3
                     WHERE flow = ?1 AND flow_id = ?2 AND last_seq = ?3 - 1",
                )?
                .execute(params![flow, flow_id, seq])?;
            if moved == 1 {
                return Ok(Some(flow));
            }
        }
        let Some(flow) = held
            .get("SELECT flow FROM outbox_head WHERE flow_id = ?1 AND last_seq = ?2 - 1")?
            .query_row(params![flow_id, seq], |row| row.get::<_, i64>(0))
            .optional()?
        else {
            return Ok(None);
        };
        let moved = held
            .get("UPDATE outbox_head SET last_seq = ?2 WHERE flow = ?1 AND last_seq = ?2 - 1")?
            .execute(params![flow, seq])?;
        assert_eq!(moved, 1, "a head read under the write lock moves");
        Ok(Some(flow))
    }

    /// Undoes [`Self::move_head`] of the flow `flow` to `seq`: a head made
    /// at seq 1 goes, a moved one goes back to seq - 1.
    fn move_head_back(&mut self, flow: i64, seq: i64) -> rusqlite::Result<()> {
        let sql = if seq == 1 {
            "DELETE FROM outbox_head WHERE flow = ?1 AND last_seq = ?2"
        } else {
            "UPDATE outbox_head SET last_seq = ?2 - 1 WHERE flow = ?1 AND last_seq = ?2"
        };
        let moved = exec_cached(&self.tx, sql, params![flow, seq])?;
        debug_assert_eq!(moved, 1);
        Ok(())
    }

    /// Whether an outbox row has the id `event_id`.
    fn event_id_used(&self, event_id: &EventId) -> rusqlite::Result<bool> {
        row_cached(
            &self.tx,
            "SELECT EXISTS (SELECT 1 FROM outbox WHERE event_id = ?1)",
            [event_id.as_str()],
            |row| row.get(0),
        )
    }

    /// Gives the row at `position` to the destinations of its flow `flow`:
    /// at seq 1 the flow becomes every destination's (decided under the
    /// write lock, which adding a destination takes too), later its relay
    /// heads move. A row no destination waits for is settled at once.
    fn hand_to_destinations(
        &mut self,
        event: &Envelope,
        flow: i64,
        position: i64,
    ) -> rusqlite::Result<()> {
        let held = self.held.get_mut();
        let waiting = if event.seq.get() == 1 {
            held.get(
                "INSERT INTO relay_head (flow, destination, relay_seq, relay_due_ms)
                 SELECT ?1, id, 1, 0 FROM destination",
            )?
            .execute([flow])?;
            // The flow's relay heads are the ones just made, one per
            // destination, none abandoned: a mark for each destination,
            // without walking them.
            held.get("INSERT INTO custody (position, destination) SELECT ?1, id FROM destination")?
                .execute([position])?
        } else {
            held.get(
                // Only a head with nothing to relay changes (a no-op update
                // of the others would still write their rows).
                "UPDATE relay_head SET
                     relay_seq = CASE WHEN relay_stop_seq IS NULL THEN ?2 END,
                     relay_due_ms = 0
                 WHERE flow = ?1 AND abandoned_seq IS NULL AND relay_seq IS NULL",
            )?
            .execute(params![flow, event.seq.get()])?;
            held.get(
                "INSERT INTO custody (position, destination)
                 SELECT ?1, destination FROM relay_head WHERE flow = ?2 AND abandoned_seq IS NULL",
            )?
            .execute(params![position, flow])?
        };
        if waiting == 0 {
            exec_cached(
                &self.tx,
                "UPDATE outbox SET accepted = 1, accepted_at_ms = ?2 WHERE position = ?1",
                params![position, self.now_ms],
            )?;
        }
        Ok(())
    }
}

/// The last receipt of each event of `receipts`, in the order of their ids.
fn latest_receipts(receipts: &[(EventId, Receipt)]) -> Vec<(&str, Receipt)> {
    let mut latest: Vec<(&str, usize, Receipt)> = (receipts.iter().enumerate())
        .map(|(at, (event_id, receipt))| (event_id.as_str(), at, *receipt))
        .collect();
    latest.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    // Of one event's receipts, the later one replaces the earlier kept.
    latest.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.2 = later.2;
        }
        same
    });
    latest
        .into_iter()
        .map(|(id, _, receipt)| (id, receipt))
        .collect()
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
    let sql = concat!(
        "SELECT body, ",
        custody::held_everywhere_sql!(),
        " FROM outbox o ORDER BY position LIMIT ?1"
    );
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
            concat!(
                "SELECT body, ",
                custody::held_everywhere_sql!(),
                " FROM outbox o WHERE event_id = ?1"
            ),
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
        browse::outbox_entries(
            &self.conn,
            "SELECT position, flow_id, seq, body, created_at_ms, accepted FROM outbox o
             WHERE (NOT ?1 OR EXISTS (SELECT 1 FROM custody c
                 WHERE c.position = o.position AND c.quarantined = 1))
             ORDER BY position LIMIT ?2",
            params![quarantined_only, sql_limit(limit)],
        )
    }

    fn retry_quarantined(
        &mut self,
        event_id: &EventId,
    ) -> Result<Result<(), RetryRefused>, StoreError> {
        let destination = self.destination_id()?;
        self.write(|ptx| {
            let tx = &ptx.tx;
            let err = |e| sql_error("producer: cannot retry a quarantined event", e);
            let row: Option<(i64, i64, Option<bool>)> = row_cached(
                tx,
                "SELECT o.flow, o.seq, c.quarantined FROM outbox o
                 LEFT JOIN custody c ON c.position = o.position AND c.destination = ?2
                 WHERE o.event_id = ?1",
                params![event_id.as_str(), destination],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .optional()
            .map_err(err)?;
            let (flow, seq) = match row {
                None => return Ok(Err(RetryRefused::Unknown(event_id.clone()))),
                Some((flow, seq, Some(true))) => (flow, seq),
                Some(_) => return Ok(Err(RetryRefused::NotQuarantined(event_id.clone()))),
            };
            exec_cached(
                tx,
                "UPDATE custody SET quarantined = 0, quarantine_reason = NULL,
                     quarantine_detail = NULL, next_attempt_at_ms = 0
                 WHERE destination = ?2 AND position = (SELECT position FROM outbox WHERE event_id = ?1)",
                params![event_id.as_str(), destination],
            )
            .map_err(err)?;
            // A retried rewound event lifts its flow's stop.
            exec_cached(
                tx,
                "UPDATE relay_head SET relay_stop_seq = NULL
                 WHERE flow = ?1 AND destination = ?3 AND relay_stop_seq = ?2",
                params![flow, seq, destination],
            )
            .map_err(err)?;
            custody::refresh_heads(tx, destination, &[flow], None, Some(seq))?;
            Ok(Ok(()))
        })
    }

    fn producer_status(&mut self, now_ms: i64) -> Result<ProducerStatus, StoreError> {
        let destinations = custody::destinations(&self.conn, now_ms)?;
        Ok(ordo_core::destination::sum_statuses(
            destinations.iter().map(|d| &d.status),
        ))
    }

    fn prune_outbox(&mut self, cutoff_ms: i64) -> Result<Pruned, StoreError> {
        self.write(|ptx| {
            let err = |e| sql_error("producer: cannot prune the outbox", e);
            exec_cached(
                &ptx.tx,
                "DELETE FROM custody WHERE position IN (
                     SELECT position FROM outbox WHERE accepted = 1 AND accepted_at_ms < ?1)",
                [cutoff_ms],
            )
            .map_err(err)?;
            let rows = exec_cached(
                &ptx.tx,
                "DELETE FROM outbox WHERE accepted = 1 AND accepted_at_ms < ?1",
                [cutoff_ms],
            )
            .map_err(err)?;
            Ok(Pruned {
                rows: rows as u64,
                fingerprints: 0,
            })
        })
    }

    fn destinations(&mut self, now_ms: i64) -> Result<Vec<Destination>, StoreError> {
        custody::destinations(&self.conn, now_ms)
    }

    fn add_destination(
        &mut self,
        name: &DestinationName,
        from: DestinationStart,
    ) -> Result<Result<(), DestinationRefused>, StoreError> {
        self.write(|ptx| {
            let refused = custody::add(&ptx.tx, name, from, ptx.now_ms)?;
            Ok::<_, StoreError>(refused)
        })
    }

    fn remove_destination(
        &mut self,
        name: &DestinationName,
        by: &str,
        reason: &str,
    ) -> Result<Result<(), DestinationRefused>, StoreError> {
        let removed = self.write(|ptx| custody::remove(&ptx.tx, name, (by, reason), ptx.now_ms))?;
        Ok(removed.map(|id| {
            if self.destination == Some(id) {
                self.destination = None;
            }
        }))
    }

    fn abandon_flow(
        &mut self,
        request: &ordo_core::destination::AbandonRequest,
    ) -> Result<Result<ordo_core::destination::ProducerRepair, DestinationRefused>, StoreError>
    {
        self.write(|ptx| custody::abandon(&ptx.tx, request, ptx.now_ms))
    }

    fn producer_repairs(
        &mut self,
    ) -> Result<Vec<ordo_core::destination::ProducerRepair>, StoreError> {
        custody::repairs(&self.conn)
    }

    fn use_destination(
        &mut self,
        name: Option<&DestinationName>,
    ) -> Result<Result<(), DestinationRefused>, StoreError> {
        Ok(custody::choose(&self.conn, name)?.map(|id| self.destination = Some(id)))
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
        let destination = self.destination_id()?;
        collect_rows(
            &self.conn,
            "producer: cannot read pending events",
            "SELECT o.body FROM custody c JOIN outbox o ON o.position = c.position
             WHERE c.destination = ?1 AND c.accepted = 0 AND c.abandoned = 0
             ORDER BY c.position LIMIT ?2",
            params![destination, sql_limit(limit)],
            |row| row.get::<_, String>(0),
            |body| stored_envelope("producer: stored outbox body", &body),
        )
    }

    fn oldest_unaccepted(&mut self, now_ms: i64) -> Result<Option<Envelope>, StoreError> {
        let destination = self.destination_id()?;
        let row: Option<(String, i64)> = row_cached(
            &self.conn,
            "SELECT o.body, c.next_attempt_at_ms FROM custody c JOIN outbox o ON o.position = c.position
             WHERE c.destination = ?1 AND c.accepted = 0 AND c.abandoned = 0
             ORDER BY c.position LIMIT 1",
            [destination],
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

    fn fair_round_deep(
        &mut self,
        limit: usize,
        flow_events_max: usize,
        skip: &BTreeSet<FlowId>,
        now_ms: i64,
    ) -> Result<Vec<Envelope>, StoreError> {
        let destination = self.destination_id()?;
        let flow_events_max = flow_events_max.min(round::FLOW_EVENTS_MAX);
        round::fair_round(
            &self.conn,
            destination,
            (limit, flow_events_max),
            skip,
            now_ms,
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
        self.record_receipts_from(None, receipts, now_ms)
    }

    fn recorded_consumer(&mut self) -> Result<Option<ordo_core::StoreId>, StoreError> {
        let destination = self.destination_id()?;
        custody::recorded_consumer(&self.conn, destination)
    }

    fn check_consumer(&mut self, consumer: &ordo_core::StoreId) -> Result<(), StoreError> {
        let destination = self.destination_id()?;
        custody::checked_consumer(&self.conn, destination, consumer).map(drop)
    }

    /// As [`record_receipts`](ProducerStore::record_receipts), with the
    /// destination's consumer identity recorded or enforced first, in the
    /// same transaction.
    fn record_receipts_from(
        &mut self,
        consumer: Option<&ordo_core::StoreId>,
        receipts: &[(EventId, Receipt)],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let destination = self.destination_id()?;
        self.write_synced(false, |ptx| {
            let tx = &ptx.tx;
            custody::check_consumer(tx, destination, consumer)?;
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
            let mut flows = Vec::new();
            for (event_id, receipt) in latest_receipts(receipts) {
                let row: Option<(i64, i64, i64)> = ptx
                    .held
                    .get_mut()
                    .get("SELECT position, flow, seq FROM outbox WHERE event_id = ?1")
                    .and_then(|statement| {
                        statement.query_row([event_id], |row| {
                            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                        })
                    })
                    .optional()
                    .map_err(err)?;
                // An event no longer in the outbox was settled and pruned
                // meanwhile (another relay recorded its receipt first):
                // there is nothing left to mark.
                let Some((position, flow, seq)) = row else {
                    continue;
                };
                let at = ptx.now_ms.max(now_ms);
                let row = (position, flow, seq);
                custody::mark_receipt(ptx.held.get_mut(), destination, row, receipt, at)?;
                flows.push(flow);
            }
            flows.sort_unstable();
            flows.dedup();
            custody::refresh_heads(tx, destination, &flows, Some(turn), None)?;
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
        let destination = self.destination_id()?;
        // Bookkeeping like the receipts: a lost attempt count only retries
        // sooner.
        self.write_synced(false, |ptx| {
            let tx = &ptx.tx;
            let err = |e| sql_error("producer: cannot record a delivery failure", e);
            let mut flows = BTreeSet::new();
            for event_id in event_ids {
                let row: Option<(i64, i64)> = row_cached(
                    tx,
                    "SELECT position, flow FROM outbox WHERE event_id = ?1",
                    [event_id.as_str()],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()
                .map_err(err)?;
                let Some((position, flow)) = row else { continue };
                let attempts: Option<i64> = row_cached(
                    tx,
                    "UPDATE custody SET attempts = attempts + 1, last_outcome = 'error', last_error = ?3
                     WHERE position = ?1 AND destination = ?2 AND accepted = 0 RETURNING attempts",
                    params![position, destination, error],
                    |row| row.get(0),
                )
                .optional()
                .map_err(err)?;
                let Some(attempts) = attempts else { continue };
                let delay_ms =
                    backoff.delay_ms(u32::try_from(attempts).unwrap_or(u32::MAX), fastrand::f64());
                // Strictly later than the failure, whatever the jitter drew.
                let due = now_ms.saturating_add(1).saturating_add(delay_ms as i64);
                exec_cached(
                    tx,
                    "UPDATE custody SET next_attempt_at_ms = ?3 WHERE position = ?1 AND destination = ?2",
                    params![position, destination, due],
                )
                .map_err(err)?;
                flows.insert(flow);
            }
            let flows: Vec<i64> = flows.into_iter().collect();
            custody::refresh_heads(tx, destination, &flows, None, None)
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
        let destination = self.destination_id()?;
        self.write_synced(false, |ptx| {
            let tx = &ptx.tx;
            let err = |e| sql_error("producer: cannot quarantine an event", e);
            let flow: Option<i64> = row_cached(
                tx,
                "UPDATE custody SET quarantined = 1, quarantine_reason = ?3, quarantine_detail = ?4,
                     attempts = attempts + 1, last_outcome = ?3, last_error = ?4
                 WHERE destination = ?2 AND accepted = 0 AND abandoned = 0
                   AND position = (SELECT position FROM outbox WHERE event_id = ?1)
                 RETURNING (SELECT flow FROM outbox WHERE event_id = ?1)",
                params![event_id.as_str(), destination, outcome, reason],
                |row| row.get(0),
            )
            .optional()
            .map_err(err)?;
            custody::refresh_heads(
                tx,
                destination,
                &flow.into_iter().collect::<Vec<_>>(),
                None,
                None,
            )
        })
    }
}

pub use ordo_core::CONFLICT_REASON;

#[cfg(test)]
mod whole_reads {
    use std::sync::Arc;

    use ordo_core::{FlowId, Receive, SchemaVersion, SystemClock};

    use super::*;
    use crate::{ConsumerDb, OpenOptions, Schema};

    /// Of several receipts of one event, the last counts; the events in
    /// the order of their ids.
    #[test]
    fn the_last_receipt_of_each_event_counts() {
        let id = |text: &str| EventId::new(text.to_string()).unwrap();
        let receipts = [
            (id("b"), Receipt::Conflict),
            (id("a"), Receipt::Duplicate),
            (id("b"), Receipt::Accepted),
            (id("a"), Receipt::Accepted),
            (id("c"), Receipt::Duplicate),
            (id("a"), Receipt::Conflict),
        ];
        assert_eq!(
            latest_receipts(&receipts),
            [
                ("a", Receipt::Conflict),
                ("b", Receipt::Accepted),
                ("c", Receipt::Duplicate)
            ]
        );
    }

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
