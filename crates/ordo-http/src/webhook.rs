//! The built-in webhook effect (EFFECTS.md "The built-in webhook
//! executor"): one intent named `webhook`, `{"url": STRING, "body":
//! OBJECT}`, turned into one `POST` and its answer into an [`Answer`].
//!
//! * [`AllowedUrls`]: the `--allow-url-prefix` values a URL must fall
//!   under (scheme, host and port equal, the path under the prefix's at a
//!   `/` boundary, never with user-info).
//! * [`Webhook`]: the client. [`Webhook::call`] takes an intent's key,
//!   attempt and request as plain values, so that any executor (the
//!   runtime's, a test's) can run it.
//!
//! Invariant: a request that is not well formed or whose URL is not
//! allowed is answered without any connection being made; the answer
//! classes are decided by the status once the response head is received,
//! and a call that may have reached the provider is never answered as
//! retryable unless the provider said it did not act (or deduplicates).

use std::io::Read;
use std::time::Duration;

use ordo_core::effect::{Answer, EffectPolicy};
use reqwest::blocking::{Client, Response};
use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use reqwest::Url;
use serde_json::{json, Map, Value};

/// The effect name the webhook executor runs.
pub const WEBHOOK_EFFECT: &str = "webhook";
/// The header carrying the intent's key.
pub const HEADER_IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// The header carrying the attempt's number (1 for the first).
pub const HEADER_ORDO_ATTEMPT: &str = "Ordo-Attempt";
/// The most of a success body kept in the result, in bytes.
pub const RESULT_BODY_BYTES_MAX: usize = 64 * 1024;
/// The longest wait a `Retry-After` may ask for, in seconds.
const RETRY_AFTER_S_MAX: u64 = 24 * 3600;

/// Why a prefix or a client was refused.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// No `--allow-url-prefix` was given.
    #[error("at least one --allow-url-prefix is required")]
    NoPrefix,
    /// A prefix is not an `http://` or `https://` URL with a host.
    #[error("--allow-url-prefix {prefix}: {rule}")]
    Prefix {
        /// The prefix given.
        prefix: String,
        /// What is wrong with it.
        rule: String,
    },
    /// The HTTP client could not be built.
    #[error("webhook client: {0}")]
    Client(String),
}

/// One allowed prefix, as its parsed parts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Prefix {
    scheme: String,
    host: String,
    port: Option<u16>,
    path: String,
}

