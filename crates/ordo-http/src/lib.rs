//! # ordo-http
//!
//! The HTTP transport of ordo (HTTP.md): the inbox server behind `ordo
//! serve`, the request signing that a relay client uses, and the Prometheus
//! metrics of every long-running mode.
//!
//! * [`metrics`]: [`Metrics`], every metric of HTTP.md, and its exposition.

#![warn(missing_docs)]

pub mod metrics;

pub use metrics::Metrics;
