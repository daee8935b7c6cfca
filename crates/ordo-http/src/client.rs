//! The relay's side of HTTP.md: a [`Transport`] that POSTs each round to
//! an `ordo serve` inbox and reads the receipts back, answering every
//! status as "The relay as a client" says.
//!
//! Every POST names the producer store it delivers from in
//! `ordo-store-id` (when the transport was told it), and every answer read
//! tells whether the consumer is of the third release (its answers name
//! its store in `ordo-store-id`) or of an earlier one. An earlier one
//! cannot read an envelope that names a producer or carries headers
//! (PROTOCOL.md section 12), so before a round holding one, when the last
//! answer read did not name the consumer store, the client asks `GET
//! /v1/health`: an answer that names none is a version skew
//! ([`TransportError::Skew`]), and the round is not sent. Rounds without
//! such envelopes go to any release as before.
//!
//! Invariant: the client decides no custody. It turns a response into
//! receipts or into a [`TransportError`] (transient, too large, one event
//! rejected, refused, a version skew); the relay records what they mean.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ordo_core::{
    Envelope, ProducerName, Receipt, StoreId, TraceParent, TransientKind, Transport, TransportError,
};
use reqwest::blocking::{Client, Response};
use reqwest::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use serde_json::Value;

use crate::auth::{signature_headers, KeyRing};
use crate::HEADER_STORE_ID;

/// The inbox route, relative to the base URL.
pub const EVENTS_PATH: &str = "v1/events";
/// The health route, relative to the base URL: what the client asks when
/// it must know the consumer's release.
pub const HEALTH_PATH: &str = "v1/health";
/// The longest error body read from a refusing server, in bytes.
const ERROR_BODY_BYTES_MAX: usize = 4096;
/// The longest wait a `Retry-After` may ask for, in seconds.
const RETRY_AFTER_S_MAX: u64 = 3600;

/// How the client connects.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// How long one request may take, connection included.
    pub timeout: Duration,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// A certificate authority (PEM) trusted beyond the system's web roots.
    pub ca_pem: Option<Vec<u8>>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            ca_pem: None,
        }
    }
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL is not an `http://` or `https://` URL with a host.
    #[error("--to {url}: {rule}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        rule: String,
    },
    /// The key id is not in the key file.
    #[error("--key-id {0}: no such key id in the key file")]
    UnknownKeyId(String),
    /// The certificate authority file or the TLS setup failed.
    #[error("TLS setup: {0}")]
    Tls(String),
}

/// The signing key of a client: a key id and the ring holding its secrets.
pub struct Signer {
    key_id: String,
    ring: KeyRing,
}

impl Signer {
    /// Signs with every secret `ring` lists for `key_id`.
    pub fn new(key_id: &str, ring: KeyRing) -> Result<Signer, ClientError> {
        if ring.secrets(key_id).is_none() {
            return Err(ClientError::UnknownKeyId(key_id.to_owned()));
        }
        Ok(Signer {
            key_id: key_id.to_owned(),
            ring,
        })
    }

    /// The key id signed with.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The producer the key is bound to in its key file (`producer=NAME`);
    /// `None` when it is bound to none.
    pub fn producer(&self) -> Option<&ProducerName> {
        self.ring.producer(&self.key_id)
    }
}

/// A [`Transport`] to an HTTP inbox, reusing its connections.
pub struct HttpTransport {
    client: Client,
    base_url: Url,
    events_url: Url,
    health_url: Url,
    signer: Option<Signer>,
    /// The consumer store as the last answer read named it: `None` before
    /// the first answer, and after one that named none.
    consumer_store_id: Option<StoreId>,
    /// Whether [`Transport::identify`] asked the consumer's health already.
    health_asked: bool,
}

impl HttpTransport {
    /// A client of the inbox at `base` (`http://HOST:PORT[/PREFIX]`).
    pub fn new(
        base: &str,
        signer: Option<Signer>,
        options: &ClientOptions,
    ) -> Result<HttpTransport, ClientError> {
        let base_url = base_url(base)?;
        let route = |path: &str| {
            base_url.join(path).map_err(|e| ClientError::Url {
                url: base.to_owned(),
                rule: e.to_string(),
            })
        };
        let (events_url, health_url) = (route(EVENTS_PATH)?, route(HEALTH_PATH)?);
        let mut builder = Client::builder()
            .timeout(options.timeout)
            .connect_timeout(options.connect_timeout)
            .pool_idle_timeout(Duration::from_secs(60))
            .redirect(reqwest::redirect::Policy::none())
            .use_rustls_tls();
        if let Some(pem) = &options.ca_pem {
            let ca =
                reqwest::Certificate::from_pem(pem).map_err(|e| ClientError::Tls(e.to_string()))?;
            builder = builder.add_root_certificate(ca);
        }
        let client = builder
            .build()
            .map_err(|e| ClientError::Tls(e.to_string()))?;
        Ok(HttpTransport {
            client,
            base_url,
            events_url,
            health_url,
            signer,
            consumer_store_id: None,
            health_asked: false,
        })
    }

