//! `POST /v1/events`: HTTP.md's checks in their order, then one
//! `receive_batch` (one transaction, durable before the answer).
//!
//! Order: size (413, from `Content-Length`, then while reading), content
//! type (415), authentication (401), parsing (400: the sender's
//! `ordo-store-id` header, then the body; 413 past `max_batch` items), the
//! producers a bound key may deliver for (403), capacity (503). A request
//! that finds every slot in flight taken is answered after the checks that
//! need no body (`Content-Length`, content type, the signing headers,
//! `ordo-store-id`): a server at capacity reads no body, so such a request
//! gets 503 where its body would have failed a later check, and its retry
//! gets the body's answer. An answer given before the
//! body was read to its end is followed by a lingering close
//! ([`crate::linger`]).
//!
//! Invariant: nothing is stored unless every item parsed; the receipts are
//! the store's, one per item in input order, and a store error is never
//! turned into a receipt.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use ordo_core::{Answer, Envelope, EventId, StoreId};
use serde_json::{json, Value};
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use ordo_inbox::{Caller, Refusal, Stored};

use crate::reply;
use crate::server::{blocking, App};

/// The handler of `POST /v1/events`.
pub async fn post_events(State(app): State<Arc<App>>, request: Request) -> Response {
    let span = tracing::info_span!(
        "events",
        items = tracing::field::Empty,
        flow_id = tracing::field::Empty,
        event_id = tracing::field::Empty,
        traceparent = tracing::field::Empty,
    );
    let (parts, body) = request.into_parts();
    receive(app, parts, body).instrument(span).await
}

async fn receive(app: Arc<App>, parts: Parts, body: Body) -> Response {
    if let Some(refused) = check_length(&app, &parts.headers) {
        return refused;
    }
    let Ok(permit) = Arc::clone(&app.in_flight).try_acquire_owned() else {
        return at_capacity(&app, &parts);
    };
    let body = match read_body(&app, body).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    if let Some(refused) = check_content_type(&parts.headers) {
        return refused;
    }
    let mut caller = match authenticate(&app, &parts, Some(&body)) {
        Ok(caller) => caller,
        Err(refused) => return *refused,
    };
    caller.sender_store_id = match sender_store_id(&parts.headers) {
        Ok(sender) => sender,
        Err(refused) => return *refused,
    };
    let envelopes = match app.inbox.parse(&caller, &body) {
        Ok(envelopes) => envelopes,
        Err(refusal) => return refuse(&refusal),
    };
    drop(body);
    store(app, caller, envelopes, permit).await
}

fn check_length(app: &App, headers: &HeaderMap) -> Option<Response> {
    let length: u64 = headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    (length > app.config.max_body_bytes).then(|| too_large(app))
}

fn too_large(app: &App) -> Response {
    reply::error(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the body is larger than {} bytes",
            app.config.max_body_bytes
        ),
    )
}

/// The answer of a request that found no slot: the checks that need no
/// body, then 503.
fn at_capacity(app: &App, parts: &Parts) -> Response {
    if let Some(refused) = check_content_type(&parts.headers) {
        return refused;
    }
    if let Err(refused) = authenticate(app, parts, None) {
        return *refused;
    }
    if let Err(refused) = sender_store_id(&parts.headers) {
        return *refused;
    }
    tracing::warn!(
        max_in_flight = app.config.max_in_flight,
        "refused a request: every slot in flight is taken"
    );
    reply::unavailable(format!(
        "{} requests are in flight; retry later",
        app.config.max_in_flight
    ))
}

async fn read_body(app: &App, body: Body) -> Result<Vec<u8>, Response> {
    let limited = Limited::new(body, app.config.max_body_bytes as usize);
    let collected = tokio::time::timeout(app.config.read_timeout, limited.collect()).await;
    match collected {
        Ok(Ok(collected)) => Ok(collected.to_bytes().to_vec()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large(app)),
        Ok(Err(e)) => Err(reply::error(
            StatusCode::BAD_REQUEST,
            format!("cannot read the body: {e}"),
        )),
        Err(_) => {
            tracing::info!("a body was not read within the read timeout");
            Err(reply::error(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the body was not received within {} ms",
                    app.config.read_timeout.as_millis()
                ),
            ))
        }
    }
}

/// `application/json`, with parameters allowed (`; charset=utf-8`).
fn check_content_type(headers: &HeaderMap) -> Option<Response> {
    let value = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let essence = value.map(|v| v.split(';').next().unwrap_or("").trim());
    if essence.is_some_and(|e| e.eq_ignore_ascii_case("application/json")) {
        return None;
    }
    Some(reply::error(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "the content type must be application/json",
    ))
}

/// Checks the signing headers (with `body`, the signature too): who
/// delivered, with the producer its key is bound to (no one in particular
/// when the server has no keys), or the 401.
fn authenticate(app: &App, parts: &Parts, body: Option<&[u8]>) -> Result<Caller, Box<Response>> {
    let Some(keys) = app.config.keys.as_ref() else {
        return Ok(Caller::default());
    };
    let now_s = app.clock.now_ms().div_euclid(1000);
    let checked = match body {
        Some(body) => keys
            .verify(
                &parts.headers,
                parts.method.as_str(),
                parts.uri.path(),
                body,
                now_s,
            )
            .map(Some),
        None => keys.check_headers(&parts.headers, now_s).map(|()| None),
    };
    match checked {
        Ok(verified) => Ok(verified.map_or_else(Caller::default, |key| Caller {
            key_id: Some(key.key_id),
            producer: key.producer,
            ..Caller::default()
        })),
        Err(error) => {
            tracing::warn!("refused a request: {error}");
            Err(Box::new(reply::error(
                StatusCode::UNAUTHORIZED,
                format!("authentication failed: {error}"),
            )))
        }
    }
}

