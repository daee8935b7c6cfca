//! docs/PROTOCOL.md sections 3 and 6: `receive` stores durably and answers
//! `accepted`, `duplicate` or `conflict`, by canonical body.

#[allow(unused_imports)]
use ordo_reservation::{FlowState, ReservationConsumer, UNSUPPORTED_SCHEMA};
use std::path::Path;

use ordo_core::{
    Answer, ConsumerOps, DrainStop, Envelope, InboxStatus, ProducerOps, Receipt, Receive, Step,
    StoreId,
};
use serde_json::json;

use crate::support::*;
use crate::Backend;
use ordo_core::ops::InboxScope;

/// A new event is `accepted` and stored as `pending` exactly as received; the
/// same event again is `duplicate` and stores nothing more.
pub fn receive_accepted_then_duplicate<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    assert!(c.inbox().unwrap().is_empty());
    let e = reservation_event("f", 1, 5);
    assert_eq!(c.receive(&e).unwrap(), Receipt::Accepted);
    let inbox = c.inbox().unwrap();
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].envelope, e);
    assert_eq!(inbox[0].envelope.body(), e.body());
    assert_eq!(inbox[0].status, InboxStatus::Pending);
    for _ in 0..2 {
        assert_eq!(c.receive(&e).unwrap(), Receipt::Duplicate);
        assert_eq!(c.inbox().unwrap(), inbox, "a duplicate stored something");
    }
    // still a duplicate once applied
    assert_eq!(apply_step(&mut c, "f", V1), applied_at(1));
    let applied = consumer_state(&mut c);
    assert_eq!(c.receive(&e).unwrap(), Receipt::Duplicate);
    assert_eq!(consumer_state(&mut c), applied);
    check_consumer_invariants(&mut c);
}

/// The same `event_id` with a different body is `conflict`, before and after
/// the stored row is applied; nothing changes, the stored body is kept.
pub fn receive_conflict_same_event_id_changes_nothing<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    let stored = reservation_event("f", 1, 5);
    assert_eq!(c.receive(&stored).unwrap(), Receipt::Accepted);
    let id = stored.event_id.as_str();
    let variants = [
        amount_event(id, "f", 1, 1, "reserved", 6),
        amount_event(id, "f", 1, 2, "reserved", 5),
        amount_event(id, "f", 1, 1, "confirmed", 5),
        amount_event(id, "f", 2, 1, "reserved", 5),
        amount_event(id, "g", 1, 1, "reserved", 5),
        envelope(id, "f", 1, 1, "reserved", json!({"amount": 5, "note": "x"})),
    ];
    for round in ["pending", "applied"] {
        let before = consumer_state(&mut c);
        for v in &variants {
            assert_eq!(c.receive(v).unwrap(), Receipt::Conflict, "{round}: {v:?}");
            assert_eq!(
                consumer_state(&mut c),
                before,
                "{round}: conflict changed something"
            );
        }
        assert_eq!(c.receive(&stored).unwrap(), Receipt::Duplicate);
        if round == "pending" {
            assert_eq!(apply_step(&mut c, "f", V1), applied_at(1));
        }
    }
    assert_eq!(projected(&mut c, "f"), (FlowState::Reserved, Some(5), 1));
    assert_eq!(flow_effects(&mut c, "f"), effects_for(&[stored]));
}

/// The same `(flow_id, seq)` under a different `event_id` is `conflict`, even
/// with an identical payload; nothing changes and the new id is not stored.
pub fn receive_conflict_same_flow_seq_changes_nothing<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    let stored = reservation_event("f", 1, 5);
    assert_eq!(c.receive(&stored).unwrap(), Receipt::Accepted);
    let before = consumer_state(&mut c);
    let intruders = [
        amount_event("other", "f", 1, 1, "reserved", 5),
        amount_event("other-2", "f", 1, 1, "reserved", 8),
        envelope("other-3", "f", 1, 9, "whatever", json!({})),
    ];
    for e in &intruders {
        assert_eq!(c.receive(e).unwrap(), Receipt::Conflict, "{e:?}");
        assert_eq!(consumer_state(&mut c), before, "conflict changed something");
        assert!(inbox_row(&mut c, &e.event_id).is_none());
    }
    // the intruder's id was not taken: a different (flow, seq) under it is new
    let elsewhere = amount_event("other", "f", 2, 1, "confirmed", 5);
    assert_eq!(c.receive(&elsewhere).unwrap(), Receipt::Accepted);
    // and the stored event applies as stored
    let d = drain_flow(&mut c, "f", None, V1);
    assert_eq!((d.applied, d.stop), (2, DrainStop::Idle));
    assert_eq!(flow_effects(&mut c, "f"), effects_for(&[stored, elsewhere]));
}

