//! Apply: the flow's next event through the application's handler, alone
//! or in batches across flows, strictly in order per flow.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use ordo_core::apply::{
    check_cursors_moved, ApplyStore, ApplyWriter, NextEvent, NextRows, SettledState,
};
use ordo_core::store::{stored_producer, WorkPage};
use ordo_core::{
    BlockCode, BlockReason, Envelope, ErrorKind, EventId, FlowId, InboxFlow, Seq, StoreError,
};

use super::{inbox_status, PgConsumer};
use crate::conn::PgTx;
use crate::error::corrupt;

const CONTEXT: &str = "consumer: apply failed";

/// Begins an apply transaction: `ordo.apply_tx` is set for it alone, so
/// that a handler that ends the transaction (which it must not) clears it,
/// and the mark then fails.
const BEGIN_APPLY: &str = "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL ordo.apply_tx = 'on'";

impl ApplyStore for PgConsumer {
    type Tx = PgTx;
    type Writer<'a> = ApplyTx<'a>;

    /// One READ COMMITTED transaction: a step locks its flow's cursor, a
    /// batch locks each flow when its turn comes, reading many flows ahead
    /// of their turn, and writes its marks and cursors at its end.
    fn begin_apply(&mut self, batch: bool) -> Result<ApplyTx<'_>, StoreError> {
        let txid = self.conn.begin_with(CONTEXT, BEGIN_APPLY)?;
        Ok(ApplyTx {
            tx: &self.conn,
            txid,
            now_ms: self.clock.now_ms(),
            batch: batch.then(Batch::default),
            commits: &mut self.commits,
            open: true,
            store_id: &self.store_id,
        })
    }

    fn commit_apply(mut writer: ApplyTx<'_>) -> Result<(), StoreError> {
        writer.open = false;
        writer
            .tx
            .commit("consumer: apply commit failed", writer.txid)?;
        *writer.commits += 1;
        Ok(())
    }

    fn settled_state(&self, flow: &InboxFlow) -> Result<SettledState, StoreError> {
        let row = self
            .conn
            .row(
                "consumer: cannot check an applied flow",
                "WITH c AS (SELECT coalesce((SELECT applied_seq FROM {s}.inbox_cursor
                                             WHERE flow_id = $1 AND producer = $2), 0) AS at)
                 SELECT c.at,
                        (SELECT count(*) FROM {s}.inbox
                         WHERE flow_id = $1 AND producer = $2 AND seq <= c.at
                           AND status NOT IN ('applied', 'skipped')),
                        (SELECT count(*) FROM {s}.inbox
                         WHERE flow_id = $1 AND producer = $2 AND seq > c.at
                           AND status IN ('applied', 'skipped'))
                 FROM c",
                &[&flow.flow_id.as_str(), &flow.producer.as_str()],
            )?
            .expect("a SELECT of one row");
        Ok(SettledState {
            cursor: row.get(0),
            unsettled_below: row.get(1),
            settled_above: row.get(2),
        })
    }
}

/// One open apply transaction of a [`PgConsumer`], as ordo's apply engine
/// writes through it ([`ApplyStore`]): alone, or with a batch's read-ahead
/// and the marks it writes at its end. Rolled back when dropped
/// uncommitted.
pub struct ApplyTx<'a> {
    tx: &'a PgTx,
    txid: i64,
    now_ms: i64,
    batch: Option<Batch>,
    commits: &'a mut u64,
    open: bool,
    store_id: &'a ordo_core::StoreId,
}

impl Drop for ApplyTx<'_> {
    fn drop(&mut self) {
        if self.open {
            self.tx.rollback();
        }
    }
}

