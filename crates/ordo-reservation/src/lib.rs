//! # ordo-reservation
//!
//! The reference domain of the protocol (`docs/PROTOCOL.md` section 2), built on
//! ordo's public API only, the way any application builds its own: a flow
//! `new -> reserved -> confirmed -> released` carrying one fixed quantity,
//! its producer table (`flow`) and `advance`, and its consumer tables
//! (`projection`, `effect`) written by [`ReservationHandler`].
//!
//! The command line, the experiment, the demo and the benchmarks use it
//! from here; nothing in `ordo-core` or `ordo-sqlite` knows it.

#![warn(missing_docs)]

mod methods;
#[cfg(feature = "postgres")]
pub mod postgres;
mod rows;
pub mod rules;
mod schema;
mod sqlite;

pub use rules::{
    AdvanceRefused, AdvanceRequest, ApplyOptions, FlowRecord, FlowState, InvalidRequest,
    Projection, Quantity, INVALID_PAYLOAD, INVALID_TRANSITION, QUANTITY_MAX, UNSUPPORTED_SCHEMA,
};
pub use schema::{consumer_schema, producer_schema};
pub use sqlite::{
    advance_in, consumer_snapshot, open_consumer, open_producer, producer_snapshot,
    producer_snapshot_entries, Advance, AdvanceError, ConsumerRows, EffectRecord,
    ReservationConsumer, ReservationHandler, ReservationProducer, DOMAIN, WEBHOOK_EFFECT,
};