/// Duplicate detection compares canonical bodies: the same envelope written
/// with keys in another order, other whitespace, and `5.0` for `5` is a
/// duplicate, and the stored event applies with quantity 5.
pub fn receive_duplicate_ignores_key_order_and_number_spelling<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    let first = parse(
        r#"{"payload":{"amount":5.0},"type":"reserved","seq":1,"schema_version":1,"flow_id":"f","event_id":"f-1"}"#,
    );
    let texts = [
        r#"{"event_id":"f-1","flow_id":"f","seq":1,"schema_version":1,"type":"reserved","payload":{"amount":5}}"#,
        "{ \"seq\" : 1 ,\n \"event_id\":\"f-1\", \"schema_version\":1,\"flow_id\":\"f\",\"payload\":{\"amount\":5.00},\"type\":\"reserved\"}",
        r#"{"type":"reserved","payload":{"amount":5e0},"event_id":"f-1","seq":1,"flow_id":"f","schema_version":1}"#,
        r#"{"type":"reserved","payload":{"amount":50e-1},"event_id":"f-1","seq":1,"flow_id":"f","schema_version":1}"#,
    ];
    assert_eq!(c.receive(&first).unwrap(), Receipt::Accepted);
    let before = consumer_state(&mut c);
    for text in texts {
        assert_eq!(
            c.receive(&parse(text)).unwrap(),
            Receipt::Duplicate,
            "{text}"
        );
        assert_eq!(consumer_state(&mut c), before);
    }
    // a different number is a different body
    let six = parse(&texts[0].replace("5}", "6}"));
    assert_eq!(c.receive(&six).unwrap(), Receipt::Conflict);

    // nested payload objects are canonical too (the payload is only judged
    // at apply)
    let a = parse(
        r#"{"event_id":"g-1","flow_id":"g","seq":1,"schema_version":9,"type":"t","payload":{"b":{"y":1,"x":[1,2.0]},"a":true}}"#,
    );
    let b = parse(
        r#"{"flow_id":"g","event_id":"g-1","type":"t","seq":1,"schema_version":9,"payload":{"a":true,"b":{"x":[1.0,2],"y":1.0}}}"#,
    );
    assert_eq!(c.receive(&a).unwrap(), Receipt::Accepted);
    assert_eq!(c.receive(&b).unwrap(), Receipt::Duplicate);
    let reordered_array = parse(
        r#"{"flow_id":"g","event_id":"g-1","type":"t","seq":1,"schema_version":9,"payload":{"a":true,"b":{"x":[2,1],"y":1}}}"#,
    );
    assert_eq!(c.receive(&reordered_array).unwrap(), Receipt::Conflict);

    assert_eq!(apply_step(&mut c, "f", V1), applied_at(1));
    assert_eq!(projected(&mut c, "f"), (FlowState::Reserved, Some(5), 1));
    let stored = inbox_row(&mut c, &event_id("f-1")).unwrap().envelope;
    assert_eq!(stored.body(), parse(texts[0]).body());
    check_consumer_invariants(&mut c);
}