impl ApplyWriter for ApplyTx<'_> {
    type Tx = PgTx;

    fn handler_tx(&self) -> &PgTx {
        self.tx
    }

    fn take_flow(&mut self, flow: &InboxFlow) -> Result<i64, StoreError> {
        lock_cursor(self.tx, flow)
    }

    fn open_flow(
        &mut self,
        flows: &[(InboxFlow, Option<u64>)],
        left: u64,
    ) -> Result<Option<i64>, StoreError> {
        let batch = self.batch.as_mut().expect("only a batch opens flows");
        batch.open(self.tx, flows, left)
    }

    fn next_event(&mut self, flow: &InboxFlow, rows: NextRows) -> Result<NextEvent, StoreError> {
        let next = rows.from;
        let Some(batch) = self.batch.as_mut() else {
            return next_row(self.tx, flow, next);
        };
        let read = batch
            .current
            .as_mut()
            .expect("a batch reads the flow it opened");
        match read.next(self.tx, flow, next.get() - 1, rows.most)? {
            Some(row) => row.found(next),
            None => Ok(NextEvent::missing(false)),
        }
    }

    fn savepoint(&mut self) -> Result<(), StoreError> {
        self.tx.control(CONTEXT, "SAVEPOINT ordo_apply_event")
    }

    fn release_savepoint(&mut self) -> Result<(), StoreError> {
        self.tx
            .control(CONTEXT, "RELEASE SAVEPOINT ordo_apply_event")
    }

    fn rollback_savepoint(&mut self) -> Result<(), StoreError> {
        self.tx.control(
            CONTEXT,
            "ROLLBACK TO SAVEPOINT ordo_apply_event; RELEASE SAVEPOINT ordo_apply_event",
        )
    }

    fn after_handler(&self, _flow_id: &FlowId, _seq: Seq) -> Result<(), StoreError> {
        // Every mark checks `ordo.apply_tx` itself.
        Ok(())
    }

    fn check_open(&self, flow_id: &FlowId, seq: Seq) -> Result<(), StoreError> {
        check_still_open(self.tx, flow_id, seq)
    }

    fn mark_applied(&mut self, event: &Envelope) -> Result<(), StoreError> {
        match self.batch.as_mut() {
            Some(batch) => {
                batch.marks.applied(event);
                Ok(())
            }
            None => mark_applied(self.tx, event, self.now_ms),
        }
    }

    fn mark_blocked(&mut self, event: &Envelope, reason: &BlockReason) -> Result<(), StoreError> {
        mark_blocked(self.tx, event, reason)
    }

    fn store_id(&self) -> &ordo_core::StoreId {
        self.store_id
    }

    fn record_intents(&mut self, intents: &[ordo_core::effect::Intent]) -> Result<(), StoreError> {
        super::effects::insert_intents(self.tx, intents, self.now_ms)
    }

    fn close_flow(&mut self, flow: &InboxFlow, applied_seq: i64) -> Result<(), StoreError> {
        match self.batch.as_mut() {
            Some(batch) => {
                let before = batch.marks.cursors.insert(flow.clone(), applied_seq);
                assert!(
                    before.is_none_or(|seq| seq < applied_seq),
                    "a cursor moves forward"
                );
                Ok(())
            }
            None => write_cursor(self.tx, flow, applied_seq),
        }
    }

    fn finish(&mut self) -> Result<(), StoreError> {
        match &self.batch {
            Some(batch) => batch.marks.write(self.tx, self.now_ms),
            None => Ok(()),
        }
    }
}

/// What a batch keeps while it runs: the flows read ahead, the flow in
/// progress, and what it writes at its end.
#[derive(Default)]
struct Batch {
    marks: Marks,
    ahead: ReadAhead,
    current: Option<Read>,
}

impl Batch {
    /// Takes `flows[0]`: goes on from where this batch left it, or locks
    /// and reads it (as read ahead where it was); `None` when another
    /// applier holds it.
    fn open(
        &mut self,
        tx: &PgTx,
        flows: &[(InboxFlow, Option<u64>)],
        left: u64,
    ) -> Result<Option<i64>, StoreError> {
        let (flow, limit) = &flows[0];
        let most = limit.map_or(left, |limit| limit.min(left));
        // A flow met before in this batch goes on from where it stopped.
        let moved = self.marks.cursors.get(flow).copied();
        let read = match moved {
            Some(_) => lock_and_read(tx, flow, moved, most.saturating_add(1))?.map(Read::all),
            None => self.ahead.read(tx, flows, &self.marks, left)?,
        };
        let Some(read) = read else {
            return Ok(None);
        };
        let applied_seq = moved.unwrap_or(read.locked_at);
        self.current = Some(read);
        Ok(Some(applied_seq))
    }
}

