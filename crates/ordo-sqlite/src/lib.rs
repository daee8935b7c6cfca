//! # ordo-sqlite
//!
//! The embedded default backend of ordo: a producer store and a consumer
//! store, each in its own SQLite file (bundled SQLite), in WAL mode with
//! `synchronous=FULL` read back at open, a busy timeout, and `BEGIN
//! IMMEDIATE` for every write transaction. An application gets these
//! settings by opening its stores here; nothing needs copying.
//!
//! * A [`Schema`] names the application's domain and declares its own
//!   tables; ordo creates and migrates them in the same file.
//! * [`ProducerDb::write`] lets the application change its own state and
//!   [`OutboxTx::append`] its events in one transaction.
//! * [`ConsumerDb`] applies each flow's events in order through the
//!   application's [`ApplyHandler`](ordo_core::ApplyHandler), which writes
//!   its own tables in the transaction that marks the event applied.
//! * [`GroupWriter`] commits the units of many threads of one process
//!   together, each unit under its own savepoint, so they share a sync.
//! * The relay and apply loops of an application's process are `ordo_runtime::Runner`'s.

#![warn(missing_docs)]

mod browse;
mod conn;
mod consumer;
mod custody;
mod domain;
pub mod group;
mod outbox_schema;
mod producer;
mod round;
mod watch;

pub use browse::read_outbox_entries;
pub use conn::{
    same_file, OpenOptions, APPLICATION_ID, BUSY_TIMEOUT_DEFAULT, FIRST_RELEASE_DOMAIN,
    SCHEMA_VERSION,
};
pub use consumer::{read_inbox, ApplyTx, ConsumerDb};
pub use domain::{Schema, MIGRATIONS_MAX};
pub use group::{
    GroupOptions, GroupWriter, Pending, SubmitError, WhenFull, BATCH_LEN_MAX_DEFAULT,
    BATCH_TIME_MAX_DEFAULT, QUEUE_LEN_MAX_DEFAULT, WAIT_MAX_DEFAULT, WAL_CHECKPOINT_PAGES_DEFAULT,
};
pub use ordo_core::OutboxTx;
pub use producer::{read_outbox, ProducerDb, ProducerTx, CONFLICT_REASON};
/// The rusqlite version these stores are built on, for callers writing their
/// own state in `ProducerDb::write` or an `ApplyHandler`.
pub use rusqlite;