/// `receive_batch` stores a batch in one call, one receipt per envelope in
/// input order; a later envelope sees the earlier ones (in-batch duplicate
/// and conflict); an empty batch is fine.
pub fn receive_batch_in_one_call<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    assert!(c.receive_batch(&[]).unwrap().is_empty());
    let [e1, e2, e3] = reservation_events("b", 3);
    let pre = reservation_event("z", 1, 1);
    assert_eq!(c.receive(&pre).unwrap(), Receipt::Accepted);
    let e2_again = parse(&{
        let mut v = e2.to_value();
        v["payload"] = json!({"amount": 3.0});
        v.to_string()
    });
    let squatter = amount_event("squat", "b", 2, 1, "confirmed", 3);
    let e1_changed = amount_event(e1.event_id.as_str(), "b", 1, 1, "reserved", 4);
    let batch = vec![
        e3.clone(),
        e1.clone(),
        e1.clone(),
        squatter.clone(),
        e2.clone(),
        e2_again,
        e1_changed,
        pre.clone(),
    ];
    let receipts = c.receive_batch(&batch).unwrap();
    // Nothing of flow b after its conflict; flow z goes on.
    assert_eq!(
        receipts,
        vec![
            Receipt::Accepted,
            Receipt::Accepted,
            Receipt::Duplicate,
            Receipt::Accepted,
            Receipt::Conflict,
            Receipt::AfterConflict,
            Receipt::AfterConflict,
            Receipt::Duplicate,
        ]
    );
    assert_eq!(
        inbox_envelopes(&mut c),
        vec![e1.clone(), squatter, e3.clone(), pre]
    );
    assert!(c.projections().unwrap().is_empty());
    assert!(c.effects().unwrap().is_empty());

    // a batch of only duplicates and conflicts stores nothing
    let before = consumer_state(&mut c);
    let receipts = c.receive_batch(&[e3, e2, e1]).unwrap();
    assert_eq!(
        receipts,
        vec![
            Receipt::Duplicate,
            Receipt::Conflict,
            Receipt::AfterConflict
        ]
    );
    assert_eq!(consumer_state(&mut c), before);
}

/// A conflict names the event the consumer holds in its place
/// (`held_event_id`), and nothing of its flow after it in the same delivery
/// is stored, whatever it is: each later envelope of the flow is answered
/// `after_conflict`, naming no held event (PROTOCOL.md section 12). Other
/// flows of the delivery go on, and the same later envelopes delivered on
/// their own are decided as usual.
pub fn receive_nothing_after_a_conflict_in_one_delivery<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    let [f1, f2, f3] = reservation_events("f", 3);
    let held = amount_event("held", "f", 1, 1, "reserved", 3);
    let g1 = reservation_event("g", 1, 4);
    assert_eq!(c.receive(&held).unwrap(), Receipt::Accepted);
    let before = consumer_state(&mut c);
    let answers =
        c.receive_answers(&[f1.clone(), g1.clone(), f2.clone(), f3.clone(), held.clone()]);
    let conflict = Answer {
        receipt: Receipt::Conflict,
        held_event_id: Some(held.event_id.clone()),
    };
    let after = Answer::of(Receipt::AfterConflict);
    assert_eq!(
        answers.unwrap(),
        vec![
            conflict.clone(),
            Answer::of(Receipt::Accepted),
            after.clone(),
            after.clone(),
            after
        ],
        "even the held event itself, a duplicate, is after the conflict"
    );
    assert_eq!(
        inbox_envelopes(&mut c),
        vec![held.clone(), g1],
        "only g stored"
    );
    // The same event id with another body: the held event is the one
    // stored under the id.
    let changed = amount_event(held.event_id.as_str(), "f", 1, 1, "reserved", 9);
    assert_eq!(
        c.receive_answers(std::slice::from_ref(&changed)).unwrap(),
        [conflict]
    );
    // Delivered alone, each later event is decided against the inbox.
    assert_eq!(c.receive_batch(&[f2, f3]).unwrap(), [Receipt::Accepted; 2]);
    assert_ne!(consumer_state(&mut c), before);
    check_consumer_invariants(&mut c);
}

