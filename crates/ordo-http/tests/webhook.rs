//! The built-in webhook against real servers on loopback: an axum server
//! answering each class of EFFECTS.md "Answers", and raw sockets that
//! break a call before or after its response head.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use ordo_core::effect::{Answer, EffectPolicy};
use ordo_http::{AllowedUrls, Webhook};
use serde_json::{json, Value};

/// One request as the provider saw it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    key: String,
    attempt: String,
    content_type: String,
    body: Value,
}

type Log = Arc<Mutex<Vec<Seen>>>;

fn header(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

async fn answer(
    State(log): State<Log>,
    Path(what): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    log.lock().unwrap().push(Seen {
        path: what.clone(),
        key: header(&headers, "idempotency-key"),
        attempt: header(&headers, "ordo-attempt"),
        content_type: header(&headers, "content-type"),
        body: serde_json::from_str(&body).unwrap_or(Value::Null),
    });
    match what.as_str() {
        "json" => (StatusCode::CREATED, r#"{"id": 7}"#).into_response(),
        "text" => (StatusCode::OK, "thanks").into_response(),
        "big" => (StatusCode::OK, "x".repeat(70 * 1024)).into_response(),
        "redirect" => (StatusCode::FOUND, [("location", "/json")]).into_response(),
        "slow" => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            StatusCode::OK.into_response()
        }
        code => {
            let status = StatusCode::from_u16(code.parse().unwrap()).unwrap();
            (status, [("retry-after", "7")], "no").into_response()
        }
    }
}

/// An axum provider on 127.0.0.1 logging every request it answers.
fn provider() -> (SocketAddr, Log) {
    let log: Log = Arc::default();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let state = log.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let app = Router::new()
                .route("/hooks/{what}", post(answer))
                .with_state(state);
            axum::serve(listener, app).await.unwrap();
        });
    });
    (addr, log)
}

/// A raw server that reads each request's head, writes `reply` and closes.
fn raw(reply: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let _ = stream.write_all(reply);
        }
    });
    addr
}

fn webhook(prefix: &str, dedup_window_ms: Option<u64>) -> Webhook {
    let policy = EffectPolicy {
        timeout_ms: 500,
        lease_ms: 5_500,
        dedup_window_ms,
        ..EffectPolicy::default()
    };
    Webhook::new(AllowedUrls::new(&[prefix]).unwrap(), &policy).unwrap()
}

fn request(url: String) -> Value {
    json!({"url": url, "body": {"producer": "default", "n": 1}})
}

#[test]
fn a_success_posts_the_body_with_the_key_and_attempt_and_keeps_the_answer() {
    let (addr, log) = provider();
    let hook = webhook(&format!("http://{addr}/hooks"), None);
    let url = |what: &str| format!("http://{addr}/hooks/{what}");
    assert_eq!(
        hook.call("s/default/f1/1/webhook", 3, &request(url("json"))),
        Answer::Succeeded(json!({"status": 201, "body": {"id": 7}}))
    );
    let seen = log.lock().unwrap()[0].clone();
    assert_eq!(seen.path, "json");
    assert_eq!(seen.key, "s/default/f1/1/webhook");
    assert_eq!(seen.attempt, "3");
    assert_eq!(seen.content_type, "application/json");
    assert_eq!(seen.body, json!({"producer": "default", "n": 1}));
    assert_eq!(
        hook.call("k", 1, &request(url("text"))),
        Answer::Succeeded(json!({"status": 200, "body": "thanks", "truncated": true}))
    );
    let Answer::Succeeded(big) = hook.call("k", 1, &request(url("big"))) else {
        panic!("a big body is a success");
    };
    assert_eq!(big["truncated"], json!(true));
    assert_eq!(big["body"].as_str().unwrap().len(), 64 * 1024);
}

