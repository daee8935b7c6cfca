//! The apply engine: one flow's next event through the application's
//! handler, alone or in batches across flows, strictly in order per flow.
//!
//! The engine decides; a backend stores. Everything the protocol says about
//! a step (what a gap, an idle flow, a held block, an event evaluated
//! again, an applied or newly blocked event is, when a savepoint guards the
//! handler and when a batch must run again) lives here once. A backend
//! implements [`ApplyWriter`] for one open apply transaction: it reads a
//! flow's cursor and rows, sets savepoints and writes the marks, in its own
//! SQL and with its own batching.
//!
//! Invariant: the engine performs no I/O of its own and knows no backend:
//! it sees only what [`ApplyWriter`] reads and writes, and the handler.

use crate::effect::Intent;
use crate::envelope::Envelope;
use crate::error::StoreError;
use crate::handler::{apply_in_order, ApplyContext, ApplyHandler, Verdict};
use crate::identity::StoreId;
use crate::ids::{BlockCode, FlowId, InboxFlow, Seq};
use crate::outcome::{BlockReason, Drain, DrainStop, InboxStatus, Step};
use crate::store::{plan_apply, ApplyPlan, NextRow};

/// What is stored at a flow's next seq, with the body of the row there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextEvent {
    /// The row's state at the next seq.
    pub row: NextRow,
    /// The stored body, when a row is there.
    pub body: Option<String>,
}

impl NextEvent {
    /// What is stored at `next`, given the flow's first stored row at or
    /// after it (its seq, body and status), or none.
    pub fn at(next: Seq, first: Option<(i64, String, InboxStatus)>) -> NextEvent {
        match first {
            Some((seq, body, status)) if seq == next.get() => NextEvent {
                row: NextRow::Stored(status),
                body: Some(body),
            },
            Some(_) => NextEvent::missing(true),
            None => NextEvent::missing(false),
        }
    }

    /// Nothing at the next seq; `later_stored` when a later seq is.
    pub fn missing(later_stored: bool) -> NextEvent {
        NextEvent {
            row: NextRow::Missing { later_stored },
            body: None,
        }
    }
}

/// How a step keeps a blocked event's handler writes apart from the rest of
/// its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Nothing: the events to apply go to the handler in one call at the
    /// batch's end, and a block leaves the transaction for the caller to
    /// roll back and run again under [`Guard::Savepoint`].
    None,
    /// A savepoint around each handler call, rolled back on a block.
    Savepoint,
}

/// The rows of one flow the engine asks a backend for: the one at `from`
/// first, and up to `most` rows from there for a backend that reads ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextRows {
    /// The seq after the flow's applied seq.
    pub from: Seq,
    /// How many rows from `from` the batch may still use (at least 1).
    pub most: u64,
}

/// One open apply transaction of a backend, as the engine uses it.
///
/// A backend reads and writes only through its own transaction; every
/// method either does what it says in that transaction or returns the
/// error, and the caller then drops the whole transaction.
pub trait ApplyWriter {
    /// The transaction type the handler writes through.
    type Tx: ?Sized;

    /// The transaction the handler is handed.
    fn handler_tx(&self) -> &Self::Tx;

    /// Takes the flow `flows[0]` for this transaction and returns its
    /// applied seq, or `None` when another applier holds it (the flow is
    /// then reported idle). `flows` are the batch's flows from this one on
    /// and `left` the events the batch may still apply, for a backend that
    /// reads ahead.
    fn open_flow(
        &mut self,
        flows: &[(InboxFlow, Option<u64>)],
        left: u64,
    ) -> Result<Option<i64>, StoreError>;

    /// What is stored at `flow`'s seq `rows.from` (the one after its
    /// applied seq); `rows.most` is how many of its rows from there the
    /// batch may still use.
    fn next_event(&mut self, flow: &InboxFlow, rows: NextRows) -> Result<NextEvent, StoreError>;

    /// Takes `flow` for this transaction's one step, waiting for
    /// another applier that holds it, and returns its applied seq.
    fn take_flow(&mut self, flow: &InboxFlow) -> Result<i64, StoreError>;

    /// Sets the savepoint that guards one handler call.
    fn savepoint(&mut self) -> Result<(), StoreError>;

    /// Keeps what the handler wrote since [`ApplyWriter::savepoint`].
    fn release_savepoint(&mut self) -> Result<(), StoreError>;

    /// Undoes what the handler wrote since [`ApplyWriter::savepoint`].
    fn rollback_savepoint(&mut self) -> Result<(), StoreError>;

