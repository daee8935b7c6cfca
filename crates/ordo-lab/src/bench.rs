//! The bench: throughput of each phase and end to end, as ratios to the
//! disk's own fsync rate F measured first on the same disk; concurrent
//! pipelines on separate threads; commit-to-applied latency at an offered
//! rate; peak memory.

use ordo_reservation::{
    AdvanceRequest, ApplyOptions, Quantity, ReservationConsumer, ReservationHandler,
    ReservationProducer,
};
use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ordo_core::{
    process_all_each, relay, ConsumerOps, Envelope, EventId, FlowId, ProducerOps, Receipt, Receive,
    RelayOptions, SchemaVersion, StoreError, SystemClock,
};
use ordo_core::{Clock, ConsumerStore, ProducerStore};
use ordo_sqlite::rusqlite::{self, Connection};
use ordo_sqlite::{ConsumerDb, ProducerDb};

use crate::bench_http::{HttpBenchReport, HttpLoad};
use crate::figures::{per, per_second, Spread};
use crate::skeleton_sqlite::{self, SkeletonRun};
use crate::{LabError as Failure, Progress, Silent, STEPS};

/// Events per flow: one per step.
pub const EVENTS_PER_FLOW: u64 = STEPS.len() as u64;
/// A run whose F moved by more than this many percent between the
/// calibrations before and after it has unreliable ratios.
pub const DRIFT_FLAGGED_PERCENT: f64 = 25.0;
/// [`DRIFT_FLAGGED_PERCENT`] as the largest [`Calibration::drift`] that is
/// not flagged.
pub const DRIFT_FLAGGED: f64 = 1.0 + DRIFT_FLAGGED_PERCENT / 100.0;
/// How long the fsync calibration runs.
pub(crate) const CALIBRATION: Duration = Duration::from_millis(1500);
/// Batch sizes of `--sweep`.
pub const SWEEP: [u64; 7] = [1, 4, 16, 64, 256, 1024, 4096];
/// The most flows of the unbatched run.
const UNBATCHED_FLOWS_MAX: u64 = 5_000;
/// Rounds of the growth measurement.
const GROWTH_ROUNDS: u64 = 10;
/// The pause of an idle pipeline stage before it looks again.
const IDLE_PAUSE: Duration = Duration::from_micros(500);
/// Rounds the two-thread pipeline hands over before it waits for the
/// oldest answer: one being received while the next is picked.
const ROUNDS_IN_FLIGHT: usize = 2;

fn internal<E: std::fmt::Display>(e: E) -> Failure {
    Failure::Internal(e.to_string())
}

pub(crate) fn flow_id(i: u64) -> FlowId {
    FlowId::new(format!("b{i:08}")).expect("bench flow ids are identifiers")
}

/// F: single-row insert-and-commit transactions per second on this disk,
/// WAL and `synchronous=FULL`, as ordo's files use.
pub(crate) fn calibrate(dir: &Path) -> Result<f64, Failure> {
    // A fresh file each time, removed with its directory afterwards.
    let scratch = tempfile::Builder::new()
        .prefix("calibrate-")
        .tempdir_in(dir)
        .map_err(internal)?;
    let path = scratch.path().join("calibrate.db");
    let conn = Connection::open(&path).map_err(internal)?;
    conn.query_row("PRAGMA journal_mode=WAL", [], |row| row.get::<_, String>(0))
        .map_err(internal)?;
    conn.execute_batch(
        "PRAGMA synchronous=FULL; CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB NOT NULL);",
    )
    .map_err(internal)?;
    let mut stmt = conn
        .prepare("INSERT INTO t (v) VALUES (?1)")
        .map_err(internal)?;
    let payload = vec![7u8; 200];
    let started = Instant::now();
    let mut commits = 0u64;
    while started.elapsed() < CALIBRATION {
        conn.execute_batch("BEGIN IMMEDIATE").map_err(internal)?;
        stmt.execute([&payload]).map_err(internal)?;
        conn.execute_batch("COMMIT").map_err(internal)?;
        commits += 1;
    }
    Ok(commits as f64 / started.elapsed().as_secs_f64())
}

fn requests(flows: std::ops::Range<u64>, step: usize) -> Vec<AdvanceRequest> {
    flows
        .map(|i| {
            AdvanceRequest::new(
                flow_id(i),
                step as i64,
                STEPS[step],
                Some(Quantity::new((i % 1000) as i64 + 1).expect("1..=1000 is a quantity")),
                SchemaVersion::V1,
            )
            .expect("bench requests are valid")
        })
        .collect()
}

/// The bench's order of production: every flow's first step, then every
/// flow's second, and so on, `batch` flows per transaction.
fn chunks(
    flows: std::ops::Range<u64>,
    batch: u64,
) -> impl Iterator<Item = (usize, std::ops::Range<u64>)> {
    (0..STEPS.len()).flat_map(move |step| {
        let end = flows.end;
        flows
            .clone()
            .step_by(batch as usize)
            .map(move |start| (step, start..(start + batch).min(end)))
    })
}

/// Commits one chunk: with `batch` 1 one `advance`, else one `advance_batch`.
fn produce_chunk(
    producer: &mut impl ReservationProducer,
    step: usize,
    range: std::ops::Range<u64>,
    batch: u64,
) -> Result<(), Failure> {
    let batch_requests = requests(range, step);
    if batch == 1 {
        producer.advance(&batch_requests[0]).map_err(internal)?;
    } else {
        for outcome in producer.advance_batch(&batch_requests)? {
            outcome.map_err(internal)?;
        }
    }
    Ok(())
}

