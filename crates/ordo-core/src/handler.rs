//! The application's side of apply: a handler that decides, inside the
//! apply transaction, what an event means.
//!
//! Invariant: ordo never interprets a payload. Order, dedup, custody,
//! blocking and repair are the store's; what an event does is the handler's,
//! written to the application's own tables through the transaction the
//! store hands it, so the application's change and the inbox mark commit
//! together or not at all.

use std::ops::Deref;

use crate::effect::{EffectKey, Intent, IntentRecorder};
use crate::envelope::Envelope;
use crate::error::{ErrorKind, StoreError};
use crate::identity::StoreId;
use crate::ids::BlockCode;
use crate::outcome::BlockReason;

/// The producer name of every event until producers are named: the one
/// namespace of a store that serves one producer.
pub const DEFAULT_PRODUCER: &str = crate::ids::ProducerName::DEFAULT;

/// What the store hands a handler with each call: the backend's
/// transaction, and what ordo knows of the events being applied beyond
/// their envelopes. It dereferences to the transaction, so a handler
/// writes through it as through the transaction itself
/// (`cx.execute(..)` on SQLite, `cx.client()` on PostgreSQL).
///
/// Through it a handler also records effect intents (EFFECTS.md): named
/// requests to the outside world that commit with the apply, or not at
/// all, and that an executor performs afterwards.
///
/// Invariant: the context only grows. What later releases hand a handler
/// is added here, never to the [`ApplyHandler`] trait's signatures.
pub struct ApplyContext<'a, Tx: ?Sized> {
    tx: &'a Tx,
    producer: &'a str,
    current: Option<&'a Envelope>,
    effects: Option<IntentRecorder>,
}

impl<'a, Tx: ?Sized> ApplyContext<'a, Tx> {
    /// A context around the open apply transaction `tx`, for events of
    /// `producer`, that records no effects. Built by the engine, not by
    /// applications.
    pub fn new(tx: &'a Tx, producer: &'a str) -> ApplyContext<'a, Tx> {
        debug_assert!(!producer.is_empty(), "a producer has a name");
        ApplyContext {
            tx,
            producer,
            current: None,
            effects: None,
        }
    }

    /// A context that records the effect intents of the consumer store
    /// `store_id`. Built by the engine, not by applications.
    pub fn recording(tx: &'a Tx, producer: &'a str, store_id: &StoreId) -> ApplyContext<'a, Tx> {
        ApplyContext {
            effects: Some(IntentRecorder::new(store_id.clone())),
            ..ApplyContext::new(tx, producer)
        }
    }

    /// The transaction the handler writes through.
    pub fn tx(&self) -> &'a Tx {
        self.tx
    }

    /// The producer of the events being applied: every event of one
    /// [`ApplyHandler::apply`] or [`ApplyHandler::apply_all`] call comes
    /// from this one producer ([`DEFAULT_PRODUCER`] for a store that
    /// serves one).
    pub fn producer(&self) -> &'a str {
        self.producer
    }

    /// Records the effect intent `name` (`[a-z][a-z0-9_]{0,63}`) with
    /// `request` (a JSON object of at most 256 KiB) for the event being
    /// applied, and returns its key. It commits with the event's apply, or
    /// not at all (a block, an error, a crash). At most 8 per event; the
    /// same name twice for one event is an error that fails the whole
    /// apply, even if the handler drops it. Inside
    /// [`ApplyHandler::apply_all`] name the event with
    /// [`ApplyContext::effect_for`].
    pub fn effect(
        &mut self,
        name: &str,
        request: &(impl serde::Serialize + ?Sized),
    ) -> Result<EffectKey, StoreError> {
        match self.current {
            Some(event) => self.effect_for(event, name, request),
            None => Err(self.refuse(format!(
                "effect {name:?}: no single event is being applied; inside apply_all use effect_for"
            ))),
        }
    }

    /// As [`ApplyContext::effect`], for `event`, one of the events of the
    /// call.
    pub fn effect_for(
        &mut self,
        event: &Envelope,
        name: &str,
        request: &(impl serde::Serialize + ?Sized),
    ) -> Result<EffectKey, StoreError> {
        match self.effects.as_mut() {
            Some(recorder) => recorder.record(event, name, request),
            None => Err(StoreError::new(
                ErrorKind::InvalidInput,
                format!("effect {name:?}: this apply records no effects"),
            )),
        }
    }

    fn refuse(&mut self, why: String) -> StoreError {
        if let Some(recorder) = self.effects.as_mut() {
            recorder.refuse(why.clone());
        }
        StoreError::new(ErrorKind::InvalidInput, why)
    }

    /// Sets the event the next [`ApplyHandler::apply`] call applies.
    pub(crate) fn applying(&mut self, event: Option<&'a Envelope>) {
        self.current = event;
    }

    /// The intents recorded for `events`, or the first refusal (the apply
    /// then fails whole).
    pub(crate) fn take_intents(&mut self, events: &[Envelope]) -> Result<Vec<Intent>, StoreError> {
        match self.effects.as_mut() {
            Some(recorder) => recorder.take(events),
            None => Ok(Vec::new()),
        }
    }
}

impl<Tx: ?Sized> Deref for ApplyContext<'_, Tx> {
    type Target = Tx;

    fn deref(&self) -> &Tx {
        self.tx
    }
}

/// What a handler decided about one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The handler wrote its changes; the store marks the event applied in
    /// the same transaction.
    Apply,
    /// The event cannot be applied: the store undoes everything the handler
    /// wrote for it and marks it `blocked` with this reason, its body
    /// unchanged. The flow stops there until an operator acts, or until the
    /// handler re-evaluates the code (see [`ApplyHandler::reevaluate`]).
    Block(BlockReason),
}

