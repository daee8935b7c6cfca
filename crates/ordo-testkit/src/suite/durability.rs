//! docs/PROTOCOL.md section 7 and the recovery half of section 9: opening again
//! (a fresh process) keeps every committed fact and never resets anything;
//! apply stays exactly-once across reopens.

#[allow(unused_imports)]
use ordo_reservation::{
    Advance, FlowState, ReservationConsumer, ReservationProducer, UNSUPPORTED_SCHEMA,
};
use std::path::Path;

use ordo_core::{DrainStop, InboxStatus, ProducerOps, Receipt, Receive, Step};
use serde_json::json;

use crate::support::*;
use crate::Backend;

/// Open, write a mix of every kind of state on both sides, open again (while
/// the first handles are still open, then after closing them, then once
/// more): every flow, outbox row and accepted mark, inbox row and status,
/// projection and effect is intact, and work continues from there.
pub fn reopen_keeps_all_state<B: Backend>(dir: &Path) {
    let (mut p, mut c) = B::open(dir);
    let x = commit_full_flow(&mut p, "x", 1);
    let y1 = commit(&mut p, &request("y", 0, FlowState::Reserved, Some(2), 2));
    let z1 = commit(&mut p, &request("z", 0, FlowState::Reserved, Some(3), 1));
    let z2 = commit(&mut p, &request("z", 1, FlowState::Confirmed, None, 1));
    let report = relay_first_pending(&mut p, &mut c, Some(5));
    assert_eq!(report.deliveries.len(), 5);
    let s9 = amount_event("s9-1", "s9", 1, 9, "reserved", 1);
    c.receive(&s9).unwrap();
    c.receive(&amount_event("gap-2", "gap", 2, 1, "confirmed", 1))
        .unwrap();
    process(&mut c, None, V1);
    assert_eq!(projected(&mut c, "x"), (FlowState::Released, Some(1), 3));
    assert_eq!(projected(&mut c, "z"), (FlowState::Reserved, Some(3), 1));
    assert_eq!(
        inbox_status(&mut c, &y1.event_id),
        InboxStatus::Blocked(UNSUPPORTED_SCHEMA)
    );
    assert!(!is_accepted(&mut p, &z2));
    assert!(is_accepted(&mut p, &z1));

    let producer = producer_state(&mut p);
    let consumer = consumer_state(&mut c);
    assert_eq!(producer.outbox.len(), 6);
    assert_eq!(consumer.inbox.len(), 7);
    assert_eq!(consumer.effects.len(), 4);

    {
        let (mut p2, mut c2) = B::open(dir);
        assert_eq!(
            producer_state(&mut p2),
            producer,
            "open beside a live handle"
        );
        assert_eq!(
            consumer_state(&mut c2),
            consumer,
            "open beside a live handle"
        );
    }
    assert_eq!(producer_state(&mut p), producer);
    assert_eq!(consumer_state(&mut c), consumer);
    drop((p, c));
    for round in 0..2 {
        let (mut p, mut c) = B::open(dir);
        assert_eq!(producer_state(&mut p), producer, "reopen {round}");
        assert_eq!(consumer_state(&mut c), consumer, "reopen {round}");
        check_consumer_invariants(&mut c);
    }

    // work continues where it stopped
    let (mut p, mut c) = B::open(dir);
    assert_eq!(
        p.advance(&request("z", 1, FlowState::Released, None, 1))
            .unwrap(),
        Advance::Stale { last_seq: 2 }
    );
    let z3 = commit(&mut p, &request("z", 2, FlowState::Released, None, 1));
    assert_eq!(z3.seq, seq(3));
    let y2 = commit(&mut p, &request("y", 1, FlowState::Confirmed, None, 2));
    let report = relay_first_pending(&mut p, &mut c, None);
    assert_eq!(
        report
            .deliveries
            .iter()
            .map(|d| (d.event_id.clone(), d.receipt))
            .collect::<Vec<_>>(),
        vec![
            (z2.event_id.clone(), Receipt::Accepted),
            (z3.event_id.clone(), Receipt::Accepted),
            (y2.event_id.clone(), Receipt::Accepted),
        ]
    );
    assert!(p.outbox().unwrap().iter().all(|r| r.accepted));
    process(&mut c, None, V2);
    for (f, q) in [("x", 1), ("y", 2), ("z", 3)] {
        let want = if f == "y" {
            (FlowState::Confirmed, Some(q), 2)
        } else {
            (FlowState::Released, Some(q), 3)
        };
        assert_eq!(projected(&mut c, f), want, "flow {f}");
    }
    assert_eq!(flow_effects(&mut c, "x"), effects_for(&x));
    assert_eq!(flow_effects(&mut c, "y"), effects_for(&[y1, y2]));
    assert_eq!(flow_effects(&mut c, "z"), effects_for(&[z1, z2, z3]));
    assert_eq!(
        inbox_status(&mut c, &s9.event_id),
        InboxStatus::Blocked(UNSUPPORTED_SCHEMA)
    );
    assert_eq!(apply_step(&mut c, "gap", V1), Step::Gap { missing: seq(1) });
    check_consumer_invariants(&mut c);
}

