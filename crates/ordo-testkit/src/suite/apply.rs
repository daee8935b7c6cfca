//! docs/PROTOCOL.md section 6: `apply_next`, blocking, `drain` and `process_all`.

#[allow(unused_imports)]
use ordo_reservation::{
    FlowState, ReservationConsumer, INVALID_PAYLOAD, INVALID_TRANSITION, UNSUPPORTED_SCHEMA,
};
use std::path::Path;

use ordo_core::{
    BlockReason, DrainStop, Envelope, InboxStatus, ProducerOps, ProducerStore, Receipt, Receive,
    Step,
};
use serde_json::{json, Value};

use crate::support::*;
use crate::Backend;

/// Events received in order apply one by one: each application moves the
/// projection one step (state, quantity, applied seq), writes one effect and
/// marks the row applied; then `idle`. A flow with nothing received is
/// `idle` and has no projection.
pub fn apply_in_order_then_idle<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    assert_eq!(apply_step(&mut c, "f", V1), Step::Idle);
    assert!(projection(&mut c, "f").is_none());
    let events = reservation_events("f", 12);
    for e in &events {
        assert_eq!(c.receive(e).unwrap(), Receipt::Accepted);
    }
    for (i, e) in events.iter().enumerate() {
        let s = i as i64 + 1;
        assert_eq!(apply_step(&mut c, "f", V1), applied_at(s));
        assert_eq!(projected(&mut c, "f"), (state_of_step(s), Some(12), s));
        assert_eq!(flow_effects(&mut c, "f"), effects_for(&events[..=i]));
        assert_eq!(inbox_status(&mut c, &e.event_id), InboxStatus::Applied);
        if let Some(next) = events.get(i + 1) {
            assert_eq!(inbox_status(&mut c, &next.event_id), InboxStatus::Pending);
        }
        check_consumer_invariants(&mut c);
    }
    for _ in 0..2 {
        assert_eq!(apply_step(&mut c, "f", V1), Step::Idle);
        assert_eq!(apply_step(&mut c, "f", V2), Step::Idle);
    }
    assert_eq!(c.effects().unwrap().len(), 3);
    assert!(c.flows_with_reservation_work(V1).unwrap().is_empty());
    assert!(c.flows_with_reservation_work(V2).unwrap().is_empty());
}

/// All six arrival orders of a flow's three events end `released` with the
/// flow's quantity and exactly one effect per event. After each arrival the
/// consumer applies what it can: `gap` (naming the missing seq) while a later
/// seq is stored and an earlier one is missing, `idle` once caught up; never
/// a skip.
pub fn apply_all_six_arrival_orders<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    let orders = [
        [1, 2, 3],
        [1, 3, 2],
        [2, 1, 3],
        [2, 3, 1],
        [3, 1, 2],
        [3, 2, 1],
    ];
    for (n, order) in orders.iter().enumerate() {
        let name = format!("order-{}{}{}", order[0], order[1], order[2]);
        let qty = 100 + n as i64;
        let events = reservation_events(&name, qty);
        let mut received = [false; 3];
        let mut applied = 0usize;
        for &s in order {
            let e = &events[s - 1];
            assert_eq!(c.receive(e).unwrap(), Receipt::Accepted, "{name} seq {s}");
            received[s - 1] = true;
            let prefix = received.iter().take_while(|r| **r).count();
            let later = received[prefix..].iter().any(|r| *r);
            let d = drain_flow(&mut c, &name, None, V1);
            assert_eq!(
                d.applied as usize,
                prefix - applied,
                "{name}: after seq {s}, applied"
            );
            applied = prefix;
            let expected_stop = if later {
                DrainStop::Gap
            } else {
                DrainStop::Idle
            };
            assert_eq!(d.stop, expected_stop, "{name}: after seq {s}");
            if later {
                assert_eq!(
                    apply_step(&mut c, &name, V1),
                    Step::Gap {
                        missing: seq(prefix as i64 + 1)
                    },
                    "{name}: after seq {s}"
                );
            }
            assert_eq!(
                projected(&mut c, &name),
                if prefix == 0 {
                    (FlowState::New, None, 0)
                } else {
                    (state_of_step(prefix as i64), Some(qty), prefix as i64)
                },
                "{name}: after seq {s}"
            );
            assert_eq!(
                flow_effects(&mut c, &name),
                effects_for(&events[..prefix]),
                "{name}: after seq {s}"
            );
        }
        assert_eq!(
            projected(&mut c, &name),
            (FlowState::Released, Some(qty), 3)
        );
        assert_eq!(flow_effects(&mut c, &name), effects_for(&events));
        assert_eq!(apply_step(&mut c, &name, V1), Step::Idle);
    }
    assert_eq!(c.effects().unwrap().len(), 18);
    check_consumer_invariants(&mut c);
}

