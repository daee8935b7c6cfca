//! The bench on PostgreSQL: the server's own single-row commit rate F_pg
//! and its rate S_pg for the rows the protocol keeps per event
//! ([`crate::skeleton_pg`]), then, for each worker count N, producer
//! threads, N relays and N appliers at once on a fresh database, until
//! every event is applied; events per second end to end as a ratio to
//! F_pg and to S_pg.
//!
//! Every worker is a thread with its own connections, running the stores'
//! real code paths: the reservation domain's `advance_batch` on
//! [`PgProducer`], the relay's rounds ([`relay_each`], fair policy, leases)
//! from a [`PgProducer`] into a [`PgConsumer`], and the applier's pages
//! ([`process_page`], `FOR UPDATE SKIP LOCKED` on the apply cursors).
//! Connections at once: [`PRODUCER_THREADS`] + 3 N + 1.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ordo_core::{
    process_page, relay_each, Clock, DrainStop, Handover, Receipt, RelayError, RelayOptions,
    SystemClock,
};
use ordo_postgres::error::pg_error;
use ordo_postgres::postgres::{Client, Statement};
use ordo_postgres::{PgConsumer, PgOptions, PgProducer};
use ordo_reservation::ReservationHandler;
use ordo_reservation::{consumer_schema, producer_schema};

use crate::bench::{produce, CALIBRATION, EVENTS_PER_FLOW};
use crate::figures::{per, per_second, Spread};
use crate::pg::{connect, Server, WalPosition, BENCH_PREFIX};
use crate::skeleton_pg::{self, SkeletonRun};
use crate::{join_all, LabError as Failure, Progress, Silent};

/// The worker counts measured unless told otherwise.
pub const WORKERS_DEFAULT: [usize; 3] = [1, 2, 4];
/// The most workers of one run (3 connections each).
pub const WORKERS_MAX: usize = 5;
/// The producer threads of every run, each advancing its own flows.
pub const PRODUCER_THREADS: usize = 2;
/// The first pause of a worker that found nothing to do; each pause in a
/// row doubles, up to [`IDLE_PAUSE_MAX`] (polling, as the follow modes do).
const IDLE_PAUSE: Duration = Duration::from_millis(1);
const IDLE_PAUSE_MAX: Duration = Duration::from_millis(16);
/// A run in which no event is applied for this long has stalled.
const STALL: Duration = Duration::from_secs(60);

/// What the PostgreSQL bench measures.
#[derive(Debug, Clone)]
pub struct PgBenchOptions {
    /// The server, `postgres://USER@HOST:PORT` (its role needs `CREATEDB`).
    pub url: String,
    /// The worker counts: N relays and N appliers, one run each.
    pub workers: Vec<usize>,
    /// Flows per run, each three events.
    pub flows: u64,
    /// Events per transaction: per `advance_batch`, relay round and apply
    /// batch.
    pub batch: u64,
}

/// One run: producers, N relays and N appliers on a fresh database.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkersRun {
    /// Relays, and as many appliers.
    pub workers: usize,
    /// Events produced, relayed and applied.
    pub events: u64,
    /// From the start until the last event was applied, in seconds.
    pub seconds: f64,
    /// Until the producers had committed every event, in seconds.
    pub produced_seconds: f64,
    /// Until the consumer had accepted every event, in seconds.
    pub relayed_seconds: f64,
    /// Events handed to the consumer (more than `events` when two relays
    /// delivered one event, the second answered `duplicate`).
    pub deliveries: u64,
    /// Write transactions committed by every store handle of the run.
    pub commits: u64,
    /// F_pg measured just before and just after the run.
    pub f_before_after: (f64, f64),
    /// Bytes of WAL the server wrote from the start until every thread of
    /// the run had ended (its write position before and after: every
    /// database's, so other work on the server counts too).
    pub wal_bytes: u64,
}

impl WorkersRun {
    /// F_pg of the run: the geometric mean of the calibrations around it.
    pub fn f_pg(&self) -> f64 {
        (self.f_before_after.0 * self.f_before_after.1).sqrt()
    }

    /// End-to-end events per second over the run's F_pg.
    pub fn ratio_to_f(&self) -> f64 {
        self.events_per_s() / self.f_pg().max(1e-9)
    }

    /// Events per second, end to end.
    pub fn events_per_s(&self) -> f64 {
        per_second(self.events, self.seconds)
    }

