//! Where a store lives (an SQLite file or a PostgreSQL database) and the
//! stores of either backend behind one type per role, so that every command
//! runs the same code on both. A leaf: it imports no command.
//!
//! Invariant: a `--producer` / `--consumer` value is a PostgreSQL URL only
//! when it starts with `postgres://` or `postgresql://`; anything else is a
//! file path, taken as it is. A URL is only ever shown with its password
//! replaced by `***`.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use ordo_core::ops::{
    ConsumerStatus, InboxEntry, OutboxEntry, ProducerStatus, Pruned, RepairRecord, RetryRefused,
    SkipRefused, SkipRequest,
};
use ordo_core::{
    AppendError, Backoff, ConsumerStore, Drain, Envelope, EventId, FlowId, OutboxRecord,
    ProducerStore, Receipt, StoreError, Transport, TransportError,
};
use ordo_postgres::{PgConsumer, PgProducer};
use ordo_reservation::{
    Advance, AdvanceError, AdvanceRefused, AdvanceRequest, FlowRecord, Projection,
    ReservationConsumer, ReservationHandler, ReservationProducer,
};
use ordo_sqlite::{ConsumerDb, ProducerDb};

/// A `--producer` or `--consumer` value.
#[derive(Clone, PartialEq, Eq)]
pub enum Location {
    /// An SQLite file.
    File(PathBuf),
    /// A PostgreSQL connection URL, as given (it may hold a password:
    /// show it only through [`Location`]'s `Display`).
    Postgres(String),
}

impl From<OsString> for Location {
    fn from(value: OsString) -> Location {
        match value.to_str() {
            Some(text) if ordo_postgres::is_postgres_url(text) => {
                Location::Postgres(text.to_owned())
            }
            _ => Location::File(PathBuf::from(value)),
        }
    }
}

impl From<&str> for Location {
    fn from(value: &str) -> Location {
        Location::from(OsString::from(value))
    }
}

impl Location {
    /// The file, for an SQLite store.
    pub fn file(&self) -> Option<&Path> {
        match self {
            Location::File(path) => Some(path),
            Location::Postgres(_) => None,
        }
    }
}

impl fmt::Debug for Location {
    /// As `Display`: never the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::File(path) => f.debug_tuple("File").field(path).finish(),
            Location::Postgres(url) => f.debug_tuple("Postgres").field(&redact(url)).finish(),
        }
    }
}

impl fmt::Display for Location {
    /// The path, or the URL with its password shown as `***`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::File(path) => write!(f, "{}", path.display()),
            Location::Postgres(url) => f.write_str(&redact(url)),
        }
    }
}

pub use ordo_postgres::redact_url as redact;

/// A producer store of either backend.
// One per role and process, never in a collection: the size is no matter.
#[allow(clippy::large_enum_variant)]
pub enum AnyProducer {
    /// An SQLite file.
    Sqlite(ProducerDb),
    /// A PostgreSQL database.
    Postgres(PgProducer),
}

/// Calls the same method on whichever store `self` holds.
macro_rules! each {
    ($self:expr, $store:ident => $call:expr) => {
        match $self {
            Self::Sqlite($store) => $call,
            Self::Postgres($store) => $call,
        }
    };
}

impl AnyProducer {
    /// The domain that owns the store.
    pub fn domain(&self) -> &str {
        each!(self, s => s.domain())
    }

    /// The flows (none for another domain than the reservation) and the
    /// outbox, read in one read transaction.
    pub fn snapshot(&mut self) -> Result<(Vec<FlowRecord>, Vec<OutboxRecord>), StoreError> {
        match self {
            AnyProducer::Sqlite(s) => ordo_reservation::producer_snapshot(s),
            AnyProducer::Postgres(s) => ordo_reservation::postgres::pg_producer_snapshot(s),
        }
    }
}

impl ordo_core::RunStore for AnyProducer {
    fn clock(&self) -> std::sync::Arc<dyn ordo_core::Clock> {
        each!(self, s => s.clock())
    }

    fn signal(&self) -> ordo_core::Signal {
        each!(self, s => ordo_core::RunStore::signal(s))
    }

    fn changed_elsewhere(&mut self) -> Result<bool, StoreError> {
        each!(self, s => s.changed_elsewhere())
    }
}

impl ProducerStore for AnyProducer {
    fn append_events(&mut self, events: &[Envelope]) -> Result<(), AppendError> {
        each!(self, s => s.append_events(events))
    }

