//! The follow modes' loops for stores that `ordo_sqlite::Runner` does not
//! run (a PostgreSQL producer or consumer): the same rounds, observed the
//! same way, on a thread each, finding work by polling (from 1 ms,
//! doubling up to 1 s while idle). A leaf: it imports no command.
//!
//! Invariant: a loop stops only between rounds, so every round it started
//! has committed or rolled back whole when [`Loops::stop`] returns. A lost
//! connection is transient: the store is opened again before the next
//! round.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ordo_core::{
    process_page, relay_each, ApplyHandler, Backoff, BlockCode, Clock, Envelope, ErrorKind, FlowId,
    RelayError, RelayOptions, StoreError, Transport, Verdict,
};
use ordo_postgres::{PgConsumer, PgTx};
use ordo_reservation::ReservationHandler;
use ordo_sqlite::{ApplyRound, RelayRound, Runner, RunnerOptions};

use crate::context::existing_consumer;
use crate::stores::{AnyConsumer, AnyProducer, Location};

/// The longest wait of an idle loop.
const POLL_MS_MAX: u64 = 1_000;
/// How often a waiting loop looks at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(50);

/// Opens a store again after its connection was lost.
pub type Reopen<S> = Box<dyn FnMut() -> Result<S, StoreError> + Send>;

/// The loops of one process, stopped together.
#[derive(Default)]
pub struct Loops {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Result<(), StoreError>>>,
}

impl Loops {
    /// Starts the relay loop: rounds of at most `options.batch_len_max`
    /// events through `transport`, each shown to `observe` when it did
    /// anything or failed transiently.
    pub fn spawn_relay<T, O>(
        &mut self,
        producer: AnyProducer,
        reopen: Reopen<AnyProducer>,
        transport: T,
        options: RelayOptions,
        clock: Arc<dyn Clock>,
        observe: O,
    ) -> std::io::Result<()>
    where
        T: Transport + Send + 'static,
        O: FnMut(&RelayRound) + Send + 'static,
    {
        let stop = Arc::clone(&self.stop);
        let body = move || relay_loop(producer, reopen, transport, options, clock, stop, observe);
        self.spawn("ordo-relay", body)
    }

    /// Starts the apply loop: pages of flows with work, at most
    /// `batch_len_max` events per transaction, each page that applied or
    /// blocked anything shown to `observe`.
    pub fn spawn_apply<H, O>(
        &mut self,
        consumer: PgConsumer,
        reopen: Reopen<PgConsumer>,
        handler: H,
        batch_len_max: u64,
        observe: O,
    ) -> std::io::Result<()>
    where
        H: ApplyHandler<PgTx> + Send + 'static,
        O: FnMut(&ApplyRound) + Send + 'static,
    {
        let stop = Arc::clone(&self.stop);
        let body = move || apply_loop(consumer, reopen, handler, batch_len_max, stop, observe);
        self.spawn("ordo-apply", body)
    }

    fn spawn(
        &mut self,
        name: &str,
        body: impl FnOnce() -> Result<(), StoreError> + Send + 'static,
    ) -> std::io::Result<()> {
        let thread = std::thread::Builder::new().name(name.into()).spawn(body)?;
        self.threads.push(thread);
        Ok(())
    }

    /// Whether a loop has ended on its own (by a failure that is not
    /// transient); [`Loops::stop`] returns it.
    pub fn failed(&self) -> bool {
        self.threads.iter().any(JoinHandle::is_finished)
    }

