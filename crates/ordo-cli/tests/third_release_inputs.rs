//! The third release's inputs as real processes on real SQLite files (and
//! one PostgreSQL database): what `receive --json` answers (producer,
//! cause, held event), the delivering store of each `snapshot` inbox row,
//! bad envelopes and a bad `ordo-store-id` posted to a real `ordo serve`
//! over loopback, refused `destination` commands, `inbox retry|skip` in one
//! producer's namespace of a shared flow id, and `outbox retry
//! --destination`. Every refusal is checked to have written nothing.

mod common;
mod pgdb;

use std::time::Duration;

use common::{reservation, row, Files, Lab, Out, Serve};
use serde_json::{json, Value};

const T0: i64 = 1_700_000_000_000;
const MINUTE: i64 = 60_000;
const WHY: [&str; 4] = ["--by", "ops", "--reason", "checked"];

/// A reservation envelope of `producer` (`None`: the default, no field)
/// with the `amount` given, and any extra fields.
fn of(producer: Option<&str>, flow: &str, seq: i64, amount: i64, extra: Value) -> Value {
    let mut value: Value =
        serde_json::from_str(&reservation(flow, seq, "reserved", amount)).unwrap();
    if let Some(producer) = producer {
        value["producer"] = json!(producer);
    }
    for (key, field) in extra.as_object().unwrap() {
        value[key] = field.clone();
    }
    value
}

/// Envelopes one a line, as `receive` reads several.
fn lines(envelopes: &[Value]) -> String {
    let lines: Vec<String> = envelopes.iter().map(Value::to_string).collect();
    lines.join("\n") + "\n"
}

/// The consumer's rows through `ordo inbox list --json`.
fn inbox(consumer: &str) -> Vec<Value> {
    let out = common::run(&["inbox", "list", "--json", "--consumer", consumer]);
    out.json()["inbox"].as_array().expect("inbox rows").clone()
}

/// The `(producer, event_id, status)` of every row of `rows`.
fn statuses(rows: &[Value]) -> Vec<(String, String, String)> {
    let text = |v: &Value| v.as_str().expect("text").to_owned();
    let mut listed: Vec<_> = (rows.iter())
        .map(|r| {
            (
                text(&r["producer"]),
                text(&r["event_id"]),
                text(&r["status"]),
            )
        })
        .collect();
    listed.sort();
    listed
}

fn status_of(rows: &[Value], producer: &str, event_id: &str) -> String {
    let found = rows
        .iter()
        .find(|r| r["producer"] == producer && r["event_id"] == event_id);
    let found = found.unwrap_or_else(|| panic!("no row {producer}/{event_id} in {rows:?}"));
    found["status"].as_str().unwrap().to_owned()
}

fn store_id(lab: &Lab, side: &str) -> String {
    let flag = format!("--{side}");
    let path = if side == "producer" { &lab.p } else { &lab.c };
    let status = lab.run(&["status", "--json", &flag, path]).json();
    status[side]["store_id"]
        .as_str()
        .expect("a store id")
        .to_owned()
}

