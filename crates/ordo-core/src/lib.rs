//! # ordo-core
//!
//! The ordered outbox / inbox protocol without I/O and without a domain:
//! validated identifiers, the envelope codec with its canonical body and
//! hash, pure decision functions, outcome types, the [`ApplyHandler`] an
//! application implements, the drivers that run it ([`drain`],
//! [`process_all`]), the relay, and the store traits every backend
//! implements.
//!
//! Backends (such as `ordo-sqlite`) run these decisions inside their own
//! transactions. What an event means is decided by the application's
//! handler; the reservation flow of the protocol's reference domain is one
//! such handler, in its own crate. The one process-level effect here is
//! [`crash::point`], which exits the process at an armed crash point; the
//! relay reports what it skips or quarantines through `tracing`.

#![warn(missing_docs)]

pub mod append;
pub mod apply;
pub mod backoff;
pub mod clock;
pub mod crash;
pub mod destination;
pub mod domain;
pub mod effect;
pub mod envelope;
pub mod error;
mod forward;
pub mod handler;
pub mod identity;
pub mod ids;
pub mod open;
pub mod ops;
pub mod outcome;
mod receive;
pub mod relay;
pub mod report;
pub mod run;
pub mod store;
pub mod trace;
pub mod transport;
pub mod wake;

pub use backoff::Backoff;
pub use clock::{Clock, FixedClock, SystemClock};
pub use envelope::{BodyHash, Envelope, EventType, MalformedEnvelope};
pub use error::{AppendError, ErrorKind, RelayError, StoreError};
pub use handler::{apply_in_order, ApplyContext, ApplyHandler, Verdict, DEFAULT_PRODUCER};
pub use identity::StoreId;
pub use ids::{
    BlockCode, DestinationName, DomainName, EventId, FlowId, InboxFlow, ProducerName,
    RuleViolation, SchemaVersion, Seq,
};
pub use outcome::{
    Answer, BlockReason, Drain, DrainStop, InboxRecord, InboxStatus, OutboxRecord, Receipt, Step,
    CONFLICT_REASON, PRODUCER_REWOUND_REASON,
};
pub use relay::{
    relay, relay_each, relay_event, Delivery, Handover, Refusal, RefusalReason, RelayOptions,
    RelayPolicy, RelayReport, RelayStop, RoundFailure,
};
pub use run::{RunConsumer, RunStore};
pub use store::{
    drain, process_all, process_all_each, process_page, ConsumerHandle, ConsumerOps, ConsumerStore,
    OutboxTx, ProducerOps, ProducerStore, Receive, Role, APPLY_BATCH_LEN_DEFAULT,
};
pub use trace::TraceParent;
pub use transport::{TransientKind, Transport, TransportError};
pub use wake::Signal;
