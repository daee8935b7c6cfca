//! `--webhook URL` and `ordo effects run` as processes (EFFECTS.md "The
//! built-in webhook executor", CLI.md "Additions of the third release"):
//! the intents the reservation domain records, what the executor sends to
//! a provider on loopback run by this test, its flags' refusals, and the
//! follow modes with their metrics.

mod common;
mod pgdb;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use common::process::Process;
use common::Lab;
use serde_json::{json, Value};

const PATIENCE: Duration = Duration::from_secs(30);

/// One request as the provider saw it: its path, `Idempotency-Key`,
/// `Ordo-Attempt`, `Content-Type` and body.
#[derive(Debug, Clone)]
struct Request {
    path: String,
    key: String,
    attempt: String,
    content_type: String,
    body: Value,
}

type Seen = Arc<Mutex<Vec<Request>>>;

async fn record(
    State(seen): State<Seen>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: String,
) -> axum::Json<Value> {
    let text = |name: &str| {
        let value = headers.get(name).and_then(|v| v.to_str().ok());
        value.unwrap_or_default().to_owned()
    };
    seen.lock().unwrap().push(Request {
        path: uri.path().to_owned(),
        key: text("idempotency-key"),
        attempt: text("ordo-attempt"),
        content_type: text("content-type"),
        body: serde_json::from_str(&body).unwrap_or(Value::Null),
    });
    axum::Json(json!({"received": true}))
}

/// A provider on 127.0.0.1 answering every POST 200 `{"received": true}`.
fn provider() -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route("/{*path}", post(record))
        .with_state(seen.clone());
    (common::http::serve_on_loopback(app), seen)
}

/// A lab with one flow of three events relayed to its consumer.
fn relayed() -> Lab {
    let lab = Lab::new();
    lab.init();
    lab.full_flow("f1", 5);
    lab.relay(&[]);
    lab
}

fn effects(lab: &Lab, extra: &[&str]) -> Value {
    let consumer = lab.path("consumer.db");
    let mut args = vec!["effects", "list", "--json", "--consumer", &consumer];
    args.extend_from_slice(extra);
    lab.run(&args).json()
}

fn run_once(lab: &Lab, prefix: &str) -> Value {
    let consumer = lab.path("consumer.db");
    let args = ["effects", "run", "--json", "--consumer", &consumer];
    lab.run(&[&args[..], &["--allow-url-prefix", prefix]].concat())
        .json()
}

#[test]
fn flags_that_cannot_hold_exit_2_and_write_nothing() {
    let lab = relayed();
    let consumer = lab.path("consumer.db");
    for url in [
        "ftp://hooks.example.com/",
        "hooks.example.com/in",
        "http://",
    ] {
        lab.apply_out(&["--webhook", url]).usage("--webhook");
    }
    let serve = ["serve", "--consumer", &consumer, "--listen", "127.0.0.1:0"];
    lab.run(&[&serve[..], &["--webhook", "http://a/"]].concat())
        .usage("--apply");
    let before = lab.files();
    let run = ["effects", "run", "--consumer", &consumer];
    for (extra, needle) in [
        (
            &[
                "--allow-url-prefix",
                "http://a/",
                "--timeout-ms",
                "2000",
                "--lease-ms",
                "6999",
            ][..],
            "--lease-ms",
        ),
        (&["--allow-url-prefix", "a/b"][..], "--allow-url-prefix"),
        (&["--allow-url-prefix", "http://u:p@a/"][..], "user-info"),
        (
            &["--allow-url-prefix", "http://a/", "--dedup-window", "soon"][..],
            "--dedup-window",
        ),
        (
            &["--allow-url-prefix", "http://a/", "--max-attempts", "0"][..],
            "--max-attempts",
        ),
    ] {
        lab.run(&[&run[..], extra].concat()).usage(needle);
    }
    lab.files().assert_unchanged(&before, "refused effects run");
    let missing = lab.path("missing.db");
    let out = lab.run(&[
        "effects",
        "run",
        "--consumer",
        &missing,
        "--allow-url-prefix",
        "http://a/",
    ]);
    out.usage("does not exist");
    assert!(common::bytes(&missing).is_none(), "never created");
}