/// Produces all steps of flows `range`, `batch` requests per transaction.
pub(crate) fn produce(
    producer: &mut impl ReservationProducer,
    range: std::ops::Range<u64>,
    batch: u64,
    progress: &dyn Progress,
) -> Result<(), Failure> {
    for (step, chunk) in chunks(range, batch) {
        let len = chunk.end - chunk.start;
        produce_chunk(producer, step, chunk, batch)?;
        progress.inc(len);
    }
    Ok(())
}

/// One relay round of up to `batch` events; returns how many moved.
fn relay_round(
    producer: &mut ProducerDb,
    consumer: &mut ConsumerDb,
    batch: u64,
) -> Result<u64, Failure> {
    let options = RelayOptions {
        max: Some(batch),
        batch_len_max: batch as usize,
        ..RelayOptions::default()
    };
    let report = relay(producer, consumer, &options, &SystemClock).map_err(internal)?;
    Ok(report.deliveries.len() as u64)
}

/// One pass of apply over every flow with work; returns how many applied.
pub(crate) fn apply_pass(consumer: &mut ConsumerDb, batch: u64) -> Result<u64, Failure> {
    let mut applied = 0;
    process_all_each(
        consumer,
        None,
        &mut ReservationHandler::default(),
        batch,
        |d| applied += d.applied,
    )?;
    Ok(applied)
}

/// Commits, and how many of them waited for the disk (the producer's
/// delivery bookkeeping does not).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Commits {
    /// Every commit.
    pub all: u64,
    /// The commits that waited for the disk.
    pub synced: u64,
}

impl Commits {
    fn producer(producer: &ProducerDb) -> Commits {
        Commits {
            all: producer.commits(),
            synced: producer.synced_commits(),
        }
    }

    fn consumer(consumer: &ConsumerDb) -> Commits {
        Commits {
            all: consumer.commits(),
            synced: consumer.commits(),
        }
    }
}

impl std::ops::Add for Commits {
    type Output = Commits;
    fn add(self, other: Commits) -> Commits {
        Commits {
            all: self.all + other.all,
            synced: self.synced + other.synced,
        }
    }
}

impl std::ops::Sub for Commits {
    type Output = Commits;
    fn sub(self, other: Commits) -> Commits {
        Commits {
            all: self.all - other.all,
            synced: self.synced - other.synced,
        }
    }
}

/// One measured phase: how long it took and what it committed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase {
    /// Wall time, in seconds.
    pub seconds: f64,
    /// Its commits.
    pub commits: Commits,
}

/// The disk's fsync-bound commit rate F, measured before and after a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// F before the run, in commits per second.
    pub before: f64,
    /// F after the run, in commits per second.
    pub after: f64,
}

impl Phase {
    /// The phase's rate for `events` events, in events per second.
    pub fn events_per_s(&self, events: u64) -> f64 {
        per_second(events, self.seconds)
    }

    /// Commits per event over `events` events.
    pub fn commits_per_event(&self, events: u64) -> f64 {
        per(self.commits.all, events)
    }

    /// Commits that waited for the disk, per event over `events` events.
    pub fn fsyncs_per_event(&self, events: u64) -> f64 {
        per(self.commits.synced, events)
    }
}

impl Calibration {
    /// F of the run: the geometric mean of the calibrations around it.
    pub fn f(&self) -> f64 {
        (self.before * self.after).sqrt()
    }

    /// A rate of the run over its F; the rate counted in whole events per
    /// second, as reported.
    pub fn ratio_to_f(&self, events_per_s: f64) -> f64 {
        events_per_s.round() / self.f()
    }

    /// How far F moved during the run: the larger calibration over the
    /// smaller, each as reported (whole commits per second, at least 1).
    pub fn drift(&self) -> f64 {
        let whole = |f: f64| f.round().max(1.0);
        let (before, after) = (whole(self.before), whole(self.after));
        before.max(after) / before.min(after)
    }

    /// Whether F moved too much for the run's ratios to be reliable.
    pub fn drifted(&self) -> bool {
        self.drift() > DRIFT_FLAGGED
    }
}

/// Produce, relay and apply, one after the other, on one thread.
#[derive(Debug, Clone, PartialEq)]
pub struct SequentialRun {
    /// Events per transaction.
    pub batch: u64,
    /// Flows run.
    pub flows: u64,
    /// Events run.
    pub events: u64,
    /// The producer's phase.
    pub produce: Phase,
    /// The relay's phase.
    pub relay: Phase,
    /// The applier's phase.
    pub apply: Phase,
    /// F around the run.
    pub calibration: Calibration,
}

impl SequentialRun {
    /// The three phases together.
    pub fn end_to_end(&self) -> Phase {
        Phase {
            seconds: self.produce.seconds + self.relay.seconds + self.apply.seconds,
            commits: self.produce.commits + self.relay.commits + self.apply.commits,
        }
    }
}

/// Commit-to-applied latency per event, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latency {
    /// The median.
    pub p50_ms: i64,
    /// The 99th percentile.
    pub p99_ms: i64,
    /// The largest.
    pub max_ms: i64,
    /// Events measured.
    pub samples: u64,
}

/// Stages running at once, every event applied.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineRun {
    /// Events per transaction.
    pub batch: u64,
    /// Events run.
    pub events: u64,
    /// The whole run.
    pub phase: Phase,
    /// Commit-to-applied latency.
    pub latency: Latency,
    /// The producer's offered rate, in events per second (as fast as it
    /// can if `None`).
    pub offered_per_s: Option<u64>,
    /// F around the run.
    pub calibration: Calibration,
}

