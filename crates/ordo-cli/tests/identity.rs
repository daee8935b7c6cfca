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
