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

use ordo_core::{ApplyHandler, Backoff, ErrorKind, RelayOptions, StoreError, Transport};

use crate::wake::Signal;
use crate::{ConsumerDb, ProducerDb};

mod apply;
mod relay;

pub use apply::ApplyRound;
pub use relay::RelayRound;

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
    /// Events the consumer refused to store (quarantined).
    pub refused: u64,
    /// Transient failures retried.
    pub transient_errors: u64,
}

impl RelayTotals {
    fn add(&mut self, round: &RelayTotals) {
        self.rounds += round.rounds;
        self.delivered += round.delivered;
        self.accepted += round.accepted;
        self.duplicate += round.duplicate;
        self.conflict += round.conflict;
        self.refused += round.refused;
        self.transient_errors += round.transient_errors;
    }
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

impl ApplyTotals {
    fn add(&mut self, page: &ApplyTotals) {
        self.rounds += page.rounds;
        self.applied += page.applied;
        self.blocked += page.blocked;
        self.transient_errors += page.transient_errors;
    }
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
        self.spawn_relay_to(producer, consumer, |_: &RelayRound| {})
    }

    /// Starts the relay loop on its own thread, handing the producer's
    /// outbox over through `transport` (a consumer store, or a network
    /// client), and showing each round that did anything to `observe`.
    pub fn spawn_relay_to<T, O>(
        &mut self,
        producer: ProducerDb,
        transport: T,
        observe: O,
    ) -> std::io::Result<()>
    where
        T: Transport + Send + 'static,
        O: FnMut(&RelayRound) + Send + 'static,
    {
        let signal = producer.append_signal();
        let clock = producer.clock();
        let relay = relay::RelayLoop {
            producer,
            transport,
            clock,
            options: self.options,
            control: self.control.clone(),
            signal: signal.clone(),
            observe,
        };
        self.spawn("ordo-relay", signal, move || relay.run())
    }

    /// Starts the apply loop on its own thread with its own consumer handle
    /// and the application's handler.
    pub fn spawn_apply<H>(&mut self, consumer: ConsumerDb, handler: H) -> std::io::Result<()>
    where
        H: ApplyHandler<rusqlite::Connection> + Send + 'static,
    {
        self.start_apply(consumer, handler, None::<fn(&ApplyRound)>)
    }

    /// [`Runner::spawn_apply`], showing each page that applied or blocked
    /// anything to `observe`, with the time each event waited from its
    /// receipt to its apply (one indexed read per event applied).
    pub fn spawn_apply_observed<H, O>(
        &mut self,
        consumer: ConsumerDb,
        handler: H,
        observe: O,
    ) -> std::io::Result<()>
    where
        H: ApplyHandler<rusqlite::Connection> + Send + 'static,
        O: FnMut(&ApplyRound) + Send + 'static,
    {
        self.start_apply(consumer, handler, Some(observe))
    }

    fn start_apply<H, O>(
        &mut self,
        consumer: ConsumerDb,
        handler: H,
        observe: Option<O>,
    ) -> std::io::Result<()>
    where
        H: ApplyHandler<rusqlite::Connection> + Send + 'static,
        O: FnMut(&ApplyRound) + Send + 'static,
    {
        let signal = consumer.receive_signal();
        let handler = apply::Observed {
            handler,
            clock: observe.is_some().then(|| consumer.clock()),
            seen: ApplyRound::default(),
        };
        let apply = apply::ApplyLoop {
            consumer,
            handler,
            options: self.options,
            control: self.control.clone(),
            signal: signal.clone(),
            observe,
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