/// What a batch writes at its end, in two statements: the events its
/// handlers applied, and the flows' new apply cursors.
#[derive(Default)]
struct Marks {
    event_ids: Vec<String>,
    flows: Vec<String>,
    producers: Vec<String>,
    seqs: Vec<i64>,
    cursors: BTreeMap<InboxFlow, i64>,
}

impl Marks {
    fn applied(&mut self, event: &Envelope) {
        self.event_ids.push(event.event_id.as_str().to_owned());
        self.flows.push(event.flow_id.as_str().to_owned());
        self.producers.push(event.producer.as_str().to_owned());
        self.seqs.push(event.seq.get());
    }

    /// Marks every applied event, only inside the apply transaction (see
    /// [`mark_applied`]), and moves the cursors.
    fn write(&self, tx: &PgTx, now_ms: i64) -> Result<(), StoreError> {
        if !self.event_ids.is_empty() {
            let marked: BTreeSet<(String, String)> = tx
                .rows(
                    CONTEXT,
                    MARK_APPLIED_MANY_SQL,
                    &[
                        &self.event_ids,
                        &self.flows,
                        &self.seqs,
                        &now_ms,
                        &self.producers,
                    ],
                )?
                .iter()
                .map(|row| (row.get(0), row.get(1)))
                .collect();
            // Each event of a batch is marked once: all marked is the
            // common case, told by the count alone.
            let key = |i: usize| (self.event_ids[i].clone(), self.producers[i].clone());
            let unmarked = (marked.len() != self.event_ids.len())
                .then(|| (0..self.event_ids.len()).find(|i| !marked.contains(&key(*i))))
                .flatten();
            if let Some(i) = unmarked {
                let flow_id = FlowId::new(self.flows[i].clone())
                    .map_err(|e| corrupt("consumer: stored flow id", e))?;
                let seq = Seq::new(self.seqs[i]).map_err(|e| corrupt("consumer: stored seq", e))?;
                check_still_open(tx, &flow_id, seq)?;
                return Err(corrupt(
                    "consumer: inbox",
                    format!(
                        "the body stored at flow {flow_id} seq {seq} names event {}",
                        self.event_ids[i]
                    ),
                ));
            }
        }
        if !self.cursors.is_empty() {
            let flows: Vec<&str> = self.cursors.keys().map(|f| f.flow_id.as_str()).collect();
            let producers: Vec<&str> = self.cursors.keys().map(|f| f.producer.as_str()).collect();
            let seqs: Vec<i64> = self.cursors.values().copied().collect();
            let moved = tx.run(
                "consumer: cannot move the apply cursor",
                "INSERT INTO {s}.inbox_cursor AS c (flow_id, producer, applied_seq)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
                 ON CONFLICT (flow_id, producer) DO UPDATE SET applied_seq = excluded.applied_seq
                 WHERE excluded.applied_seq > c.applied_seq",
                &[&flows, &producers, &seqs],
            )?;
            check_cursors_moved(moved, flows.len(), &flows[0], seqs[0])?;
        }
        Ok(())
    }
}

/// The most flows one statement locks and reads ahead of their turn.
const READ_AHEAD_FLOWS_MAX: usize = 256;

/// The rows per flow a batch's first read-ahead expects, before it has
/// seen any: it locks about as many flows as the events left need at this
/// many each. Later read-aheads go by the rows per flow the batch found.
const READ_AHEAD_ROWS_PER_FLOW_GUESS: u64 = 2;

/// A flow's apply cursor, locked by this transaction, and its rows after
/// it read so far, in seq order.
struct Read {
    locked_at: i64,
    rows: VecDeque<Ahead>,
    /// Whether more rows may be stored after those read (the read stopped
    /// at its limit).
    more: bool,
}

impl Read {
    /// A read that asked for every row the batch may need.
    fn all((locked_at, rows): (i64, Vec<Ahead>)) -> Read {
        Read {
            locked_at,
            rows: rows.into(),
            more: false,
        }
    }

