//! The destinations bench: what fan-out costs. For each count N, a fresh
//! producer file gets N destinations (its own `default` and N - 1 added
//! `--from start`), each relayed to a consumer file of its own by a relay
//! of its own (its own connections, its own thread, all started together).
//! The bench appends a fixed number of reservation flows, relays until
//! every destination holds every event, applies each consumer, and then
//! reads every consumer's inbox back: each must hold exactly the events
//! appended, every one applied, or the run fails.
//!
//! Appending, relaying and applying are phases one after the other, so
//! that each one's cost with N is seen apart: an append writes one custody
//! row per destination, and the N relays share the producer file. The
//! relay phase is timed alone, from the moment every relay is ready until
//! its destination holds every event: its rate per destination, against
//! the one destination's of the same run of the bench, is what fan-out
//! costs a consumer. Where each relay thread's time went over that phase,
//! by the kernel's scheduler statistics (on a core, waiting for one, or
//! neither: blocked on the producer file's write lock or the disk's
//! syncs), tells what limits it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use ordo_core::destination::DestinationStart;
use ordo_core::{
    relay, Clock, ConsumerOps, DestinationName, InboxStatus, ProducerOps, Receipt, RelayOptions,
    SystemClock,
};

use crate::bench::{produce, EVENTS_PER_FLOW};
use crate::figures::per_second;
use crate::{internal, join_all, LabError, Progress};

/// The most destinations of one run.
pub const DESTINATIONS_MAX: usize = 16;
/// The destination counts measured unless told otherwise (`ordo bench
/// --destinations` without a list).
pub const DESTINATIONS_DEFAULT: [usize; 3] = [1, 2, 4];
/// Flows appended in each run unless told otherwise (each three events).
pub const FLOWS_DEFAULT: u64 = 10_000;
/// How long a relay waits for events that backed off before it looks again.
const IDLE_PAUSE: Duration = Duration::from_millis(2);
/// How long a relay may take to bring its destination everything before
/// the run fails.
const RELAY_DEADLINE: Duration = Duration::from_secs(300);

/// What the destinations bench measures.
#[derive(Debug, Clone)]
pub struct DestinationsOptions {
    /// The destination counts, one run each, in this order.
    pub counts: Vec<usize>,
    /// Flows appended in each run, each three events.
    pub flows: u64,
    /// Events per transaction of the append, of each relay round and of
    /// each apply.
    pub batch: u64,
    /// Where to create the temporary files (the system's if `None`).
    pub dir: Option<PathBuf>,
}

/// One destination of a run, as its relay and its consumer saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct DestinationRun {
    /// Its name.
    pub name: String,
    /// Seconds from the start of the relays until it held every event.
    pub relay_seconds: f64,
    /// Events its consumer holds, read back from the inbox after apply.
    pub held: u64,
    /// Events its consumer applied, read back from the inbox.
    pub applied: u64,
    /// Rounds of its relay that failed transiently (lock waits that ran
    /// out); their events backed off and were relayed again.
    pub transient_errors: u64,
    /// Where its relay thread's time went until then (`None` where the
    /// system does not say).
    pub time: Option<ThreadTime>,
}

/// Where a relay thread's time went over the relay phase, by the kernel's
/// scheduler statistics (`/proc/thread-self/schedstat`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ThreadTime {
    /// Seconds on a core.
    pub cpu_seconds: f64,
    /// Seconds runnable but waiting for a core (other threads, or other
    /// processes, had them).
    pub runqueue_seconds: f64,
    /// Seconds neither: blocked, on the producer file's write lock (SQLite's
    /// busy handler sleeps), on the disk's syncs, or pausing while events
    /// backed off.
    pub blocked_seconds: f64,
}

impl ThreadTime {
    /// The sum of `times`.
    pub fn total<'a>(times: impl Iterator<Item = &'a ThreadTime>) -> ThreadTime {
        times.fold(ThreadTime::default(), |sum, t| ThreadTime {
            cpu_seconds: sum.cpu_seconds + t.cpu_seconds,
            runqueue_seconds: sum.runqueue_seconds + t.runqueue_seconds,
            blocked_seconds: sum.blocked_seconds + t.blocked_seconds,
        })
    }

    /// What took most of the time.
    pub fn limit(&self) -> RelayLimit {
        if self.cpu_seconds >= self.runqueue_seconds.max(self.blocked_seconds) {
            RelayLimit::Cpu
        } else if self.runqueue_seconds >= self.blocked_seconds {
            RelayLimit::Cores
        } else {
            RelayLimit::Blocked
        }
    }
}

