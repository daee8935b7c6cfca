//! The producers bench: N threads of one process, each advancing its own
//! flows as fast as its commits come back, through one group-committing
//! writer; events per second as a ratio to the disk's fsync rate F measured
//! in the same run, latency from submit to durable, and each producer's
//! count (fairness). One thread calling `advance` directly, without the
//! writer, is measured too, as today's single append, and one thread
//! calling `advance_batch` of [`BATCH_LEN`] requests, the single-threaded
//! batched append that many producers through the writer are judged
//! against; each run's rate is given as a ratio to both.
//!
//! Flows are numbered by one counter that every producer of a run shares,
//! as a service numbers its orders: a producer that has taken a flow
//! through its three steps takes the next number. The number becomes the
//! flow id as is ([`FlowIds::Sequential`]) or hashed
//! ([`FlowIds::Random`]); which one decides how many places of each index
//! one group transaction writes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use ordo_core::{FlowId, SchemaVersion};
use ordo_reservation::{
    advance_in, Advance, AdvanceError, AdvanceRequest, Quantity, ReservationProducer,
};
use ordo_sqlite::{GroupOptions, GroupWriter, ProducerDb, SubmitError};

use crate::figures::{per, per_second, Spread};
use crate::{LabError, Progress, STEPS};

/// The most producers of one run.
pub const PRODUCERS_MAX: usize = 1_024;
/// The producer counts measured unless told otherwise.
pub const PRODUCERS_DEFAULT: [usize; 3] = [1, 16, 64];
/// How long each run lasts unless told otherwise.
pub const RUN_DEFAULT: Duration = Duration::from_secs(3);
/// Requests per `advance_batch` of the batched baseline, as the main
/// bench's batches.
pub const BATCH_LEN: u64 = 256;

/// How a flow's number becomes its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowIds {
    /// The number itself, zero-padded (`000000000042`), as an order number
    /// or a time-ordered id: the flows in flight at one time are neighbours
    /// in every index, so a group transaction writes few pages per event.
    Sequential,
    /// A hash of the number (16 hex digits), as a random UUID: each event
    /// of a group transaction writes its own page of each index.
    Random,
}

impl FlowIds {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            FlowIds::Sequential => "sequential",
            FlowIds::Random => "random",
        }
    }

    /// The id of flow number `k`.
    fn id(self, k: u64) -> FlowId {
        let id = match self {
            FlowIds::Sequential => format!("{k:012}"),
            FlowIds::Random => format!("{:016x}", mix(k)),
        };
        FlowId::new(id).expect("bench flow ids are identifiers")
    }
}

/// SplitMix64's finaliser: a bijection of u64, so distinct numbers give
/// distinct ids.
fn mix(k: u64) -> u64 {
    let mut z = k.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What the producers bench measures.
#[derive(Debug, Clone)]
pub struct ProducersOptions {
    /// The producer counts, one run each, in this order.
    pub counts: Vec<usize>,
    /// How flow numbers become flow ids.
    pub flow_ids: FlowIds,
    /// How long each run lasts.
    pub run: Duration,
    /// Where to create the temporary files (the system's if `None`).
    pub dir: Option<PathBuf>,
}

/// Latency from submit to durable, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SubmitLatency {
    /// The median.
    pub p50_ms: f64,
    /// The 99th percentile.
    pub p99_ms: f64,
    /// The 99.9th percentile.
    pub p999_ms: f64,
    /// The largest.
    pub max_ms: f64,
}

/// Events committed by each producer of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerProducer {
    /// The fewest.
    pub min: u64,
    /// The most.
    pub max: u64,
    /// The mean.
    pub mean: f64,
}

/// One run: N producers sharing a writer for a while.
#[derive(Debug, Clone, PartialEq)]
pub struct ProducersRun {
    /// Producer threads.
    pub producers: usize,
    /// Events committed.
    pub events: u64,
    /// Transactions committed.
    pub commits: u64,
    /// Wall time, in seconds.
    pub seconds: f64,
    /// F before and after the run, in commits per second.
    pub f_before_after: (f64, f64),
    /// Submit to durable.
    pub latency: SubmitLatency,
    /// Fairness.
    pub per_producer: PerProducer,
}

impl ProducersRun {
    /// Events per second.
    pub fn events_per_s(&self) -> f64 {
        per_second(self.events, self.seconds)
    }

