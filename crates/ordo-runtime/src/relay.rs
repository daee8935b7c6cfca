//! The relay loop: rounds of the fair relay through a transport until
//! stopped.
//!
//! Invariant: the loop knows no transport; it sees receipts, refusals and
//! transient failures as [`Handover`]s, and stops only between rounds.

use std::sync::Arc;

use ordo_core::{
    relay_each, ErrorKind, Handover, ProducerStore, Receipt, RelayError, RelayOptions, RunStore,
    Signal, StoreError, TransientKind, Transport,
};

use super::{transient, Control, Held, Idle, RelayTotals, RunnerOptions};

/// One round of the relay loop, as its observer sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayRound {
    /// What the round did (`rounds` is 1).
    pub totals: RelayTotals,
    /// The kind of each transient failure of the round.
    pub failures: Vec<TransientKind>,
}

pub(super) struct RelayLoop<P, T, O> {
    pub(super) store: Held<P>,
    pub(super) transport: T,
    pub(super) options: RunnerOptions,
    pub(super) control: Arc<Control>,
    pub(super) signal: Signal,
    pub(super) observe: O,
}

impl<P, T, O> RelayLoop<P, T, O>
where
    P: ProducerStore + RunStore,
    T: Transport,
    O: FnMut(&RelayRound),
{
    pub(super) fn run(mut self) -> Result<(), StoreError> {
        let mut idle = Idle::new(&self.options);
        // Each round hands over at most one batch.
        let round_options = RelayOptions {
            max: Some(self.options.relay.batch_len_max.max(1) as u64),
            ..self.options.relay
        };
        let mut round_no = 0u64;
        while !self.control.stopping() {
            let seen = self.signal.generation();
            round_no += 1;
            let _span = tracing::debug_span!("relay_round", round = round_no).entered();
            let (this, lost) = self.round(&round_options)?;
            let worked = this.totals.rounds > 0;
            if worked || !this.failures.is_empty() {
                (self.observe)(&this);
            }
            self.control.update(|r| r.relay.add(&this.totals));
            if lost == Some(ErrorKind::ConnectionLost) && self.store.can_reopen() {
                let wait = self
                    .store
                    .failed(ErrorKind::ConnectionLost, &self.options.relay.backoff);
                self.signal.wait(seen, wait);
            } else if worked {
                self.store.succeeded();
                idle.reset();
            } else {
                idle.wait(&self.signal, seen, &mut self.store.store);
            }
        }
        Ok(())
    }

    /// One round of at most the batch's events: what it did, and the kind
    /// of a transient failure that ended it (a failure that is not
    /// transient ends the loop).
    fn round(
        &mut self,
        options: &RelayOptions,
    ) -> Result<(RelayRound, Option<ErrorKind>), StoreError> {
        let clock = self.store.store.clock();
        let mut this = RelayRound::default();
        let outcome = relay_each(
            &mut self.store.store,
            &mut self.transport,
            options,
            clock.as_ref(),
            |handover| this.note(handover),
        );
        let failed = match outcome {
            Ok(_) => None,
            Err(RelayError::FailureUnrecorded { recording, .. }) if transient(recording.kind()) => {
                Some(recording.kind())
            }
            Err(RelayError::Store(e)) if transient(e.kind()) => {
                tracing::warn!(error = %e, "relay round failed; retrying");
                Some(e.kind())
            }
            Err(RelayError::Store(e)) => return Err(e),
            Err(e) => return Err(StoreError::new(ErrorKind::Other, e.to_string())),
        };
        if failed.is_some() {
            this.totals.transient_errors += 1;
            this.failures.push(TransientKind::Busy);
        }
        let worked = this.totals.delivered > 0 || this.totals.refused > 0;
        this.totals.rounds = u64::from(worked);
        Ok((this, failed))
    }
}

impl RelayRound {
    /// Counts one handover of the round into its totals (a failure also
    /// by its kind).
    pub fn note(&mut self, handover: Handover<'_>) {
        let totals = &mut self.totals;
        match handover {
            Handover::Delivered(delivery) => {
                totals.delivered += 1;
                match delivery.receipt {
                    Receipt::Accepted => totals.accepted += 1,
                    Receipt::Duplicate => totals.duplicate += 1,
                    Receipt::Conflict | Receipt::AfterConflict => totals.conflict += 1,
                    Receipt::ProducerRewound => {
                        totals.conflict += 1;
                        totals.rewound += 1;
                    }
                }
            }
            Handover::Refused(_) => totals.refused += 1,
            Handover::Failed(failure) => {
                totals.transient_errors += 1;
                self.failures.push(failure.kind);
            }
        }
    }
}
