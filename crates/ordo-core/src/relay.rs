//! The relay: hands outbox events to the consumer and marks them accepted
//! only after a receipt that moves custody.

use crate::crash;
use crate::envelope::Envelope;
use crate::error::RelayError;
use crate::ids::{EventId, FlowId, Seq};
use crate::outcome::Receipt;
use crate::store::{ConsumerStore, ProducerStore};

/// Which unaccepted events a relay run picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RelayPolicy {
    /// Always the oldest unaccepted event; a conflict on it ends the run, so a
    /// permanent conflict starves every later event (the seed's behaviour).
    #[default]
    FirstPending,
}

impl RelayPolicy {
    /// The policy's name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            RelayPolicy::FirstPending => "first-pending",
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

fn deliver<P, C>(
    producer: &mut P,
    consumer: &mut C,
    event: &Envelope,
) -> Result<Delivery, RelayError>
where
    P: ProducerStore + ?Sized,
    C: ConsumerStore + ?Sized,
{
    crash::point(crash::RELAY_BEFORE_RECEIVE);
    let receipt = consumer.receive(event)?;
    crash::point(crash::RELAY_AFTER_RECEIVE);
    if receipt.moves_custody() {
        producer.mark_accepted(std::slice::from_ref(&event.event_id))?;
    }
    Ok(Delivery {
        event_id: event.event_id.clone(),
        flow_id: event.flow_id.clone(),
        seq: event.seq,
        receipt,
    })
}

/// Relays under `policy` until nothing may be delivered or `max` deliveries
/// (conflicts included) were made. `max = None` means no bound other than
/// the outbox itself.
pub fn relay<P, C>(
    producer: &mut P,
    consumer: &mut C,
    policy: RelayPolicy,
    max: Option<u64>,
) -> Result<RelayReport, RelayError>
where
    P: ProducerStore + ?Sized,
    C: ConsumerStore + ?Sized,
{
    let RelayPolicy::FirstPending = policy;
    let mut deliveries = Vec::new();
    loop {
        if max.is_some_and(|max| deliveries.len() as u64 >= max) {
            return Ok(RelayReport {
                deliveries,
                stop: RelayStop::Max,
            });
        }
        let Some(event) = producer.pending(1)?.into_iter().next() else {
            return Ok(RelayReport {
                deliveries,
                stop: RelayStop::Drained,
            });
        };
        let delivery = deliver(producer, consumer, &event)?;
        let conflict = delivery.receipt == Receipt::Conflict;
        deliveries.push(delivery);
        if conflict {
            return Ok(RelayReport {
                deliveries,
                stop: RelayStop::Drained,
            });
        }
    }
}

/// Delivers exactly one event, even one already accepted (its receipt is then
/// `duplicate`), and marks it accepted if the receipt moves custody.
pub fn relay_event<P, C>(
    producer: &mut P,
    consumer: &mut C,
    event_id: &EventId,
) -> Result<RelayReport, RelayError>
where
    P: ProducerStore + ?Sized,
    C: ConsumerStore + ?Sized,
{
    let record = producer
        .outbox_event(event_id)?
        .ok_or_else(|| RelayError::UnknownEvent(event_id.clone()))?;
    let delivery = deliver(producer, consumer, &record.envelope)?;
    Ok(RelayReport {
        deliveries: vec![delivery],
        stop: RelayStop::Drained,
    })
}