/// A conflict whose held row, or its fingerprint after pruning, was
/// delivered by the same producer store as the delivery is cause
/// `producer_rewound` (PROTOCOL.md section 12, rewound producers); from
/// another store, or from an unknown one on either side, it is an ordinary
/// `conflict`. Nothing is stored either way; a redelivery of the held event
/// itself stays `duplicate`.
pub fn receive_tells_a_rewound_producer_from_a_conflict<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (_p, mut c) = open_at::<B>(dir, &clock);
    let store = |digit: &str| StoreId::new(digit.repeat(32)).unwrap();
    let (s1, s2) = (store("1"), store("2"));
    let [f1, f2, _] = reservation_events("f", 3);
    let g1 = reservation_event("g", 1, 4);
    let from = |c: &mut B::Consumer, sender: Option<&StoreId>, e: &Envelope| {
        let answers = c.receive_from(sender, std::slice::from_ref(e)).unwrap();
        assert_eq!(answers.len(), 1);
        answers[0].clone()
    };
    assert_eq!(from(&mut c, Some(&s1), &f1).receipt, Receipt::Accepted);
    assert_eq!(from(&mut c, None, &g1).receipt, Receipt::Accepted);
    let senders: Vec<(String, Option<StoreId>)> =
        (c.inbox_entries(false, InboxScope::All, 10).unwrap())
            .into_iter()
            .map(|e| (e.envelope.event_id.as_str().to_owned(), e.store_id))
            .collect();
    assert_eq!(
        senders,
        [
            ("f-1".to_owned(), Some(s1.clone())),
            ("g-1".to_owned(), None)
        ],
        "each row keeps the store that delivered it"
    );
    let before = consumer_state(&mut c);
    // Another body at f's seq 1 (another event id), and another body under
    // f-1's own id.
    let other_at_seq = amount_event("f-1-again", "f", 1, 1, "reserved", 9);
    let other_body = amount_event(f1.event_id.as_str(), "f", 1, 1, "reserved", 9);
    let unknown_held = amount_event("g-1-again", "g", 1, 1, "reserved", 9);
    let rewound = |held: &Envelope| Answer {
        receipt: Receipt::ProducerRewound,
        held_event_id: Some(held.event_id.clone()),
    };
    let conflict = |held: &Envelope| Answer {
        receipt: Receipt::Conflict,
        held_event_id: Some(held.event_id.clone()),
    };
    for round in ["stored", "pruned"] {
        for changed in [&other_at_seq, &other_body] {
            assert_eq!(from(&mut c, Some(&s1), changed), rewound(&f1), "{round}");
            assert_eq!(from(&mut c, Some(&s2), changed), conflict(&f1), "{round}");
            assert_eq!(from(&mut c, None, changed), conflict(&f1), "{round}");
        }
        assert_eq!(
            from(&mut c, Some(&s1), &unknown_held),
            conflict(&g1),
            "{round}"
        );
        assert_eq!(from(&mut c, Some(&s1), &f1).receipt, Receipt::Duplicate);
        if round == "stored" {
            assert_eq!(
                consumer_state(&mut c),
                before,
                "a conflict changed something"
            );
            drain_flow(&mut c, "f", None, V1);
            drain_flow(&mut c, "g", None, V1);
            clock.set(T0 + 10_000);
            let pruned = c.prune_inbox(T0 + 20_000).unwrap();
            assert_eq!(pruned.rows, 2, "{pruned:?}");
        }
    }
    // The flow goes on from its sender, and one delivery's own rows are
    // held from it.
    let answers = c
        .receive_from(Some(&s1), &[f2.clone(), f2.clone()])
        .unwrap();
    assert_eq!(answers[0].receipt, Receipt::Accepted);
    assert_eq!(answers[1].receipt, Receipt::Duplicate);
    assert_eq!(
        inbox_envelopes(&mut c),
        vec![f2],
        "only f's seq 2 is stored"
    );
}

/// `receive` never changes the projection or the effects, whatever its
/// receipt: accepted (even the flow's next seq), duplicate of an applied or
/// pending row, conflict, or a blocked-to-be event.
pub fn receive_never_changes_projection_or_effects<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    let [e1, e2, e3] = reservation_events("f", 5);
    assert_eq!(c.receive(&e1).unwrap(), Receipt::Accepted);
    assert_eq!(apply_step(&mut c, "f", V1), applied_at(1));
    let projections = c.projections().unwrap();
    let effects = c.effects().unwrap();
    let inputs = [
        (e2.clone(), Receipt::Accepted),
        (e2.clone(), Receipt::Duplicate),
        (e1.clone(), Receipt::Duplicate),
        (e3.clone(), Receipt::Accepted),
        (
            amount_event("x", "f", 2, 1, "confirmed", 5),
            Receipt::Conflict,
        ),
        (
            amount_event(e1.event_id.as_str(), "f", 1, 1, "reserved", 9),
            Receipt::Conflict,
        ),
        (
            amount_event("g-1", "g", 1, 9, "reserved", 5),
            Receipt::Accepted,
        ),
        (reservation_event("h", 1, 1), Receipt::Accepted),
    ];
    for (e, receipt) in inputs {
        assert_eq!(c.receive(&e).unwrap(), receipt, "{e:?}");
        assert_eq!(
            c.projections().unwrap(),
            projections,
            "receive changed a projection"
        );
        assert_eq!(c.effects().unwrap(), effects, "receive changed effects");
    }
    assert_eq!(inbox_status(&mut c, &e2.event_id), InboxStatus::Pending);
    assert_eq!(inbox_status(&mut c, &e3.event_id), InboxStatus::Pending);
    check_consumer_invariants(&mut c);
}

