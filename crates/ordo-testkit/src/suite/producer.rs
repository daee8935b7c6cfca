//! docs/PROTOCOL.md sections 2 and 4: `advance` on the producer.

#[allow(unused_imports)]
use ordo_reservation::{
    Advance, AdvanceError, AdvanceRefused, FlowRecord, FlowState, ReservationProducer,
    INVALID_TRANSITION,
};
use std::path::Path;

use ordo_core::{OutboxRecord, ProducerOps, ProducerStore, SchemaVersion};
use serde_json::json;

use crate::support::*;
use crate::Backend;

use FlowState::{Confirmed, New, Released, Reserved};

/// A new flow advances through its three steps; each step commits the flow's
/// new state and quantity together with one outbox row carrying the event
/// (producer id, contiguous seq, type, `{"amount": q}`), not accepted, in
/// commit order.
pub fn advance_happy_path<B: Backend>(dir: &Path) {
    let (mut p, _c) = B::open(dir);
    assert!(p.flows().unwrap().is_empty(), "a new store has no flows");
    assert!(p.outbox().unwrap().is_empty(), "a new store has no events");
    assert!(p.pending(10).unwrap().is_empty());

    let mut events = Vec::new();
    for (s, to) in [(1, Reserved), (2, Confirmed), (3, Released)] {
        let qty = (to == Reserved).then_some(7);
        let event = commit(&mut p, &request("f1", s - 1, to, qty, 1));
        assert_eq!(
            event.event_id,
            ordo_core::EventId::for_seq(&flow("f1"), seq(s))
        );
        assert_eq!(event.flow_id, flow("f1"));
        assert_eq!(event.seq, seq(s));
        assert_eq!(event.schema_version, SchemaVersion::V1);
        assert_eq!(event.event_type.as_str(), to.as_str());
        assert_eq!(
            serde_json::Value::Object(event.payload.clone()),
            json!({"amount": 7})
        );
        assert_eq!(event, reservation_event("f1", s, 7));
        assert_eq!(
            p.flows().unwrap(),
            vec![FlowRecord {
                flow_id: flow("f1"),
                state: to,
                quantity: Some(quantity(7)),
                last_seq: s,
            }]
        );
        events.push(event);
        let outbox = p.outbox().unwrap();
        assert_eq!(
            outbox,
            events
                .iter()
                .map(|e| OutboxRecord {
                    envelope: e.clone(),
                    accepted: false,
                })
                .collect::<Vec<_>>(),
            "one outbox row per committed event, in commit order, not accepted"
        );
    }
    assert_eq!(outbox_row(&mut p, &events[1]).envelope, events[1]);
    assert_eq!(p.outbox_event(&event_id("f1-99")).unwrap(), None);
    assert_eq!(p.pending(10).unwrap(), events);
    assert_eq!(p.pending(2).unwrap(), events[..2].to_vec());
    assert!(p.pending(0).unwrap().is_empty());
}

/// The producer emits schema 2 as `{"units": q}` and schema 1 as
/// `{"amount": q}`, step by step, with the same quantity.
pub fn advance_schema_2_payload<B: Backend>(dir: &Path) {
    let (mut p, _c) = B::open(dir);
    let e1 = commit(&mut p, &request("v2", 0, Reserved, Some(1_000_000), 2));
    assert_eq!(e1.schema_version, SchemaVersion::V2);
    assert_eq!(
        serde_json::Value::Object(e1.payload.clone()),
        json!({"units": 1_000_000})
    );
    let e2 = commit(&mut p, &request("v2", 1, Confirmed, None, 1));
    assert_eq!(e2.schema_version, SchemaVersion::V1);
    assert_eq!(
        serde_json::Value::Object(e2.payload.clone()),
        json!({"amount": 1_000_000})
    );
    let e3 = commit(&mut p, &request("v2", 2, Released, Some(1_000_000), 2));
    assert_eq!(
        serde_json::Value::Object(e3.payload.clone()),
        json!({"units": 1_000_000})
    );
    let stored = outbox_envelopes(&mut p);
    assert_eq!(stored, vec![e1.clone(), e2, e3]);
    assert_eq!(stored[0].body(), e1.body());
    assert_eq!(recorded(&mut p, "v2"), (Released, Some(1_000_000), 3));
}