    /// Runs after every handler call: fails where the backend can tell
    /// cheaply that the handler ended the transaction (a backend whose
    /// marks themselves refuse to write outside it may do nothing).
    fn after_handler(&self, flow_id: &FlowId, seq: Seq) -> Result<(), StoreError>;

    /// Fails when the handler ended the transaction; the last word before a
    /// batch is given up on.
    fn check_open(&self, flow_id: &FlowId, seq: Seq) -> Result<(), StoreError>;

    /// Marks the stored `event` (its row at its flow and seq) applied, now
    /// or in [`ApplyWriter::finish`]; called only after the handler has
    /// applied it, and only a row still pending or blocked may be marked.
    fn mark_applied(&mut self, event: &Envelope) -> Result<(), StoreError>;

    /// Marks the stored `event` blocked with `reason`; only a row still
    /// pending or blocked may be marked.
    fn mark_blocked(&mut self, event: &Envelope, reason: &BlockReason) -> Result<(), StoreError>;

    /// Moves the flow's cursor forward to `applied_seq`, now or in
    /// [`ApplyWriter::finish`] (called only when the flow applied an event
    /// in this transaction; the handler may not have run for all of them
    /// yet). A cursor never stays or moves back.
    fn close_flow(&mut self, flow: &InboxFlow, applied_seq: i64) -> Result<(), StoreError>;

    /// Writes what was kept for the end, after every handler call of the
    /// transaction.
    fn finish(&mut self) -> Result<(), StoreError>;

    /// The consumer store's identity: the first part of every effect key.
    fn store_id(&self) -> &StoreId;

    /// Writes the effect intents the handler recorded for events it
    /// applied in this transaction, each `pending` and due now; called
    /// only for events that are marked applied in it.
    fn record_intents(&mut self, intents: &[Intent]) -> Result<(), StoreError>;
}

/// A backend's consumer store as the drivers [`next_in`] and [`batch_in`]
/// run its apply transactions: it begins one, commits it, and checks a
/// flow after a commit. A writer dropped uncommitted rolls its
/// transaction back.
pub trait ApplyStore {
    /// The transaction type the handler writes through.
    type Tx: ?Sized;

    /// One open apply transaction.
    type Writer<'a>: ApplyWriter<Tx = Self::Tx>
    where
        Self: 'a;

    /// Begins an apply transaction: for one flow's step, or (`batch`) for
    /// a batch across flows.
    fn begin_apply(&mut self, batch: bool) -> Result<Self::Writer<'_>, StoreError>;

    /// Commits the transaction of `writer`.
    fn commit_apply(writer: Self::Writer<'_>) -> Result<(), StoreError>;

    /// The flow's cursor and how many of its stored rows break the rule
    /// that every row at or below it is settled (applied or skipped) and
    /// none above it is: read after a commit that applied an event of the
    /// flow, in debug builds.
    fn settled_state(&self, flow: &InboxFlow) -> Result<SettledState, StoreError>;
}

/// A flow's rows measured against its cursor (see
/// [`ApplyStore::settled_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettledState {
    /// The flow's apply cursor.
    pub cursor: i64,
    /// Rows at or below the cursor neither applied nor skipped.
    pub unsettled_below: i64,
    /// Rows above the cursor applied or skipped.
    pub settled_above: i64,
}

/// Panics unless `flow` is settled up to its cursor and nothing above
/// it is: the store broke the protocol.
fn check_settled<S: ApplyStore + ?Sized>(store: &S, flow: &InboxFlow) -> Result<(), StoreError> {
    let state = store.settled_state(flow)?;
    assert_eq!(
        (state.unsettled_below, state.settled_above),
        (0, 0),
        "flow {flow} at cursor {}: rows unsettled at or below it, settled above it",
        state.cursor
    );
    Ok(())
}

/// [`ConsumerStore::apply_next_with`](crate::ConsumerStore::apply_next_with)
/// on every backend: one transaction, committed when the step wrote
/// anything.
pub fn next_in<S, H>(store: &mut S, flow: &InboxFlow, handler: &mut H) -> Result<Step, StoreError>
where
    S: ApplyStore + ?Sized,
    H: ApplyHandler<S::Tx> + ?Sized,
{
    let step = {
        let mut writer = store.begin_apply(false)?;
        let applied_seq = writer.take_flow(flow)?;
        let (step, wrote) = apply_next(&mut writer, flow, applied_seq, handler)?;
        if wrote {
            S::commit_apply(writer)?;
        }
        step
    };
    let applied = matches!(step, Step::Applied { .. }).then_some(flow);
    after_commit(applied, |f| check_settled(store, f))?;
    Ok(step)
}