/// What limits the relay phase: where most of the relays' time went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayLimit {
    /// On a core: the relays' own work.
    Cpu,
    /// Waiting for a core: more runnable threads than cores.
    Cores,
    /// Blocked: the producer file's one writer, the disk's syncs.
    Blocked,
}

impl RelayLimit {
    /// `cpu`, `cores` or `blocked`.
    pub fn as_str(self) -> &'static str {
        match self {
            RelayLimit::Cpu => "cpu",
            RelayLimit::Cores => "cores",
            RelayLimit::Blocked => "blocked",
        }
    }
}

/// One run: N destinations of one producer file.
#[derive(Debug, Clone, PartialEq)]
pub struct DestinationsRun {
    /// Destinations.
    pub destinations: usize,
    /// Flows appended.
    pub flows: u64,
    /// Events appended.
    pub events: u64,
    /// Seconds the append took.
    pub append_seconds: f64,
    /// Seconds from the start of the relays until every destination held
    /// every event.
    pub relay_seconds: f64,
    /// Seconds the appliers took, all consumers at once.
    pub apply_seconds: f64,
    /// Each destination, in the order they were added.
    pub per_destination: Vec<DestinationRun>,
}

impl DestinationsRun {
    /// Seconds from the start of the append until every destination held
    /// every event.
    pub fn all_held_seconds(&self) -> f64 {
        self.append_seconds + self.relay_seconds
    }

    /// Wall time of the run: append, relay and apply.
    pub fn seconds(&self) -> f64 {
        self.all_held_seconds() + self.apply_seconds
    }

    /// Events held by all destinations together per second of append and
    /// relay.
    pub fn events_per_s(&self) -> f64 {
        per_second(
            self.events * self.destinations as u64,
            self.all_held_seconds(),
        )
    }

    /// Events per second of append and relay for one destination: the
    /// events over the time from the start of the append until it held
    /// them all.
    pub fn destination_events_per_s(&self, destination: &DestinationRun) -> f64 {
        per_second(self.events, self.append_seconds + destination.relay_seconds)
    }

    /// Events per second of the relay phase alone, all destinations
    /// together: every destination's events over the time until the last
    /// one held them all.
    pub fn relay_events_per_s(&self) -> f64 {
        per_second(self.events * self.destinations as u64, self.relay_seconds)
    }

    /// Events per second of the relay phase alone for one destination:
    /// the events over the time from the start of the relays until it held
    /// them all.
    pub fn destination_relay_events_per_s(&self, destination: &DestinationRun) -> f64 {
        per_second(self.events, destination.relay_seconds)
    }

    /// The relay phase's events per second of a destination, the mean
    /// over the run's destinations.
    pub fn relay_events_per_s_per_destination(&self) -> f64 {
        let rates = (self.per_destination.iter()).map(|d| self.destination_relay_events_per_s(d));
        rates.sum::<f64>() / self.per_destination.len().max(1) as f64
    }

    /// Where the relay threads' time went, all together (`None` unless
    /// known for every one).
    pub fn relay_time(&self) -> Option<ThreadTime> {
        let times: Option<Vec<ThreadTime>> =
            (self.per_destination.iter()).map(|d| d.time).collect();
        Some(ThreadTime::total(times?.iter()))
    }
}

/// How a run compares with the run of one destination.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RatioToOne {
    /// Its time until every destination held everything over that of N = 1.
    pub all_held_seconds: f64,
    /// Its events per second, all destinations together, over that of N = 1.
    pub events_per_s: f64,
    /// Its relay phase's events per second, all destinations together, over
    /// that of N = 1.
    pub relay_events_per_s: f64,
    /// Its relay phase's events per second of a destination (the mean over
    /// its destinations) over that of the one destination of N = 1.
    pub per_destination: f64,
}

