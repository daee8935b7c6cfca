//! Apply on SQLite: the engine of `ordo_core::apply` over one
//! `BEGIN IMMEDIATE` transaction, with a savepoint where it asks for one.

use std::collections::{BTreeMap, VecDeque};

use ordo_core::apply::{ApplyStore, ApplyWriter, NextEvent, NextRows, SettledState};
use ordo_core::store::stored_producer;
use ordo_core::store::{sql_limit, WorkPage};
use ordo_core::{
    BlockCode, BlockReason, Envelope, ErrorKind, FlowId, InboxFlow, InboxStatus, Seq, StoreError,
};
use rusqlite::{params, Connection, OptionalExtension};

use super::schema::{
    inbox_status, read_cursor_error, read_cursor_with, write_cursor_error, write_cursor_with,
    READ_CURSOR, WRITE_CURSOR,
};
use super::ConsumerDb;
use crate::conn::{
    begin_immediate, collect_rows, corrupt, exec_cached, row_cached, sql_error, Held,
};

impl ApplyStore for ConsumerDb {
    type Tx = Connection;
    type Writer<'a> = ApplyTx<'a>;

    /// One `BEGIN IMMEDIATE` transaction: it holds the whole file, so no
    /// other applier holds any flow, and one step reads its cursor as a
    /// batch does.
    fn begin_apply(&mut self, _batch: bool) -> Result<ApplyTx<'_>, StoreError> {
        let conn = &self.conn;
        let tx = begin_immediate(conn, "consumer")?;
        // Read under the write lock, so settle times follow commit order.
        let now_ms = self.clock.now_ms();
        Ok(ApplyTx {
            tx,
            held: Held::new(conn),
            now_ms,
            cursors: BTreeMap::new(),
            ahead: None,
            commits: &mut self.commits,
            store_id: &self.store_id,
        })
    }

    fn commit_apply(writer: ApplyTx<'_>) -> Result<(), StoreError> {
        let ApplyTx {
            tx, held, commits, ..
        } = writer;
        drop(held);
        tx.commit()
            .map_err(|e| sql_error("consumer: apply commit failed", e))?;
        *commits += 1;
        Ok(())
    }

    fn settled_state(&self, flow: &InboxFlow) -> Result<SettledState, StoreError> {
        row_cached(
            &self.conn,
            "WITH c AS (SELECT coalesce((SELECT applied_seq FROM inbox_cursor
                                         WHERE flow_id = ?1 AND producer = ?2), 0) AS at)
             SELECT c.at,
                    (SELECT count(*) FROM inbox WHERE flow_id = ?1 AND producer = ?2 AND seq <= c.at
                       AND status <> 'applied' AND status <> 'skipped'),
                    (SELECT count(*) FROM inbox WHERE flow_id = ?1 AND producer = ?2 AND seq > c.at
                       AND (status = 'applied' OR status = 'skipped'))
             FROM c",
            params![flow.flow_id.as_str(), flow.producer.as_str()],
            |row| {
                Ok(SettledState {
                    cursor: row.get(0)?,
                    unsettled_below: row.get(1)?,
                    settled_above: row.get(2)?,
                })
            },
        )
        .map_err(|e| sql_error("consumer: cannot check an applied flow", e))
    }
}

/// One open apply transaction of a [`ConsumerDb`], as ordo's apply engine
/// writes through it ([`ApplyStore`]); rolled back when dropped
/// uncommitted. The cursors move at its end, after every handler call.
pub struct ApplyTx<'a> {
    tx: rusqlite::Transaction<'a>,
    /// The statements run for each event, prepared once per transaction.
    held: Held<'a>,
    now_ms: i64,
    cursors: BTreeMap<InboxFlow, i64>,
    /// The rows of the flow last read, read ahead.
    ahead: Option<Ahead>,
    commits: &'a mut u64,
    store_id: &'a ordo_core::StoreId,
}

/// The rows of one flow read ahead in one statement: those at and after
/// the seq asked for, in seq order, as many as the batch may still use and
/// one more.
struct Ahead {
    flow: InboxFlow,
    /// The seq the next read of the flow asks for, where these rows go on.
    next: i64,
    rows: VecDeque<AheadRow>,
    /// Whether the read stopped at its limit, so that more rows may follow.
    more: bool,
}

