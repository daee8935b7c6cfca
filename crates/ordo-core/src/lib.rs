//! # ordo-core
//!
//! The ordered outbox / inbox protocol without I/O: validated identifiers,
//! the envelope codec with its canonical body and hash, the reservation
//! flow's transition rules and schema decoding, pure decision functions,
//! outcome types, and the store traits every backend implements.
//!
//! Backends (such as `ordo-sqlite`) run these decisions inside their own
//! transactions. The one process-level effect here is [`crash::point`], which
//! exits the process at an armed crash point.

#![warn(missing_docs)]

pub mod clock;
pub mod crash;
pub mod envelope;
pub mod error;
pub mod ids;
pub mod ops;
pub mod outcome;
pub mod relay;
pub mod reservation;
pub mod store;

pub use clock::{Clock, FixedClock, SystemClock};
pub use envelope::{BodyHash, Envelope, EventType, MalformedEnvelope};
pub use error::{AdvanceError, ErrorKind, RelayError, StoreError};
pub use ids::{EventId, FlowId, Quantity, RuleViolation, SchemaVersion, Seq};
pub use outcome::{
    Advance, BlockReason, Drain, DrainStop, EffectRecord, InboxRecord, InboxStatus, OutboxRecord,
    Receipt, Step,
};
pub use relay::{
    relay, relay_event, Backoff, Delivery, RelayOptions, RelayPolicy, RelayReport, RelayStop,
};
pub use reservation::{
    AdvanceRefused, AdvanceRequest, ApplyOptions, FlowRecord, FlowState, InvalidRequest, Projection,
};
pub use store::{
    drain, process_all, process_all_each, ConsumerStore, ProducerStore, APPLY_BATCH_LEN_DEFAULT,
};