    /// F of the run: the geometric mean of the calibrations around it.
    pub fn f(&self) -> f64 {
        (self.f_before_after.0 * self.f_before_after.1).sqrt()
    }

    /// Events per second over F.
    pub fn ratio_to_f(&self) -> f64 {
        self.events_per_s() / self.f().max(1e-9)
    }

    /// Events per transaction committed.
    pub fn events_per_commit(&self) -> f64 {
        per(self.events, self.commits)
    }
}

/// What the producers bench measured.
#[derive(Debug, Clone)]
pub struct ProducersReport {
    /// How flow numbers became flow ids.
    pub flow_ids: FlowIds,
    /// One thread calling `advance` directly, without the writer.
    pub direct: ProducersRun,
    /// One thread calling `advance_batch` of [`BATCH_LEN`] requests.
    pub batched: ProducersRun,
    /// One run per producer count, through the writer.
    pub runs: Vec<ProducersRun>,
    /// Every calibration of F, in order.
    pub calibrations: Vec<f64>,
}

impl ProducersReport {
    /// A run's events per second over the direct `advance`'s.
    pub fn ratio_to_direct(&self, run: &ProducersRun) -> f64 {
        run.events_per_s() / self.direct.events_per_s().max(1e-9)
    }

    /// A run's events per second over the batched append's.
    pub fn ratio_to_batched(&self, run: &ProducersRun) -> f64 {
        run.events_per_s() / self.batched.events_per_s().max(1e-9)
    }

    /// The spread of every calibration of F; its median is the bench's F.
    pub fn f_spread(&self) -> Spread {
        Spread::of(&self.calibrations)
    }
}

/// Step `step` of flow number `k`.
fn request(flow_ids: FlowIds, k: u64, step: usize) -> AdvanceRequest {
    AdvanceRequest::new(
        flow_ids.id(k),
        step as i64,
        STEPS[step],
        Some(Quantity::new(1 + (k % 1_000) as i64).expect("1..=1000 is a quantity")),
        SchemaVersion::V1,
    )
    .expect("bench requests are valid")
}

/// What one producer thread did: its latencies, in microseconds.
type Samples = Vec<u32>;

/// How a producer commits one advance.
trait Commit: Sync {
    fn commit(&self, request: AdvanceRequest) -> Result<Advance, LabError>;
}

impl Commit for GroupWriter {
    fn commit(&self, request: AdvanceRequest) -> Result<Advance, LabError> {
        self.submit(move |ptx| advance_in(ptx, &request))
            .map_err(|e| match e {
                SubmitError::Unit(AdvanceError::Store(e)) | SubmitError::Store(e) => e.into(),
                other => LabError::Internal(other.to_string()),
            })
    }
}

/// What the producers of one run share.
struct Race<'a> {
    commit: &'a dyn Commit,
    flow_ids: FlowIds,
    /// The next flow number.
    next_flow: AtomicU64,
}

/// One producer: takes the next flow number, advances that flow through
/// its steps, and again, until `end`.
fn produce(race: &Race<'_>, end: Instant) -> Result<Samples, LabError> {
    let mut samples = Samples::new();
    let mut k = race.next_flow.fetch_add(1, Ordering::Relaxed);
    let mut step = 0;
    while Instant::now() < end {
        let submitted = Instant::now();
        match race.commit.commit(request(race.flow_ids, k, step))? {
            Advance::Committed(_) => {}
            other => return Err(LabError::Check(format!("bench advance was {other:?}"))),
        }
        let us = submitted.elapsed().as_micros();
        samples.push(u32::try_from(us).unwrap_or(u32::MAX));
        step += 1;
        if step == STEPS.len() {
            (k, step) = (race.next_flow.fetch_add(1, Ordering::Relaxed), 0);
        }
    }
    Ok(samples)
}

/// `producers` threads, started together, each producing until `run` ends.
fn race(
    producers: usize,
    commit: &dyn Commit,
    flow_ids: FlowIds,
    run: Duration,
) -> Result<Vec<Samples>, LabError> {
    let barrier = Barrier::new(producers);
    let race = Race {
        commit,
        flow_ids,
        next_flow: AtomicU64::new(0),
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..producers)
            .map(|_| {
                let (barrier, race) = (&barrier, &race);
                scope.spawn(move || {
                    barrier.wait();
                    produce(race, Instant::now() + run)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| LabError::Internal("a producer thread panicked".into()))?
            })
            .collect()
    })
}

