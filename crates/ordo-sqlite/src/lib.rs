//! # ordo-sqlite
//!
//! The embedded default backend of ordo: a producer store and a consumer
//! store, each in its own SQLite file (bundled SQLite), in WAL mode with
//! `synchronous=FULL` read back at open, a busy timeout, and `BEGIN
//! IMMEDIATE` for every write transaction.
//!
//! * [`ProducerDb::write`] lets a caller change its own state and append
//!   events to the outbox in one transaction; the reservation flow's
//!   `advance` is built on it.
//! * [`ConsumerDb::apply_next_with`] applies a flow's next event through an
//!   [`ApplyHandler`] that writes its projection and effect in the same
//!   transaction that marks the inbox row applied.

#![warn(missing_docs)]

mod conn;
mod consumer;
mod producer;

pub use conn::{same_file, OpenOptions, APPLICATION_ID, BUSY_TIMEOUT_DEFAULT, SCHEMA_VERSION};
pub use consumer::{ApplyHandler, ConsumerDb, ReservationHandler};
pub use producer::{ProducerDb, ProducerTx};
/// The rusqlite version these stores are built on, for callers writing their
/// own state in `ProducerDb::write` or an `ApplyHandler`.
pub use rusqlite;