/// How both files grow over a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrowthRun {
    /// Events run.
    pub events: u64,
    /// The producer file's size at the end, WAL checkpointed.
    pub producer_bytes: u64,
    /// The consumer file's size at the end, WAL checkpointed.
    pub consumer_bytes: u64,
    /// Both files' sizes (with their WAL) after each round.
    pub bytes_after_each_round: Vec<(u64, u64)>,
}

impl GrowthRun {
    /// The producer file's bytes per event run (not a number when no
    /// event ran).
    pub fn producer_bytes_per_event(&self) -> f64 {
        self.producer_bytes as f64 / self.events as f64
    }

    /// The consumer file's bytes per event run (not a number when no
    /// event ran).
    pub fn consumer_bytes_per_event(&self) -> f64 {
        self.consumer_bytes as f64 / self.events as f64
    }
}

/// What the bench measures.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Flows, each three events.
    pub flows: u64,
    /// Events per transaction in every phase.
    pub batch: u64,
    /// Run the sequential phases for several batch sizes ([`SWEEP`]).
    pub sweep: bool,
    /// The offered rate of the latency run, in events per second.
    pub rate: u64,
    /// Where to create the temporary files (the system's if `None`).
    pub dir: Option<PathBuf>,
    /// Measure growth with and without pruning instead of throughput.
    pub growth: bool,
    /// Measure the relay over HTTP and a server under load instead
    /// ([`crate::bench_http`]).
    pub http: Option<HttpLoad>,
}

/// The throughput figures.
#[derive(Debug, Clone)]
pub struct ThroughputReport {
    /// Flows run.
    pub flows: u64,
    /// Every calibration of F, in order.
    pub calibrations: Vec<f64>,
    /// The sequential runs, by batch size.
    pub runs: Vec<SequentialRun>,
    /// The unbatched sequential run (not with `--sweep` or a batch of 1).
    pub unbatched: Option<SequentialRun>,
    /// Producer, relay and applier on three threads.
    pub concurrent: PipelineRun,
    /// Producer file and consumer file on two threads.
    pub pipelined: PipelineRun,
    /// Three threads at an offered rate.
    pub offered: PipelineRun,
    /// The process's peak resident memory.
    pub peak_memory_bytes: Option<u64>,
    /// S_sqlite, measured before the first run and after the last
    /// ([`crate::skeleton_sqlite`]).
    pub skeletons: Vec<SkeletonRun>,
}

impl ThroughputReport {
    /// S_sqlite: the geometric mean of the skeleton's rates, in events per
    /// second (0 when it was not measured).
    pub fn s_sqlite(&self) -> f64 {
        if self.skeletons.is_empty() {
            return 0.0;
        }
        let logs: f64 = self
            .skeletons
            .iter()
            .map(|s| s.events_per_s().max(1e-9).ln())
            .sum();
        (logs / self.skeletons.len() as f64).exp()
    }

    /// The spread of the skeleton's rates.
    pub fn s_sqlite_spread(&self) -> Spread {
        let rates: Vec<f64> = self.skeletons.iter().map(|s| s.events_per_s()).collect();
        Spread::of(&rates)
    }

    /// A rate over S_sqlite, both counted in whole events per second, as
    /// reported.
    pub fn ratio_to_s(&self, events_per_s: f64) -> f64 {
        events_per_s.round() / self.s_sqlite().round().max(1.0)
    }

    /// Events of each run but the unbatched one.
    pub fn events(&self) -> u64 {
        self.flows * EVENTS_PER_FLOW
    }

    /// The spread of every calibration of F; its median is the bench's F.
    pub fn f_spread(&self) -> Spread {
        Spread::of(&self.calibrations)
    }

    /// Whether F moved too much around any run ([`Calibration::drifted`]).
    pub fn drifted(&self) -> bool {
        let sequential = self.runs.iter().chain(&self.unbatched);
        let pipelines = [&self.concurrent, &self.pipelined, &self.offered];
        sequential
            .map(|r| r.calibration)
            .chain(pipelines.map(|r| r.calibration))
            .any(|c| c.drifted())
    }
}

/// What the bench measured.
#[derive(Debug, Clone)]
pub enum BenchReport {
    /// Throughput of each phase and pipeline.
    Throughput(Box<ThroughputReport>),
    /// The relay over HTTP against the relay in process, and a server
    /// under concurrent clients.
    Http(Box<HttpBenchReport>),
    /// File growth without and with pruning.
    Growth {
        /// Nothing pruned.
        without_pruning: GrowthRun,
        /// Everything settled pruned after each round.
        with_pruning: GrowthRun,
    },
}

/// Produce, then relay, then apply, each to completion, on one thread.
fn sequential(
    dir: &Path,
    flows: u64,
    batch: u64,
    progress: &dyn Progress,
) -> Result<SequentialRun, Failure> {
    let mut producer = ordo_reservation::open_producer(dir.join("producer.db"))?;
    let mut consumer = ordo_reservation::open_consumer(dir.join("consumer.db"))?;
    let events = flows * STEPS.len() as u64;

    progress.start(&format!("produce B={batch}"), events);
    let started = Instant::now();
    produce(&mut producer, 0..flows, batch, progress)?;
    let produce_phase = Phase {
        seconds: started.elapsed().as_secs_f64(),
        commits: Commits::producer(&producer),
    };
    progress.finish();

    progress.start(&format!("relay B={batch}"), events);
    let (p0, c0) = (Commits::producer(&producer), Commits::consumer(&consumer));
    let started = Instant::now();
    let mut relayed = 0;
    loop {
        let moved = relay_round(&mut producer, &mut consumer, batch)?;
        if moved == 0 {
            break;
        }
        relayed += moved;
        progress.inc(moved);
    }
    let relay_phase = Phase {
        seconds: started.elapsed().as_secs_f64(),
        commits: Commits::producer(&producer) - p0 + Commits::consumer(&consumer) - c0,
    };
    progress.finish();

    let c0 = Commits::consumer(&consumer);
    let started = Instant::now();
    let applied = apply_pass(&mut consumer, batch)?;
    let apply_phase = Phase {
        seconds: started.elapsed().as_secs_f64(),
        commits: Commits::consumer(&consumer) - c0,
    };
    if relayed != events || applied != events {
        return Err(Failure::Check(format!(
            "bench moved {relayed} and applied {applied} of {events} events"
        )));
    }
    Ok(SequentialRun {
        batch,
        flows,
        events,
        produce: produce_phase,
        relay: relay_phase,
        apply: apply_phase,
        calibration: Calibration {
            before: 0.0,
            after: 0.0,
        },
    })
}

