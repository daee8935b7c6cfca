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

use std::collections::BTreeSet;

use crate::backoff::Backoff;
use crate::clock::Clock;
use crate::crash;
use crate::envelope::Envelope;
use crate::error::{ErrorKind, RelayError};
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

/// The failures of one round that a run goes on after.
#[derive(Default)]
struct RoundLog {
    deliveries: Vec<Delivery>,
    refusals: Vec<Refusal>,
    failures: Vec<RoundFailure>,
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
    while !rest.is_empty() {
        crash::point(crash::RELAY_BEFORE_RECEIVE);
        match transport.deliver(&rest) {
            Ok(receipts) => return record(producer, &rest, &receipts, clock, log),
            Err(TransportError::TooLarge { .. }) if rest.len() > 1 => {
                let (first, second) = rest.split_at(rest.len() / 2);
                deliver_round(producer, transport, first, clock, backoff, log)?;
                return deliver_round(producer, transport, second, clock, backoff, log);
            }
            Err(TransportError::TooLarge { message }) => {
                let event = rest.remove(0);
                refuse(
                    producer,
                    event,
                    RefusalReason::TooLarge,
                    message,
                    clock,
                    log,
                )?;
            }
            Err(TransportError::Rejected { index, message }) if index < rest.len() => {
                let event = rest.remove(index);
                let reason = RefusalReason::RejectedByConsumer;
                refuse(producer, event, reason, message, clock, log)?;
            }
            Err(TransportError::Rejected { index, message }) => {
                return Err(RelayError::Refused(format!(
                    "the consumer rejected event {index} of a round of {}: {message}",
                    rest.len()
                )));
            }
            Err(TransportError::Transient {
                kind,
                message,
                retry_after_ms,
            }) => {
                let backoff = Backoff {
                    floor_ms: backoff.floor_ms.max(retry_after_ms.unwrap_or(0)),
                    ..*backoff
                };
                let ids: Vec<EventId> = rest.iter().map(|e| e.event_id.clone()).collect();
                let recorded = producer.record_failure(&ids, &message, clock.now_ms(), &backoff);
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
                    events = rest.len(),
                    "a round failed transiently; its events back off: {message}"
                );
                log.failures.push(RoundFailure {
                    kind,
                    events_len: rest.len(),
                    message,
                });
                return Ok(());
            }
            Err(TransportError::Refused { message }) => return Err(RelayError::Refused(message)),
            Err(TransportError::Store(error)) => return Err(RelayError::Store(error)),
        }
    }
    Ok(())
}

/// Records the receipts of a round in one producer transaction.
fn record<P>(
    producer: &mut P,
    events: &[Envelope],
    receipts: &[Receipt],
    clock: &dyn Clock,
    log: &mut RoundLog,
) -> Result<(), RelayError>
where
    P: ProducerStore + ?Sized,
{
    assert_eq!(receipts.len(), events.len(), "one receipt per event");
    crash::point(crash::RELAY_AFTER_RECEIVE);
    let outcomes: Vec<(EventId, Receipt)> = events
        .iter()
        .zip(receipts)
        .map(|(e, r)| (e.event_id.clone(), *r))
        .collect();
    producer.record_receipts(&outcomes, clock.now_ms())?;
    log.deliveries.extend(
        events
            .iter()
            .zip(receipts)
            .map(|(event, receipt)| Delivery {
                event_id: event.event_id.clone(),
                flow_id: event.flow_id.clone(),
                seq: event.seq,
                receipt: *receipt,
            }),
    );
    Ok(())
}

/// Quarantines an event the consumer refused to store.
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
    tracing::warn!(
        event_id = %event.event_id, flow_id = %event.flow_id, seq = event.seq.get(),
        reason = reason.as_str(), "the consumer refused the event; quarantining it: {message}"
    );
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
/// ([`RelayError::Refused`]) or another store error ends the run, the
/// rounds before it recorded.
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
    let batch_len_max = options.batch_len_max.max(1);
    let mut delivered = 0u64;
    let mut skipped: BTreeSet<FlowId> = BTreeSet::new();
    loop {
        let room = match options.max {
            Some(max) if delivered >= max => return Ok(RelayStop::Max),
            Some(max) => usize::try_from(max - delivered).unwrap_or(usize::MAX),
            None => usize::MAX,
        };
        let events = match options.policy {
            RelayPolicy::FirstPending => producer
                .oldest_unaccepted(clock.now_ms())?
                .into_iter()
                .collect(),
            RelayPolicy::Fair => producer.fair_round_deep(
                batch_len_max.min(room),
                options.flow_events_max.max(1),
                &skipped,
                clock.now_ms(),
            )?,
        };
        if events.is_empty() {
            return Ok(RelayStop::Drained);
        }
        let mut log = RoundLog::default();
        let round = deliver_round(
            producer,
            transport,
            &events,
            clock,
            &options.backoff,
            &mut log,
        );
        match round {
            Ok(()) => {}
            Err(error) if lease_lost(&error) => {
                // Another relay claimed flows of this round while it was
                // delivered: their bookkeeping is that relay's now (what
                // reached the consumer is answered duplicate to it).
                tracing::info!("another relay took over flows of a round: {error}");
                if options.policy == RelayPolicy::FirstPending {
                    // Its one event would be picked again at once.
                    return Ok(RelayStop::Drained);
                }
                skipped.extend(events.iter().map(|e| e.flow_id.clone()));
            }
            Err(error) => return Err(error),
        }
        let mut conflict = false;
        for delivery in &log.deliveries {
            tracing::debug!(
                event_id = %delivery.event_id, flow_id = %delivery.flow_id,
                seq = delivery.seq.get(), receipt = delivery.receipt.as_str(), "delivered"
            );
            if delivery.receipt == Receipt::Conflict {
                conflict = true;
                skipped.insert(delivery.flow_id.clone());
            }
            each(Handover::Delivered(delivery));
        }
        log.refusals.iter().for_each(|r| each(Handover::Refused(r)));
        log.failures.iter().for_each(|f| each(Handover::Failed(f)));
        if !log.failures.is_empty() {
            // The round's events back off; a fixed clock must not find them
            // due again in this run.
            let settled: BTreeSet<&EventId> = log
                .deliveries
                .iter()
                .map(|d| &d.event_id)
                .chain(log.refusals.iter().map(|r| &r.event_id))
                .collect();
            skipped.extend(
                events
                    .iter()
                    .filter(|e| !settled.contains(&e.event_id))
                    .map(|e| e.flow_id.clone()),
            );
            if options.policy == RelayPolicy::FirstPending {
                return Ok(RelayStop::Drained);
            }
        }
        delivered += (log.deliveries.len() + log.refusals.len()) as u64;
        if conflict && options.policy == RelayPolicy::FirstPending {
            return Ok(RelayStop::Drained);
        }
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
    deliver_round(
        producer,
        transport,
        &events,
        clock,
        &Backoff::default(),
        &mut log,
    )?;
    Ok(RelayReport {
        transient_errors: log.failures.len() as u64,
        deliveries: log.deliveries,
        refusals: log.refusals,
        stop: RelayStop::Drained,
    })
}
