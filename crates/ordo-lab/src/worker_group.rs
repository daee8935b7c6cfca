//! The producer worker with many threads: each thread drives its share of
//! the flows through one group-committing writer, as the request handlers
//! of one service would, and records every event it was told committed.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ordo_core::{Clock, FlowId, SchemaVersion, SystemClock};
use ordo_reservation::{advance_in, Advance, AdvanceError, AdvanceRequest, Quantity};
use ordo_sqlite::{GroupOptions, GroupWriter, SubmitError};

use crate::worker::{WorkerEnv, WorkerReport};
use crate::{join_all, LabError as Failure, STEPS};

/// The most producer threads of one worker process.
pub const THREADS_MAX: usize = 1_024;

/// What the grouped producer does.
#[derive(Debug, Clone)]
pub struct GroupedProduce {
    /// The producer file.
    pub producer: PathBuf,
    /// The flows, shared out among the threads (flow `i` to thread
    /// `i mod threads`).
    pub flows: Vec<FlowId>,
    /// The quantity of every flow.
    pub quantity: Quantity,
    /// Flow by flow over this window (ms since the epoch), as the
    /// single-threaded producer does.
    pub spread_ms: Option<(i64, i64)>,
    /// Producer threads, 1..=[`THREADS_MAX`].
    pub threads: usize,
    /// Appends the id of every event acknowledged as committed, one line
    /// each, after the acknowledgement.
    pub acks: Option<PathBuf>,
}

/// One thread's tally.
#[derive(Default)]
struct Tally {
    committed: u64,
    stale: u64,
}

/// Where a producer thread records what it was told committed.
pub(crate) struct Acks(Option<File>);

impl Acks {
    pub(crate) fn open(path: Option<&Path>) -> Result<Acks, Failure> {
        let file = path
            .map(|p| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| Failure::Internal(format!("cannot open {}: {e}", p.display())))
            })
            .transpose()?;
        Ok(Acks(file))
    }

    /// One line in one write, so that a kill leaves whole lines.
    pub(crate) fn record(&self, event_id: &str) -> Result<(), Failure> {
        if let Some(mut file) = self.0.as_ref() {
            file.write_all(format!("{event_id}\n").as_bytes())
                .map_err(|e| Failure::Internal(format!("cannot record an ack: {e}")))?;
        }
        Ok(())
    }
}

/// Runs the grouped producer to its end.
pub fn produce(env: &WorkerEnv, job: &GroupedProduce) -> Result<WorkerReport, Failure> {
    if job.threads == 0 || job.threads > THREADS_MAX {
        return Err(Failure::Usage(format!(
            "--threads must be in 1..={THREADS_MAX}"
        )));
    }
    let db = ordo_sqlite::ProducerDb::open_or_create(
        &job.producer,
        &ordo_reservation::producer_schema(),
        env.clock.clone(),
        &env.options,
    )?;
    let writer = GroupWriter::start(db, GroupOptions::default())?;
    let acks = Acks::open(job.acks.as_deref())?;
    let tallies: Vec<Result<Tally, Failure>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..job.threads)
            .map(|t| {
                let (writer, acks) = (&writer, &acks);
                scope.spawn(move || drive(writer, acks, job, t))
            })
            .collect();
        join_all(handles, "a producer thread")
    });
    writer.close();
    let (mut committed, mut stale) = (0, 0);
    for tally in tallies {
        let tally = tally?;
        committed += tally.committed;
        stale += tally.stale;
    }
    Ok(WorkerReport::Produced { committed, stale })
}

/// Thread `t`'s flows through all steps: step by step across them, or
/// flow by flow on the spread's schedule.
fn drive(
    writer: &GroupWriter,
    acks: &Acks,
    job: &GroupedProduce,
    t: usize,
) -> Result<Tally, Failure> {
    let mine: Vec<(usize, &FlowId)> = job
        .flows
        .iter()
        .enumerate()
        .filter(|(i, _)| i % job.threads == t)
        .collect();
    let mut tally = Tally::default();
    let mut advance = |flow: &FlowId, step: usize| -> Result<(), Failure> {
        let request = AdvanceRequest::new(
            flow.clone(),
            step as i64,
            STEPS[step],
            Some(job.quantity),
            SchemaVersion::V1,
        )
        .map_err(|e| Failure::Usage(e.to_string()))?;
        match writer.submit(move |ptx| advance_in(ptx, &request)) {
            Ok(Advance::Committed(event)) => {
                tally.committed += 1;
                acks.record(event.event_id.as_str())
            }
            Ok(Advance::Stale { .. }) => {
                tally.stale += 1;
                Ok(())
            }
            Ok(other) => Err(Failure::Internal(format!("{flow}: unexpected {other:?}"))),
            Err(SubmitError::Unit(AdvanceError::Store(e)) | SubmitError::Store(e)) => Err(e.into()),
            Err(e) => Err(Failure::Internal(e.to_string())),
        }
    };
    match job.spread_ms {
        None => {
            for step in 0..STEPS.len() {
                for (_, flow) in &mine {
                    advance(flow, step)?;
                }
            }
        }
        Some((from_ms, until_ms)) => {
            let per_flow_ms = (until_ms - from_ms).max(0) as f64 / job.flows.len().max(1) as f64;
            for (i, flow) in &mine {
                let due_ms = from_ms + (per_flow_ms * *i as f64) as i64;
                let wait_ms = due_ms - SystemClock.now_ms();
                if wait_ms > 0 {
                    std::thread::sleep(Duration::from_millis(wait_ms as u64));
                }
                for step in 0..STEPS.len() {
                    advance(flow, step)?;
                }
            }
        }
    }
    Ok(tally)
}