    fn outbox(&mut self) -> Result<Vec<OutboxRecord>, StoreError> {
        each!(self, s => s.outbox())
    }

    fn outbox_event(&mut self, event_id: &EventId) -> Result<Option<OutboxRecord>, StoreError> {
        each!(self, s => s.outbox_event(event_id))
    }

    fn pending(&mut self, limit: usize) -> Result<Vec<Envelope>, StoreError> {
        each!(self, s => s.pending(limit))
    }

    fn oldest_unaccepted(&mut self, now_ms: i64) -> Result<Option<Envelope>, StoreError> {
        each!(self, s => s.oldest_unaccepted(now_ms))
    }

    fn fair_round(
        &mut self,
        limit: usize,
        skip: &BTreeSet<FlowId>,
        now_ms: i64,
    ) -> Result<Vec<Envelope>, StoreError> {
        each!(self, s => s.fair_round(limit, skip, now_ms))
    }

    fn fair_round_deep(
        &mut self,
        limit: usize,
        flow_events_max: usize,
        skip: &BTreeSet<FlowId>,
        now_ms: i64,
    ) -> Result<Vec<Envelope>, StoreError> {
        each!(self, s => s.fair_round_deep(limit, flow_events_max, skip, now_ms))
    }

    fn record_receipts(
        &mut self,
        receipts: &[(EventId, Receipt)],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        each!(self, s => s.record_receipts(receipts, now_ms))
    }

    fn record_failure(
        &mut self,
        event_ids: &[EventId],
        error: &str,
        now_ms: i64,
        backoff: &Backoff,
    ) -> Result<(), StoreError> {
        each!(self, s => s.record_failure(event_ids, error, now_ms, backoff))
    }

    fn quarantine(
        &mut self,
        event_id: &EventId,
        outcome: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        each!(self, s => s.quarantine(event_id, outcome, reason, now_ms))
    }

    fn outbox_entries(
        &mut self,
        quarantined_only: bool,
        limit: usize,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        each!(self, s => s.outbox_entries(quarantined_only, limit))
    }

    fn retry_quarantined(
        &mut self,
        event_id: &EventId,
    ) -> Result<Result<(), RetryRefused>, StoreError> {
        each!(self, s => s.retry_quarantined(event_id))
    }

    fn producer_status(&mut self, now_ms: i64) -> Result<ProducerStatus, StoreError> {
        each!(self, s => s.producer_status(now_ms))
    }

    fn prune_outbox(&mut self, cutoff_ms: i64) -> Result<Pruned, StoreError> {
        each!(self, s => s.prune_outbox(cutoff_ms))
    }
}

impl ReservationProducer for AnyProducer {
    fn advance(&mut self, request: &AdvanceRequest) -> Result<Advance, AdvanceError> {
        each!(self, s => s.advance(request))
    }

    fn advance_batch(
        &mut self,
        requests: &[AdvanceRequest],
    ) -> Result<Vec<Result<Advance, AdvanceRefused>>, StoreError> {
        each!(self, s => s.advance_batch(requests))
    }

    fn flows(&mut self) -> Result<Vec<FlowRecord>, StoreError> {
        each!(self, s => s.flows())
    }
}

/// A consumer store of either backend. Not a [`ConsumerStore`] itself (the
/// handler's transaction type differs by backend): the handler runs through
/// [`AnyConsumer::drain_reservation`] and
/// [`AnyConsumer::process_reservation_each`].
// One per role and handle, never in a collection: the size is no matter.
#[allow(clippy::large_enum_variant)]
pub enum AnyConsumer {
    /// An SQLite file.
    Sqlite(ConsumerDb),
    /// A PostgreSQL database.
    Postgres(PgConsumer),
}

/// The inbox, projections and effects of a consumer snapshot.
pub use ordo_reservation::ConsumerRows;

impl AnyConsumer {
    /// The domain that owns the store.
    pub fn domain(&self) -> &str {
        each!(self, s => s.domain())
    }

    /// The inbox, and the projections and effects (none for another domain
    /// than the reservation), read in one read transaction.
    pub fn snapshot(&mut self) -> Result<ConsumerRows, StoreError> {
        match self {
            AnyConsumer::Sqlite(s) => ordo_reservation::consumer_snapshot(s),
            AnyConsumer::Postgres(s) => ordo_reservation::postgres::pg_consumer_snapshot(s),
        }
    }

