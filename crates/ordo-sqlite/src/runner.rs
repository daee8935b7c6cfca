//! Running ordo inside the application's process: a relay loop that hands
//! the outbox to the consumer, and an apply loop that runs the application's
//! handler, each on its own thread with its own store handles.
//!
//! Each loop wakes at once when the same process commits work for it (an
//! append to the producer file, a receive into the consumer file), and
//! otherwise polls, more slowly the longer it finds nothing (from
//! `poll_ms_min` doubling up to `poll_ms_max`), so that work committed by
//! other processes is found too. A transient failure (`Busy`,
//! `ConnectionLost`) is retried after the relay's backoff; any other failure
//! ends the loop and is returned by [`Runner::stop`] or reported by
//! [`Runner::failed`].
//!
//! Invariant: a loop stops only between rounds, so every round it started
//! has committed or rolled back whole when [`Runner::stop`] returns; nothing
//! is half-done, and a later start resumes from the stores.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ordo_core::{
    process_page, relay_each, ApplyHandler, Backoff, Clock, DrainStop, ErrorKind, FlowId, Receipt,
    RelayError, RelayOptions, StoreError,
};

use crate::wake::Signal;
use crate::{ConsumerDb, ProducerDb};

/// How the loops of a [`Runner`] behave. The defaults suit most
/// applications; see each field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunnerOptions {
    /// The relay's policy, batch size (events per round, one consumer and
    /// one producer transaction; default 256) and backoff. `max` is ignored:
    /// a loop runs until stopped.
    pub relay: RelayOptions,
    /// The most events applied per transaction (default 256). Larger
    /// batches apply faster and hold the consumer's write lock longer.
    pub apply_batch_len_max: u64,
    /// The first poll interval after a round that found nothing (default 1).
    pub poll_ms_min: u64,
    /// The longest poll interval (default 1,000): the most time work
    /// committed by another process may wait before a loop notices it.
    pub poll_ms_max: u64,
    /// The wait after a transient failure of the apply loop, by failures in
    /// a row (the relay loop's events carry their own backoff).
    pub backoff: Backoff,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        RunnerOptions {
            relay: RelayOptions::default(),
            apply_batch_len_max: ordo_core::APPLY_BATCH_LEN_DEFAULT,
            poll_ms_min: 1,
            poll_ms_max: 1_000,
            backoff: Backoff::default(),
        }
    }
}

/// What the relay loop did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayTotals {
    /// Rounds that handed over at least one event.
    pub rounds: u64,
    /// Events handed over.
    pub delivered: u64,
    /// Receipts `accepted`.
    pub accepted: u64,
    /// Receipts `duplicate`.
    pub duplicate: u64,
    /// Receipts `conflict` (quarantined).
    pub conflict: u64,
    /// Transient failures retried.
    pub transient_errors: u64,
}

/// What the apply loop did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyTotals {
    /// Pages of flows visited that applied at least one event.
    pub rounds: u64,
    /// Events applied.
    pub applied: u64,
    /// Flows found blocked (counted at every visit).
    pub blocked: u64,
    /// Transient failures retried.
    pub transient_errors: u64,
}

/// What a [`Runner`] did until it stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunReport {
    /// The relay loop's totals (zero if none ran).
    pub relay: RelayTotals,
    /// The apply loop's totals (zero if none ran).
    pub apply: ApplyTotals,
}

/// Shared between a runner and its loops.
#[derive(Debug, Default)]
struct Control {
    stop: AtomicBool,
    report: Mutex<RunReport>,
}