/// Schema 9 is accepted and stored, then `blocked/unsupported_schema` at
/// apply, with schema 2 support too; the stored body stays exactly the
/// received one; nothing is applied.
pub fn apply_unknown_schema_blocked_body_unchanged<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    let received = parse(
        r#"{"event_id":"s9-1","flow_id":"s9","seq":1,"schema_version":9,"type":"reserved","payload":{"quantity":{"value":5,"unit":"kg"}}}"#,
    );
    assert_eq!(c.receive(&received).unwrap(), Receipt::Accepted);
    assert_eq!(
        inbox_status(&mut c, &received.event_id),
        InboxStatus::Pending
    );
    for options in [V1, V2, V1] {
        assert_eq!(
            apply_step(&mut c, "s9", options),
            blocked_at(1, UNSUPPORTED_SCHEMA),
            "{options:?}"
        );
        let row = inbox_row(&mut c, &received.event_id).unwrap();
        assert_eq!(row.status, InboxStatus::Blocked(UNSUPPORTED_SCHEMA));
        assert_eq!(row.envelope, received, "stored envelope changed");
        assert_eq!(row.envelope.body(), received.body(), "stored body changed");
    }
    assert!(projection(&mut c, "s9").is_none());
    assert!(c.effects().unwrap().is_empty());
    assert_eq!(c.receive(&received).unwrap(), Receipt::Duplicate);
    check_consumer_invariants(&mut c);
}

/// Schema 2 (`{"units": q}`) is blocked for `unsupported_schema` by default
/// and listed as work only with `support_v2`; with it, the original stored
/// record is applied (same event id, seq and body), and the rest follows.
pub fn apply_schema_2_blocked_then_applied_as_stored_with_support_v2<B: Backend>(dir: &Path) {
    let (mut p, mut c) = B::open(dir);
    let e1 = commit(&mut p, &request("v2", 0, FlowState::Reserved, Some(33), 2));
    let e2 = commit(&mut p, &request("v2", 1, FlowState::Confirmed, None, 2));
    let report = relay_first_pending(&mut p, &mut c, None);
    assert!(report
        .deliveries
        .iter()
        .all(|d| d.receipt == Receipt::Accepted));

    assert_eq!(
        c.flows_with_reservation_work(V1).unwrap(),
        vec![inbox_flow("v2")]
    );
    let blocked = blocked_at(1, UNSUPPORTED_SCHEMA);
    assert_eq!(apply_step(&mut c, "v2", V1), blocked);
    assert_eq!(apply_step(&mut c, "v2", V1), blocked);
    assert_eq!(
        inbox_status(&mut c, &e1.event_id),
        InboxStatus::Blocked(UNSUPPORTED_SCHEMA)
    );
    assert_eq!(inbox_status(&mut c, &e2.event_id), InboxStatus::Pending);
    assert!(projection(&mut c, "v2").is_none());
    // the pending seq 2 is still work, but apply stops at the blocked seq 1
    let drains = process(&mut c, None, V1);
    assert_eq!(
        drains,
        vec![drained("v2", 0, DrainStop::Blocked(UNSUPPORTED_SCHEMA))]
    );
    assert!(c.effects().unwrap().is_empty());
    assert_eq!(
        c.flows_with_reservation_work(V2).unwrap(),
        vec![inbox_flow("v2")]
    );

    assert_eq!(apply_step(&mut c, "v2", V2), applied_at(1));
    let row = inbox_row(&mut c, &e1.event_id).unwrap();
    assert_eq!(row.status, InboxStatus::Applied);
    assert_eq!(row.envelope, e1, "applied as stored");
    assert_eq!(row.envelope.body(), e1.body());
    assert_eq!(flow_effects(&mut c, "v2"), effects_for([&e1]));
    assert_eq!(projected(&mut c, "v2"), (FlowState::Reserved, Some(33), 1));

    let e3 = commit(&mut p, &request("v2", 2, FlowState::Released, None, 1));
    relay_first_pending(&mut p, &mut c, None);
    let drains = process(&mut c, None, V2);
    assert_eq!(drains, vec![drained("v2", 2, DrainStop::Idle)]);
    assert_eq!(projected(&mut c, "v2"), (FlowState::Released, Some(33), 3));
    assert_eq!(flow_effects(&mut c, "v2"), effects_for(&[e1, e2, e3]));
    assert!(c.flows_with_reservation_work(V2).unwrap().is_empty());
    check_consumer_invariants(&mut c);
}