/// One row read ahead: its seq, body and status (the status read in place).
struct AheadRow {
    seq: i64,
    body: String,
    status: Result<InboxStatus, StoreError>,
}

/// The flow's stored rows from `rows.from` on, up to `rows.most`, through
/// the held statement. Nothing else writes the flow's rows while the
/// transaction holds the file; this transaction marks each row only after
/// it was handed out.
fn read_rows(held: &mut Held<'_>, flow: &InboxFlow, rows: NextRows) -> Result<Ahead, StoreError> {
    let limit = sql_limit(usize::try_from(rows.most).unwrap_or(usize::MAX));
    let read: Vec<AheadRow> = held
        .get(
            "SELECT seq, body, status, reason, detail FROM inbox
             WHERE flow_id = ?1 AND producer = ?3 AND seq >= ?2
             ORDER BY seq LIMIT ?4",
        )
        .and_then(|statement| {
            let params = params![
                flow.flow_id.as_str(),
                rows.from.get(),
                flow.producer.as_str(),
                limit
            ];
            statement
                .query_map(params, |row| {
                    let reason = row.get_ref(3)?.as_str_or_null()?;
                    let status = inbox_status(row.get_ref(2)?.as_str()?, reason, row.get(4)?);
                    Ok(AheadRow {
                        seq: row.get(0)?,
                        body: row.get(1)?,
                        status,
                    })
                })?
                .collect()
        })
        .map_err(|e| sql_error("consumer: apply failed", e))?;
    let more = i64::try_from(read.len()).is_ok_and(|n| n >= limit);
    Ok(Ahead {
        flow: flow.clone(),
        next: rows.from.get(),
        rows: read.into(),
        more,
    })
}

impl ApplyTx<'_> {
    /// The flow's apply cursor, through the held statement.
    fn read_cursor(&mut self, flow: &InboxFlow) -> Result<i64, StoreError> {
        let statement = self.held.get(READ_CURSOR).map_err(read_cursor_error)?;
        read_cursor_with(statement, flow)
    }

    fn exec(&self, sql: &str) -> Result<(), StoreError> {
        exec_cached(&self.tx, sql, [])
            .map(drop)
            .map_err(|e| sql_error("consumer: apply failed", e))
    }
}

