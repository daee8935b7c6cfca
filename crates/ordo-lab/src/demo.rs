//! The demo: N flows through all three steps on two fresh SQLite files,
//! relayed and applied, with a check of the end state.

use ordo_reservation::{advance_in, Advance, AdvanceRequest, Quantity, ReservationHandler};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ordo_core::{
    process_all, relay, ConsumerStore, DrainStop, FlowId, RelayOptions, SchemaVersion, SystemClock,
};
use ordo_sqlite::{ConsumerDb, GroupOptions, GroupWriter, ProducerDb};
use ordo_testkit::check::{check_end_state, EndState, Finished, Snapshot, Violation};

use crate::figures::per_second;
use crate::{join_all, LabError as Failure, Progress, STEPS};

const FILES: [&str; 2] = ["producer.db", "consumer.db"];
/// Producer threads sharing the demo's group-committing writer.
const PRODUCERS: usize = 16;
/// Deliveries per relay round, so the progress bar moves.
const RELAY_ROUND_LEN: u64 = 256;

/// What the demo runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The directory of `producer.db` and `consumer.db`.
    pub dir: PathBuf,
    /// How many flows, each through all three steps.
    pub flows: u64,
    /// Replace the files if they exist (else they are refused).
    pub force: bool,
}

/// What the demo did and found.
#[derive(Debug, Clone)]
pub struct DemoReport {
    /// The options it ran with.
    pub options: DemoOptions,
    /// Events committed.
    pub produced: u64,
    /// Events whose custody moved to the consumer.
    pub delivered: u64,
    /// Events applied.
    pub applied: u64,
    /// Flows whose apply stopped at a blocked event.
    pub blocked: u64,
    /// How long each phase took.
    pub produce_time: Duration,
    /// See [`DemoReport::produce_time`].
    pub relay_time: Duration,
    /// See [`DemoReport::produce_time`].
    pub apply_time: Duration,
    /// The end state's violations: every flow released on both sides,
    /// every event delivered and applied once.
    pub violations: Vec<Violation>,
    /// Flows a second apply pass still found work for.
    pub leftover_flows: usize,
}

impl DemoReport {
    /// Events committed per second of the produce phase.
    pub fn produced_per_s(&self) -> f64 {
        per_second(self.produced, self.produce_time.as_secs_f64())
    }

    /// Events delivered per second of the relay phase.
    pub fn delivered_per_s(&self) -> f64 {
        per_second(self.delivered, self.relay_time.as_secs_f64())
    }

    /// Events applied per second of the apply phase.
    pub fn applied_per_s(&self) -> f64 {
        per_second(self.applied, self.apply_time.as_secs_f64())
    }

    /// Everything wrong with the end state, one line each; empty when it is
    /// right.
    pub fn problems(&self) -> Vec<String> {
        let mut problems: Vec<String> = self.violations.iter().map(|v| v.to_string()).collect();
        if self.leftover_flows > 0 {
            problems.push(format!(
                "{} flows still had work after apply",
                self.leftover_flows
            ));
        }
        problems
    }
}

/// Makes room for fresh files in `dir`: refuses existing ones unless `force`.
fn prepare_dir(dir: &Path, force: bool) -> Result<(), Failure> {
    if dir.exists() && !dir.is_dir() {
        return Err(Failure::Usage(format!(
            "--dir {} is not a directory",
            dir.display()
        )));
    }
    for name in FILES {
        let path = dir.join(name);
        if path.exists() && !force {
            return Err(Failure::Usage(format!(
                "{} already exists; pass --force to replace it",
                path.display()
            )));
        }
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Failure::Internal(format!("cannot create {}: {e}", dir.display())))?;
    for name in FILES {
        for suffix in ["", "-wal", "-shm"] {
            let path = dir.join(format!("{name}{suffix}"));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Failure::Internal(format!(
                        "cannot remove {}: {e}",
                        path.display()
                    )))
                }
            }
        }
    }
    Ok(())
}