fn expect_blocked<C: ReservationConsumer>(
    c: &mut C,
    e: &Envelope,
    reason: BlockReason,
    options: ordo_reservation::ApplyOptions,
) {
    let before_projection = projection(c, e.flow_id.as_str());
    let before_effects = c.effects().unwrap();
    assert_eq!(c.receive(e).unwrap(), Receipt::Accepted, "{e:?}");
    assert_eq!(
        c.apply_next(&e.inbox_flow(), options).unwrap(),
        Step::Blocked {
            seq: e.seq,
            reason: reason.clone()
        },
        "{e:?}"
    );
    let row = inbox_row(c, &e.event_id).unwrap();
    assert_eq!(row.status, InboxStatus::Blocked(reason), "{e:?}");
    assert_eq!(
        row.envelope.body(),
        e.body(),
        "body of a blocked row changed"
    );
    assert_eq!(
        projection(c, e.flow_id.as_str()),
        before_projection,
        "{e:?}"
    );
    assert_eq!(c.effects().unwrap(), before_effects, "{e:?}");
}

/// A payload without a valid quantity is `blocked/invalid_payload`: amount 0,
/// 1_000_001, -1, 5.5, "5", null, missing, the schema 2 key under schema 1,
/// an extra key; and schema 2 with the schema 1 key when enabled.
pub fn apply_invalid_payload_blocked<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    let payloads: [Value; 10] = [
        json!({"amount": 0}),
        json!({"amount": 1_000_001}),
        json!({"amount": -1}),
        json!({"amount": 5.5}),
        json!({"amount": "5"}),
        json!({"amount": null}),
        json!({}),
        json!({"units": 5}),
        json!({"amount": 5, "units": 5}),
        json!({"amount": [5]}),
    ];
    for (i, payload) in payloads.into_iter().enumerate() {
        let f = format!("p{i}");
        let e = envelope(&format!("{f}-1"), &f, 1, 1, "reserved", payload);
        expect_blocked(&mut c, &e, INVALID_PAYLOAD, V2);
    }
    let e = amount_event("v2-1", "v2", 1, 2, "reserved", 5);
    expect_blocked(&mut c, &e, INVALID_PAYLOAD, V2);

    // on a later step too, with the projection left as it was
    let [e1, _, _] = reservation_events("late", 7);
    assert_eq!(c.receive(&e1).unwrap(), Receipt::Accepted);
    assert_eq!(apply_step(&mut c, "late", V1), applied_at(1));
    let bad = amount_event("late-2", "late", 2, 1, "confirmed", 0);
    expect_blocked(&mut c, &bad, INVALID_PAYLOAD, V1);
    assert_eq!(projected(&mut c, "late"), (FlowState::Reserved, Some(7), 1));

    // the bounds themselves apply
    for (f, q) in [("lo", 1), ("hi", 1_000_000)] {
        assert_eq!(
            c.receive(&reservation_event(f, 1, q)).unwrap(),
            Receipt::Accepted
        );
        assert_eq!(apply_step(&mut c, f, V1), applied_at(1));
        assert_eq!(projected(&mut c, f), (FlowState::Reserved, Some(q), 1));
    }
    check_consumer_invariants(&mut c);
}