    /// The consumer store's identity as the last answer read named it;
    /// `None` before the first answer, or when the last one named none
    /// (a consumer of an earlier release, or an answer that did not come
    /// from `ordo serve`).
    pub fn consumer_store_id(&self) -> Option<&StoreId> {
        self.consumer_store_id.as_ref()
    }

    /// Reads a certificate authority file for [`ClientOptions::ca_pem`].
    pub fn read_ca(path: &Path) -> Result<Vec<u8>, ClientError> {
        std::fs::read(path).map_err(|e| ClientError::Tls(format!("{}: {e}", path.display())))
    }

    /// The key rounds are signed with; `None` when they are not signed.
    pub fn signer(&self) -> Option<&Signer> {
        self.signer.as_ref()
    }

    /// The URL rounds are posted to.
    pub fn events_url(&self) -> &Url {
        &self.events_url
    }

    /// Posts `body`, naming `sender`, the producer store the round is
    /// from, as `ordo-store-id` (not signed; without it the consumer
    /// records the sender as unknown), and the round's trace context as
    /// `traceparent` when it has one (not signed either).
    fn post(
        &self,
        sender: Option<&StoreId>,
        traceparent: Option<&TraceParent>,
        body: Vec<u8>,
    ) -> Result<Response, reqwest::Error> {
        let mut request = self
            .client
            .post(self.events_url.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(store_id) = sender {
            request = request.header(HEADER_STORE_ID, store_id.as_str());
        }
        if let Some(traceparent) = traceparent {
            request = request.header(ordo_core::trace::TRACEPARENT, traceparent.as_str());
        }
        if let Some(signer) = &self.signer {
            let headers = signature_headers(
                &signer.ring,
                &signer.key_id,
                unix_now_s(),
                "POST",
                self.events_url.path(),
                &body,
            )
            .expect("the signer's key id is in its ring");
            for (name, value) in headers {
                request = request.header(name, value);
            }
        }
        request.body(body).send()
    }

    /// Notes which consumer store `response` names, if any.
    fn note_consumer(&mut self, response: &Response) {
        self.consumer_store_id = response
            .headers()
            .get(HEADER_STORE_ID)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| StoreId::new(v).ok());
    }

    /// Asks `GET /v1/health` whether the consumer is of this release: an
    /// answer naming its store is; a 200 naming none is an earlier
    /// release's, a version skew; another status means what it means to a
    /// POST (a 503 is transient, a 404 a wrong `--to`).
    fn probe(&mut self) -> Result<(), TransportError> {
        let response = self
            .client
            .get(self.health_url.clone())
            .send()
            .map_err(|e| request_failure("GET /v1/health", e))?;
        self.note_consumer(&response);
        if self.consumer_store_id.is_some() {
            return Ok(());
        }
        let status = response.status();
        if status != StatusCode::OK {
            let retry_after_ms = retry_after_ms(&response);
            let (message, _) = error_body(response);
            return Err(answer(status, message, None, retry_after_ms));
        }
        let mut shown = self.base_url.clone();
        let _ = (shown.set_username(""), shown.set_password(None));
        Err(TransportError::Skew {
            message: format!(
                "the consumer at {} is of an earlier release (its answers carry no {HEADER_STORE_ID} \
                 header) and cannot read envelopes that name a producer or carry headers; \
                 upgrade consumers before naming a producer or using headers (nothing of this \
                 round was sent or marked)",
                shown
            ),
        })
    }
}

/// Whether an earlier release's consumer cannot read `envelope`: it names
/// a producer (other than `default`) or carries headers, fields of the
/// third release that an earlier codec refuses as unknown.
fn needs_this_release(envelope: &Envelope) -> bool {
    !envelope.producer.is_default() || !envelope.headers.is_empty()
}