impl ApplyWriter for ApplyTx<'_> {
    type Tx = Connection;

    fn handler_tx(&self) -> &Connection {
        &self.tx
    }

    fn take_flow(&mut self, flow: &InboxFlow) -> Result<i64, StoreError> {
        self.read_cursor(flow)
    }

    fn open_flow(
        &mut self,
        flows: &[(InboxFlow, Option<u64>)],
        _left: u64,
    ) -> Result<Option<i64>, StoreError> {
        // The write transaction holds the whole file: no other applier can
        // hold the flow. A flow met before in this batch goes on from
        // where it stopped.
        let flow = &flows[0].0;
        match self.cursors.get(flow) {
            Some(&moved) => Ok(Some(moved)),
            None => self.read_cursor(flow).map(Some),
        }
    }

    fn next_event(&mut self, flow: &InboxFlow, rows: NextRows) -> Result<NextEvent, StoreError> {
        let next = rows.from;
        // The rows read ahead go on from here unless another flow was read
        // since, or this one is asked for from elsewhere, or they ran out
        // at the read's limit.
        let read_on = matches!(&self.ahead, Some(a) if a.next == next.get() && &a.flow == flow
            && (!a.rows.is_empty() || !a.more));
        if !read_on {
            self.ahead = Some(read_rows(&mut self.held, flow, rows)?);
        }
        let ahead = self.ahead.as_mut().expect("read above");
        match ahead.rows.front() {
            Some(row) if row.seq == next.get() => {
                let row = ahead.rows.pop_front().expect("a front row");
                ahead.next = next.get() + 1;
                Ok(NextEvent::at(next, Some((row.seq, row.body, row.status?))))
            }
            // A gap: the first stored row is a later one.
            Some(_) => Ok(NextEvent::missing(true)),
            None => Ok(NextEvent::missing(false)),
        }
    }

    fn savepoint(&mut self) -> Result<(), StoreError> {
        self.exec("SAVEPOINT ordo_apply_event")
    }

    fn release_savepoint(&mut self) -> Result<(), StoreError> {
        self.exec("RELEASE ordo_apply_event")
    }

    fn rollback_savepoint(&mut self) -> Result<(), StoreError> {
        self.exec("ROLLBACK TO ordo_apply_event")?;
        self.exec("RELEASE ordo_apply_event")
    }

    fn after_handler(&self, flow_id: &FlowId, seq: Seq) -> Result<(), StoreError> {
        self.check_open(flow_id, seq)
    }

    fn check_open(&self, flow_id: &FlowId, seq: Seq) -> Result<(), StoreError> {
        if self.tx.is_autocommit() {
            return Err(ended_under_handler(flow_id, seq));
        }
        Ok(())
    }

    fn mark_applied(&mut self, event: &Envelope) -> Result<(), StoreError> {
        mark_applied(&mut self.held, event, self.now_ms)
    }

    fn mark_blocked(&mut self, event: &Envelope, reason: &BlockReason) -> Result<(), StoreError> {
        let (flow_id, seq) = (&event.flow_id, event.seq);
        let marked = exec_cached(
            &self.tx,
            "UPDATE inbox SET status = 'blocked', reason = ?3, detail = ?4
             WHERE flow_id = ?1 AND producer = ?5 AND seq = ?2
               AND (status = 'pending' OR status = 'blocked')",
            params![
                flow_id.as_str(),
                seq.get(),
                reason.code.as_str(),
                reason.detail,
                event.producer.as_str(),
            ],
        )
        .map_err(|e| sql_error("consumer: apply failed", e))?;
        if marked != 1 {
            return Err(settled_under_apply(flow_id, seq));
        }
        Ok(())
    }

    fn close_flow(&mut self, flow: &InboxFlow, applied_seq: i64) -> Result<(), StoreError> {
        let before = self.cursors.insert(flow.clone(), applied_seq);
        assert!(
            before.is_none_or(|seq| seq < applied_seq),
            "a cursor moves forward"
        );
        Ok(())
    }

    fn finish(&mut self) -> Result<(), StoreError> {
        for (flow, applied_seq) in std::mem::take(&mut self.cursors) {
            let statement = self.held.get(WRITE_CURSOR).map_err(write_cursor_error)?;
            write_cursor_with(statement, &flow, applied_seq)?;
        }
        Ok(())
    }

    fn store_id(&self) -> &ordo_core::StoreId {
        self.store_id
    }

    fn record_intents(&mut self, intents: &[ordo_core::effect::Intent]) -> Result<(), StoreError> {
        super::effects::insert_intents(&self.tx, intents, self.now_ms)
    }
}

/// SQLite ended the transaction under the handler (an `ON CONFLICT
/// ROLLBACK` constraint, a full disk) and the handler went on: nothing
/// written since BEGIN stands, so nothing after it may be.
fn ended_under_handler(flow_id: &FlowId, seq: Seq) -> StoreError {
    StoreError::new(
        ErrorKind::Other,
        format!(
            "consumer: the transaction ended while the handler applied flow {flow_id} seq {seq}; nothing was applied"
        ),
    )
}

/// The row being applied was settled (or removed) by something other than
/// this apply inside its own transaction: nothing of it may be marked.
fn settled_under_apply(flow_id: &FlowId, seq: Seq) -> StoreError {
    corrupt(
        "consumer: inbox",
        format!("flow {flow_id} seq {seq} is no longer pending or blocked while it is applied"),
    )
}