/// An event that is not the legal next step of the projection is
/// `blocked/invalid_transition`: a wrong first step, a type that is not a
/// state, a skipped step, a repeated step, a changed quantity, a step after
/// `released`.
pub fn apply_invalid_transition_blocked<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    // first steps that are not `reserved`
    for (i, ty) in ["confirmed", "released", "new", "shipped", "RESERVED"]
        .into_iter()
        .enumerate()
    {
        let f = format!("first{i}");
        let e = amount_event(&format!("{f}-1"), &f, 1, 1, ty, 5);
        expect_blocked(&mut c, &e, INVALID_TRANSITION, V1);
    }
    // later steps after `reserved` with quantity 5
    let cases: [(&str, Value); 5] = [
        ("reserved", json!({"amount": 5})),
        ("released", json!({"amount": 5})),
        ("confirmed", json!({"amount": 6})),
        ("confirmed", json!({"amount": 1})),
        ("cancelled", json!({"amount": 5})),
    ];
    for (i, (ty, payload)) in cases.into_iter().enumerate() {
        let f = format!("second{i}");
        assert_eq!(
            c.receive(&reservation_event(&f, 1, 5)).unwrap(),
            Receipt::Accepted
        );
        assert_eq!(apply_step(&mut c, &f, V1), applied_at(1));
        let e = envelope(&format!("{f}-2"), &f, 2, 1, ty, payload);
        expect_blocked(&mut c, &e, INVALID_TRANSITION, V1);
        assert_eq!(projected(&mut c, &f), (FlowState::Reserved, Some(5), 1));
    }
    // schema 2 with a changed quantity, when enabled
    assert_eq!(
        c.receive(&reservation_event("units", 1, 5)).unwrap(),
        Receipt::Accepted
    );
    assert_eq!(apply_step(&mut c, "units", V1), applied_at(1));
    let e = envelope("units-2", "units", 2, 2, "confirmed", json!({"units": 50}));
    expect_blocked(&mut c, &e, INVALID_TRANSITION, V2);
    // reopening after `released`
    for e in reservation_events("done", 2) {
        assert_eq!(c.receive(&e).unwrap(), Receipt::Accepted);
    }
    let d = drain_flow(&mut c, "done", None, V1);
    assert_eq!((d.applied, d.stop), (3, DrainStop::Idle));
    let reopen = amount_event("done-4", "done", 4, 1, "reserved", 2);
    expect_blocked(&mut c, &reopen, INVALID_TRANSITION, V1);
    assert_eq!(projected(&mut c, "done"), (FlowState::Released, Some(2), 3));
    assert_eq!(c.effects().unwrap().len(), 3 + 5 + 1);
    check_consumer_invariants(&mut c);
}

