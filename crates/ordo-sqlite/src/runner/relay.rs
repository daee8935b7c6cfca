//! The relay loop: rounds of the fair relay through a transport until
//! stopped.
//!
//! Invariant: the loop knows no transport; it sees receipts, refusals and
//! transient failures as [`Handover`]s, and stops only between rounds.

use std::sync::Arc;

use ordo_core::{
    relay_each, Clock, ErrorKind, Handover, Receipt, RelayError, RelayOptions, StoreError,
    TransientKind, Transport,
};

use super::{Control, Idle, RelayTotals, RunnerOptions};
use crate::wake::Signal;
use crate::ProducerDb;

/// One round of the relay loop, as its observer sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayRound {
    /// What the round did (`rounds` is 1).
    pub totals: RelayTotals,
    /// The kind of each transient failure of the round.
    pub failures: Vec<TransientKind>,
}

pub(super) struct RelayLoop<T, O> {
    pub(super) producer: ProducerDb,
    pub(super) transport: T,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) options: RunnerOptions,
    pub(super) control: Arc<Control>,
    pub(super) signal: Signal,
    pub(super) observe: O,
}

impl<T: Transport, O: FnMut(&RelayRound)> RelayLoop<T, O> {
    pub(super) fn run(mut self) -> Result<(), StoreError> {
        let mut idle = Idle::new(&self.options);
        let round = RelayOptions {
            max: Some(self.options.relay.batch_len_max.max(1) as u64),
            ..self.options.relay
        };
        let mut round_no = 0u64;
        while !self.control.stopping() {
            let seen = self.signal.generation();
            let mut this = RelayRound::default();
            round_no += 1;
            let _span = tracing::debug_span!("relay_round", round = round_no).entered();
            let outcome = relay_each(
                &mut self.producer,
                &mut self.transport,
                &round,
                self.clock.as_ref(),
                |handover| this.note(handover),
            );
            match outcome {
                Ok(_) => {}
                Err(RelayError::FailureUnrecorded { recording, .. })
                    if transient(recording.kind()) =>
                {
                    this.totals.transient_errors += 1;
                    this.failures.push(TransientKind::Busy);
                }
                Err(RelayError::Store(e)) if transient(e.kind()) => {
                    this.totals.transient_errors += 1;
                    this.failures.push(TransientKind::Busy);
                }
                Err(RelayError::Store(e)) => return Err(e),
                Err(e) => return Err(StoreError::new(ErrorKind::Other, e.to_string())),
            }
            let worked = this.totals.delivered > 0 || this.totals.refused > 0;
            this.totals.rounds = u64::from(worked);
            if worked || !this.failures.is_empty() {
                (self.observe)(&this);
            }
            self.control.update(|r| r.relay.add(&this.totals));
            if worked {
                idle.reset();
            } else {
                idle.wait(&self.signal, seen);
            }
        }
        Ok(())
    }
}

fn transient(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::Busy | ErrorKind::ConnectionLost)
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
                    Receipt::Conflict => totals.conflict += 1,
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