    /// The first row after `applied_seq`, reading up to `want` more rows
    /// when those read ahead have run out and more may be stored.
    fn next(
        &mut self,
        tx: &PgTx,
        flow: &InboxFlow,
        applied_seq: i64,
        want: u64,
    ) -> Result<Option<Ahead>, StoreError> {
        if self.rows.is_empty() && self.more {
            // This transaction holds the flow: SKIP LOCKED does not skip it.
            let (_, rows) = lock_and_read(tx, flow, Some(applied_seq), want)?
                .ok_or_else(|| corrupt("consumer: apply", "a flow the batch holds was skipped"))?;
            *self = Read::all((applied_seq, rows));
        }
        Ok(self.rows.pop_front())
    }
}

/// Flows of a batch locked and read before their turn, many in one
/// statement.
#[derive(Default)]
struct ReadAhead {
    /// Every flow a read ahead asked for.
    asked: HashSet<InboxFlow>,
    /// Those it locked, not yet taken.
    read: HashMap<InboxFlow, Read>,
    /// Those another applier held.
    held: HashSet<InboxFlow>,
    /// How many flows the read-aheads locked, and the rows they read.
    flows_locked: u64,
    rows_read: u64,
}

impl ReadAhead {
    /// The flow `flows[0]`, locked and read: as read ahead, or else with the
    /// flows after it not asked for yet (about as many as the events `left`
    /// need, see [`ReadAhead::chunk_len`]) in one statement; alone when a
    /// read ahead found no cursor for it. `None` when another applier
    /// holds it.
    fn read(
        &mut self,
        tx: &PgTx,
        flows: &[(InboxFlow, Option<u64>)],
        marks: &Marks,
        left: u64,
    ) -> Result<Option<Read>, StoreError> {
        let flow = &flows[0].0;
        if !self.asked.contains(flow) {
            let most = self.chunk_len(left);
            let mut chunk: Vec<&InboxFlow> = Vec::new();
            for (each, _) in flows {
                if chunk.len() >= most {
                    break;
                }
                if !marks.cursors.contains_key(each) && self.asked.insert(each.clone()) {
                    chunk.push(each);
                }
            }
            // Enough rows for every event left, and one more than the
            // flows' share of them: a flow with fewer rows than asked has
            // no more, so a flow with as many rows as its share is read
            // once (asked for its share exactly, it would be read again
            // alone to find nothing after them, and the rows read per flow
            // that size the next chunk would never grow past the guess).
            let each = (left + 1).div_ceil(chunk.len() as u64).saturating_add(1);
            let many = lock_and_read_many(tx, &chunk, each)?;
            self.flows_locked += many.locked.len() as u64;
            self.rows_read += many
                .locked
                .values()
                .map(|r| r.rows.len() as u64)
                .sum::<u64>();
            self.read.extend(many.locked);
            self.held.extend(many.held);
        }
        if let Some(read) = self.read.remove(flow) {
            return Ok(Some(read));
        }
        if self.held.contains(flow) {
            return Ok(None);
        }
        let take = left.saturating_add(1);
        Ok(lock_and_read(tx, &flows[0].0, None, take)?.map(Read::all))
    }

    /// How many flows the next read-ahead locks for `left` events: as many
    /// as they need at the rows per flow read so far (a guess before the
    /// first), so that a batch holds few flows it will not reach (another
    /// applier takes those meanwhile); one at least,
    /// [`READ_AHEAD_FLOWS_MAX`] at most.
    fn chunk_len(&self, left: u64) -> usize {
        let per_flow = match self.flows_locked {
            0 => READ_AHEAD_ROWS_PER_FLOW_GUESS,
            flows => (self.rows_read / flows).max(1),
        };
        usize::try_from(left.div_ceil(per_flow))
            .unwrap_or(usize::MAX)
            .clamp(1, READ_AHEAD_FLOWS_MAX)
    }
}

/// Marks the events `$1` (of flows `$2` at seqs `$3`, of producers `$5`)
/// applied at `$4`, each only while still open and inside an apply
/// transaction; returns the ones marked. By key whatever the inbox's size
/// (see `LOCK_AND_READ_MANY_SQL`).
const MARK_APPLIED_MANY_SQL: &str = "UPDATE {s}.inbox i SET status = 'applied', reason = NULL,
         detail = NULL, settled_at_ms = $4
     FROM unnest($1::text[], $2::text[], $3::bigint[], $5::text[]) AS m(event_id, flow_id, seq, producer)
     WHERE i.event_id = ANY (ARRAY(SELECT unnest($1::text[])))
       AND i.event_id = m.event_id AND i.producer = m.producer
       AND i.flow_id = m.flow_id AND i.seq = m.seq
       AND i.status IN ('pending', 'blocked')
       AND current_setting('ordo.apply_tx', true) = 'on'
     RETURNING i.event_id, i.producer";