#[test]
fn applied_events_are_posted_once_each_under_their_keys() {
    let (addr, seen) = provider();
    let lab = relayed();
    let url = format!("http://{addr}/hooks/orders");
    lab.apply(&["--webhook", &url]);
    let listed = effects(&lab, &["--name", "webhook"]);
    let rows = listed["effects"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 3, "{listed}");
    let inbox = lab.snapshot()["consumer"]["inbox"].clone();
    for (row, seq) in rows.iter().zip(1..) {
        assert_eq!(row["state"], "pending", "{row}");
        assert_eq!(row["request"]["url"], json!(url));
        let body = &row["request"]["body"];
        assert_eq!(body["producer"], "default");
        assert_eq!(body["event"]["flow_id"], "f1");
        assert_eq!(body["event"]["seq"], json!(seq));
        assert!(row["key"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/default/f1/{seq}/webhook")));
        let stored = inbox
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["seq"] == json!(seq));
        let event_id = &stored.expect("in the inbox")["event_id"];
        assert_eq!(&body["event"]["event_id"], event_id);
    }
    let counts = run_once(&lab, &format!("http://{addr}/hooks"));
    assert_eq!(
        counts,
        json!({"attempted": 3, "succeeded": 3, "failed": 0, "retried": 0, "unknown": 0})
    );
    let sent = seen.lock().unwrap().clone();
    assert_eq!(sent.len(), 3);
    for (request, row) in sent.iter().zip(&rows) {
        assert_eq!(request.path, "/hooks/orders");
        assert_eq!(request.key, row["key"].as_str().unwrap());
        assert_eq!(request.attempt, "1");
        assert_eq!(request.content_type, "application/json");
        assert_eq!(request.body, row["request"]["body"]);
    }
    for row in effects(&lab, &[])["effects"].as_array().unwrap() {
        assert_eq!(row["state"], "succeeded", "{row}");
        assert_eq!(
            row["result"],
            json!({"status": 200, "body": {"received": true}})
        );
    }
    let again = run_once(&lab, &format!("http://{addr}/hooks"));
    assert_eq!(again["attempted"], 0, "nothing is due any more");
}

#[test]
fn a_url_outside_the_prefixes_fails_and_is_never_called() {
    let (addr, seen) = provider();
    let lab = relayed();
    lab.apply(&["--webhook", &format!("http://{addr}/hooksx/orders")]);
    let counts = run_once(&lab, &format!("http://{addr}/hooks"));
    assert_eq!(
        counts["failed"], 3,
        "a failed intent holds nothing back: {counts}"
    );
    let rows = effects(&lab, &["--state", "failed"]);
    for row in rows["effects"].as_array().unwrap() {
        assert_eq!(row["last_error"], "url_not_allowed", "{row}");
    }
    assert!(seen.lock().unwrap().is_empty());
}

/// Lines of `reader`, as they come.
fn lines(reader: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Starts `ordo ARGS` with JSON logs; its stdout lines and stderr lines.
fn follow(args: &[&str]) -> (Process, Receiver<String>, Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(args)
        .args(["--log-format", "json"])
        .env_remove("ORDO_CRASH_POINT")
        .env_remove("ORDO_NOW_MS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ordo starts");
    let out = lines(child.stdout.take().unwrap());
    let logs = lines(child.stderr.take().unwrap());
    (Process(child), out, logs)
}

/// The metrics address a follow mode logs.
fn metrics_addr(logs: &Receiver<String>) -> String {
    loop {
        let line = logs.recv_timeout(PATIENCE).expect("a log line");
        let log: Value = serde_json::from_str(&line).expect("a JSON log line");
        if log["fields"]["message"] == "serving metrics" {
            return log["fields"]["addr"].as_str().unwrap().to_owned();
        }
    }
}

fn terminate(child: &mut Child) {
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0), "exit 0 after SIGTERM");
            return;
        }
        assert!(started.elapsed() < PATIENCE, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn follow_modes_record_and_post_as_events_arrive_and_export_the_metrics() {
    let (addr, seen) = provider();
    let lab = Lab::new();
    lab.init();
    let consumer = lab.path("consumer.db");
    let url = format!("http://{addr}/hooks/in");
    let (mut applier, _, _applier_logs) = follow(&[
        "apply",
        "--follow",
        "--json",
        "--consumer",
        &consumer,
        "--webhook",
        &url,
    ]);
    let prefix = format!("http://{addr}/hooks");
    let (mut executor, rounds, logs) = follow(&[
        "effects",
        "run",
        "--follow",
        "--json",
        "--consumer",
        &consumer,
        "--allow-url-prefix",
        &prefix,
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let metrics = metrics_addr(&logs);
    lab.full_flow("f1", 5);
    lab.full_flow("f2", 5);
    lab.relay(&[]);
    let started = Instant::now();
    while seen.lock().unwrap().len() < 6 {
        assert!(started.elapsed() < PATIENCE, "{:?}", seen.lock().unwrap());
        std::thread::sleep(Duration::from_millis(50));
    }
    let round: Value = serde_json::from_str(&rounds.recv_timeout(PATIENCE).unwrap()).unwrap();
    assert!(
        round["round"].as_u64().is_some() && round["attempted"].as_u64().is_some(),
        "{round}"
    );
    let wanted = [
        "ordo_effect_attempts_total{name=\"webhook\",outcome=\"succeeded\"} 6",
        "ordo_effect_attempts_total{name=\"webhook\",outcome=\"unknown\"} 0",
        "ordo_effects{state=\"succeeded\"} 6",
        "ordo_effects{state=\"pending\"} 0",
    ];
    loop {
        let exposition = ureq::get(format!("http://{metrics}/metrics"))
            .call()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap();
        if wanted.iter().all(|w| exposition.lines().any(|l| l == *w)) {
            break;
        }
        assert!(started.elapsed() < PATIENCE, "{exposition}");
        std::thread::sleep(Duration::from_millis(100));
    }
    terminate(&mut executor);
    terminate(&mut applier);
    let keys: std::collections::BTreeSet<String> =
        seen.lock().unwrap().iter().map(|r| r.key.clone()).collect();
    assert_eq!(keys.len(), 6, "each key sent once");
}

#[test]
fn serve_apply_records_a_webhook_intent_per_event_it_applies() {
    let lab = Lab::new();
    lab.init();
    let consumer = lab.path("consumer.db");
    let url = "https://hooks.example.com/in";
    let mut command = Command::new(env!("CARGO_BIN_EXE_ordo"));
    command
        .args(["serve", "--consumer", &consumer, "--listen", "127.0.0.1:0"])
        .args(["--apply", "--webhook", url])
        .env_remove("ORDO_CRASH_POINT")
        .stderr(Stdio::null());
    let (mut server, addr) = common::process::start_listening(&mut command, "serve");
    lab.full_flow("f1", 5);
    let producer = lab.path("producer.db");
    let to = format!("http://{addr}");
    let relayed = lab.run(&["relay", "--json", "--producer", &producer, "--to", &to]);
    assert_eq!(relayed.code, 0, "{relayed:#?}");
    let started = Instant::now();
    loop {
        let rows = effects(&lab, &[])["effects"].as_array().unwrap().clone();
        if rows.len() == 3 {
            assert!(rows.iter().all(|r| r["request"]["url"] == url), "{rows:?}");
            break;
        }
        assert!(started.elapsed() < PATIENCE, "{rows:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    terminate(&mut server);
}

#[test]
fn a_postgres_consumers_intents_are_posted_once_each() {
    let (addr, seen) = provider();
    let db = pgdb::Database::create();
    let lab = Lab::with_stores(&db.url(), &db.url());
    lab.init();
    lab.full_flow("f1", 5);
    lab.relay(&[]);
    let url = format!("http://{addr}/hooks/orders");
    lab.apply(&["--webhook", &url]);
    let args = ["effects", "run", "--json", "--consumer", &lab.c];
    let prefix = format!("http://{addr}/hooks");
    let counts = lab
        .run(&[&args[..], &["--allow-url-prefix", &prefix]].concat())
        .json();
    assert_eq!(
        counts,
        json!({"attempted": 3, "succeeded": 3, "failed": 0, "retried": 0, "unknown": 0})
    );
    let listed = lab
        .run(&["effects", "list", "--json", "--consumer", &lab.c])
        .json();
    let rows = listed["effects"].as_array().unwrap();
    let sent = seen.lock().unwrap().clone();
    assert_eq!(sent.len(), 3, "one POST per intent");
    for (request, row) in sent.iter().zip(rows) {
        assert_eq!(row["state"], "succeeded", "{row}");
        assert_eq!(request.key, row["key"].as_str().unwrap());
        assert_eq!(request.attempt, "1");
    }
    let again = lab
        .run(&[&args[..], &["--allow-url-prefix", &prefix]].concat())
        .json();
    assert_eq!(again["attempted"], 0, "nothing is due any more");
}
