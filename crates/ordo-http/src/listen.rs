//! The accept loop: bounded connections, HTTP/1.1 (over TLS when given),
//! a read timeout on every request head, body and TLS handshake, and a
//! graceful shutdown. An answer given before its request's body was read
//! to the end is followed by a lingering close ([`crate::linger`]).
//!
//! On shutdown the loop stops accepting and asks every open connection to
//! close once its request in flight is answered (idle ones close at once),
//! then waits for them, at most `shutdown_grace`.
//!
//! Invariant: this layer knows no route and no store: it hands each
//! request to the router it is given.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::linger;

/// The bounds of a listener.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most connections open at once; more are closed at accept.
    pub max_connections: usize,
    /// The longest wait for a TLS handshake or a request head (an idle
    /// connection is closed after it too).
    pub read_timeout: Duration,
    /// The longest wait for open connections at shutdown.
    pub shutdown_grace: Duration,
}

/// The listen backlog: connections the kernel completes before they are
/// accepted (capped by the system's `somaxconn`). A short queue makes a
/// burst of clients wait for a SYN retransmission, a second each.
pub const BACKLOG: u32 = 1024;

/// Binds `addr` with [`BACKLOG`] (port 0 picks a free port).
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// The pause after an accept failed for lack of resources (file
/// descriptors, memory), so that the loop does not spin.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// Serves `router` on `listener` until `shutdown` completes, then closes
/// gracefully.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Option<TlsAcceptor>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::warn!(%peer, max_connections = limits.max_connections, "closed a connection: too many open");
            continue;
        };
        let connection = Connection {
            router: router.clone(),
            tls: tls.clone(),
            read_timeout: limits.read_timeout,
            watcher: graceful.watcher(),
            _slot: slot,
        };
        tokio::spawn(connection.run(stream, peer));
    }
    drop(listener);
    tracing::info!(
        open = graceful.count(),
        "stopped accepting; closing connections"
    );
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.shutdown_grace) => {
            tracing::warn!("connections still open after {} ms; leaving them", limits.shutdown_grace.as_millis());
        }
    }
}

async fn accept_failed(error: &std::io::Error) {
    use std::io::ErrorKind;
    // A peer that gave up before the accept is no failure of the listener.
    if matches!(
        error.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::Interrupted
    ) {
        return;
    }
    tracing::warn!("accept failed: {error}");
    tokio::time::sleep(ACCEPT_PAUSE).await;
}

/// One accepted connection and what it needs.
struct Connection {
    router: Router,
    tls: Option<TlsAcceptor>,
    read_timeout: Duration,
    watcher: Watcher,
    _slot: OwnedSemaphorePermit,
}

impl Connection {
    async fn run(self, stream: TcpStream, peer: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let Some(acceptor) = self.tls.clone() else {
            return self.http(stream, peer).await;
        };
        match tokio::time::timeout(self.read_timeout, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => self.http(stream, peer).await,
            Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
            Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
        }
    }

    async fn http<S>(self, stream: S, peer: SocketAddr)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let router = TowerToHyperService::new(self.router);
        let service = service_fn(move |request| linger::answer(&router, request));
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.read_timeout);
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        if let Err(e) = self.watcher.watch(connection).await {
            tracing::debug!(%peer, "connection ended: {e}");
        }
    }
}