/// A blocked row stays blocked on every later `apply_next` and `drain`, with
/// or without schema 2 support (other than `unsupported_schema`); the flow
/// never passes it, even with later seqs stored; a corrected event cannot
/// replace it (conflict); its flow is no longer listed as work.
pub fn apply_blocked_row_stays_blocked<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    let [e1, _, e3] = reservation_events("f", 5);
    let bad = amount_event("f-2", "f", 2, 1, "confirmed", 0);
    for e in [&e1, &bad, &e3] {
        assert_eq!(c.receive(e).unwrap(), Receipt::Accepted);
    }
    let d = drain_flow(&mut c, "f", None, V1);
    assert_eq!(
        (d.applied, d.stop),
        (1, DrainStop::Blocked(INVALID_PAYLOAD))
    );
    let blocked = blocked_at(2, INVALID_PAYLOAD);
    let state = consumer_state(&mut c);
    for options in [V1, V2, V1] {
        assert_eq!(apply_step(&mut c, "f", options), blocked);
        let d = drain_flow(&mut c, "f", None, options);
        assert_eq!(
            (d.applied, d.stop),
            (0, DrainStop::Blocked(INVALID_PAYLOAD))
        );
        assert_eq!(consumer_state(&mut c), state, "a held block wrote");
    }
    assert_eq!(inbox_status(&mut c, &e3.event_id), InboxStatus::Pending);
    // the pending seq 3 keeps the flow listed, but process_all stops at seq 2
    let drains = process(&mut c, None, V2);
    assert_eq!(
        drains,
        vec![drained("f", 0, DrainStop::Blocked(INVALID_PAYLOAD))]
    );
    // a corrected event cannot replace the blocked one
    let fixed = reservation_event("f", 2, 5);
    assert_eq!(fixed.event_id, bad.event_id);
    assert_eq!(c.receive(&fixed).unwrap(), Receipt::Conflict);
    let fixed_other_id = amount_event("f-2-fixed", "f", 2, 1, "confirmed", 5);
    assert_eq!(c.receive(&fixed_other_id).unwrap(), Receipt::Conflict);
    assert_eq!(c.receive(&bad).unwrap(), Receipt::Duplicate);
    assert_eq!(consumer_state(&mut c), state);
    assert_eq!(apply_step(&mut c, "f", V1), blocked);

    // a flow whose only row is blocked is not work
    let only = amount_event("g-1", "g", 1, 1, "confirmed", 5);
    expect_blocked(&mut c, &only, INVALID_TRANSITION, V1);
    let work = c.flows_with_reservation_work(V2).unwrap();
    assert!(!work.contains(&inbox_flow("g")), "{work:?}");
    check_consumer_invariants(&mut c);
}

/// `drain` stops with each of its four reasons: `limit` (after exactly that
/// many applications), `gap`, `blocked` with the reason, and `idle`.
pub fn drain_stop_reasons<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    for e in reservation_events("lim", 4) {
        c.receive(&e).unwrap();
    }
    let d = drain_flow(&mut c, "lim", Some(2), V1);
    assert_eq!(d, drained("lim", 2, DrainStop::Limit));
    assert_eq!(projected(&mut c, "lim"), (FlowState::Confirmed, Some(4), 2));
    let d = drain_flow(&mut c, "lim", Some(0), V1);
    assert_eq!((d.applied, d.stop), (0, DrainStop::Limit));
    let d = drain_flow(&mut c, "lim", Some(5), V1);
    assert_eq!((d.applied, d.stop.clone()), (1, DrainStop::Idle));
    assert_eq!(d.stop.as_str(), "idle");

    let [g1, _, g3] = reservation_events("gap", 4);
    c.receive(&g3).unwrap();
    let d = drain_flow(&mut c, "gap", None, V1);
    assert_eq!((d.applied, d.stop), (0, DrainStop::Gap));
    c.receive(&g1).unwrap();
    let d = drain_flow(&mut c, "gap", Some(10), V1);
    assert_eq!((d.applied, d.stop.clone()), (1, DrainStop::Gap));
    assert_eq!(d.stop.as_str(), "gap");

    let [b1, _, _] = reservation_events("blk", 4);
    c.receive(&b1).unwrap();
    c.receive(&amount_event("blk-2", "blk", 2, 9, "confirmed", 4))
        .unwrap();
    let d = drain_flow(&mut c, "blk", None, V1);
    assert_eq!(
        (d.applied, d.stop.clone()),
        (1, DrainStop::Blocked(UNSUPPORTED_SCHEMA))
    );
    assert_eq!(d.stop.reason(), Some(&UNSUPPORTED_SCHEMA));

    let d = drain_flow(&mut c, "nothing", None, V1);
    assert_eq!((d.applied, d.stop), (0, DrainStop::Idle));
    check_consumer_invariants(&mut c);
}