/// [`lock_and_read_many`]'s statement. The cursors go by their primary key
/// whatever the planner guesses of the table (`ARRAY(...)` hides the
/// array's length from it). A cursor row seen but not locked is locked by
/// another transaction: `held`.
const LOCK_AND_READ_MANY_SQL: &str = "WITH wanted AS (
             SELECT * FROM unnest($1::text[], $3::text[]) AS w(flow_id, producer)),
         locked AS (
             SELECT c.flow_id, c.producer, c.applied_seq FROM {s}.inbox_cursor c
             WHERE c.flow_id = ANY (ARRAY(SELECT unnest($1::text[])))
               AND (c.flow_id, c.producer) IN (SELECT flow_id, producer FROM wanted)
             ORDER BY c.flow_id, c.producer FOR UPDATE SKIP LOCKED),
         held AS (
             SELECT c.flow_id, c.producer FROM {s}.inbox_cursor c
             WHERE c.flow_id = ANY (ARRAY(SELECT unnest($1::text[])))
               AND (c.flow_id, c.producer) IN (SELECT flow_id, producer FROM wanted)
               AND NOT EXISTS (SELECT 1 FROM locked l
                               WHERE l.flow_id = c.flow_id AND l.producer = c.producer))
         SELECT l.flow_id, l.producer, l.applied_seq, n.seq, n.body, n.status, n.reason, n.detail
         FROM locked l LEFT JOIN LATERAL (
             SELECT i.seq, i.body, i.status, i.reason, i.detail FROM {s}.inbox i
             WHERE i.flow_id = l.flow_id AND i.producer = l.producer AND i.seq > l.applied_seq
             ORDER BY i.seq LIMIT $2) AS n ON true
         UNION ALL
         SELECT h.flow_id, h.producer, NULL, NULL, NULL, NULL, NULL, NULL FROM held h
         ORDER BY 1, 2, 4";

/// What one statement found of many flows: those it locked, with their
/// rows, and those another applier holds.
#[derive(Default)]
struct ManyRead {
    locked: HashMap<InboxFlow, Read>,
    held: HashSet<InboxFlow>,
}

/// Locks the apply cursors of `flows` that no other applier holds, and
/// reads up to `each` rows after each, in one statement; also names the
/// flows whose cursor another applier holds. Flows without a cursor are in
/// neither.
fn lock_and_read_many(tx: &PgTx, flows: &[&InboxFlow], each: u64) -> Result<ManyRead, StoreError> {
    let each_sql = i64::try_from(each).unwrap_or(i64::MAX);
    let flow_ids: Vec<&str> = flows.iter().map(|f| f.flow_id.as_str()).collect();
    let producers: Vec<&str> = flows.iter().map(|f| f.producer.as_str()).collect();
    let rows = tx.rows(
        "consumer: cannot lock the apply cursors",
        LOCK_AND_READ_MANY_SQL,
        &[&flow_ids, &each_sql, &producers],
    )?;
    let mut many = ManyRead::default();
    let read = &mut many.locked;
    for row in &rows {
        let flow = stored_flow(row.get(0), row.get(1))?;
        let Some(locked_at) = row.get::<_, Option<i64>>(2) else {
            many.held.insert(flow);
            continue;
        };
        let entry = read.entry(flow).or_insert_with(|| Read {
            locked_at,
            rows: VecDeque::new(),
            more: false,
        });
        if let Some(ahead) = Ahead::of(row, 3) {
            entry.rows.push_back(ahead);
        }
    }
    for entry in read.values_mut() {
        entry.more = entry.rows.len() as u64 >= each;
    }
    Ok(many)
}

/// The flow of a stored `(flow_id, producer)`.
fn stored_flow(flow_id: String, producer: &str) -> Result<InboxFlow, StoreError> {
    let flow_id = FlowId::new(flow_id).map_err(|e| corrupt("consumer: stored flow id", e))?;
    Ok(InboxFlow::new(stored_producer(producer)?, flow_id))
}