/// Runs the demo in `options.dir`, refusing existing files unless
/// `options.force`; the end state is checked, not asserted: a wrong one is
/// in the report.
pub fn run(options: &DemoOptions, progress: &dyn Progress) -> Result<DemoReport, Failure> {
    prepare_dir(&options.dir, options.force)?;
    let producer = ordo_reservation::open_producer(options.dir.join(FILES[0]))?;
    let mut consumer = ordo_reservation::open_consumer(options.dir.join(FILES[1]))?;
    let flows: Vec<FlowId> = (1..=options.flows)
        .map(|i| FlowId::new(format!("flow-{i:07}")).expect("demo flow ids are identifiers"))
        .collect();
    let events = options.flows * STEPS.len() as u64;

    let ((mut producer, produced), produce_time) = timed(progress, "produce", events, || {
        produce(producer, &flows, progress)
    })?;
    let (delivered, relay_time) = timed(progress, "relay", events, || {
        relay_all(&mut producer, &mut consumer, progress)
    })?;
    // The bar counts events, as the summary does.
    let ((applied, blocked, leftover), apply_time) = timed(progress, "apply", events, || {
        let (applied, blocked) = apply_all(&mut consumer, progress)?;
        // Nothing may remain: a second pass must find no work.
        let leftover = process_all(
            &mut consumer,
            None,
            &mut ReservationHandler::default(),
            ordo_core::APPLY_BATCH_LEN_DEFAULT,
        )?;
        Ok((applied, blocked, leftover))
    })?;

    let snapshot = Snapshot::new(
        ordo_reservation::producer_snapshot(&mut producer)?,
        ordo_reservation::consumer_snapshot(&mut consumer)?,
    );
    let expected = EndState {
        delivered: true,
        finished: Some(Finished::released(flows.len())),
    };
    Ok(DemoReport {
        options: options.clone(),
        produced,
        delivered,
        applied,
        blocked,
        produce_time,
        relay_time,
        apply_time,
        violations: check_end_state(&snapshot, &expected),
        leftover_flows: leftover.len(),
    })
}

/// Runs `phase` as the progress phase `label` of `len` steps; what it
/// returned and how long it took.
fn timed<T>(
    progress: &dyn Progress,
    label: &str,
    len: u64,
    phase: impl FnOnce() -> Result<T, Failure>,
) -> Result<(T, Duration), Failure> {
    let started = Instant::now();
    progress.start(label, len);
    let value = phase()?;
    progress.finish();
    Ok((value, started.elapsed()))
}

/// Advances every flow through its three steps, the flows shared out among
/// [`PRODUCERS`] threads of one group-committing writer, as the request
/// handlers of a service would; returns the store and the events committed.
fn produce(
    producer: ProducerDb,
    flows: &[FlowId],
    progress: &dyn Progress,
) -> Result<(ProducerDb, u64), Failure> {
    let writer = GroupWriter::start(producer, GroupOptions::default())?;
    let counts: Vec<Result<u64, Failure>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..PRODUCERS)
            .map(|t| {
                let writer = &writer;
                scope.spawn(move || {
                    let mine = flows.iter().enumerate().skip(t).step_by(PRODUCERS);
                    let mut produced = 0;
                    for (i, flow_id) in mine {
                        produced += produce_flow(writer, i, flow_id, progress)?;
                    }
                    Ok(produced)
                })
            })
            .collect();
        join_all(handles, "a producer thread")
    });
    let producer = writer.close();
    let produced = counts.into_iter().sum::<Result<u64, Failure>>()?;
    Ok((producer, produced))
}

