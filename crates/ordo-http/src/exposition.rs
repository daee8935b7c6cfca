//! `GET /metrics` alone, for the long-running modes that serve no inbox
//! (`relay --follow`, `apply --follow` with `--metrics-listen ADDR`).
//!
//! Invariant: the exposition only encodes [`Metrics`]; the caller keeps
//! the gauges current.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::listen::{self, Limits};
use crate::{metrics, reply, Metrics};

/// The bounds of a metrics listener: scrapers are few.
const LIMITS: Limits = Limits {
    max_connections: 64,
    read_timeout: Duration::from_secs(10),
    shutdown_grace: Duration::from_secs(5),
};

/// `GET /metrics` (404 and 405 as JSON otherwise).
pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = Arc::clone(&metrics);
                async move {
                    (
                        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
                        metrics.encode(),
                    )
                        .into_response()
                }
            }),
        )
        .fallback(reply::not_found)
        .method_not_allowed_fallback(reply::method_not_allowed)
}

/// Serves [`metrics_router`] on `listener` until `shutdown` completes.
pub async fn serve_metrics(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) {
    listen::serve(listener, metrics_router(metrics), None, LIMITS, shutdown).await;
}

/// A metrics listener on its own thread, for callers without a runtime.
/// Dropping it stops it.
pub struct MetricsServer {
    local_addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` (port 0 picks one) and serves `metrics` on it.
    pub fn start(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<MetricsServer> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let listener = runtime.block_on(async { listen::bind(addr) })?;
        let local_addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ordo-metrics".into())
            .spawn(move || {
                runtime.block_on(serve_metrics(listener, metrics, async {
                    let _ = stopped.await;
                }));
            })?;
        Ok(MetricsServer {
            local_addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops serving and waits for the thread.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.halt();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        reply
    }

    #[test]
    fn a_metrics_server_serves_the_exposition_until_stopped() {
        let metrics = Arc::new(Metrics::new());
        metrics.apply_applied_total.inc_by(7);
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), metrics).unwrap();
        let addr = server.local_addr();
        let reply = get(addr, "/metrics");
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(reply.contains("version=0.0.4"), "{reply}");
        assert!(reply.contains("\nordo_apply_applied_total 7\n"), "{reply}");
        let reply = get(addr, "/other");
        assert!(
            reply.starts_with("HTTP/1.1 404") && reply.contains("\"error\""),
            "{reply}"
        );
        server.stop();
        assert!(std::net::TcpStream::connect(addr).is_err());
    }
}
