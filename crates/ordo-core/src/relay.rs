//! The relay: hands outbox events to the consumer and marks them accepted
//! only after a receipt that moves custody.
//!
//! Each round takes a batch of events chosen by the policy, receives all of
//! them in one consumer transaction, then records every receipt in one
//! producer transaction: custody-moving receipts mark their rows accepted, a
//! conflict quarantines its row (never accepted, never retried
//! automatically). A transient failure of the consumer (busy, locked,
//! unreachable) is recorded on every event of the round with an exponential,
//! fully jittered backoff, and returned as the error it is.

use std::collections::{BTreeSet, HashMap};

use crate::backoff::Backoff;
use crate::clock::Clock;
use crate::crash;
use crate::envelope::Envelope;
use crate::error::{ErrorKind, RelayError, StoreError};
use crate::identity::StoreId;
use crate::ids::{EventId, FlowId, Seq};
use crate::outcome::Receipt;
use crate::store::ProducerStore;
use crate::transport::{TransientKind, Transport, TransportError};

/// Which unaccepted events a relay run picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RelayPolicy {
    /// Head-of-line only within a flow, round-robin across flows: each round
    /// hands over the next due event of the flows served least recently, one
    /// per flow. A quarantined or backing-off event holds back only its own
    /// flow (and a quarantined one not even that: later events of the flow
    /// may still move to the consumer, whose strict order protects apply).
    #[default]
    Fair,
    /// Always the oldest unaccepted event, one per round, quarantined or not;
    /// a conflict on it ends the run, so a permanent conflict starves every
    /// later event. The seed's behaviour, kept for the experiment.
    FirstPending,
}

impl RelayPolicy {
    /// The policy's name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            RelayPolicy::Fair => "fair",
            RelayPolicy::FirstPending => "first-pending",
        }
    }
}

/// The default number of events handed over per round.
pub const BATCH_LEN_DEFAULT: usize = 256;

/// How a relay run behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayOptions {
    /// The selection policy.
    pub policy: RelayPolicy,
    /// The most deliveries in this run (conflicts included); `None`: until
    /// nothing this policy may deliver remains.
    pub max: Option<u64>,
    /// The most events per round (one consumer and one producer transaction).
    pub batch_len_max: usize,
    /// The most events of one flow in a fair round, from its head in seq
    /// order (default 1: the head alone). A store may hand fewer
    /// ([`ProducerStore::fair_round_deep`]).
    pub flow_events_max: usize,
    /// Backoff for transient failures.
    pub backoff: Backoff,
}

impl Default for RelayOptions {
    fn default() -> Self {
        RelayOptions {
            policy: RelayPolicy::Fair,
            max: None,
            batch_len_max: BATCH_LEN_DEFAULT,
            flow_events_max: 1,
            backoff: Backoff::default(),
        }
    }
}

/// One hand-over of an event to the consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The event.
    pub event_id: EventId,
    /// Its flow.
    pub flow_id: FlowId,
    /// Its seq.
    pub seq: Seq,
    /// The consumer's receipt.
    pub receipt: Receipt,
}

/// Why a relay run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayStop {
    /// Nothing this policy may deliver in this run remains.
    Drained,
    /// The bound on deliveries was reached.
    Max,
}

impl RelayStop {
    /// The stop's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RelayStop::Drained => "drained",
            RelayStop::Max => "max",
        }
    }
}

/// The result of a relay run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayReport {
    /// Every delivery, in order.
    pub deliveries: Vec<Delivery>,
    /// Every event the consumer refused (quarantined), in order.
    pub refusals: Vec<Refusal>,
    /// Rounds that failed transiently (their events back off).
    pub transient_errors: u64,
    /// Why the run ended.
    pub stop: RelayStop,
}

impl RelayReport {
    /// A report of deliveries only.
    pub fn delivered(deliveries: Vec<Delivery>, stop: RelayStop) -> RelayReport {
        RelayReport {
            deliveries,
            refusals: Vec::new(),
            transient_errors: 0,
            stop,
        }
    }

    fn note(&mut self, handover: Handover<'_>) {
        match handover {
            Handover::Delivered(d) => self.deliveries.push(d.clone()),
            Handover::Refused(r) => self.refusals.push(r.clone()),
            Handover::Failed(_) => self.transient_errors += 1,
        }
    }
}

/// Whether a consumer failure is worth retrying later.
pub fn is_transient(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::Busy | ErrorKind::ConnectionLost)
}

/// Why the relay quarantined an event without a receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// The consumer refused the event alone as too large (HTTP 413).
    TooLarge,
    /// The consumer could not read the event (HTTP 400 naming it): the two
    /// sides' codecs disagree.
    RejectedByConsumer,
}

impl RefusalReason {
    /// The reason's code, recorded first in the quarantine reason.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::TooLarge => "too_large",
            RefusalReason::RejectedByConsumer => "rejected_by_consumer",
        }
    }
}