/// Marks the row at `flow_id`, `seq` applied by the inbox's primary key,
/// only while it is pending or blocked: the row's event id is its body's
/// `event_id`, and a row settled already is never marked again (anything
/// else is a corrupt file or a handler that wrote ordo's tables).
fn mark_applied(held: &mut Held<'_>, event: &Envelope, now_ms: i64) -> Result<(), StoreError> {
    let (flow_id, seq, event_id) = (&event.flow_id, event.seq, &event.event_id);
    let marked = held
        .get(
            "UPDATE inbox SET status = 'applied', reason = NULL, detail = NULL, settled_at_ms = ?4
             WHERE producer = ?5 AND event_id = ?1 AND flow_id = ?2 AND seq = ?3
               AND (status = 'pending' OR status = 'blocked')",
        )
        .and_then(|statement| {
            statement.execute(params![
                event_id.as_str(),
                flow_id.as_str(),
                seq.get(),
                now_ms,
                event.producer.as_str()
            ])
        })
        .map_err(|e| sql_error("consumer: apply failed", e))?;
    if marked == 1 {
        return Ok(());
    }
    let stored: Option<String> = row_cached(
        held.conn(),
        "SELECT event_id FROM inbox WHERE flow_id = ?1 AND producer = ?3 AND seq = ?2",
        params![flow_id.as_str(), seq.get(), event.producer.as_str()],
        |row| row.get(0),
    )
    .optional()
    .map_err(|e| sql_error("consumer: apply failed", e))?;
    if stored.as_deref() == Some(event_id.as_str()) {
        return Err(settled_under_apply(flow_id, seq));
    }
    Err(corrupt(
        "consumer: inbox",
        format!("the body stored at flow {flow_id} seq {seq} names event {event_id}"),
    ))
}

/// The flows `sql` lists with `params`, as `(flow_id, producer)` rows.
fn flow_page<P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
) -> Result<Vec<InboxFlow>, StoreError> {
    collect_rows(
        conn,
        "consumer: cannot list flows with work",
        sql,
        params,
        |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)),
        |(id, producer)| {
            let flow_id = FlowId::new(id).map_err(|e| corrupt("consumer: stored flow id", e))?;
            Ok(InboxFlow::new(stored_producer(&producer)?, flow_id))
        },
    )
}

/// The flows on `page` with a pending row: a walk of the pending partial
/// index from `after` that stops at the page's limit, so a page costs
/// O(limit) however many flows have work.
pub(super) fn pending_flows(
    db: &mut ConsumerDb,
    page: WorkPage<'_>,
) -> Result<Vec<InboxFlow>, StoreError> {
    let sql = "SELECT DISTINCT flow_id, producer FROM inbox
        WHERE status = 'pending' AND (flow_id, producer) > (?1, ?2)
        ORDER BY flow_id, producer LIMIT ?3";
    let (flow_id, producer) = page.after;
    flow_page(&db.conn, sql, params![flow_id, producer, page.limit_sql()])
}

/// The flows on `page` with a row blocked with one of `codes`: one walk of
/// the blocked rows' index per code.
pub(super) fn reevaluated_flows(
    db: &mut ConsumerDb,
    page: WorkPage<'_>,
    codes: &[BlockCode],
) -> Result<Vec<InboxFlow>, StoreError> {
    let sql = "SELECT DISTINCT flow_id, producer FROM inbox
        WHERE status = 'blocked' AND reason = ?4 AND (flow_id, producer) > (?1, ?2)
        ORDER BY flow_id, producer LIMIT ?3";
    let (flow_id, producer) = page.after;
    let mut flows = Vec::new();
    for code in codes {
        let params = params![flow_id, producer, page.limit_sql(), code.as_str()];
        flows.extend(flow_page(&db.conn, sql, params)?);
    }
    flows.sort_unstable();
    flows.dedup();
    flows.truncate(page.limit);
    Ok(flows)
}

#[cfg(test)]
mod tests {
    use ordo_core::{
        ApplyContext, ApplyHandler, ConsumerStore, Envelope, Receive, SchemaVersion, Verdict,
    };

    use super::*;
    use crate::Schema;

    /// Marks the flow's seq 2 applied while it applies seq 1: the writes a
    /// handler must never make.
    struct WritesOrdoTables;

    impl ApplyHandler<Connection> for WritesOrdoTables {
        fn apply(
            &mut self,
            cx: &mut ApplyContext<'_, Connection>,
            _event: &Envelope,
        ) -> Result<Verdict, StoreError> {
            cx.tx()
                .execute("UPDATE inbox SET status = 'applied' WHERE seq = 2", [])
                .unwrap();
            Ok(Verdict::Apply)
        }
    }