/// What the destinations bench measured.
#[derive(Debug, Clone)]
pub struct DestinationsReport {
    /// Flows appended in each run.
    pub flows: u64,
    /// Events per transaction.
    pub batch: u64,
    /// The cores the system gives the process.
    pub cores: usize,
    /// One run per destination count, in the order asked.
    pub runs: Vec<DestinationsRun>,
}

impl DestinationsReport {
    /// Events appended in each run.
    pub fn events(&self) -> u64 {
        self.flows * EVENTS_PER_FLOW
    }

    /// `run` against the run of one destination, if one was measured.
    pub fn ratio_to_one(&self, run: &DestinationsRun) -> Option<RatioToOne> {
        let one = self.one()?;
        Some(RatioToOne {
            all_held_seconds: run.all_held_seconds() / one.all_held_seconds().max(1e-9),
            events_per_s: run.events_per_s() / one.events_per_s().max(1e-9),
            relay_events_per_s: run.relay_events_per_s() / one.relay_events_per_s().max(1e-9),
            per_destination: run.relay_events_per_s_per_destination()
                / one.relay_events_per_s_per_destination().max(1e-9),
        })
    }

    /// The relay phase's events per second of `destination` of `run` over
    /// that of the one destination of N = 1, if that run was measured.
    pub fn destination_ratio_to_one(
        &self,
        run: &DestinationsRun,
        destination: &DestinationRun,
    ) -> Option<f64> {
        let one = self.one()?.relay_events_per_s_per_destination();
        Some(run.destination_relay_events_per_s(destination) / one.max(1e-9))
    }

    /// The run of one destination, if measured.
    fn one(&self) -> Option<&DestinationsRun> {
        self.runs.iter().find(|r| r.destinations == 1)
    }
}

/// Refuses an empty list, a count outside 1..=[`DESTINATIONS_MAX`] and a
/// count given twice.
pub fn check_counts(counts: &[usize]) -> Result<(), LabError> {
    if counts.is_empty() {
        return Err(LabError::Usage(
            "--destinations: give at least one count, for example 1,2,4".into(),
        ));
    }
    if let Some(bad) = counts.iter().find(|&&n| n == 0 || n > DESTINATIONS_MAX) {
        return Err(LabError::Usage(format!(
            "--destinations {bad}: each count must be in 1..={DESTINATIONS_MAX}"
        )));
    }
    let mut seen = BTreeSet::new();
    if let Some(twice) = counts.iter().find(|&&n| !seen.insert(n)) {
        return Err(LabError::Usage(format!(
            "--destinations: {twice} is given twice; each count once"
        )));
    }
    Ok(())
}

/// The name of destination `k` (from 1) of a run: the store's own
/// `default` first.
fn destination_name(k: usize) -> DestinationName {
    if k == 1 {
        return DestinationName::default_name();
    }
    DestinationName::new(format!("fanout-{k:02}")).expect("bench destination names are names")
}

/// The consumer file of destination `k`.
fn consumer_path(dir: &Path, k: usize) -> PathBuf {
    dir.join(format!("consumer-{k:02}.db"))
}

/// A fresh producer file in `dir` with `n` destinations, and an empty
/// consumer file for each.
fn create_files(dir: &Path, n: usize) -> Result<PathBuf, LabError> {
    let producer_path = dir.join("producer.db");
    let mut producer = ordo_reservation::open_producer(&producer_path)?;
    for k in 2..=n {
        producer
            .add_destination(&destination_name(k), DestinationStart::Start)?
            .map_err(internal)?;
    }
    for k in 1..=n {
        ordo_reservation::open_consumer(consumer_path(dir, k))?;
    }
    Ok(producer_path)
}

/// What one relay did: when it was done, its transient failures, and
/// its thread's time on a core and waiting for one.
struct Relayed {
    done: Instant,
    transient_errors: u64,
    scheduled: Option<Scheduled>,
}

/// A thread's time on a core and waiting for one, in nanoseconds, as the
/// first two fields of `/proc/thread-self/schedstat` count them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Scheduled {
    cpu_ns: u64,
    runqueue_ns: u64,
}

impl Scheduled {
    /// The calling thread's, `None` where the system does not say.
    fn now() -> Option<Scheduled> {
        Scheduled::parse(&std::fs::read_to_string("/proc/thread-self/schedstat").ok()?)
    }