    /// Events per second at which the producers committed.
    pub fn produce_per_s(&self) -> f64 {
        per_second(self.events, self.produced_seconds)
    }

    /// Events per second at which the relays got them accepted.
    pub fn relay_per_s(&self) -> f64 {
        per_second(self.events, self.relayed_seconds)
    }

    /// Bytes of WAL per event: a measure of the work each event costs the
    /// server that a shared machine's speed does not move.
    pub fn wal_bytes_per_event(&self) -> f64 {
        per(self.wal_bytes, self.events)
    }

    /// Write transactions per event.
    pub fn commits_per_event(&self) -> f64 {
        per(self.commits, self.events)
    }

    /// Events per write transaction.
    pub fn events_per_commit(&self) -> f64 {
        per(self.events, self.commits)
    }
}

/// What the PostgreSQL bench measured.
#[derive(Debug, Clone)]
pub struct PgBenchReport {
    /// The server as messages name it (no password).
    pub server: String,
    /// F_pg, each time it was measured (single-row insert-and-commit
    /// transactions per second on one connection, `synchronous_commit`
    /// on): before the first run and after each.
    pub calibrations: Vec<f64>,
    /// S_pg, measured before the first run and after the last: the
    /// server's rate for the rows the protocol keeps per event and nothing
    /// else ([`crate::skeleton_pg`]).
    pub skeletons: Vec<SkeletonRun>,
    /// Flows per run.
    pub flows: u64,
    /// Events per transaction.
    pub batch: u64,
    /// Producer threads per run.
    pub producers: usize,
    /// One run per worker count, in the order asked.
    pub runs: Vec<WorkersRun>,
}

impl PgBenchReport {
    /// S_pg of the bench: the geometric mean of its measurements.
    pub fn s_pg(&self) -> f64 {
        let logs: f64 = self
            .skeletons
            .iter()
            .map(|s| s.events_per_s().max(1e-9).ln())
            .sum();
        (logs / self.skeletons.len().max(1) as f64).exp()
    }

    /// A run's end-to-end events per second over S_pg.
    pub fn ratio_to_s(&self, run: &WorkersRun) -> f64 {
        run.events_per_s() / self.s_pg().max(1e-9)
    }

    /// The spread of every calibration of F_pg; its median is the bench's
    /// F_pg.
    pub fn f_pg_spread(&self) -> Spread {
        Spread::of(&self.calibrations)
    }

    /// The spread of the measurements of S_pg.
    pub fn s_pg_spread(&self) -> Spread {
        let rates: Vec<f64> = self
            .skeletons
            .iter()
            .map(SkeletonRun::events_per_s)
            .collect();
        Spread::of(&rates)
    }

    /// Bytes of WAL per event of the last measurement of S_pg (0 when
    /// none).
    pub fn s_pg_wal_bytes_per_event(&self) -> f64 {
        self.skeletons
            .last()
            .map_or(0.0, SkeletonRun::wal_bytes_per_event)
    }

    /// Events of each run.
    pub fn events_per_run(&self) -> u64 {
        self.flows * EVENTS_PER_FLOW
    }
}

/// Measures F_pg, as often as asked, on a database of its own: single-row
/// insert-and-commit transactions per second on one connection, each
/// commit waiting for the WAL flush (`synchronous_commit` on).
struct Calibrator {
    client: Client,
    insert: Statement,
}

const CALIBRATING: &str = "bench: calibrating F_pg";

impl Calibrator {
    fn new(url: &str) -> Result<Calibrator, Failure> {
        let mut client = connect(url, "ordo-bench-calibrate")?;
        client
            .batch_execute(
                "SET synchronous_commit = on;
                 CREATE TABLE calibrate (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                                         v bytea NOT NULL)",
            )
            .map_err(|e| pg_error(CALIBRATING, e))?;
        let insert = client
            .prepare("INSERT INTO calibrate (v) VALUES ($1)")
            .map_err(|e| pg_error(CALIBRATING, e))?;
        Ok(Calibrator { client, insert })
    }