/// One `receive` holding a conflict, the same flow's next event and two
/// other flows: each receipt names its producer; the conflict its cause
/// `conflict` and the held event; the next event of its flow is not
/// stored (`after_conflict`, no held event); the rest is. The text output
/// says the cause too.
#[test]
fn receive_names_the_producer_and_a_conflicts_cause_and_held_event() {
    let lab = Lab::new();
    lab.receive(&reservation("A", 1, "reserved", 1));
    let mut refused = of(None, "A", 1, 5, json!({}));
    refused["event_id"] = json!("A-1b");
    let input = lines(&[
        refused,
        of(None, "A", 2, 1, json!({})),
        of(None, "B", 1, 1, json!({})),
        of(Some("orders"), "A", 1, 1, json!({})),
    ]);
    let receipt = |id: &str, flow: &str, seq: i64, producer: &str, receipt: &str| json!({"event_id": id, "flow_id": flow, "seq": seq, "producer": producer, "receipt": receipt});
    let mut conflict = receipt("A-1b", "A", 1, "default", "conflict");
    conflict["cause"] = json!("conflict");
    conflict["held_event_id"] = json!("A-1");
    let mut after = receipt("A-2", "A", 2, "default", "conflict");
    after["cause"] = json!("after_conflict");
    after["held_event_id"] = Value::Null;
    assert_eq!(
        lab.receive(&input),
        json!({"receipts": [
            conflict,
            after,
            receipt("B-1", "B", 1, "default", "accepted"),
            receipt("A-1", "A", 1, "orders", "accepted"),
        ]})
    );
    let held = [
        ("default", "A-1", "pending"),
        ("default", "B-1", "pending"),
        ("orders", "A-1", "pending"),
    ];
    let held: Vec<_> = (held.iter())
        .map(|(p, e, s)| (p.to_string(), e.to_string(), s.to_string()))
        .collect();
    assert_eq!(statuses(&inbox(&lab.c)), held, "A-2 is not stored");
    let again = lab.run_bytes(&["receive", "--consumer", &lab.c], input.as_bytes());
    let text = again.text();
    for said in [
        "A-1b A seq 1: conflict (conflict, held A-1)",
        "A-2 A seq 2: conflict (after_conflict, held none)",
        "B-1 B seq 1: duplicate",
        "A-1 A seq 1 (producer orders): duplicate",
        "4 envelopes received",
    ] {
        assert!(text.contains(said), "{said:?} in {text}");
    }
    assert_eq!(statuses(&inbox(&lab.c)), held, "nothing more stored");
}

/// Every `snapshot` inbox row names its producer and the store that
/// delivered it: the producer store's identity for a relayed row, `null`
/// for a row `receive`d from stdin.
fn snapshot_rows_name_their_delivering_store(lab: &Lab) {
    lab.init();
    lab.advance("A", 0, "reserved", Some(1));
    lab.relay(&[]);
    lab.receive(&lines(&[of(Some("orders"), "B", 1, 2, json!({}))]));
    let rows = lab.snapshot()["consumer"]["inbox"].clone();
    assert_eq!(rows.as_array().map(Vec::len), Some(2), "{rows}");
    let relayed = row(&rows, "event_id", "A-1");
    assert_eq!(relayed["producer"], json!("default"), "{relayed}");
    assert_eq!(relayed["store_id"], json!(store_id(lab, "producer")));
    assert_ne!(store_id(lab, "producer"), store_id(lab, "consumer"));
    let received = row(&rows, "event_id", "B-1");
    assert_eq!(received["producer"], json!("orders"), "{received}");
    assert_eq!(received["store_id"], Value::Null, "{received}");
    // As `inbox list` says.
    for listed in inbox(&lab.c) {
        let snapped = row(&rows, "event_id", listed["event_id"].as_str().unwrap());
        assert_eq!(snapped["store_id"], listed["store_id"], "{listed}");
    }
}

#[test]
fn snapshot_inbox_rows_name_their_delivering_store() {
    snapshot_rows_name_their_delivering_store(&Lab::new());
}

#[test]
fn snapshot_inbox_rows_name_their_delivering_store_on_postgres() {
    let db = pgdb::Database::create();
    snapshot_rows_name_their_delivering_store(&Lab::with_stores(&db.url(), &db.url()));
}

/// POSTs `body` to the server's inbox with extra headers: status and body.
fn post(serve: &Serve, headers: &[(&str, &str)], body: &str) -> (u16, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into();
    let mut request = agent
        .post(format!("{}/v1/events", serve.url()))
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut response = request.send(body.as_bytes()).expect("the server answers");
    let text = response.body_mut().read_to_string().unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    (response.status().as_u16(), value)
}

fn serving() -> (Lab, Serve) {
    let lab = Lab::new();
    assert_eq!(lab.run(&["init", "--consumer", &lab.c]).code, 0);
    let serve = Serve::start(&lab.c, &[]);
    (lab, serve)
}