impl Prefix {
    fn parse(text: &str) -> Result<Prefix, WebhookError> {
        let refuse = |rule: &str| WebhookError::Prefix {
            prefix: text.to_owned(),
            rule: rule.to_owned(),
        };
        let url = Url::parse(text).map_err(|e| refuse(&e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(refuse("must be an http:// or https:// URL"));
        }
        if has_user_info(&url) {
            return Err(refuse("must not carry user-info"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(refuse("must not carry a query or a fragment"));
        }
        let host = url.host_str().ok_or_else(|| refuse("must name a host"))?;
        Ok(Prefix {
            scheme: url.scheme().to_owned(),
            host: host.to_owned(),
            port: url.port_or_known_default(),
            path: url.path().to_owned(),
        })
    }

    fn allows(&self, url: &Url) -> bool {
        url.scheme() == self.scheme
            && url.host_str() == Some(self.host.as_str())
            && url.port_or_known_default() == self.port
            && path_under(url.path(), &self.path)
    }
}

/// Whether `path` is `prefix` or lies under it at a `/` boundary.
fn path_under(path: &str, prefix: &str) -> bool {
    match path.strip_prefix(prefix) {
        None => false,
        Some(rest) => rest.is_empty() || prefix.ends_with('/') || rest.starts_with('/'),
    }
}

fn has_user_info(url: &Url) -> bool {
    !url.username().is_empty() || url.password().is_some()
}

/// The URLs the webhook executor may call: those under one of its
/// prefixes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedUrls {
    prefixes: Vec<Prefix>,
}

impl AllowedUrls {
    /// The URLs under `prefixes` (at least one; each an `http://` or
    /// `https://` URL with a host, without user-info, query or fragment).
    pub fn new<S: AsRef<str>>(prefixes: &[S]) -> Result<AllowedUrls, WebhookError> {
        if prefixes.is_empty() {
            return Err(WebhookError::NoPrefix);
        }
        let prefixes = prefixes
            .iter()
            .map(|p| Prefix::parse(p.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(AllowedUrls { prefixes })
    }

    /// The parsed URL when `text` is allowed: it parses, carries no
    /// user-info, and its scheme, host and port equal those of a prefix
    /// whose path its path starts with at a `/` boundary.
    pub fn allowed(&self, text: &str) -> Option<Url> {
        let url = Url::parse(text).ok()?;
        if has_user_info(&url) {
            return None;
        }
        self.prefixes.iter().any(|p| p.allows(&url)).then_some(url)
    }
}

/// The webhook client: the allowed URLs, the call's timeout, and whether
/// the endpoint deduplicates by `Idempotency-Key` (which makes a 409 and
/// a 5xx other than 503 retryable).
pub struct Webhook {
    client: Client,
    allowed: AllowedUrls,
    deduplicates: bool,
}

impl Webhook {
    /// A client calling under `allowed`, with `policy`'s timeout, that
    /// answers as an endpoint deduplicating by key when `policy` declares a
    /// dedup window. Builds a blocking client: not from inside an async
    /// runtime.
    pub fn new(allowed: AllowedUrls, policy: &EffectPolicy) -> Result<Webhook, WebhookError> {
        let timeout = Duration::from_millis(policy.timeout_ms.max(1));
        let client = Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            // One connection per call: an answer never depends on a pooled
            // connection the provider closed meanwhile.
            .pool_max_idle_per_host(0)
            .use_rustls_tls()
            .build()
            .map_err(|e| WebhookError::Client(e.to_string()))?;
        Ok(Webhook {
            client,
            allowed,
            deduplicates: policy.dedup_window_ms.is_some(),
        })
    }

    /// The URLs this client may call.
    pub fn allowed(&self) -> &AllowedUrls {
        &self.allowed
    }

    /// Makes attempt `attempt` of the intent `key` whose request is
    /// `request`, and says what happened (EFFECTS.md "Answers").
    pub fn call(&self, key: &str, attempt: u32, request: &Value) -> Answer {
        let Some((url, body)) = webhook_request(request) else {
            return Answer::Failed("bad_request".into());
        };
        let Some(url) = self.allowed.allowed(url) else {
            return Answer::Failed("url_not_allowed".into());
        };
        let sent = self
            .client
            .post(url)
            .header(HEADER_IDEMPOTENCY_KEY, key)
            .header(HEADER_ORDO_ATTEMPT, attempt.to_string())
            .header(CONTENT_TYPE, "application/json")
            .body(Value::Object(body.clone()).to_string())
            .send();
        match sent {
            Ok(response) => self.answer(response),
            Err(error) => sending_failed(&error),
        }
    }

    /// The answer of a response whose head was received.
    fn answer(&self, response: Response) -> Answer {
        let status = response.status();
        let code = status.as_u16();
        let said = format!("status {code}");
        let retry = |response: &Response| Answer::Retry {
            reason: said.clone(),
            after_ms: retry_after_ms(response),
        };
        match code {
            200..=299 => Answer::Succeeded(success_result(code, response)),
            300..=399 => Answer::Failed("redirect".into()),
            408 | 425 | 429 | 503 => retry(&response),
            409 if self.deduplicates => retry(&response),
            500..=599 if self.deduplicates => retry(&response),
            500..=599 => Answer::Unknown(said),
            400..=499 => Answer::Failed(said),
            // 1xx as a final answer, or past 599: it does not say whether
            // the provider acted.
            _ => Answer::Unknown(format!("unexpected {status}")),
        }
    }
}

/// `text` when it parses as an `http://` or `https://` URL with a host
/// (`--webhook URL`); whether it may be called is the executor's decision.
pub fn check_url(text: &str) -> Result<String, String> {
    let url = Url::parse(text).map_err(|e| format!("must be an http:// or https:// URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("must be an http:// or https:// URL with a host".into());
    }
    Ok(text.to_owned())
}

/// `(url, body)` of a well-formed request: exactly `{"url": STRING,
/// "body": OBJECT}`.
pub fn webhook_request(request: &Value) -> Option<(&str, &Map<String, Value>)> {
    let fields = request.as_object()?;
    if fields.len() != 2 {
        return None;
    }
    let url = fields.get("url")?.as_str()?;
    let body = fields.get("body")?.as_object()?;
    Some((url, body))
}

/// The answer of a call that produced no response head: retryable when no
/// connection was made (nothing was sent), else unknown (a timeout or a
/// reset after the request may have been sent).
fn sending_failed(error: &reqwest::Error) -> Answer {
    let detail = error_chain(error);
    if error.is_connect() {
        Answer::Retry {
            reason: format!("connect: {detail}"),
            after_ms: None,
        }
    } else if error.is_timeout() {
        Answer::Unknown(format!("timeout: {detail}"))
    } else {
        Answer::Unknown(format!("no answer: {detail}"))
    }
}

/// An error with its sources, `: `-separated.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
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

/// The result of a 2xx: `{"status": S, "body": B}`, B the parsed JSON when
/// the body is complete, valid and at most 64 KiB; else its first 64 KiB
/// as a string with `"truncated": true` (EFFECTS.md: the body as text
/// instead of its JSON, whether or not it was cut); or `null` with
/// `body_error` when reading it failed.
fn success_result(status: u16, response: Response) -> Value {
    let mut bytes = Vec::new();
    let limit = RESULT_BODY_BYTES_MAX as u64 + 1;
    if let Err(error) = response.take(limit).read_to_end(&mut bytes) {
        return json!({"status": status, "body": null, "body_error": error_chain(&error)});
    }
    let truncated = bytes.len() > RESULT_BODY_BYTES_MAX;
    if !truncated {
        if let Ok(body) = serde_json::from_slice::<Value>(&bytes) {
            return json!({"status": status, "body": body});
        }
    }
    bytes.truncate(RESULT_BODY_BYTES_MAX);
    let text = String::from_utf8_lossy(&bytes);
    json!({"status": status, "body": text, "truncated": true})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(prefixes: &[&str]) -> AllowedUrls {
        AllowedUrls::new(prefixes).unwrap()
    }

    #[test]
    fn a_url_is_allowed_under_a_prefix_at_a_slash_boundary() {
        let urls = allowed(&["https://hooks.example.com/v1/in", "http://127.0.0.1:8080/"]);
        for good in [
            "https://hooks.example.com/v1/in",
            "https://hooks.example.com/v1/in/",
            "https://hooks.example.com/v1/in/orders?x=1",
            "https://HOOKS.example.com:443/v1/in/a",
            "http://127.0.0.1:8080/anything",
            "http://127.0.0.1:8080",
        ] {
            assert!(urls.allowed(good).is_some(), "{good}");
        }
        for bad in [
            "https://hooks.example.com/v1/inbox",
            "https://hooks.example.com/v1",
            "https://hooks.example.com/v1/in/../admin",
            "https://hooks.example.com/v1/in/%2e%2e/admin",
            "http://hooks.example.com/v1/in",
            "https://hooks.example.com:8443/v1/in",
            "https://evil.example.com/v1/in",
            "https://hooks.example.com.evil.com/v1/in",
            "https://user@hooks.example.com/v1/in",
            "https://user:pw@hooks.example.com/v1/in",
            "http://127.0.0.1:8081/",
            "http://localhost:8080/",
            "not a url",
            "ftp://127.0.0.1:8080/",
        ] {
            assert!(urls.allowed(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_prefix_with_a_trailing_slash_allows_below_it_only() {
        let urls = allowed(&["http://127.0.0.1:9/hooks/"]);
        assert!(urls.allowed("http://127.0.0.1:9/hooks/a").is_some());
        assert!(urls.allowed("http://127.0.0.1:9/hooks/").is_some());
        assert!(urls.allowed("http://127.0.0.1:9/hooks").is_none());
        assert!(urls.allowed("http://127.0.0.1:9/hooksx").is_none());
    }

    #[test]
    fn bad_prefixes_are_refused_at_construction() {
        assert!(matches!(
            AllowedUrls::new::<&str>(&[]),
            Err(WebhookError::NoPrefix)
        ));
        for bad in [
            "hooks.example.com",
            "ftp://hooks.example.com/",
            "https://u:p@hooks.example.com/",
            "https://hooks.example.com/?q=1",
            "https://hooks.example.com/#f",
            "file:///etc",
        ] {
            assert!(
                matches!(AllowedUrls::new(&[bad]), Err(WebhookError::Prefix { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_webhook_url_is_http_or_https_with_a_host() {
        assert!(check_url("https://hooks.example.com/in").is_ok());
        assert!(check_url("http://127.0.0.1:9/").is_ok());
        for bad in ["hooks.example.com", "ftp://a/", "mailto:a@b", "http://", ""] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_request_is_exactly_a_url_and_an_object_body() {
        assert!(webhook_request(&json!({"url": "http://a/", "body": {}})).is_some());
        for bad in [
            json!({"url": "http://a/"}),
            json!({"url": "http://a/", "body": []}),
            json!({"url": 1, "body": {}}),
            json!({"url": "http://a/", "body": {}, "extra": 1}),
            json!("http://a/"),
        ] {
            assert!(webhook_request(&bad).is_none(), "{bad}");
        }
    }
}