/// Scenario `process_all_isolation`: a blocked flow and a gapped flow, listed
/// before a healthy one, do not stop it; the healthy flow ends `released`.
/// Once the gap fills, the gapped flow catches up; the blocked one holds.
pub fn process_all_isolation<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    let blocked = amount_event("a-blocked-1", "a-blocked", 1, 9, "reserved", 1);
    let [g1, g2, g3] = reservation_events("b-gapped", 2);
    let healthy = reservation_events("c-healthy", 3);
    for e in [&blocked, &g2, &g3].into_iter().chain(healthy.iter()) {
        assert_eq!(c.receive(e).unwrap(), Receipt::Accepted);
    }
    assert_eq!(
        c.flows_with_reservation_work(V1).unwrap(),
        vec![
            inbox_flow("a-blocked"),
            inbox_flow("b-gapped"),
            inbox_flow("c-healthy")
        ]
    );
    let drains = process(&mut c, None, V1);
    assert_eq!(
        drains,
        vec![
            drained("a-blocked", 0, DrainStop::Blocked(UNSUPPORTED_SCHEMA)),
            drained("b-gapped", 0, DrainStop::Gap),
            drained("c-healthy", 3, DrainStop::Idle),
        ]
    );
    assert_eq!(
        projected(&mut c, "c-healthy"),
        (FlowState::Released, Some(3), 3)
    );
    assert_eq!(flow_effects(&mut c, "c-healthy"), effects_for(&healthy));
    assert!(projection(&mut c, "a-blocked").is_none());
    assert!(projection(&mut c, "b-gapped").is_none());

    // nothing pending in the blocked flow any more; the gapped one still waits
    assert_eq!(
        c.flows_with_reservation_work(V1).unwrap(),
        vec![inbox_flow("b-gapped")]
    );
    assert_eq!(c.receive(&g1).unwrap(), Receipt::Accepted);
    let drains = process(&mut c, Some(100), V1);
    assert_eq!(drains, vec![drained("b-gapped", 3, DrainStop::Idle)]);
    assert_eq!(
        projected(&mut c, "b-gapped"),
        (FlowState::Released, Some(2), 3)
    );
    assert_eq!(flow_effects(&mut c, "b-gapped"), effects_for(&[g1, g2, g3]));
    assert!(process(&mut c, None, V1).is_empty());
    // schema 9 stays blocked even with schema 2 support
    let drains = process(&mut c, None, V2);
    assert_eq!(
        drains,
        vec![drained(
            "a-blocked",
            0,
            DrainStop::Blocked(UNSUPPORTED_SCHEMA)
        )]
    );
    assert_eq!(c.effects().unwrap().len(), 6);
    check_consumer_invariants(&mut c);
}