/// The delivering producer store's identity, from the request's
/// `ordo-store-id` (not signed): `None` when the header is missing, a 400
/// when it is given more than once or is not [`StoreId`]'s 32 lowercase
/// hex digits.
fn sender_store_id(headers: &HeaderMap) -> Result<Option<StoreId>, Box<Response>> {
    let mut given = headers.get_all(crate::HEADER_STORE_ID).iter();
    let Some(value) = given.next() else {
        return Ok(None);
    };
    let refused = |rule: String| {
        tracing::info!("refused a request: {rule}");
        Box::new(reply::error(
            StatusCode::BAD_REQUEST,
            format!("the {} header: {rule}", crate::HEADER_STORE_ID),
        ))
    };
    if given.next().is_some() {
        return Err(refused("given more than once".to_owned()));
    }
    let text = value
        .to_str()
        .map_err(|_| refused("not visible ASCII".to_owned()))?;
    StoreId::new(text)
        .map(Some)
        .map_err(|e| refused(e.to_string()))
}

/// The answer to a delivery the inbox refused.
fn refuse(refusal: &Refusal) -> Response {
    tracing::info!("refused a delivery: {refusal}");
    match refusal {
        Refusal::TooLarge { .. } | Refusal::Malformed { too_many: true, .. } => {
            reply::error(StatusCode::PAYLOAD_TOO_LARGE, refusal.to_string())
        }
        Refusal::Malformed {
            index: Some(index),
            message,
            ..
        } => reply::item_error(StatusCode::BAD_REQUEST, *index, message.clone()),
        Refusal::Malformed { message, .. } => {
            reply::error(StatusCode::BAD_REQUEST, message.clone())
        }
        Refusal::NotAllowed { index, .. } => {
            tracing::warn!("{refusal}");
            reply::item_error(StatusCode::FORBIDDEN, *index, refusal.to_string())
        }
        Refusal::Busy(_) => {
            tracing::warn!("{refusal}");
            reply::unavailable(refusal.to_string())
        }
        Refusal::Storage(error) => {
            tracing::error!(kind = ?error.kind(), "{refusal}");
            reply::error(StatusCode::INTERNAL_SERVER_ERROR, refusal.to_string())
        }
    }
}

async fn store(
    app: Arc<App>,
    caller: Caller,
    envelopes: Vec<Envelope>,
    permit: OwnedSemaphorePermit,
) -> Response {
    record_ids(&envelopes);
    let inbox = Arc::clone(&app.inbox);
    // Each envelope's receive span is a child of this request's.
    let span = tracing::Span::current();
    let stored = blocking(move || {
        let _request = span.enter();
        let stored: Result<Stored, Refusal> = inbox.store(&caller, &envelopes);
        if stored.is_ok() {
            ordo_core::crash::point(ordo_core::crash::SERVE_AFTER_COMMIT);
        }
        drop(permit);
        Ok((envelopes, stored))
    })
    .await;
    match stored {
        Ok((envelopes, Ok(stored))) => receipts_reply(&app, &envelopes, &stored),
        Ok((_, Err(refusal))) => refuse(&refusal),
        Err(error) => refuse(&Refusal::Storage(error)),
    }
}

fn record_ids(envelopes: &[Envelope]) {
    let span = tracing::Span::current();
    span.record("items", envelopes.len());
    if let [only] = envelopes {
        span.record("flow_id", only.flow_id.as_str());
        span.record("event_id", only.event_id.as_str());
        if let Some(traceparent) = only.traceparent() {
            span.record("traceparent", traceparent.as_str());
        }
    }
}

/// The 200 of a stored delivery: one receipt per envelope (a conflict's
/// with its cause and held event), and the consumer store's identity in
/// the `ordo-store-id` header.
fn receipts_reply(app: &App, envelopes: &[Envelope], stored: &Stored) -> Response {
    let listed: Vec<_> = envelopes
        .iter()
        .zip(&stored.answers)
        .map(|(envelope, answer)| {
            (app.metrics).count_received(envelope.producer.as_str(), answer.receipt);
            receipt_value(envelope, answer)
        })
        .collect();
    tracing::debug!(items = listed.len(), "stored");
    let mut response = reply::body(StatusCode::OK, json!({ "receipts": listed }));
    let store_id = HeaderValue::from_str(stored.store_id.as_str())
        .expect("a store identity is hexadecimal digits");
    response
        .headers_mut()
        .insert(crate::HEADER_STORE_ID, store_id);
    response
}

/// One receipt object (HTTP.md): `event_id`, `flow_id`, `seq`,
/// `producer`, `receipt`, and for a conflict `cause` and `held_event_id`.
fn receipt_value(envelope: &Envelope, answer: &Answer) -> Value {
    let mut value = json!({
        "event_id": envelope.event_id.as_str(),
        "flow_id": envelope.flow_id.as_str(),
        "seq": envelope.seq.get(),
        "producer": envelope.producer.as_str(),
        "receipt": answer.receipt.as_str(),
    });
    if let Some(cause) = answer.receipt.cause() {
        value["cause"] = json!(cause);
        value["held_event_id"] = json!(answer.held_event_id.as_ref().map(EventId::as_str));
    }
    value
}