/// An `expected_seq` different from the flow's `last_seq` is `stale` with the
/// actual `last_seq`, and writes nothing: on a new flow, behind, and ahead.
pub fn advance_stale_writes_nothing<B: Backend>(dir: &Path) {
    let (mut p, _c) = B::open(dir);
    assert_eq!(
        p.advance(&request("s", 1, Reserved, Some(5), 1)).unwrap(),
        Advance::Stale { last_seq: 0 }
    );
    assert!(p.flows().unwrap().is_empty(), "stale wrote a flow");
    assert!(p.outbox().unwrap().is_empty(), "stale wrote an event");

    commit(&mut p, &request("s", 0, Reserved, Some(5), 1));
    let before = producer_state(&mut p);
    for (expected, to, qty) in [
        (0, Confirmed, None),
        (0, Reserved, Some(5)),
        (2, Confirmed, None),
        (2, Released, Some(5)),
        (i64::MAX, Confirmed, None),
    ] {
        let outcome = p.advance(&request("s", expected, to, qty, 1));
        assert_eq!(
            outcome.unwrap(),
            Advance::Stale { last_seq: 1 },
            "expected {expected}"
        );
        assert_eq!(producer_state(&mut p), before, "stale must write nothing");
    }
    // stale wins over an illegal step: it is checked first
    assert_eq!(
        p.advance(&request("s", 0, Released, None, 1)).unwrap(),
        Advance::Stale { last_seq: 1 }
    );
    // and the right expected_seq still commits
    let e = commit(&mut p, &request("s", 1, Confirmed, None, 1));
    assert_eq!(e.seq, seq(2));
}

/// Every illegal step is `invalid_transition` with the flow's state and the
/// requested one, and writes nothing: a wrong first step, skipping a step,
/// repeating or going back a step, re-reserving, reopening after `released`.
pub fn advance_illegal_transitions_write_nothing<B: Backend>(dir: &Path) {
    let (mut p, _c) = B::open(dir);
    // one flow in each state
    commit(&mut p, &request("at-reserved", 0, Reserved, Some(3), 1));
    for (s, to) in [(0, Reserved), (1, Confirmed)] {
        commit(&mut p, &request("at-confirmed", s, to, Some(3), 1));
    }
    commit_full_flow(&mut p, "at-released", 3);

    let cases: [(&str, i64, FlowState, FlowState); 9] = [
        ("at-new", 0, New, Confirmed),
        ("at-new", 0, New, Released),
        ("at-reserved", 1, Reserved, Reserved),
        ("at-reserved", 1, Reserved, Released),
        ("at-confirmed", 2, Confirmed, Reserved),
        ("at-confirmed", 2, Confirmed, Confirmed),
        ("at-released", 3, Released, Reserved),
        ("at-released", 3, Released, Confirmed),
        ("at-released", 3, Released, Released),
    ];
    let before = producer_state(&mut p);
    for (flow_id, expected, from, to) in cases {
        for schema in [1, 2] {
            let outcome = p
                .advance(&request(flow_id, expected, to, Some(3), schema))
                .unwrap_or_else(|e| panic!("{flow_id} {from} -> {to}: error {e}"));
            assert_eq!(
                outcome,
                Advance::InvalidTransition { from, to },
                "{flow_id}: {from} -> {to}"
            );
            assert_eq!(
                producer_state(&mut p),
                before,
                "{flow_id}: {from} -> {to} must write nothing"
            );
        }
    }
    assert!(flow_record(&mut p, "at-new").is_none());
}