    /// Asks every loop to stop after its round, waits, and returns the
    /// first failure that ended a loop.
    pub fn stop(mut self) -> Result<(), StoreError> {
        self.stop.store(true, Ordering::Release);
        let mut first = None;
        for thread in self.threads.drain(..) {
            let outcome = thread
                .join()
                .unwrap_or_else(|_| Err(StoreError::new(ErrorKind::Other, "a loop panicked")));
            if let Err(e) = outcome {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for Loops {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// The loops of a follow mode or of `serve --apply`: the SQLite runner's,
/// or these.
pub enum Running {
    /// `ordo_sqlite::Runner` (SQLite files, woken by this process's commits).
    Runner(Runner),
    /// [`Loops`] (PostgreSQL, polling).
    Loops(Loops),
}

impl Running {
    /// Whether a loop has ended on its own.
    pub fn failed(&self) -> bool {
        match self {
            Running::Runner(runner) => runner.failed(),
            Running::Loops(loops) => loops.failed(),
        }
    }

    /// Stops the loops after their rounds; the first failure that ended one.
    pub fn stop(self) -> Result<(), StoreError> {
        match self {
            Running::Runner(runner) => {
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
            Running::Loops(loops) => {
                loops.stop()?;
                tracing::info!("loops stopped");
                Ok(())
            }
        }
    }
}

/// Starts the apply loop of the reservation domain on `consumer` (opened
/// from `location`): the runner's on an SQLite file, a polling loop on
/// PostgreSQL.
pub fn start_apply(
    consumer: AnyConsumer,
    location: &Location,
    handler: ReservationHandler,
    batch_len_max: u64,
    observe: impl FnMut(&ApplyRound) + Send + 'static,
) -> std::io::Result<Running> {
    match consumer {
        AnyConsumer::Sqlite(consumer) => {
            let mut runner = Runner::new(RunnerOptions {
                apply_batch_len_max: batch_len_max,
                ..RunnerOptions::default()
            });
            runner.spawn_apply_observed(consumer, handler, observe)?;
            Ok(Running::Runner(runner))
        }
        AnyConsumer::Postgres(consumer) => {
            let location = location.clone();
            let reopen = Box::new(move || match existing_consumer(&location)? {
                AnyConsumer::Postgres(consumer) => Ok(consumer),
                AnyConsumer::Sqlite(_) => unreachable!("a URL opens a PostgreSQL store"),
            });
            let mut loops = Loops::default();
            loops.spawn_apply(consumer, reopen, handler, batch_len_max, observe)?;
            Ok(Running::Loops(loops))
        }
    }
}

fn transient(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::Busy | ErrorKind::ConnectionLost)
}

/// Waits `ms`, or less when asked to stop.
fn pause(stop: &AtomicBool, ms: u64) {
    let mut left = Duration::from_millis(ms);
    while !left.is_zero() && !stop.load(Ordering::Acquire) {
        let step = left.min(STOP_CHECK);
        std::thread::sleep(step);
        left -= step;
    }
}

/// The wait of a loop that found nothing: doubles up to [`POLL_MS_MAX`].
struct Idle(u64);

impl Idle {
    fn reset(&mut self) {
        self.0 = 1;
    }

    fn wait(&mut self, stop: &AtomicBool) {
        pause(stop, self.0);
        self.0 = (self.0 * 2).min(POLL_MS_MAX);
    }
}

/// Opens the store again after a lost connection; a failure to is one
/// more transient failure, waited out with `backoff`.
fn recover<S>(
    store: &mut S,
    reopen: &mut Reopen<S>,
    failures: &mut u32,
    backoff: &Backoff,
    stop: &AtomicBool,
) {
    *failures = failures.saturating_add(1);
    match reopen() {
        Ok(fresh) => *store = fresh,
        Err(e) => {
            tracing::warn!(error = %e, "cannot open the store again");
            pause(stop, backoff.delay_ms(*failures, fastrand::f64()));
        }
    }
}

fn relay_loop<T: Transport, O: FnMut(&RelayRound)>(
    mut producer: AnyProducer,
    mut reopen: Reopen<AnyProducer>,
    mut transport: T,
    options: RelayOptions,
    clock: Arc<dyn Clock>,
    stop: Arc<AtomicBool>,
    mut observe: O,
) -> Result<(), StoreError> {
    let round_options = RelayOptions {
        max: Some(options.batch_len_max.max(1) as u64),
        ..options
    };
    let mut idle = Idle(1);
    let mut failures = 0u32;
    while !stop.load(Ordering::Acquire) {
        let mut round = RelayRound::default();
        let outcome = relay_each(
            &mut producer,
            &mut transport,
            &round_options,
            clock.as_ref(),
            |handover| round.note(handover),
        );
        let lost = match outcome {
            Ok(_) => false,
            Err(RelayError::FailureUnrecorded { recording, .. }) if transient(recording.kind()) => {
                round.totals.transient_errors += 1;
                round.failures.push(ordo_core::TransientKind::Busy);
                recording.kind() == ErrorKind::ConnectionLost
            }
            Err(RelayError::Store(e)) if transient(e.kind()) => {
                tracing::warn!(error = %e, "relay round failed; retrying");
                round.totals.transient_errors += 1;
                round.failures.push(ordo_core::TransientKind::Busy);
                e.kind() == ErrorKind::ConnectionLost
            }
            Err(RelayError::Store(e)) => return Err(e),
            Err(e) => return Err(StoreError::new(ErrorKind::Other, e.to_string())),
        };
        let worked = round.totals.delivered > 0 || round.totals.refused > 0;
        round.totals.rounds = u64::from(worked);
        if worked || !round.failures.is_empty() {
            observe(&round);
        }
        if lost {
            recover(
                &mut producer,
                &mut reopen,
                &mut failures,
                &options.backoff,
                &stop,
            );
        } else if worked {
            failures = 0;
            idle.reset();
        } else {
            idle.wait(&stop);
        }
    }
    Ok(())
}

/// The application's handler, with the codes it blocked seen by the loop.
struct Seen<H> {
    handler: H,
    blocked: Vec<BlockCode>,
}

impl<H: ApplyHandler<PgTx>> ApplyHandler<PgTx> for Seen<H> {
    fn apply(&mut self, tx: &PgTx, event: &Envelope) -> Result<Verdict, StoreError> {
        let verdict = self.handler.apply(tx, event)?;
        if let Verdict::Block(reason) = &verdict {
            tracing::info!(
                event_id = %event.event_id, flow_id = %event.flow_id,
                seq = event.seq.get(), reason = %reason, "blocked"
            );
            self.blocked.push(reason.code);
        }
        Ok(verdict)
    }

    /// The handler's own batch call; a block in it is seen when the store
    /// offers the events again one at a time.
    fn apply_all(&mut self, tx: &PgTx, events: &[Envelope]) -> Result<Option<Verdict>, StoreError> {
        self.handler.apply_all(tx, events)
    }

    fn reevaluate(&self) -> &[BlockCode] {
        self.handler.reevaluate()
    }
}

fn apply_loop<H: ApplyHandler<PgTx>, O: FnMut(&ApplyRound)>(
    mut consumer: PgConsumer,
    mut reopen: Reopen<PgConsumer>,
    handler: H,
    batch_len_max: u64,
    stop: Arc<AtomicBool>,
    mut observe: O,
) -> Result<(), StoreError> {
    let backoff = Backoff::default();
    let mut handler = Seen {
        handler,
        blocked: Vec::new(),
    };
    let mut idle = Idle(1);
    let mut failures = 0u32;
    let mut after: Option<FlowId> = None;
    let mut pass_applied = 0u64;
    while !stop.load(Ordering::Acquire) {
        let mut round = ApplyRound::default();
        handler.blocked.clear();
        let outcome = process_page(
            &mut consumer,
            after.as_ref(),
            None,
            &mut handler,
            batch_len_max.max(1),
            |drain| round.totals.applied += drain.applied,
        );
        match outcome {
            Ok(next) => {
                failures = 0;
                after = next;
                pass_applied += round.totals.applied;
                round.totals.rounds = u64::from(round.totals.applied > 0);
                round.blocked = std::mem::take(&mut handler.blocked);
                round.totals.blocked = round.blocked.len() as u64;
                if round.totals.applied > 0 || !round.blocked.is_empty() {
                    observe(&round);
                }
            }
            Err(e) if e.kind() == ErrorKind::ConnectionLost => {
                tracing::warn!(error = %e, "apply page failed; opening the store again");
                recover(&mut consumer, &mut reopen, &mut failures, &backoff, &stop);
                continue;
            }
            Err(e) if transient(e.kind()) => {
                failures = failures.saturating_add(1);
                pause(&stop, backoff.delay_ms(failures, fastrand::f64()));
                continue;
            }
            Err(e) => return Err(e),
        }
        if after.is_some() {
            continue; // the pass goes on with the next page
        }
        if pass_applied > 0 {
            idle.reset();
        } else {
            idle.wait(&stop);
        }
        pass_applied = 0;
    }
    Ok(())
}