/// Integer bounds on receive. `seq` `i64::MAX`, `i64::MAX - 1`, 2^53 and
/// 2^53 + 1 are stored exactly (distinct rows, read back unchanged, although
/// RFC 8785 writes them as doubles); a redelivery is a duplicate; another
/// event id at a stored large seq is a conflict and changes nothing; apply
/// reports the gap before them. `schema_version` `i64::MAX` is stored and
/// blocked as unsupported.
pub fn receive_seq_bounds<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    let max = amount_event("big-max", "big", i64::MAX, 1, "released", 1);
    assert_eq!(c.receive(&max).unwrap(), Receipt::Accepted);
    let inbox = c.inbox().unwrap();
    assert_eq!(inbox.len(), 1);
    assert_eq!(inbox[0].envelope.seq.get(), i64::MAX);
    assert_eq!(inbox[0].envelope.body(), max.body());

    let below = amount_event("big-below", "big", i64::MAX - 1, 1, "confirmed", 1);
    let far = amount_event("big-far", "big", 1 << 53, 1, "confirmed", 1);
    let far_next = amount_event("big-far-next", "big", (1 << 53) + 1, 1, "confirmed", 1);
    for e in [&below, &far, &far_next] {
        assert_eq!(c.receive(e).unwrap(), Receipt::Accepted, "seq {}", e.seq);
    }
    for e in [&max, &below, &far, &far_next] {
        assert_eq!(c.receive(e).unwrap(), Receipt::Duplicate, "seq {}", e.seq);
    }
    let inbox = c.inbox().unwrap();
    let stored: Vec<_> = inbox.iter().map(|r| r.envelope.clone()).collect();
    assert_eq!(
        stored,
        vec![far.clone(), far_next.clone(), below.clone(), max.clone()]
    );
    for (row, e) in inbox.iter().zip([&far, &far_next, &below, &max]) {
        assert_eq!(row.envelope.body(), e.body(), "seq {} body", e.seq);
        assert_eq!(row.status, InboxStatus::Pending);
    }
    let before = consumer_state(&mut c);
    let same_seq = amount_event("big-other", "big", i64::MAX, 1, "released", 1);
    assert_eq!(c.receive(&same_seq).unwrap(), Receipt::Conflict);
    assert_eq!(consumer_state(&mut c), before);

    assert_eq!(apply_step(&mut c, "big", V1), Step::Gap { missing: seq(1) });
    let first = amount_event("big-1", "big", 1, 1, "reserved", 1);
    assert_eq!(c.receive(&first).unwrap(), Receipt::Accepted);
    let d = drain_flow(&mut c, "big", None, V1);
    assert_eq!((d.applied, d.stop), (1, DrainStop::Gap));
    assert_eq!(apply_step(&mut c, "big", V1), Step::Gap { missing: seq(2) });

    let schema_max = amount_event("sv-1", "sv", 1, i64::MAX, "reserved", 1);
    assert_eq!(c.receive(&schema_max).unwrap(), Receipt::Accepted);
    assert_eq!(
        apply_step(&mut c, "sv", V2),
        blocked_at(1, ordo_reservation::UNSUPPORTED_SCHEMA)
    );
    assert_eq!(
        inbox_row(&mut c, &schema_max.event_id).unwrap().envelope,
        schema_max
    );
    check_consumer_invariants(&mut c);
}