/// An event the consumer refused to store, quarantined by the relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The event.
    pub event_id: EventId,
    /// Its flow.
    pub flow_id: FlowId,
    /// Its seq.
    pub seq: Seq,
    /// Why it was refused.
    pub reason: RefusalReason,
    /// The consumer's words.
    pub message: String,
}

/// A round that failed transiently: its events back off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundFailure {
    /// What went wrong.
    pub kind: TransientKind,
    /// The events of the round.
    pub events_len: usize,
    /// The transport's words.
    pub message: String,
}

/// What happened to the events of a round, as the relay records it.
#[derive(Debug, Clone, Copy)]
pub enum Handover<'a> {
    /// The consumer issued a receipt.
    Delivered(&'a Delivery),
    /// The consumer refused the event; it is quarantined.
    Refused(&'a Refusal),
    /// The round failed transiently; its events back off.
    Failed(&'a RoundFailure),
}

/// What one round brought, as a run goes on after it.
#[derive(Debug, Default)]
struct RoundLog {
    deliveries: Vec<Delivery>,
    refusals: Vec<Refusal>,
    failures: Vec<RoundFailure>,
    /// The store refused the round's bookkeeping because another relay
    /// claimed flows of it meanwhile ([`ErrorKind::LeaseLost`]); what came
    /// before the refusal is logged.
    lease_lost: bool,
}

impl RoundLog {
    /// Whether the log accounts for every event of a round recorded whole,
    /// each once: delivered, refused, or backing off.
    fn accounts_for(&self, events: &[Envelope]) -> bool {
        let ids: BTreeSet<&EventId> = events.iter().map(|e| &e.event_id).collect();
        let settled: Vec<&EventId> = self.settled_ids().collect();
        let settled_distinct: BTreeSet<&EventId> = settled.iter().copied().collect();
        let failed_len: usize = self.failures.iter().map(|f| f.events_len).sum();
        settled_distinct.len() == settled.len()
            && settled_distinct.is_subset(&ids)
            && settled.len() + failed_len == events.len()
    }

    /// The events delivered or refused in the round.
    fn settled_ids(&self) -> impl Iterator<Item = &EventId> {
        let delivered = self.deliveries.iter().map(|d| &d.event_id);
        delivered.chain(self.refusals.iter().map(|r| &r.event_id))
    }
}

/// What the relay writes after one answer of the consumer to a round,
/// decided without reading or writing anything.
#[derive(Debug)]
enum Bookkeeping {
    /// A receipt for every event: one mark per event, in round order, with
    /// its receipt ([`ProducerStore::record_receipts`]: `accepted` and
    /// `duplicate` mark the event accepted, `conflict` quarantines it, and
    /// an `after_conflict` one is not recorded).
    Marks(Vec<(EventId, Receipt)>),
    /// The round is too large: its first `first_len` events go over as a
    /// round of their own, then the rest. Nothing is written yet.
    Split {
        /// The events of the first half, at least one.
        first_len: usize,
    },
    /// The consumer refused the event at `index` alone: it is quarantined
    /// and the rest go over again.
    Quarantine {
        /// The event's position in the round.
        index: usize,
        /// Why it was refused.
        reason: RefusalReason,
        /// The consumer's words.
        message: String,
    },
    /// The round failed transiently: every event of it backs off.
    BackOff(BackOff),
    /// Nothing is written; the run ends with this error.
    End(RelayError),
}

/// A transient failure of a round, as it is recorded on its events.
#[derive(Debug)]
struct BackOff {
    /// Every event of the round, in round order.
    event_ids: Vec<EventId>,
    /// The run's backoff, its floor raised to the consumer's `Retry-After`.
    backoff: Backoff,
    /// What went wrong.
    kind: TransientKind,
    /// The transport's words.
    message: String,
    /// The wait the consumer asked for.
    retry_after_ms: Option<u64>,
}

/// What `answer`, the consumer's answer to `events`, makes the relay
/// write under `backoff`. Panics if a receipt is missing or extra: a
/// transport answers one receipt per event.
fn bookkeeping(
    events: &[Envelope],
    answer: Result<Vec<Receipt>, TransportError>,
    backoff: &Backoff,
) -> Bookkeeping {
    let error = match answer {
        Ok(receipts) => return Bookkeeping::Marks(marks(events, receipts)),
        Err(error) => error,
    };
    match error {
        TransportError::TooLarge { .. } if events.len() > 1 => Bookkeeping::Split {
            first_len: events.len() / 2,
        },
        TransportError::TooLarge { message } => Bookkeeping::Quarantine {
            index: 0,
            reason: RefusalReason::TooLarge,
            message,
        },
        TransportError::Rejected { index, message } if index < events.len() => {
            Bookkeeping::Quarantine {
                index,
                reason: RefusalReason::RejectedByConsumer,
                message,
            }
        }
        TransportError::Rejected { index, message } => {
            Bookkeeping::End(RelayError::Refused(format!(
                "the consumer rejected event {index} of a round of {}: {message}",
                events.len()
            )))
        }
        TransportError::Transient {
            kind,
            message,
            retry_after_ms,
        } => Bookkeeping::BackOff(BackOff {
            event_ids: events.iter().map(|e| e.event_id.clone()).collect(),
            backoff: backoff_after(backoff, retry_after_ms),
            kind,
            message,
            retry_after_ms,
        }),
        TransportError::Refused { message } => Bookkeeping::End(RelayError::Refused(message)),
        TransportError::Store(error) => Bookkeeping::End(RelayError::Store(error)),
        TransportError::Skew { message } => Bookkeeping::End(RelayError::Skew(message)),
    }
}

/// `backoff` waiting at least `retry_after_ms`, the consumer's
/// `Retry-After`, when it names one.
fn backoff_after(backoff: &Backoff, retry_after_ms: Option<u64>) -> Backoff {
    Backoff {
        floor_ms: backoff.floor_ms.max(retry_after_ms.unwrap_or(0)),
        ..*backoff
    }
}

/// One mark per event of `events`, in order, with its receipt. Panics if
/// a receipt is missing or extra.
fn marks(events: &[Envelope], receipts: Vec<Receipt>) -> Vec<(EventId, Receipt)> {
    assert_eq!(receipts.len(), events.len(), "one receipt per event");
    let ids = events.iter().map(|e| e.event_id.clone());
    ids.zip(receipts).collect()
}

/// The marks the producer records: every one but an `after_conflict`
/// event's, which is left unmarked and goes over again.
fn recorded(marks: &[(EventId, Receipt)]) -> Vec<(EventId, Receipt)> {
    marks
        .iter()
        .filter(|(_, r)| r.is_recorded())
        .cloned()
        .collect()
}

/// Whether `marks` name the events of `events`, one each, in order.
fn marks_follow(events: &[Envelope], marks: &[(EventId, Receipt)]) -> bool {
    let ids = marks.iter().map(|(id, _)| id);
    marks.len() == events.len() && ids.eq(events.iter().map(|e| &e.event_id))
}

/// Whether `deliveries` log `marks`, one each, in order, with their
/// receipts.
fn deliveries_log(deliveries: &[Delivery], marks: &[(EventId, Receipt)]) -> bool {
    let logged = deliveries.iter().map(|d| (&d.event_id, d.receipt));
    logged.eq(marks.iter().map(|(id, receipt)| (id, *receipt)))
}

/// Refuses, before anything is delivered, a consumer store other than the
/// one the destination recorded (PROTOCOL.md section 12): the transport is
/// asked for the consumer's identity only when one is recorded. A failure
/// to ask is the round's transport error.
fn identified<P, T>(
    producer: &mut P,
    transport: &mut T,
) -> Result<Result<(), TransportError>, RelayError>
where
    P: ProducerStore + ?Sized,
    T: Transport + ?Sized,
{
    if producer.recorded_consumer()?.is_none() {
        return Ok(Ok(()));
    }
    match transport.identify() {
        Ok(Some(consumer)) => Ok(Ok(producer.check_consumer(&consumer)?)),
        Ok(None) => Ok(Ok(())),
        Err(e) => Ok(Err(e)),
    }
}

/// Hands `events` over through `transport` and records the outcome in the
/// producer: receipts in one producer transaction; a round too large is
/// split in halves; an event refused alone is quarantined and the rest sent
/// again; a transient failure backs every event of the round off.
fn deliver_round<P, T>(
    producer: &mut P,
    transport: &mut T,
    events: &[Envelope],
    clock: &dyn Clock,
    backoff: &Backoff,
    log: &mut RoundLog,
) -> Result<(), RelayError>
where
    P: ProducerStore + ?Sized,
    T: Transport + ?Sized,
{
    let mut rest: Vec<Envelope> = events.to_vec();
    let sender = producer.store_id().clone();
    while !rest.is_empty() {
        crash::point(crash::RELAY_BEFORE_RECEIVE);
        let answer = match identified(producer, transport)? {
            Ok(()) => transport.deliver(Some(&sender), &rest),
            Err(e) => Err(e),
        };
        match bookkeeping(&rest, answer, backoff) {
            Bookkeeping::Marks(marks) => {
                let consumer = transport.consumer_identity();
                let marks = (consumer.as_ref(), marks.as_slice());
                return record(producer, &rest, marks, clock, log);
            }
            Bookkeeping::Split { first_len } => {
                let (first, second) = rest.split_at(first_len);
                deliver_round(producer, transport, first, clock, backoff, log)?;
                return deliver_round(producer, transport, second, clock, backoff, log);
            }
            Bookkeeping::Quarantine {
                index,
                reason,
                message,
            } => {
                let event = rest.remove(index);
                refuse(producer, event, reason, message, clock, log)?;
            }
            Bookkeeping::BackOff(back_off) => {
                return record_failure(producer, back_off, clock, log)
            }
            Bookkeeping::End(error) => return Err(error),
        }
    }
    Ok(())
}

/// Records the marks of a round, one per event of `events` in order, with
/// the identity of the consumer store that returned them, in one producer
/// transaction, then logs them as deliveries.
fn record<P>(
    producer: &mut P,
    events: &[Envelope],
    (consumer, marks): (Option<&StoreId>, &[(EventId, Receipt)]),
    clock: &dyn Clock,
    log: &mut RoundLog,
) -> Result<(), RelayError>
where
    P: ProducerStore + ?Sized,
{
    debug_assert!(
        marks_follow(events, marks),
        "one mark per event of the round, in round order"
    );
    crash::point(crash::RELAY_AFTER_RECEIVE);
    producer.record_receipts_from(consumer, &recorded(marks), clock.now_ms())?;
    let logged_len = log.deliveries.len();
    log.deliveries.extend(
        events
            .iter()
            .zip(marks)
            .map(|(event, (_, receipt))| Delivery {
                event_id: event.event_id.clone(),
                flow_id: event.flow_id.clone(),
                seq: event.seq,
                receipt: *receipt,
            }),
    );
    debug_assert!(
        deliveries_log(&log.deliveries[logged_len..], marks),
        "one delivery logged per mark written, with its receipt"
    );
    Ok(())
}

/// Quarantines an event the consumer refused to store, then logs it as a
/// refusal.
fn refuse<P>(
    producer: &mut P,
    event: Envelope,
    reason: RefusalReason,
    message: String,
    clock: &dyn Clock,
    log: &mut RoundLog,
) -> Result<(), RelayError>
where
    P: ProducerStore + ?Sized,
{
    debug_assert!(
        log.settled_ids().all(|id| *id != event.event_id),
        "an event is quarantined at most once a round, and never once delivered"
    );
    event_span(&event).in_scope(|| {
        tracing::warn!(
            event_id = %event.event_id, flow_id = %event.flow_id, seq = event.seq.get(),
            reason = reason.as_str(), "the consumer refused the event; quarantining it: {message}"
        )
    });
    let text = format!("{}: {message}", reason.as_str());
    producer.quarantine(&event.event_id, reason.as_str(), &text, clock.now_ms())?;
    log.refusals.push(Refusal {
        event_id: event.event_id,
        flow_id: event.flow_id,
        seq: event.seq,
        reason,
        message,
    });
    Ok(())
}

/// Records a transient failure on every event of the round, then logs it;
/// if the record fails, returns both errors.
fn record_failure<P>(
    producer: &mut P,
    back_off: BackOff,
    clock: &dyn Clock,
    log: &mut RoundLog,
) -> Result<(), RelayError>
where
    P: ProducerStore + ?Sized,
{
    let BackOff {
        event_ids,
        backoff,
        kind,
        message,
        retry_after_ms,
    } = back_off;
    let recorded = producer.record_failure(&event_ids, &message, clock.now_ms(), &backoff);
    if let Err(recording) = recorded {
        let delivery = TransportError::Transient {
            kind,
            message,
            retry_after_ms,
        };
        return Err(RelayError::FailureUnrecorded {
            delivery,
            recording,
        });
    }
    tracing::warn!(
        kind = kind.as_str(),
        events = event_ids.len(),
        "a round failed transiently; its events back off: {message}"
    );
    log.failures.push(RoundFailure {
        kind,
        events_len: event_ids.len(),
        message,
    });
    Ok(())
}

/// Relays under `options` until nothing may be delivered in this run or
/// `options.max` deliveries were made, and returns what happened. Memory
/// grows with the deliveries; [`relay_each`] keeps it bounded.
pub fn relay<P, T>(
    producer: &mut P,
    transport: &mut T,
    options: &RelayOptions,
    clock: &dyn Clock,
) -> Result<RelayReport, RelayError>
where
    P: ProducerStore + ?Sized,
    T: Transport + ?Sized,
{
    let mut report = RelayReport::delivered(Vec::new(), RelayStop::Drained);
    report.stop = relay_each(producer, transport, options, clock, |handover| {
        report.note(handover)
    })?;
    Ok(report)
}

/// [`relay`] handing each outcome to `each` as its round is recorded,
/// instead of collecting them: memory stays bounded by one round
/// (`options.batch_len_max` events) however long the run.
///
/// A transient failure backs the round's events off and the run goes on
/// with other flows; a refused event is quarantined and the rest go on; a
/// round whose bookkeeping the store refuses because another relay claimed
/// its flows meanwhile ([`ErrorKind::LeaseLost`]) leaves those flows to
/// that relay for the rest of the run; a configuration error
/// ([`RelayError::Refused`]), a consumer of an earlier release than the
/// round needs ([`RelayError::Skew`]) or another store error ends the run,
/// the rounds before it recorded.
pub fn relay_each<P, T>(
    producer: &mut P,
    transport: &mut T,
    options: &RelayOptions,
    clock: &dyn Clock,
    mut each: impl FnMut(Handover<'_>),
) -> Result<RelayStop, RelayError>
where
    P: ProducerStore + ?Sized,
    T: Transport + ?Sized,
{
    let mut delivered = 0u64;
    let mut skipped: BTreeSet<FlowId> = BTreeSet::new();
    loop {
        let Some(room_len) = room_len(options.max, delivered) else {
            return Ok(RelayStop::Max);
        };
        let events = next_round(producer, options, room_len, &skipped, clock)?;
        if events.is_empty() {
            return Ok(RelayStop::Drained);
        }
        let span = round_span(&events);
        let _round = span.enter();
        let log = run_round(producer, transport, &events, clock, &options.backoff)?;
        let end = round_end(options.policy, &events, &log);
        if end.hand_over {
            hand_over(&log, &events, &mut each);
        }
        skipped.extend(end.skip_flows);
        if end.drained {
            return Ok(RelayStop::Drained);
        }
        delivered += end.settled_len;
    }
}

/// How many more events a run bounded by `max` may deliver after
/// `delivered`; `None` once it may deliver no more.
fn room_len(max: Option<u64>, delivered: u64) -> Option<usize> {
    match max {
        Some(max) if delivered >= max => None,
        Some(max) => Some(usize::try_from(max - delivered).unwrap_or(usize::MAX)),
        None => Some(usize::MAX),
    }
}

/// The events of the next round under `options`, at most `room_len` of a
/// fair round, none of the `skipped` flows'; empty when none is due.
fn next_round<P>(
    producer: &mut P,
    options: &RelayOptions,
    room_len: usize,
    skipped: &BTreeSet<FlowId>,
    clock: &dyn Clock,
) -> Result<Vec<Envelope>, StoreError>
where
    P: ProducerStore + ?Sized,
{
    match options.policy {
        RelayPolicy::FirstPending => Ok(producer
            .oldest_unaccepted(clock.now_ms())?
            .into_iter()
            .collect()),
        RelayPolicy::Fair => producer.fair_round_deep(
            options.batch_len_max.max(1).min(room_len),
            options.flow_events_max.max(1),
            skipped,
            clock.now_ms(),
        ),
    }
}

/// Delivers and records one round of a run. A lease lost to another relay
/// is logged, not returned; any other error is returned.
fn run_round<P, T>(
    producer: &mut P,
    transport: &mut T,
    events: &[Envelope],
    clock: &dyn Clock,
    backoff: &Backoff,
) -> Result<RoundLog, RelayError>
where
    P: ProducerStore + ?Sized,
    T: Transport + ?Sized,
{
    let mut log = RoundLog::default();
    match deliver_round(producer, transport, events, clock, backoff, &mut log) {
        Ok(()) => debug_assert!(log.accounts_for(events), "a whole round is logged whole"),
        Err(error) if lease_lost(&error) => {
            // Another relay claimed flows of this round while it was
            // delivered: their bookkeeping is that relay's now (what
            // reached the consumer is answered duplicate to it).
            tracing::info!("another relay took over flows of a round: {error}");
            log.lease_lost = true;
        }
        Err(error) => return Err(error),
    }
    Ok(log)
}

/// The span of a round of `events`: their number, and the round's trace
/// context (the first well-formed `traceparent` of its events, the one a
/// transport sends with it).
fn round_span(events: &[Envelope]) -> tracing::Span {
    let span = tracing::debug_span!(
        "relay_batch",
        events = events.len(),
        traceparent = tracing::field::Empty,
    );
    crate::trace::follow(&span, crate::trace::first_traceparent(events).as_ref());
    span
}

/// The span of one event of a round, with the event's own trace context.
fn event_span(event: &Envelope) -> tracing::Span {
    crate::trace::event_span!("relay_event", event)
}

/// Hands the outcomes of a round of `events` to `each`: deliveries, each
/// in its event's span, then refusals, then failures, each in the order
/// they were recorded.
fn hand_over(log: &RoundLog, events: &[Envelope], each: &mut impl FnMut(Handover<'_>)) {
    let by_id: HashMap<&EventId, &Envelope> = events.iter().map(|e| (&e.event_id, e)).collect();
    for delivery in &log.deliveries {
        let span = event_span(by_id[&delivery.event_id]);
        let _event = span.enter();
        tracing::debug!(
            event_id = %delivery.event_id, flow_id = %delivery.flow_id,
            seq = delivery.seq.get(), receipt = delivery.receipt.as_str(), "delivered"
        );
        each(Handover::Delivered(delivery));
    }
    log.refusals.iter().for_each(|r| each(Handover::Refused(r)));
    log.failures.iter().for_each(|f| each(Handover::Failed(f)));
}

/// What a run does after a round.
#[derive(Debug, PartialEq, Eq)]
struct RoundEnd {
    /// Whether the round's outcomes go to the caller.
    hand_over: bool,
    /// Flows the run leaves alone from now on.
    skip_flows: BTreeSet<FlowId>,
    /// The round's deliveries and refusals, counted against the run's max.
    settled_len: u64,
    /// Whether the run ends, drained, after the round.
    drained: bool,
}

/// What a run under `policy` does after the round of `events` that `log`
/// records, decided from them alone: flows lost to another relay, with a
/// conflict, or backing off are skipped for the rest of the run; under
/// `first-pending` any of these ends it.
fn round_end(policy: RelayPolicy, events: &[Envelope], log: &RoundLog) -> RoundEnd {
    let first_pending = policy == RelayPolicy::FirstPending;
    if log.lease_lost && first_pending {
        // Its one event would be picked again at once.
        return RoundEnd {
            hand_over: false,
            skip_flows: BTreeSet::new(),
            settled_len: 0,
            drained: true,
        };
    }
    let mut skip_flows: BTreeSet<FlowId> = BTreeSet::new();
    if log.lease_lost {
        skip_flows.extend(events.iter().map(|e| e.flow_id.clone()));
    }
    let conflicts = log.deliveries.iter().filter(|d| d.receipt.is_conflict());
    let conflict = conflicts.clone().next().is_some();
    skip_flows.extend(conflicts.map(|d| d.flow_id.clone()));
    if !log.failures.is_empty() {
        // The round's events back off; a fixed clock must not find them
        // due again in this run.
        let settled: BTreeSet<&EventId> = log.settled_ids().collect();
        let unsettled = events.iter().filter(|e| !settled.contains(&e.event_id));
        skip_flows.extend(unsettled.map(|e| e.flow_id.clone()));
    }
    RoundEnd {
        hand_over: true,
        skip_flows,
        settled_len: (log.deliveries.len() + log.refusals.len()) as u64,
        drained: first_pending && (conflict || !log.failures.is_empty()),
    }
}

/// Whether a round's bookkeeping was refused because another relay
/// claimed one of its flows ([`ErrorKind::LeaseLost`]).
fn lease_lost(error: &RelayError) -> bool {
    match error {
        RelayError::Store(e) => e.kind() == ErrorKind::LeaseLost,
        RelayError::FailureUnrecorded { recording, .. } => recording.kind() == ErrorKind::LeaseLost,
        _ => false,
    }
}

/// Delivers exactly one event, even one already accepted (its receipt is then
/// `duplicate`) or quarantined, and records its outcome.
pub fn relay_event<P, T>(
    producer: &mut P,
    transport: &mut T,
    event_id: &EventId,
    clock: &dyn Clock,
) -> Result<RelayReport, RelayError>
where
    P: ProducerStore + ?Sized,
    T: Transport + ?Sized,
{
    let record = producer
        .outbox_event(event_id)?
        .ok_or_else(|| RelayError::UnknownEvent(event_id.clone()))?;
    let mut log = RoundLog::default();
    let events = [record.envelope];
    let _round = round_span(&events).entered();
    deliver_round(
        producer,
        transport,
        &events,
        clock,
        &Backoff::default(),
        &mut log,
    )?;
    debug_assert!(log.accounts_for(&events), "a whole round is logged whole");
    Ok(RelayReport {
        transient_errors: log.failures.len() as u64,
        deliveries: log.deliveries,
        refusals: log.refusals,
        stop: RelayStop::Drained,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::EventType;
    use crate::ids::SchemaVersion;
    use Receipt::{Accepted, AfterConflict, Conflict, Duplicate};

    fn envelope(flow: &str, seq: i64) -> Envelope {
        let flow_id = FlowId::new(flow).unwrap();
        let seq = Seq::new(seq).unwrap();
        Envelope {
            event_id: EventId::for_seq(&flow_id, seq),
            flow_id,
            seq,
            schema_version: SchemaVersion::V1,
            event_type: EventType::new("noted").unwrap(),
            payload: serde_json::Map::new(),
            producer: crate::ProducerName::default(),
            headers: Default::default(),
        }
    }

    /// A round of `len` events, one flow each: `a`, `b`, `c`, ...
    fn round(len: usize) -> Vec<Envelope> {
        (0..len)
            .map(|i| envelope(&char::from(b'a' + i as u8).to_string(), 1))
            .collect()
    }

    const RUN_BACKOFF: Backoff = Backoff {
        base_ms: 100,
        cap_ms: 1_000,
        floor_ms: 50,
    };

    /// What a [`Bookkeeping`] writes, by event position in the round.
    #[derive(Debug, PartialEq, Eq, Default)]
    struct Writes {
        /// Events marked accepted, with the receipt that moved custody.
        marks: Vec<(usize, Receipt)>,
        /// Events quarantined, with the code of their last outcome.
        quarantines: Vec<(usize, &'static str)>,
        /// Events backing off, with the least wait in ms.
        backoff: Option<(Vec<usize>, u64)>,
        /// The length of the first half of a split round.
        split: Option<usize>,
        /// The error that ends the run.
        end: Option<String>,
    }

    fn writes(events: &[Envelope], bookkeeping: Bookkeeping) -> Writes {
        let position = |id: &EventId| events.iter().position(|e| e.event_id == *id).unwrap();
        let mut writes = Writes::default();
        match bookkeeping {
            Bookkeeping::Marks(marks) => {
                for (id, receipt) in recorded(&marks) {
                    match receipt {
                        Conflict => writes.quarantines.push((position(&id), "conflict")),
                        _ => writes.marks.push((position(&id), receipt)),
                    }
                }
            }
            Bookkeeping::Split { first_len } => writes.split = Some(first_len),
            Bookkeeping::Quarantine { index, reason, .. } => {
                writes.quarantines.push((index, reason.as_str()))
            }
            Bookkeeping::BackOff(back_off) => {
                assert_eq!(
                    (back_off.backoff.base_ms, back_off.backoff.cap_ms),
                    (100, 1_000)
                );
                let ids = back_off.event_ids.iter().map(position).collect();
                writes.backoff = Some((ids, back_off.backoff.floor_ms));
            }
            Bookkeeping::End(error) => writes.end = Some(error.to_string()),
        }
        writes
    }

    /// A consumer's answer to a round.
    type Answer = Result<Vec<Receipt>, TransportError>;

    fn transient(retry_after_ms: Option<u64>) -> TransportError {
        TransportError::Transient {
            kind: TransientKind::Busy,
            message: "busy".into(),
            retry_after_ms,
        }
    }

    /// Each answer of the consumer to a round, and what the relay writes
    /// for it: receipts mark or quarantine (conflict) every event in round
    /// order; a refusal quarantines one event; a transient failure backs
    /// every event off, waiting at least the consumer's `Retry-After`.
    #[test]
    fn an_answer_decides_the_writes_of_its_round() {
        let rejected = |index| TransportError::Rejected {
            index,
            message: "unreadable".into(),
        };
        let too_large = || TransportError::TooLarge {
            message: "413".into(),
        };
        let cases: Vec<(&str, usize, Answer, Writes)> = vec![
            ("no events", 0, Ok(vec![]), Writes::default()),
            (
                "all accepted",
                3,
                Ok(vec![Accepted, Accepted, Accepted]),
                Writes {
                    marks: vec![(0, Accepted), (1, Accepted), (2, Accepted)],
                    ..Writes::default()
                },
            ),
            (
                "mixed receipts",
                3,
                Ok(vec![Duplicate, Conflict, Accepted]),
                Writes {
                    marks: vec![(0, Duplicate), (2, Accepted)],
                    quarantines: vec![(1, "conflict")],
                    ..Writes::default()
                },
            ),
            (
                "a conflict, then its flow's later events",
                4,
                Ok(vec![Conflict, AfterConflict, AfterConflict, Accepted]),
                Writes {
                    marks: vec![(3, Accepted)],
                    quarantines: vec![(0, "conflict")],
                    ..Writes::default()
                },
            ),
            (
                "too large, several",
                3,
                Err(too_large()),
                Writes {
                    split: Some(1),
                    ..Writes::default()
                },
            ),
            (
                "too large, alone",
                1,
                Err(too_large()),
                Writes {
                    quarantines: vec![(0, "too_large")],
                    ..Writes::default()
                },
            ),
            (
                "rejected in the round",
                3,
                Err(rejected(2)),
                Writes {
                    quarantines: vec![(2, "rejected_by_consumer")],
                    ..Writes::default()
                },
            ),
            (
                "rejected past the round",
                3,
                Err(rejected(3)),
                Writes {
                    end: Some(
                        "the consumer refused the delivery: the consumer rejected event 3 \
                         of a round of 3: unreadable"
                            .into(),
                    ),
                    ..Writes::default()
                },
            ),
            (
                "transient, no Retry-After",
                2,
                Err(transient(None)),
                Writes {
                    backoff: Some((vec![0, 1], 50)),
                    ..Writes::default()
                },
            ),
            (
                "transient, Retry-After above the floor",
                2,
                Err(transient(Some(5_000))),
                Writes {
                    backoff: Some((vec![0, 1], 5_000)),
                    ..Writes::default()
                },
            ),
            (
                "transient, Retry-After below the floor",
                1,
                Err(transient(Some(10))),
                Writes {
                    backoff: Some((vec![0], 50)),
                    ..Writes::default()
                },
            ),
            (
                "refused",
                2,
                Err(TransportError::Refused {
                    message: "wrong key".into(),
                }),
                Writes {
                    end: Some("the consumer refused the delivery: wrong key".into()),
                    ..Writes::default()
                },
            ),
            (
                "a consumer of an earlier release",
                2,
                Err(TransportError::Skew {
                    message: "upgrade it".into(),
                }),
                Writes {
                    end: Some("version skew: upgrade it".into()),
                    ..Writes::default()
                },
            ),
            (
                "store error",
                2,
                Err(TransportError::Store(StoreError::new(
                    ErrorKind::Corrupt,
                    "inbox corrupt",
                ))),
                Writes {
                    end: Some("inbox corrupt".into()),
                    ..Writes::default()
                },
            ),
        ];
        for (name, events_len, answer, expected) in cases {
            let events = round(events_len);
            let decided = bookkeeping(&events, answer, &RUN_BACKOFF);
            assert_eq!(writes(&events, decided), expected, "{name}");
        }
    }

    #[test]
    #[should_panic(expected = "one receipt per event")]
    fn a_missing_receipt_is_refused() {
        bookkeeping(&round(2), Ok(vec![Accepted]), &RUN_BACKOFF);
    }

    fn delivered(event: &Envelope, receipt: Receipt) -> Delivery {
        Delivery {
            event_id: event.event_id.clone(),
            flow_id: event.flow_id.clone(),
            seq: event.seq,
            receipt,
        }
    }

    fn refused(event: &Envelope) -> Refusal {
        Refusal {
            event_id: event.event_id.clone(),
            flow_id: event.flow_id.clone(),
            seq: event.seq,
            reason: RefusalReason::TooLarge,
            message: "413".into(),
        }
    }

    fn failed(events_len: usize) -> RoundFailure {
        RoundFailure {
            kind: TransientKind::Busy,
            events_len,
            message: "busy".into(),
        }
    }

    fn flows(names: &[&str]) -> BTreeSet<FlowId> {
        names.iter().map(|n| FlowId::new(*n).unwrap()).collect()
    }

    /// The round of flows a, b, c, and what the run does after it: flows
    /// with a conflict, backing off or lost to another relay are skipped;
    /// under first-pending any of these ends the run, a lost lease before
    /// the round is handed over.
    #[test]
    fn a_round_decides_what_the_run_does_next() {
        use RelayPolicy::{Fair, FirstPending};
        let events = round(3);
        let [a, b, c] = [&events[0], &events[1], &events[2]];
        let log = |deliveries, refusals, failures, lease_lost| RoundLog {
            deliveries,
            refusals,
            failures,
            lease_lost,
        };
        let all_accepted = || {
            let deliveries = events.iter().map(|e| delivered(e, Accepted)).collect();
            log(deliveries, vec![], vec![], false)
        };
        let conflict_on_b = || {
            let deliveries = vec![delivered(a, Duplicate), delivered(b, Conflict)];
            log(deliveries, vec![refused(c)], vec![], false)
        };
        let b_c_back_off = || log(vec![delivered(a, Accepted)], vec![], vec![failed(2)], false);
        let a_refused_rest_back_off = || log(vec![], vec![refused(a)], vec![failed(2)], false);
        let lost_after_a = || log(vec![delivered(a, Accepted)], vec![], vec![], true);
        let end = |hand_over, skip: &[&str], settled_len, drained| RoundEnd {
            hand_over,
            skip_flows: flows(skip),
            settled_len,
            drained,
        };
        // (policy, log, then: hand over, skipped flows, settled, drained)
        let cases = [
            (Fair, all_accepted(), end(true, &[], 3, false)),
            (Fair, conflict_on_b(), end(true, &["b"], 3, false)),
            (Fair, b_c_back_off(), end(true, &["b", "c"], 1, false)),
            (
                Fair,
                a_refused_rest_back_off(),
                end(true, &["b", "c"], 1, false),
            ),
            (Fair, lost_after_a(), end(true, &["a", "b", "c"], 1, false)),
            (FirstPending, all_accepted(), end(true, &[], 3, false)),
            (FirstPending, conflict_on_b(), end(true, &["b"], 3, true)),
            (
                FirstPending,
                b_c_back_off(),
                end(true, &["b", "c"], 1, true),
            ),
            (FirstPending, lost_after_a(), end(false, &[], 0, true)),
        ];
        for (i, (policy, log, expected)) in cases.into_iter().enumerate() {
            assert_eq!(round_end(policy, &events, &log), expected, "case {i}");
        }
    }

    /// A round logged whole accounts for each of its events once.
    #[test]
    fn a_log_accounts_for_its_round() {
        let events = round(3);
        let [a, b] = [&events[0], &events[1]];
        let log = |deliveries, refusals, failures| RoundLog {
            deliveries,
            refusals,
            failures,
            lease_lost: false,
        };
        let whole = log(
            vec![delivered(a, Conflict)],
            vec![refused(b)],
            vec![failed(1)],
        );
        assert!(whole.accounts_for(&events));
        let twice = log(
            vec![delivered(a, Accepted)],
            vec![refused(a)],
            vec![failed(1)],
        );
        assert!(!twice.accounts_for(&events));
        let short = log(
            vec![delivered(a, Accepted), delivered(b, Accepted)],
            vec![],
            vec![],
        );
        assert!(!short.accounts_for(&events));
        let foreign = log(
            vec![delivered(&envelope("z", 1), Accepted)],
            vec![],
            vec![failed(2)],
        );
        assert!(!foreign.accounts_for(&events));
    }

    #[test]
    fn the_room_of_a_run_is_its_max_less_its_deliveries() {
        let cases = [
            (None, 7, Some(usize::MAX)),
            (Some(10), 3, Some(7)),
            (Some(10), 10, None),
            (Some(10), 11, None),
            (Some(0), 0, None),
        ];
        for (max, delivered, expected) in cases {
            assert_eq!(room_len(max, delivered), expected, "{max:?} {delivered}");
        }
    }
}