impl Transport for HttpTransport {
    fn deliver(
        &mut self,
        sender: Option<&StoreId>,
        events: &[Envelope],
    ) -> Result<Vec<Receipt>, TransportError> {
        assert!(!events.is_empty(), "a round holds at least one event");
        if self.consumer_store_id.is_none() && events.iter().any(needs_this_release) {
            self.probe()?;
        }
        let body: Vec<Value> = events.iter().map(Envelope::to_value).collect();
        let body = serde_json::to_vec(&body).expect("envelopes serialize");
        let traceparent = ordo_core::trace::first_traceparent(events);
        let response = (self.post(sender, traceparent.as_ref(), body))
            .map_err(|e| request_failure("POST", e))?;
        self.note_consumer(&response);
        let status = response.status();
        if status == StatusCode::OK {
            return receipts(response, events);
        }
        let retry_after_ms = retry_after_ms(&response);
        let (message, index) = error_body(response);
        Err(answer(status, message, index, retry_after_ms))
    }

    fn consumer_identity(&self) -> Option<StoreId> {
        self.consumer_store_id.clone()
    }

    /// Asks `GET /v1/health` once, before the first delivery, when no
    /// answer has named the consumer's store yet; a consumer of an earlier
    /// release names none, and a status other than 200 is left to the
    /// delivery to report.
    fn identify(&mut self) -> Result<Option<StoreId>, TransportError> {
        if self.consumer_store_id.is_none() && !self.health_asked {
            let response = self
                .client
                .get(self.health_url.clone())
                .send()
                .map_err(|e| request_failure("GET /v1/health", e))?;
            self.note_consumer(&response);
            self.health_asked = true;
        }
        Ok(self.consumer_store_id.clone())
    }
}