/// The sample at rank `round((n - 1) * q)` of sorted samples, in ms.
fn quantile_ms(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() - 1) as f64 * q).round() as usize;
    f64::from(sorted[rank]) / 1_000.0
}

fn summarize(producers: usize, samples: Vec<Samples>, seconds: f64, commits: u64) -> ProducersRun {
    let counts: Vec<u64> = samples.iter().map(|s| s.len() as u64).collect();
    let mut all: Vec<u32> = samples.into_iter().flatten().collect();
    all.sort_unstable();
    let events = all.len() as u64;
    ProducersRun {
        producers,
        events,
        commits,
        seconds,
        f_before_after: (0.0, 0.0),
        latency: SubmitLatency {
            p50_ms: quantile_ms(&all, 0.5),
            p99_ms: quantile_ms(&all, 0.99),
            p999_ms: quantile_ms(&all, 0.999),
            max_ms: quantile_ms(&all, 1.0),
        },
        per_producer: PerProducer {
            min: counts.iter().copied().min().unwrap_or(0),
            max: counts.iter().copied().max().unwrap_or(0),
            mean: events as f64 / producers.max(1) as f64,
        },
    }
}

/// `producers` threads through one group writer on a fresh file in `dir`.
fn grouped(
    dir: &Path,
    producers: usize,
    flow_ids: FlowIds,
    run: Duration,
) -> Result<ProducersRun, LabError> {
    let db = ordo_reservation::open_producer(dir.join("producer.db"))?;
    let writer = GroupWriter::start(db, GroupOptions::default())?;
    let started = Instant::now();
    let samples = race(producers, &writer, flow_ids, run);
    let seconds = started.elapsed().as_secs_f64();
    let db = writer.close();
    Ok(summarize(producers, samples?, seconds, db.commits()))
}

/// Today's single append: one thread, `advance` on its own connection.
struct Direct(std::sync::Mutex<ProducerDb>);

impl Commit for Direct {
    fn commit(&self, request: AdvanceRequest) -> Result<Advance, LabError> {
        let mut db = self.0.lock().unwrap_or_else(|e| e.into_inner());
        db.advance(&request)
            .map_err(|e| LabError::Internal(e.to_string()))
    }
}

fn direct(dir: &Path, flow_ids: FlowIds, run: Duration) -> Result<ProducersRun, LabError> {
    let db = Direct(std::sync::Mutex::new(ordo_reservation::open_producer(
        dir.join("producer.db"),
    )?));
    let started = Instant::now();
    let samples = race(1, &db, flow_ids, run)?;
    let seconds = started.elapsed().as_secs_f64();
    let commits = db.0.lock().unwrap_or_else(|e| e.into_inner()).commits();
    Ok(summarize(1, samples, seconds, commits))
}

/// The single-threaded batched append: one thread, `advance_batch` of
/// [`BATCH_LEN`] requests (one step of as many consecutive flows) per
/// transaction, until `run` ends; each event's latency is its batch's.
fn batched(dir: &Path, flow_ids: FlowIds, run: Duration) -> Result<ProducersRun, LabError> {
    let mut db = ordo_reservation::open_producer(dir.join("producer.db"))?;
    let mut samples = Samples::new();
    let started = Instant::now();
    let end = started + run;
    let mut first = 0;
    'run: loop {
        for step in 0..STEPS.len() {
            if Instant::now() >= end {
                break 'run;
            }
            let requests: Vec<_> = (first..first + BATCH_LEN)
                .map(|k| request(flow_ids, k, step))
                .collect();
            let submitted = Instant::now();
            let outcomes = db.advance_batch(&requests)?;
            if let Some(other) = outcomes
                .iter()
                .find(|o| !matches!(o, Ok(Advance::Committed(_))))
            {
                return Err(LabError::Check(format!("bench advance was {other:?}")));
            }
            let us = u32::try_from(submitted.elapsed().as_micros()).unwrap_or(u32::MAX);
            samples.extend(std::iter::repeat_n(us, outcomes.len()));
        }
        first += BATCH_LEN;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(summarize(1, vec![samples], seconds, db.commits()))
}

