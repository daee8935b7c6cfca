//! # ordo-faults
//!
//! Standing fault tests of ordo's SQLite stores, and the machinery they run
//! on:
//!
//! * [`install`] registers a SQLite VFS that wraps the default one (`unix`)
//!   as the process's default, so that `ordo-sqlite` opens its files through
//!   it unchanged. It knows nothing of ordo.
//! * [`FaultPlan::arm`] arms a directory: the files under it are counted,
//!   journaled, and made to fail as its [`Fault`] says (the Nth write, the
//!   Nth sync, every write as read-only, or a power cut at the Nth sync).
//!   Plans of different directories do not interfere, so tests on threads
//!   of one process each arm their own.
//! * [`FaultPlan::simulate_power_loss`] puts every file back as it was at
//!   its last successful sync, optionally keeping or tearing some of the
//!   writes made since ([`Tear`]).
//! * [`ops`] is the one place that calls the store API: each [`ops::Operation`]
//!   sets up its files, runs once, and the directory's state is read as a
//!   [`ops::Snapshot`]. [`harness`] runs an operation under every fault
//!   point and checks what must hold after each.
//!
//! See `docs/faults.md` for what is injected, how power loss is simulated
//! and what each test proves.

#![warn(missing_docs)]

pub mod harness;
pub mod ops;
mod plan;
mod vfs;

pub use plan::{Counts, Fault, FaultPlan, PowerLoss, Tear, TORN_SECTOR_LEN_BYTES};
pub use vfs::{install, InstallError, VFS_NAME};
