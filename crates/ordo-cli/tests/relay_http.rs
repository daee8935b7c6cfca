//! `ordo relay --to URL` and the `--follow` modes, as real processes: a
//! producer file on one side, `ordo serve` on a consumer file on the other,
//! talking over loopback. Every row of HTTP.md "The relay as a client" has
//! a test here; the answers no honest `ordo serve` gives (403, 405, 429,
//! 500, 400 naming an item) come from a one-response-per-connection server
//! of the test's own that stands for a consumer of another version.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{
    assert_backlog, http_get, keys, line_reader, producer_status, receipts, relay_to, row, run,
    spawn, Lab, Out, SelfSigned, Serve,
};
use ordo_sqlite::rusqlite;
use serde_json::{json, Value};

const T0: i64 = 1_700_000_000_000;
/// The longest a test waits for something a process should do at once.
const PATIENCE: Duration = Duration::from_secs(20);

/// A producer with `flows` reserved flows, a consumer file created empty.
fn lab_with(flows: &[&str]) -> Lab {
    let lab = Lab::new();
    lab.init();
    for flow in flows {
        lab.advance(flow, 0, "reserved", Some(3));
    }
    lab
}

/// `ordo relay --follow --json` from the lab's producer to `to` (`--to
/// URL` or `--consumer C`).
fn relay_follow(lab: &Lab, to: &[&str]) -> Child {
    spawn(&[&["relay", "--follow", "--json", "--producer", &lab.p], to].concat())
}

fn outbox(lab: &Lab) -> Value {
    lab.run(&["outbox", "list", "--json", "--producer", &lab.p])
        .json()["outbox"]
        .clone()
}

fn inbox_ids(lab: &Lab) -> Vec<String> {
    let inbox = lab.snapshot()["consumer"]["inbox"].clone();
    let mut ids: Vec<String> = inbox
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| r["event_id"].as_str().expect("an id").to_owned())
        .collect();
    ids.sort();
    ids
}

#[test]
fn relay_to_a_server_moves_custody_and_a_resend_answers_duplicate() {
    let lab = lab_with(&["A", "B"]);
    lab.advance("A", 1, "confirmed", None);
    let serve = Serve::start(&lab.c, &[]);
    let report = relay_to(&lab, &serve.url(), &[]).json();
    let mut got = receipts(&report);
    got.sort();
    assert_eq!(
        got,
        [
            ("A-1".into(), "accepted".into()),
            ("A-2".into(), "accepted".into()),
            ("B-1".into(), "accepted".into())
        ]
    );
    assert_eq!(inbox_ids(&lab), ["A-1", "A-2", "B-1"]);
    assert!(outbox(&lab)
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["accepted"] == json!(true)));
    // An explicit resend (a retry after a lost response) is a duplicate.
    let again = relay_to(&lab, &serve.url(), &["--event", "A-1"]).json();
    assert_eq!(receipts(&again), [("A-1".into(), "duplicate".into())]);
    assert_eq!(inbox_ids(&lab), ["A-1", "A-2", "B-1"]);
}

#[test]
fn a_round_over_the_servers_max_batch_is_split_and_delivered_whole() {
    let flows = ["A", "B", "C", "D", "E"];
    let lab = lab_with(&flows);
    let serve = Serve::start(&lab.c, &["--max-batch", "2"]);
    let report = relay_to(&lab, &serve.url(), &["--batch", "5"]).json();
    assert_eq!(report["deliveries_total"], json!(5), "{report}");
    assert_eq!(report["refused_total"], json!(0), "{report}");
    assert_eq!(inbox_ids(&lab), ["A-1", "B-1", "C-1", "D-1", "E-1"]);
}

