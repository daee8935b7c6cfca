//! The effects loop: executor rounds over one consumer store, until
//! stopped.
//!
//! Invariant: a round claims, calls and records before the loop looks at
//! the stop flag again, so a stop never leaves an outcome half-recorded;
//! an intent whose call was in progress is recorded by its round, and one
//! the process did not reach is left to its lease (EFFECTS.md).

use std::sync::Arc;

use ordo_core::effect::EffectStore;
use ordo_core::{RunStore, Signal, StoreError};

use super::effects::{EffectRound, Executor};
use super::{transient, Control, Held, Idle, RunnerOptions};

pub(super) struct EffectsLoop<C, O> {
    pub(super) store: Held<C>,
    pub(super) executor: Executor,
    pub(super) options: RunnerOptions,
    pub(super) control: Arc<Control>,
    pub(super) signal: Signal,
    pub(super) observe: O,
}

impl<C, O> EffectsLoop<C, O>
where
    C: EffectStore + RunStore,
    O: FnMut(&EffectRound),
{
    pub(super) fn run(mut self) -> Result<(), StoreError> {
        let mut idle = Idle::new(&self.options);
        while !self.control.stopping() {
            let seen = self.signal.generation();
            let round = match self.executor.run_once(&mut self.store.store) {
                Ok(round) => {
                    self.store.succeeded();
                    round
                }
                Err(e) if transient(e.kind()) => {
                    self.control.update(|r| r.effect_transient_errors += 1);
                    let wait = self.store.failed(e.kind(), &self.options.backoff);
                    self.signal.wait(seen, wait);
                    continue;
                }
                Err(e) => return Err(e),
            };
            self.control.update(|r| r.effects.add(&round));
            if round == EffectRound::default() {
                idle.wait(&self.signal, seen, &mut self.store.store);
            } else {
                (self.observe)(&round);
                idle.reset();
            }
        }
        Ok(())
    }
}