    /// Commits per second over [`CALIBRATION`].
    fn measure(&mut self, progress: &dyn Progress) -> Result<f64, Failure> {
        progress.start(
            "calibrating F_pg (single-row commits, synchronous_commit on)",
            0,
        );
        let payload = vec![7u8; 200];
        let started = Instant::now();
        let mut commits = 0u64;
        while started.elapsed() < CALIBRATION {
            // Outside a transaction block: each statement commits alone.
            self.client
                .execute(&self.insert, &[&payload])
                .map_err(|e| pg_error(CALIBRATING, e))?;
            commits += 1;
        }
        progress.finish();
        Ok(commits as f64 / started.elapsed().as_secs_f64())
    }
}

/// Runs the bench: one run per worker count, each on a fresh database,
/// with F_pg measured before the first and after each (the single-row
/// commit rate of a shared server moves with everything else on it);
/// every database is dropped afterwards.
pub fn run(options: &PgBenchOptions, progress: &dyn Progress) -> Result<PgBenchReport, Failure> {
    if let Some(&n) = options.workers.iter().find(|&&n| n == 0 || n > WORKERS_MAX) {
        return Err(Failure::Usage(format!(
            "--workers {n}: between 1 and {WORKERS_MAX}"
        )));
    }
    if options.flows == 0 || options.batch == 0 {
        return Err(Failure::Usage(
            "--flows and --batch: at least 1 each".into(),
        ));
    }
    let server = Server::connect(&options.url, BENCH_PREFIX)?;
    let calibration_database = server.create()?;
    let mut calibrator = Calibrator::new(&calibration_database.url())?;
    let mut calibrations = vec![calibrator.measure(progress)?];
    let mut skeletons = vec![skeleton(&server, options, progress)?];
    let mut runs = Vec::new();
    for &workers in &options.workers {
        let database = server.create()?;
        let mut run = workers_run(&database.url(), workers, options, progress)?;
        drop(database);
        let after = calibrator.measure(progress)?;
        run.f_before_after = (calibrations[calibrations.len() - 1], after);
        calibrations.push(after);
        runs.push(run);
    }
    skeletons.push(skeleton(&server, options, progress)?);
    Ok(PgBenchReport {
        server: server.shown().to_owned(),
        calibrations,
        skeletons,
        flows: options.flows,
        batch: options.batch,
        producers: PRODUCER_THREADS,
        runs,
    })
}

/// One measurement of S_pg, on a fresh database of its own with the
/// runs' flows and batch.
fn skeleton(
    server: &Server,
    options: &PgBenchOptions,
    progress: &dyn Progress,
) -> Result<SkeletonRun, Failure> {
    let database = server.create()?;
    skeleton_pg::measure(&database.url(), options.flows, options.batch, progress)
}

/// The pauses of a worker while it finds nothing to do.
struct Idle(Duration);

impl Idle {
    fn new() -> Idle {
        Idle(IDLE_PAUSE)
    }

    fn reset(&mut self) {
        self.0 = IDLE_PAUSE;
    }

    fn wait(&mut self) {
        std::thread::sleep(self.0);
        self.0 = (self.0 * 2).min(IDLE_PAUSE_MAX);
    }
}

/// What the threads of one run share.
struct Shared {
    events: u64,
    threads: usize,
    ready: AtomicU64,
    start: OnceLock<Instant>,
    abort: AtomicBool,
    accepted: AtomicU64,
    applied: AtomicU64,
    relayed_at: OnceLock<Instant>,
    applied_at: OnceLock<Instant>,
}

impl Shared {
    /// Counts this thread ready, then waits until the run starts; `None`
    /// when it was aborted instead.
    fn ready(&self) -> Option<Instant> {
        self.ready.fetch_add(1, Ordering::SeqCst);
        loop {
            if let Some(start) = self.start.get() {
                return Some(*start);
            }
            if self.aborted() {
                return None;
            }
            std::thread::sleep(IDLE_PAUSE);
        }
    }

    fn aborted(&self) -> bool {
        self.abort.load(Ordering::SeqCst)
    }
}

/// Aborts the run when its thread returns early, with an error or a panic.
struct AbortOnDrop<'a>(&'a Shared);

impl Drop for AbortOnDrop<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.abort.store(true, Ordering::SeqCst);
        }
    }
}

/// What one thread did: its commits, and its deliveries if a relay.
type Done = Result<(u64, u64), Failure>;

/// The producer store of `url`, its connection named for the bench's
/// `role` and worker `i`.
fn open_producer(url: &str, role: &str, i: usize) -> Result<PgProducer, Failure> {
    Ok(PgProducer::open_with(
        url,
        &producer_schema(),
        clock(),
        &store_options(role, i),
    )?)
}