/// A stored row after a flow's cursor.
struct Ahead {
    seq: i64,
    body: String,
    status: String,
    reason: Option<String>,
    detail: Option<String>,
}

impl Ahead {
    /// The row in the columns of `row` from `first` on (seq, body, status,
    /// reason, detail); `None` where a left join found none.
    fn of(row: &postgres::Row, first: usize) -> Option<Ahead> {
        Some(Ahead {
            seq: row.get::<_, Option<i64>>(first)?,
            body: row.get(first + 1),
            status: row.get(first + 2),
            reason: row.get(first + 3),
            detail: row.get(first + 4),
        })
    }

    /// What is stored at `next`, given that this is the first row at or
    /// after it.
    fn found(self, next: Seq) -> Result<NextEvent, StoreError> {
        let status = inbox_status(&self.status, self.reason.as_deref(), self.detail)?;
        Ok(NextEvent::at(next, Some((self.seq, self.body, status))))
    }
}

/// Locks the flow's apply cursor unless another applier holds it (then
/// `None`), creating it at 0 if it has none, and reads up to `take` rows
/// after it (after `moved` instead, where this batch has moved it), in seq
/// order, in one statement: the stored cursor and the rows.
fn lock_and_read(
    tx: &PgTx,
    flow: &InboxFlow,
    moved: Option<i64>,
    take: u64,
) -> Result<Option<(i64, Vec<Ahead>)>, StoreError> {
    let take = i64::try_from(take).unwrap_or(i64::MAX);
    let rows = tx.rows(
        "consumer: cannot lock the apply cursor",
        "WITH locked AS (
             SELECT flow_id, producer, applied_seq FROM {s}.inbox_cursor
             WHERE flow_id = $1 AND producer = $4
             FOR UPDATE SKIP LOCKED),
         created AS (
             INSERT INTO {s}.inbox_cursor (flow_id, producer, applied_seq)
             SELECT $1, $4, 0 WHERE NOT EXISTS (SELECT 1 FROM locked)
             ON CONFLICT (flow_id, producer) DO NOTHING RETURNING flow_id, producer, applied_seq),
         cursor AS (SELECT * FROM locked UNION ALL SELECT * FROM created)
         SELECT c.applied_seq, n.seq, n.body, n.status, n.reason, n.detail
         FROM cursor c LEFT JOIN LATERAL (
             SELECT i.seq, i.body, i.status, i.reason, i.detail FROM {s}.inbox i
             WHERE i.flow_id = c.flow_id AND i.producer = c.producer
               AND i.seq > greatest(c.applied_seq, $2::bigint)
             ORDER BY i.seq LIMIT $3) AS n ON true
         ORDER BY n.seq",
        &[
            &flow.flow_id.as_str(),
            &moved,
            &take,
            &flow.producer.as_str(),
        ],
    )?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let locked_at: i64 = first.get(0);
    let ahead = rows.iter().filter_map(|row| Ahead::of(row, 1)).collect();
    Ok(Some((locked_at, ahead)))
}

/// The flow's apply cursor (the last applied or skipped seq, 0 if none),
/// its row locked until the transaction ends (waiting for another applier
/// that holds it), so that one applier at a time applies the flow; a flow
/// never applied gets its row (at 0) first.
pub(super) fn lock_cursor(tx: &PgTx, flow: &InboxFlow) -> Result<i64, StoreError> {
    let context = "consumer: cannot lock the apply cursor";
    let key: [&(dyn postgres::types::ToSql + Sync); 2] =
        [&flow.flow_id.as_str(), &flow.producer.as_str()];
    let lock = "SELECT applied_seq FROM {s}.inbox_cursor
        WHERE flow_id = $1 AND producer = $2 FOR UPDATE";
    if let Some(row) = tx.row(context, lock, &key)? {
        return Ok(row.get(0));
    }
    // None: receive creates the row with the flow's first event, so none
    // means nothing stored (or the flow's first event being received right
    // now, which the insert waits for).
    let created = tx.row(
        context,
        "INSERT INTO {s}.inbox_cursor (flow_id, producer, applied_seq) VALUES ($1, $2, 0)
         ON CONFLICT (flow_id, producer) DO NOTHING RETURNING applied_seq",
        &key,
    )?;
    match created {
        Some(row) => Ok(row.get(0)),
        None => Ok(tx.row(context, lock, &key)?.map_or(0, |row| row.get(0))),
    }
}