/// Envelopes the codec refuses (PROTOCOL.md section 12: `producer` left
/// out for the default, `headers` left out when empty, at most 32 string
/// values of at most 1,024 bytes under names `[a-z0-9-]{1,64}`), each as
/// the second item of a batch: 400 with `index` 1 naming the rule, and
/// nothing of the batch stored. At the bounds they are stored.
#[test]
fn bad_envelopes_posted_to_serve_answer_400_with_index_and_store_nothing() {
    let (lab, serve) = serving();
    let headers = |n: usize| -> Value {
        Value::Object((0..n).map(|i| (format!("h{i}"), json!("v"))).collect())
    };
    let long = "x".repeat(1025);
    let cases = [
        (json!({"producer": "default"}), "producer"),
        (json!({"headers": {}}), "headers"),
        (json!({"headers": {"trace": 7}}), "must be a string"),
        (json!({"headers": headers(33)}), "at most 32 headers"),
        (json!({"headers": {"x": long}}), "1025 bytes"),
        (json!({"headers": {"Trace": "v"}}), "header name"),
        (json!({"headers": {"a b": "v"}}), "header name"),
        (json!({"headers": {"": "v"}}), "header name"),
    ];
    let valid = of(None, "ok", 1, 1, json!({}));
    for (extra, rule) in &cases {
        let bad = of(None, "bad", 1, 1, extra.clone());
        let (status, body) = post(&serve, &[], &json!([valid, bad]).to_string());
        assert_eq!(
            (status, &body["index"]),
            (400, &json!(1)),
            "{extra}: {body}"
        );
        let error = body["error"].as_str().expect("an error");
        assert!(error.contains(rule), "{rule:?} in {error}");
    }
    assert_eq!(inbox(&lab.c), Vec::<Value>::new(), "nothing stored");
    // At the bounds: stored.
    let at_bounds = [
        of(None, "h", 1, 1, json!({"headers": headers(32)})),
        of(None, "v", 1, 1, json!({"headers": {"x": "x".repeat(1024)}})),
        of(Some("orders"), "p", 1, 1, json!({"headers": {"a-0": "v"}})),
    ];
    let (status, body) = post(&serve, &[], &json!(at_bounds).to_string());
    assert_eq!(status, 200, "{body}");
    let stored: Vec<_> = (inbox(&lab.c).iter())
        .map(|r| (r["producer"].clone(), r["flow_id"].clone()))
        .collect();
    assert_eq!(
        stored,
        [
            (json!("default"), json!("h")),
            (json!("orders"), json!("p")),
            (json!("default"), json!("v")),
        ]
    );
}

/// A malformed `ordo-store-id` request header is a 400 without `index`,
/// storing nothing; a missing one is an unknown sender, its row's
/// `store_id` null; a well-formed one is the row's `store_id`.
#[test]
fn the_senders_store_id_header_malformed_is_400_and_missing_is_null() {
    let (lab, serve) = serving();
    let body = |flow: &str| of(None, flow, 1, 1, json!({})).to_string();
    let good = "0123456789abcdef0123456789abcdef";
    for bad in ["xyz", "0123456789ABCDEF0123456789ABCDEF", &good[1..]] {
        let (status, answer) = post(&serve, &[("ordo-store-id", bad)], &body("a"));
        assert_eq!(status, 400, "{bad}: {answer}");
        assert_eq!(answer.get("index"), None, "{answer}");
        assert!(answer["error"].as_str().unwrap().contains("ordo-store-id"));
    }
    let twice = [("ordo-store-id", good), ("ordo-store-id", good)];
    assert_eq!(post(&serve, &twice, &body("a")).0, 400);
    assert_eq!(inbox(&lab.c), Vec::<Value>::new(), "nothing stored");
    let (status, answer) = post(&serve, &[], &body("a"));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(post(&serve, &[("ordo-store-id", good)], &body("b")).0, 200);
    let rows = inbox(&lab.c);
    assert_eq!(
        row(&Value::from(rows.clone()), "flow_id", "a")["store_id"],
        Value::Null
    );
    assert_eq!(
        row(&Value::from(rows), "flow_id", "b")["store_id"],
        json!(good)
    );
}

/// `destination ARGS --json --producer P`.
fn destination(lab: &Lab, args: &[&str]) -> Out {
    let mut all = vec!["destination", args[0], "--json", "--producer", &lab.p];
    all.extend_from_slice(&args[1..]);
    lab.run(&all)
}

fn destination_names(lab: &Lab) -> Vec<String> {
    let listed = destination(lab, &["list"]).json()["destinations"].clone();
    (listed.as_array().unwrap().iter())
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .collect()
}

