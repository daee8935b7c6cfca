//! `ordo serve` as a real process: every answer of HTTP.md that can fail,
//! over real sockets, with the consumer store checked through the CLI.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{envelope, reservation, run, Lab, SelfSigned};
use ordo_http::KeyRing;
use serde_json::{json, Value};

const SECRET_OLD: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const SECRET_NEW: &str = "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff000102030405060708090a0b0c0d0e0f";

/// A running `ordo serve`; killed when dropped.
struct Served {
    child: Child,
    addr: String,
    stderr: Arc<Mutex<String>>,
}

impl Served {
    /// Starts `ordo serve --consumer C --listen 127.0.0.1:0 EXTRA` and
    /// reads the address from its first stdout line.
    fn start(consumer: &str, extra: &[&str]) -> Served {
        Served::start_on(consumer, "127.0.0.1:0", extra)
    }

    fn start_on(consumer: &str, listen: &str, extra: &[&str]) -> Served {
        let (child, addr, stderr) = common::spawn_listening(
            Command::new(env!("CARGO_BIN_EXE_ordo"))
                .args(["serve", "--consumer", consumer, "--listen", listen])
                .args(extra)
                .env("RUST_LOG", "info"),
        );
        Served {
            child,
            addr,
            stderr,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn signal(&self, signal: i32) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid");
        // SAFETY: kill(2) on the pid of our own child.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }

    /// Sends `signal` and waits for the exit: (status code, stdout rest, stderr).
    fn stop_with(mut self, signal: i32) -> (i32, String, String) {
        self.signal(signal);
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait works") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "serve did not exit after the signal"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut rest = String::new();
        if let Some(mut stdout) = self.child.stdout.take() {
            let _ = stdout.read_to_string(&mut rest);
        }
        std::thread::sleep(Duration::from_millis(50));
        let stderr = self.stderr.lock().unwrap().clone();
        (status.code().unwrap_or(-1), rest, stderr)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let status = self.child.wait();
        if std::thread::panicking() {
            std::thread::sleep(Duration::from_millis(50));
            eprintln!(
                "serve on {} ended with {status:?}; its stderr:\n{}",
                self.addr,
                self.stderr.lock().unwrap()
            );
        }
    }
}

/// An answer: status, `Retry-After`, body as JSON (`Null` if not JSON).
#[derive(Debug)]
struct Answer {
    status: u16,
    retry_after: Option<String>,
    store_id: Option<String>,
    content_type: String,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    /// Asserts `status` and a JSON `{"error": ...}` body (with `index` only
    /// when given).
    #[track_caller]
    fn refused(&self, status: u16, index: Option<u64>) {
        assert_eq!(self.status, status, "{self:?}");
        let body = self.json();
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{self:?}"
        );
        assert_eq!(body.get("index").and_then(Value::as_u64), index, "{self:?}");
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into()
}

fn answer(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Answer {
    let mut response = response.expect("the server answers");
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let retry_after = header("retry-after");
    let store_id = header("ordo-store-id");
    let content_type = header("content-type").unwrap_or_default();
    Answer {
        status: response.status().as_u16(),
        retry_after,
        store_id,
        content_type,
        text: response.body_mut().read_to_string().expect("a text body"),
    }
}

fn get(url: &str) -> Answer {
    answer(agent().get(url).call())
}

/// POSTs `body` as JSON with extra headers.
fn post_with(url: &str, headers: &[(&str, String)], body: &[u8]) -> Answer {
    let mut request = agent().post(url).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    answer(request.send(body))
}

fn post(url: &str, body: &str) -> Answer {
    post_with(url, &[], body.as_bytes())
}

/// The receipts of a 200, as `(event_id, receipt)`, each checked to carry
/// exactly the keys of HTTP.md (a conflict's with its cause and held
/// event), producer `default`.
fn receipts(answer: &Answer) -> Vec<(String, String)> {
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.json()["receipts"]
        .as_array()
        .expect("receipts")
        .iter()
        .map(|r| {
            let mut keys = vec!["event_id", "flow_id", "producer", "receipt", "seq"];
            if r["receipt"] == "conflict" {
                keys.extend(["cause", "held_event_id"]);
            }
            assert_eq!(
                common::sorted(&common::keys(r)),
                common::sorted(&keys),
                "{r}"
            );
            assert_eq!(r["producer"], "default", "{r}");
            (
                r["event_id"].as_str().unwrap().to_owned(),
                r["receipt"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The consumer's inbox event ids, through the CLI.
fn inbox_ids(consumer: &str) -> Vec<String> {
    let out = run(&["--json", "inbox", "list", "--consumer", consumer]);
    out.json()["inbox"]
        .as_array()
        .expect("inbox rows")
        .iter()
        .map(|row| row["event_id"].as_str().unwrap().to_owned())
        .collect()
}

fn lab() -> Lab {
    let lab = Lab::new();
    run(&["init", "--consumer", &lab.c]).json_or_text();
    lab
}

/// `ordo serve EXTRA` on a fresh consumer: the lab, then the server.
fn serving(extra: &[&str]) -> (Lab, Served) {
    let lab = lab();
    let served = Served::start(&lab.c, extra);
    (lab, served)
}

trait Ran {
    fn json_or_text(&self);
}

impl Ran for common::Out {
    #[track_caller]
    fn json_or_text(&self) {
        assert_eq!(self.code, 0, "{self:#?}");
    }
}

fn array(items: &[String]) -> String {
    format!("[{}]", items.join(","))
}

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A key file readable by its owner only.
fn key_file(dir: &Path, name: &str, text: &str, mode: u32) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path.display().to_string()
}

fn signed(
    ring: &KeyRing,
    key_id: &str,
    timestamp_s: i64,
    body: &[u8],
) -> Vec<(&'static str, String)> {
    ordo_http::signature_headers(ring, key_id, timestamp_s, "POST", "/v1/events", body)
        .expect("a known key id")
        .into_iter()
        .collect()
}

/// Sends raw bytes and reads until the server closes or `wait` passes.
fn raw(addr: &str, request: &[u8], wait: Duration) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(wait)).unwrap();
    stream.write_all(request).unwrap();
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    String::from_utf8_lossy(&reply).into_owned()
}

#[test]
fn receipts_come_in_input_order_with_duplicates_and_conflicts() {
    let (lab, served) = serving(&[]);
    let url = served.url("/v1/events");
    let one = post(&url, &reservation("a", 1, "reserved", 3));
    assert_eq!(receipts(&one), [("a-1".into(), "accepted".into())]);
    assert_eq!(one.json()["receipts"][0]["seq"], 1);
    assert_eq!(one.json()["receipts"][0]["flow_id"], "a");
    let batch = array(&[
        reservation("b", 1, "reserved", 3),
        reservation("a", 1, "reserved", 3),
        reservation("a", 1, "reserved", 4),
        reservation("b", 2, "confirmed", 3),
    ]);
    let answered = receipts(&post(&url, &batch));
    let expected = [
        ("b-1", "accepted"),
        ("a-1", "duplicate"),
        ("a-1", "conflict"),
        ("b-2", "accepted"),
    ];
    assert_eq!(
        answered,
        expected.map(|(e, r)| (e.to_owned(), r.to_owned()))
    );
    assert_eq!(inbox_ids(&lab.c), ["a-1", "b-1", "b-2"]);
}

/// A conflict names its cause and the held event; nothing of its flow
/// after it in the same request is stored (`after_conflict`, no held
/// event); other flows go on. Every 200 names the consumer store in
/// `ordo-store-id`, as `status` reports it.
#[test]
fn a_conflict_names_the_held_event_and_stops_its_flow_for_the_request() {
    let (lab, served) = serving(&[]);
    let url = served.url("/v1/events");
    let held = envelope("held", "a", 1, 1, "reserved", json!({"amount": 3}));
    let first = post(&url, &held);
    assert_eq!(receipts(&first), [("held".into(), "accepted".into())]);
    let batch = array(&[
        reservation("a", 1, "reserved", 3),
        reservation("b", 1, "reserved", 3),
        reservation("a", 2, "confirmed", 3),
    ]);
    let answer = post(&url, &batch);
    let listed = answer.json()["receipts"].clone();
    let cause_and_held = |i: usize| {
        (
            listed[i]["cause"].clone(),
            listed[i]["held_event_id"].clone(),
        )
    };
    assert_eq!(receipts(&answer)[1], ("b-1".into(), "accepted".into()));
    assert_eq!(cause_and_held(0), ("conflict".into(), "held".into()));
    assert_eq!(cause_and_held(2), ("after_conflict".into(), Value::Null));
    assert_eq!(inbox_ids(&lab.c), ["held", "b-1"]);
    let status = run(&["status", "--json", "--consumer", &lab.c]).json();
    let store_id = status["consumer"]["store_id"]
        .as_str()
        .expect("a store id")
        .to_owned();
    assert_eq!(store_id.len(), 32, "{status}");
    for answered in [&first, &answer] {
        assert_eq!(answered.store_id.as_deref(), Some(store_id.as_str()));
    }
}

/// The consumer store's identity, as `status --json` reports it.
fn consumer_store_id(consumer: &str) -> String {
    let status = run(&["status", "--json", "--consumer", consumer]).json();
    let store_id = status["consumer"]["store_id"]
        .as_str()
        .expect("a store id")
        .to_owned();
    assert_eq!(store_id.len(), 32, "{status}");
    store_id
}

/// Every answer, of every route and status, early or not, names the
/// consumer store in `ordo-store-id`, as `status` reports it.
#[test]
fn every_answer_names_the_consumer_store() {
    let lab = lab();
    let keys = key_file(lab.dir.path(), "keys", &format!("k1 {SECRET_OLD}\n"), 0o600);
    let flags = [
        "--keys",
        &keys,
        "--max-batch",
        "1",
        "--busy-timeout-ms",
        "200",
    ];
    let served = Served::start(&lab.c, &flags);
    let store_id = consumer_store_id(&lab.c);
    let url = served.url("/v1/events");
    let ring = KeyRing::parse(&format!("k1 {SECRET_OLD}"), Path::new("test")).unwrap();
    let signed_post = |body: &str| {
        let bytes = body.as_bytes();
        post_with(&url, &signed(&ring, "k1", now_s(), bytes), bytes)
    };
    let body = reservation("a", 1, "reserved", 3);
    let two = array(&[body.clone(), reservation("b", 1, "reserved", 3)]);
    let text_plain = agent().post(&url).header("content-type", "text/plain");
    let answers = [
        (200, signed_post(&body)),
        (400, signed_post("nope")),
        (401, post(&url, &body)),
        (404, get(&served.url("/nope"))),
        (405, get(&url)),
        (413, signed_post(&two)),
        (415, answer(text_plain.send(&body))),
        (200, get(&served.url("/v1/health"))),
        (200, get(&served.url("/v1/ready"))),
        (200, get(&served.url("/metrics"))),
    ];
    for (status, answered) in &answers {
        assert_eq!(answered.status, *status, "{answered:?}");
        assert_eq!(
            answered.store_id.as_deref(),
            Some(store_id.as_str()),
            "{answered:?}"
        );
    }
    let lock = ordo_sqlite::rusqlite::Connection::open(&lab.c).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let busy = signed_post(&reservation("c", 1, "reserved", 3));
    busy.refused(503, None);
    assert_eq!(busy.store_id.as_deref(), Some(store_id.as_str()));
    lock.execute_batch("ROLLBACK").unwrap();
    // 8 MiB + 1 by Content-Length: answered before any body byte is read.
    let head = format!(
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        8 * 1024 * 1024 + 1
    );
    let reply = raw(&served.addr, head.as_bytes(), Duration::from_secs(5));
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(
        reply
            .to_ascii_lowercase()
            .contains(&format!("\r\nordo-store-id: {store_id}\r\n")),
        "{reply}"
    );
    assert_eq!(inbox_ids(&lab.c), ["a-1"]);
}

/// The request's `ordo-store-id` is the sender's identity: checked with
/// the parsing (after the content type and the signature, before the
/// body), a malformed one a 400 storing nothing, and not signed.
#[test]
fn a_malformed_sender_store_id_answers_400_and_stores_nothing() {
    let lab = lab();
    let keys = key_file(lab.dir.path(), "keys", &format!("k1 {SECRET_OLD}\n"), 0o600);
    let served = Served::start(&lab.c, &["--keys", &keys]);
    let url = served.url("/v1/events");
    let ring = KeyRing::parse(&format!("k1 {SECRET_OLD}"), Path::new("test")).unwrap();
    let sent = |store_ids: &[&str], body: &str| {
        let bytes = body.as_bytes();
        let mut headers = signed(&ring, "k1", now_s(), bytes);
        headers.extend(
            store_ids
                .iter()
                .map(|id| ("ordo-store-id", (*id).to_owned())),
        );
        post_with(&url, &headers, bytes)
    };
    let body = reservation("a", 1, "reserved", 3);
    let good = "0123456789abcdef0123456789abcdef";
    let bad_item = array(&[body.clone(), "7".to_owned()]);
    for bad in [
        "",
        "xyz",
        "0123456789ABCDEF0123456789ABCDEF",
        &good[1..],
        &format!("{good}0"),
        "0123456789abcdef0123456789abcdeg",
    ] {
        let refused = sent(&[bad], &body);
        refused.refused(400, None);
        assert!(
            refused.json()["error"]
                .as_str()
                .unwrap()
                .contains("ordo-store-id"),
            "{refused:?}"
        );
        // Before the body: a malformed item is not what is answered.
        sent(&[bad], &bad_item).refused(400, None);
    }
    sent(&[good, good], &body).refused(400, None);
    // The content type and the signature are checked first.
    let unsigned = [("ordo-store-id", "xyz".to_owned())];
    post_with(&url, &unsigned, body.as_bytes()).refused(401, None);
    let mut text_plain = signed(&ring, "k1", now_s(), body.as_bytes());
    text_plain.push(("ordo-store-id", "xyz".to_owned()));
    let mut request = agent().post(&url).header("content-type", "text/plain");
    for (name, value) in &text_plain {
        request = request.header(*name, value);
    }
    answer(request.send(&body)).refused(415, None);
    assert!(inbox_ids(&lab.c).is_empty(), "nothing stored");
    // Well formed, or missing (unknown): stored; the signature does not
    // cover it.
    assert_eq!(receipts(&sent(&[good], &body))[0].1, "accepted");
    let other = reservation("b", 1, "reserved", 3);
    assert_eq!(receipts(&sent(&[], &other))[0].1, "accepted");
    assert_eq!(inbox_ids(&lab.c), ["a-1", "b-1"]);
}

#[test]
fn malformed_bodies_answer_400_and_store_nothing() {
    let (lab, served) = serving(&[]);
    let url = served.url("/v1/events");
    let valid = reservation("a", 1, "reserved", 3);
    for body in ["nope", "5", "\"x\"", "[]", "{\"event_id\":\"a-1\"}", "[1,"] {
        post(&url, body).refused(400, None);
    }
    let repeated = valid.replacen("{", "{\"seq\":1,", 1);
    for (bad, index) in [("7", 1), ("{}", 1), (repeated.as_str(), 1)] {
        post(&url, &format!("[{valid},{bad}]")).refused(400, Some(index));
    }
    post(&url, &format!("[{bad},{valid}]", bad = "null")).refused(400, Some(0));
    assert!(inbox_ids(&lab.c).is_empty());
}

#[test]
fn too_many_items_or_bytes_answer_413() {
    let (lab, served) = serving(&["--max-batch", "2"]);
    let url = served.url("/v1/events");
    let three: Vec<String> = (1..=3)
        .map(|s| reservation("a", s, "reserved", 3))
        .collect();
    post(&url, &array(&three)).refused(413, None);
    assert_eq!(receipts(&post(&url, &array(&three[..2]))).len(), 2);
    // 8 MiB + 1 by Content-Length: refused before any body byte is read.
    let head = format!(
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        8 * 1024 * 1024 + 1
    );
    let reply = raw(&served.addr, head.as_bytes(), Duration::from_secs(5));
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    // Too many bytes found while reading a chunked body.
    let small = Served::start(&lab.c, &["--max-body-bytes", "100"]);
    let chunk = "x".repeat(101);
    let request = format!(
        "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len()
    );
    let reply = raw(&small.addr, request.as_bytes(), Duration::from_secs(5));
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert_eq!(inbox_ids(&lab.c), ["a-1", "a-2"]);
}

#[test]
fn a_wrong_or_missing_content_type_answers_415() {
    let (_lab, served) = serving(&[]);
    let url = served.url("/v1/events");
    let body = reservation("a", 1, "reserved", 3);
    answer(
        agent()
            .post(&url)
            .header("content-type", "text/plain")
            .send(&body),
    )
    .refused(415, None);
    answer(agent().post(&url).send(&body)).refused(415, None);
    let with_charset = answer(
        agent()
            .post(&url)
            .header("content-type", "application/json; charset=utf-8")
            .send(&body),
    );
    assert_eq!(receipts(&with_charset).len(), 1);
}

#[test]
fn signatures_are_checked_and_rotation_accepts_either_secret() {
    let lab = lab();
    let keys = key_file(
        lab.dir.path(),
        "keys",
        &format!("# rotation\nk1 {SECRET_OLD}\nk1 {SECRET_NEW}\n"),
        0o600,
    );
    let served = Served::start(&lab.c, &["--keys", &keys]);
    let url = served.url("/v1/events");
    let parse = |text: String| KeyRing::parse(&text, Path::new("test")).unwrap();
    let old = parse(format!("k1 {SECRET_OLD}"));
    let new = parse(format!("k1 {SECRET_NEW}"));
    let stranger = parse(format!("k1 {}", "ab".repeat(32)));
    let unknown = parse(format!("k9 {SECRET_OLD}"));
    let body = reservation("a", 1, "reserved", 3);
    let bytes = body.as_bytes();
    post(&url, &body).refused(401, None);
    post_with(&url, &signed(&old, "k1", now_s() - 301, bytes), bytes).refused(401, None);
    post_with(&url, &signed(&stranger, "k1", now_s(), bytes), bytes).refused(401, None);
    post_with(&url, &signed(&unknown, "k9", now_s(), bytes), bytes).refused(401, None);
    let other = reservation("b", 1, "reserved", 3);
    post_with(&url, &signed(&old, "k1", now_s(), other.as_bytes()), bytes).refused(401, None);
    assert!(inbox_ids(&lab.c).is_empty());
    let headers = signed(&old, "k1", now_s(), bytes);
    assert_eq!(receipts(&post_with(&url, &headers, bytes))[0].1, "accepted");
    // A replay inside the window is harmless.
    assert_eq!(
        receipts(&post_with(&url, &headers, bytes))[0].1,
        "duplicate"
    );
    let second = reservation("a", 2, "confirmed", 3);
    let headers = signed(&new, "k1", now_s(), second.as_bytes());
    assert_eq!(
        receipts(&post_with(&url, &headers, second.as_bytes()))[0].1,
        "accepted"
    );
    // Health, readiness and metrics need no signature.
    assert_eq!(get(&served.url("/v1/health")).status, 200);
    assert_eq!(get(&served.url("/metrics")).status, 200);
}

#[test]
fn key_files_readable_by_others_or_malformed_are_refused() {
    let lab = lab();
    let open = key_file(lab.dir.path(), "open", &format!("k1 {SECRET_OLD}\n"), 0o644);
    let addr = ["--listen", "127.0.0.1:0", "--consumer", &lab.c];
    let out = run(&[&["serve", "--keys", &open][..], &addr].concat());
    out.usage("0644");
    assert!(out.stderr.contains("open"), "{out:?}");
    let short = key_file(lab.dir.path(), "short", "\nk1 0011\n", 0o600);
    run(&[&["serve", "--keys", &short][..], &addr].concat()).usage("line 2");
}

#[test]
fn a_store_locked_past_its_timeout_answers_503_then_recovers() {
    let (lab, served) = serving(&["--busy-timeout-ms", "200"]);
    let url = served.url("/v1/events");
    let body = reservation("a", 1, "reserved", 3);
    let lock = ordo_sqlite::rusqlite::Connection::open(&lab.c).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let busy = post(&url, &body);
    busy.refused(503, None);
    let retry_after: u64 = busy.retry_after.as_deref().unwrap().parse().unwrap();
    assert!(retry_after >= 1);
    lock.execute_batch("ROLLBACK").unwrap();
    assert_eq!(receipts(&post(&url, &body))[0].1, "accepted");
}

#[test]
fn requests_past_the_bound_in_flight_answer_503() {
    let lab = lab();
    let served = Served::start(
        &lab.c,
        &["--busy-timeout-ms", "3000", "--max-in-flight", "1"],
    );
    let url = served.url("/v1/events");
    let lock = ordo_sqlite::rusqlite::Connection::open(&lab.c).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let first_url = url.clone();
    let first = std::thread::spawn(move || post(&first_url, &reservation("a", 1, "reserved", 3)));
    std::thread::sleep(Duration::from_millis(500));
    let second = post(&url, &reservation("b", 1, "reserved", 3));
    second.refused(503, None);
    assert!(second.retry_after.is_some());
    // A malformed sender's identity is a parsing error: 400 before 503.
    let malformed = [("ordo-store-id", "xyz".to_owned())];
    let body = reservation("b", 1, "reserved", 3);
    post_with(&url, &malformed, body.as_bytes()).refused(400, None);
    lock.execute_batch("ROLLBACK").unwrap();
    assert_eq!(receipts(&first.join().unwrap())[0].1, "accepted");
    assert_eq!(inbox_ids(&lab.c), ["a-1"]);
}

#[test]
fn unknown_routes_and_methods_answer_json_404_and_405() {
    let (_lab, served) = serving(&[]);
    get(&served.url("/nope")).refused(404, None);
    get(&served.url("/v1/events")).refused(405, None);
    answer(agent().delete(&served.url("/v1/health")).call()).refused(405, None);
    let health = get(&served.url("/v1/health"));
    assert_eq!(
        (health.status, health.json()),
        (200, json!({"status": "ok"}))
    );
    let ready = get(&served.url("/v1/ready"));
    assert_eq!(
        (ready.status, ready.json()),
        (200, json!({"status": "ready"}))
    );
}

#[test]
fn metrics_expose_every_name_of_the_contract() {
    let (lab, served) = serving(&["--apply"]);
    let url = served.url("/v1/events");
    let batch = array(&[
        reservation("a", 1, "reserved", 3),
        reservation("a", 2, "confirmed", 3),
    ]);
    assert_eq!(receipts(&post(&url, &batch)).len(), 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let scraped = get(&served.url("/metrics"));
        assert!(
            scraped.content_type.contains("version=0.0.4"),
            "{scraped:?}"
        );
        // The gauges are read at the scrape, the counter moves at the
        // apply's commit: wait for both to show it.
        let settled = scraped.text.contains("ordo_apply_applied_total 2")
            && scraped
                .text
                .contains("ordo_inbox_pending{producer=\"default\"} 0");
        if settled || Instant::now() > deadline {
            break scraped.text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for name in [
        "ordo_inbox_received_total{producer=\"default\",receipt=\"accepted\"} 2",
        "ordo_http_requests_total{status=\"200\"}",
        "ordo_http_request_seconds_bucket",
        "ordo_inbox_pending{producer=\"default\"} 0",
        "ordo_inbox_blocked{producer=\"default\"} 0",
        "ordo_inbox_gap_flows{producer=\"default\"} 0",
        "ordo_apply_applied_total 2",
        "ordo_apply_blocked_total{reason=",
        "ordo_apply_lag_seconds_count 2",
    ] {
        assert!(text.lines().any(|l| l.starts_with(name)), "{name}:\n{text}");
    }
    // The outbox and relay metrics are relay --follow's, by destination.
    assert!(!text.contains("destination="), "{text}");
    let snapshot = run(&["--json", "snapshot", "--consumer", &lab.c]).json();
    assert_eq!(snapshot["consumer"]["projection"][0]["state"], "confirmed");
}

#[test]
fn unsigned_serving_off_loopback_needs_insecure_no_auth() {
    let lab = lab();
    run(&["serve", "--consumer", &lab.c, "--listen", "0.0.0.0:0"]).usage("--keys");
    let served = Served::start_on(&lab.c, "0.0.0.0:0", &["--insecure-no-auth"]);
    let port = served.addr.rsplit(':').next().unwrap().to_owned();
    assert_eq!(
        get(&format!("http://127.0.0.1:{port}/v1/health")).status,
        200
    );
}

#[test]
fn a_missing_store_is_never_created() {
    let lab = Lab::new();
    let out = run(&["serve", "--consumer", &lab.c, "--listen", "127.0.0.1:0"]);
    out.usage("does not exist");
    assert!(!Path::new(&lab.c).exists());
    lab.assert_no_files();
    let other = lab.path("other.db");
    run(&["init", "--consumer", &other, "--domain", "shipping"]).json_or_text();
    run(&[
        "serve",
        "--consumer",
        &other,
        "--listen",
        "127.0.0.1:0",
        "--apply",
    ])
    .usage("domain \"shipping\"");
}

#[test]
fn bad_flags_exit_2_with_one_error_line() {
    let lab = lab();
    let base = [
        "serve",
        "--consumer",
        lab.c.as_str(),
        "--listen",
        "127.0.0.1:0",
    ];
    for extra in [
        &["--max-batch", "0"][..],
        &["--max-body-bytes", "0"],
        &["--tls-cert", "cert.pem"],
        &["--log-format", "xml"],
    ] {
        run(&[&base[..], extra].concat()).usage("");
    }
    run(&["serve", "--consumer", &lab.c, "--listen", "nowhere"]).usage("--listen");
    let missing = lab.path("missing.pem");
    run(&[&base[..], &["--tls-cert", &missing, "--tls-key", &missing]].concat())
        .usage("missing.pem");
}

#[test]
fn sigterm_and_sigint_let_requests_in_flight_finish_and_exit_0() {
    let (lab, served) = serving(&["--busy-timeout-ms", "5000"]);
    let url = served.url("/v1/events");
    let lock = ordo_sqlite::rusqlite::Connection::open(&lab.c).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let in_flight = std::thread::spawn(move || post(&url, &reservation("a", 1, "reserved", 3)));
    std::thread::sleep(Duration::from_millis(500));
    served.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    lock.execute_batch("ROLLBACK").unwrap();
    assert_eq!(receipts(&in_flight.join().unwrap())[0].1, "accepted");
    let (code, rest, stderr) = served.stop_with(libc::SIGTERM);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(rest, "");
    assert!(!stderr.contains("error:"), "{stderr}");
    assert_eq!(inbox_ids(&lab.c), ["a-1"]);
    let served = Served::start(&lab.c, &["--log-format", "json"]);
    let (code, _, stderr) = served.stop_with(libc::SIGINT);
    let last = stderr.lines().last().expect("a log line");
    let logged: Value = serde_json::from_str(last).expect("JSON logs");
    assert!(logged["fields"]["message"].is_string(), "{last}");
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn json_mode_names_the_bound_address() {
    let lab = lab();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args([
            "--json",
            "serve",
            "--consumer",
            &lab.c,
            "--listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let value: Value = serde_json::from_str(&line).unwrap();
    let addr = value["listening"].as_str().unwrap();
    assert!(
        addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"),
        "{line}"
    );
}

#[test]
fn slow_clients_are_cut_off() {
    let (_lab, served) = serving(&["--read-timeout-ms", "500"]);
    // The reply to `request`, which must come well before the client's
    // own patience runs out.
    let cut_off = |request: &[u8]| {
        let started = Instant::now();
        let reply = raw(&served.addr, request, Duration::from_secs(10));
        assert!(started.elapsed() < Duration::from_secs(5), "{reply}");
        reply
    };
    // A head that never ends.
    cut_off(b"POST /v1/events HTTP/1.1\r\nHost: x\r\n");
    // A body that never comes.
    let reply = cut_off(
        b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n[",
    );
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert_eq!(get(&served.url("/v1/health")).status, 200);
}

#[test]
fn a_thousand_connections_leave_the_server_answering() {
    rlimit::increase_nofile_limit(4096).expect("the test may raise its own limit");
    let (lab, served) = serving(&[]);
    let open: Vec<TcpStream> = (0..1000)
        .map(|_| TcpStream::connect(&served.addr).expect("a connection"))
        .collect();
    let health = get(&served.url("/v1/health"));
    assert_eq!(health.status, 200);
    let stored = post(
        &served.url("/v1/events"),
        &reservation("a", 1, "reserved", 3),
    );
    assert_eq!(receipts(&stored)[0].1, "accepted");
    drop(open);
    // Past --max-connections, a connection is closed at once.
    let bounded = Served::start(&lab.c, &["--max-connections", "4"]);
    let held: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(&bounded.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let reply = raw(
        &bounded.addr,
        b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(5),
    );
    assert_eq!(reply, "");
    drop(held);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(get(&bounded.url("/v1/health")).status, 200);
}

#[test]
fn https_serves_with_a_pem_certificate() {
    use std::os::unix::fs::PermissionsExt;
    let lab = lab();
    let SelfSigned { cert, key, der } = SelfSigned::new(&lab);
    // A private key that others may read is refused.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let listen = ["--listen", "127.0.0.1:0"];
    run(&[
        &[
            "serve",
            "--consumer",
            &lab.c,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ][..],
        &listen[..],
    ]
    .concat())
    .usage("readable by group or others");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let served = Served::start(&lab.c, &["--tls-cert", &cert, "--tls-key", &key]);
    let root = ureq::tls::Certificate::from_der(&der).to_owned();
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::Specific(Arc::new(vec![root])))
        .build();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .tls_config(tls)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into();
    let url = format!("https://{}/v1/events", served.addr);
    let stored = answer(
        agent
            .post(&url)
            .header("content-type", "application/json")
            .send(&reservation("a", 1, "reserved", 3)),
    );
    assert_eq!(receipts(&stored)[0].1, "accepted");
    // Plain HTTP on the HTTPS port gets no answer.
    let reply = raw(
        &served.addr,
        b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(!reply.starts_with("HTTP/1.1 200"), "{reply}");
}