/// Raises its flag when dropped, so that a stage that returns early, with an
/// error or a panic, still lets the stages after it finish.
struct RaiseOnDrop(Arc<AtomicBool>);

impl Drop for RaiseOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The producer and consumer files of `dir`, created before the threads
/// that open them start.
fn create_files(dir: &Path) -> Result<(PathBuf, PathBuf), Failure> {
    let producer_path = dir.join("producer.db");
    let consumer_path = dir.join("consumer.db");
    ordo_reservation::open_producer(&producer_path)?;
    ordo_reservation::open_consumer(&consumer_path)?;
    Ok((producer_path, consumer_path))
}

/// Producer, relay and applier on three threads at once, each with its own
/// connections. With `rate`, the producer offers that many events per second
/// in 10 ms ticks; without, it produces as fast as it can.
fn concurrent(
    dir: &Path,
    flows: u64,
    batch: u64,
    rate: Option<u64>,
    label: &str,
    progress: &dyn Progress,
) -> Result<PipelineRun, Failure> {
    let (producer_path, consumer_path) = create_files(dir)?;
    let events = flows * STEPS.len() as u64;
    let produced_all = Arc::new(AtomicBool::new(false));
    let relayed_all = Arc::new(AtomicBool::new(false));
    progress.start(label, events);
    let started = Instant::now();

    let producer_thread = {
        let path = producer_path.clone();
        let done = produced_all.clone();
        std::thread::spawn(move || -> Result<Commits, Failure> {
            let _done = RaiseOnDrop(done);
            let mut producer = ordo_reservation::open_producer(&path)?;
            match rate {
                None => produce(&mut producer, 0..flows, batch, &Silent)?,
                Some(rate) => {
                    // Whole flows per tick: each tick offers rate/100 events.
                    let per_tick = (rate / 100 / STEPS.len() as u64).max(1);
                    let tick = Duration::from_millis(10);
                    let mut next = Instant::now();
                    let mut start = 0;
                    while start < flows {
                        let end = (start + per_tick).min(flows);
                        for step in 0..STEPS.len() {
                            let reqs = requests(start..end, step);
                            for outcome in producer.advance_batch(&reqs)? {
                                outcome.map_err(internal)?;
                            }
                        }
                        start = end;
                        next += tick;
                        if let Some(wait) = next.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                    }
                }
            }
            Ok(Commits::producer(&producer))
        })
    };
    let relay_thread = {
        let (p, c) = (producer_path.clone(), consumer_path.clone());
        let (produced, relayed) = (produced_all.clone(), relayed_all.clone());
        std::thread::spawn(move || -> Result<Commits, Failure> {
            let _relayed = RaiseOnDrop(relayed);
            let mut producer = ordo_reservation::open_producer(&p)?;
            let mut consumer = ordo_reservation::open_consumer(&c)?;
            loop {
                let finishing = produced.load(Ordering::SeqCst);
                if relay_round(&mut producer, &mut consumer, batch)? == 0 {
                    if finishing {
                        break;
                    }
                    std::thread::sleep(IDLE_PAUSE);
                }
            }
            Ok(Commits::producer(&producer) + Commits::consumer(&consumer))
        })
    };
    let mut consumer = ordo_reservation::open_consumer(&consumer_path)?;
    let mut applied = 0;
    loop {
        let finishing = relayed_all.load(Ordering::SeqCst);
        let n = apply_pass(&mut consumer, batch)?;
        applied += n;
        progress.inc(n);
        if n == 0 {
            if finishing {
                break;
            }
            std::thread::sleep(IDLE_PAUSE);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    progress.finish();
    let producer_commits = producer_thread
        .join()
        .map_err(|_| internal("the producer thread panicked"))??;
    let relay_commits = relay_thread
        .join()
        .map_err(|_| internal("the relay thread panicked"))??;
    let phase = Phase {
        seconds,
        commits: producer_commits + relay_commits + Commits::consumer(&consumer),
    };
    let mut run = pipeline_run(dir, events, applied, phase, batch)?;
    run.offered_per_s = rate;
    Ok(run)
}

/// Producer-file work and consumer-file work on two threads, one per core.
/// The producer thread produces and runs the producer side of the relay
/// (the fair round, recording the receipts); the consumer thread receives
/// and applies, one apply transaction at a time so that a round never waits
/// for more than one. Up to [`ROUNDS_IN_FLIGHT`] rounds are in flight, on
/// disjoint flows (a flow's next event is picked only once the receipt of
/// the one before is recorded); meanwhile the producer thread goes on
/// producing and recording.
fn two_files(
    dir: &Path,
    flows: u64,
    batch: u64,
    progress: &Arc<dyn Progress>,
) -> Result<PipelineRun, Failure> {
    use std::sync::mpsc;
    let (producer_path, consumer_path) = create_files(dir)?;
    let events = flows * STEPS.len() as u64;
    let (round_tx, round_rx) = mpsc::channel::<Vec<Envelope>>();
    let (receipts_tx, receipts_rx) = mpsc::channel::<Result<Vec<Receipt>, StoreError>>();
    progress.start("pipelined", events);
    let started = Instant::now();

    let consumer_thread = {
        let path = consumer_path.clone();
        let progress = progress.clone();
        std::thread::spawn(move || -> Result<(Commits, u64), Failure> {
            let mut consumer = ordo_reservation::open_consumer(&path)?;
            let options = ApplyOptions::default();
            let mut applied = 0;
            let mut producer_done = false;
            // The producer side waits for each answer; a closed channel
            // means it stopped, which its own result says.
            let answer = |consumer: &mut ConsumerDb, round: Vec<Envelope>| {
                let _ = receipts_tx.send(consumer.receive_batch(&round));
            };
            loop {
                match round_rx.try_recv() {
                    Ok(round) => {
                        answer(&mut consumer, round);
                        continue;
                    }
                    Err(mpsc::TryRecvError::Disconnected) => producer_done = true,
                    Err(mpsc::TryRecvError::Empty) => {}
                }
                let flows: Vec<(ordo_core::InboxFlow, Option<u64>)> = consumer
                    .flows_with_work_page(None, batch as usize, &[])?
                    .into_iter()
                    .map(|flow| (flow, None))
                    .collect();
                let n: u64 = consumer
                    .apply_batch(&flows, batch, options)?
                    .iter()
                    .map(|drain| drain.applied)
                    .sum();
                applied += n;
                progress.inc(n);
                if n == 0 {
                    if producer_done {
                        return Ok((Commits::consumer(&consumer), applied));
                    }
                    if let Ok(round) = round_rx.recv_timeout(IDLE_PAUSE) {
                        answer(&mut consumer, round);
                    }
                }
            }
        })
    };

    let producer_side = (|| -> Result<Commits, Failure> {
        let mut producer = ordo_reservation::open_producer(&producer_path)?;
        let mut work = chunks(0..flows, batch);
        // Rounds handed over and not yet answered, oldest first (the
        // consumer answers in order), and their flows, which the next
        // round skips: a flow has at most one event in flight.
        let mut in_flight: VecDeque<Vec<(EventId, FlowId)>> = VecDeque::new();
        let mut skip: BTreeSet<FlowId> = BTreeSet::new();
        // Records the answer to the oldest round in flight.
        fn record(
            producer: &mut ProducerDb,
            in_flight: &mut VecDeque<Vec<(EventId, FlowId)>>,
            skip: &mut BTreeSet<FlowId>,
            answer: Result<Vec<Receipt>, StoreError>,
        ) -> Result<(), Failure> {
            let round = in_flight
                .pop_front()
                .expect("an answer is to a round in flight");
            let receipts: Vec<(EventId, Receipt)> = round
                .iter()
                .map(|(id, _)| id.clone())
                .zip(answer?)
                .collect();
            producer.record_receipts(&receipts, SystemClock.now_ms())?;
            for (_, flow) in &round {
                skip.remove(flow);
            }
            Ok(())
        }
        let mut producing = true;
        loop {
            if producing {
                match work.next() {
                    Some((step, range)) => produce_chunk(&mut producer, step, range, batch)?,
                    None => producing = false,
                }
            }
            // Record the answers already there, without waiting.
            while !in_flight.is_empty() {
                match receipts_rx.try_recv() {
                    Ok(answer) => record(&mut producer, &mut in_flight, &mut skip, answer)?,
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        return Err(internal("the consumer thread stopped"))
                    }
                }
            }
            let round = if in_flight.len() < ROUNDS_IN_FLIGHT {
                // Each flow's head alone: a flow rarely has more than one
                // event due when a round is taken here, and deeper rounds
                // measured slower in this shape (docs/performance.md).
                producer.fair_round(batch as usize, &skip, SystemClock.now_ms())?
            } else {
                Vec::new()
            };
            if round.is_empty() {
                if producing {
                    continue;
                }
                if in_flight.is_empty() {
                    return Ok(Commits::producer(&producer));
                }
                // Nothing left but the answers: wait for the oldest.
                let answer = receipts_rx
                    .recv()
                    .map_err(|_| internal("the consumer thread stopped"))?;
                record(&mut producer, &mut in_flight, &mut skip, answer)?;
                continue;
            }
            skip.extend(round.iter().map(|e| e.flow_id.clone()));
            in_flight.push_back(
                round
                    .iter()
                    .map(|e| (e.event_id.clone(), e.flow_id.clone()))
                    .collect(),
            );
            round_tx
                .send(round)
                .map_err(|_| internal("the consumer thread stopped"))?;
        }
    })();
    // Closing the channel tells the consumer thread to finish applying.
    drop(round_tx);
    let consumer_result = consumer_thread
        .join()
        .map_err(|_| internal("the consumer thread panicked"))?;
    // The consumer's own error first: the producer side only sees it stop.
    let (consumer_commits, applied) = consumer_result?;
    let producer_commits = producer_side?;
    let seconds = started.elapsed().as_secs_f64();
    progress.finish();
    let phase = Phase {
        seconds,
        commits: producer_commits + consumer_commits,
    };
    pipeline_run(dir, events, applied, phase, batch)
}

/// A run whose stages ran at once: all events applied, the phase, the
/// batch size and the commit-to-applied latency.
fn pipeline_run(
    dir: &Path,
    events: u64,
    applied: u64,
    phase: Phase,
    batch: u64,
) -> Result<PipelineRun, Failure> {
    if applied != events {
        return Err(Failure::Check(format!(
            "bench applied {applied} of {events} events"
        )));
    }
    Ok(PipelineRun {
        batch,
        events,
        phase,
        latency: latency(&dir.join("producer.db"), &dir.join("consumer.db"))?,
        offered_per_s: None,
        calibration: Calibration {
            before: 0.0,
            after: 0.0,
        },
    })
}

/// Commit-to-applied latency per event: the outbox row's creation time to
/// the inbox row's application time (millisecond clock).
fn latency(producer: &Path, consumer: &Path) -> Result<Latency, Failure> {
    let conn = Connection::open(consumer).map_err(internal)?;
    conn.execute("ATTACH DATABASE ?1 AS p", [producer.to_string_lossy()])
        .map_err(internal)?;
    // A histogram by millisecond, so memory does not grow with the events.
    let mut stmt = conn
        .prepare(
            "SELECT i.settled_at_ms - o.created_at_ms AS ms, count(*) FROM main.inbox i
             JOIN p.outbox o ON o.event_id = i.event_id WHERE i.settled_at_ms IS NOT NULL
             GROUP BY ms ORDER BY ms",
        )
        .map_err(internal)?;
    let histogram: Vec<(i64, u64)> = stmt
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .map_err(internal)?
        .collect::<rusqlite::Result<_>>()
        .map_err(internal)?;
    let samples: u64 = histogram.iter().map(|(_, n)| n).sum();
    // The sample at rank round((samples - 1) * q), counting from 0.
    let at = |q: f64| -> i64 {
        let rank = (samples.saturating_sub(1) as f64 * q).round() as u64;
        let mut seen = 0;
        for (ms, n) in &histogram {
            seen += n;
            if seen > rank {
                return *ms;
            }
        }
        0
    };
    Ok(Latency {
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        max_ms: histogram.last().map(|(ms, _)| *ms).unwrap_or(0),
        samples,
    })
}

/// Runs `flows` flows through in rounds, pruning everything settled after
/// each round when `prune`, and reports the size of both files afterwards
/// (WAL checkpointed into the file).
fn growth(
    dir: &Path,
    flows: u64,
    batch: u64,
    prune: bool,
    progress: &dyn Progress,
) -> Result<GrowthRun, Failure> {
    let producer_path = dir.join("producer.db");
    let consumer_path = dir.join("consumer.db");
    let mut producer = ordo_reservation::open_producer(&producer_path)?;
    let mut consumer = ordo_reservation::open_consumer(&consumer_path)?;
    let label = if prune { "growth+prune" } else { "growth" };
    progress.start(label, flows * STEPS.len() as u64);
    let per_round = flows.div_ceil(GROWTH_ROUNDS);
    let mut start = 0;
    let mut sizes = Vec::new();
    while start < flows {
        let end = (start + per_round).min(flows);
        produce(&mut producer, start..end, batch, &Silent)?;
        while relay_round(&mut producer, &mut consumer, batch)? > 0 {}
        let applied = apply_pass(&mut consumer, batch)?;
        progress.inc(applied);
        if prune {
            let cutoff_ms = SystemClock.now_ms() + 1;
            producer.prune_outbox(cutoff_ms)?;
            consumer.prune_inbox(cutoff_ms)?;
        }
        sizes.push((file_bytes(&producer_path)?, file_bytes(&consumer_path)?));
        start = end;
    }
    progress.finish();
    drop((producer, consumer));
    Ok(GrowthRun {
        events: flows * STEPS.len() as u64,
        producer_bytes: checkpointed_bytes(&producer_path)?,
        consumer_bytes: checkpointed_bytes(&consumer_path)?,
        bytes_after_each_round: sizes,
    })
}

/// The size of a database file after its WAL is checkpointed into it.
fn checkpointed_bytes(path: &Path) -> Result<u64, Failure> {
    let conn = Connection::open(path).map_err(internal)?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .map_err(internal)?;
    drop(conn);
    file_bytes(path)
}

fn file_bytes(path: &Path) -> Result<u64, Failure> {
    let wal = path.with_extension("db-wal");
    let main = std::fs::metadata(path).map_err(internal)?.len();
    Ok(main + std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0))
}