pub(super) fn write_cursor(tx: &PgTx, flow: &InboxFlow, seq: i64) -> Result<(), StoreError> {
    let applied_seq = seq;
    let moved = tx.run(
        "consumer: cannot move the apply cursor",
        "INSERT INTO {s}.inbox_cursor AS c (flow_id, producer, applied_seq) VALUES ($1, $2, $3)
         ON CONFLICT (flow_id, producer) DO UPDATE SET applied_seq = excluded.applied_seq
         WHERE excluded.applied_seq > c.applied_seq",
        &[
            &flow.flow_id.as_str(),
            &flow.producer.as_str(),
            &applied_seq,
        ],
    )?;
    check_cursors_moved(moved, 1, flow, applied_seq)
}

/// What is stored at the flow's next seq, with its body.
fn next_row(tx: &PgTx, flow: &InboxFlow, next: Seq) -> Result<NextEvent, StoreError> {
    // The flow's first stored row at or after `next`: the next event
    // itself, or one past a gap, or none.
    let row = tx.row(
        CONTEXT,
        "SELECT seq, body, status, reason, detail FROM {s}.inbox
         WHERE flow_id = $1 AND producer = $3 AND seq >= $2
         ORDER BY seq LIMIT 1",
        &[&flow.flow_id.as_str(), &next.get(), &flow.producer.as_str()],
    )?;
    let first = match row {
        Some(row) => Some((
            row.get(0),
            row.get(1),
            inbox_status(row.get(2), row.get(3), row.get(4))?,
        )),
        None => None,
    };
    Ok(NextEvent::at(next, first))
}

/// Marks the event blocked with `reason`, only while it is pending or
/// blocked and inside the apply transaction.
fn mark_blocked(tx: &PgTx, event: &Envelope, reason: &BlockReason) -> Result<(), StoreError> {
    let (flow_id, seq) = (&event.flow_id, event.seq);
    let marked = tx.run(
        CONTEXT,
        "UPDATE {s}.inbox SET status = 'blocked', reason = $3, detail = $4
         WHERE flow_id = $1 AND producer = $5 AND seq = $2 AND status IN ('pending', 'blocked')
           AND current_setting('ordo.apply_tx', true) = 'on'",
        &[
            &flow_id.as_str(),
            &seq.get(),
            &reason.code.as_str(),
            &reason.detail,
            &event.producer.as_str(),
        ],
    )?;
    expect_marked(tx, marked, flow_id, seq, || {
        format!("flow {flow_id} seq {seq} is no longer pending or blocked while it is applied")
    })
}

/// Marks the event applied, by its primary key and only inside the apply
/// transaction; anything else is a damaged inbox or a handler that ended
/// the transaction.
fn mark_applied(tx: &PgTx, event: &Envelope, now_ms: i64) -> Result<(), StoreError> {
    let (flow_id, next, event_id): (&FlowId, Seq, &EventId) =
        (&event.flow_id, event.seq, &event.event_id);
    let marked = tx.run(
        CONTEXT,
        "UPDATE {s}.inbox SET status = 'applied', reason = NULL, detail = NULL, settled_at_ms = $4
         WHERE event_id = $1 AND producer = $5 AND flow_id = $2 AND seq = $3
           AND status IN ('pending', 'blocked')
           AND current_setting('ordo.apply_tx', true) = 'on'",
        &[
            &event_id.as_str(),
            &flow_id.as_str(),
            &next.get(),
            &now_ms,
            &event.producer.as_str(),
        ],
    )?;
    expect_marked(tx, marked, flow_id, next, || {
        format!("the body stored at flow {flow_id} seq {next} names event {event_id}")
    })
}

