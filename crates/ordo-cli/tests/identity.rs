//! Store identities and conflict causes on the command line (CLI.md,
//! third release): `status` and `snapshot` report each store's
//! `store_id`, the same on every run and its own; `relay --json` names the
//! `cause` of each conflict delivery.

mod common;

use common::*;
use serde_json::json;

#[test]
fn status_and_snapshot_report_each_stores_identity() {
    let lab = Lab::new();
    lab.init();
    let status = lab.run_both("status", &[]).json();
    let snapshot = lab.snapshot();
    let id = |value: &serde_json::Value, side: &str| {
        let id = value[side]["store_id"]
            .as_str()
            .expect("a store id")
            .to_owned();
        assert_eq!(id.len(), 32, "{value}");
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        id
    };
    let (producer, consumer) = (id(&status, "producer"), id(&status, "consumer"));
    assert_ne!(producer, consumer, "each store its own");
    assert_eq!(id(&snapshot, "producer"), producer);
    assert_eq!(id(&snapshot, "consumer"), consumer);
    let again = lab.run_both("status", &[]).json();
    assert_eq!(
        (id(&again, "producer"), id(&again, "consumer")),
        (producer, consumer)
    );
}

#[test]
fn relay_json_names_the_cause_of_a_conflict() {
    let lab = Lab::new();
    lab.init();
    lab.advance("A", 0, "reserved", Some(5));
    lab.advance("B", 0, "reserved", Some(2));
    lab.receive(&reservation("A", 1, "reserved", 6));
    let report = lab.relay(&[]);
    let deliveries = &report["deliveries"];
    assert_eq!(
        row(deliveries, "event_id", "A-1"),
        &json!({"event_id": "A-1", "flow_id": "A", "seq": 1, "receipt": "conflict", "cause": "conflict"})
    );
    assert_eq!(
        row(deliveries, "event_id", "B-1"),
        &json!({"event_id": "B-1", "flow_id": "B", "seq": 1, "receipt": "accepted"})
    );
}

#[test]
fn a_producer_is_named_when_created_and_its_events_carry_the_name() {
    let lab = Lab::new();
    let init = lab.run(&[
        "init",
        "--producer",
        &lab.p,
        "--consumer",
        &lab.c,
        "--producer-name",
        "orders",
    ]);
    assert_eq!(init.code, 0, "{init:#?}");
    let status = lab.run_both("status", &[]).json();
    assert_eq!(status["producer"]["producer_name"], "orders", "{status}");
    assert_eq!(lab.snapshot()["producer"]["producer_name"], "orders");
    lab.advance("A", 0, "reserved", Some(5));
    let outbox = &lab.snapshot()["producer"]["outbox"];
    assert_eq!(
        row(outbox, "event_id", "A-1")["producer"],
        "orders",
        "{outbox}"
    );
    let report = lab.relay(&[]);
    assert_eq!(
        row(&report["deliveries"], "event_id", "A-1")["receipt"],
        "accepted"
    );
    let inbox = &lab.snapshot()["consumer"]["inbox"];
    assert_eq!(
        row(inbox, "event_id", "A-1")["producer"],
        "orders",
        "{inbox}"
    );

    // The name never changes: another is refused, and nothing is written.
    let before = Files::of(&[&lab.p, &lab.c]);
    lab.run(&["init", "--producer", &lab.p, "--producer-name", "billing"])
        .usage("named \"orders\", not \"billing\"");
    before.assert_unchanged(&Files::of(&[&lab.p, &lab.c]), "a renaming init");
    // The same name, or none, opens it as it is.
    for again in [vec!["--producer-name", "orders"], vec![]] {
        let mut args = vec!["init", "--producer", lab.p.as_str()];
        args.extend(again);
        let out = lab.run(&args);
        assert_eq!(out.code, 0, "{out:#?}");
    }
}

#[test]
fn a_bad_or_misplaced_producer_name_is_refused_and_creates_nothing() {
    let lab = Lab::new();
    lab.run(&["init", "--producer", &lab.p, "--producer-name", "Orders"])
        .usage("producer name must match");
    lab.run(&["init", "--consumer", &lab.c, "--producer-name", "orders"])
        .usage("--producer-name names a producer store");
    assert!(
        bytes(&lab.p).is_none() && bytes(&lab.c).is_none(),
        "nothing created"
    );
}