#[test]
fn an_event_too_large_alone_is_quarantined_and_the_rest_go_on() {
    // A long flow id makes one envelope larger than the server takes.
    let long = "L".repeat(100);
    let lab = lab_with(&["A", &long, "B"]);
    let serve = Serve::start(&lab.c, &["--max-body-bytes", "250"]);
    let report = relay_to(&lab, &serve.url(), &[]).json();
    assert_eq!(report["deliveries_total"], json!(2), "{report}");
    assert_eq!(
        report["refused"][0]["reason"],
        json!("too_large"),
        "{report}"
    );
    assert_eq!(report["refused"][0]["flow_id"], json!(long));
    assert_eq!(inbox_ids(&lab), ["A-1", "B-1"]);
    let rows = outbox(&lab);
    let quarantined = row(&rows, "flow_id", &long);
    assert_eq!(quarantined["quarantined"], json!(true));
    assert_eq!(quarantined["accepted"], json!(false));
    assert!(
        quarantined["quarantine_reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("too_large")),
        "{quarantined}"
    );
    // A later run does not offer it again.
    let again = relay_to(&lab, &serve.url(), &[]).json();
    assert_eq!(again["deliveries_total"], json!(0), "{again}");
}

#[test]
fn unsigned_or_wrongly_signed_rounds_are_a_configuration_error_marking_nothing() {
    let lab = lab_with(&["A"]);
    let keys = write_key_file(lab.dir.path(), "keys", "k1", &"11".repeat(32));
    let wrong = write_key_file(lab.dir.path(), "wrong", "k1", &"22".repeat(32));
    let serve = Serve::start(&lab.c, &["--keys", &keys]);
    let before = outbox(&lab);
    for extra in [vec![], vec!["--key-id", "k1", "--key-file", &wrong]] {
        let out = relay_to(&lab, &serve.url(), &extra);
        out.storage_error();
        assert!(out.stderr.contains("401"), "{out:#?}");
        assert_eq!(outbox(&lab), before, "nothing marked");
    }
    assert!(inbox_ids(&lab).is_empty());
    let signed = relay_to(&lab, &serve.url(), &["--key-id", "k1", "--key-file", &keys]).json();
    assert_eq!(receipts(&signed), [("A-1".into(), "accepted".into())]);
}

#[test]
fn a_key_id_missing_from_the_key_file_is_invalid_input() {
    let lab = lab_with(&["A"]);
    let keys = write_key_file(lab.dir.path(), "keys", "k1", &"11".repeat(32));
    let out = relay_to(
        &lab,
        "http://127.0.0.1:9",
        &["--key-id", "k2", "--key-file", &keys],
    );
    out.usage("k2");
}

#[test]
fn a_wrong_path_is_a_configuration_error_and_a_bad_url_invalid_input() {
    let lab = lab_with(&["A"]);
    let serve = Serve::start(&lab.c, &[]);
    let out = relay_to(&lab, &format!("{}/not-ordo", serve.url()), &[]);
    out.storage_error();
    assert!(out.stderr.contains("404"), "{out:#?}");
    assert_eq!(outbox(&lab)[0]["attempts"], json!(0), "nothing recorded");
    relay_to(&lab, "ftp://127.0.0.1/", &[]).usage("http");
}

#[test]
fn an_unreachable_server_is_transient_recorded_and_exit_0() {
    let lab = lab_with(&["A", "B"]);
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let out = relay_to(lab.at(T0), &url, &["--timeout-ms", "2000"]);
    let report = out.json();
    assert_eq!(report["deliveries_total"], json!(0));
    assert!(
        report["transient_errors"].as_u64().unwrap() >= 1,
        "{report}"
    );
    for flow in ["A", "B"] {
        let rows = outbox(&lab);
        let r = row(&rows, "flow_id", flow);
        assert_eq!(r["attempts"], json!(1), "{r}");
        assert_eq!(r["last_outcome"], json!("error"), "{r}");
        assert!(r["next_attempt_at_ms"].as_i64().unwrap() > T0, "{r}");
    }
}

#[test]
fn a_busy_store_behind_the_server_is_503_then_delivered_after_it_clears() {
    let lab = lab_with(&["A"]);
    let serve = Serve::start(&lab.c, &["--busy-timeout-ms", "50"]);
    let lock = rusqlite::Connection::open(&lab.c).expect("open the consumer");
    lock.execute_batch("BEGIN IMMEDIATE").expect("lock it");
    let busy = relay_to(lab.at(T0), &serve.url(), &[]);
    let report = busy.json();
    assert_eq!(report["transient_errors"], json!(1), "{report}");
    let rows = outbox(&lab);
    let a1 = row(&rows, "event_id", "A-1");
    assert!(
        a1["last_error"].as_str().is_some_and(|e| e.contains("503")),
        "{a1}"
    );
    // The server's Retry-After (at least 1 s) bounds the next attempt.
    assert!(
        a1["next_attempt_at_ms"].as_i64().unwrap() >= T0 + 1_000,
        "{a1}"
    );
    lock.execute_batch("ROLLBACK").expect("unlock");
    let later = relay_to(lab.at(T0 + 120_000), &serve.url(), &[]).json();
    assert_eq!(receipts(&later), [("A-1".into(), "accepted".into())]);
}

#[test]
fn a_retry_after_is_never_shortened_and_429_500_are_transient() {
    for (status, kind_in_error) in [(503, "503"), (429, "429"), (500, "500")] {
        let lab = lab_with(&["A"]);
        let url = canned(status, &[("Retry-After", "30")], r#"{"error":"later"}"#);
        let report = relay_to(lab.at(T0), &url, &[]).json();
        assert_eq!(report["transient_errors"], json!(1), "{status}: {report}");
        let rows = outbox(&lab);
        let a1 = row(&rows, "event_id", "A-1");
        assert!(
            a1["next_attempt_at_ms"].as_i64().unwrap() >= T0 + 30_000,
            "{status}: {a1}"
        );
        assert!(
            a1["last_error"]
                .as_str()
                .is_some_and(|e| e.contains(kind_in_error)),
            "{a1}"
        );
    }
}

#[test]
fn forbidden_and_method_not_allowed_stop_the_run_marking_nothing() {
    for status in [403, 405, 415] {
        let lab = lab_with(&["A"]);
        let url = canned(status, &[], r#"{"error":"no"}"#);
        let before = outbox(&lab);
        let out = relay_to(&lab, &url, &[]);
        out.storage_error();
        assert!(out.stderr.contains(&status.to_string()), "{out:#?}");
        assert_eq!(outbox(&lab), before, "{status}: nothing marked");
    }
}

#[test]
fn an_item_the_consumer_cannot_read_is_quarantined_and_the_rest_sent_again() {
    let lab = lab_with(&["A", "B"]);
    // The first answer refuses item 0 of the round; the second takes the rest.
    let url = canned_sequence(vec![
        (400, r#"{"error":"unknown field","index":0}"#.to_owned()),
        (200, String::new()),
    ]);
    let report = relay_to(&lab, &url, &[]).json();
    assert_eq!(report["refused_total"], json!(1), "{report}");
    assert_eq!(
        report["refused"][0]["reason"],
        json!("rejected_by_consumer")
    );
    assert_eq!(report["deliveries_total"], json!(1), "{report}");
    let refused = report["refused"][0]["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let rows = outbox(&lab);
    let r = row(&rows, "event_id", &refused);
    assert_eq!(r["quarantined"], json!(true), "{r}");
    assert!(r["quarantine_reason"]
        .as_str()
        .is_some_and(|q| q.starts_with("rejected_by_consumer")));
}

#[test]
fn follow_delivers_what_is_appended_later_and_stops_cleanly_on_sigterm() {
    let lab = lab_with(&["A"]);
    let serve = Serve::start(&lab.c, &[]);
    let mut follow = relay_follow(&lab, &["--to", &serve.url()]);
    let lines = line_reader(follow.stdout.take().unwrap());
    let first: Value = next_line(&lines);
    assert_eq!(first["round"], json!(1));
    assert_eq!(first["accepted"], json!(1), "{first}");
    lab.advance("B", 0, "reserved", Some(2));
    let second: Value = next_line(&lines);
    assert_eq!(second["round"], json!(2));
    assert_eq!(second["delivered"], json!(1), "{second}");
    assert_eq!(
        keys(&second),
        [
            "accepted",
            "conflict",
            "delivered",
            "duplicate",
            "refused",
            "rewound",
            "round",
            "transient_errors"
        ]
    );
    terminate(&mut follow);
    assert_eq!(inbox_ids(&lab), ["A-1", "B-1"]);
}

#[test]
fn follow_to_a_consumer_file_delivers_and_stops_on_sigint() {
    let lab = lab_with(&["A", "B"]);
    let mut follow = relay_follow(&lab, &["--consumer", &lab.c]);
    let lines = line_reader(follow.stdout.take().unwrap());
    let first: Value = next_line(&lines);
    assert_eq!(first["accepted"], json!(2), "{first}");
    lab.advance("A", 1, "confirmed", None);
    let second: Value = next_line(&lines);
    assert_eq!(second["accepted"], json!(1), "{second}");
    signal(&mut follow, "-INT");
    assert_eq!(inbox_ids(&lab), ["A-1", "A-2", "B-1"]);
}

#[test]
fn apply_follow_applies_what_arrives_and_serves_metrics() {
    let lab = lab_with(&["A"]);
    lab.relay(&[]);
    let mut follow = Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(["apply", "--follow", "--json", "--consumer", &lab.c])
        .args(["--metrics-listen", "127.0.0.1:0", "--log-format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ordo starts");
    let logs = line_reader(follow.stderr.take().unwrap());
    let lines = line_reader(follow.stdout.take().unwrap());
    let first: Value = next_line(&lines);
    assert_eq!(first, json!({"round": 1, "applied": 1, "blocked": 0}));
    let addr = loop {
        let log: Value = next_line(&logs);
        if log["fields"]["message"] == json!("serving metrics") {
            break log["fields"]["addr"].as_str().unwrap().to_owned();
        }
    };
    // The gauges are read from the store every second.
    let started = Instant::now();
    let exposition = loop {
        let exposition = http_get(&addr, "/metrics");
        if exposition.contains("ordo_inbox_pending{producer=\"default\"} 0")
            || started.elapsed() > PATIENCE
        {
            break exposition;
        }
        thread::sleep(Duration::from_millis(100));
    };
    for sample in [
        "ordo_apply_applied_total 1",
        "ordo_inbox_pending{producer=\"default\"} 0",
        "ordo_inbox_blocked{producer=\"default\"} 0",
        "ordo_inbox_gap_flows{producer=\"default\"} 0",
        "ordo_apply_lag_seconds_count 1",
        "ordo_apply_blocked_total{reason=\"invalid_transition\"} 0",
    ] {
        assert!(exposition.contains(sample), "{sample} in {exposition}");
    }
    terminate(&mut follow);
    let projection = lab.snapshot()["consumer"]["projection"].clone();
    assert_eq!(projection[0]["applied_seq"], json!(1), "{projection}");
}

#[test]
fn relay_over_https_trusts_the_given_ca_and_refuses_an_unknown_one() {
    let lab = lab_with(&["A"]);
    let SelfSigned { cert, key, .. } = SelfSigned::new(&lab);
    let serve = Serve::start(&lab.c, &["--tls-cert", &cert, "--tls-key", &key]);
    let url = format!("https://{}", serve.addr);
    let untrusted = relay_to(&lab, &url, &[]);
    untrusted.storage_error();
    assert!(untrusted.stderr.contains("certificate"), "{untrusted:#?}");
    assert_eq!(outbox(&lab)[0]["attempts"], json!(0), "nothing recorded");
    let trusted = relay_to(&lab, &url, &["--tls-ca", &cert]).json();
    assert_eq!(receipts(&trusted), [("A-1".into(), "accepted".into())]);
}

#[test]
fn follow_modes_never_create_a_missing_store() {
    let lab = Lab::new();
    let missing = lab.path("missing.db");
    run(&["apply", "--follow", "--consumer", &missing]).usage("missing.db");
    run(&[
        "relay",
        "--follow",
        "--producer",
        &missing,
        "--to",
        "http://127.0.0.1:9",
    ])
    .usage("missing.db");
    run(&[
        "relay",
        "--producer",
        &missing,
        "--to",
        "http://127.0.0.1:9",
    ])
    .usage("missing.db");
    assert!(!Path::new(&missing).exists());
}

/// A producer store named `orders` (every envelope it appends names it)
/// with one reserved flow per name of `flows`.
fn named_lab(flows: &[&str]) -> Lab {
    let lab = Lab::new();
    let init = lab.run(&["init", "--producer", &lab.p, "--producer-name", "orders"]);
    assert_eq!(init.code, 0, "{init:#?}");
    for flow in flows {
        lab.advance(flow, 0, "reserved", Some(3));
    }
    lab
}

#[track_caller]
fn assert_version_skew(out: &Out) {
    out.storage_error();
    for said in [
        "version skew",
        "earlier release",
        "upgrade consumers before naming a producer or using headers",
    ] {
        assert!(out.stderr.contains(said), "{said:?} in {out:#?}");
    }
}

/// Envelopes that name a producer never go to a consumer of an earlier
/// release (PROTOCOL.md section 12): the relay asks its health, finds no
/// `ordo-store-id`, and stops with exit 1 as a version skew, sending
/// nothing, marking, recording and quarantining nothing; `--follow` too.
#[test]
fn a_named_producer_stops_at_a_consumer_of_an_earlier_release() {
    let lab = named_lab(&["A", "B"]);
    let (url, seen) = earlier_release();
    let before = outbox(&lab);
    assert_version_skew(&relay_to(&lab, &url, &[]));
    assert_version_skew(&relay_to(&lab, &url, &["--event", "A-1"]));
    let mut follow = relay_follow(&lab, &["--to", &url]);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = follow.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < PATIENCE, "relay --follow went on");
        thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(1), "relay --follow");
    let lines: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.line.clone())
        .collect();
    assert_eq!(lines, ["GET /v1/health"; 3], "no POST arrived");
    assert_eq!(outbox(&lab), before, "nothing marked or recorded");
    assert_backlog(&lab, 2, 0);
}

/// Rounds without a producer's name or headers still go to a consumer of
/// an earlier release, unprobed; each POST names the producer store in
/// `ordo-store-id`, as `status` reports it.
#[test]
fn a_default_producer_still_delivers_to_a_consumer_of_an_earlier_release() {
    let lab = lab_with(&["A", "B"]);
    let (url, seen) = earlier_release();
    let report = relay_to(&lab, &url, &[]).json();
    let mut got = receipts(&report);
    got.sort();
    assert_eq!(
        got,
        [
            ("A-1".into(), "accepted".into()),
            ("B-1".into(), "accepted".into())
        ]
    );
    let store_id = producer_status(&lab)["store_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty());
    for request in seen.iter() {
        assert_eq!(request.line, "POST /v1/events", "{request:?}");
        assert_eq!(request.header("ordo-store-id"), Some(store_id.as_str()));
    }
    let rows = outbox(&lab);
    assert!(rows
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["accepted"] == json!(true)));
}

/// A named producer delivers to `ordo serve` of this release, whose
/// answers name its store.
#[test]
fn a_named_producer_delivers_to_a_consumer_of_this_release() {
    let lab = named_lab(&["A"]);
    let init = lab.run(&["init", "--consumer", &lab.c]);
    assert_eq!(init.code, 0, "{init:#?}");
    let serve = Serve::start(&lab.c, &[]);
    let report = relay_to(&lab, &serve.url(), &[]).json();
    assert_eq!(receipts(&report), [("A-1".into(), "accepted".into())]);
    let inbox = lab
        .run(&["inbox", "list", "--json", "--consumer", &lab.c])
        .json();
    assert_eq!(inbox["inbox"][0]["producer"], json!("orders"), "{inbox}");
}

// ---------------------------------------------------------------- helpers

fn write_key_file(dir: &Path, name: &str, key_id: &str, secret_hex: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("{key_id} {secret_hex}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.display().to_string()
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A server answering every request with `status`, `headers` and `body`.
fn canned(status: u16, headers: &[(&str, &str)], body: &str) -> String {
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let answer = (status, body.to_owned(), extra);
    serve_answers(move |_| answer.clone())
}

/// A server answering the n-th request with the n-th (status, body), the
/// last one repeated; a 200 with an empty body answers `accepted` for every
/// envelope of the request.
fn canned_sequence(answers: Vec<(u16, String)>) -> String {
    serve_answers(move |(n, request): (usize, Request)| {
        let (status, body) = answers[n.min(answers.len() - 1)].clone();
        let body = if status == 200 && body.is_empty() {
            accept_all(&request.body)
        } else {
            body
        };
        (status, body, String::new())
    })
}

/// A 200's body answering `accepted` for every envelope of `request`, as
/// a consumer of any release does.
fn accept_all(request: &Value) -> String {
    let receipts: Vec<Value> = request
        .as_array()
        .unwrap()
        .iter()
        .map(|e| json!({"event_id": e["event_id"], "flow_id": e["flow_id"], "seq": e["seq"], "receipt": "accepted"}))
        .collect();
    json!({ "receipts": receipts }).to_string()
}

/// One request a test's server read.
#[derive(Debug, Clone)]
struct Request {
    /// `METHOD PATH`.
    line: String,
    /// The head's header lines, names lowercased.
    headers: Vec<(String, String)>,
    /// The body as JSON (`Null` when there is none).
    body: Value,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A consumer of an earlier release, as far as the relay can see: `GET
/// /v1/health` answers 200, every POST takes each envelope (`accepted`),
/// and no answer names the store in `ordo-store-id`. Every request it
/// read is in the list, in order.
fn earlier_release() -> (String, Arc<Mutex<Vec<Request>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let url = serve_answers(move |(_, request): (usize, Request)| {
        log.lock().unwrap().push(request.clone());
        match request.line.as_str() {
            "GET /v1/health" => (200, json!({"status": "ok"}).to_string(), String::new()),
            "POST /v1/events" => (200, accept_all(&request.body), String::new()),
            _ => (
                404,
                json!({"error": "no such route"}).to_string(),
                String::new(),
            ),
        }
    });
    (url, seen)
}

fn serve_answers(
    mut answer: impl FnMut((usize, Request)) -> (u16, String, String) + Send + 'static,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    thread::spawn(move || {
        for (n, stream) in listener.incoming().enumerate() {
            let Ok(mut stream) = stream else { return };
            let request = read_request(&mut stream);
            let (status, body, extra) = answer((n, request));
            let response = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes());
        }
    });
    url
}

fn read_request(stream: &mut std::net::TcpStream) -> Request {
    let mut reader = BufReader::new(stream);
    let mut first = String::new();
    let _ = reader.read_line(&mut first);
    let line: Vec<&str> = first.split_whitespace().take(2).collect();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    let length = headers
        .iter()
        .find(|(name, _)| name == "content-length")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0usize);
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
    Request {
        line: line.join(" "),
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    }
}

#[track_caller]
fn next_line(lines: &mpsc::Receiver<String>) -> Value {
    let line = lines
        .recv_timeout(PATIENCE)
        .expect("a round line within the patience");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
}

/// SIGTERM, then the exit status must be 0 within the patience.
fn terminate(child: &mut Child) {
    signal(child, "-TERM");
}

/// Sends `signal` (`-TERM`, `-INT`); the exit status must then be 0 within
/// the patience.
fn signal(child: &mut Child, signal: &str) {
    let pid = child.id().to_string();
    let killed = Command::new("kill").args([signal, &pid]).status().unwrap();
    assert!(killed.success());
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0), "exit after {signal}");
            return;
        }
        assert!(started.elapsed() < PATIENCE, "no exit after {signal}");
        thread::sleep(Duration::from_millis(20));
    }
}