/// Each `(producer, flow_id)` is its own flow (PROTOCOL.md section 12):
/// the same event ids and seqs from another producer are new; each flow is
/// applied in its own order onto its own projection; a conflict in one
/// delivery stops only its own producer's flow; the listings and a skip
/// name the producer and touch no other; the status counts each
/// producer's rows apart.
pub fn receive_and_apply_keep_each_producers_namespace<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    let of = |producer: &str, e: Envelope| Envelope {
        producer: ordo_core::ProducerName::new(producer).unwrap(),
        ..e
    };
    let orders = reservation_events("o", 3).map(|e| of("orders", e));
    let payments = reservation_events("o", 9).map(|e| of("payments", e));
    let default = reservation_event("o", 1, 4);
    let first = [
        orders[0].clone(),
        payments[0].clone(),
        orders[1].clone(),
        payments[1].clone(),
        default.clone(),
    ];
    assert_eq!(c.receive_batch(&first).unwrap(), [Receipt::Accepted; 5]);
    assert_eq!(c.receive(&payments[0]).unwrap(), Receipt::Duplicate);
    // Another body at payments' o seq 2 stops payments' o in this delivery
    // only; orders' o goes on.
    let other = of("payments", reservation_event("o", 2, 5));
    let answers = c
        .receive_answers(&[other, payments[2].clone(), orders[2].clone()])
        .unwrap();
    let held = Answer {
        receipt: Receipt::Conflict,
        held_event_id: Some(payments[1].event_id.clone()),
    };
    assert_eq!(
        answers,
        [
            held,
            Answer::of(Receipt::AfterConflict),
            Answer::of(Receipt::Accepted)
        ]
    );
    let listed = |c: &mut B::Consumer, scope| {
        let rows = c.inbox_entries(false, scope, 10).unwrap();
        rows.into_iter().map(|e| e.envelope).collect::<Vec<_>>()
    };
    let orders_name = ordo_core::ProducerName::new("orders").unwrap();
    assert_eq!(
        listed(&mut c, InboxScope::Producer(&orders_name)),
        orders.to_vec()
    );
    let payments_o = flow_of("payments", "o");
    assert_eq!(
        listed(&mut c, InboxScope::Flow(&payments_o)),
        payments[..2].to_vec()
    );
    assert_eq!(listed(&mut c, InboxScope::All).len(), 6);
    // The status counts each producer's rows apart.
    let shares: Vec<(String, u64)> = (c.consumer_status().unwrap().producers.iter())
        .map(|(name, share)| (name.to_string(), share.pending))
        .collect();
    let expected = [("default", 1), ("orders", 3), ("payments", 2)];
    assert_eq!(shares, expected.map(|(name, n)| (name.to_owned(), n)));
    // Three flows, each applied on its own.
    let drains = c.process_all(None, V1, 16).unwrap();
    let stops: Vec<(String, u64)> = drains
        .iter()
        .map(|d| (d.flow.to_string(), d.applied))
        .collect();
    assert_eq!(
        stops,
        [
            ("o".to_owned(), 1),
            ("o of producer orders".to_owned(), 3),
            ("o of producer payments".to_owned(), 2)
        ]
    );
    let state = |c: &mut B::Consumer, flow| {
        let p = c.projection(&flow).unwrap();
        (p.state, p.quantity.map(|q| q.get()), p.applied_seq)
    };
    assert_eq!(
        state(&mut c, flow_of("orders", "o")),
        (FlowState::Released, Some(3), 3)
    );
    assert_eq!(
        state(&mut c, payments_o.clone()),
        (FlowState::Confirmed, Some(9), 2)
    );
    assert_eq!(
        state(&mut c, inbox_flow("o")),
        (FlowState::Reserved, Some(4), 1)
    );
    // Payments' next event, skipped: its repair names payments; the others
    // stay as they are.
    assert_eq!(c.receive(&payments[2]).unwrap(), Receipt::Accepted);
    let request = ordo_core::ops::SkipRequest::new(
        payments_o.clone(),
        seq(3),
        "not needed".into(),
        "ops".into(),
    )
    .unwrap();
    let repair = c.skip(&request).unwrap().unwrap();
    assert_eq!(
        (repair.producer.as_str(), repair.flow_id.as_str()),
        ("payments", "o")
    );
    let skipped = c.inbox_entry_at(&payments_o, seq(3)).unwrap().unwrap();
    assert_eq!(skipped.status, InboxStatus::Skipped);
    let default_o = c.inbox_entry_at(&inbox_flow("o"), seq(1)).unwrap().unwrap();
    assert_eq!(default_o.status, InboxStatus::Applied);
    check_consumer_invariants(&mut c);
}