/// `--from start` (the default) would begin a flow whose first events
/// were pruned in the middle: exit 2 naming the flow, nothing written;
/// `--from now` is taken.
#[test]
fn destination_add_from_start_after_a_prune_exits_2_naming_the_flow() {
    let lab = Lab::new();
    lab.at(T0).init();
    lab.advance("A", 0, "reserved", Some(1));
    lab.advance("A", 1, "confirmed", None);
    lab.relay(&[]);
    lab.at(T0 + 10 * MINUTE);
    let pruned = lab.run(&[
        "prune",
        "--json",
        "--producer",
        &lab.p,
        "--older-than",
        "1m",
    ]);
    assert_eq!(pruned.json()["producer"]["removed"], json!(2));
    lab.advance("A", 2, "released", None);
    let before = Files::of(&[&lab.p]);
    for args in [&["add", "late"][..], &["add", "late", "--from", "start"]] {
        let out = destination(&lab, args);
        out.usage("flow A was pruned from its start");
        assert!(out.stderr.contains("--from now"), "{out:#?}");
    }
    Files::of(&[&lab.p]).assert_unchanged(&before, "refused");
    assert_eq!(destination_names(&lab), ["default"]);
    destination(&lab, &["add", "late", "--from", "now"]).json();
    assert_eq!(destination_names(&lab), ["default", "late"]);
}

/// `destination remove` without `--by` or `--reason` (or blank), a second
/// destination of a name, and a bad name: exit 2, nothing written, the
/// list unchanged, nothing audited.
#[test]
fn refused_destination_commands_exit_2_and_change_nothing() {
    let lab = Lab::new();
    lab.init();
    destination(&lab, &["add", "billing"]).json();
    let before = Files::of(&[&lab.p]);
    let refusals: [(&[&str], &str); 7] = [
        (&["remove", "billing"], "--by"),
        (&["remove", "billing", "--by", "ops"], "--reason"),
        (&["remove", "billing", "--reason", "r"], "--by"),
        (&["remove", "billing", "--by", " ", "--reason", "r"], "--by"),
        (&["add", "billing"], "destination billing already exists"),
        (&["add", "default", "--from", "now"], "already exists"),
        (&["add", "Bad name"], "destination name"),
    ];
    for (args, said) in refusals {
        destination(&lab, args).usage(said);
    }
    for bad in ["9lives", "a.b", &"x".repeat(65)] {
        destination(&lab, &["add", bad]).usage(bad);
    }
    Files::of(&[&lab.p]).assert_unchanged(&before, "refused");
    assert_eq!(destination_names(&lab), ["billing", "default"]);
    let repairs = lab.run(&["outbox", "repairs", "--json", "--producer", &lab.p]);
    assert_eq!(repairs.json(), json!({"repairs": []}));
}