    fn parse(schedstat: &str) -> Option<Scheduled> {
        let mut fields = schedstat.split_whitespace();
        Some(Scheduled {
            cpu_ns: fields.next()?.parse().ok()?,
            runqueue_ns: fields.next()?.parse().ok()?,
        })
    }

    /// What the thread did from `self` until `later`.
    fn until(self, later: Scheduled) -> Scheduled {
        Scheduled {
            cpu_ns: later.cpu_ns.saturating_sub(self.cpu_ns),
            runqueue_ns: later.runqueue_ns.saturating_sub(self.runqueue_ns),
        }
    }

    /// Over `seconds` of wall time: on a core, waiting for one, and the
    /// rest, blocked.
    fn over(self, seconds: f64) -> ThreadTime {
        let cpu_seconds = self.cpu_ns as f64 / 1e9;
        let runqueue_seconds = self.runqueue_ns as f64 / 1e9;
        ThreadTime {
            cpu_seconds,
            runqueue_seconds,
            blocked_seconds: (seconds - cpu_seconds - runqueue_seconds).max(0.0),
        }
    }
}

/// One destination's relay: its own connections to the producer file and
/// to its consumer file; once every relay is ready, relays until the
/// consumer has taken `events` events. A refusal fails the run.
fn relay_one(
    producer_path: &Path,
    consumer_path: &Path,
    name: &DestinationName,
    events: u64,
    batch: u64,
    ready: &Barrier,
) -> Result<Relayed, LabError> {
    let opened = (|| {
        let mut producer = ordo_reservation::open_producer(producer_path)?;
        producer.use_destination(Some(name))?.map_err(internal)?;
        let consumer = ordo_reservation::open_consumer(consumer_path)?;
        Ok::<_, LabError>((producer, consumer))
    })();
    // Every relay waits for the others, an unopened one included, so that
    // none is left waiting.
    ready.wait();
    let before = Scheduled::now();
    let (mut producer, mut consumer) = opened?;
    let options = RelayOptions {
        batch_len_max: batch as usize,
        ..RelayOptions::default()
    };
    let deadline = Instant::now() + RELAY_DEADLINE;
    let (mut held, mut transient_errors) = (0u64, 0u64);
    while held < events {
        let report = relay(&mut producer, &mut consumer, &options, &SystemClock)
            .map_err(|e| LabError::Internal(format!("the relay of destination {name}: {e}")))?;
        if let Some(refused) = report.refusals.first() {
            return Err(LabError::Check(format!(
                "destination {name} refused {} event(s); first: {refused:?}",
                report.refusals.len()
            )));
        }
        let taken = (report.deliveries.iter())
            .filter(|d| matches!(d.receipt, Receipt::Accepted | Receipt::Duplicate))
            .count() as u64;
        held += taken;
        transient_errors += report.transient_errors;
        if taken == 0 && held < events {
            if Instant::now() > deadline {
                return Err(LabError::Check(format!(
                    "destination {name} took {held} of {events} events in {RELAY_DEADLINE:?}"
                )));
            }
            std::thread::sleep(IDLE_PAUSE);
        }
    }
    let scheduled = before.zip(Scheduled::now()).map(|(b, a)| b.until(a));
    Ok(Relayed {
        done: Instant::now(),
        transient_errors,
        scheduled,
    })
}

/// What the N relays of a run did together.
struct RelayPhase {
    /// Seconds until every destination held every event.
    seconds: f64,
    /// Each relay's seconds until its destination held every event, its
    /// transient failures, and where its thread's time went.
    each: Vec<(f64, u64, Option<ThreadTime>)>,
}

/// The N relays at once, timed from the moment every one is ready.
fn relay_all(
    dir: &Path,
    producer_path: &Path,
    n: usize,
    events: u64,
    batch: u64,
) -> Result<RelayPhase, LabError> {
    let ready = Barrier::new(n + 1);
    let (started, relayed) = std::thread::scope(|scope| {
        let handles: Vec<_> = (1..=n)
            .map(|k| {
                let (consumer, ready) = (consumer_path(dir, k), &ready);
                scope.spawn(move || {
                    relay_one(
                        producer_path,
                        &consumer,
                        &destination_name(k),
                        events,
                        batch,
                        ready,
                    )
                })
            })
            .collect();
        ready.wait();
        let started = Instant::now();
        (started, join_all(handles, "a relay thread"))
    });
    let relayed: Vec<Relayed> = relayed.into_iter().collect::<Result<_, _>>()?;
    let each: Vec<(f64, u64, Option<ThreadTime>)> = relayed
        .iter()
        .map(|r| {
            let seconds = r.done.saturating_duration_since(started).as_secs_f64();
            let time = r.scheduled.map(|s| s.over(seconds));
            (seconds, r.transient_errors, time)
        })
        .collect();
    let seconds = each.iter().map(|&(s, _, _)| s).fold(0.0, f64::max);
    Ok(RelayPhase { seconds, each })
}