/// A later step naming a quantity different from the flow's is refused as an
/// error (not an outcome), and writes nothing; the same quantity is accepted.
pub fn advance_quantity_mismatch_writes_nothing<B: Backend>(dir: &Path) {
    let (mut p, _c) = B::open(dir);
    commit(&mut p, &request("q", 0, Reserved, Some(5), 1));
    let before = producer_state(&mut p);
    for (to, requested) in [(Confirmed, 6), (Confirmed, 4), (Confirmed, 1_000_000)] {
        match p.advance(&request("q", 1, to, Some(requested), 1)) {
            Err(AdvanceError::Refused(AdvanceRefused::QuantityMismatch {
                flow_id,
                fixed,
                requested: got,
            })) => {
                assert_eq!(flow_id, flow("q"));
                assert_eq!(fixed, quantity(5));
                assert_eq!(got, quantity(requested));
            }
            other => panic!("quantity {requested}: expected a quantity mismatch, got {other:?}"),
        }
        assert_eq!(producer_state(&mut p), before, "a refused advance wrote");
    }
    let e = commit(&mut p, &request("q", 1, Confirmed, Some(5), 1));
    assert_eq!(serde_json::Value::Object(e.payload), json!({"amount": 5}));
    let before = producer_state(&mut p);
    assert!(matches!(
        p.advance(&request("q", 2, Released, Some(50), 2)),
        Err(AdvanceError::Refused(
            AdvanceRefused::QuantityMismatch { .. }
        ))
    ));
    assert_eq!(producer_state(&mut p), before, "a refused advance wrote");
}

/// A later step without a quantity carries the flow's quantity, in both
/// schemas, in the payload and in the flow record.
pub fn advance_quantity_defaults_for_later_steps<B: Backend>(dir: &Path) {
    let (mut p, _c) = B::open(dir);
    for (schema, key) in [(1, "amount"), (2, "units")] {
        let f = format!("d{schema}");
        commit(&mut p, &request(&f, 0, Reserved, Some(42), schema));
        for (expected, to) in [(1, Confirmed), (2, Released)] {
            let e = commit(&mut p, &request(&f, expected, to, None, schema));
            assert_eq!(
                serde_json::Value::Object(e.payload),
                json!({ key: 42 }),
                "{f} {to}"
            );
            let record = flow_record(&mut p, &f).unwrap();
            assert_eq!(record.quantity, Some(quantity(42)));
            assert_eq!(record.state, to);
        }
    }
}

/// Seqs are allocated per flow, contiguous from 1, whatever the interleaving
/// of flows; the outbox keeps commit order across flows; event ids are unique.
pub fn advance_seq_is_contiguous_per_flow<B: Backend>(dir: &Path) {
    let (mut p, _c) = B::open(dir);
    let long = "L".repeat(100);
    let order = ["a", "b", "a", &long, "b", "a", &long, &long, "b"];
    let mut committed = Vec::new();
    for f in order {
        let last = flow_record(&mut p, f).map_or(0, |r| r.last_seq);
        let to = state_of_step(last + 1);
        let e = commit(&mut p, &request(f, last, to, Some(9), 1));
        assert_eq!(e.seq, seq(last + 1), "flow {f}");
        committed.push(e);
    }
    let outbox = outbox_envelopes(&mut p);
    assert_eq!(outbox, committed, "outbox in commit order");
    let mut ids: Vec<_> = outbox.iter().map(|e| e.event_id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 9, "event ids are unique");
    let records = p.flows().unwrap();
    assert_eq!(
        records
            .iter()
            .map(|r| r.flow_id.clone())
            .collect::<Vec<_>>(),
        vec![flow(&long), flow("a"), flow("b")],
        "flows ordered by flow id"
    );
    assert!(records
        .iter()
        .all(|r| r.last_seq == 3 && r.state == Released));
}