/// An unknown store identity never makes a rewound producer (PROTOCOL.md
/// section 12): a conflict with a row whose delivering store is unknown
/// (stored before the third release, or delivered without one) is cause
/// `conflict`, whether the delivery's store is known or unknown too, at the
/// row and at its fingerprint once pruned, and within one delivery; the
/// held row is the one at the envelope's place, whatever row holds its
/// event id. Nothing is stored.
pub fn receive_an_unknown_store_never_makes_a_rewound_producer<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (_p, mut c) = open_at::<B>(dir, &clock);
    let s1 = StoreId::new("1".repeat(32)).unwrap();
    let from = |c: &mut B::Consumer, sender: Option<&StoreId>, e: &Envelope| {
        let answers = c.receive_from(sender, std::slice::from_ref(e)).unwrap();
        assert_eq!(answers.len(), 1);
        answers[0].clone()
    };
    // f-1 from an unknown store, g-1 from s1.
    let f1 = reservation_event("f", 1, 5);
    let g1 = reservation_event("g", 1, 4);
    assert_eq!(from(&mut c, None, &f1).receipt, Receipt::Accepted);
    assert_eq!(from(&mut c, Some(&s1), &g1).receipt, Receipt::Accepted);
    let conflict = |held: &Envelope| Answer {
        receipt: Receipt::Conflict,
        held_event_id: Some(held.event_id.clone()),
    };
    let rewound = |held: &Envelope| Answer {
        receipt: Receipt::ProducerRewound,
        held_event_id: Some(held.event_id.clone()),
    };
    // Another event at f's seq 1, another body under f-1's id, and g-1's
    // id (held from s1) at f's seq 1 (held from no known store).
    let other_at_seq = amount_event("f-1-again", "f", 1, 1, "reserved", 9);
    let other_body = amount_event(f1.event_id.as_str(), "f", 1, 1, "reserved", 9);
    let g_id_at_f = amount_event(g1.event_id.as_str(), "f", 1, 1, "reserved", 9);
    // And the other way round: f-1's id at g's seq 1, whose row s1 stored.
    let f_id_at_g = amount_event(f1.event_id.as_str(), "g", 1, 1, "reserved", 9);
    let before = consumer_state(&mut c);
    for round in ["stored", "pruned"] {
        for sender in [Some(&s1), None] {
            for changed in [&other_at_seq, &other_body, &g_id_at_f] {
                let answer = from(&mut c, sender, changed);
                assert_eq!(
                    answer,
                    conflict(&f1),
                    "{round}, from {sender:?}: {changed:?}"
                );
            }
            assert_eq!(from(&mut c, sender, &f1).receipt, Receipt::Duplicate);
        }
        assert_eq!(
            from(&mut c, Some(&s1), &f_id_at_g),
            rewound(&g1),
            "{round}: the row at g's seq 1 came from s1"
        );
        assert_eq!(from(&mut c, None, &f_id_at_g), conflict(&g1), "{round}");
        if round == "stored" {
            assert_eq!(
                consumer_state(&mut c),
                before,
                "a conflict changed something"
            );
            drain_flow(&mut c, "f", None, V1);
            drain_flow(&mut c, "g", None, V1);
            clock.set(T0 + 10_000);
            let pruned = c.prune_inbox(T0 + 20_000).unwrap();
            assert_eq!(pruned.rows, 2, "{pruned:?}");
            assert!(
                inbox_envelopes(&mut c).is_empty(),
                "only fingerprints remain"
            );
        }
    }
    assert!(inbox_envelopes(&mut c).is_empty(), "nothing stored");
    // Within one delivery from no known store, a row it stored is held from
    // no known store: another body at its place is `conflict`.
    let h1 = reservation_event("h", 1, 3);
    let h1_other = amount_event("h-1-again", "h", 1, 1, "reserved", 6);
    let answers = c.receive_from(None, &[h1.clone(), h1_other]).unwrap();
    assert_eq!(answers, [Answer::of(Receipt::Accepted), conflict(&h1)]);
    assert_eq!(inbox_envelopes(&mut c), [h1]);
}