/// The process's peak resident memory, from /proc.
fn peak_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

pub(crate) fn fresh_dir(root: &Path, name: &str) -> Result<PathBuf, Failure> {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).map_err(internal)?;
    Ok(dir)
}

/// The label of the calibration phase.
const CALIBRATING: &str = "calibrating F (single-row commits, WAL, synchronous=FULL)";

/// Runs the bench in a temporary directory under `options.dir`.
pub fn run(options: &BenchOptions, progress: Arc<dyn Progress>) -> Result<BenchReport, Failure> {
    let root = tempfile::Builder::new()
        .prefix("ordo-bench-")
        .tempdir_in(options.dir.as_deref().unwrap_or(&std::env::temp_dir()))
        .map_err(|e| Failure::Internal(format!("cannot create a temporary directory: {e}")))?;
    let (flows, batch) = (options.flows, options.batch);
    if let Some(load) = &options.http {
        let report = crate::bench_http::run(root.path(), flows, batch, load, progress.as_ref())?;
        return Ok(BenchReport::Http(Box::new(report)));
    }
    if options.growth {
        let progress = progress.as_ref();
        return Ok(BenchReport::Growth {
            without_pruning: growth(
                &fresh_dir(root.path(), "growth-keep")?,
                flows,
                batch,
                false,
                progress,
            )?,
            with_pruning: growth(
                &fresh_dir(root.path(), "growth-prune")?,
                flows,
                batch,
                true,
                progress,
            )?,
        });
    }
    throughput(options, root.path(), progress)
        .map(|report| BenchReport::Throughput(Box::new(report)))
}