/// `advance_batch` decides every request in order in one transaction, each
/// seeing the ones before it: a stale, an illegal or a refused request
/// writes nothing and does not stop the others; the committed steps are all
/// stored, in order.
pub fn advance_batch_sees_earlier_requests<B: Backend>(dir: &Path) {
    let (mut p, _c) = B::open(dir);
    let requests = [
        request("a", 0, Reserved, Some(5), 1),
        request("a", 1, Confirmed, None, 2),
        request("a", 1, Confirmed, None, 1),
        request("b", 0, Confirmed, Some(5), 1),
        request("a", 2, Released, Some(6), 1),
        request("b", 0, Reserved, Some(8), 1),
        request("a", 2, Released, Some(5), 1),
    ];
    let outcomes = p.advance_batch(&requests).unwrap();
    assert_eq!(outcomes.len(), requests.len());
    let a1 = reservation_event("a", 1, 5);
    let mut a2 = reservation_event("a", 2, 5);
    a2.schema_version = SchemaVersion::V2;
    a2.payload = ordo_reservation::rules::payload_for(SchemaVersion::V2, quantity(5));
    let a3 = reservation_event("a", 3, 5);
    let b1 = reservation_event("b", 1, 8);
    assert_eq!(outcomes[0], Ok(Advance::Committed(a1.clone())));
    assert_eq!(outcomes[1], Ok(Advance::Committed(a2.clone())));
    assert_eq!(outcomes[2], Ok(Advance::Stale { last_seq: 2 }));
    assert_eq!(
        outcomes[3],
        Ok(Advance::InvalidTransition {
            from: New,
            to: Confirmed
        })
    );
    assert!(
        matches!(outcomes[4], Err(AdvanceRefused::QuantityMismatch { .. })),
        "{:?}",
        outcomes[4]
    );
    assert_eq!(outcomes[5], Ok(Advance::Committed(b1.clone())));
    assert_eq!(outcomes[6], Ok(Advance::Committed(a3.clone())));
    let outbox = outbox_envelopes(&mut p);
    assert_eq!(outbox, vec![a1, a2, b1, a3]);
    assert_eq!(recorded(&mut p, "a"), (Released, Some(5), 3));
    assert_eq!(recorded(&mut p, "b"), (Reserved, Some(8), 1));

    // a batch that commits nothing writes nothing
    let before = producer_state(&mut p);
    let outcomes = p
        .advance_batch(&[
            request("a", 0, Confirmed, None, 1),
            request("b", 1, Released, None, 1),
        ])
        .unwrap();
    assert_eq!(
        outcomes,
        vec![
            Ok(Advance::Stale { last_seq: 3 }),
            Ok(Advance::InvalidTransition {
                from: Reserved,
                to: Released
            })
        ]
    );
    assert_eq!(producer_state(&mut p), before);
    assert!(p.advance_batch(&[]).unwrap().is_empty());
    assert_eq!(producer_state(&mut p), before);
}

/// A request that `advance_batch` refuses (a quantity different from the
/// flow's) writes nothing for itself, consumes no seq and does not stop the
/// requests after it, whether the flow existed before the batch or was
/// created earlier in it; a batch of refused requests writes nothing.
pub fn advance_batch_refused_request_writes_nothing_for_itself<B: Backend>(dir: &Path) {
    let (mut p, _c) = B::open(dir);
    let c1 = commit(&mut p, &request("c", 0, Reserved, Some(3), 1));
    let outcomes = p
        .advance_batch(&[
            request("c", 1, Confirmed, Some(4), 1),
            request("n", 0, Reserved, Some(2), 1),
            request("c", 1, Confirmed, Some(3), 1),
            request("n", 1, Confirmed, Some(9), 1),
            request("n", 1, Confirmed, None, 1),
        ])
        .unwrap();
    let c2 = reservation_event("c", 2, 3);
    let n1 = reservation_event("n", 1, 2);
    let n2 = reservation_event("n", 2, 2);
    assert_eq!(
        outcomes,
        vec![
            Err(AdvanceRefused::QuantityMismatch {
                flow_id: flow("c"),
                fixed: quantity(3),
                requested: quantity(4)
            }),
            Ok(Advance::Committed(n1.clone())),
            Ok(Advance::Committed(c2.clone())),
            Err(AdvanceRefused::QuantityMismatch {
                flow_id: flow("n"),
                fixed: quantity(2),
                requested: quantity(9)
            }),
            Ok(Advance::Committed(n2.clone())),
        ]
    );
    let outbox = outbox_envelopes(&mut p);
    assert_eq!(outbox, vec![c1, n1, c2, n2]);
    for (f, q) in [("c", 3), ("n", 2)] {
        assert_eq!(recorded(&mut p, f), (Confirmed, Some(q), 2), "{f}");
    }

    let before = producer_state(&mut p);
    let outcomes = p
        .advance_batch(&[
            request("c", 2, Released, Some(5), 1),
            request("n", 2, Released, Some(1), 2),
        ])
        .unwrap();
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Err(AdvanceRefused::QuantityMismatch { .. }))),
        "{outcomes:?}"
    );
    assert_eq!(producer_state(&mut p), before);
    let c3 = commit(&mut p, &request("c", 2, Released, None, 1));
    assert_eq!(c3.seq, seq(3));
}