/// Applies one consumer file until nothing is left; returns how many
/// events it applied.
fn apply_one(path: &Path, batch: u64) -> Result<u64, LabError> {
    let mut consumer = ordo_reservation::open_consumer(path)?;
    crate::bench::apply_pass(&mut consumer, batch)
}

/// One applier per consumer, all at once; returns the seconds they took.
fn apply_all(dir: &Path, n: usize, events: u64, batch: u64) -> Result<f64, LabError> {
    let started = Instant::now();
    let applied = std::thread::scope(|scope| {
        let handles: Vec<_> = (1..=n)
            .map(|k| scope.spawn(move || apply_one(&consumer_path(dir, k), batch)))
            .collect();
        join_all(handles, "an applier thread")
    });
    let seconds = started.elapsed().as_secs_f64();
    for (k, applied) in (1..=n).zip(applied) {
        let applied = applied?;
        if applied != events {
            return Err(LabError::Check(format!(
                "the consumer of destination {} applied {applied} of {events} events",
                destination_name(k)
            )));
        }
    }
    Ok(seconds)
}

/// What destination `k`'s consumer holds and has applied, read back from
/// its inbox; fails unless it holds exactly `appended`, each once.
fn verify_consumer(
    dir: &Path,
    k: usize,
    appended: &BTreeSet<(String, String)>,
) -> Result<(u64, u64), LabError> {
    let name = destination_name(k);
    let mut consumer = ordo_reservation::open_consumer(consumer_path(dir, k))?;
    let inbox = consumer.inbox()?;
    let held: BTreeSet<(String, String)> = (inbox.iter())
        .map(|r| {
            let e = &r.envelope;
            (
                e.producer.as_str().to_owned(),
                e.event_id.as_str().to_owned(),
            )
        })
        .collect();
    if held.len() != inbox.len() || &held != appended {
        let missing = appended.difference(&held).count();
        let extra = held.difference(appended).count();
        return Err(LabError::Check(format!(
            "the consumer of destination {name} holds {} rows ({} distinct) for {} events \
             appended: {missing} missing, {extra} not appended",
            inbox.len(),
            held.len(),
            appended.len()
        )));
    }
    let applied = (inbox.iter())
        .filter(|r| r.status == InboxStatus::Applied)
        .count() as u64;
    if applied != held.len() as u64 {
        return Err(LabError::Check(format!(
            "the consumer of destination {name} applied {applied} of its {} events",
            held.len()
        )));
    }
    Ok((held.len() as u64, applied))
}

/// Every event of the producer file, and a check that no destination has
/// a backlog left.
fn appended_events(producer_path: &Path) -> Result<BTreeSet<(String, String)>, LabError> {
    let mut producer = ordo_reservation::open_producer(producer_path)?;
    let now_ms = SystemClock.now_ms();
    if let Some(d) = (producer.destinations(now_ms)?.iter()).find(|d| d.status.backlog > 0) {
        return Err(LabError::Check(format!(
            "destination {} still has a backlog of {} events",
            d.name, d.status.backlog
        )));
    }
    Ok((producer.outbox()?.iter())
        .map(|r| {
            let e = &r.envelope;
            (
                e.producer.as_str().to_owned(),
                e.event_id.as_str().to_owned(),
            )
        })
        .collect())
}

