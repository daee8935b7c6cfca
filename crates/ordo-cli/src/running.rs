//! Starting the runtime's loops for the follow modes and `serve --apply`,
//! on either backend: one `ordo_runtime::Runner` whatever the store, which
//! opens a PostgreSQL store again after a lost connection. A leaf: it
//! imports no command.
//!
//! Invariant: a loop stops only between rounds (see `ordo_runtime`).

use ordo_core::{StoreError, Transport};
use ordo_reservation::ReservationHandler;
use ordo_runtime::{ApplyRound, RelayRound, Runner, RunnerOptions};

use crate::context::existing_spec;
use crate::stores::{AnyConsumer, AnyProducer, Location};

/// Starts the relay loop of `producer` (opened from `location`) through
/// `transport`, each round that did anything shown to `observe`.
pub fn start_relay<T, O>(
    producer: AnyProducer,
    location: &Location,
    transport: T,
    options: RunnerOptions,
    observe: O,
) -> std::io::Result<Runner>
where
    T: Transport + Send + 'static,
    O: FnMut(&RelayRound) + Send + 'static,
{
    let mut runner = Runner::new(options);
    existing_spec().spawn_relay(&mut runner, location, producer, transport, observe)?;
    Ok(runner)
}

/// Starts the apply loop of the reservation domain on `consumer` (opened
/// from `location`), each page that applied or blocked anything shown to
/// `observe`.
pub fn start_apply(
    consumer: AnyConsumer,
    location: &Location,
    handler: ReservationHandler,
    batch_len_max: u64,
    observe: impl FnMut(&ApplyRound) + Send + 'static,
) -> std::io::Result<Runner> {
    let mut runner = Runner::new(RunnerOptions {
        apply_batch_len_max: batch_len_max,
        ..RunnerOptions::default()
    });
    existing_spec().spawn_apply(&mut runner, location, consumer, handler, observe)?;
    Ok(runner)
}

/// Stops the loops after their rounds and logs what they did; the first
/// failure that ended one.
pub fn stop(runner: Runner) -> Result<(), StoreError> {
    let report = runner.stop()?;
    tracing::info!(
        relay_rounds = report.relay.rounds,
        delivered = report.relay.delivered,
        apply_rounds = report.apply.rounds,
        applied = report.apply.applied,
        "loops stopped"
    );
    Ok(())
}
