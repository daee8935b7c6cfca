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
//!   a lost connection `ConnectionLost`, a COMMIT whose outcome cannot be
//!   learned `CommitOutcomeUnknown`.
//!
//! Each store owns one connection (the sync `postgres` client), over TLS
//! when the URL asks for it with libpq's parameters (`sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey`; see [`PgUrl`] and [`TlsMode`]), with
//! rustls. Unlike libpq, a URL without `sslmode` connects without TLS: on
//! anything but a loopback address or a trusted network, ask for
//! `sslmode=verify-full`.
//!
//! # Several workers
//!
//! Run several relays and appliers as several store handles (threads or
//! processes), each with its own connection:
//!
//! * [`PgOptions::owner`] names the worker (default: unique per handle);
//!   the connection's `application_name` is `ordo-relay-<owner>` for a
//!   producer, `ordo-apply-<owner>` for a consumer, unless
//!   [`PgOptions::application_name`] or the URL sets one.
//! * Relays claim whole flows under leases of [`PgOptions::lease_ms`]
//!   (default [`LEASE_MS_DEFAULT`]) with a fence; a stale relay's
//!   bookkeeping is refused with
//!   [`ErrorKind::LeaseLost`](ordo_core::ErrorKind::LeaseLost) and
//!   nothing written (see [`PgProducer`]). Use the `fair` policy: the
//!   `first-pending` policy claims nothing and is for one relay.
//! * Appliers lock a flow's apply cursor row: a batch passes by a flow
//!   another applier holds (reporting it `idle`, nothing applied), so
//!   appliers never wait for each other on different flows, and each
//!   `(flow, seq)` is applied once, in order.
//! * Every write transaction records its transaction id when it begins; a
//!   COMMIT whose answer is lost is resolved on a new connection with
//!   `pg_xact_status` ([`PgTx::transaction_outcome`]): committed is
//!   success, aborted is
//!   [`ErrorKind::ConnectionLost`](ordo_core::ErrorKind::ConnectionLost)
//!   with nothing written, still unknown is
//!   [`ErrorKind::CommitOutcomeUnknown`](ordo_core::ErrorKind::CommitOutcomeUnknown).
//!   Receive, apply and the relay's bookkeeping are idempotent or
//!   conditional: after `ConnectionLost` they are simply retried.
//! * A connection whose transaction errored or broke is replaced by a new
//!   one with the same settings before the store's next transaction.
//! * A receive that stores at least one new event, and a write that
//!   appends, send one `NOTIFY` with their COMMIT, on the channel
//!   `ordo_inbox_<schema>` or `ordo_outbox_<schema>`
//!   ([`PgConsumer::notify_channel`], [`PgProducer::notify_channel`]), so
//!   that a loop of another process wakes at once: a handle's
//!   [`RunStore::changed_elsewhere`](ordo_core::RunStore::changed_elsewhere)
//!   listens on a connection of its own (`application_name` and
//!   `-listen`), opened at its first call.

#![warn(missing_docs)]

mod browse;
mod columns;
mod conn;
mod consumer;
mod domain;
pub mod error;
#[cfg(test)]
mod plans;
mod producer;
mod tls;
mod url;
mod wake;

pub use browse::read_outbox_entries;
pub use conn::{
    Params, PgOptions, PgTx, TxOutcome, CONSUMER_SCHEMA_DEFAULT, LEASE_MS_DEFAULT,
    PRODUCER_SCHEMA_DEFAULT, SCHEMA_VERSION,
};
pub use consumer::{read_inbox, ApplyTx, PgConsumer};
pub use domain::{Schema, MIGRATIONS_MAX};
pub use ordo_core::OutboxTx;
pub use producer::{read_outbox, PgProducer, PgProducerTx, CONFLICT_REASON};
pub use tls::{PgUrl, TlsMode};
pub use url::{is_postgres_url, redact_url, url_host_start};
/// ordo's own tables of each role (producer, consumer) as they are created,
/// with `{s}` standing for the schema: what a store at [`SCHEMA_VERSION`]
/// holds, for a caller that caches migrated databases (a test template).
pub fn tables_ddl() -> [String; 2] {
    [producer::TABLES.all(), consumer::TABLES.all()]
}

/// The `postgres` client these stores are built on, for rows and types in
/// an application's own SQL.
pub use postgres;