/// Passes when a mark's UPDATE changed its one row; otherwise fails, as a
/// handler that ended the apply transaction or else as a damaged inbox
/// (`damage` says how).
fn expect_marked(
    tx: &PgTx,
    marked: u64,
    flow_id: &FlowId,
    seq: Seq,
    damage: impl FnOnce() -> String,
) -> Result<(), StoreError> {
    if marked == 1 {
        return Ok(());
    }
    check_still_open(tx, flow_id, seq)?;
    Err(corrupt("consumer: inbox", damage()))
}

/// Fails when the handler ended the apply transaction.
fn check_still_open(tx: &PgTx, flow_id: &FlowId, next: Seq) -> Result<(), StoreError> {
    let open: Option<String> = tx
        .row(
            CONTEXT,
            "SELECT current_setting('ordo.apply_tx', true)",
            &[],
        )?
        .and_then(|row| row.get(0));
    if open.as_deref() == Some("on") {
        return Ok(());
    }
    Err(StoreError::new(
        ErrorKind::Other,
        format!(
            "consumer: the transaction ended while the handler applied flow {flow_id} seq {next}; \
             what the handler committed stands, the event is not marked"
        ),
    ))
}

fn flow_page(
    tx: &PgTx,
    template: &'static str,
    params: crate::conn::Params<'_>,
) -> Result<Vec<InboxFlow>, StoreError> {
    tx.rows("consumer: cannot list flows with work", template, params)?
        .iter()
        .map(|row| stored_flow(row.get(0), row.get(1)))
        .collect()
}

/// The flows on `page` with a pending row, in flow order.
pub(super) fn pending_flows(
    db: &mut PgConsumer,
    page: WorkPage<'_>,
) -> Result<Vec<InboxFlow>, StoreError> {
    let sql = "SELECT DISTINCT flow_id, producer FROM {s}.inbox
        WHERE status = 'pending' AND (flow_id, producer) > ($1, $3)
        ORDER BY flow_id, producer LIMIT $2";
    let (after, after_producer) = page.after;
    flow_page(&db.conn, sql, &[&after, &page.limit_sql(), &after_producer])
}

/// The flows on `page` with a row blocked with one of `codes`, in flow
/// order: one read for all the codes.
pub(super) fn reevaluated_flows(
    db: &mut PgConsumer,
    page: WorkPage<'_>,
    codes: &[BlockCode],
) -> Result<Vec<InboxFlow>, StoreError> {
    let sql = "SELECT DISTINCT flow_id, producer FROM {s}.inbox
        WHERE status = 'blocked' AND reason = ANY ($3) AND (flow_id, producer) > ($1, $4)
        ORDER BY flow_id, producer LIMIT $2";
    let codes: Vec<&str> = codes.iter().map(BlockCode::as_str).collect();
    let (after, after_producer) = page.after;
    let params: crate::conn::Params<'_> = &[&after, &page.limit_sql(), &codes, &after_producer];
    flow_page(&db.conn, sql, params)
}

#[cfg(test)]
mod tests {
    use super::{LOCK_AND_READ_MANY_SQL, MARK_APPLIED_MANY_SQL};
    use crate::plans::{assert_indexed_by_batch, Side};

    /// The cursors and rows of a batch's flows are read by key however many
    /// flows the batch asks for.
    #[test]
    fn a_batch_locks_and_reads_its_flows_by_key_on_many_flows() {
        let sql = LOCK_AND_READ_MANY_SQL;
        assert_indexed_by_batch(Side::Consumer, sql, "text[], bigint, text[]", "", |flows| {
            let producers = format!("array_fill('default'::text, ARRAY[cardinality({flows})])");
            format!("{flows}, 2, {producers}")
        });
    }

    /// A batch's events are marked applied by key however many it applied.
    #[test]
    fn a_batch_marks_its_events_by_key_on_many_events() {
        let types = "text[], text[], bigint[], bigint, text[]";
        assert_indexed_by_batch(
            Side::Consumer,
            MARK_APPLIED_MANY_SQL,
            types,
            "-1",
            |events| {
                let flows = events.replace("-1'", "'");
                let seqs = format!("array_fill(1::bigint, ARRAY[cardinality({events})])");
                let producers =
                    format!("array_fill('default'::text, ARRAY[cardinality({events})])");
                format!("{events}, {flows}, {seqs}, 0, {producers}")
            },
        );
    }
}