/// The consumer store of `url`, named as [`open_producer`]'s.
fn open_consumer(url: &str, role: &str, i: usize) -> Result<PgConsumer, Failure> {
    Ok(PgConsumer::open_with(
        url,
        &consumer_schema(),
        clock(),
        &store_options(role, i),
    )?)
}

fn store_options(role: &str, i: usize) -> PgOptions {
    PgOptions {
        application_name: Some(format!("ordo-bench-{role}-{i}")),
        ..PgOptions::default()
    }
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// Producer `i` of `of`: every step of its share of the flows, `batch`
/// requests per `advance_batch`.
fn producer_thread(
    url: &str,
    i: usize,
    of: usize,
    options: &PgBenchOptions,
    shared: &Shared,
) -> Done {
    let mut producer = open_producer(url, "produce", i)?;
    if shared.ready().is_none() {
        return Ok((0, 0));
    }
    let share = options.flows.div_ceil(of as u64);
    let first = share * i as u64;
    let range = first.min(options.flows)..(first + share).min(options.flows);
    produce(&mut producer, range, options.batch, &Silent)?;
    Ok((producer.commits(), 0))
}

/// The most events of one flow in a relay's round.
const ROUND_FLOW_EVENTS_MAX: usize = 16;

/// A relay: rounds of up to `batch` events from its own producer handle
/// into its own consumer handle, until the consumer accepted every event.
fn relay_thread(url: &str, i: usize, options: &PgBenchOptions, shared: &Shared) -> Done {
    let mut producer = open_producer(url, "relay", i)?;
    let mut consumer = open_consumer(url, "receive", i)?;
    if shared.ready().is_none() {
        return Ok((0, 0));
    }
    let round = RelayOptions {
        max: Some(options.batch),
        batch_len_max: options.batch as usize,
        flow_events_max: ROUND_FLOW_EVENTS_MAX,
        ..RelayOptions::default()
    };
    let mut deliveries = 0u64;
    let mut idle = Idle::new();
    while shared.accepted.load(Ordering::SeqCst) < shared.events && !shared.aborted() {
        let (mut delivered, mut accepted) = (0u64, 0u64);
        relay_each(
            &mut producer,
            &mut consumer,
            &round,
            &SystemClock,
            |handover| {
                if let Handover::Delivered(delivery) = handover {
                    delivered += 1;
                    accepted += u64::from(delivery.receipt == Receipt::Accepted);
                }
            },
        )
        .map_err(|e| match e {
            RelayError::Store(e) => Failure::Store(e),
            other => Failure::Internal(other.to_string()),
        })?;
        deliveries += delivered;
        let total = shared.accepted.fetch_add(accepted, Ordering::SeqCst) + accepted;
        if total >= shared.events {
            shared.relayed_at.get_or_init(Instant::now);
        }
        if delivered == 0 {
            idle.wait();
        } else {
            idle.reset();
        }
    }
    Ok((producer.commits() + consumer.commits(), deliveries))
}

/// An applier: pages of flows with work, up to `batch` events per
/// transaction, until every event is applied.
fn apply_thread(
    url: &str,
    i: usize,
    options: &PgBenchOptions,
    shared: &Shared,
    progress: &dyn Progress,
) -> Done {
    let mut consumer = open_consumer(url, "apply", i)?;
    if shared.ready().is_none() {
        return Ok((0, 0));
    }
    let mut handler = ReservationHandler::default();
    let mut after: Option<ordo_core::InboxFlow> = None;
    let mut pass_applied = 0u64;
    let mut idle = Idle::new();
    while shared.applied.load(Ordering::SeqCst) < shared.events && !shared.aborted() {
        let mut applied = 0u64;
        let mut blocked = None;
        after = process_page(
            &mut consumer,
            after.as_ref(),
            None,
            &mut handler,
            options.batch,
            |drain| {
                applied += drain.applied;
                if let DrainStop::Blocked(reason) = drain.stop {
                    blocked = Some((drain.flow, reason));
                }
            },
        )?;
        if let Some((flow, reason)) = blocked {
            return Err(Failure::Check(format!(
                "bench: flow {flow} blocked ({reason})"
            )));
        }
        progress.inc(applied);
        pass_applied += applied;
        let total = shared.applied.fetch_add(applied, Ordering::SeqCst) + applied;
        if total >= shared.events {
            shared.applied_at.get_or_init(Instant::now);
        }
        if after.is_none() {
            if pass_applied == 0 {
                idle.wait();
            } else {
                idle.reset();
            }
            pass_applied = 0;
        }
    }
    Ok((consumer.commits(), 0))
}

/// Runs `body` as the run's thread, aborting the run when it fails.
fn guarded(shared: &Shared, body: impl FnOnce() -> Done) -> Done {
    let _abort = AbortOnDrop(shared);
    let done = body();
    if done.is_err() {
        shared.abort.store(true, Ordering::SeqCst);
    }
    done
}

/// One run with `workers` relays and appliers on the database of `url`.
fn workers_run(
    url: &str,
    workers: usize,
    options: &PgBenchOptions,
    progress: &dyn Progress,
) -> Result<WorkersRun, Failure> {
    // Both schemas first, so that the workers only open them.
    open_producer(url, "init", 0)?;
    open_consumer(url, "init", 0)?;
    let mut wal = WalPosition::connect(url)?;
    let events = options.flows * 3;
    let shared = Shared {
        events,
        threads: PRODUCER_THREADS + 2 * workers,
        ready: AtomicU64::new(0),
        start: OnceLock::new(),
        abort: AtomicBool::new(false),
        accepted: AtomicU64::new(0),
        applied: AtomicU64::new(0),
        relayed_at: OnceLock::new(),
        applied_at: OnceLock::new(),
    };
    progress.start(&format!("{workers} workers"), events);
    let (results, produced, stalled, wal_start) = std::thread::scope(|scope| {
        let shared = &shared;
        let producers: Vec<_> = (0..PRODUCER_THREADS)
            .map(|i| {
                scope.spawn(move || {
                    let done = guarded(shared, || {
                        producer_thread(url, i, PRODUCER_THREADS, options, shared)
                    });
                    (done, Instant::now())
                })
            })
            .collect();
        let others: Vec<_> = (0..workers)
            .flat_map(|i| {
                [
                    scope.spawn(move || guarded(shared, || relay_thread(url, i, options, shared))),
                    scope.spawn(move || {
                        guarded(shared, || apply_thread(url, i, options, shared, progress))
                    }),
                ]
            })
            .collect();
        while shared.ready.load(Ordering::SeqCst) < shared.threads as u64 && !shared.aborted() {
            std::thread::sleep(IDLE_PAUSE);
        }
        let wal_start = wal.read();
        shared.start.get_or_init(Instant::now);
        // A watchdog: a run that applies nothing for STALL is aborted.
        let (mut seen, mut since) = (0, Instant::now());
        let mut stalled = false;
        while shared.applied_at.get().is_none() && !shared.aborted() {
            std::thread::sleep(Duration::from_millis(50));
            let applied = shared.applied.load(Ordering::SeqCst);
            if applied != seen {
                (seen, since) = (applied, Instant::now());
            } else if since.elapsed() >= STALL {
                stalled = true;
                shared.abort.store(true, Ordering::SeqCst);
            }
        }
        let mut produced = None::<Instant>;
        let mut results = Vec::new();
        for handle in producers {
            let (done, at) = handle.join().unwrap_or_else(|_| {
                (
                    Err(Failure::Internal("a producer panicked".into())),
                    Instant::now(),
                )
            });
            produced = produced.max(Some(at));
            results.push(done);
        }
        results.extend(join_all(others, "a worker"));
        (results, produced, stalled, wal_start)
    });
    progress.finish();
    let mut commits = 0;
    let mut deliveries = 0;
    for result in results {
        let (c, d) = result?;
        commits += c;
        deliveries += d;
    }
    let applied = shared.applied.load(Ordering::SeqCst);
    if stalled {
        return Err(Failure::Check(format!(
            "bench: {workers} workers applied {applied} of {events} events, then nothing for {} s",
            STALL.as_secs()
        )));
    }
    let wal_bytes = wal.bytes_since(&wal_start?)?;
    check_end_state(url, events)?;
    let start = *shared.start.get().expect("the run started");
    let since_start = |at: Option<&Instant>| -> Result<f64, Failure> {
        at.map(|at| at.duration_since(start).as_secs_f64())
            .ok_or_else(|| {
                Failure::Check(format!(
                    "bench: {workers} workers applied {applied} of {events} events"
                ))
            })
    };
    Ok(WorkersRun {
        workers,
        events,
        seconds: since_start(shared.applied_at.get())?,
        produced_seconds: since_start(produced.as_ref())?,
        relayed_seconds: since_start(shared.relayed_at.get())?,
        deliveries,
        commits,
        f_before_after: (0.0, 0.0),
        wal_bytes,
    })
}

/// Every event is in the outbox, accepted, and has its one effect.
fn check_end_state(url: &str, events: u64) -> Result<(), Failure> {
    let context = "bench: cannot check the end state";
    let mut client = connect(url, "ordo-bench-check")?;
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM ordo_producer.outbox),
                    (SELECT count(*) FROM ordo_producer.outbox WHERE accepted),
                    (SELECT count(*) FROM ordo_consumer.inbox WHERE status = 'applied'),
                    (SELECT count(*) FROM effect)",
            &[],
        )
        .map_err(|e| pg_error(context, e))?;
    let counts: Vec<i64> = (0..4).map(|i| row.get(i)).collect();
    let expected = i64::try_from(events).unwrap_or(i64::MAX);
    if counts.iter().any(|&n| n != expected) {
        return Err(Failure::Check(format!(
            "bench: of {events} events, the outbox holds {}, {} accepted, \
             the inbox {} applied, with {} effects",
            counts[0], counts[1], counts[2], counts[3]
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(events: u64, commits: u64) -> WorkersRun {
        WorkersRun {
            workers: 4,
            events,
            seconds: 2.0,
            produced_seconds: 1.0,
            relayed_seconds: 1.5,
            deliveries: events,
            commits,
            f_before_after: (400.0, 900.0),
            wal_bytes: 0,
        }
    }

    fn skeleton(events: u64, seconds: f64, wal_bytes: u64) -> SkeletonRun {
        SkeletonRun {
            clients: 8,
            events,
            seconds,
            wal_bytes,
        }
    }

    #[test]
    fn a_run_reports_commits_per_event_and_events_per_commit() {
        // (events, commits) -> (commits per event, events per commit)
        let cases = [
            ((3000, 500), (1.0 / 6.0, 6.0)),
            ((3000, 3000), (1.0, 1.0)),
            ((3000, 0), (0.0, 3000.0)),
            ((0, 12), (12.0, 0.0)),
            ((0, 0), (0.0, 0.0)),
        ];
        for ((events, commits), figures) in cases {
            let run = workers(events, commits);
            assert_eq!(
                (run.commits_per_event(), run.events_per_commit()),
                figures,
                "{events} events in {commits} commits"
            );
        }
    }

    #[test]
    fn the_report_spreads_f_pg_and_s_pg_and_takes_the_last_s_pg_s_wal() {
        let spread = |min, median, max| Spread { min, median, max };
        // (calibrations, S_pg measurements) ->
        // (F_pg spread, S_pg spread, WAL bytes per event of the last)
        let cases = [
            (
                (
                    vec![400.0, 450.5, 380.25],
                    vec![
                        skeleton(3000, 1.5, 3_000_000),
                        skeleton(3000, 1.0, 3_300_000),
                    ],
                ),
                (
                    spread(380.25, 400.0, 450.5),
                    spread(2000.0, 3000.0, 3000.0),
                    1100.0,
                ),
            ),
            (
                (vec![500.0], vec![skeleton(1000, 0.5, 0)]),
                (
                    spread(500.0, 500.0, 500.0),
                    spread(2000.0, 2000.0, 2000.0),
                    0.0,
                ),
            ),
            (
                (vec![500.0, 600.0], Vec::new()),
                (spread(500.0, 600.0, 600.0), spread(0.0, 0.0, 0.0), 0.0),
            ),
        ];
        for ((calibrations, skeletons), (f_pg, s_pg, wal)) in cases {
            let report = PgBenchReport {
                server: "localhost".into(),
                calibrations,
                skeletons,
                flows: 1000,
                batch: 64,
                producers: 4,
                runs: Vec::new(),
            };
            assert_eq!(report.f_pg_spread(), f_pg, "{report:?}");
            assert_eq!(report.s_pg_spread(), s_pg, "{report:?}");
            assert_eq!(report.s_pg_wal_bytes_per_event(), wal, "{report:?}");
            assert_eq!(report.events_per_run(), 3000);
        }
    }
}
