//! The inbox server of HTTP.md: its configuration, routes, and the
//! per-request bookkeeping (metrics, shutdown answers).
//!
//! Routes: `POST /v1/events` (the `inbox` module), `GET /v1/health`, `GET
//! /v1/ready`, `GET /metrics`; anything else 404, a wrong method 405, both
//! with a JSON body. Every answer, of every route and status (a 503 while
//! draining too), names the consumer store in `ordo-store-id`, so that a
//! relay can tell a consumer of this release from an earlier one.
//!
//! Invariant: the server never opens a store by itself; handles come from
//! the caller's [`Opener`], which decides the file, the clock and the busy
//! timeout (and that a missing store is never created).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use ordo_core::{Clock, ErrorKind, StoreError, StoreId, TraceParent};
use ordo_inbox::{Inbox, InboxLimits, Opener, Pool};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tracing::Instrument;

use crate::listen::{self, Limits};
use crate::{inbox, metrics, reply, KeyRing, Metrics};

/// Default of `--max-batch`: envelopes in one request.
pub const MAX_BATCH_DEFAULT: usize = 256;
/// Default of `--max-body-bytes`: 8 MiB.
pub const MAX_BODY_BYTES_DEFAULT: u64 = 8 * 1024 * 1024;
/// Default of `--max-in-flight`: requests reading a body or storing at once.
pub const MAX_IN_FLIGHT_DEFAULT: usize = 64;
/// Default of `--max-connections`: connections open at once.
pub const MAX_CONNECTIONS_DEFAULT: usize = 2048;
/// Default of `--read-timeout-ms`: for a request's head, its body, a TLS
/// handshake, and an idle connection.
pub const READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// How long a shutdown waits for open connections.
pub const SHUTDOWN_GRACE_DEFAULT: Duration = Duration::from_secs(30);
/// Status reads (`/v1/ready`, `/metrics`) running at once.
const STATUS_READS_MAX: usize = 2;
/// Idle store handles kept between requests.
const IDLE_STORES_MAX: usize = 8;

/// How a server behaves; every bound has a default.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The keys every `POST` must be signed with; `None` accepts unsigned
    /// requests (the caller decides where that is allowed).
    pub keys: Option<KeyRing>,
    /// The most envelopes of one request.
    pub max_batch: usize,
    /// The largest body, in bytes.
    pub max_body_bytes: u64,
    /// The most requests past their head at once; more answer 503.
    pub max_in_flight: usize,
    /// The most open connections; more are closed at accept.
    pub max_connections: usize,
    /// The read timeout (request head, body, TLS handshake, idle connection).
    pub read_timeout: Duration,
    /// The longest wait for open connections at shutdown.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            keys: None,
            max_batch: MAX_BATCH_DEFAULT,
            max_body_bytes: MAX_BODY_BYTES_DEFAULT,
            max_in_flight: MAX_IN_FLIGHT_DEFAULT,
            max_connections: MAX_CONNECTIONS_DEFAULT,
            read_timeout: READ_TIMEOUT_DEFAULT,
            shutdown_grace: SHUTDOWN_GRACE_DEFAULT,
        }
    }
}

/// What every request of one server shares.
pub(crate) struct App {
    pub(crate) config: ServerConfig,
    pub(crate) inbox: Arc<Inbox>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) in_flight: Arc<Semaphore>,
    /// The consumer store's identity, as every answer's `ordo-store-id`.
    store_id: HeaderValue,
    status_reads: Semaphore,
    draining: AtomicBool,
}

/// Runs `f` (a call on the store) on a blocking thread, never on the
/// executor.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::new(ErrorKind::Other, format!("the store task failed: {e}")))?
}

/// The inbox server.
pub struct Server {
    app: Arc<App>,
}

