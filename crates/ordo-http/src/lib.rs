//! # ordo-http
//!
//! The HTTP transport of ordo (HTTP.md): the inbox server behind `ordo
//! serve`, the request signing that a relay client uses, and the Prometheus
//! metrics of every long-running mode.
//!
//! * [`auth`]: key files, [`sign`], [`signature_headers`], [`KeyRing::verify`].
//! * [`metrics`]: [`Metrics`], every metric of HTTP.md, and its exposition.

#![warn(missing_docs)]

pub mod auth;
pub mod metrics;

pub use auth::{sign, signature_headers, AuthError, KeyFileError, KeyRing, Secret};
pub use metrics::Metrics;
