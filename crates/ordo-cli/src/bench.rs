//! `ordo bench`: throughput of each phase and end to end, as ratios to the
//! disk's own fsync rate F measured first on the same disk; concurrent
//! pipelines on separate threads; commit-to-applied latency at an offered
//! rate; peak memory.

#[allow(unused_imports)]
use ordo_reservation::{
    AdvanceRequest, ApplyOptions, FlowState, Quantity, ReservationConsumer, ReservationHandler,
    ReservationProducer,
};
use std::collections::{BTreeSet, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use ordo_core::{
    process_all_each, relay, Envelope, EventId, FlowId, Receipt, RelayOptions, SchemaVersion,
    StoreError, SystemClock,
};
use ordo_core::{Clock, ConsumerStore, ProducerStore};
use ordo_sqlite::rusqlite::{self, Connection};
use ordo_sqlite::{ConsumerDb, ProducerDb};
use serde_json::{json, Value};

use crate::args::BenchArgs;
use crate::context::emit;
use crate::Failure;

const STEPS: [FlowState; 3] = [
    FlowState::Reserved,
    FlowState::Confirmed,
    FlowState::Released,
];
/// How long the fsync calibration runs.
const CALIBRATION: Duration = Duration::from_millis(1500);
/// Batch sizes of `--sweep`.
const SWEEP: [u64; 7] = [1, 4, 16, 64, 256, 1024, 4096];
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

fn flow_id(i: u64) -> FlowId {
    FlowId::new(format!("b{i:08}")).expect("bench flow ids are identifiers")
}

fn bar(len: u64, label: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:40}] {pos}/{len} {per_sec}")
            .expect("the template is valid")
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_owned());
    bar
}