impl Server {
    /// A server storing through `open`'s handles into the consumer store
    /// whose identity is `store_id` (named on every answer), counting in
    /// `metrics`, checking signatures' times against `clock`.
    pub fn new(
        config: ServerConfig,
        open: Opener,
        store_id: &StoreId,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Server {
        let in_flight = Arc::new(Semaphore::new(config.max_in_flight));
        let store_id = HeaderValue::from_str(store_id.as_str())
            .expect("a store identity is hexadecimal digits");
        Server {
            app: Arc::new(App {
                inbox: Arc::new(Inbox::new(
                    Pool::new(open, IDLE_STORES_MAX),
                    InboxLimits {
                        max_batch: config.max_batch,
                        max_body_bytes: config.max_body_bytes,
                    },
                )),
                config,
                metrics,
                clock,
                in_flight,
                store_id,
                status_reads: Semaphore::new(STATUS_READS_MAX),
                draining: AtomicBool::new(false),
            }),
        }
    }

    /// The routes, for serving on a listener of the caller's.
    pub fn router(&self) -> Router {
        let app = Arc::clone(&self.app);
        Router::new()
            .route("/v1/events", post(inbox::post_events))
            .route("/v1/health", get(health))
            .route("/v1/ready", get(ready))
            .route("/metrics", get(exposition))
            .fallback(reply::not_found)
            .method_not_allowed_fallback(reply::method_not_allowed)
            .layer(middleware::from_fn_with_state(Arc::clone(&app), observe))
            .layer(middleware::map_response_with_state(
                Arc::clone(&app),
                name_store,
            ))
            .with_state(app)
    }

    /// Serves on `listener` (HTTPS with `tls`) until `shutdown` completes:
    /// then new requests answer 503, accepting stops, requests in flight
    /// finish, and this returns.
    pub async fn serve(
        self,
        listener: TcpListener,
        tls: Option<TlsAcceptor>,
        shutdown: impl Future<Output = ()>,
    ) {
        let limits = Limits {
            max_connections: self.app.config.max_connections,
            read_timeout: self.app.config.read_timeout,
            shutdown_grace: self.app.config.shutdown_grace,
        };
        let app = Arc::clone(&self.app);
        let draining = async move {
            shutdown.await;
            app.draining.store(true, Ordering::Release);
        };
        listen::serve(listener, self.router(), tls, limits, draining).await;
    }
}

/// The request's well-formed `traceparent` header, if any.
fn request_traceparent(headers: &axum::http::HeaderMap) -> Option<TraceParent> {
    let value = headers.get(ordo_core::trace::TRACEPARENT)?.to_str().ok()?;
    TraceParent::parse(value).ok()
}

/// Counts every answer by status and time; answers 503 once draining.
async fn observe(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let span = tracing::info_span!(
        "request",
        method = %request.method(),
        path = %request.uri().path(),
        traceparent = tracing::field::Empty,
    );
    ordo_core::trace::follow(&span, request_traceparent(request.headers()).as_ref());
    let response = if app.draining.load(Ordering::Acquire) {
        reply::unavailable("the server is shutting down")
    } else {
        next.run(request).instrument(span.clone()).await
    };
    let status = response.status();
    span.in_scope(|| tracing::debug!(status = status.as_u16(), "answered"));
    app.metrics
        .http_requests_total
        .with_label_values(&[status.as_str()])
        .inc();
    app.metrics
        .http_request_seconds
        .observe(started.elapsed().as_secs_f64());
    response
}

/// Names the consumer store in `ordo-store-id` on every answer, the
/// outermost layer (a 503 while draining too). A stored delivery's 200
/// already names the store that holds it, which it keeps.
async fn name_store(State(app): State<Arc<App>>, mut response: Response) -> Response {
    response
        .headers_mut()
        .entry(crate::HEADER_STORE_ID)
        .or_insert_with(|| app.store_id.clone());
    response
}

async fn health() -> Response {
    reply::body(StatusCode::OK, json!({ "status": "ok" }))
}

/// Reads the inbox's status (and sets the inbox gauges from it).
async fn refresh(app: &Arc<App>) -> Result<(), String> {
    let _permit = app
        .status_reads
        .try_acquire()
        .map_err(|_| "too many status reads in flight".to_string())?;
    let inbox = Arc::clone(&app.inbox);
    let status = blocking(move || inbox.status())
        .await
        .map_err(|e| format!("the store does not answer: {e}"))?;
    app.metrics.set_inbox(&status);
    Ok(())
}

async fn ready(State(app): State<Arc<App>>) -> Response {
    match refresh(&app).await {
        Ok(()) => reply::body(StatusCode::OK, json!({ "status": "ready" })),
        Err(e) => {
            tracing::warn!("not ready: {e}");
            reply::unavailable(e)
        }
    }
}

async fn exposition(State(app): State<Arc<App>>) -> Response {
    if let Err(e) = refresh(&app).await {
        tracing::warn!("inbox gauges not refreshed: {e}");
    }
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        app.metrics.encode(),
    )
        .into_response()
}