    /// What `next_event` answers for `from`, `most`: the seq of the row
    /// handed out, or `Err(later_stored)` for none.
    fn next(tx: &mut ApplyTx<'_>, flow: &InboxFlow, from: i64, most: u64) -> Result<i64, bool> {
        let rows = NextRows {
            from: Seq::new(from).unwrap(),
            most,
        };
        let found = tx.next_event(flow, rows).unwrap();
        match (found.row, found.body) {
            (ordo_core::store::NextRow::Stored(InboxStatus::Pending), Some(body)) => {
                let stored = crate::producer::stored_envelope("test", &body).unwrap();
                assert_eq!(stored.seq.get(), from);
                Ok(from)
            }
            (ordo_core::store::NextRow::Missing { later_stored }, None) => Err(later_stored),
            other => panic!("{other:?}"),
        }
    }

    /// A new consumer file in `dir`, and the events of flow `f` at seqs 1
    /// to `seqs`.
    fn consumer_and_events(dir: &tempfile::TempDir, seqs: i64) -> (ConsumerDb, Vec<Envelope>) {
        let schema = Schema::new("app").unwrap();
        let db = ConsumerDb::open(dir.path().join("consumer.db"), &schema).unwrap();
        let flow = FlowId::new("f".to_string()).unwrap();
        let v1 = SchemaVersion::new(1).unwrap();
        let events: Vec<Envelope> = (0..seqs)
            .map(|last| {
                ordo_core::append::next_event(&flow, last, "placed", v1, &serde_json::json!({}))
            })
            .collect::<Result<_, _>>()
            .unwrap();
        (db, events)
    }

    #[test]
    fn rows_read_ahead_are_handed_out_in_order_and_read_on_past_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let (mut db, events) = consumer_and_events(&dir, 6);
        let flow = events[0].flow_id.clone();
        // Seqs 1 to 4 and 6: a gap at 5.
        let stored: Vec<Envelope> = events.into_iter().filter(|e| e.seq.get() != 5).collect();
        db.receive_batch(&stored).unwrap();
        let f = InboxFlow::of_default(flow.clone());
        let other = InboxFlow::of_default(FlowId::new("g".to_string()).unwrap());
        let mut tx = db.begin_apply(true).unwrap();
        // Two rows read; the second handed out from them.
        assert_eq!(next(&mut tx, &f, 1, 2), Ok(1));
        assert_eq!(tx.ahead.as_ref().unwrap().rows.len(), 1);
        assert_eq!(next(&mut tx, &f, 2, 1), Ok(2));
        // Those read ran out at the limit: read on.
        assert_eq!(next(&mut tx, &f, 3, 3), Ok(3));
        assert_eq!(next(&mut tx, &f, 4, 2), Ok(4));
        // The gap, then the flow asked for again from an earlier seq.
        assert_eq!(next(&mut tx, &f, 5, 2), Err(true));
        assert_eq!(next(&mut tx, &f, 2, 1), Ok(2));
        // Another flow read in between: the first is read again.
        assert_eq!(next(&mut tx, &other, 1, 5), Err(false));
        assert_eq!(next(&mut tx, &f, 3, 1), Ok(3));
        // Past the last row read, with nothing more stored.
        assert_eq!(next(&mut tx, &f, 6, 5), Ok(6));
        assert_eq!(next(&mut tx, &f, 7, 5), Err(false));
        assert!(!tx.ahead.as_ref().unwrap().more);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "rows unsettled at or below it, settled above it")]
    fn a_row_settled_above_the_cursor_fails_the_check_after_commit() {
        let dir = tempfile::tempdir().unwrap();
        let (mut db, events) = consumer_and_events(&dir, 2);
        db.receive_batch(&events).unwrap();
        let inbox_flow = ordo_core::InboxFlow::of_default(events[0].flow_id.clone());
        let _ = db.apply_next_with(&inbox_flow, &mut WritesOrdoTables);
    }
}
