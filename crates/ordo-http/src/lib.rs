//! # ordo-http
//!
//! The HTTP transport of ordo (HTTP.md): the inbox server behind `ordo
//! serve`, the request signing that a relay client uses, and the exposition
//! of the Prometheus metrics of every long-running mode.
//!
//! * [`auth`]: key files, [`sign`], [`signature_headers`], [`KeyRing::verify`].
//! * [`client`]: [`HttpTransport`], the relay's [`ordo_core::Transport`] to an inbox.
//! * [`metrics`]: [`Metrics`], every metric of HTTP.md (the `ordo-metrics`
//!   crate, which knows no transport); [`exposition`]: `GET /metrics` alone ([`metrics_router`],
//!   [`serve_metrics`], [`MetricsServer`]).
//! * [`server`]: the inbox server ([`Server`], [`ServerConfig`]); its
//!   parts: `inbox` (`POST /v1/events`: HTTP's checks over
//!   [`ordo_inbox::Inbox`], which parses and stores), [`listen`] (accept loop, limits,
//!   shutdown), [`linger`] (the lingering close after an early answer),
//!   [`tls`], `reply` (JSON errors).
//! * [`webhook`]: the built-in webhook effect ([`Webhook`], [`AllowedUrls`])
//!   that `ordo effects run` executes (EFFECTS.md).

#![warn(missing_docs)]

pub mod auth;
pub mod client;
pub mod exposition;
mod inbox;
pub mod linger;
pub mod listen;
/// The metrics of every long-running mode (the `ordo-metrics` crate).
pub use ordo_metrics as metrics;
mod reply;
pub mod server;
pub mod tls;
pub mod webhook;

/// The header carrying a store's identity (HTTP.md, third release): the
/// consumer store's on every answer of the inbox server, the delivering
/// producer store's on a relay's `POST /v1/events` (not signed).
pub const HEADER_STORE_ID: &str = "ordo-store-id";

pub use auth::{sign, signature_headers, AuthError, KeyFileError, KeyRing, Secret, Verified};
pub use client::{ClientError, ClientOptions, HttpTransport, Signer};
pub use exposition::{metrics_router, serve_metrics, MetricsServer};
pub use listen::bind;
pub use metrics::Metrics;
pub use ordo_inbox::Opener;
pub use server::{Server, ServerConfig};
pub use webhook::{AllowedUrls, Webhook, WebhookError};