impl Control {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn update(&self, f: impl FnOnce(&mut RunReport)) {
        f(&mut self.report.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// The relay and apply loops of one application process. Dropping a runner
/// without [`Runner::stop`] stops its loops too (without reporting).
pub struct Runner {
    options: RunnerOptions,
    control: Arc<Control>,
    signals: Vec<Signal>,
    threads: Vec<JoinHandle<Result<(), StoreError>>>,
}

impl Runner {
    /// A runner with no loop yet.
    pub fn new(options: RunnerOptions) -> Runner {
        Runner {
            options,
            control: Arc::default(),
            signals: Vec::new(),
            threads: Vec::new(),
        }
    }

    /// Starts the relay loop on its own thread, with its own handles on the
    /// producer and consumer files (open them for this loop alone). The
    /// relay reads the time from the producer's clock.
    pub fn spawn_relay(
        &mut self,
        producer: ProducerDb,
        consumer: ConsumerDb,
    ) -> std::io::Result<()> {
        let signal = producer.append_signal();
        let clock = producer.clock();
        let relay = RelayLoop {
            producer,
            consumer,
            clock,
            options: self.options,
            control: self.control.clone(),
            signal: signal.clone(),
        };
        self.spawn("ordo-relay", signal, move || relay.run())
    }

    /// Starts the apply loop on its own thread with its own consumer handle
    /// and the application's handler.
    pub fn spawn_apply<H>(&mut self, consumer: ConsumerDb, handler: H) -> std::io::Result<()>
    where
        H: ApplyHandler<rusqlite::Connection> + Send + 'static,
    {
        let signal = consumer.receive_signal();
        let apply = ApplyLoop {
            consumer,
            handler,
            options: self.options,
            control: self.control.clone(),
            signal: signal.clone(),
        };
        self.spawn("ordo-apply", signal, move || apply.run())
    }

    fn spawn(
        &mut self,
        name: &str,
        signal: Signal,
        body: impl FnOnce() -> Result<(), StoreError> + Send + 'static,
    ) -> std::io::Result<()> {
        let thread = std::thread::Builder::new().name(name.into()).spawn(body)?;
        self.signals.push(signal);
        self.threads.push(thread);
        Ok(())
    }

    /// The totals so far.
    pub fn report(&self) -> RunReport {
        *self
            .control
            .report
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a loop has ended on its own, by a failure that is not
    /// transient; [`Runner::stop`] returns it.
    pub fn failed(&self) -> bool {
        self.threads.iter().any(JoinHandle::is_finished)
    }

    /// Asks every loop to stop after its round in progress, waits for them,
    /// and returns the totals, or the first failure that ended a loop.
    pub fn stop(mut self) -> Result<RunReport, StoreError> {
        self.halt()?;
        Ok(self.report())
    }

    fn halt(&mut self) -> Result<(), StoreError> {
        self.control.stop.store(true, Ordering::Release);
        self.signals.iter().for_each(Signal::raise);
        let mut first_error = None;
        for thread in self.threads.drain(..) {
            let outcome = thread
                .join()
                .unwrap_or_else(|_| Err(StoreError::new(ErrorKind::Other, "a loop panicked")));
            if let Err(e) = outcome {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            let _ = self.halt();
        }
    }
}

/// The adaptive wait of a loop that found nothing to do.
struct Idle {
    next_ms: u64,
    min_ms: u64,
    max_ms: u64,
}

impl Idle {
    fn new(options: &RunnerOptions) -> Idle {
        let min_ms = options.poll_ms_min.max(1);
        Idle {
            next_ms: min_ms,
            min_ms,
            max_ms: options.poll_ms_max.max(min_ms),
        }
    }

    /// Work was found: the next empty round waits the shortest time.
    fn reset(&mut self) {
        self.next_ms = self.min_ms;
    }

    /// Nothing was found: wait for the signal past `seen`, or the poll
    /// interval, which then doubles.
    fn wait(&mut self, signal: &Signal, seen: u64) {
        signal.wait(seen, Duration::from_millis(self.next_ms));
        self.next_ms = self.next_ms.saturating_mul(2).min(self.max_ms);
    }
}

fn is_transient(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::Busy | ErrorKind::ConnectionLost)
}

struct RelayLoop {
    producer: ProducerDb,
    consumer: ConsumerDb,
    clock: Arc<dyn Clock>,
    options: RunnerOptions,
    control: Arc<Control>,
    signal: Signal,
}

impl RelayLoop {
    fn run(mut self) -> Result<(), StoreError> {
        let mut idle = Idle::new(&self.options);
        let round = RelayOptions {
            max: Some(self.options.relay.batch_len_max.max(1) as u64),
            ..self.options.relay
        };
        while !self.control.stopping() {
            let seen = self.signal.generation();
            let mut totals = RelayTotals::default();
            let outcome = relay_each(
                &mut self.producer,
                &mut self.consumer,
                &round,
                self.clock.as_ref(),
                |delivery| {
                    totals.delivered += 1;
                    match delivery.receipt {
                        Receipt::Accepted => totals.accepted += 1,
                        Receipt::Duplicate => totals.duplicate += 1,
                        Receipt::Conflict => totals.conflict += 1,
                    }
                },
            );
            match outcome {
                Ok(_) => {}
                Err(e) if e.kind().is_some_and(is_transient) => totals.transient_errors += 1,
                Err(RelayError::Store(e)) => return Err(e),
                Err(e) => return Err(StoreError::new(ErrorKind::Other, e.to_string())),
            }
            totals.rounds = u64::from(totals.delivered > 0);
            self.control.update(|r| add_relay(&mut r.relay, &totals));
            if totals.delivered > 0 {
                idle.reset();
            } else {
                idle.wait(&self.signal, seen);
            }
        }
        Ok(())
    }
}

fn add_relay(sum: &mut RelayTotals, round: &RelayTotals) {
    sum.rounds += round.rounds;
    sum.delivered += round.delivered;
    sum.accepted += round.accepted;
    sum.duplicate += round.duplicate;
    sum.conflict += round.conflict;
    sum.transient_errors += round.transient_errors;
}

struct ApplyLoop<H> {
    consumer: ConsumerDb,
    handler: H,
    options: RunnerOptions,
    control: Arc<Control>,
    signal: Signal,
}

impl<H: ApplyHandler<rusqlite::Connection>> ApplyLoop<H> {
    fn run(mut self) -> Result<(), StoreError> {
        let mut idle = Idle::new(&self.options);
        let mut failures = 0u32;
        let mut after: Option<FlowId> = None;
        let mut pass_applied = 0u64;
        while !self.control.stopping() {
            let seen = self.signal.generation();
            let mut page = ApplyTotals::default();
            let outcome = process_page(
                &mut self.consumer,
                after.as_ref(),
                None,
                &mut self.handler,
                self.options.apply_batch_len_max.max(1),
                |drain| {
                    page.applied += drain.applied;
                    page.blocked += u64::from(matches!(drain.stop, DrainStop::Blocked(_)));
                },
            );
            match outcome {
                Ok(next) => {
                    failures = 0;
                    after = next;
                    pass_applied += page.applied;
                    page.rounds = u64::from(page.applied > 0);
                    self.control.update(|r| add_apply(&mut r.apply, &page));
                }
                Err(e) if is_transient(e.kind()) => {
                    failures = failures.saturating_add(1);
                    self.control.update(|r| r.apply.transient_errors += 1);
                    let wait_ms = self.options.backoff.delay_ms(failures, fastrand::f64());
                    self.signal.wait(seen, Duration::from_millis(wait_ms));
                    continue;
                }
                Err(e) => return Err(e),
            }
            if after.is_some() {
                continue; // the pass goes on with the next page
            }
            // A whole pass is done: wait only if it applied nothing (flows
            // that are blocked or gapped still list as having work).
            if pass_applied > 0 {
                idle.reset();
            } else {
                idle.wait(&self.signal, seen);
            }
            pass_applied = 0;
        }
        Ok(())
    }
}

fn add_apply(sum: &mut ApplyTotals, page: &ApplyTotals) {
    sum.rounds += page.rounds;
    sum.applied += page.applied;
    sum.blocked += page.blocked;
    sum.transient_errors += page.transient_errors;
}
