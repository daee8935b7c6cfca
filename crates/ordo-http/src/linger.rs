//! Early answers and the lingering close (HTTP.md, "Early answers").
//!
//! A request answered before its body was read to the end (a 413 from
//! `Content-Length` or found while reading, a 401, 404, 405, 503, a read
//! timeout) is answered with `Connection: close`, and what is left of its
//! body is read and discarded, at most [`LINGER_BYTES_MAX`] bytes or for
//! [`LINGER_MS_MAX`] ms, whichever comes first, before the connection
//! closes. So a client that writes its whole body before reading (no
//! `Expect: 100-continue`) reads the answer instead of a reset connection.
//!
//! A client that waits for `100 Continue` and was sent none sends no body:
//! its request is answered and closed at once, and it is never sent a
//! `100 Continue` after its answer.
//!
//! Invariant: the discarded bytes are dropped as they arrive, never
//! buffered; a body read to its end changes nothing (the connection may be
//! kept alive as usual).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::http::{header, HeaderValue, Request, Version};
use axum::response::Response;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::Service;
use hyper_util::service::TowerToHyperService;

/// The most bytes of an unread body discarded after an early answer.
pub const LINGER_BYTES_MAX: u64 = 32 * 1024 * 1024;
/// The longest time spent discarding an unread body after an early answer.
pub const LINGER_MS_MAX: u64 = 5_000;
/// The longest a lingering connection may stay silent: a client that sends
/// nothing for this long is not writing a body (a slow client answered 408
/// is not waited for again).
pub const LINGER_IDLE_MS_MAX: u64 = 1_000;

/// Hands `request` to `router` with its body wrapped in [`Lingering`]; an
/// answer given before the body's end carries `Connection: close`.
pub(crate) fn answer(
    router: &TowerToHyperService<Router>,
    request: Request<Incoming>,
) -> impl Future<Output = Result<Response, Infallible>> + Send {
    let (parts, body) = request.into_parts();
    let waits_for_continue = parts.version == Version::HTTP_11
        && parts
            .headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let ended = Arc::new(AtomicBool::new(body.is_end_stream()));
    let body = Lingering {
        inner: Some(body),
        ended: Arc::clone(&ended),
        waits_for_continue,
        polled: false,
    };
    let answered = router.call(Request::from_parts(parts, body));
    async move {
        let mut response = answered.await?;
        if !ended.load(Ordering::Acquire) {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        Ok(response)
    }
}

/// A request body that, dropped before its end, leaves what is left of it
/// to a task that discards it within the bounds of this module.
pub(crate) struct Lingering {
    inner: Option<Incoming>,
    /// Set once the body was read to its end.
    ended: Arc<AtomicBool>,
    /// The client waits for `100 Continue` before it sends the body.
    waits_for_continue: bool,
    /// The body was asked for a frame (hyper then sent any `100 Continue`).
    polled: bool,
}

impl Body for Lingering {
    type Data = <Incoming as Body>::Data;
    type Error = <Incoming as Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        this.polled = true;
        let frame = ready!(Pin::new(&mut *inner).poll_frame(cx));
        if frame.is_none() || inner.is_end_stream() {
            this.ended.store(true, Ordering::Release);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        let Some(body) = self.inner.take() else {
            return;
        };
        if self.ended.load(Ordering::Acquire) || body.is_end_stream() {
            return;
        }
        if self.waits_for_continue && !self.polled {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(discard(body));
        }
    }
}

/// Reads and drops `body` until its end, an error, [`LINGER_MS_MAX`] ms,
/// [`LINGER_IDLE_MS_MAX`] ms without a byte, or once [`LINGER_BYTES_MAX`]
/// bytes are discarded (the last piece read may pass that bound by the
/// size of one read); then drops it, which closes the connection.
async fn discard(mut body: Incoming) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(LINGER_MS_MAX);
    let mut discarded_bytes: u64 = 0;
    let outcome = loop {
        if discarded_bytes >= LINGER_BYTES_MAX {
            break "the bound of bytes was reached";
        }
        let idle = tokio::time::Instant::now() + Duration::from_millis(LINGER_IDLE_MS_MAX);
        match tokio::time::timeout_at(deadline.min(idle), body.frame()).await {
            Ok(Some(Ok(frame))) => {
                let piece = frame.data_ref().map_or(0, |data| data.len());
                discarded_bytes += piece as u64;
            }
            Ok(None) => break "the body ended",
            Ok(Some(Err(_))) => break "the body failed",
            Err(_) => break "the bound of time, or of silence, was reached",
        }
    };
    tracing::debug!(discarded_bytes, "discarded an unread body: {outcome}");
}