/// [`ConsumerStore::apply_batch_with`](crate::ConsumerStore::apply_batch_with)
/// on every backend: the batch in ONE transaction, first without a
/// savepoint per event, handing the events it is about to apply to the
/// handler in one call ([`ApplyHandler::apply_all`]). When one blocks,
/// what the handler wrote for it cannot be told apart from the rest, so
/// the transaction is rolled back and the batch runs again, event by
/// event, with a savepoint around each ([`under_guards`]); blocks are
/// rare, and a handler must already expect a call whose writes never
/// commit.
pub fn batch_in<S, H>(
    store: &mut S,
    flows: &[(InboxFlow, Option<u64>)],
    events_max: u64,
    handler: &mut H,
) -> Result<Vec<Drain>, StoreError>
where
    S: ApplyStore + ?Sized,
    H: ApplyHandler<S::Tx> + ?Sized,
{
    under_guards(|guard| {
        let drains = {
            let mut writer = store.begin_apply(true)?;
            let Some(run) = run_batch(&mut writer, flows, events_max, handler, guard)? else {
                return Ok(None);
            };
            if run.wrote {
                S::commit_apply(writer)?;
            }
            run.drains
        };
        let applied = drains.iter().filter(|d| d.applied > 0);
        after_commit(applied.map(|d| &d.flow), |f| check_settled(store, f))?;
        Ok(Some(drains))
    })
}

/// A step and whether it wrote anything (an application or a new block).
pub type Stepped = (Step, bool);

/// The events a batch has yet to hand to the handler in one call, in the
/// batch's order (under [`Guard::None`]).
pub type Deferred = Vec<Envelope>;

/// One apply step of `flow` at `next`, where `found` is what is stored
/// there. Returns `None` when the event blocked under [`Guard::None`]: the
/// handler may have written, so the caller must roll the transaction back.
/// With `deferred`, an event that needs no savepoint is kept there instead
/// of handed to the handler, and those kept go to the handler (and are
/// marked) before any other.
pub fn step<W, H>(
    w: &mut W,
    flow: &InboxFlow,
    next: Seq,
    found: NextEvent,
    handler: &mut H,
    guard: Guard,
    deferred: Option<&mut Deferred>,
) -> Result<Option<Stepped>, StoreError>
where
    W: ApplyWriter + ?Sized,
    H: ApplyHandler<W::Tx> + ?Sized,
{
    let event = match evaluated(flow, next, &found, handler.reevaluate())? {
        Ok(event) => event,
        Err(report) => return Ok(Some((report, false))),
    };
    // A row blocked before is being evaluated again (the handler asked for
    // its code) and is likely to block again: it always gets its savepoint,
    // so a block that stays does not throw a whole batch away at every pass.
    let was_blocked = matches!(found.row, NextRow::Stored(InboxStatus::Blocked(_)));
    let guarded = guard == Guard::Savepoint || was_blocked;
    if let Some(deferred) = deferred {
        if !guarded {
            // Applied with the rest of the batch, or not at all; marked once
            // the handler has run (see `flush`).
            deferred.push(event);
            return Ok(Some((Step::Applied { seq: next }, true)));
        }
        // The handler sees the events in the batch's order.
        if !flush(w, handler, deferred)? {
            return Ok(None);
        }
    }
    offer(w, flow, next, &found.row, event, handler, guarded)
}

/// The stored event to hand to the handler at `next`, or the step to
/// report without writing; a row already settled there is a corrupt store.
fn evaluated(
    flow: &InboxFlow,
    next: Seq,
    found: &NextEvent,
    reevaluate: &[BlockCode],
) -> Result<Result<Envelope, Step>, StoreError> {
    if matches!(
        found.row,
        NextRow::Stored(InboxStatus::Applied | InboxStatus::Skipped)
    ) {
        return Err(StoreError::corrupt(
            "consumer: inbox",
            format!(
                "flow {flow} seq {next} is settled but the cursor is at {}",
                next.get() - 1
            ),
        ));
    }
    if let ApplyPlan::Report(kind) = plan_apply(found.row.clone(), reevaluate) {
        return Ok(Err(kind.into_step(next)));
    }
    let body = found.body.as_deref().expect("an evaluated row is stored");
    let event = Envelope::from_stored(body)
        .map_err(|e| StoreError::corrupt("consumer: stored inbox body", e))?;
    if !event.is_of(flow) || event.seq != next {
        return Err(StoreError::corrupt(
            "consumer: stored inbox body",
            format!(
                "the row at flow {flow} seq {next} holds {} seq {}",
                event.inbox_flow(),
                event.seq
            ),
        ));
    }
    Ok(Ok(event))
}