    /// [`ConsumerStore::receive_batch`].
    pub fn receive_batch(&mut self, envelopes: &[Envelope]) -> Result<Vec<Receipt>, StoreError> {
        each!(self, s => s.receive_batch(envelopes))
    }

    /// [`ordo_core::drain`] with the reservation handler.
    pub fn drain_reservation(
        &mut self,
        flow_id: &FlowId,
        limit: Option<u64>,
        handler: &mut ReservationHandler,
        batch_len_max: u64,
    ) -> Result<Drain, StoreError> {
        each!(self, s => ordo_core::drain(s, flow_id, limit, handler, batch_len_max))
    }

    /// [`ordo_core::process_all_each`] with the reservation handler.
    pub fn process_reservation_each(
        &mut self,
        limit: Option<u64>,
        handler: &mut ReservationHandler,
        batch_len_max: u64,
        each: impl FnMut(Drain),
    ) -> Result<(), StoreError> {
        each!(self, s => ordo_core::process_all_each(s, limit, handler, batch_len_max, each))
    }

    /// The flow's projection, for a store of the reservation domain
    /// ([`ReservationConsumer::projection`]).
    pub fn projection(&mut self, flow_id: &FlowId) -> Result<Projection, StoreError> {
        each!(self, s => s.projection(flow_id))
    }

    /// [`ConsumerStore::inbox_entries`].
    pub fn inbox_entries(
        &mut self,
        blocked_only: bool,
        flow_id: Option<&FlowId>,
        limit: usize,
    ) -> Result<Vec<InboxEntry>, StoreError> {
        each!(self, s => s.inbox_entries(blocked_only, flow_id, limit))
    }

    /// [`ConsumerStore::reopen_blocked`].
    pub fn reopen_blocked(&mut self, flow_id: &FlowId) -> Result<u64, StoreError> {
        each!(self, s => s.reopen_blocked(flow_id))
    }

    /// [`ConsumerStore::skip`].
    pub fn skip(
        &mut self,
        request: &SkipRequest,
    ) -> Result<Result<RepairRecord, SkipRefused>, StoreError> {
        each!(self, s => s.skip(request))
    }

    /// [`ConsumerStore::repairs`].
    pub fn repairs(&mut self) -> Result<Vec<RepairRecord>, StoreError> {
        each!(self, s => s.repairs())
    }

    /// [`ConsumerStore::consumer_status`].
    pub fn consumer_status(&mut self) -> Result<ConsumerStatus, StoreError> {
        each!(self, s => s.consumer_status())
    }

    /// [`ConsumerStore::prune_inbox`].
    pub fn prune_inbox(&mut self, cutoff_ms: i64) -> Result<Pruned, StoreError> {
        each!(self, s => s.prune_inbox(cutoff_ms))
    }
}

/// A consumer store in this process is a transport, of either backend.
impl Transport for AnyConsumer {
    fn deliver(&mut self, events: &[Envelope]) -> Result<Vec<Receipt>, TransportError> {
        each!(self, s => s.deliver(events))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_two_schemes_are_urls() {
        let cases = [
            ("postgres://u@h/db", true),
            ("postgresql://u@h/db", true),
            ("file:x.db", false),
            ("postgres:/x", false),
            ("Postgres://u@h/db", false),
            ("./postgres://x", false),
            ("x.db", false),
        ];
        for (value, url) in cases {
            let location = Location::from(value);
            assert_eq!(matches!(location, Location::Postgres(_)), url, "{value}");
        }
    }

    #[test]
    fn passwords_are_hidden() {
        let cases = [
            (
                "postgres://me:secret@127.0.0.1:5432/db",
                "postgres://me:***@127.0.0.1:5432/db",
            ),
            ("postgres://me@h/db", "postgres://me@h/db"),
            ("postgres://h/db", "postgres://h/db"),
            (
                "postgresql://me:s:e@c@h:1/db?sslmode=disable&password=x",
                "postgresql://me:***@h:1/db?sslmode=disable&password=***",
            ),
            (
                "postgres://me:secret@h:notaport",
                "postgres://me:***@h:notaport",
            ),
            ("postgres://me:se/c?r@et@h/db", "postgres://me:***@h/db"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact(url), shown, "{url}");
            assert_eq!(Location::from(url).to_string(), shown, "{url}");
        }
    }
}