/// F: single-row insert-and-commit transactions per second on this disk,
/// WAL and `synchronous=FULL`, as ordo's files use.
fn calibrate(dir: &Path) -> Result<f64, Failure> {
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
    producer: &mut ProducerDb,
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
fn produce(
    producer: &mut ProducerDb,
    range: std::ops::Range<u64>,
    batch: u64,
    progress: &ProgressBar,
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
fn apply_pass(consumer: &mut ConsumerDb, batch: u64) -> Result<u64, Failure> {
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
#[derive(Clone, Copy, Default)]
struct Commits {
    all: u64,
    synced: u64,
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

struct Phase {
    seconds: f64,
    commits: Commits,
}

/// A phase's figures; `ratio_to_f` is filled in by `set_f` once the F
/// measured after the run is known.
fn phase_json(events: u64, phase: &Phase) -> Value {
    let rate = events as f64 / phase.seconds.max(1e-9);
    json!({
        "events": events,
        "seconds": round3(phase.seconds),
        "events_per_s": rate.round(),
        "commits_per_event": round3(phase.commits.all as f64 / events.max(1) as f64),
        "fsyncs_per_event": round3(phase.commits.synced as f64 / events.max(1) as f64),
    })
}

/// Fills in a run's F (the geometric mean of the calibrations before and
/// after it), both calibrations, and every phase's ratio to that F.
fn set_f(run: &mut Value, before: f64, after: f64) {
    let f = (before * after).sqrt();
    run["f_commits_per_s"] = json!(f.round());
    run["f_before_after"] = json!([before.round(), after.round()]);
    let ratio = |phase: &mut Value| {
        if let Some(rate) = phase["events_per_s"].as_f64() {
            phase["ratio_to_f"] = json!(round3(rate / f));
        }
    };
    ratio(run);
    for name in ["produce", "relay", "apply", "end_to_end"] {
        if run.get(name).is_some() {
            ratio(&mut run[name]);
        }
    }
}

/// How far F moved during a run: the larger calibration over the smaller.
fn drift(run: &Value) -> f64 {
    let pair = |i: usize| run["f_before_after"][i].as_f64().unwrap_or(0.0).max(1.0);
    pair(0).max(pair(1)) / pair(0).min(pair(1))
}

/// A run whose F moved more than this is flagged in the text output.
const DRIFT_FLAGGED: f64 = 1.25;

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Produce, then relay, then apply, each to completion, on one thread.
fn sequential(dir: &Path, flows: u64, batch: u64) -> Result<Value, Failure> {
    let mut producer = ordo_reservation::open_producer(dir.join("producer.db"))?;
    let mut consumer = ordo_reservation::open_consumer(dir.join("consumer.db"))?;
    let events = flows * STEPS.len() as u64;

    let progress = bar(events, &format!("produce B={batch}"));
    let started = Instant::now();
    produce(&mut producer, 0..flows, batch, &progress)?;
    let produce_phase = Phase {
        seconds: started.elapsed().as_secs_f64(),
        commits: Commits::producer(&producer),
    };
    progress.finish_and_clear();

    let progress = bar(events, &format!("relay B={batch}"));
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
    progress.finish_and_clear();

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
    let total = Phase {
        seconds: produce_phase.seconds + relay_phase.seconds + apply_phase.seconds,
        commits: produce_phase.commits + relay_phase.commits + apply_phase.commits,
    };
    Ok(json!({
        "batch": batch,
        "produce": phase_json(events, &produce_phase),
        "relay": phase_json(events, &relay_phase),
        "apply": phase_json(events, &apply_phase),
        "end_to_end": phase_json(events, &total),
    }))
}

/// Raises its flag when dropped, so that a stage that returns early, with an
/// error or a panic, still lets the stages after it finish.
struct RaiseOnDrop(Arc<AtomicBool>);

impl Drop for RaiseOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
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
) -> Result<Value, Failure> {
    let producer_path = dir.join("producer.db");
    let consumer_path = dir.join("consumer.db");
    ordo_reservation::open_producer(&producer_path)?;
    ordo_reservation::open_consumer(&consumer_path)?;
    let events = flows * STEPS.len() as u64;
    let produced_all = Arc::new(AtomicBool::new(false));
    let relayed_all = Arc::new(AtomicBool::new(false));
    let progress = bar(events, label);
    let started = Instant::now();

    let producer_thread = {
        let path = producer_path.clone();
        let done = produced_all.clone();
        std::thread::spawn(move || -> Result<Commits, Failure> {
            let _done = RaiseOnDrop(done);
            let mut producer = ordo_reservation::open_producer(&path)?;
            match rate {
                None => produce(&mut producer, 0..flows, batch, &ProgressBar::hidden())?,
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
    progress.finish_and_clear();
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
    let mut value = pipeline_json(dir, events, applied, &phase, batch)?;
    if let Some(rate) = rate {
        value["offered_per_s"] = json!(rate);
    }
    Ok(value)
}

/// Producer-file work and consumer-file work on two threads, one per core.
/// The producer thread produces and runs the producer side of the relay
/// (the fair round, recording the receipts); the consumer thread receives
/// and applies, one apply transaction at a time so that a round never waits
/// for more than one. Up to [`ROUNDS_IN_FLIGHT`] rounds are in flight, on
/// disjoint flows (a flow's next event is picked only once the receipt of
/// the one before is recorded); meanwhile the producer thread goes on
/// producing and recording.
fn two_files(dir: &Path, flows: u64, batch: u64) -> Result<Value, Failure> {
    use std::sync::mpsc;
    let producer_path = dir.join("producer.db");
    let consumer_path = dir.join("consumer.db");
    ordo_reservation::open_producer(&producer_path)?;
    ordo_reservation::open_consumer(&consumer_path)?;
    let events = flows * STEPS.len() as u64;
    let (round_tx, round_rx) = mpsc::channel::<Vec<Envelope>>();
    let (receipts_tx, receipts_rx) = mpsc::channel::<Result<Vec<Receipt>, StoreError>>();
    let progress = bar(events, "pipelined");
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
                let flows: Vec<(FlowId, Option<u64>)> = consumer
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
    progress.finish_and_clear();
    let phase = Phase {
        seconds,
        commits: producer_commits + consumer_commits,
    };
    pipeline_json(dir, events, applied, &phase, batch)
}

/// The figures of a run whose stages ran at once: all events applied, the
/// phase, the batch size and the commit-to-applied latency.
fn pipeline_json(
    dir: &Path,
    events: u64,
    applied: u64,
    phase: &Phase,
    batch: u64,
) -> Result<Value, Failure> {
    if applied != events {
        return Err(Failure::Check(format!(
            "bench applied {applied} of {events} events"
        )));
    }
    let mut value = phase_json(events, phase);
    value["batch"] = json!(batch);
    value["latency_ms"] = latency(&dir.join("producer.db"), &dir.join("consumer.db"))?;
    Ok(value)
}

/// Commit-to-applied latency per event: the outbox row's creation time to
/// the inbox row's application time (millisecond clock).
fn latency(producer: &Path, consumer: &Path) -> Result<Value, Failure> {
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
    let max = histogram.last().map(|(ms, _)| *ms).unwrap_or(0);
    Ok(json!({"p50": at(0.5), "p99": at(0.99), "max": max, "samples": samples}))
}

/// Runs `flows` flows through in rounds, pruning everything settled after
/// each round when `prune`, and reports the size of both files afterwards
/// (WAL checkpointed into the file).
fn growth(dir: &Path, flows: u64, batch: u64, prune: bool) -> Result<Value, Failure> {
    let producer_path = dir.join("producer.db");
    let consumer_path = dir.join("consumer.db");
    let mut producer = ordo_reservation::open_producer(&producer_path)?;
    let mut consumer = ordo_reservation::open_consumer(&consumer_path)?;
    let label = if prune { "growth+prune" } else { "growth" };
    let progress = bar(flows * STEPS.len() as u64, label);
    let per_round = flows.div_ceil(GROWTH_ROUNDS);
    let mut start = 0;
    let mut sizes = Vec::new();
    while start < flows {
        let end = (start + per_round).min(flows);
        produce(&mut producer, start..end, batch, &ProgressBar::hidden())?;
        while relay_round(&mut producer, &mut consumer, batch)? > 0 {}
        let applied = apply_pass(&mut consumer, batch)?;
        progress.inc(applied);
        if prune {
            let cutoff_ms = SystemClock.now_ms() + 1;
            producer.prune_outbox(cutoff_ms)?;
            consumer.prune_inbox(cutoff_ms)?;
        }
        sizes.push(json!([
            file_bytes(&producer_path)?,
            file_bytes(&consumer_path)?
        ]));
        start = end;
    }
    progress.finish_and_clear();
    drop((producer, consumer));
    let events = flows * STEPS.len() as u64;
    let producer_bytes = checkpointed_bytes(&producer_path)?;
    let consumer_bytes = checkpointed_bytes(&consumer_path)?;
    Ok(json!({
        "events": events,
        "producer_bytes": producer_bytes,
        "consumer_bytes": consumer_bytes,
        "producer_bytes_per_event": round3(producer_bytes as f64 / events as f64),
        "consumer_bytes_per_event": round3(consumer_bytes as f64 / events as f64),
        "bytes_after_each_round": sizes,
    }))
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

fn growth_text(g: &Value) -> String {
    let line = |name: &str, v: &Value| {
        format!(
            "{name:<16} {} events: producer.db {} bytes ({} per event), consumer.db {} bytes ({} per event)",
            v["events"], v["producer_bytes"], v["producer_bytes_per_event"], v["consumer_bytes"], v["consumer_bytes_per_event"]
        )
    };
    [
        line("without pruning", &g["without_pruning"]),
        line("with pruning", &g["with_pruning"]),
    ]
    .join("\n")
}

/// The process's peak resident memory, from /proc.
fn peak_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn fresh_dir(root: &Path, name: &str) -> Result<std::path::PathBuf, Failure> {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).map_err(internal)?;
    Ok(dir)
}

pub fn run(json_mode: bool, args: BenchArgs) -> Result<(), Failure> {
    if let Some(plot) = &args.plot {
        if !args.sweep {
            return Err(Failure::Usage("--plot needs --sweep".into()));
        }
        if plot.extension().and_then(|e| e.to_str()) != Some("svg") {
            return Err(Failure::Usage(format!(
                "--plot {}: the file name must end in .svg",
                plot.display()
            )));
        }
    }
    let root = tempfile::Builder::new()
        .prefix("ordo-bench-")
        .tempdir_in(args.dir.as_deref().unwrap_or(&std::env::temp_dir()))
        .map_err(|e| Failure::Internal(format!("cannot create a temporary directory: {e}")))?;
    if args.growth {
        let value = json!({
            "growth": {
                "without_pruning": growth(&fresh_dir(root.path(), "growth-keep")?, args.flows, args.batch, false)?,
                "with_pruning": growth(&fresh_dir(root.path(), "growth-prune")?, args.flows, args.batch, true)?,
            }
        });
        emit(json_mode, &value, || growth_text(&value["growth"]));
        return Ok(());
    }
    // The disk's rate drifts (other tenants, writeback), so F is measured
    // before and after every run, and each run's ratios use the geometric
    // mean of the two; the run records both, so a drifting disk shows.
    let calibrated = || -> Result<f64, Failure> {
        let progress = ProgressBar::new_spinner();
        progress.set_message("calibrating F (single-row commits, WAL, synchronous=FULL)");
        let f = calibrate(root.path());
        progress.finish_and_clear();
        f
    };
    let mut fs = vec![calibrated()?];
    let mut measured = |run: Result<Value, Failure>| -> Result<Value, Failure> {
        let mut run = run?;
        let before = *fs.last().expect("F was measured before the first run");
        let after = calibrated()?;
        fs.push(after);
        set_f(&mut run, before, after);
        Ok(run)
    };
    let batches: Vec<u64> = if args.sweep {
        SWEEP.to_vec()
    } else {
        vec![args.batch]
    };
    let mut runs = Vec::new();
    for batch in &batches {
        let dir = fresh_dir(root.path(), &format!("seq-{batch}"))?;
        runs.push(measured(sequential(&dir, args.flows, *batch))?);
    }
    let unbatched = if args.sweep || args.batch == 1 {
        Value::Null
    } else {
        // Four commits per event: a few thousand flows measure it well.
        let flows = args.flows.min(UNBATCHED_FLOWS_MAX);
        let mut run = measured(sequential(&fresh_dir(root.path(), "seq-1")?, flows, 1))?;
        run["flows"] = json!(flows);
        run
    };
    let pipelined = measured(concurrent(
        &fresh_dir(root.path(), "concurrent")?,
        args.flows,
        args.batch,
        None,
        "concurrent",
    ))?;
    let two_threads = measured(two_files(
        &fresh_dir(root.path(), "pipelined")?,
        args.flows,
        args.batch,
    ))?;
    let offered = measured(concurrent(
        &fresh_dir(root.path(), "offered")?,
        args.flows,
        args.batch,
        Some(args.rate),
        "offered",
    ))?;
    let f_min = fs.iter().copied().fold(f64::INFINITY, f64::min);
    let f_max = fs.iter().copied().fold(0.0, f64::max);
    // The run's F in one number: the median of all calibrations.
    let f = {
        let mut sorted = fs.clone();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    };
    if let Some(plot) = &args.plot {
        draw(plot, &runs, f_min, f_max)?;
    }
    let value = json!({
        "f_commits_per_s": f.round(),
        "f_range": [f_min.round(), f_max.round()],
        "flows": args.flows,
        "events": args.flows * 3,
        "runs": runs,
        "unbatched": unbatched,
        "concurrent": pipelined,
        "pipelined": two_threads,
        "offered": offered,
        "peak_memory_bytes": peak_memory_bytes(),
    });
    emit(json_mode, &value, || text(&value));
    Ok(())
}

fn text(v: &Value) -> String {
    let mut lines = vec![
        format!(
            "F (fsync-bound single-row commits on this disk), measured between the runs: {} to {} /s",
            v["f_range"][0], v["f_range"][1]
        ),
        format!("flows {}, events {}", v["flows"], v["events"]),
        format!(
            "{:>6} {:>8} {:>20} {:>20} {:>20} {:>20} {:>14} {:>13}",
            "batch",
            "F/s",
            "produce/s (x F)",
            "relay/s (x F)",
            "apply/s (x F)",
            "end-to-end/s (x F)",
            "commits/event",
            "fsyncs/event"
        ),
    ];
    // serde_json's Display ignores width, so every cell is a String first.
    let f_cell = |r: &Value| {
        let flag = if drift(r) > DRIFT_FLAGGED { "*" } else { "" };
        format!("{}{flag}", r["f_commits_per_s"])
    };
    let rate = |p: &Value| {
        format!(
            "{} ({:.2})",
            p["events_per_s"],
            p["ratio_to_f"].as_f64().unwrap_or(0.0)
        )
    };
    let row = |r: &Value| {
        format!(
            "{:>6} {:>8} {:>20} {:>20} {:>20} {:>20} {:>14} {:>13}",
            r["batch"].to_string(),
            f_cell(r),
            rate(&r["produce"]),
            rate(&r["relay"]),
            rate(&r["apply"]),
            rate(&r["end_to_end"]),
            r["end_to_end"]["commits_per_event"].to_string(),
            r["end_to_end"]["fsyncs_per_event"].to_string(),
        )
    };
    if !v["unbatched"].is_null() {
        lines.push(row(&v["unbatched"]));
    }
    for r in v["runs"].as_array().into_iter().flatten() {
        lines.push(row(r));
    }
    let c = &v["concurrent"];
    lines.push(format!(
        "concurrent (3 threads, B={}, F {}/s): {} events/s = {} x F, {} commits/event, {} fsyncs/event, latency p50 {} ms p99 {} ms",
        c["batch"], f_cell(c), c["events_per_s"], c["ratio_to_f"], c["commits_per_event"], c["fsyncs_per_event"], c["latency_ms"]["p50"], c["latency_ms"]["p99"]
    ));
    let p = &v["pipelined"];
    lines.push(format!(
        "pipelined (2 threads: producer file, consumer file; B={}, F {}/s): {} events/s = {} x F, {} fsyncs/event, latency p50 {} ms p99 {} ms",
        p["batch"], f_cell(p), p["events_per_s"], p["ratio_to_f"], p["fsyncs_per_event"], p["latency_ms"]["p50"], p["latency_ms"]["p99"]
    ));
    let o = &v["offered"];
    lines.push(format!(
        "offered {} events/s: achieved {} events/s, commit-to-applied p50 {} ms, p99 {} ms, max {} ms",
        o["offered_per_s"], o["events_per_s"], o["latency_ms"]["p50"], o["latency_ms"]["p99"], o["latency_ms"]["max"]
    ));
    let all_runs = v["runs"].as_array().into_iter().flatten().chain([
        &v["unbatched"],
        &v["concurrent"],
        &v["pipelined"],
        &v["offered"],
    ]);
    if all_runs
        .filter(|r| !r.is_null())
        .any(|r| drift(r) > DRIFT_FLAGGED)
    {
        lines.push(format!(
            "* F moved by more than {:.0} % between the calibrations before and after this run: its ratios are unreliable, run again",
            (DRIFT_FLAGGED - 1.0) * 100.0
        ));
    }
    if let Some(bytes) = v["peak_memory_bytes"].as_u64() {
        lines.push(format!(
            "peak memory {:.1} MiB",
            bytes as f64 / (1024.0 * 1024.0)
        ));
    }
    lines.join("\n")
}

/// Throughput of each phase against batch size, on log-2 axes.
fn draw(path: &Path, runs: &[Value], f_min: f64, f_max: f64) -> Result<(), Failure> {
    use plotters::prelude::*;
    let series = ["produce", "relay", "apply", "end_to_end"];
    let points = |phase: &str| -> Vec<(f64, f64)> {
        runs.iter()
            .map(|r| {
                (
                    (r["batch"].as_f64().unwrap_or(1.0)).log2(),
                    r[phase]["ratio_to_f"].as_f64().unwrap_or(0.0),
                )
            })
            .collect()
    };
    let y_max = series
        .iter()
        .flat_map(|s| points(s))
        .map(|(_, y)| y)
        .fold(1.0, f64::max)
        * 1.1;
    let x_max = points("produce")
        .iter()
        .map(|(x, _)| *x)
        .fold(1.0, f64::max);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(internal)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("ordo throughput / F (F measured around each run: {f_min:.0} to {f_max:.0} commits/s)"),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(internal)?;
    chart
        .configure_mesh()
        .x_desc("batch size (log2)")
        .y_desc("events/s as a multiple of F")
        .draw()
        .map_err(internal)?;
    let colors = [RED, BLUE, GREEN, BLACK];
    for (name, color) in series.iter().zip(colors) {
        chart
            .draw_series(LineSeries::new(points(name), color.stroke_width(2)))
            .map_err(internal)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(internal)?;
    root.present().map_err(internal)?;
    Ok(())
}