/// Hands one event to the handler, under a savepoint when `guarded`, and
/// marks what it decided.
fn offer<W, H>(
    w: &mut W,
    flow: &InboxFlow,
    next: Seq,
    row: &NextRow,
    event: Envelope,
    handler: &mut H,
    guarded: bool,
) -> Result<Option<Stepped>, StoreError>
where
    W: ApplyWriter + ?Sized,
    H: ApplyHandler<W::Tx> + ?Sized,
{
    let span = crate::handler::event_span(&event);
    let _event = span.enter();
    if guarded {
        w.savepoint()?;
    }
    let (verdict, intents) = {
        let producer = event.producer.as_str();
        let mut cx = ApplyContext::recording(w.handler_tx(), producer, w.store_id());
        cx.applying(Some(&event));
        let verdict = handler.apply(&mut cx, &event)?;
        (verdict, cx.take_intents(std::slice::from_ref(&event)))
    };
    w.after_handler(&flow.flow_id, next)?;
    match verdict {
        Verdict::Apply => {
            let intents = intents?;
            if guarded {
                w.release_savepoint()?;
            }
            w.record_intents(&intents)?;
            w.mark_applied(&event)?;
            Ok(Some((Step::Applied { seq: next }, true)))
        }
        Verdict::Block(_) if !guarded => {
            w.check_open(&flow.flow_id, next)?;
            Ok(None)
        }
        Verdict::Block(reason) => {
            w.rollback_savepoint()?;
            let reason = reason.normalized();
            if *row == NextRow::Stored(InboxStatus::Blocked(reason.clone())) {
                // Evaluated again and blocked for the same reason: nothing
                // to write.
                return Ok(Some((Step::Blocked { seq: next, reason }, false)));
            }
            w.mark_blocked(&event, &reason)?;
            Ok(Some((Step::Blocked { seq: next, reason }, true)))
        }
    }
}

/// Hands the `deferred` events to the handler, one call per run of events
/// of one producer (a call's events all come from one), and marks them
/// applied; false when one of them blocked (the caller rolls the
/// transaction back).
pub fn flush<W, H>(w: &mut W, handler: &mut H, deferred: &mut Deferred) -> Result<bool, StoreError>
where
    W: ApplyWriter + ?Sized,
    H: ApplyHandler<W::Tx> + ?Sized,
{
    let events = std::mem::take(deferred);
    let mut intents = Vec::new();
    for run in events.chunk_by(|a, b| a.producer == b.producer) {
        let first = &run[0];
        let producer = first.producer.as_str();
        let mut cx = ApplyContext::recording(w.handler_tx(), producer, w.store_id());
        let verdict = apply_in_order(handler, &mut cx, run, |event| {
            w.after_handler(&event.flow_id, event.seq)
        })?;
        if let Verdict::Block(_) = verdict {
            w.check_open(&first.flow_id, first.seq)?;
            return Ok(false);
        }
        intents.extend(cx.take_intents(run)?);
    }
    w.record_intents(&intents)?;
    for event in &events {
        w.mark_applied(event)?;
    }
    Ok(true)
}

/// What one run of a batch did.
#[derive(Debug, Default)]
pub struct BatchRun {
    /// One drain per visited flow, in the batch's order.
    pub drains: Vec<Drain>,
    /// How many events were applied in all.
    pub applied: u64,
    /// Whether anything was written (the transaction is worth committing).
    pub wrote: bool,
}

/// Runs a batch under each guard in turn, as every backend does: first
/// without a savepoint per event ([`Guard::None`]), then, when `run`
/// returns `None` (an event blocked, and the caller rolled its transaction
/// back), again with one around each ([`Guard::Savepoint`]), which always
/// runs to its end.
pub fn under_guards<T>(
    mut run: impl FnMut(Guard) -> Result<Option<T>, StoreError>,
) -> Result<T, StoreError> {
    for guard in [Guard::None, Guard::Savepoint] {
        if let Some(done) = run(guard)? {
            return Ok(done);
        }
    }
    unreachable!("a guarded batch runs to its end")
}

