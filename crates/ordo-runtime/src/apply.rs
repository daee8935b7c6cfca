//! The apply loop: pages of flows with work, each drained through the
//! application's handler, until stopped.
//!
//! Invariant: the loop knows no domain; the handler decides every event.
//! An observed loop wraps the handler to see its verdicts and reads each
//! applied row's receive time inside the apply transaction.

use std::sync::Arc;

use ordo_core::{
    process_page, ApplyContext, ApplyHandler, BlockCode, Clock, DrainStop, Envelope, InboxFlow,
    RunConsumer, Signal, StoreError, Verdict,
};

use super::{transient, ApplyTotals, Control, Held, Idle, RunnerOptions};

/// One page of the apply loop, as its observer sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyRound {
    /// What the page did (`rounds` is 1 when it applied anything).
    pub totals: ApplyTotals,
    /// The code of each event the handler blocked in this page.
    pub blocked: Vec<BlockCode>,
    /// For each event applied, the time from its receipt to its apply.
    pub lags_ms: Vec<u64>,
}

pub(super) struct ApplyLoop<C: RunConsumer, H, O> {
    pub(super) store: Held<C>,
    pub(super) handler: Observed<C::Tx, H>,
    pub(super) options: RunnerOptions,
    pub(super) control: Arc<Control>,
    pub(super) signal: Signal,
    pub(super) observe: Option<O>,
}

impl<C, H, O> ApplyLoop<C, H, O>
where
    C: RunConsumer,
    H: ApplyHandler<C::Tx>,
    O: FnMut(&ApplyRound),
{
    pub(super) fn run(mut self) -> Result<(), StoreError> {
        let mut idle = Idle::new(&self.options);
        let mut after: Option<InboxFlow> = None;
        let mut pass_applied = 0u64;
        let mut page_no = 0u64;
        while !self.control.stopping() {
            let seen = self.signal.generation();
            page_no += 1;
            let _span = tracing::debug_span!("apply_page", page = page_no).entered();
            let page = match self.page(after.as_ref()) {
                Ok((page, next)) => {
                    self.store.succeeded();
                    after = next;
                    page
                }
                Err(e) if transient(e.kind()) => {
                    self.control.update(|r| r.apply.transient_errors += 1);
                    let wait = self.store.failed(e.kind(), &self.options.backoff);
                    self.signal.wait(seen, wait);
                    continue;
                }
                Err(e) => return Err(e),
            };
            pass_applied += page.applied;
            self.control.update(|r| r.apply.add(&page));
            self.report(page);
            if after.is_some() {
                continue; // the pass goes on with the next page
            }
            // A whole pass is done: wait only if it applied nothing (flows
            // that are blocked or gapped still list as having work).
            if pass_applied > 0 {
                idle.reset();
            } else {
                idle.wait(&self.signal, seen, &mut self.store.store);
            }
            pass_applied = 0;
        }
        Ok(())
    }

    /// One page of flows with work after `after`, drained: what it did,
    /// and where the pass goes on (`None`: the pass is done).
    fn page(
        &mut self,
        after: Option<&InboxFlow>,
    ) -> Result<(ApplyTotals, Option<InboxFlow>), StoreError> {
        let mut page = ApplyTotals::default();
        self.handler.seen = ApplyRound::default();
        let next = process_page(
            &mut self.store.store,
            after,
            None,
            &mut self.handler,
            self.options.apply_batch_len_max.max(1),
            |drain| {
                page.applied += drain.applied;
                page.blocked += u64::from(matches!(drain.stop, DrainStop::Blocked(_)));
            },
        )?;
        page.rounds = u64::from(page.applied > 0);
        Ok((page, next))
    }

    /// Hands a page that applied or blocked anything to the observer.
    fn report(&mut self, page: ApplyTotals) {
        let Some(observe) = self.observe.as_mut() else {
            return;
        };
        let mut round = std::mem::take(&mut self.handler.seen);
        if page.applied == 0 && round.blocked.is_empty() {
            return;
        }
        round.totals = ApplyTotals {
            blocked: round.blocked.len() as u64,
            ..page
        };
        observe(&round);
    }
}

/// The application's handler, with what it decided seen by the loop when
/// the loop is observed.
pub(super) struct Observed<Tx: ?Sized, H> {
    pub(super) handler: H,
    pub(super) clock: Option<Arc<dyn Clock>>,
    /// The store's read of when an event was received (see
    /// [`RunConsumer::received_at_ms`]).
    pub(super) received_at_ms: fn(&Tx, &Envelope) -> Result<Option<i64>, StoreError>,
    pub(super) seen: ApplyRound,
}

impl<Tx: ?Sized, H> Observed<Tx, H> {
    /// Records how long `event`, applied now, waited since its receipt.
    fn lag(&mut self, tx: &Tx, event: &Envelope) -> Result<(), StoreError> {
        let Some(clock) = &self.clock else {
            return Ok(());
        };
        if let Some(received_at_ms) = (self.received_at_ms)(tx, event)? {
            let lag_ms = clock.now_ms().saturating_sub(received_at_ms).max(0);
            self.seen.lags_ms.push(lag_ms as u64);
        }
        Ok(())
    }
}

impl<Tx: ?Sized, H: ApplyHandler<Tx>> ApplyHandler<Tx> for Observed<Tx, H> {
    /// The handler's own batch call; a block in it is seen when the store
    /// offers the events again one at a time.
    fn apply_all(
        &mut self,
        tx: &mut ApplyContext<'_, Tx>,
        events: &[Envelope],
    ) -> Result<Option<Verdict>, StoreError> {
        let verdict = self.handler.apply_all(tx, events)?;
        if verdict == Some(Verdict::Apply) {
            for event in events {
                self.lag(tx, event)?;
            }
        }
        Ok(verdict)
    }

    fn apply(
        &mut self,
        tx: &mut ApplyContext<'_, Tx>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        let verdict = self.handler.apply(tx, event)?;
        if self.clock.is_none() {
            return Ok(verdict);
        }
        match &verdict {
            Verdict::Apply => self.lag(tx, event)?,
            Verdict::Block(reason) => {
                tracing::info!(
                    event_id = %event.event_id, flow_id = %event.flow_id, producer = %event.producer,
                    seq = event.seq.get(), reason = %reason, "blocked"
                );
                self.seen.blocked.push(reason.code);
            }
        }
        Ok(verdict)
    }

    fn reevaluate(&self) -> &[BlockCode] {
        self.handler.reevaluate()
    }
}
