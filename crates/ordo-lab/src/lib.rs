//! # ordo-lab
//!
//! The machinery behind `ordo experiment`, `ordo soak`, `ordo bench` and
//! `ordo demo`: runs on real SQLite files and real `ordo` processes, each
//! returning a typed report. The lab prints nothing; a caller renders the
//! reports and shows progress through [`Progress`]. Runs that need child
//! processes take the path of the `ordo` binary, whose hidden `worker`
//! command runs [`worker::run`].

pub mod bench;
pub mod bench_destinations;
pub mod bench_http;
pub mod bench_pg;
pub mod bench_producers;
pub mod bench_wake;
pub mod demo;
pub mod experiment;
pub mod faults;
pub mod figures;
pub mod pg;
pub mod serve;
pub mod skeleton_pg;
pub mod skeleton_sqlite;
pub mod soak;
pub mod soak_effects;
mod soak_effects_check;
mod soak_pg;
pub mod soak_topology;
pub mod transports;
pub mod worker;
pub mod worker_group;

use ordo_core::{Envelope, StoreError};
use ordo_reservation::FlowState;

/// Why a lab run could not report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LabError {
    /// The options or the files given cannot be used; nothing was run.
    #[error("{0}")]
    Usage(String),
    /// A store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A run could not complete (a file, a process, a thread).
    #[error("{0}")]
    Internal(String),
    /// A run completed with figures that contradict each other (events
    /// lost by a bench pipeline).
    #[error("{0}")]
    Check(String),
}

/// The three steps of every flow the lab drives, in order.
const STEPS: [FlowState; 3] = [
    FlowState::Reserved,
    FlowState::Confirmed,
    FlowState::Released,
];

fn internal<E: std::fmt::Display>(error: E) -> LabError {
    LabError::Internal(error.to_string())
}

/// The first event of a new flow `flow_id` (seq 1), reserving `amount`:
/// the load of the benches, one event a flow.
pub fn first_reservation(flow_id: String, amount: u64) -> Result<Envelope, LabError> {
    Envelope::from_value(serde_json::json!({
        "event_id": format!("{flow_id}-1"),
        "flow_id": flow_id,
        "seq": 1,
        "schema_version": 1,
        "type": "reserved",
        "payload": {"amount": amount},
    }))
    .map_err(internal)
}

/// What each of a scope's threads returned, in order; a thread that
/// panicked failed with "`who` panicked".
fn join_all<T>(
    handles: Vec<std::thread::ScopedJoinHandle<'_, Result<T, LabError>>>,
    who: &str,
) -> Vec<Result<T, LabError>> {
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(LabError::Internal(format!("{who} panicked"))))
        })
        .collect()
}

/// What a long run reports as it goes, for a caller to show. One phase runs
/// at a time; [`Progress::inc`] may be called from any thread.
pub trait Progress: Send + Sync {
    /// A phase of `len` steps starts (`len` 0: of unknown length).
    fn start(&self, label: &str, len: u64);
    /// `steps` more steps of the current phase are done.
    fn inc(&self, steps: u64);
    /// The current phase stands at `position`, with a short note.
    fn set(&self, position: u64, note: &str);
    /// The current phase is over.
    fn finish(&self);
}

/// Progress that nobody watches.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Progress for Silent {
    fn start(&self, _label: &str, _len: u64) {}
    fn inc(&self, _steps: u64) {}
    fn set(&self, _position: u64, _note: &str) {}
    fn finish(&self) {}
}