/// What follows an apply transaction's commit, on every backend: when it
/// applied an event (of the `applied` flows), the crash point
/// `consumer.apply.after_commit`, and in debug builds `check` of each of
/// those flows (the backend's cheap read that the flow is settled up to its
/// cursor and nothing above it).
pub fn after_commit<'a>(
    applied: impl IntoIterator<Item = &'a InboxFlow>,
    mut check: impl FnMut(&InboxFlow) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let mut applied = applied.into_iter().peekable();
    if applied.peek().is_none() {
        return Ok(());
    }
    crate::crash::point(crate::crash::CONSUMER_APPLY_AFTER_COMMIT);
    if cfg!(debug_assertions) {
        applied.try_for_each(&mut check)?;
    }
    Ok(())
}

/// Drains `flows` in order, each up to its own limit, applying at most
/// `events_max` events in all, inside the writer's one transaction, and
/// writes the batch's end. `None` when an event blocked under
/// [`Guard::None`]: the caller rolls back and runs the batch again under
/// [`Guard::Savepoint`]. When `events_max` runs out, the flow in progress
/// stops with `limit` and the flows after it are not visited.
pub fn run_batch<W, H>(
    w: &mut W,
    flows: &[(InboxFlow, Option<u64>)],
    events_max: u64,
    handler: &mut H,
    guard: Guard,
) -> Result<Option<BatchRun>, StoreError>
where
    W: ApplyWriter + ?Sized,
    H: ApplyHandler<W::Tx> + ?Sized,
{
    let mut run = BatchRun::default();
    let mut deferred = Deferred::new();
    for index in 0..flows.len() {
        let left = events_max.saturating_sub(run.applied);
        let Some(drain) = drain_one(w, &flows[index..], left, handler, guard, &mut deferred)?
        else {
            return Ok(None);
        };
        run.wrote |= drain.wrote;
        run.applied += drain.drain.applied;
        let stopped_at_limit = drain.drain.stop == DrainStop::Limit;
        run.drains.push(drain.drain);
        if run.applied >= events_max && stopped_at_limit {
            break;
        }
    }
    if !flush(w, handler, &mut deferred)? {
        return Ok(None);
    }
    w.finish()?;
    assert!(
        run.applied <= events_max,
        "a batch applies at most its limit"
    );
    Ok(Some(run))
}

/// A flow's drain inside a batch, and whether it wrote anything.
struct FlowDrain {
    drain: Drain,
    wrote: bool,
}

/// Drains `flows[0]` for at most `left` events (and its own limit); `None`
/// when an event blocked under [`Guard::None`].
fn drain_one<W, H>(
    w: &mut W,
    flows: &[(InboxFlow, Option<u64>)],
    left: u64,
    handler: &mut H,
    guard: Guard,
    deferred: &mut Deferred,
) -> Result<Option<FlowDrain>, StoreError>
where
    W: ApplyWriter + ?Sized,
    H: ApplyHandler<W::Tx> + ?Sized,
{
    let (flow, limit) = &flows[0];
    let most = limit.map_or(left, |limit| limit.min(left));
    let Some(start_seq) = w.open_flow(flows, left)? else {
        // Another applier holds the flow and drains it.
        let drain = Drain {
            flow: flow.clone(),
            applied: 0,
            stop: DrainStop::Idle,
        };
        return Ok(Some(FlowDrain {
            drain,
            wrote: false,
        }));
    };
    let (mut applied_seq, mut applied, mut wrote) = (start_seq, 0u64, false);
    let stop = loop {
        if applied >= most {
            break DrainStop::Limit;
        }
        let Some(next) = Seq::after(applied_seq) else {
            break DrainStop::Idle;
        };
        // Every row before this one was applied, in seq order.
        let rows = NextRows {
            from: next,
            most: most - applied + 1,
        };
        let found = w.next_event(flow, rows)?;
        let defer = (guard == Guard::None).then_some(&mut *deferred);
        let Some((step, stepped_wrote)) = step(w, flow, next, found, handler, guard, defer)? else {
            return Ok(None);
        };
        wrote |= stepped_wrote;
        match step {
            Step::Applied { seq } => {
                assert_eq!(seq, next, "a flow applies its next seq");
                applied_seq = seq.get();
                applied += 1;
            }
            Step::Gap { .. } => break DrainStop::Gap,
            Step::Blocked { reason, .. } => break DrainStop::Blocked(reason),
            Step::Idle => break DrainStop::Idle,
        }
    };
    if applied > 0 {
        assert_eq!(
            applied_seq,
            start_seq + applied as i64,
            "applied seqs are contiguous"
        );
        w.close_flow(flow, applied_seq)?;
    }
    let drain = Drain {
        flow: flow.clone(),
        applied,
        stop,
    };
    Ok(Some(FlowDrain { drain, wrote }))
}

