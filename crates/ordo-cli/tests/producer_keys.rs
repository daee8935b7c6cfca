//! Keys bound to producers (HTTP.md, PROTOCOL.md section 12), as real
//! processes: key files with `producer=NAME` read by `ordo serve` and
//! `ordo relay`, the 403 of a bound key posting another producer's
//! envelope, `serve --require-producer-keys`, and the relay's checks of its
//! key against its producer store's name, on real SQLite files.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{assert_backlog, relay_to, reservation, Lab, Out, Serve};
use ordo_http::KeyRing;
use serde_json::{json, Value};

const SECRET: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const OTHER: &str = "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff000102030405060708090a0b0c0d0e0f";

/// A key file of `text` in the lab's directory, readable by its owner only.
fn key_file(lab: &Lab, name: &str, text: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = lab.path(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// A lab whose consumer store exists (empty).
fn consumer_lab() -> Lab {
    let lab = Lab::new();
    let init = lab.run(&["init", "--consumer", &lab.c]);
    assert_eq!(init.code, 0, "{init:#?}");
    lab
}

/// A lab with an empty consumer store and a producer store named `name`
/// with one reserved flow per name of `flows`.
fn named_lab(name: &str, flows: &[&str]) -> Lab {
    let lab = consumer_lab();
    let init = lab.run(&["init", "--producer", &lab.p, "--producer-name", name]);
    assert_eq!(init.code, 0, "{init:#?}");
    for flow in flows {
        lab.advance(flow, 0, "reserved", Some(3));
    }
    lab
}

/// `ordo serve ARGS` on the lab's consumer, expected to refuse to start.
fn serve_refused(lab: &Lab, extra: &[&str]) -> Out {
    let base = ["serve", "--consumer", &lab.c, "--listen", "127.0.0.1:0"];
    lab.run(&[&base[..], extra].concat())
}

/// A reservation envelope of `producer` (`None`: the default, no field).
fn envelope_of(producer: Option<&str>, flow: &str, seq: i64) -> String {
    let mut value: Value = serde_json::from_str(&reservation(flow, seq, "reserved", 3)).unwrap();
    if let Some(producer) = producer {
        value["producer"] = json!(producer);
    }
    value.to_string()
}

fn array(items: &[String]) -> String {
    format!("[{}]", items.join(","))
}

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// POSTs `body` to the server's inbox signed with `key_id`'s secrets of
/// `ring`: the status and the body as JSON.
fn post_signed(serve: &Serve, ring: &KeyRing, key_id: &str, body: &str) -> (u16, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into();
    let bytes = body.as_bytes();
    let headers = ordo_http::signature_headers(ring, key_id, now_s(), "POST", "/v1/events", bytes)
        .expect("a known key id");
    let mut request = agent
        .post(format!("{}/v1/events", serve.url()))
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let mut response = request.send(bytes).expect("the server answers");
    let text = response.body_mut().read_to_string().unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    (response.status().as_u16(), value)
}

/// Asserts a 403 `{"error": ...,"index": I}` naming the key's producer
/// (`index` 0 for a single envelope).
#[track_caller]
fn assert_forbidden((status, body): (u16, Value), index: u64) {
    assert_eq!(status, 403, "{body}");
    let error = body["error"].as_str().expect("an error message");
    assert!(
        error.contains("orders-key") && error.contains("orders"),
        "{body}"
    );
    assert_eq!(
        body.get("index").and_then(Value::as_u64),
        Some(index),
        "{body}"
    );
}

/// The consumer's inbox as `(producer, event_id)`, sorted, through the CLI
/// (a row without `producer` is the default producer's).
fn inbox(lab: &Lab) -> Vec<(String, String)> {
    let listed = lab
        .run(&["inbox", "list", "--json", "--consumer", &lab.c])
        .json();
    let mut rows: Vec<(String, String)> = listed["inbox"]
        .as_array()
        .expect("inbox rows")
        .iter()
        .map(|r| {
            let producer = r["producer"].as_str().unwrap_or("default");
            (
                producer.to_owned(),
                r["event_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    rows.sort();
    rows
}

fn outbox(lab: &Lab) -> Value {
    lab.run(&["outbox", "list", "--json", "--producer", &lab.p])
        .json()["outbox"]
        .clone()
}

#[test]
fn key_file_lines_binding_a_key_otherwise_or_malformed_stop_serve() {
    let lab = consumer_lab();
    let cases = [
        (
            format!("k1 {SECRET} producer=orders\n# rotation\nk1 {OTHER} producer=billing\n"),
            "line 3",
            "key id k1 is bound to producer billing here but to producer orders on line 1",
        ),
        (
            format!("k1 {SECRET} producer=orders\nk1 {OTHER}\n"),
            "line 2",
            "key id k1 is bound to no producer here but to producer orders on line 1",
        ),
        (
            format!("k1 {SECRET} producer=Orders\n"),
            "line 1",
            "a producer name must match",
        ),
        (
            format!("k0 {OTHER}\nk1 {SECRET} owner=orders\n"),
            "line 2",
            "producer=NAME",
        ),
        (
            format!("k1 {SECRET} producer=orders {OTHER}\n"),
            "line 1",
            "more than three fields",
        ),
    ];
    for (text, line, rule) in cases {
        let keys = key_file(&lab, "keys", &text);
        let out = serve_refused(&lab, &["--keys", &keys]);
        out.usage(line);
        assert!(out.stderr.contains(rule), "{rule:?} in {out:#?}");
        assert!(out.stderr.contains(&keys), "the file is named: {out:#?}");
        assert!(!out.stderr.contains(OTHER), "no secret shown: {out:#?}");
        // The relay reads key files with the same parser.
        let relayed = relay_to(
            &lab,
            "http://127.0.0.1:9",
            &["--key-id", "k1", "--key-file", &keys],
        );
        relayed.usage(line);
        assert!(relayed.stderr.contains(rule), "{rule:?} in {relayed:#?}");
    }
}

#[test]
fn require_producer_keys_refuses_an_unbound_key_and_a_server_without_keys() {
    let lab = consumer_lab();
    let unbound = key_file(
        &lab,
        "unbound",
        &format!("orders-key {SECRET} producer=orders\nany-key {OTHER}\n"),
    );
    let out = serve_refused(&lab, &["--keys", &unbound, "--require-producer-keys"]);
    out.usage("--require-producer-keys");
    assert!(out.stderr.contains("any-key"), "{out:#?}");
    serve_refused(&lab, &["--require-producer-keys"]).usage("--keys");
    // Without the flag the same file serves; with every key bound the flag
    // serves too.
    drop(Serve::start(&lab.c, &["--keys", &unbound]));
    let bound = key_file(
        &lab,
        "bound",
        &format!("orders-key {SECRET} producer=orders\norders-key {OTHER} producer=orders\n"),
    );
    let serve = Serve::start(&lab.c, &["--keys", &bound, "--require-producer-keys"]);
    let ring = KeyRing::parse(&format!("orders-key {OTHER}"), Path::new("k")).unwrap();
    let own = envelope_of(Some("orders"), "a", 1);
    assert_eq!(post_signed(&serve, &ring, "orders-key", &own).0, 200);
}

/// A key bound to `orders` may deliver only `orders`' envelopes: any other
/// producer's (the default's too) is a 403 naming the first such item (0
/// for a single envelope),
/// after the parsing (400) and before the store's lock (503), with nothing
/// of the request stored; an unbound key delivers for every producer.
#[test]
fn a_bound_key_posting_another_producers_envelope_is_403_and_stores_nothing() {
    let lab = consumer_lab();
    let text = format!("orders-key {SECRET} producer=orders\nany-key {OTHER}\n");
    let keys = key_file(&lab, "keys", &text);
    let serve = Serve::start(&lab.c, &["--keys", &keys, "--busy-timeout-ms", "100"]);
    let ring = KeyRing::parse(&text, Path::new("keys")).unwrap();
    let post = |key_id: &str, body: &str| post_signed(&serve, &ring, key_id, body);
    let orders = |flow: &str, seq: i64| envelope_of(Some("orders"), flow, seq);
    let billing = envelope_of(Some("billing"), "b", 1);
    let default = envelope_of(None, "d", 1);
    assert_forbidden(post("orders-key", &billing), 0);
    assert_forbidden(post("orders-key", &default), 0);
    let second_foreign = array(&[orders("a", 1), billing.clone(), orders("c", 1)]);
    assert_forbidden(post("orders-key", &second_foreign), 1);
    assert_forbidden(
        post("orders-key", &array(std::slice::from_ref(&default))),
        0,
    );
    // Parsing first: a malformed item is a 400 whatever the producers.
    let malformed = array(&[billing.clone(), "7".to_owned()]);
    let (status, body) = post("orders-key", &malformed);
    assert_eq!((status, &body["index"]), (400, &json!(1)), "{body}");
    // Before the store's lock: a locked store does not turn a 403 into a 503.
    let lock = ordo_sqlite::rusqlite::Connection::open(&lab.c).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    assert_forbidden(post("orders-key", &second_foreign), 1);
    assert_eq!(post("orders-key", &orders("a", 1)).0, 503);
    lock.execute_batch("ROLLBACK").unwrap();
    assert!(inbox(&lab).is_empty(), "nothing stored");
    let metrics = common::http_get(&serve.addr, "/metrics");
    assert!(
        metrics.contains("ordo_http_requests_total{status=\"403\"} 5"),
        "{metrics}"
    );
    let (status, body) = post("orders-key", &array(&[orders("a", 1), orders("a", 2)]));
    assert_eq!(status, 200, "{body}");
    for receipt in body["receipts"].as_array().unwrap() {
        assert_eq!(receipt["producer"], json!("orders"), "{receipt}");
        assert_eq!(receipt["receipt"], json!("accepted"), "{receipt}");
    }
    for body in [&billing, &default] {
        let (status, answer) = post("any-key", body);
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["receipts"][0]["receipt"], json!("accepted"));
    }
    let stored = |producer: &str, id: &str| (producer.to_owned(), id.to_owned());
    assert_eq!(
        inbox(&lab),
        [
            stored("billing", "b-1"),
            stored("default", "d-1"),
            stored("orders", "a-1"),
            stored("orders", "a-2"),
        ]
    );
}

/// A relay whose key is bound to another producer than its store's name
/// exits 2 before sending anything: the server would take the round from
/// this key (unbound there), yet nothing arrives and nothing is marked.
#[test]
fn a_relay_whose_key_is_bound_to_another_producer_exits_2_sending_nothing() {
    let lab = named_lab("orders", &["A", "B"]);
    let server_keys = key_file(&lab, "server.keys", &format!("k1 {SECRET}\n"));
    let serve = Serve::start(&lab.c, &["--keys", &server_keys]);
    let relay_keys = key_file(
        &lab,
        "relay.keys",
        &format!("k1 {SECRET} producer=billing\n"),
    );
    let key = ["--key-id", "k1", "--key-file", &relay_keys];
    let before = outbox(&lab);
    for follow in [false, true] {
        let extra = [&key[..], if follow { &["--follow"][..] } else { &[] }].concat();
        let out = relay_to(&lab, &serve.url(), &extra);
        out.usage("bound to producer billing");
        assert!(out.stderr.contains("named orders"), "{out:#?}");
    }
    assert!(inbox(&lab).is_empty(), "nothing sent");
    assert_eq!(outbox(&lab), before, "nothing marked or recorded");
}

/// A key bound to the store's name delivers; the server checks the same
/// binding in its own key file.
#[test]
fn a_relay_whose_key_is_bound_to_its_stores_name_delivers() {
    let lab = named_lab("orders", &["A", "B"]);
    let keys = key_file(&lab, "keys", &format!("k1 {SECRET} producer=orders\n"));
    let serve = Serve::start(&lab.c, &["--keys", &keys, "--require-producer-keys"]);
    let report = relay_to(&lab, &serve.url(), &["--key-id", "k1", "--key-file", &keys]).json();
    assert_eq!(report["deliveries_total"], json!(2), "{report}");
    let stored = |id: &str| ("orders".to_owned(), id.to_owned());
    assert_eq!(inbox(&lab), [stored("A-1"), stored("B-1")]);
    assert_backlog(&lab, 0, 0);
}

/// The server's key file binds the relay's key to another producer: its
/// 403 stops the run with exit 1, a message naming the key's producer
/// problem, the backlog unchanged and nothing quarantined; `--follow` too.
#[test]
fn a_403_stops_the_relay_with_exit_1_marking_and_quarantining_nothing() {
    let lab = named_lab("orders", &["A", "B"]);
    let server_keys = key_file(
        &lab,
        "server.keys",
        &format!("k1 {SECRET} producer=billing\n"),
    );
    let serve = Serve::start(&lab.c, &["--keys", &server_keys]);
    let relay_keys = key_file(&lab, "relay.keys", &format!("k1 {SECRET}\n"));
    let key = ["--key-id", "k1", "--key-file", &relay_keys];
    let before = outbox(&lab);
    for follow in [false, true] {
        let extra = [&key[..], if follow { &["--follow"][..] } else { &[] }].concat();
        let out = relay_to(&lab, &serve.url(), &extra);
        out.storage_error();
        for said in ["403", "bound to producer billing", "producer="] {
            assert!(out.stderr.contains(said), "{said:?} in {out:#?}");
        }
    }
    assert_eq!(outbox(&lab), before, "nothing marked or recorded");
    assert_backlog(&lab, 2, 0);
    assert!(inbox(&lab).is_empty(), "nothing stored");
}
