//! # ordo-inbox
//!
//! ordo's inbox as a transport sees it: a delivery's bytes and who
//! delivered them in, the receipts (one per envelope, in order, durable
//! before they are returned) or a typed refusal out. The HTTP server is one
//! adapter over it (`ordo-http`); a message-queue consumer is another.
//!
//! * [`batch`]: the body, one envelope or an array of them, each read by
//!   ordo-core's strict codec.
//! * [`pool`]: the store handles deliveries are stored through.
//! * [`Inbox`]: the checks in order (size, parsing, the producers the
//!   caller's key may deliver for, storing) and their [`Refusal`]s.
//!
//! Invariant: the inbox knows no transport and no backend: no status codes,
//! headers or sockets, no SQL. Nothing is stored unless every item parsed
//! and the caller may deliver every one, and a store error is never turned
//! into a receipt.

#![warn(missing_docs)]

pub mod batch;
pub mod pool;
mod receive;

pub use batch::{parse_batch, BatchError};
pub use pool::{IdlePool, Opener, Pool};
pub use receive::{Caller, Inbox, InboxLimits, Refusal, Stored};