#[test]
fn statuses_answer_as_the_contract_says() {
    let (addr, log) = provider();
    let url = |what: &str| request(format!("http://{addr}/hooks/{what}"));
    let plain = webhook(&format!("http://{addr}/hooks/"), None);
    let dedup = webhook(&format!("http://{addr}/hooks/"), Some(3_600_000));
    let retry = |code: u16| Answer::Retry {
        reason: format!("status {code}"),
        after_ms: Some(7_000),
    };
    for code in [408, 425, 429, 503] {
        assert_eq!(plain.call("k", 1, &url(&code.to_string())), retry(code));
        assert_eq!(dedup.call("k", 1, &url(&code.to_string())), retry(code));
    }
    for code in [500, 502, 504] {
        let said = format!("status {code}");
        assert_eq!(
            plain.call("k", 1, &url(&code.to_string())),
            Answer::Unknown(said)
        );
        assert_eq!(dedup.call("k", 1, &url(&code.to_string())), retry(code));
    }
    assert_eq!(
        plain.call("k", 1, &url("409")),
        Answer::Failed("status 409".into())
    );
    assert_eq!(dedup.call("k", 1, &url("409")), retry(409));
    for code in [400, 401, 403, 404, 422] {
        assert_eq!(
            plain.call("k", 1, &url(&code.to_string())),
            Answer::Failed(format!("status {code}"))
        );
    }
    assert_eq!(
        plain.call("k", 1, &url("redirect")),
        Answer::Failed("redirect".into())
    );
    let calls = log.lock().unwrap().len();
    assert_eq!(
        calls,
        8 + 6 + 2 + 5 + 1,
        "one request per call, none followed"
    );
}

#[test]
fn bad_requests_and_urls_not_allowed_are_never_sent() {
    let (addr, log) = provider();
    let hook = webhook(&format!("http://{addr}/hooks"), None);
    for bad in [
        json!({"url": format!("http://{addr}/hooks/json")}),
        json!({"url": format!("http://{addr}/hooks/json"), "body": "text"}),
        json!({"url": format!("http://{addr}/hooks/json"), "body": {}, "more": 1}),
    ] {
        assert_eq!(
            hook.call("k", 1, &bad),
            Answer::Failed("bad_request".into())
        );
    }
    for url in [
        format!("http://{addr}/hooksx/json"),
        format!("http://{addr}/other"),
        format!("http://user@{addr}/hooks/json"),
        format!("http://localhost:{}/hooks/json", addr.port()),
        "not a url".to_owned(),
    ] {
        assert_eq!(
            hook.call("k", 1, &request(url)),
            Answer::Failed("url_not_allowed".into())
        );
    }
    assert!(log.lock().unwrap().is_empty());
}

#[test]
fn a_refused_connection_is_retryable_and_a_timeout_is_unknown() {
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let hook = webhook(&format!("http://{closed}/"), None);
    let answer = hook.call("k", 1, &request(format!("http://{closed}/hooks/json")));
    assert!(
        matches!(&answer, Answer::Retry { reason, after_ms: None } if reason.starts_with("connect")),
        "{answer:?}"
    );
    let (addr, log) = provider();
    let hook = webhook(&format!("http://{addr}/hooks"), Some(3_600_000));
    let answer = hook.call("k", 1, &request(format!("http://{addr}/hooks/slow")));
    assert!(
        matches!(&answer, Answer::Unknown(why) if why.starts_with("timeout")),
        "{answer:?}"
    );
    assert_eq!(log.lock().unwrap().len(), 1, "the slow call was sent");
}

#[test]
fn a_reset_after_sending_is_unknown_and_a_broken_success_body_is_kept_as_an_error() {
    let reset = raw(b"");
    let hook = webhook(&format!("http://{reset}/"), None);
    let answer = hook.call("k", 1, &request(format!("http://{reset}/hooks")));
    assert!(matches!(answer, Answer::Unknown(_)), "{answer:?}");
    let broken = raw(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"partial\"");
    let hook = webhook(&format!("http://{broken}/"), None);
    let Answer::Succeeded(result) = hook.call("k", 1, &request(format!("http://{broken}/h")))
    else {
        panic!("the head said 200");
    };
    assert_eq!(result["status"], json!(200));
    assert_eq!(result["body"], Value::Null);
    assert!(result["body_error"].as_str().is_some(), "{result}");
}