/// A new directory under `root` for run number `run`, so that no two runs
/// (two of the same count among them) share a file.
fn fresh_dir(root: &Path, run: usize, name: &str) -> Result<PathBuf, LabError> {
    let dir = root.join(format!("{run:03}-{}", name.replace(' ', "-")));
    std::fs::create_dir(&dir).map_err(crate::internal)?;
    Ok(dir)
}

/// F, shown as a phase of unknown length.
fn calibrated(root: &Path, progress: &dyn Progress) -> Result<f64, LabError> {
    progress.start(
        "calibrating F (single-row commits, WAL, synchronous=FULL)",
        0,
    );
    let f = crate::bench::calibrate(root);
    progress.finish();
    f
}

/// Runs the direct baseline, then one run per producer count, each between
/// two calibrations of F, in a temporary directory under `options.dir`.
pub fn run(
    options: &ProducersOptions,
    progress: &dyn Progress,
) -> Result<ProducersReport, LabError> {
    if let Some(bad) = options
        .counts
        .iter()
        .find(|&&n| n == 0 || n > PRODUCERS_MAX)
    {
        return Err(LabError::Usage(format!(
            "--producers {bad}: each count must be in 1..={PRODUCERS_MAX}"
        )));
    }
    let root = tempfile::Builder::new()
        .prefix("ordo-bench-producers-")
        .tempdir_in(options.dir.as_deref().unwrap_or(&std::env::temp_dir()))
        .map_err(|e| LabError::Internal(format!("cannot create a temporary directory: {e}")))?;
    let root = root.path();
    let mut calibrations = vec![calibrated(root, progress)?];
    let mut measure = |label: String,
                       f: &dyn Fn(&Path) -> Result<ProducersRun, LabError>|
     -> Result<ProducersRun, LabError> {
        progress.start(&label, 0);
        let run = f(&fresh_dir(root, calibrations.len(), &label)?);
        progress.finish();
        let mut run = run?;
        let before = *calibrations.last().expect("F was measured first");
        let after = calibrated(root, progress)?;
        calibrations.push(after);
        run.f_before_after = (before, after);
        Ok(run)
    };
    let direct = measure("direct advance".into(), &|dir| {
        direct(dir, options.flow_ids, options.run)
    })?;
    let batched = measure("batched advance".into(), &|dir| {
        batched(dir, options.flow_ids, options.run)
    })?;
    let mut runs = Vec::new();
    for &n in &options.counts {
        runs.push(measure(format!("producers {n}"), &|dir| {
            grouped(dir, n, options.flow_ids, options.run)
        })?);
    }
    Ok(ProducersReport {
        flow_ids: options.flow_ids,
        direct,
        batched,
        runs,
        calibrations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(events: u64, commits: u64) -> ProducersRun {
        ProducersRun {
            producers: 4,
            events,
            commits,
            seconds: 2.0,
            f_before_after: (400.0, 900.0),
            latency: SubmitLatency {
                p50_ms: 1.0,
                p99_ms: 2.0,
                p999_ms: 3.0,
                max_ms: 4.0,
            },
            per_producer: PerProducer {
                min: 1,
                max: 2,
                mean: 1.5,
            },
        }
    }

    #[test]
    fn a_run_reports_events_per_commit() {
        // (events, commits) -> events per commit
        let cases = [
            ((20_000, 1_000), 20.0),
            ((5_000, 5_000), 1.0),
            ((3, 2), 1.5),
            ((7, 0), 7.0),
            ((0, 0), 0.0),
        ];
        for ((events, commits), per_commit) in cases {
            assert_eq!(
                run(events, commits).events_per_commit(),
                per_commit,
                "{events} events in {commits} commits"
            );
        }
    }

    #[test]
    fn the_report_s_f_spans_every_calibration() {
        // calibrations -> (least, median, greatest)
        let cases = [
            (vec![800.0], (800.0, 800.0, 800.0)),
            (vec![800.0, 820.0, 700.5, 900.25], (700.5, 820.0, 900.25)),
            (vec![820.0, 700.5, 800.0], (700.5, 800.0, 820.0)),
        ];
        for (calibrations, (min, median, max)) in cases {
            let report = ProducersReport {
                flow_ids: FlowIds::Sequential,
                direct: run(1, 1),
                batched: run(1, 1),
                runs: Vec::new(),
                calibrations,
            };
            assert_eq!(report.f_spread(), Spread { min, median, max });
        }
    }
}
