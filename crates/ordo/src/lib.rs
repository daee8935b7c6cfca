//! # ordo
//!
//! The crate an application adds. Where a store lives is a [`Location`]
//! (an SQLite file, or a PostgreSQL database given by its `postgres://`
//! URL); how to open it is one [`OpenSpec`] (the domain's [`Schema`] with
//! its migrations for both dialects, whether a missing store is created,
//! whether an application's SQLite file is adopted, the clock), which opens
//! a [`Producer`] or a [`Consumer`] on either backend. Each is the
//! backend's own store, so the application's handler runs on its own
//! transaction type; [`OpenSpec::run_apply`] runs a handler written for
//! both on whichever was opened.
//!
//! Invariant: this crate decides nothing of the protocol and writes no
//! SQL. It maps a location onto a backend's open calls, and hands out the
//! object-safe views of `ordo-core` ([`ProducerOps`], [`ConsumerHandle`])
//! for code that runs on any backend.
//!
//! The crates beneath are re-exported under their own names: [`core`],
//! [`sqlite`], [`postgres`] and [`runtime`].

#![warn(missing_docs)]

mod location;
mod open;

pub use location::{redact, Location};
pub use open::{Consumer, OpenSpec, Producer};

pub use ordo_core as core;
pub use ordo_postgres as postgres;
pub use ordo_runtime as runtime;
pub use ordo_sqlite as sqlite;

pub use ordo_core::domain::Schema;
pub use ordo_core::{
    ApplyContext, ApplyHandler, ConsumerHandle, ConsumerOps, ConsumerStore, Envelope, ProducerOps,
    ProducerStore, Receive, StoreError, Verdict,
};

/// The README's examples, compiled and run by `cargo test`.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// The application guide's example (docs/guide.md), compiled and run by
/// `cargo test`.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/guide.md")]
pub struct GuideDoctests;