/// `base` as the URL the routes join under, refusing what is not http(s).
fn base_url(base: &str) -> Result<Url, ClientError> {
    let invalid = |rule: &str| ClientError::Url {
        url: base.to_owned(),
        rule: rule.to_owned(),
    };
    let mut url = Url::parse(base).map_err(|e| invalid(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("the scheme must be http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("a host is required"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("a query or fragment is not allowed"));
    }
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    Ok(url)
}

fn unix_now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A request (`what`) that got no response: transient, except a server
/// certificate that does not verify (a configuration error: retrying
/// cannot help).
fn request_failure(what: &str, error: reqwest::Error) -> TransportError {
    let chain = error_chain(&error);
    if chain.contains("invalid peer certificate") {
        return TransportError::Refused {
            message: format!(
                "the server's certificate does not verify (--tls-ca names a CA to trust): {chain}"
            ),
        };
    }
    let kind = if error.is_timeout() {
        TransientKind::Timeout
    } else if error.is_connect() || error.is_request() || error.is_body() {
        TransientKind::Connection
    } else {
        TransientKind::Other
    };
    TransportError::Transient {
        kind,
        message: format!("{what} failed: {chain}"),
        retry_after_ms: None,
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// What a status other than 200 means to the relay (HTTP.md, "The relay as
/// a client").
fn answer(
    status: StatusCode,
    message: String,
    index: Option<usize>,
    retry_after_ms: Option<u64>,
) -> TransportError {
    let code = status.as_u16();
    let said = format!("{status}: {message}");
    match code {
        413 => TransportError::TooLarge { message: said },
        400 => match index {
            Some(index) => TransportError::Rejected {
                index,
                message: said,
            },
            None => TransportError::Refused { message: said },
        },
        401 => TransportError::Refused {
            message: format!("{said} (check --key-id and --key-file against the server's --keys)"),
        },
        403 => TransportError::Refused {
            message: format!(
                "{said} (a key bound to a producer delivers only that producer's events: \
                 check the producer= of --key-id's lines in the server's --keys against \
                 this producer store's name)"
            ),
        },
        404 | 405 => TransportError::Refused {
            message: format!("{said} (is --to the base URL of `ordo serve`?)"),
        },
        408 | 429 | 500..=599 => TransportError::Transient {
            kind: if code == 503 {
                TransientKind::Busy
            } else {
                TransientKind::Http
            },
            message: said,
            retry_after_ms,
        },
        _ => TransportError::Refused { message: said },
    }
}

/// `Retry-After` in seconds (an integer), as milliseconds.
fn retry_after_ms(response: &Response) -> Option<u64> {
    let seconds: u64 = response
        .headers()
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(seconds.min(RETRY_AFTER_S_MAX) * 1000)
}

/// The `error` and `index` of an error body, as far as it can be read.
fn error_body(response: Response) -> (String, Option<usize>) {
    let bytes = match response.bytes() {
        Ok(bytes) => bytes,
        Err(e) => return (format!("unreadable error body: {e}"), None),
    };
    let bytes = &bytes[..bytes.len().min(ERROR_BODY_BYTES_MAX)];
    match serde_json::from_slice::<Value>(bytes) {
        Ok(value) => {
            let message = value
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("no error message")
                .to_owned();
            let index = value
                .get("index")
                .and_then(Value::as_u64)
                .and_then(|i| usize::try_from(i).ok());
            (message, index)
        }
        Err(_) => (String::from_utf8_lossy(bytes).into_owned(), None),
    }
}

/// The receipts of a 200, checked against the round: one per event, in
/// order, under the events' own ids. A server that answers otherwise is
/// not an ordo inbox, and nothing is marked.
fn receipts(response: Response, events: &[Envelope]) -> Result<Vec<Receipt>, TransportError> {
    let refused = |rule: &str| TransportError::Refused {
        message: format!("the server's 200 is not an ordo receipt list: {rule}"),
    };
    let value: Value = response.json().map_err(|e| TransportError::Transient {
        kind: TransientKind::Connection,
        message: format!("reading the receipts failed: {}", error_chain(&e)),
        retry_after_ms: None,
    })?;
    let list = value
        .get("receipts")
        .and_then(Value::as_array)
        .ok_or_else(|| refused("no \"receipts\" array"))?;
    if list.len() != events.len() {
        return Err(refused(&format!(
            "{} receipts for {} events",
            list.len(),
            events.len()
        )));
    }
    list.iter()
        .zip(events)
        .map(|(item, event)| {
            if item.get("event_id").and_then(Value::as_str) != Some(event.event_id.as_str()) {
                return Err(refused(&format!(
                    "the receipt for {} names another event",
                    event.event_id
                )));
            }
            let name = item.get("receipt").and_then(Value::as_str);
            let cause = item.get("cause").and_then(Value::as_str);
            name.and_then(|name| Receipt::parse(name, cause))
                .ok_or_else(|| {
                    refused("a receipt is not accepted, duplicate or conflict of a known cause")
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_url_joins_the_route_under_the_base() {
        let url = |base: &str| {
            HttpTransport::new(base, None, &ClientOptions::default())
                .map(|t| t.events_url().to_string())
        };
        assert_eq!(
            url("http://127.0.0.1:8080").unwrap(),
            "http://127.0.0.1:8080/v1/events"
        );
        let ordo = HttpTransport::new(
            "https://inbox.example/ordo",
            None,
            &ClientOptions::default(),
        );
        assert_eq!(
            ordo.unwrap().health_url.as_str(),
            "https://inbox.example/ordo/v1/health"
        );
        assert_eq!(
            url("https://inbox.example/ordo").unwrap(),
            "https://inbox.example/ordo/v1/events"
        );
        assert_eq!(
            url("https://inbox.example/ordo/").unwrap(),
            "https://inbox.example/ordo/v1/events"
        );
        for bad in ["ftp://x/", "127.0.0.1:8080", "http://x/?a=1", "not a url"] {
            assert!(url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_a_named_producer_or_headers_need_this_release() {
        let mut envelope = Envelope::parse(
            br#"{"event_id":"f-1","flow_id":"f","seq":1,"schema_version":1,"type":"t","payload":{}}"#,
        )
        .unwrap();
        assert!(!needs_this_release(&envelope));
        envelope.producer = ordo_core::ProducerName::new("orders").unwrap();
        assert!(needs_this_release(&envelope));
        envelope.producer = ordo_core::ProducerName::default();
        envelope.headers.insert("traceparent".into(), "x".into());
        assert!(needs_this_release(&envelope));
    }

    #[test]
    fn every_status_means_what_http_md_says() {
        let kind = |status: u16, index: Option<usize>| {
            let status = StatusCode::from_u16(status).unwrap();
            match answer(status, "x".into(), index, Some(2000)) {
                TransportError::TooLarge { .. } => "too_large".to_owned(),
                TransportError::Rejected { index, .. } => format!("rejected {index}"),
                TransportError::Refused { .. } => "refused".to_owned(),
                TransportError::Transient {
                    kind,
                    retry_after_ms,
                    ..
                } => format!("transient {} {retry_after_ms:?}", kind.as_str()),
                other => panic!("{other}"),
            }
        };
        assert_eq!(kind(413, None), "too_large");
        assert_eq!(kind(400, Some(3)), "rejected 3");
        assert_eq!(kind(400, None), "refused");
        for status in [401, 403, 404, 405, 415, 302] {
            assert_eq!(kind(status, None), "refused", "{status}");
        }
        // A 403 naming an item stops the run: it quarantines nothing.
        assert_eq!(kind(403, Some(1)), "refused");
        assert_eq!(kind(503, None), "transient busy Some(2000)");
        for status in [408, 429, 500, 502, 504] {
            assert_eq!(kind(status, None), "transient http Some(2000)", "{status}");
        }
    }
}
