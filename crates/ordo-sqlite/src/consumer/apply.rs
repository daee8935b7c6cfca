//! Apply: the flow's next event through the application's handler, alone
//! or in batches across flows, strictly in order per flow.

use ordo_core::crash;
use ordo_core::store::{plan_apply, ApplyPlan, NextRow};
use ordo_core::{
    apply_in_order, ApplyHandler, BlockCode, Drain, DrainStop, Envelope, ErrorKind, EventId,
    FlowId, InboxStatus, Seq, Step, StoreError, Verdict,
};
use rusqlite::{params, Connection, OptionalExtension};

use super::schema::{begin_write, inbox_status, read_cursor, write_cursor};
use super::ConsumerDb;
use crate::conn::{collect_rows, corrupt, exec_cached, row_cached, sql_error};
use crate::producer::stored_envelope;

/// Applies the flow's next event through `handler`. Looks only at
/// `(flow_id, applied_seq + 1)`: never skips a gap, never passes a blocked
/// event.
pub(super) fn apply_next<H>(
    db: &mut ConsumerDb,
    flow_id: &FlowId,
    handler: &mut H,
) -> Result<Step, StoreError>
where
    H: ApplyHandler<Connection> + ?Sized,
{
    let mut tx = begin_write(&mut db.conn)?;
    let now_ms = db.clock.now_ms();
    let applied_seq = read_cursor(&tx, flow_id)?;
    let (step, wrote) = step_in_tx(
        &mut tx,
        flow_id,
        applied_seq,
        handler,
        now_ms,
        Guard::Savepoint,
        None,
    )?
    .expect("a guarded step always ends");
    if let Step::Applied { seq } = step {
        write_cursor(&tx, flow_id, seq.get())?;
    }
    if wrote {
        tx.commit()
            .map_err(|e| sql_error("consumer: apply commit failed", e))?;
        db.commits += 1;
        if matches!(step, Step::Applied { .. }) {
            crash::point(crash::CONSUMER_APPLY_AFTER_COMMIT);
        }
    }
    Ok(step)
}

/// Drains the given flows, in order, each up to its own limit, in ONE
/// transaction applying at most `events_max` events in all. Each event's
/// handler writes and inbox mark commit together with the rest of the
/// batch, still strictly in order per flow. Returns one drain per
/// visited flow; when `events_max` runs out, the flow in progress stops
/// with `limit` and the flows after it are not visited.
///
/// The batch first runs without a savepoint around each event, handing the
/// events it is about to apply to the handler in one call
/// ([`ApplyHandler::apply_all`]). When one blocks, what the handler wrote
/// for it cannot be told apart from the rest of the batch, so the whole
/// transaction is rolled back and the batch runs again, event by event,
/// with a savepoint around each; blocks are rare, and a handler must
/// already expect a call whose writes never commit.
pub(super) fn apply_batch<H>(
    db: &mut ConsumerDb,
    flows: &[(FlowId, Option<u64>)],
    events_max: u64,
    handler: &mut H,
) -> Result<Vec<Drain>, StoreError>
where
    H: ApplyHandler<Connection> + ?Sized,
{
    if let Some(drains) = apply_batch_once(db, flows, events_max, handler, Guard::None)? {
        return Ok(drains);
    }
    Ok(
        apply_batch_once(db, flows, events_max, handler, Guard::Savepoint)?
            .expect("a guarded batch runs to its end"),
    )
}

