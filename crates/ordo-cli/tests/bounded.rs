//! docs/CLI.md "Bounded output": `relay` without `--max` and `apply` without
//! `--flow` list at most 10,000 entries, count them all, and say when the
//! list was cut.

mod common;

use common::*;
use ordo_core::{FlowId, SchemaVersion};
use ordo_reservation::{AdvanceRequest, FlowState, Quantity, ReservationProducer};

/// One more than a list holds.
const FLOWS: usize = 10_001;

#[test]
fn relay_and_apply_list_at_most_10000_entries_and_count_them_all() {
    let lab = Lab::new();
    let mut producer = ordo_reservation::open_producer(&lab.p).unwrap();
    let requests: Vec<AdvanceRequest> = (0..FLOWS)
        .map(|i| {
            AdvanceRequest::new(
                FlowId::new(format!("f{i:05}")).unwrap(),
                0,
                FlowState::Reserved,
                Some(Quantity::new(1).unwrap()),
                SchemaVersion::V1,
            )
            .unwrap()
        })
        .collect();
    for outcome in producer.advance_batch(&requests).unwrap() {
        outcome.unwrap();
    }
    drop(producer);

    let relay = lab.relay(&[]);
    assert_eq!(relay["deliveries"].as_array().unwrap().len(), 10_000);
    assert_eq!(relay["deliveries_total"], FLOWS);
    assert_eq!(relay["truncated"], true);
    assert_eq!(relay["stop"], "drained");

    let apply = lab.apply(&[]);
    assert_eq!(apply["flows"].as_array().unwrap().len(), 10_000);
    assert_eq!(apply["flows_total"], FLOWS);
    assert_eq!(apply["truncated"], true);
    // every flow was applied, listed or not
    let snapshot = lab.snapshot();
    assert_eq!(
        snapshot["consumer"]["effects"].as_array().unwrap().len(),
        FLOWS
    );

    let text = lab.run(&["relay", "--producer", &lab.p, "--consumer", &lab.c]);
    assert_eq!(text.code, 0, "{text:#?}");
    assert!(
        text.stdout.ends_with("0 deliveries, stop: drained\n"),
        "{}",
        text.stdout
    );
}