/// PROTOCOL.md section 12: a producer store is named when it is created
/// and never renamed (another name is refused, and the store opens again
/// as it was); every envelope it holds names it, and one of another
/// producer is refused with nothing written; a store created without a
/// name is `default`'s.
pub fn a_producer_is_named_once_and_its_events_carry_the_name<B: Backend>(dir: &Path) {
    let name = |n: &str| ordo_core::ProducerName::new(n).unwrap();
    let mut p = B::open_named_producer(dir, Some(name("orders"))).unwrap();
    assert_eq!(p.producer_name(), &name("orders"));
    let mut event = envelope("o-1", "o", 1, 1, "placed", json!({}));
    let refused = p.append_events(std::slice::from_ref(&event)).unwrap_err();
    assert!(
        refused.to_string().contains("names producer \"default\""),
        "{refused}"
    );
    assert!(
        p.outbox().unwrap().is_empty(),
        "a refused append writes nothing"
    );
    event.producer = name("orders");
    p.append_events(std::slice::from_ref(&event)).unwrap();
    assert_eq!(p.outbox().unwrap()[0].envelope, event);
    drop(p);

    let renamed = B::open_named_producer(dir, Some(name("billing"))).map(drop);
    let renamed = renamed.expect_err("a producer is never renamed");
    assert_eq!(
        renamed.kind(),
        ordo_core::ErrorKind::Incompatible,
        "{renamed}"
    );
    assert!(
        renamed
            .to_string()
            .contains("named \"orders\", not \"billing\""),
        "{renamed}"
    );
    let mut again = B::open_named_producer(dir, None).unwrap();
    assert_eq!(again.producer_name(), &name("orders"));
    assert_eq!(
        again.outbox().unwrap().len(),
        1,
        "the refused open changed nothing"
    );
    let (unnamed, _c) = B::open(dir);
    assert!(unnamed.producer_name().is_default());
}

/// PROTOCOL.md section 12: an event's headers are part of its stored body;
/// an envelope whose headers break their rules is refused with nothing
/// written.
pub fn headers_are_kept_with_the_event_and_bad_ones_refused<B: Backend>(dir: &Path) {
    let (mut p, _c) = B::open(dir);
    let mut bad = envelope("h-1", "h", 1, 1, "placed", json!({}));
    bad.headers.insert("Trace".into(), "x".into());
    let refused = p.append_events(std::slice::from_ref(&bad)).unwrap_err();
    assert!(
        refused.to_string().contains("a header name must match"),
        "{refused}"
    );
    assert!(
        p.outbox().unwrap().is_empty(),
        "a refused append writes nothing"
    );
    let mut event = envelope("h-1", "h", 1, 1, "placed", json!({}));
    event.headers.insert(
        "traceparent".into(),
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
    );
    p.append_events(std::slice::from_ref(&event)).unwrap();
    assert_eq!(p.outbox().unwrap()[0].envelope, event);
    assert_eq!(p.pending(10).unwrap(), vec![event]);
}
