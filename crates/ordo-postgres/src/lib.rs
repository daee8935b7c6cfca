//! # ordo-postgres
//!
//! ordo's producer and consumer stores on PostgreSQL, behind the same
//! traits as the SQLite stores: [`PgProducer`] (a
//! [`ProducerStore`](ordo_core::ProducerStore)) and [`PgConsumer`] (a
//! [`ConsumerStore`](ordo_core::ConsumerStore)).
//!
//! * ordo's tables live in their own schemas (`ordo_producer` and
//!   `ordo_consumer` by default, see [`PgOptions::schema`]), so one
//!   database may hold both roles and the application's tables beside
//!   them. Each schema records its role, ordo's schema version and the
//!   owning domain in `ordo_meta`; opening creates what is missing and
//!   migrates forward inside one transaction, under an advisory lock, and
//!   never resets state. A [`Schema`] names the application's domain and
//!   its migrations.
//! * Every connection reads `synchronous_commit` back and refuses `off`;
//!   transactions are READ COMMITTED. The producer allocates each flow's
//!   next seq under a row lock on the flow's head (see
//!   [`PgProducerTx::last_seq`]), so a racing writer of the same flow waits
//!   and then finds itself stale; there is no global cursor.
//! * A handler writes through [`PgTx`] (`execute`, `query`, `query_opt`,
//!   ... on `&self`), inside the transaction that marks its event applied.
//! * Errors carry the SQLSTATE in their message; serialization failures,
//!   deadlocks and lock timeouts are [`ErrorKind::Busy`](ordo_core::ErrorKind::Busy),
//!   a lost connection `ConnectionLost`, one lost during COMMIT
//!   `CommitOutcomeUnknown`.
//!
//! Each store owns one connection (the sync `postgres` client, without
//! TLS for now: meant for loopback or a trusted network). A pool, several
//! relays and appliers with leases, and resolving unknown commit outcomes
//! come later.

#![warn(missing_docs)]

mod conn;
mod consumer;
mod domain;
pub mod error;
mod producer;

pub use conn::{
    Params, PgOptions, PgTx, TxOutcome, CONSUMER_SCHEMA_DEFAULT, LEASE_MS_DEFAULT,
    PRODUCER_SCHEMA_DEFAULT, SCHEMA_VERSION,
};
pub use consumer::{read_inbox, PgConsumer};
pub use domain::{Schema, MIGRATIONS_MAX};
pub use producer::{read_outbox, PgProducer, PgProducerTx, CONFLICT_REASON};
/// ordo's own tables of each role (producer, consumer) as they are created,
/// with `{s}` standing for the schema: what a store at [`SCHEMA_VERSION`]
/// holds, for a caller that caches migrated databases (a test template).
pub fn tables_ddl() -> [String; 2] {
    [producer::TABLES.all(), consumer::TABLES.all()]
}

/// The `postgres` client these stores are built on, for rows and types in
/// an application's own SQL.
pub use postgres;