/// One run of `n` destinations on fresh files in `dir`.
fn run_one(
    dir: &Path,
    n: usize,
    options: &DestinationsOptions,
    progress: &dyn Progress,
) -> Result<DestinationsRun, LabError> {
    let events = options.flows * EVENTS_PER_FLOW;
    let producer_path = create_files(dir, n)?;
    let mut producer = ordo_reservation::open_producer(&producer_path)?;
    let note = |phase: &str| progress.set(0, &format!("destinations {n}: {phase}"));
    note("appending");
    let started = Instant::now();
    produce(
        &mut producer,
        0..options.flows,
        options.batch,
        &crate::Silent,
    )?;
    let append_seconds = started.elapsed().as_secs_f64();
    drop(producer);
    note("relaying");
    let relayed = relay_all(dir, &producer_path, n, events, options.batch)?;
    note("applying");
    let apply_seconds = apply_all(dir, n, events, options.batch)?;
    note("checking every consumer");
    let appended = appended_events(&producer_path)?;
    if appended.len() as u64 != events {
        return Err(LabError::Check(format!(
            "the producer holds {} of the {events} events appended",
            appended.len()
        )));
    }
    let mut per_destination = Vec::new();
    for (k, &(seconds, transient_errors, time)) in (1..=n).zip(&relayed.each) {
        let (held, applied) = verify_consumer(dir, k, &appended)?;
        per_destination.push(DestinationRun {
            name: destination_name(k).as_str().to_owned(),
            relay_seconds: seconds,
            held,
            applied,
            transient_errors,
            time,
        });
    }
    Ok(DestinationsRun {
        destinations: n,
        flows: options.flows,
        events,
        append_seconds,
        relay_seconds: relayed.seconds,
        apply_seconds,
        per_destination,
    })
}

