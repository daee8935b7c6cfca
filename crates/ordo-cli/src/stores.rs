//! The stores of either backend as the commands see them: `ordo`'s
//! [`Location`] and role types, with what the reservation domain adds to
//! them (its snapshot, its `advance`, its handler's drains). A leaf: it
//! imports no command.

use ordo_core::ops::OutboxEntry;
use ordo_core::{Drain, StoreError};
use ordo_reservation::{
    Advance, AdvanceError, AdvanceRequest, FlowRecord, Projection, ReservationConsumer,
    ReservationHandler, ReservationProducer,
};

pub use ordo::{Consumer as AnyConsumer, Location, Producer as AnyProducer};

/// The inbox, projections and effects of a consumer snapshot.
pub use ordo_reservation::ConsumerRows;

/// Calls the same expression on whichever store `self` (a producer or a
/// consumer of `ordo`) holds.
macro_rules! each {
    ($self:expr, $store:ident => $call:expr) => {
        match $self {
            Self::Sqlite($store) => $call,
            Self::Postgres($store) => $call,
        }
    };
}

/// What the reservation domain adds to a producer store of either backend.
pub trait ReservationSide {
    /// The flows (none for another domain than the reservation) and the
    /// outbox with each row's custody by destination, read in one read
    /// transaction.
    fn snapshot(&mut self) -> Result<(Vec<FlowRecord>, Vec<OutboxEntry>), StoreError>;
    /// [`ReservationProducer::advance`].
    fn advance(&mut self, request: &AdvanceRequest) -> Result<Advance, AdvanceError>;
}

impl ReservationSide for AnyProducer {
    fn snapshot(&mut self) -> Result<(Vec<FlowRecord>, Vec<OutboxEntry>), StoreError> {
        match self {
            AnyProducer::Sqlite(s) => ordo_reservation::producer_snapshot_entries(s),
            AnyProducer::Postgres(s) => ordo_reservation::postgres::pg_producer_snapshot_entries(s),
        }
    }

    fn advance(&mut self, request: &AdvanceRequest) -> Result<Advance, AdvanceError> {
        each!(self, s => s.advance(request))
    }
}

/// What the reservation domain adds to a consumer store of either backend.
pub trait ReservationInbox {
    /// The inbox, and the projections and effects (none for another domain
    /// than the reservation), read in one read transaction.
    fn snapshot(&mut self) -> Result<ConsumerRows, StoreError>;
    /// [`ordo_core::drain`] with the reservation handler.
    fn drain_reservation(
        &mut self,
        flow: &ordo_core::InboxFlow,
        limit: Option<u64>,
        handler: &mut ReservationHandler,
        batch_len_max: u64,
    ) -> Result<Drain, StoreError>;
    /// [`ordo_core::process_all_each`] with the reservation handler.
    fn process_reservation_each(
        &mut self,
        limit: Option<u64>,
        handler: &mut ReservationHandler,
        batch_len_max: u64,
        each: impl FnMut(Drain),
    ) -> Result<(), StoreError>;
    /// The flow's projection ([`ReservationConsumer::projection`]).
    fn projection(&mut self, flow: &ordo_core::InboxFlow) -> Result<Projection, StoreError>;
}

impl ReservationInbox for AnyConsumer {
    fn snapshot(&mut self) -> Result<ConsumerRows, StoreError> {
        match self {
            AnyConsumer::Sqlite(s) => ordo_reservation::consumer_snapshot(s),
            AnyConsumer::Postgres(s) => ordo_reservation::postgres::pg_consumer_snapshot(s),
        }
    }

    fn drain_reservation(
        &mut self,
        flow: &ordo_core::InboxFlow,
        limit: Option<u64>,
        handler: &mut ReservationHandler,
        batch_len_max: u64,
    ) -> Result<Drain, StoreError> {
        each!(self, s => ordo_core::drain(s, flow, limit, handler, batch_len_max))
    }

    fn process_reservation_each(
        &mut self,
        limit: Option<u64>,
        handler: &mut ReservationHandler,
        batch_len_max: u64,
        each: impl FnMut(Drain),
    ) -> Result<(), StoreError> {
        each!(self, s => ordo_core::process_all_each(s, limit, handler, batch_len_max, each))
    }

    fn projection(&mut self, flow: &ordo_core::InboxFlow) -> Result<Projection, StoreError> {
        each!(self, s => s.projection(flow))
    }
}