/// One run of [`apply_batch`]; `None` when an event blocked under
/// [`Guard::None`] (the transaction is rolled back).
fn apply_batch_once<H>(
    db: &mut ConsumerDb,
    flows: &[(FlowId, Option<u64>)],
    events_max: u64,
    handler: &mut H,
    guard: Guard,
) -> Result<Option<Vec<Drain>>, StoreError>
where
    H: ApplyHandler<Connection> + ?Sized,
{
    let mut tx = begin_write(&mut db.conn)?;
    let now_ms = db.clock.now_ms();
    let mut drains = Vec::new();
    let mut total = 0u64;
    let mut wrote_any = false;
    // Under `Guard::None`, the events for one `apply_all` call.
    let mut deferred = Vec::new();
    for (flow_id, limit) in flows {
        // The cursor is read once per flow and written once after its
        // run, in the same transaction as every event of the run.
        let mut applied_seq = read_cursor(&tx, flow_id)?;
        let mut applied = 0u64;
        let stop = loop {
            if total >= events_max || limit.is_some_and(|limit| applied >= limit) {
                break DrainStop::Limit;
            }
            let defer = (guard == Guard::None).then_some(&mut deferred);
            let Some((step, wrote)) =
                step_in_tx(&mut tx, flow_id, applied_seq, handler, now_ms, guard, defer)?
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
        let limit_hit = stop == DrainStop::Limit;
        drains.push(Drain {
            flow_id: flow_id.clone(),
            applied,
            stop,
        });
        if total >= events_max && limit_hit {
            break;
        }
    }
    if !flush(&tx, handler, &mut deferred)? {
        return Ok(None);
    }
    if wrote_any {
        tx.commit()
            .map_err(|e| sql_error("consumer: apply commit failed", e))?;
        db.commits += 1;
        if total > 0 {
            crash::point(crash::CONSUMER_APPLY_AFTER_COMMIT);
        }
    }
    Ok(Some(drains))
}

/// The flow ids `sql` lists with `params`.
fn flow_page<P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
) -> Result<Vec<FlowId>, StoreError> {
    collect_rows(
        conn,
        "consumer: cannot list flows with work",
        sql,
        params,
        |row| row.get::<_, String>(0),
        |id| FlowId::new(id).map_err(|e| corrupt("consumer: stored flow id", e)),
    )
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

/// Hands the `deferred` events to the handler in one call; false when one
/// of them blocked (the caller rolls the transaction back).
fn flush<H>(
    tx: &Connection,
    handler: &mut H,
    deferred: &mut Vec<Envelope>,
) -> Result<bool, StoreError>
where
    H: ApplyHandler<Connection> + ?Sized,
{
    let events = std::mem::take(deferred);
    // Stopping as soon as the transaction has ended.
    let verdict = apply_in_order(handler, tx, &events, |event| {
        if tx.is_autocommit() {
            return Err(ended_under_handler(&event.flow_id, event.seq));
        }
        Ok(())
    })?;
    Ok(verdict == Verdict::Apply)
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

/// One apply step of `flow_id`, whose cursor is at `applied_seq`, inside
/// `tx`. Returns the step and whether it wrote anything (an application or a
/// new block); the caller moves the cursor when the step applied, in the
/// same transaction. Returns `None` when the event blocked under
/// [`Guard::None`]: the handler may have written, so the caller must roll
/// the transaction back. With `deferred`, an event to apply that needs no
/// savepoint is marked and added there instead of handed to the handler,
/// and the events there go to the handler before any other.
#[allow(clippy::too_many_arguments)]
fn step_in_tx<H>(
    tx: &mut rusqlite::Transaction<'_>,
    flow_id: &FlowId,
    applied_seq: i64,
    handler: &mut H,
    now_ms: i64,
    guard: Guard,
    deferred: Option<&mut Vec<Envelope>>,
) -> Result<Option<(Step, bool)>, StoreError>
where
    H: ApplyHandler<Connection> + ?Sized,
{
    let err = |e| sql_error("consumer: apply failed", e);
    let Some(next) = Seq::after(applied_seq) else {
        return Ok(Some((Step::Idle, false)));
    };
    // The flow's first stored row at or after `next`: the next event itself,
    // or one past a gap, or none.
    #[allow(clippy::type_complexity)]
    let row: Option<(i64, String, String, Option<String>, Option<String>)> = row_cached(
        tx,
        "SELECT seq, body, status, reason, detail FROM inbox WHERE flow_id = ?1 AND seq >= ?2
         ORDER BY seq LIMIT 1",
        params![flow_id.as_str(), next.get()],
        |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
            ))
        },
    )
    .optional()
    .map_err(err)?;
    let (next_row, body) = match row {
        Some((seq, body, status, reason, detail)) if seq == next.get() => (
            NextRow::Stored(inbox_status(&status, reason.as_deref(), detail)?),
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
    let body = match plan_apply(next_row.clone(), handler.reevaluate()) {
        ApplyPlan::Report(kind) => return Ok(Some((kind.into_step(next), false))),
        ApplyPlan::Evaluate => body.expect("an evaluated row is stored"),
    };
    let event = stored_envelope("consumer: stored inbox body", &body)?;
    // Guarded, the handler's writes sit in a savepoint: a block undoes them.
    // An error undoes the whole transaction (the caller drops it).
    // A row already blocked is being evaluated again (the handler asked for
    // its code), and is likely to block again: it always gets its savepoint, so a block
    // that stays does not throw the whole batch away at every pass.
    let guarded =
        guard == Guard::Savepoint || matches!(next_row, NextRow::Stored(InboxStatus::Blocked(_)));
    if let Some(deferred) = deferred {
        if !guarded {
            // Applied with the rest of the batch, or not at all.
            mark_applied(tx, flow_id, next, &event.event_id, now_ms)?;
            deferred.push(event);
            return Ok(Some((Step::Applied { seq: next }, true)));
        }
        // The handler sees the events in the batch's order.
        if !flush(tx, handler, deferred)? {
            return Ok(None);
        }
    }
    if guarded {
        exec_cached(tx, "SAVEPOINT ordo_apply_event", []).map_err(err)?;
    }
    let verdict = handler.apply(tx, &event)?;
    if tx.is_autocommit() {
        return Err(ended_under_handler(flow_id, next));
    }
    match verdict {
        Verdict::Apply => {
            if guarded {
                exec_cached(tx, "RELEASE ordo_apply_event", []).map_err(err)?;
            }
            mark_applied(tx, flow_id, next, &event.event_id, now_ms)?;
            Ok(Some((Step::Applied { seq: next }, true)))
        }
        Verdict::Block(_) if !guarded => Ok(None),
        Verdict::Block(reason) => {
            exec_cached(tx, "ROLLBACK TO ordo_apply_event", []).map_err(err)?;
            exec_cached(tx, "RELEASE ordo_apply_event", []).map_err(err)?;
            let reason = reason.normalized();
            if next_row == NextRow::Stored(InboxStatus::Blocked(reason.clone())) {
                // Evaluated again and blocked for the same reason: nothing
                // to write.
                return Ok(Some((Step::Blocked { seq: next, reason }, false)));
            }
            exec_cached(
                tx,
                "UPDATE inbox SET status = 'blocked', reason = ?3, detail = ?4
                 WHERE flow_id = ?1 AND seq = ?2",
                params![
                    flow_id.as_str(),
                    next.get(),
                    reason.code.as_str(),
                    reason.detail
                ],
            )
            .map_err(err)?;
            Ok(Some((Step::Blocked { seq: next, reason }, true)))
        }
    }
}

/// Marks the row at `flow_id`, `seq` applied by the inbox's primary key:
/// the row's event id is its body's `event_id` (anything else is a corrupt
/// file).
fn mark_applied(
    tx: &Connection,
    flow_id: &FlowId,
    seq: Seq,
    event_id: &EventId,
    now_ms: i64,
) -> Result<(), StoreError> {
    let marked = exec_cached(
        tx,
        "UPDATE inbox SET status = 'applied', reason = NULL, detail = NULL, settled_at_ms = ?4
         WHERE event_id = ?1 AND flow_id = ?2 AND seq = ?3",
        params![event_id.as_str(), flow_id.as_str(), seq.get(), now_ms],
    )
    .map_err(|e| sql_error("consumer: apply failed", e))?;
    if marked != 1 {
        return Err(corrupt(
            "consumer: inbox",
            format!("the body stored at flow {flow_id} seq {seq} names event {event_id}"),
        ));
    }
    Ok(())
}

/// Up to `limit` flows with work after `after` (see
/// [`ConsumerStore::flows_with_work`](ordo_core::ConsumerStore::flows_with_work)).
pub(super) fn flows_with_work_page(
    db: &mut ConsumerDb,
    after: Option<&FlowId>,
    limit: usize,
    reevaluate: &[BlockCode],
) -> Result<Vec<FlowId>, StoreError> {
    let after = after.map(FlowId::as_str).unwrap_or("");
    // Each list walks its own partial index from `after` and stops at
    // `limit`, so a page costs O(limit) however many flows have work.
    let limit_sql = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut flows = flow_page(
        &db.conn,
        "SELECT DISTINCT flow_id FROM inbox WHERE status = 'pending' AND flow_id > ?1
             ORDER BY flow_id LIMIT ?2",
        params![after, limit_sql],
    )?;
    for code in reevaluate {
        flows.extend(flow_page(
            &db.conn,
            "SELECT DISTINCT flow_id FROM inbox
             WHERE status = 'blocked' AND reason = ?3 AND flow_id > ?1
             ORDER BY flow_id LIMIT ?2",
            params![after, limit_sql, code.as_str()],
        )?);
    }
    if !reevaluate.is_empty() {
        flows.sort_unstable();
        flows.dedup();
        flows.truncate(limit);
    }
    Ok(flows)
}

/// Every flow with work, ordered by flow id.
pub(super) fn flows_with_work(
    db: &mut ConsumerDb,
    reevaluate: &[BlockCode],
) -> Result<Vec<FlowId>, StoreError> {
    let mut all = Vec::new();
    let mut after: Option<FlowId> = None;
    loop {
        let page = flows_with_work_page(db, after.as_ref(), FLOWS_PAGE_LEN, reevaluate)?;
        let Some(last) = page.last().cloned() else {
            return Ok(all);
        };
        all.extend(page);
        after = Some(last);
    }
}

/// How many flows one page lists.
const FLOWS_PAGE_LEN: usize = 1_024;