/// Applies the next event of `flow`, whose cursor the writer has taken
/// at `applied_seq`, with a savepoint around the handler; moves the cursor
/// when it applied. The step and whether it wrote anything.
pub fn apply_next<W, H>(
    w: &mut W,
    flow: &InboxFlow,
    applied_seq: i64,
    handler: &mut H,
) -> Result<Stepped, StoreError>
where
    W: ApplyWriter + ?Sized,
    H: ApplyHandler<W::Tx> + ?Sized,
{
    let Some(next) = Seq::after(applied_seq) else {
        return Ok((Step::Idle, false));
    };
    let found = w.next_event(
        flow,
        NextRows {
            from: next,
            most: 1,
        },
    )?;
    let stepped = step(w, flow, next, found, handler, Guard::Savepoint, None)?
        .expect("a guarded step always ends");
    if let Step::Applied { seq } = stepped.0 {
        w.close_flow(flow, seq.get())?;
    }
    w.finish()?;
    Ok(stepped)
}

/// Refuses a write of `expected` apply cursors that moved only `moved` of
/// them: a cursor only moves forward (never stays nor moves back), so a
/// write that left one where it was is a corrupt store, reported at the
/// first cursor of the write (`flow`, `applied_seq`) and rolled back. The
/// flow is only formatted when the check fails.
pub fn check_cursors_moved(
    moved: u64,
    expected: usize,
    flow: &dyn std::fmt::Display,
    applied_seq: i64,
) -> Result<(), StoreError> {
    assert!(
        expected > 0 && applied_seq > 0,
        "a cursor moves to a stored seq"
    );
    if moved == expected as u64 {
        return Ok(());
    }
    Err(StoreError::corrupt(
        "consumer: inbox_cursor",
        format!(
            "a cursor (of flow {flow} or another of its write) is already at or past {applied_seq}"
        ),
    ))
}

/// A row's status as stored (`status`, `reason`, `detail` columns), or a
/// corrupt store when the columns do not make one.
pub fn stored_status(
    status: &str,
    reason: Option<&str>,
    detail: Option<String>,
) -> Result<InboxStatus, StoreError> {
    let context = "consumer: stored inbox status";
    match (status, reason) {
        ("pending", None) => Ok(InboxStatus::Pending),
        ("applied", None) => Ok(InboxStatus::Applied),
        ("skipped", None) => Ok(InboxStatus::Skipped),
        ("blocked", Some(code)) => BlockCode::new(code)
            .map(|code| InboxStatus::Blocked(BlockReason { code, detail }))
            .map_err(|e| StoreError::corrupt(context, e)),
        _ => Err(StoreError::corrupt(
            context,
            format!("{status:?} with reason {reason:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn seq(value: i64) -> Seq {
        Seq::new(value).unwrap()
    }

    #[test]
    fn the_first_row_at_or_after_next_says_what_is_there() {
        let body = || "{}".to_owned();
        let cases = [
            (None, NextEvent::missing(false)),
            (
                Some((4, body(), InboxStatus::Pending)),
                NextEvent::missing(true),
            ),
            (
                Some((3, body(), InboxStatus::Pending)),
                NextEvent {
                    row: NextRow::Stored(InboxStatus::Pending),
                    body: Some(body()),
                },
            ),
        ];
        for (first, expected) in cases {
            assert_eq!(NextEvent::at(seq(3), first.clone()), expected, "{first:?}");
        }
    }

    #[test]
    fn stored_statuses_decode_or_are_corrupt() {
        let blocked = stored_status("blocked", Some("late"), Some("why".into())).unwrap();
        assert_eq!(blocked.reason().unwrap().code.as_str(), "late");
        assert_eq!(
            stored_status("pending", None, None).unwrap(),
            InboxStatus::Pending
        );
        assert_eq!(
            stored_status("applied", None, None).unwrap(),
            InboxStatus::Applied
        );
        assert_eq!(
            stored_status("skipped", None, None).unwrap(),
            InboxStatus::Skipped
        );
        for (status, reason) in [("blocked", None), ("pending", Some("x")), ("gone", None)] {
            let error = stored_status(status, reason, None).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::Corrupt, "{status} {reason:?}");
        }
    }
}