/// F, measured with the calibration shown as a phase of unknown length.
fn calibrated(root: &Path, progress: &dyn Progress) -> Result<f64, Failure> {
    progress.start(CALIBRATING, 0);
    let f = calibrate(root);
    progress.finish();
    f
}

/// Every calibration of F, one before the first run and one after each.
struct Calibrations(Vec<f64>);

impl Calibrations {
    /// The calibration around a run just made.
    fn around(&mut self, root: &Path, progress: &dyn Progress) -> Result<Calibration, Failure> {
        let before = *self.0.last().expect("F was measured before the first run");
        let after = calibrated(root, progress)?;
        self.0.push(after);
        Ok(Calibration { before, after })
    }
}

fn throughput(
    options: &BenchOptions,
    root: &Path,
    progress: Arc<dyn Progress>,
) -> Result<ThroughputReport, Failure> {
    // The disk's rate drifts (other tenants, writeback), so F is measured
    // before and after every run, and each run's ratios use the geometric
    // mean of the two; the run records both, so a drifting disk shows.
    let shown = progress.as_ref();
    let mut fs = Calibrations(vec![calibrated(root, shown)?]);
    let (flows, batch) = (options.flows, options.batch);
    let skeleton =
        |name: &str| skeleton_sqlite::measure(&fresh_dir(root, name)?, flows, batch, shown);
    let mut skeletons = vec![skeleton("skeleton-before")?];
    let batches: Vec<u64> = if options.sweep {
        SWEEP.to_vec()
    } else {
        vec![batch]
    };
    let mut runs = Vec::new();
    for b in &batches {
        let dir = fresh_dir(root, &format!("seq-{b}"))?;
        let mut run = sequential(&dir, flows, *b, shown)?;
        run.calibration = fs.around(root, shown)?;
        runs.push(run);
    }
    let unbatched = if options.sweep || batch == 1 {
        None
    } else {
        // Four commits per event: a few thousand flows measure it well.
        let flows = flows.min(UNBATCHED_FLOWS_MAX);
        let mut run = sequential(&fresh_dir(root, "seq-1")?, flows, 1, shown)?;
        run.calibration = fs.around(root, shown)?;
        Some(run)
    };
    let mut concurrent_run = concurrent(
        &fresh_dir(root, "concurrent")?,
        flows,
        batch,
        None,
        "concurrent",
        shown,
    )?;
    concurrent_run.calibration = fs.around(root, shown)?;
    let mut pipelined = two_files(&fresh_dir(root, "pipelined")?, flows, batch, &progress)?;
    pipelined.calibration = fs.around(root, shown)?;
    let offered_dir = fresh_dir(root, "offered")?;
    let mut offered = concurrent(
        &offered_dir,
        flows,
        batch,
        Some(options.rate),
        "offered",
        shown,
    )?;
    offered.calibration = fs.around(root, shown)?;
    skeletons.push(skeleton("skeleton-after")?);
    Ok(ThroughputReport {
        flows,
        calibrations: fs.0,
        runs,
        unbatched,
        concurrent: concurrent_run,
        pipelined,
        offered,
        peak_memory_bytes: peak_memory_bytes(),
        skeletons,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(seconds: f64, all: u64, synced: u64) -> Phase {
        Phase {
            seconds,
            commits: Commits { all, synced },
        }
    }

    fn calibration(before: f64, after: f64) -> Calibration {
        Calibration { before, after }
    }

    #[test]
    fn a_phase_has_a_rate_and_commits_per_event() {
        // (seconds, commits, synced, events) -> (events/s, commits/event, fsyncs/event)
        let cases = [
            ((1.5, 30, 10, 3000), (2000.0, 0.01, 1.0 / 300.0)),
            ((0.25, 4, 4, 1), (4.0, 4.0, 4.0)),
            ((2.0, 0, 0, 0), (0.0, 0.0, 0.0)),
            // No time and no event: still finite.
            ((0.0, 7, 3, 0), (0.0, 7.0, 3.0)),
            ((0.0, 1, 0, 3), (3e9, 1.0 / 3.0, 0.0)),
        ];
        for ((seconds, all, synced, events), (rate, commits, fsyncs)) in cases {
            let p = phase(seconds, all, synced);
            let got = (
                p.events_per_s(events),
                p.commits_per_event(events),
                p.fsyncs_per_event(events),
            );
            assert_eq!(got, (rate, commits, fsyncs), "{p:?}, {events} events");
        }
    }

    #[test]
    fn a_run_s_f_is_the_geometric_mean_and_its_ratios_use_whole_rates() {
        // (before, after, events/s) -> (F, ratio to F)
        let cases = [
            ((400.0, 900.0, 1200.0), (600.0, 2.0)),
            ((400.0, 900.0, 1200.4), (600.0, 2.0)),
            ((400.0, 900.0, 299.5), (600.0, 0.5)),
            ((800.0, 800.0, 0.0), (800.0, 0.0)),
            ((0.0, 800.0, 10.0), (0.0, f64::INFINITY)),
        ];
        for ((before, after, rate), (f, ratio)) in cases {
            let c = calibration(before, after);
            assert_eq!((c.f(), c.ratio_to_f(rate)), (f, ratio), "{c:?} at {rate}/s");
        }
    }

    #[test]
    fn drift_is_the_larger_whole_calibration_over_the_smaller() {
        // (before, after) -> (drift, flagged)
        let cases = [
            ((800.0, 800.0), (1.0, false)),
            ((1000.0, 1250.0), (1.25, false)),
            ((1250.0, 1000.0), (1.25, false)),
            ((1000.0, 1251.0), (1.251, true)),
            ((1251.0, 1000.0), (1.251, true)),
            // As reported: 999.6 and 1250.4 are 1000 and 1250.
            ((999.6, 1250.4), (1.25, false)),
            ((1000.4, 1250.6), (1.251, true)),
            // Below one commit per second counts as one.
            ((0.0, 800.0), (800.0, true)),
            ((0.2, 0.4), (1.0, false)),
        ];
        for ((before, after), (drift, flagged)) in cases {
            let c = calibration(before, after);
            assert!((c.drift() - drift).abs() < 1e-12, "{c:?}: {}", c.drift());
            assert_eq!(c.drifted(), flagged, "{c:?}");
        }
        assert_eq!(DRIFT_FLAGGED, 1.25);
    }

    #[test]
    fn growth_is_bytes_per_event_run() {
        // (events, producer bytes, consumer bytes) -> (per event each)
        let cases = [
            ((3000, 1_000_000, 2_400_000), (1_000_000.0 / 3000.0, 800.0)),
            ((1, 4096, 8192), (4096.0, 8192.0)),
        ];
        for ((events, producer_bytes, consumer_bytes), (producer, consumer)) in cases {
            let g = GrowthRun {
                events,
                producer_bytes,
                consumer_bytes,
                bytes_after_each_round: Vec::new(),
            };
            let got = (g.producer_bytes_per_event(), g.consumer_bytes_per_event());
            assert_eq!(got, (producer, consumer), "{g:?}");
        }
        let none = GrowthRun {
            events: 0,
            producer_bytes: 4096,
            consumer_bytes: 0,
            bytes_after_each_round: Vec::new(),
        };
        assert!(none.producer_bytes_per_event().is_infinite());
        assert!(none.consumer_bytes_per_event().is_nan());
    }

    fn sequential_at(c: Calibration) -> SequentialRun {
        SequentialRun {
            batch: 16,
            flows: 10,
            events: 30,
            produce: phase(1.0, 3, 3),
            relay: phase(1.0, 3, 3),
            apply: phase(1.0, 3, 3),
            calibration: c,
        }
    }

    fn pipeline_at(c: Calibration) -> PipelineRun {
        PipelineRun {
            batch: 16,
            events: 30,
            phase: phase(1.0, 3, 3),
            latency: Latency {
                p50_ms: 1,
                p99_ms: 2,
                max_ms: 3,
                samples: 30,
            },
            offered_per_s: None,
            calibration: c,
        }
    }

    #[test]
    fn s_sqlite_is_the_geometric_mean_of_the_skeleton_s_runs() {
        let skeleton = |events: u64, seconds: f64| SkeletonRun {
            batch: 16,
            events,
            seconds,
            commits: 0,
            synced_commits: 0,
            written: Default::default(),
        };
        // (skeleton runs, a rate) -> (S_sqlite, the rate's ratio to it)
        let cases = [
            (
                vec![skeleton(3000, 1.5), skeleton(3000, 0.375)],
                6000.4,
                (4000.0, 1.5),
            ),
            (vec![skeleton(1000, 0.5)], 1000.0, (2000.0, 0.5)),
            (vec![], 1000.0, (0.0, 1000.0)),
        ];
        for (skeletons, rate, (s, ratio)) in cases {
            let mut report = ThroughputReport {
                flows: 10,
                calibrations: vec![800.0],
                runs: Vec::new(),
                unbatched: None,
                concurrent: pipeline_at(calibration(800.0, 800.0)),
                pipelined: pipeline_at(calibration(800.0, 800.0)),
                offered: pipeline_at(calibration(800.0, 800.0)),
                peak_memory_bytes: None,
                skeletons: Vec::new(),
            };
            report.skeletons = skeletons;
            assert!((report.s_sqlite() - s).abs() < 1e-6, "{report:?}");
            let rates: Vec<f64> = report.skeletons.iter().map(|r| r.events_per_s()).collect();
            assert_eq!(report.s_sqlite_spread(), Spread::of(&rates));
            assert_eq!(report.ratio_to_s(rate), ratio, "{report:?}");
        }
    }

    #[test]
    fn a_throughput_report_is_flagged_when_any_run_drifted() {
        let steady = calibration(800.0, 810.0);
        let moved = calibration(800.0, 1100.0);
        // Which run moved: none, a sequential one, the unbatched one, and
        // each pipeline.
        let cases = [
            ([steady; 6], false),
            ([steady, moved, steady, steady, steady, steady], true),
            ([steady, steady, moved, steady, steady, steady], true),
            ([steady, steady, steady, moved, steady, steady], true),
            ([steady, steady, steady, steady, moved, steady], true),
            ([steady, steady, steady, steady, steady, moved], true),
        ];
        for (runs, flagged) in cases {
            let report = ThroughputReport {
                flows: 10,
                calibrations: vec![900.0, 700.0, 800.0, 1100.0],
                runs: vec![sequential_at(runs[0]), sequential_at(runs[1])],
                unbatched: Some(sequential_at(runs[2])),
                concurrent: pipeline_at(runs[3]),
                pipelined: pipeline_at(runs[4]),
                offered: pipeline_at(runs[5]),
                peak_memory_bytes: None,
                skeletons: Vec::new(),
            };
            assert_eq!(report.drifted(), flagged, "{runs:?}");
            assert_eq!(report.events(), 30);
            assert_eq!(
                report.f_spread(),
                Spread {
                    min: 700.0,
                    median: 900.0,
                    max: 1100.0
                }
            );
        }
    }
}