/// Runs each destination count on fresh files in a temporary directory
/// under `options.dir`, removed afterwards.
pub fn run(
    options: &DestinationsOptions,
    progress: &dyn Progress,
) -> Result<DestinationsReport, LabError> {
    check_counts(&options.counts)?;
    if options.flows == 0 || options.batch == 0 {
        return Err(LabError::Usage(
            "--destinations needs at least one flow and a batch of at least one".into(),
        ));
    }
    let root = tempfile::Builder::new()
        .prefix("ordo-bench-destinations-")
        .tempdir_in(options.dir.as_deref().unwrap_or(&std::env::temp_dir()))
        .map_err(|e| LabError::Internal(format!("cannot create a temporary directory: {e}")))?;
    let mut runs = Vec::new();
    for &n in &options.counts {
        let dir = root.path().join(format!("{n:02}-destinations"));
        std::fs::create_dir(&dir).map_err(internal)?;
        progress.start(&format!("destinations {n}"), 0);
        let run = run_one(&dir, n, options, progress);
        progress.finish();
        runs.push(run?);
    }
    Ok(DestinationsReport {
        flows: options.flows,
        batch: options.batch,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_refused_outside_the_range_empty_or_twice() {
        // counts -> the refusal names
        let cases: [(&[usize], Option<&str>); 7] = [
            (&[1, 2, 4], None),
            (&[16], None),
            (&[], Some("at least one")),
            (&[0], Some("--destinations 0")),
            (&[17], Some("--destinations 17")),
            (&[1, 1], Some("1 is given twice")),
            (&[2, 4, 2], Some("2 is given twice")),
        ];
        for (counts, refusal) in cases {
            match (check_counts(counts), refusal) {
                (Ok(()), None) => {}
                (Err(LabError::Usage(message)), Some(needle)) => {
                    assert!(message.contains(needle), "{counts:?}: {message}");
                }
                (other, _) => panic!("{counts:?}: {other:?}"),
            }
        }
    }

    fn run(destinations: usize, relay_seconds: &[f64]) -> DestinationsRun {
        DestinationsRun {
            destinations,
            flows: 100,
            events: 300,
            append_seconds: 1.0,
            relay_seconds: relay_seconds.iter().copied().fold(0.0, f64::max),
            apply_seconds: 0.5,
            per_destination: (relay_seconds.iter().enumerate())
                .map(|(k, &s)| DestinationRun {
                    name: destination_name(k + 1).as_str().to_owned(),
                    relay_seconds: s,
                    held: 300,
                    applied: 300,
                    transient_errors: 0,
                    time: Some(ThreadTime {
                        cpu_seconds: s / 2.0,
                        runqueue_seconds: s / 4.0,
                        blocked_seconds: s / 4.0,
                    }),
                })
                .collect(),
        }
    }

    #[test]
    fn rates_count_every_destination_from_the_start_of_the_append() {
        let two = run(2, &[0.5, 2.0]);
        assert_eq!(two.all_held_seconds(), 3.0);
        assert_eq!(two.seconds(), 3.5);
        assert_eq!(two.events_per_s(), 200.0);
        let per: Vec<f64> = (two.per_destination.iter())
            .map(|d| two.destination_events_per_s(d))
            .collect();
        assert_eq!(per, [200.0, 100.0]);
        assert_eq!(two.relay_events_per_s(), 300.0);
        let relay: Vec<f64> = (two.per_destination.iter())
            .map(|d| two.destination_relay_events_per_s(d))
            .collect();
        assert_eq!(relay, [600.0, 150.0]);
        assert_eq!(two.relay_events_per_s_per_destination(), 375.0);
        let time = two.relay_time().unwrap();
        assert_eq!(
            (
                time.cpu_seconds,
                time.runqueue_seconds,
                time.blocked_seconds
            ),
            (1.25, 0.625, 0.625)
        );
        assert_eq!(time.limit(), RelayLimit::Cpu);
        let mut unknown = two.clone();
        unknown.per_destination[1].time = None;
        assert_eq!(unknown.relay_time(), None);
    }

    #[test]
    fn the_limit_is_where_most_of_the_time_went() {
        let time = |cpu, runqueue, blocked| ThreadTime {
            cpu_seconds: cpu,
            runqueue_seconds: runqueue,
            blocked_seconds: blocked,
        };
        assert_eq!(time(2.0, 1.0, 1.0).limit(), RelayLimit::Cpu);
        assert_eq!(time(1.0, 2.0, 1.0).limit(), RelayLimit::Cores);
        assert_eq!(time(1.0, 1.0, 2.0).limit(), RelayLimit::Blocked);
        assert_eq!(RelayLimit::Blocked.as_str(), "blocked");
    }

    #[test]
    fn a_threads_schedule_is_read_and_split_over_its_wall_time() {
        let read = Scheduled::parse("1500000000 500000000 42\n").unwrap();
        assert_eq!(
            (read.cpu_ns, read.runqueue_ns),
            (1_500_000_000, 500_000_000)
        );
        assert_eq!(Scheduled::parse("12"), None);
        let later = Scheduled {
            cpu_ns: 2_500_000_000,
            runqueue_ns: 1_000_000_000,
        };
        let spent = read.until(later);
        assert_eq!(
            spent.over(4.0),
            ThreadTime {
                cpu_seconds: 1.0,
                runqueue_seconds: 0.5,
                blocked_seconds: 2.5,
            }
        );
        assert_eq!(spent.over(1.0).blocked_seconds, 0.0);
        assert!(
            Scheduled::now().is_some(),
            "/proc/thread-self/schedstat on Linux"
        );
    }

    #[test]
    fn ratios_are_to_the_run_of_one_destination_if_any() {
        let report = DestinationsReport {
            flows: 100,
            batch: 16,
            cores: 2,
            runs: vec![run(1, &[1.0]), run(2, &[0.5, 2.0])],
        };
        let ratio = report.ratio_to_one(&report.runs[1]).unwrap();
        assert_eq!(ratio.all_held_seconds, 1.5);
        assert_eq!(ratio.events_per_s, 200.0 / 150.0);
        // The relay phase alone: 300 events/s at N = 1, 300 all together
        // and 375 per destination (600 and 150) at N = 2.
        assert_eq!(ratio.relay_events_per_s, 1.0);
        assert_eq!(ratio.per_destination, 1.25);
        let each: Vec<Option<f64>> = (report.runs[1].per_destination.iter())
            .map(|d| report.destination_ratio_to_one(&report.runs[1], d))
            .collect();
        assert_eq!(each, [Some(2.0), Some(0.5)]);
        let without_one = DestinationsReport {
            runs: vec![run(2, &[1.0, 1.0])],
            ..report
        };
        assert_eq!(without_one.ratio_to_one(&without_one.runs[0]), None);
        let d = &without_one.runs[0].per_destination[0];
        assert_eq!(
            without_one.destination_ratio_to_one(&without_one.runs[0], d),
            None
        );
    }
}