/// One flow through its three steps, each committed through the writer.
fn produce_flow(
    writer: &GroupWriter,
    i: usize,
    flow_id: &FlowId,
    progress: &dyn Progress,
) -> Result<u64, Failure> {
    let quantity = Quantity::new((i as i64 % 1_000) + 1).expect("1..=1000 is a quantity");
    for (expected_seq, to) in STEPS.iter().enumerate() {
        let request = AdvanceRequest::new(
            flow_id.clone(),
            expected_seq as i64,
            *to,
            Some(quantity),
            SchemaVersion::V1,
        )
        .map_err(|e| Failure::Internal(e.to_string()))?;
        match writer
            .submit(move |ptx| advance_in(ptx, &request))
            .map_err(|e| Failure::Internal(e.to_string()))?
        {
            Advance::Committed(_) => progress.inc(1),
            other => {
                return Err(Failure::Internal(format!(
                    "demo advance of {flow_id} was {other:?}"
                )))
            }
        }
    }
    Ok(STEPS.len() as u64)
}

/// Relays in rounds until nothing is left; returns the events delivered.
fn relay_all(
    producer: &mut ProducerDb,
    consumer: &mut ConsumerDb,
    progress: &dyn Progress,
) -> Result<u64, Failure> {
    let mut delivered = 0u64;
    loop {
        let report = relay(
            producer,
            consumer,
            &RelayOptions {
                max: Some(RELAY_ROUND_LEN),
                ..RelayOptions::default()
            },
            &SystemClock,
        )
        .map_err(|e| Failure::Internal(e.to_string()))?;
        let accepted = report
            .deliveries
            .iter()
            .filter(|d| d.receipt.moves_custody())
            .count() as u64;
        delivered += accepted;
        progress.inc(accepted);
        if report.deliveries.len() as u64 != accepted {
            return Err(Failure::Internal("demo relay met a conflict".into()));
        }
        if report.deliveries.is_empty() {
            return Ok(delivered);
        }
    }
}

/// Drains every flow with work; returns the events applied and the flows
/// that stopped at a blocked event.
fn apply_all(consumer: &mut ConsumerDb, progress: &dyn Progress) -> Result<(u64, u64), Failure> {
    let (mut applied, mut blocked) = (0u64, 0u64);
    for chunk in consumer.flows_with_work(&[])?.chunks(64) {
        let before = applied;
        for flow_id in chunk {
            let drain = ordo_core::drain(
                consumer,
                flow_id,
                None,
                &mut ReservationHandler::default(),
                ordo_core::APPLY_BATCH_LEN_DEFAULT,
            )?;
            applied += drain.applied;
            if matches!(drain.stop, DrainStop::Blocked(_)) {
                blocked += 1;
            }
        }
        progress.inc(applied - before);
    }
    Ok((applied, blocked))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_phase_has_its_rate() {
        let ms = Duration::from_millis;
        // (events of each phase, times) -> (produced/s, delivered/s, applied/s)
        let cases = [
            (
                ((300, 300, 300), (ms(1500), ms(3000), ms(600))),
                (200.0, 100.0, 500.0),
            ),
            (
                ((300, 299, 0), (ms(250), ms(1000), ms(40))),
                (1200.0, 299.0, 0.0),
            ),
            // A phase of no measurable time stays finite.
            (
                ((3, 0, 5), (Duration::ZERO, Duration::ZERO, Duration::ZERO)),
                (3e9, 0.0, 5e9),
            ),
        ];
        for (((produced, delivered, applied), (produce, relay, apply)), rates) in cases {
            let report = DemoReport {
                options: DemoOptions {
                    dir: PathBuf::from("demo"),
                    flows: 100,
                    force: false,
                },
                produced,
                delivered,
                applied,
                blocked: 0,
                produce_time: produce,
                relay_time: relay,
                apply_time: apply,
                violations: Vec::new(),
                leftover_flows: 0,
            };
            let got = (
                report.produced_per_s(),
                report.delivered_per_s(),
                report.applied_per_s(),
            );
            assert_eq!(got, rates, "{report:?}");
        }
    }
}
