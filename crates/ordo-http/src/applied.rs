//! The apply metrics of an applier running beside the server (`serve
//! --apply`): a handler wrapper that counts blocks by code and observes the
//! lag from receive to apply.
//!
//! The lag is known for events this process received ([`ReceiveTimes`],
//! filled by the inbox around every receive and kept for the `accepted`
//! receipts, bounded), and is
//! observed when the handler applies the event, once per event. A handler
//! call can still be undone (a later failure in its transaction), so the
//! histogram and the block counts follow the handler's decisions; the
//! count of applied events should come from committed totals
//! (`ordo_sqlite::Runner::report` in the CLI), not from here.
//!
//! Invariant: the wrapper never changes a verdict, never writes and never
//! reads the store; it only watches the inner handler's answers.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ordo_core::{ApplyHandler, BlockCode, Envelope, EventId, Receipt, StoreError, Verdict};

use crate::Metrics;

/// The most events whose receive time or block is remembered.
pub const REMEMBERED_MAX: usize = 100_000;

/// Up to [`REMEMBERED_MAX`] events by id, oldest forgotten first.
#[derive(Debug)]
struct Bounded<V> {
    values: HashMap<EventId, V>,
    order: VecDeque<EventId>,
}

impl<V> Default for Bounded<V> {
    fn default() -> Self {
        Bounded {
            values: HashMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<V> Bounded<V> {
    fn insert(&mut self, id: EventId, value: V) -> bool {
        if self.values.contains_key(&id) {
            return false;
        }
        if self.order.len() == REMEMBERED_MAX {
            if let Some(oldest) = self.order.pop_front() {
                self.values.remove(&oldest);
            }
        }
        self.order.push_back(id.clone());
        self.values.insert(id, value);
        true
    }

    fn remove(&mut self, id: &EventId) -> Option<V> {
        // The id stays in `order` until it ages out; it is then a no-op.
        self.values.remove(id)
    }
}

/// When this process stored each recent event: the start of the receive
/// transaction that answered `accepted` for it.
#[derive(Debug, Default)]
pub struct ReceiveTimes {
    received: Mutex<Bounded<Instant>>,
}

impl ReceiveTimes {
    /// Notes the time before a receive of `envelopes`: an applier woken by
    /// the commit may apply them before [`ReceiveTimes::settle`] runs.
    pub fn expect(&self, envelopes: &[Envelope]) {
        let now = Instant::now();
        let mut received = self.lock();
        for envelope in envelopes {
            received.insert(envelope.event_id.clone(), now);
        }
    }

    /// Forgets the times of events the receive did not accept (all of
    /// them when it failed).
    pub fn settle(&self, envelopes: &[Envelope], receipts: Option<&[Receipt]>) {
        let mut received = self.lock();
        for (index, envelope) in envelopes.iter().enumerate() {
            let receipt = receipts.and_then(|r| r.get(index));
            if receipt != Some(&Receipt::Accepted) {
                received.remove(&envelope.event_id);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bounded<Instant>> {
        self.received.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take(&self, id: &EventId) -> Option<Instant> {
        self.lock().remove(id)
    }
}

/// An [`ApplyHandler`] that reports the inner handler's verdicts to
/// [`Metrics`] (`ordo_apply_blocked_total{reason}`, each event once;
/// `ordo_apply_lag_seconds`).
pub struct MeteredHandler<H> {
    inner: H,
    metrics: Arc<Metrics>,
    times: Arc<ReceiveTimes>,
    blocked: Bounded<()>,
}

impl<H> MeteredHandler<H> {
    /// Wraps `inner`.
    pub fn new(inner: H, metrics: Arc<Metrics>, times: Arc<ReceiveTimes>) -> MeteredHandler<H> {
        MeteredHandler {
            inner,
            metrics,
            times,
            blocked: Bounded::default(),
        }
    }

    fn observe(&mut self, event: &Envelope, verdict: &Verdict) {
        match verdict {
            Verdict::Apply => {
                if let Some(received) = self.times.take(&event.event_id) {
                    let lag = received.elapsed().as_secs_f64();
                    self.metrics.apply_lag_seconds.observe(lag);
                }
            }
            Verdict::Block(reason) => {
                if self.blocked.insert(event.event_id.clone(), ()) {
                    self.metrics
                        .apply_blocked_total
                        .with_label_values(&[reason.code.as_str()])
                        .inc();
                }
            }
        }
    }
}

impl<Tx: ?Sized, H: ApplyHandler<Tx>> ApplyHandler<Tx> for MeteredHandler<H> {
    fn apply(&mut self, tx: &Tx, event: &Envelope) -> Result<Verdict, StoreError> {
        let verdict = self.inner.apply(tx, event)?;
        self.observe(event, &verdict);
        Ok(verdict)
    }

    fn reevaluate(&self) -> &[BlockCode] {
        self.inner.reevaluate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_core::{BlockReason, FlowId, SchemaVersion, Seq};

    fn event(id: &str) -> Envelope {
        Envelope {
            event_id: EventId::new(id).unwrap(),
            flow_id: FlowId::new("f").unwrap(),
            seq: Seq::new(1).unwrap(),
            schema_version: SchemaVersion::V1,
            event_type: ordo_core::EventType::new("t").unwrap(),
            payload: Default::default(),
        }
    }

    #[test]
    fn blocks_count_once_per_event_and_lag_once_per_received_event() {
        let metrics = Arc::new(Metrics::new());
        let times = Arc::new(ReceiveTimes::default());
        let (a, b) = (event("a"), event("b"));
        let both = [a.clone(), b.clone()];
        times.expect(&both);
        times.settle(&both, Some(&[Receipt::Accepted, Receipt::Duplicate]));
        let code = BlockCode::new("nope").unwrap();
        let verdict_of_b = Verdict::Block(BlockReason::code(code));
        let mut handler = MeteredHandler::new(
            move |_: &(), e: &Envelope| {
                Ok(if e.event_id.as_str() == "a" {
                    Verdict::Apply
                } else {
                    verdict_of_b.clone()
                })
            },
            metrics.clone(),
            times,
        );
        for _ in 0..2 {
            handler.apply(&(), &a).unwrap();
            handler.apply(&(), &b).unwrap();
        }
        assert_eq!(metrics.apply_lag_seconds.get_sample_count(), 1);
        assert_eq!(
            metrics
                .apply_blocked_total
                .with_label_values(&["nope"])
                .get(),
            1
        );
    }
}
