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
use crate::store::{ConsumerStore, ProducerStore};

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
    /// Backoff for transient failures.
    pub backoff: Backoff,
}

impl Default for RelayOptions {
    fn default() -> Self {
        RelayOptions {
            policy: RelayPolicy::Fair,
            max: None,
            batch_len_max: BATCH_LEN_DEFAULT,
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
    /// Why the run ended.
    pub stop: RelayStop,
}

/// Whether a consumer failure is worth retrying later.
pub fn is_transient(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::Busy | ErrorKind::ConnectionLost)
}

/// Hands `events` to the consumer in one transaction and records every
/// receipt in one producer transaction.
fn deliver_round<P, C>(
    producer: &mut P,
    consumer: &mut C,
    events: &[Envelope],
    clock: &dyn Clock,
    backoff: &Backoff,
) -> Result<Vec<Delivery>, RelayError>
where
    P: ProducerStore + ?Sized,
    C: ConsumerStore + ?Sized,
{
    crash::point(crash::RELAY_BEFORE_RECEIVE);
    let receipts = match consumer.receive_batch(events) {
        Ok(receipts) => receipts,
        Err(error) => {
            if is_transient(error.kind()) {
                let ids: Vec<EventId> = events.iter().map(|e| e.event_id.clone()).collect();
                let recorded =
                    producer.record_failure(&ids, &error.to_string(), clock.now_ms(), backoff);
                if let Err(recording) = recorded {
                    return Err(RelayError::FailureUnrecorded {
                        delivery: error,
                        recording,
                    });
                }
            }
            return Err(RelayError::Store(error));
        }
    };
    assert_eq!(receipts.len(), events.len(), "one receipt per event");
    crash::point(crash::RELAY_AFTER_RECEIVE);
    let outcomes: Vec<(EventId, Receipt)> = events
        .iter()
        .zip(&receipts)
        .map(|(e, r)| (e.event_id.clone(), *r))
        .collect();
    producer.record_receipts(&outcomes, clock.now_ms())?;
    Ok(events
        .iter()
        .zip(receipts)
        .map(|(event, receipt)| Delivery {
            event_id: event.event_id.clone(),
            flow_id: event.flow_id.clone(),
            seq: event.seq,
            receipt,
        })
        .collect())
}

/// Relays under `options` until nothing may be delivered in this run or
/// `options.max` deliveries were made, and returns every delivery. Memory
/// grows with the deliveries; [`relay_each`] keeps it bounded.
pub fn relay<P, C>(
    producer: &mut P,
    consumer: &mut C,
    options: &RelayOptions,
    clock: &dyn Clock,
) -> Result<RelayReport, RelayError>
where
    P: ProducerStore + ?Sized,
    C: ConsumerStore + ?Sized,
{
    let mut deliveries = Vec::new();
    let stop = relay_each(producer, consumer, options, clock, |d| {
        deliveries.push(d.clone())
    })?;
    Ok(RelayReport { deliveries, stop })
}

/// [`relay`] handing each delivery to `each` as its round is recorded,
/// instead of collecting them: memory stays bounded by one round
/// (`options.batch_len_max` events) however long the run.
pub fn relay_each<P, C>(
    producer: &mut P,
    consumer: &mut C,
    options: &RelayOptions,
    clock: &dyn Clock,
    mut each: impl FnMut(&Delivery),
) -> Result<RelayStop, RelayError>
where
    P: ProducerStore + ?Sized,
    C: ConsumerStore + ?Sized,
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
            RelayPolicy::Fair => {
                producer.fair_round(batch_len_max.min(room), &skipped, clock.now_ms())?
            }
        };
        if events.is_empty() {
            return Ok(RelayStop::Drained);
        }
        let round = deliver_round(producer, consumer, &events, clock, &options.backoff)?;
        let mut conflict = false;
        for delivery in &round {
            if delivery.receipt == Receipt::Conflict {
                conflict = true;
                skipped.insert(delivery.flow_id.clone());
            }
            each(delivery);
        }
        delivered += round.len() as u64;
        if conflict && options.policy == RelayPolicy::FirstPending {
            return Ok(RelayStop::Drained);
        }
    }
}

/// Delivers exactly one event, even one already accepted (its receipt is then
/// `duplicate`) or quarantined, and records its receipt.
pub fn relay_event<P, C>(
    producer: &mut P,
    consumer: &mut C,
    event_id: &EventId,
    clock: &dyn Clock,
) -> Result<RelayReport, RelayError>
where
    P: ProducerStore + ?Sized,
    C: ConsumerStore + ?Sized,
{
    let record = producer
        .outbox_event(event_id)?
        .ok_or_else(|| RelayError::UnknownEvent(event_id.clone()))?;
    let deliveries = deliver_round(
        producer,
        consumer,
        &[record.envelope],
        clock,
        &Backoff::default(),
    )?;
    Ok(RelayReport {
        deliveries,
        stop: RelayStop::Drained,
    })
}