/// A rewound producer is told apart when the consumer keeps only the
/// fingerprint of the row it delivered before its restore, and its flows
/// begun after the detection are delivered and applied as any
/// (PROTOCOL.md section 12): the rewound flow's head is quarantined
/// `producer_rewound` and nothing more of it is delivered; a new flow of
/// the same store goes on.
pub fn a_rewound_producer_is_told_by_a_fingerprint_and_its_new_flows_go_on<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, mut c) = open_at::<B>(dir, &clock);
    let sender = p.store_id().clone();
    // Before its restore, the store delivered its A-1 (10 units); the
    // consumer applied it and pruned it, keeping its fingerprint.
    let forgotten = reservation_event("A", 1, 10);
    let answers = c
        .receive_from(Some(&sender), std::slice::from_ref(&forgotten))
        .unwrap();
    assert_eq!(answers[0].receipt, Receipt::Accepted);
    assert_eq!(process(&mut c, None, V1).len(), 1);
    clock.set(T0 + 10_000);
    assert_eq!(c.prune_inbox(T0 + 20_000).unwrap().rows, 1);
    assert!(inbox_row(&mut c, &forgotten.event_id).is_none());

    // Restored, the store commits another A-1 (7 units), and A-2 after it.
    let a1 = commit(&mut p, &request("A", 0, FlowState::Reserved, Some(7), 1));
    let a2 = commit(&mut p, &request("A", 1, FlowState::Confirmed, None, 1));
    assert_eq!(a1.event_id, forgotten.event_id);
    assert_ne!(a1.body(), forgotten.body());
    let at = T0 + 30_000;
    let report = relay_fair_at(&mut p, &mut c, None, 256, at);
    assert_eq!(
        report.deliveries,
        [delivery(&a1, Receipt::ProducerRewound)],
        "{report:?}"
    );
    let entry = outbox_entry(&mut p, &a1);
    assert_quarantined(&entry);
    assert_eq!(entry.quarantine_reason.as_deref(), Some("producer_rewound"));
    let status = p.producer_status(at).unwrap();
    assert_eq!(
        (status.quarantined, status.rewound, status.backlog),
        (1, 1, 2)
    );
    // The held event the consumer names is the fingerprint's.
    let answers = c
        .receive_from(Some(&sender), std::slice::from_ref(&a1))
        .unwrap();
    assert_eq!(
        answers,
        [Answer {
            receipt: Receipt::ProducerRewound,
            held_event_id: Some(forgotten.event_id.clone()),
        }]
    );

    // A flow begun after the detection, by the same store, goes on.
    let n = commit_full_flow(&mut p, "N", 3);
    let report = relay_fair_at(&mut p, &mut c, None, 256, at + 1);
    let delivered: Vec<_> = n.iter().map(|e| delivery(e, Receipt::Accepted)).collect();
    assert_eq!(report.deliveries, delivered, "only N, in order");
    assert!(relay_fair_at(&mut p, &mut c, None, 256, at + 2)
        .deliveries
        .is_empty());
    assert!(n.iter().all(|e| is_accepted(&mut p, e)));
    assert!(!is_accepted(&mut p, &a2) && !outbox_entry(&mut p, &a2).quarantined);
    let drains = process(&mut c, None, V1);
    assert_eq!(drain_stops(&drains), [("N", 3, DrainStop::Idle)]);
    assert_eq!(projected(&mut c, "N"), (FlowState::Released, Some(3), 3));
    assert_eq!(
        (inbox_entries(&mut c).iter())
            .map(|e| (e.envelope.event_id.to_string(), e.store_id.clone()))
            .collect::<Vec<_>>(),
        n.iter()
            .map(|e| (e.event_id.to_string(), Some(sender.clone())))
            .collect::<Vec<_>>(),
        "only N stored, from the same store"
    );
    assert_eq!(projected(&mut c, "A"), (FlowState::Reserved, Some(10), 1));
}