impl Verdict {
    /// Blocks with a code and no detail.
    pub const fn block(code: BlockCode) -> Verdict {
        Verdict::Block(BlockReason::code(code))
    }

    /// Blocks with a code and detail text for the operator.
    pub fn block_with(code: BlockCode, detail: impl Into<String>) -> Verdict {
        Verdict::Block(BlockReason::with_detail(code, detail))
    }
}

/// Applies a flow's next event inside the consumer's apply transaction.
///
/// `Tx` is the backend's transaction type (for SQLite,
/// `rusqlite::Connection`, inside an open `BEGIN IMMEDIATE` transaction),
/// handed over inside an [`ApplyContext`].
///
/// Guarantees the store gives a handler:
/// - it is called only for a flow's next event after its applied seq, in
///   seq order, never for an event already applied or skipped;
/// - what it writes through `tx` commits together with the event's inbox
///   mark, or not at all; on [`Verdict::Block`] none of it commits.
///
/// What a handler must allow for: a call whose writes never commit (a crash,
/// an error, or a batch that runs again after a block), so it keeps nothing
/// outside `tx` that assumes the call took effect. It must not end the
/// transaction (the store then fails the apply and nothing commits), and it
/// must not read the store's own tables to learn where a flow stands: the
/// event it is given is the next one.
pub trait ApplyHandler<Tx: ?Sized> {
    /// Applies `event` by writing through `cx`, or blocks it. An `Err` is an
    /// operating failure: the whole apply transaction is rolled back and the
    /// error returned to the caller; nothing is marked.
    fn apply(
        &mut self,
        cx: &mut ApplyContext<'_, Tx>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError>;

    /// Applies several events in one call, in the order given, writing
    /// through `cx`: `Some(Verdict::Apply)` when every one of them applied,
    /// else `Some` of the first [`Verdict::Block`] (the handler may stop
    /// there); `None` (the default) to have the store offer them one at a
    /// time through [`ApplyHandler::apply`] instead. A batch apply hands over
    /// every event it is about to apply at once, so that a handler can read
    /// and write for all of them in a few statements (`unnest`, `= ANY`)
    /// instead of a few per event.
    ///
    /// The same guarantees as [`ApplyHandler::apply`], for each event: each
    /// flow's events come in seq order, each the flow's next one after the
    /// events before it in `events` (flows may be interleaved), none of them
    /// applied or skipped before. On `Apply` every event is marked applied
    /// in the same transaction. On a `Block` nothing of the call is kept:
    /// the store undoes all of it and offers the same events again one at a
    /// time through [`ApplyHandler::apply`], each under its own savepoint,
    /// to learn which one blocks. So an implementation must decide exactly
    /// as `apply` would for the same events in the same order. The store
    /// cannot step in between the events of one call: a handler that has
    /// ended the transaction (which it must not) should stop there.
    fn apply_all(
        &mut self,
        cx: &mut ApplyContext<'_, Tx>,
        events: &[Envelope],
    ) -> Result<Option<Verdict>, StoreError> {
        let _ = (cx, events);
        Ok(None)
    }

    /// The block codes this handler evaluates again: rows blocked with one
    /// of them are offered to [`ApplyHandler::apply`] once more (for example
    /// after the handler learned a new schema version). Rows blocked with
    /// any other code stay blocked until an operator acts. None by default.
    fn reevaluate(&self) -> &[BlockCode] {
        &[]
    }
}

/// Hands `events` to `handler` in order: in one
/// [`ApplyHandler::apply_all`] call, or, when it declines, one at a time
/// through [`ApplyHandler::apply`] up to the first block. `after` runs after
/// each call (once after `apply_all`, with the first event) and may refuse
/// to go on (a store whose transaction ended under the handler). The
/// verdict is the call's, or the first block's.
pub fn apply_in_order<'a, Tx, H>(
    handler: &mut H,
    cx: &mut ApplyContext<'a, Tx>,
    events: &'a [Envelope],
    mut after: impl FnMut(&Envelope) -> Result<(), StoreError>,
) -> Result<Verdict, StoreError>
where
    Tx: ?Sized,
    H: ApplyHandler<Tx> + ?Sized,
{
    let Some(first) = events.first() else {
        return Ok(Verdict::Apply);
    };
    let batch = tracing::debug_span!(
        "apply_batch",
        events = events.len(),
        traceparent = tracing::field::Empty,
    );
    crate::trace::follow(&batch, crate::trace::first_traceparent(events).as_ref());
    if let Some(verdict) = batch.in_scope(|| handler.apply_all(cx, events))? {
        if verdict == Verdict::Apply {
            // One span per event of the batch, once it applied.
            batch.in_scope(|| events.iter().for_each(|e| drop(event_span(e).entered())));
        }
        after(first)?;
        return Ok(verdict);
    }
    for event in events {
        cx.applying(Some(event));
        let verdict = event_span(event).in_scope(|| handler.apply(cx, event));
        cx.applying(None);
        let verdict = verdict?;
        after(event)?;
        if let Verdict::Block(_) = verdict {
            return Ok(verdict);
        }
    }
    Ok(Verdict::Apply)
}

/// The span of one event's apply, with the event's trace context.
pub(crate) fn event_span(event: &Envelope) -> tracing::Span {
    crate::trace::event_span!("apply_event", event)
}

impl<Tx: ?Sized, F> ApplyHandler<Tx> for F
where
    F: FnMut(&mut ApplyContext<'_, Tx>, &Envelope) -> Result<Verdict, StoreError>,
{
    fn apply(
        &mut self,
        cx: &mut ApplyContext<'_, Tx>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        self(cx, event)
    }
}