/// Two producers' flows under one flow id, each blocked at seq 1
/// (schema 2 without `--support-v2`): `inbox retry` and `inbox skip` with
/// `--producer-name` act on that producer's flow alone.
#[test]
fn inbox_retry_and_skip_act_on_one_producers_flow_of_a_shared_id() {
    let lab = Lab::new();
    let v2 = |producer: &str, seq: i64, kind: &str| {
        let mut envelope = of(Some(producer), "A", seq, 1, json!({"schema_version": 2}));
        envelope["type"] = json!(kind);
        envelope["payload"] = json!({"units": 3});
        envelope
    };
    let input = lines(&[
        v2("orders", 1, "reserved"),
        v2("orders", 2, "confirmed"),
        v2("billing", 1, "reserved"),
        v2("billing", 2, "confirmed"),
    ]);
    let received = lab.receive(&input);
    assert!(
        (received["receipts"].as_array().unwrap().iter()).all(|r| r["receipt"] == "accepted"),
        "{received}"
    );
    lab.apply(&[]);
    let blocked = |producer: &str| status_of(&inbox(&lab.c), producer, "A-1");
    assert_eq!(
        (blocked("orders"), blocked("billing")),
        ("blocked".into(), "blocked".into())
    );

    let retry = [
        "inbox",
        "retry",
        "--json",
        "--consumer",
        &lab.c,
        "--flow",
        "A",
    ];
    let retried = lab.run(&[&retry[..], &["--producer-name", "orders", "--support-v2"]].concat());
    let retried = retried.json();
    assert_eq!(
        (
            &retried["producer"],
            &retried["flow_id"],
            &retried["reopened"],
            &retried["applied"]
        ),
        (&json!("orders"), &json!("A"), &json!(1), &json!(2)),
        "{retried}"
    );
    let rows = inbox(&lab.c);
    assert_eq!(status_of(&rows, "orders", "A-2"), "applied");
    assert_eq!(
        status_of(&rows, "billing", "A-1"),
        "blocked",
        "billing's untouched"
    );
    assert_eq!(status_of(&rows, "billing", "A-2"), "pending");

    let skip = |producer: &str| {
        let args = [
            "inbox",
            "skip",
            "--json",
            "--consumer",
            &lab.c,
            "--flow",
            "A",
            "--seq",
            "1",
        ];
        lab.run(&[&args[..], &["--producer-name", producer], &WHY].concat())
    };
    let before = Files::of(&[&lab.c]);
    skip("orders").usage("flow A of producer orders seq 1 is already applied or skipped");
    Files::of(&[&lab.c]).assert_unchanged(&before, "orders' A-1 is settled");
    let repair = skip("billing").json()["repair"].clone();
    assert_eq!(
        (
            &repair["producer"],
            &repair["flow_id"],
            &repair["seq"],
            &repair["action"]
        ),
        (&json!("billing"), &json!("A"), &json!(1), &json!("skip")),
        "{repair}"
    );
    let rows = inbox(&lab.c);
    assert_eq!(status_of(&rows, "billing", "A-1"), "skipped");
    assert_eq!(
        status_of(&rows, "orders", "A-1"),
        "applied",
        "orders' untouched"
    );
    // Without --producer-name: the default producer's flow A, which holds
    // nothing.
    let before = Files::of(&[&lab.c]);
    let args = [
        "inbox",
        "skip",
        "--consumer",
        &lab.c,
        "--flow",
        "A",
        "--seq",
        "1",
    ];
    lab.run(&[&args[..], &WHY].concat())
        .usage("flow A seq 1 is not stored in the inbox");
    Files::of(&[&lab.c]).assert_unchanged(&before, "the default producer's A");
}

/// One destination's quarantine cleared by `outbox retry --destination`:
/// the other destination's custody untouched, the event handed over to
/// that destination again by the next relay.
#[test]
fn outbox_retry_of_one_destination_clears_its_quarantine_only() {
    let lab = Lab::new();
    lab.init();
    destination(&lab, &["add", "billing"]).json();
    // The default consumer holds another body at A-1.
    lab.receive(&reservation("A", 1, "reserved", 99));
    lab.advance("A", 0, "reserved", Some(1));
    let relay = |consumer: &str, name: &str| {
        let args = [
            "relay",
            "--json",
            "--producer",
            &lab.p,
            "--consumer",
            consumer,
        ];
        lab.run(&[&args[..], &["--destination", name]].concat())
            .json()
    };
    let c2 = lab.path("c2.db");
    assert_eq!(
        relay(&lab.c, "default")["deliveries"][0]["cause"],
        json!("conflict")
    );
    assert_eq!(
        relay(&c2, "billing")["deliveries"][0]["receipt"],
        json!("accepted")
    );
    let custody = |name: &str| {
        let listed = lab
            .run(&["outbox", "list", "--json", "--producer", &lab.p])
            .json();
        row(&listed["outbox"], "event_id", "A-1")["destinations"][name].clone()
    };
    assert_eq!(custody("default")["quarantined"], json!(true));
    let billing = custody("billing");

    let retry = ["outbox", "retry", "--json", "--producer", &lab.p, "A-1"];
    let before = Files::of(&[&lab.p]);
    lab.run(&[&retry[..], &["--destination", "billing"]].concat())
        .usage("A-1 is not quarantined");
    Files::of(&[&lab.p]).assert_unchanged(&before, "not quarantined at billing");
    let retried = lab.run(&[&retry[..], &["--destination", "default"]].concat());
    assert_eq!(retried.json(), json!({"event_id": "A-1", "retried": true}));
    assert_eq!(custody("default")["quarantined"], json!(false));
    assert_eq!(custody("billing"), billing, "billing's custody untouched");
    let again = relay(&lab.c, "default");
    assert_eq!(
        common::receipts(&again),
        [("A-1".into(), "conflict".into())]
    );
    assert!(common::receipts(&relay(&c2, "billing")).is_empty());
}
