//! The JSON bodies of HTTP.md's error answers.
//!
//! Invariant: a reply is built from a status and a message only; what the
//! message says was decided by the caller.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

/// The `Retry-After` of a 503, in seconds (HTTP.md: an integer >= 1).
pub const RETRY_AFTER_S: u64 = 1;

/// `{"error": message}` with `status`.
pub fn error(status: StatusCode, message: impl Into<String>) -> Response {
    body(status, json!({ "error": message.into() }))
}

/// `{"error": message, "index": index}` with `status`: a 400 or a 403 for
/// one item of an array.
pub fn item_error(status: StatusCode, index: usize, message: impl Into<String>) -> Response {
    body(status, json!({ "error": message.into(), "index": index }))
}

/// A 503 with `Retry-After`: busy, at capacity, or shutting down.
pub fn unavailable(message: impl Into<String>) -> Response {
    let mut response = error(StatusCode::SERVICE_UNAVAILABLE, message);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
    response
}

/// A JSON body with `status`.
pub fn body(status: StatusCode, value: Value) -> Response {
    (status, Json(value)).into_response()
}

/// 404 for a route that does not exist.
pub async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such route")
}

/// 405 for a known route asked with another method.
pub async fn method_not_allowed() -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
    )
}