/// The whole path for several flows: advance, relay, apply. Every flow ends
/// `released` on both sides with its quantity, every outbox row accepted,
/// one effect per event with the producer's event ids.
pub fn end_to_end_advance_relay_apply<B: Backend>(dir: &Path) {
    let (mut p, mut c) = B::open(dir);
    let flows = [("e2e-a", 1), ("e2e-b", 500), ("e2e-c", 1_000_000)];
    let mut all = Vec::new();
    for step in 1..=3 {
        for (f, q) in flows {
            let qty = (step == 1).then_some(q);
            let schema = if f == "e2e-b" { 2 } else { 1 };
            all.push(commit(
                &mut p,
                &request(f, step - 1, state_of_step(step), qty, schema),
            ));
        }
        relay_first_pending(&mut p, &mut c, None);
        process(&mut c, None, V2);
    }
    assert!(p.outbox().unwrap().iter().all(|r| r.accepted));
    assert!(p.pending(100).unwrap().is_empty());
    for (f, q) in flows {
        assert_eq!(recorded(&mut p, f), (FlowState::Released, Some(q), 3));
        assert_eq!(projected(&mut c, f), (FlowState::Released, Some(q), 3));
        let events: Vec<Envelope> = all
            .iter()
            .filter(|e| e.flow_id.as_str() == f)
            .cloned()
            .collect();
        assert_eq!(flow_effects(&mut c, f), effects_for(&events));
    }
    assert_eq!(
        inbox_envelopes(&mut c),
        by_flow_seq(all.clone()),
        "the inbox holds the producer's events as committed"
    );
    check_consumer_invariants(&mut c);
}

/// `apply_batch` (several flows, one transaction) and the batch size of
/// `drain` and `process_all` change nothing but the number of transactions:
/// per-flow limits hold, a batch that runs out of room stops the flow in
/// progress with `limit` and visits no later flow, and every batch size ends
/// in the same projections and effects.
pub fn apply_batches_keep_order_and_limits<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    let flows = ["k1", "k2", "k3", "k4"];
    for f in flows {
        for e in reservation_events(f, 6) {
            c.receive(&e).unwrap();
        }
    }
    // one transaction, per-flow limits, room for 4 events
    let drains = c
        .apply_batch(
            &[
                (inbox_flow("k1"), Some(1)),
                (inbox_flow("k2"), None),
                (inbox_flow("k3"), None),
                (inbox_flow("k4"), None),
            ],
            4,
            V1,
        )
        .unwrap();
    assert_eq!(
        drains,
        vec![
            drained("k1", 1, DrainStop::Limit),
            drained("k2", 3, DrainStop::Limit),
        ],
        "k2 stops with limit when the batch's room runs out; k3 is not visited"
    );
    assert_eq!(projected(&mut c, "k1"), (FlowState::Reserved, Some(6), 1));
    assert_eq!(projected(&mut c, "k2"), (FlowState::Released, Some(6), 3));
    assert!(projection(&mut c, "k3").is_none());
    check_consumer_invariants(&mut c);

    // process_all with a per-flow limit and a batch of one event
    let drains = c.process_all(Some(1), V1, 1).unwrap();
    assert_eq!(
        drain_stops(&drains),
        vec![
            ("k1", 1, DrainStop::Limit),
            ("k3", 1, DrainStop::Limit),
            ("k4", 1, DrainStop::Limit),
        ]
    );
    // drain in batches of two
    let d = c.drain(&inbox_flow("k3"), None, V1, 2).unwrap();
    assert_eq!((d.applied, d.stop), (2, DrainStop::Idle));
    let drains = c.process_all(None, V1, 2).unwrap();
    assert_eq!(
        drain_stops(&drains),
        vec![("k1", 1, DrainStop::Idle), ("k4", 2, DrainStop::Idle)]
    );
    for f in flows {
        assert_eq!(
            projected(&mut c, f),
            (FlowState::Released, Some(6), 3),
            "{f}"
        );
        assert_eq!(
            flow_effects(&mut c, f),
            effects_for(reservation_events(f, 6))
        );
    }
    // a batch that applies nothing reports each flow's stop
    let drains = c
        .apply_batch(
            &[(inbox_flow("k1"), None), (inbox_flow("none"), Some(3))],
            10,
            V1,
        )
        .unwrap();
    assert_eq!(
        drain_stops(&drains),
        vec![("k1", 0, DrainStop::Idle), ("none", 0, DrainStop::Idle)]
    );
    check_consumer_invariants(&mut c);
}

