//! Running ordo inside the application's process, on any backend: a relay
//! loop that hands the outbox to a consumer through any transport, and an
//! apply loop that runs the application's handler, each on its own thread
//! with its own store handles.
//!
//! Each loop wakes at once when the same process commits work for it (an
//! append to the producer store, a receive into the consumer store), looks
//! every [`WATCH_MS`] while idle for another process's commits where the
//! store can tell cheaply ([`RunStore::changed_elsewhere`]: SQLite's
//! `data_version`), and otherwise polls, more slowly the longer it finds
//! nothing (from `poll_ms_min` doubling up to `poll_ms_max`). A transient
//! failure (`Busy`, `ConnectionLost`) is retried after a backoff, and a lost
//! connection is opened again where the loop was given a way to
//! ([`Reopen`]); any other failure ends the loop and is returned by
//! [`Runner::stop`] or reported by [`Runner::failed`].
//!
//! Invariant: a loop stops only between rounds, so every round it started
//! has committed or rolled back whole when [`Runner::stop`] returns; nothing
//! is half-done, and a later start resumes from the stores.
//!
//! Invariant: the runtime knows no backend, no transport and no domain: it
//! sees the store traits of `ordo-core`, [`Transport`] and the handler.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ordo_core::effect::EffectStore;
use ordo_core::{
    ApplyHandler, Backoff, DestinationName, ErrorKind, ProducerStore, RelayOptions, RunConsumer,
    RunStore, Signal, StoreError, Transport,
};

mod apply;
mod effects;
mod effects_loop;
mod relay;

pub use apply::ApplyRound;
pub use effects::{Effect, EffectCode, EffectRound, Executor, ReconcileCode};
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