/// Apply is exactly-once across reopens: after each reopen, apply moves on
/// from the committed cursor, never re-applies, never re-writes an effect;
/// redeliveries after reopen are duplicates; a block survives a reopen and is
/// re-evaluated with schema 2 support after one.
pub fn apply_exactly_once_across_reopen<B: Backend>(dir: &Path) {
    let events = reservation_events("f", 9);
    {
        let (_p, mut c) = B::open(dir);
        for e in &events {
            assert_eq!(c.receive(e).unwrap(), Receipt::Accepted);
        }
        assert_eq!(apply_step(&mut c, "f", V1), applied_at(1));
    }
    {
        let (_p, mut c) = B::open(dir);
        assert_eq!(flow_effects(&mut c, "f"), effects_for(&events[..1]));
        assert_eq!(apply_step(&mut c, "f", V1), applied_at(2));
        assert_eq!(flow_effects(&mut c, "f"), effects_for(&events[..2]));
    }
    {
        let (_p, mut c) = B::open(dir);
        let d = drain_flow(&mut c, "f", None, V1);
        assert_eq!((d.applied, d.stop), (1, DrainStop::Idle));
    }
    {
        let (_p, mut c) = B::open(dir);
        assert_eq!(apply_step(&mut c, "f", V1), Step::Idle);
        for e in &events {
            assert_eq!(c.receive(e).unwrap(), Receipt::Duplicate);
        }
        assert!(process(&mut c, None, V2).is_empty());
        assert_eq!(flow_effects(&mut c, "f"), effects_for(&events));
        assert_eq!(projected(&mut c, "f"), (FlowState::Released, Some(9), 3));
        let v2 = envelope("v-1", "v", 1, 2, "reserved", json!({"units": 4}));
        assert_eq!(c.receive(&v2).unwrap(), Receipt::Accepted);
        assert_eq!(
            apply_step(&mut c, "v", V1),
            blocked_at(1, UNSUPPORTED_SCHEMA)
        );
    }
    {
        let (_p, mut c) = B::open(dir);
        assert_eq!(
            apply_step(&mut c, "v", V1),
            blocked_at(1, UNSUPPORTED_SCHEMA)
        );
        assert_eq!(apply_step(&mut c, "v", V2), applied_at(1));
    }
    let (_p, mut c) = B::open(dir);
    assert_eq!(apply_step(&mut c, "v", V2), Step::Idle);
    assert_eq!(projected(&mut c, "v"), (FlowState::Reserved, Some(4), 1));
    assert_eq!(c.effects().unwrap().len(), 4);
    check_consumer_invariants(&mut c);
}