/// One `apply_batch` call applies up to `events_max` events across several
/// flows, visiting them in the given order, each strictly in seq order and
/// up to its own limit, and reports each visited flow's stop: `idle` when
/// caught up, `gap`, `blocked` with the reason, `limit` for its own limit or
/// for the batch's room running out (then later flows are not visited).
pub fn apply_batch_across_flows_reports_each_stop<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    let a = reservation_events("a", 2);
    let b2 = reservation_event("b", 2, 3);
    let c1 = amount_event("c-1", "c", 1, 1, "reserved", 0);
    let d = reservation_events("d", 4);
    let f = reservation_events("f", 5);
    for e in a.iter().chain([&b2, &c1]).chain(&d).chain(&f) {
        assert_eq!(c.receive(e).unwrap(), Receipt::Accepted);
    }
    let run = |c: &mut B::Consumer, flows: &[(&str, Option<u64>)], events_max: u64| {
        let flows: Vec<_> = flows.iter().map(|(f, l)| (inbox_flow(f), *l)).collect();
        c.apply_batch(&flows, events_max, V1)
            .unwrap()
            .into_iter()
            .map(|d| (d.flow.flow_id.as_str().to_owned(), d.applied, d.stop))
            .collect::<Vec<_>>()
    };
    let owned = |rows: &[(&str, u64, DrainStop)]| {
        rows.iter()
            .map(|(f, n, s)| (f.to_string(), *n, s.clone()))
            .collect::<Vec<_>>()
    };
    let all = [
        ("a", None),
        ("b", None),
        ("c", None),
        ("d", Some(1)),
        ("e", None),
        ("f", None),
        ("a", None),
    ];
    assert_eq!(
        run(&mut c, &all, 5),
        owned(&[
            ("a", 3, DrainStop::Idle),
            ("b", 0, DrainStop::Gap),
            ("c", 0, DrainStop::Blocked(INVALID_PAYLOAD)),
            ("d", 1, DrainStop::Limit),
            ("e", 0, DrainStop::Idle),
            ("f", 1, DrainStop::Limit),
        ]),
        "f stops when the room of 5 runs out; nothing after it is visited"
    );
    assert_eq!(projected(&mut c, "a"), (FlowState::Released, Some(2), 3));
    assert!(projection(&mut c, "b").is_none());
    assert!(projection(&mut c, "c").is_none());
    assert_eq!(projected(&mut c, "d"), (FlowState::Reserved, Some(4), 1));
    assert_eq!(projected(&mut c, "f"), (FlowState::Reserved, Some(5), 1));
    assert_eq!(
        c.effects().unwrap(),
        effects_for([&a[..], &d[..1], &f[..1]].concat())
    );
    assert_eq!(
        inbox_status(&mut c, &c1.event_id),
        InboxStatus::Blocked(INVALID_PAYLOAD)
    );
    check_consumer_invariants(&mut c);

    // the room runs out exactly at the end of a flow: it stops with limit
    assert_eq!(
        run(&mut c, &[("f", None), ("d", None)], 2),
        owned(&[("f", 2, DrainStop::Limit)])
    );
    assert_eq!(projected(&mut c, "f"), (FlowState::Released, Some(5), 3));
    assert_eq!(projected(&mut c, "d"), (FlowState::Reserved, Some(4), 1));
    // a limit of zero applies nothing and does not stop the batch
    assert_eq!(
        run(&mut c, &[("f", None), ("d", Some(0)), ("b", None)], 10),
        owned(&[
            ("f", 0, DrainStop::Idle),
            ("d", 0, DrainStop::Limit),
            ("b", 0, DrainStop::Gap),
        ])
    );
    assert_eq!(projected(&mut c, "d"), (FlowState::Reserved, Some(4), 1));
    assert_eq!(
        run(&mut c, &[("d", None)], 10),
        owned(&[("d", 2, DrainStop::Idle)])
    );
    assert_eq!(
        c.effects().unwrap(),
        effects_for([&a[..], &d[..], &f[..]].concat())
    );
    check_consumer_invariants(&mut c);
}