/// A struct of `u64` counters, each documented, whose `add` adds another's
/// counters to its own one by one.
macro_rules! totals {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $($(#[$field_doc:meta])* pub $field:ident,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name {
            $($(#[$field_doc])* pub $field: u64,)*
        }

        impl $name {
            fn add(&mut self, other: &$name) {
                $(self.$field += other.$field;)*
            }
        }
    };
}

totals! {
    /// What the relay loop did.
    pub struct RelayTotals {
        /// Rounds that handed over at least one event.
        pub rounds,
        /// Events handed over.
        pub delivered,
        /// Receipts `accepted`.
        pub accepted,
        /// Receipts `duplicate`.
        pub duplicate,
        /// Receipts `conflict` (quarantined, or left unmarked for cause
        /// `after_conflict`).
        pub conflict,
        /// Of those, conflicts of cause `producer_rewound`.
        pub rewound,
        /// Events the consumer refused to store (quarantined).
        pub refused,
        /// Transient failures retried.
        pub transient_errors,
    }
}

totals! {
    /// What the apply loop did.
    pub struct ApplyTotals {
        /// Pages of flows visited that applied at least one event.
        pub rounds,
        /// Events applied.
        pub applied,
        /// Flows found blocked (counted at every visit).
        pub blocked,
        /// Transient failures retried.
        pub transient_errors,
    }
}

/// What a [`Runner`] did until it stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunReport {
    /// The relay loop's totals (zero if none ran).
    pub relay: RelayTotals,
    /// The apply loop's totals (zero if none ran).
    pub apply: ApplyTotals,
    /// The effects loop's totals (zero if none ran).
    pub effects: EffectRound,
    /// Transient failures the effects loop retried.
    pub effect_transient_errors: u64,
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

    /// Starts the relay loop on its own thread, with its own producer
    /// handle, handing the outbox over through `transport` (a consumer
    /// store, or a network client). The relay reads the time from the
    /// producer's clock.
    pub fn spawn_relay<P, T>(&mut self, producer: P, transport: T) -> std::io::Result<()>
    where
        P: ProducerStore + RunStore + Send + 'static,
        T: Transport + Send + 'static,
    {
        self.spawn_relay_to(producer, transport, |_: &RelayRound| {})
    }

    /// [`Runner::spawn_relay`], showing each round that did anything to
    /// `observe`.
    pub fn spawn_relay_to<P, T, O>(
        &mut self,
        producer: P,
        transport: T,
        observe: O,
    ) -> std::io::Result<()>
    where
        P: ProducerStore + RunStore + Send + 'static,
        T: Transport + Send + 'static,
        O: FnMut(&RelayRound) + Send + 'static,
    {
        self.spawn_relay_reopening(producer, None, transport, observe)
    }

    /// [`Runner::spawn_relay_to`], opening the producer store again with
    /// `reopen` after its connection was lost.
    pub fn spawn_relay_reopening<P, T, O>(
        &mut self,
        producer: P,
        reopen: Option<Reopen<P>>,
        transport: T,
        observe: O,
    ) -> std::io::Result<()>
    where
        P: ProducerStore + RunStore + Send + 'static,
        T: Transport + Send + 'static,
        O: FnMut(&RelayRound) + Send + 'static,
    {
        let signal = producer.signal();
        let relay = relay::RelayLoop {
            store: Held::new(producer, reopen),
            transport,
            options: self.options,
            control: self.control.clone(),
            signal: signal.clone(),
            observe,
        };
        self.spawn("ordo-relay", signal, move || relay.run())
    }

    /// [`Runner::spawn_relay_reopening`] for one destination of the
    /// producer store: the loop's handle (and each one `reopen` opens after
    /// a lost connection) acts on `destination` only, its own custody,
    /// backoff and quarantine (PROTOCOL.md section 12). One runner serves
    /// several destinations of a store this way, each loop with its own
    /// producer handle and its own transport. An unknown destination is
    /// refused ([`ErrorKind::InvalidInput`]) and nothing starts.
    pub fn spawn_relay_for<P, T, O>(
        &mut self,
        destination: &DestinationName,
        mut producer: P,
        reopen: Option<Reopen<P>>,
        transport: T,
        observe: O,
    ) -> Result<(), StoreError>
    where
        P: ProducerStore + RunStore + Send + 'static,
        T: Transport + Send + 'static,
        O: FnMut(&RelayRound) + Send + 'static,
    {
        use_destination(&mut producer, destination)?;
        let reopen = reopen.map(|mut open| -> Reopen<P> {
            let destination = destination.clone();
            Box::new(move || {
                let mut fresh = open()?;
                use_destination(&mut fresh, &destination)?;
                Ok(fresh)
            })
        });
        self.spawn_relay_reopening(producer, reopen, transport, observe)
            .map_err(|e| {
                StoreError::new(ErrorKind::Other, format!("cannot start a relay loop: {e}"))
            })
    }

    /// Starts the apply loop on its own thread with its own consumer handle
    /// and the application's handler.
    pub fn spawn_apply<C, H>(&mut self, consumer: C, handler: H) -> std::io::Result<()>
    where
        C: RunConsumer + Send + 'static,
        H: ApplyHandler<C::Tx> + Send + 'static,
    {
        self.start_apply(consumer, None, handler, None::<fn(&ApplyRound)>)
    }

    /// [`Runner::spawn_apply`], showing each page that applied or blocked
    /// anything to `observe`, with the time each event waited from its
    /// receipt to its apply (one indexed read per event applied).
    pub fn spawn_apply_observed<C, H, O>(
        &mut self,
        consumer: C,
        handler: H,
        observe: O,
    ) -> std::io::Result<()>
    where
        C: RunConsumer + Send + 'static,
        H: ApplyHandler<C::Tx> + Send + 'static,
        O: FnMut(&ApplyRound) + Send + 'static,
    {
        self.start_apply(consumer, None, handler, Some(observe))
    }

    /// [`Runner::spawn_apply_observed`], opening the consumer store again
    /// with `reopen` after its connection was lost.
    pub fn spawn_apply_reopening<C, H, O>(
        &mut self,
        consumer: C,
        reopen: Reopen<C>,
        handler: H,
        observe: O,
    ) -> std::io::Result<()>
    where
        C: RunConsumer + Send + 'static,
        H: ApplyHandler<C::Tx> + Send + 'static,
        O: FnMut(&ApplyRound) + Send + 'static,
    {
        self.start_apply(consumer, Some(reopen), handler, Some(observe))
    }

    fn start_apply<C, H, O>(
        &mut self,
        consumer: C,
        reopen: Option<Reopen<C>>,
        handler: H,
        observe: Option<O>,
    ) -> std::io::Result<()>
    where
        C: RunConsumer + Send + 'static,
        H: ApplyHandler<C::Tx> + Send + 'static,
        O: FnMut(&ApplyRound) + Send + 'static,
    {
        let signal = consumer.signal();
        let handler = apply::Observed {
            handler,
            clock: observe.is_some().then(|| consumer.clock()),
            received_at_ms: C::received_at_ms,
            seen: ApplyRound::default(),
        };
        let apply = apply::ApplyLoop {
            store: Held::new(consumer, reopen),
            handler,
            options: self.options,
            control: self.control.clone(),
            signal: signal.clone(),
            observe,
        };
        self.spawn("ordo-apply", signal, move || apply.run())
    }

    /// Starts the effects loop on its own thread, with its own consumer
    /// handle: `executor` runs the intents of the names registered with it,
    /// round after round, and shows each round that did anything to
    /// `observe`. It finds new intents by the store's change watch (or
    /// polls), and retries transient failures after a backoff, opening the
    /// store again with `reopen` after a lost connection.
    pub fn spawn_effects<C, O>(
        &mut self,
        consumer: C,
        reopen: Option<Reopen<C>>,
        executor: Executor,
        observe: O,
    ) -> std::io::Result<()>
    where
        C: EffectStore + RunStore + Send + 'static,
        O: FnMut(&EffectRound) + Send + 'static,
    {
        let signal = consumer.signal();
        let effects = effects_loop::EffectsLoop {
            store: Held::new(consumer, reopen),
            executor,
            options: self.options,
            control: self.control.clone(),
            signal: signal.clone(),
            observe,
        };
        self.spawn("ordo-effects", signal, move || effects.run())
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

/// Opens a store again after its connection was lost.
pub type Reopen<S> = Box<dyn FnMut() -> Result<S, StoreError> + Send>;

/// Makes `producer` act on `destination`; an unknown one is invalid input.
fn use_destination<P: ProducerStore + ?Sized>(
    producer: &mut P,
    destination: &DestinationName,
) -> Result<(), StoreError> {
    producer
        .use_destination(Some(destination))?
        .map_err(|refused| StoreError::new(ErrorKind::InvalidInput, refused.to_string()))
}

/// How often an idle loop looks for another process's commits
/// ([`RunStore::changed_elsewhere`]), so that such work waits at most
/// about this long.
pub const WATCH_MS: u64 = 10;

/// Whether a failure is worth retrying after a wait.
fn transient(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::Busy | ErrorKind::ConnectionLost)
}

/// A loop's store handle, and how to open it again after a lost
/// connection.
struct Held<S> {
    store: S,
    reopen: Option<Reopen<S>>,
    failures: u32,
}

impl<S> Held<S> {
    fn new(store: S, reopen: Option<Reopen<S>>) -> Held<S> {
        Held {
            store,
            reopen,
            failures: 0,
        }
    }

    /// Whether a lost connection can be opened again.
    fn can_reopen(&self) -> bool {
        self.reopen.is_some()
    }

    /// A round went through.
    fn succeeded(&mut self) {
        self.failures = 0;
    }

    /// After a transient failure of `kind`: opens the store again when the
    /// connection was lost and the loop can; returns how long to wait
    /// before the next round.
    fn failed(&mut self, kind: ErrorKind, backoff: &Backoff) -> Duration {
        self.failures = self.failures.saturating_add(1);
        if kind == ErrorKind::ConnectionLost {
            if let Some(reopen) = self.reopen.as_mut() {
                match reopen() {
                    Ok(fresh) => {
                        self.store = fresh;
                        return Duration::ZERO;
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot open the store again"),
                }
            }
        }
        Duration::from_millis(backoff.delay_ms(self.failures, fastrand::f64()))
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

    /// Nothing was found: waits for the signal past `seen`, another
    /// process's commit seen by `store`, or the poll interval, which then
    /// doubles. A failed look is logged and the wait goes on as a poll.
    fn wait(&mut self, signal: &Signal, seen: u64, store: &mut impl RunStore) {
        let deadline = Instant::now() + Duration::from_millis(self.next_ms);
        self.next_ms = self.next_ms.saturating_mul(2).min(self.max_ms);
        let mut watching = true;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let step = left.min(Duration::from_millis(WATCH_MS));
            if step.is_zero() || signal.wait(seen, step) != seen {
                return;
            }
            if watching {
                match store.changed_elsewhere() {
                    Ok(true) => return,
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot look for other processes' commits");
                        watching = false;
                    }
                }
            }
        }
    }
}
