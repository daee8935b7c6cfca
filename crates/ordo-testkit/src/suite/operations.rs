//! docs/PROTOCOL.md section 8 on the consumer side: blocked rows and their
//! re-evaluation, the explicit, audited skip, the consumer's status signals,
//! and inbox retention that still recognises every late redelivery.
//!
//! Time is always controlled: explicit `now_ms` and `cutoff_ms` values and a
//! [`ManualClock`] for the times the stores stamp themselves.

#[allow(unused_imports)]
use ordo_reservation::{
    FlowState, ReservationConsumer, INVALID_PAYLOAD, INVALID_TRANSITION, UNSUPPORTED_SCHEMA,
};
use std::collections::BTreeMap;
use std::path::Path;

use ordo_core::ops::{
    ConsumerStatus, GapWait, InvalidSkip, ProducerInbox, Pruned, SkipRefused, SkipRequest,
    REPAIR_BY_LEN_MAX, REPAIR_REASON_LEN_MAX,
};
use ordo_core::{BlockReason, ConsumerOps, DrainStop, InboxStatus, Receipt, Receive, Step};
use serde_json::json;

use crate::support::*;
use crate::Backend;
use ordo_core::ops::InboxScope;
use ordo_core::ProducerName;

/// A valid skip request; panics if its own rules refuse it.
fn skip_request(flow_id: &str, seq_value: i64, reason: &str, by: &str) -> SkipRequest {
    SkipRequest::new(
        inbox_flow(flow_id),
        seq(seq_value),
        reason.into(),
        by.into(),
    )
    .expect("test skip request is valid")
}

/// A status's blocked counts from `(reason, count)` pairs.
fn blocked(counts: &[(BlockReason, u64)]) -> BTreeMap<String, u64> {
    counts
        .iter()
        .map(|(reason, n)| (reason.as_str().to_owned(), *n))
        .collect()
}

/// A skip the flow's state refuses (the seq is already applied, is not the
/// flow's next one, or is not stored) writes nothing: no status, cursor,
/// effect or repair log entry changes. A request with an empty or too long
/// reason or name is refused before any storage is touched.
pub fn skip_refusals_write_nothing<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (_p, mut c) = open_at::<B>(dir, &clock);
    // s: seq 1 applied, seq 2 stored and blocked, seq 4 stored
    let s1 = reservation_event("s", 1, 5);
    let s2 = amount_event("s-2", "s", 2, 1, "confirmed", 0);
    let s4 = amount_event("s-4", "s", 4, 1, "released", 5);
    // g: seq 1 missing, seq 2 stored
    let g2 = reservation_event("g", 2, 7);
    for e in [&s1, &s2, &s4, &g2] {
        assert_eq!(c.receive(e).unwrap(), Receipt::Accepted);
    }
    let d = drain_flow(&mut c, "s", None, V1);
    assert_eq!(
        (d.applied, d.stop),
        (1, DrainStop::Blocked(INVALID_PAYLOAD))
    );
    let state = consumer_state(&mut c);
    let entries = inbox_entries(&mut c);
    let status = c.consumer_status().unwrap();

    // Each refused skip: its flow, seq and reason, and why it is refused.
    enum Refused {
        Settled { applied_seq: i64 },
        NotNext { next: i64 },
        NotStored,
    }
    use Refused::*;
    let refusals = [
        ("s", 1, "again", Settled { applied_seq: 1 }),
        ("s", 3, "not stored, not next", NotNext { next: 2 }),
        ("s", 4, "stored, not next", NotNext { next: 2 }),
        ("g", 1, "the gap itself", NotStored),
        ("g", 2, "past the gap", NotNext { next: 1 }),
        ("none", 1, "nothing received", NotStored),
    ];
    for (flow_id, seq_value, reason, refused) in refusals {
        let request = skip_request(flow_id, seq_value, reason, "ops");
        let (flow, seq) = (inbox_flow(flow_id), seq(seq_value));
        let refused = match refused {
            Settled { applied_seq } => SkipRefused::AlreadySettled {
                flow,
                seq,
                applied_seq,
            },
            NotNext { next } => SkipRefused::NotNext { flow, seq, next },
            NotStored => SkipRefused::NotStored { flow, seq },
        };
        assert_eq!(
            skip_at(&mut c, &clock, &request, T0 + 100).unwrap(),
            Err(refused),
            "{request:?}"
        );
        assert_eq!(consumer_state(&mut c), state, "{request:?} wrote");
        assert_eq!(inbox_entries(&mut c), entries, "{request:?} wrote");
        assert_eq!(c.consumer_status().unwrap(), status, "{request:?} wrote");
        assert!(c.repairs().unwrap().is_empty(), "{request:?} logged");
    }
    assert_eq!(
        apply_step(&mut c, "g", V1),
        Step::Gap { missing: seq(1) },
        "a refused skip does not pass a gap"
    );
    assert_eq!(apply_step(&mut c, "s", V1), blocked_at(2, INVALID_PAYLOAD));

    // the request's own rules
    let new = |reason: &str, by: &str| {
        SkipRequest::new(inbox_flow("s"), seq(2), reason.to_owned(), by.to_owned())
    };
    let max_reason = "r".repeat(REPAIR_REASON_LEN_MAX);
    let max_by = "b".repeat(REPAIR_BY_LEN_MAX);
    assert_eq!(new("", "ops"), Err(InvalidSkip::Reason(0)));
    assert_eq!(new(" \t ", "ops"), Err(InvalidSkip::Reason(3)));
    assert_eq!(
        new(&format!("{max_reason}r"), "ops"),
        Err(InvalidSkip::Reason(REPAIR_REASON_LEN_MAX + 1))
    );
    assert_eq!(new("why", ""), Err(InvalidSkip::By(0)));
    assert_eq!(new("why", " "), Err(InvalidSkip::By(1)));
    assert_eq!(
        new("why", &format!("{max_by}b")),
        Err(InvalidSkip::By(REPAIR_BY_LEN_MAX + 1))
    );
    let longest = new(&max_reason, &max_by).expect("the longest reason and name");
    assert_eq!(
        (longest.reason.len(), longest.by.len()),
        (REPAIR_REASON_LEN_MAX, REPAIR_BY_LEN_MAX)
    );
}

/// A valid skip marks the flow's next stored event `skipped` (body
/// unchanged, no effect, projection unchanged), moves apply past it so that
/// the next event applies, and appends who, why and when to the repair log,
/// which `repairs` lists oldest first and which survives a reopen. A
/// skipped event is settled: skipping it again is refused and its
/// redelivery is a duplicate.
pub fn skip_marks_skipped_moves_past_and_logs_the_repair<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (_p, mut c) = open_at::<B>(dir, &clock);
    let s1 = reservation_event("s", 1, 5);
    let s2 = amount_event("s-2", "s", 2, 1, "confirmed", 0);
    let s3 = amount_event("s-3", "s", 3, 1, "confirmed", 5);
    let s4 = amount_event("s-4", "s", 4, 1, "released", 5);
    for e in [&s1, &s2, &s3] {
        assert_eq!(c.receive(e).unwrap(), Receipt::Accepted);
    }
    clock.set(T0 + 1_000);
    let d = drain_flow(&mut c, "s", None, V1);
    assert_eq!(
        (d.applied, d.stop),
        (1, DrainStop::Blocked(INVALID_PAYLOAD))
    );
    let projection_before = projection(&mut c, "s");
    let effects_before = c.effects().unwrap();

    let reason = "amount 0 was a producer bug; the step is re-issued as seq 3";
    let skipped_at = T0 + 5_000;
    let record = skip_at(
        &mut c,
        &clock,
        &skip_request("s", 2, reason, "alice"),
        skipped_at,
    )
    .unwrap()
    .expect("skip the blocked seq 2");
    assert_eq!(
        (
            record.action.as_str(),
            &record.flow_id,
            record.seq,
            &record.event_id,
            record.reason.as_str(),
            record.by.as_str(),
            record.at_ms
        ),
        (
            "skip",
            &flow("s"),
            seq(2),
            &s2.event_id,
            reason,
            "alice",
            skipped_at
        )
    );
    assert_eq!(c.repairs().unwrap(), vec![record.clone()]);
    let row = inbox_row(&mut c, &s2.event_id).unwrap();
    assert_eq!(
        (row.envelope, row.status),
        (s2.clone(), InboxStatus::Skipped),
        "skipped, body unchanged"
    );
    let entry = inbox_entries(&mut c)
        .into_iter()
        .find(|e| e.envelope.event_id == s2.event_id)
        .unwrap();
    assert_eq!(entry.settled_at_ms, Some(skipped_at), "{entry:?}");
    assert_eq!(c.effects().unwrap(), effects_before, "a skip has no effect");
    assert_eq!(projection(&mut c, "s"), projection_before);

    // apply moves past the skipped seq
    assert_eq!(apply_step(&mut c, "s", V1), applied_at(3));
    assert_eq!(projected(&mut c, "s"), (FlowState::Confirmed, Some(5), 3));
    assert_eq!(flow_effects(&mut c, "s"), effects_for([&s1, &s3]));
    assert_eq!(
        skip_at(
            &mut c,
            &clock,
            &skip_request("s", 2, reason, "alice"),
            skipped_at + 1
        )
        .unwrap(),
        Err(SkipRefused::AlreadySettled {
            flow: inbox_flow("s"),
            seq: seq(2),
            applied_seq: 3
        })
    );
    assert_eq!(c.receive(&s2).unwrap(), Receipt::Duplicate);
    assert_eq!(inbox_status(&mut c, &s2.event_id), InboxStatus::Skipped);
    assert_eq!(
        c.reopen_blocked(&inbox_flow("s")).unwrap(),
        0,
        "a skipped row is not blocked"
    );
    assert_eq!(inbox_status(&mut c, &s2.event_id), InboxStatus::Skipped);

    // a pending (not blocked) next event can be skipped too
    assert_eq!(c.receive(&s4).unwrap(), Receipt::Accepted);
    let second = skip_at(
        &mut c,
        &clock,
        &skip_request("s", 4, "released by hand", "bob"),
        skipped_at + 2,
    )
    .unwrap()
    .expect("skip the pending seq 4");
    assert!(second.id > record.id, "{second:?} after {record:?}");
    assert_eq!(
        (second.seq, &second.event_id, second.by.as_str()),
        (seq(4), &s4.event_id, "bob")
    );
    assert_eq!(c.repairs().unwrap(), vec![record.clone(), second.clone()]);
    assert_eq!(apply_step(&mut c, "s", V1), Step::Idle);
    assert_eq!(flow_effects(&mut c, "s"), effects_for([&s1, &s3]));
    let statuses: Vec<InboxStatus> = c.inbox().unwrap().into_iter().map(|r| r.status).collect();
    assert_eq!(
        statuses,
        vec![
            InboxStatus::Applied,
            InboxStatus::Skipped,
            InboxStatus::Applied,
            InboxStatus::Skipped
        ]
    );
    let status = c.consumer_status().unwrap();
    assert_eq!(
        (status.applied, status.skipped, status.pending),
        (2, 2, 0),
        "{status:?}"
    );
    assert!(
        status.blocked.is_empty() && status.gaps.is_empty(),
        "{status:?}"
    );

    let state = consumer_state(&mut c);
    drop(c);
    let (_p, mut c) = open_at::<B>(dir, &clock);
    assert_eq!(c.repairs().unwrap(), vec![record, second]);
    assert_eq!(consumer_state(&mut c), state);
    assert_eq!(apply_step(&mut c, "s", V1), Step::Idle);
}

/// `reopen_blocked` sets one flow's blocked rows back to pending (and
/// reports how many); apply then evaluates them again: without schema 2
/// support a schema 2 row blocks again, with it the row is applied as
/// stored; a row that is still invalid blocks again with its reason.
/// `inbox_entries(true, ..)` lists only blocked rows, per flow if asked.
pub fn reopen_blocked_re_evaluates_with_support_v2<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (_p, mut c) = open_at::<B>(dir, &clock);
    let v1 = envelope("v-1", "v", 1, 2, "reserved", json!({"units": 7}));
    let v2 = reservation_event("v", 2, 7);
    let w1 = amount_event("w-1", "w", 1, 9, "reserved", 7);
    let x1 = amount_event("x-1", "x", 1, 1, "reserved", 0);
    let y1 = amount_event("y-1", "y", 1, 1, "confirmed", 7);
    for e in [&v1, &v2, &w1, &x1, &y1] {
        assert_eq!(c.receive(e).unwrap(), Receipt::Accepted);
    }
    let drains = process(&mut c, None, V1);
    assert_eq!(
        drain_stops(&drains),
        vec![
            ("v", 0, DrainStop::Blocked(UNSUPPORTED_SCHEMA)),
            ("w", 0, DrainStop::Blocked(UNSUPPORTED_SCHEMA)),
            ("x", 0, DrainStop::Blocked(INVALID_PAYLOAD)),
            ("y", 0, DrainStop::Blocked(INVALID_TRANSITION)),
        ]
    );
    let listed = c.inbox_entries(true, InboxScope::All, 100).unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|e| (e.envelope.clone(), e.status.clone()))
            .collect::<Vec<_>>(),
        vec![
            (v1.clone(), InboxStatus::Blocked(UNSUPPORTED_SCHEMA)),
            (w1.clone(), InboxStatus::Blocked(UNSUPPORTED_SCHEMA)),
            (x1.clone(), InboxStatus::Blocked(INVALID_PAYLOAD)),
            (y1.clone(), InboxStatus::Blocked(INVALID_TRANSITION)),
        ],
        "only blocked rows"
    );
    assert_eq!(
        c.inbox_entries(true, InboxScope::Flow(&inbox_flow("w")), 100)
            .unwrap(),
        listed[1..2].to_vec()
    );
    assert_eq!(
        c.inbox_entries(true, InboxScope::All, 2).unwrap(),
        listed[..2].to_vec()
    );
    assert_eq!(
        c.inbox_entries(false, InboxScope::Flow(&inbox_flow("v")), 100)
            .unwrap()
            .into_iter()
            .map(|e| e.envelope)
            .collect::<Vec<_>>(),
        vec![v1.clone(), v2.clone()]
    );

    assert_eq!(c.reopen_blocked(&inbox_flow("none")).unwrap(), 0);
    assert_eq!(c.reopen_blocked(&inbox_flow("v")).unwrap(), 1);
    assert_eq!(inbox_status(&mut c, &v1.event_id), InboxStatus::Pending);
    for (e, reason) in [
        (&w1, UNSUPPORTED_SCHEMA),
        (&x1, INVALID_PAYLOAD),
        (&y1, INVALID_TRANSITION),
    ] {
        assert_eq!(
            inbox_status(&mut c, &e.event_id),
            InboxStatus::Blocked(reason),
            "another flow's row was reopened"
        );
    }
    let status = c.consumer_status().unwrap();
    assert_eq!(status.pending, 2, "{status:?}");
    assert_eq!(
        status.blocked,
        blocked(&[
            (UNSUPPORTED_SCHEMA, 1),
            (INVALID_PAYLOAD, 1),
            (INVALID_TRANSITION, 1)
        ])
    );

    // evaluated again without schema 2 support: blocked again
    assert_eq!(
        apply_step(&mut c, "v", V1),
        blocked_at(1, UNSUPPORTED_SCHEMA)
    );
    assert_eq!(
        inbox_status(&mut c, &v1.event_id),
        InboxStatus::Blocked(UNSUPPORTED_SCHEMA)
    );
    // reopened and evaluated with it: applied as stored
    assert_eq!(c.reopen_blocked(&inbox_flow("v")).unwrap(), 1);
    assert_eq!(apply_step(&mut c, "v", V2), applied_at(1));
    assert_eq!(apply_step(&mut c, "v", V1), applied_at(2));
    assert_eq!(projected(&mut c, "v"), (FlowState::Confirmed, Some(7), 2));
    assert_eq!(flow_effects(&mut c, "v"), effects_for([&v1, &v2]));
    assert_eq!(
        inbox_row(&mut c, &v1.event_id).map(|r| (r.envelope, r.status)),
        Some((v1.clone(), InboxStatus::Applied)),
        "applied as stored"
    );
    assert_eq!(
        c.reopen_blocked(&inbox_flow("v")).unwrap(),
        0,
        "applied rows stay"
    );

    // rows still invalid block again, with their reason
    for (f, e, reason) in [
        ("w", &w1, UNSUPPORTED_SCHEMA),
        ("x", &x1, INVALID_PAYLOAD),
        ("y", &y1, INVALID_TRANSITION),
    ] {
        assert_eq!(c.reopen_blocked(&inbox_flow(f)).unwrap(), 1, "{f}");
        assert_eq!(inbox_status(&mut c, &e.event_id), InboxStatus::Pending);
        assert_eq!(
            apply_step(&mut c, f, V2),
            blocked_at(1, reason.clone()),
            "{f}"
        );
        assert_eq!(
            inbox_row(&mut c, &e.event_id).map(|r| (r.envelope, r.status)),
            Some((e.clone(), InboxStatus::Blocked(reason))),
            "{f}: blocked again, body unchanged"
        );
        assert!(projection(&mut c, f).is_none(), "{f}");
    }
    assert_eq!(c.effects().unwrap().len(), 2);
    check_consumer_invariants(&mut c);
}

/// The default producer's share of a status, the only producer's.
fn default_share(
    pending: u64,
    blocked: u64,
    gap_flows: u64,
) -> BTreeMap<ProducerName, ProducerInbox> {
    let share = ProducerInbox {
        pending,
        blocked,
        gap_flows,
    };
    BTreeMap::from([(ProducerName::default(), share)])
}

/// `consumer_status`: the number of pending rows (a gapped flow's rows are
/// pending), blocked rows by reason, and every flow waiting on a gap with the
/// missing seq and since when (the earliest reception of an event after the
/// gap), plus applied and skipped counts, and each producer's share of the
/// pending and blocked rows and of the gaps. The signals follow the state:
/// a gap closes when its event arrives.
pub fn consumer_status_counts_pending_blocked_and_gaps<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (_p, mut c) = open_at::<B>(dir, &clock);
    assert_eq!(c.consumer_status().unwrap(), ConsumerStatus::default());
    let at = |ms: i64| T0 + ms;
    let p = reservation_events("p", 2);
    let g = reservation_events("g", 3);
    let h = reservation_events("h", 4);
    let x1 = amount_event("x-1", "x", 1, 1, "reserved", 0);
    let x2 = reservation_event("x", 2, 1);
    let y1 = amount_event("y-1", "y", 1, 9, "reserved", 1);
    let z1 = amount_event("z-1", "z", 1, 1, "released", 1);
    let arrivals: [(i64, Vec<&ordo_core::Envelope>); 6] = [
        (0, vec![&p[0], &p[1]]),
        (200, vec![&g[2]]),
        (500, vec![&g[1]]),
        (700, vec![&h[0]]),
        (800, vec![&x1, &x2, &y1, &z1]),
        (1_000, vec![&h[2]]),
    ];
    for (ms, events) in arrivals {
        clock.set(at(ms));
        for e in events {
            assert_eq!(c.receive(e).unwrap(), Receipt::Accepted, "{e:?}");
        }
    }
    // a redelivery is not a new reception
    clock.set(at(1_100));
    assert_eq!(c.receive(&g[2]).unwrap(), Receipt::Duplicate);
    clock.set(at(1_500));
    for (f, applied, stop) in [
        ("h", 1, DrainStop::Gap),
        ("x", 0, DrainStop::Blocked(INVALID_PAYLOAD)),
        ("y", 0, DrainStop::Blocked(UNSUPPORTED_SCHEMA)),
        ("z", 0, DrainStop::Blocked(INVALID_TRANSITION)),
    ] {
        let d = drain_flow(&mut c, f, None, V1);
        assert_eq!((d.applied, d.stop), (applied, stop), "{f}");
    }
    let gap_g = GapWait {
        producer: ProducerName::default(),
        flow_id: flow("g"),
        missing: seq(1),
        since_ms: at(200),
    };
    let gap_h = GapWait {
        producer: ProducerName::default(),
        flow_id: flow("h"),
        missing: seq(2),
        since_ms: at(1_000),
    };
    let blocked_rows = blocked(&[
        (UNSUPPORTED_SCHEMA, 1),
        (INVALID_PAYLOAD, 1),
        (INVALID_TRANSITION, 1),
    ]);
    assert_eq!(
        c.consumer_status().unwrap(),
        ConsumerStatus {
            pending: 6, // p1, p2, g2, g3, h3, x2
            blocked: blocked_rows.clone(),
            gaps: vec![gap_g.clone(), gap_h.clone()],
            gaps_total: 2,
            applied: 1,
            skipped: 0,
            producers: default_share(6, 3, 2),
        }
    );

    // g's gap closes when its event arrives
    clock.set(at(2_000));
    assert_eq!(c.receive(&g[0]).unwrap(), Receipt::Accepted);
    let status = c.consumer_status().unwrap();
    assert_eq!(
        (status.pending, &status.gaps),
        (7, &vec![gap_h.clone()]),
        "{status:?}"
    );
    process(&mut c, None, V1);
    assert_eq!(
        c.consumer_status().unwrap(),
        ConsumerStatus {
            pending: 2, // h3, x2
            blocked: blocked_rows.clone(),
            gaps: vec![gap_h],
            gaps_total: 1,
            applied: 6,
            skipped: 0,
            producers: default_share(2, 3, 1),
        }
    );
    clock.set(at(3_000));
    assert_eq!(c.receive(&h[1]).unwrap(), Receipt::Accepted);
    process(&mut c, None, V1);
    assert_eq!(
        c.consumer_status().unwrap(),
        ConsumerStatus {
            pending: 1,
            blocked: blocked_rows,
            gaps: vec![],
            gaps_total: 0,
            applied: 8,
            skipped: 0,
            producers: default_share(1, 3, 0),
        }
    );
}

/// `consumer_status` lists at most `GAPS_LISTED_MAX` gap-waiting flows, the
/// first by flow id, and counts them all.
pub fn consumer_status_caps_the_listed_gaps<B: Backend>(dir: &Path) {
    let (_p, mut c) = B::open(dir);
    let total = ordo_core::ops::GAPS_LISTED_MAX + 1;
    let waiting: Vec<ordo_core::Envelope> = (0..total)
        .map(|i| {
            amount_event(
                &format!("g{i:05}-2"),
                &format!("g{i:05}"),
                2,
                1,
                "confirmed",
                1,
            )
        })
        .collect();
    let receipts = c.receive_batch(&waiting).unwrap();
    assert!(receipts.iter().all(|r| *r == Receipt::Accepted));
    let status = c.consumer_status().unwrap();
    assert_eq!(status.gaps_total, total as u64);
    assert_eq!(status.gaps.len(), ordo_core::ops::GAPS_LISTED_MAX);
    assert_eq!(status.gaps[0].flow_id, flow("g00000"));
    assert_eq!(
        status.gaps.last().unwrap().flow_id,
        flow(&format!("g{:05}", total - 2))
    );
    assert_eq!(status.pending, total as u64);
}

/// `prune_inbox` removes only applied and skipped rows settled strictly
/// before the cutoff (pending and blocked rows stay, whatever their age) and
/// keeps one fingerprint per removed row. After it: a redelivery of a pruned
/// event is `duplicate`; a changed body under its id, another event id at its
/// `(flow, seq)`, or its id at another seq is `conflict`; nothing is stored
/// again or applied twice; the flow goes on with its next seq; applied and
/// skipped counts still include the pruned rows.
pub fn prune_inbox_keeps_fingerprints_and_never_reapplies<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (_p, mut c) = open_at::<B>(dir, &clock);
    let at = |ms: i64| T0 + ms;
    let a = reservation_events("a", 3);
    let b = reservation_events("b", 4);
    let m = reservation_events("m", 6);
    let k1 = amount_event("k-1", "k", 1, 1, "reserved", 0);
    let x1 = amount_event("x-1", "x", 1, 9, "reserved", 1);
    let p1 = reservation_event("p", 1, 8);
    for e in a.iter().chain(&b[..2]).chain([&m[0], &k1, &x1]) {
        assert_eq!(c.receive(e).unwrap(), Receipt::Accepted);
    }
    clock.set(at(2_000));
    for (f, limit) in [
        ("a", None),
        ("b", Some(1)),
        ("m", None),
        ("k", None),
        ("x", None),
    ] {
        drain_flow(&mut c, f, limit, V1);
    }
    skip_at(
        &mut c,
        &clock,
        &skip_request("k", 1, "bad amount", "ops"),
        at(3_000),
    )
    .unwrap()
    .expect("skip k-1");
    clock.set(at(8_000));
    assert_eq!(drain_flow(&mut c, "b", None, V1).applied, 1);
    assert_eq!(c.receive(&p1).unwrap(), Receipt::Accepted);
    let before = consumer_state(&mut c);
    let status = c.consumer_status().unwrap();
    assert_eq!((status.applied, status.skipped), (6, 1), "{status:?}");

    assert_eq!(
        c.prune_inbox(at(2_000)).unwrap(),
        Pruned {
            rows: 0,
            fingerprints: 0
        },
        "settled at the cutoff is not before it"
    );
    assert_eq!(
        c.prune_inbox(at(5_000)).unwrap(),
        Pruned {
            rows: 6,
            fingerprints: 6
        },
        "a1-a3, b1, m1 and the skipped k1"
    );
    assert_eq!(
        inbox_envelopes(&mut c),
        vec![b[1].clone(), p1.clone(), x1.clone()],
        "a row settled after the cutoff, a pending and a blocked row stay"
    );
    assert_eq!(c.projections().unwrap(), before.projections);
    assert_eq!(c.effects().unwrap(), before.effects);
    assert_eq!(
        c.consumer_status().unwrap(),
        ConsumerStatus {
            pending: 1,
            blocked: blocked(&[(UNSUPPORTED_SCHEMA, 1)]),
            gaps: vec![],
            gaps_total: 0,
            applied: 6,
            skipped: 1,
            producers: default_share(1, 1, 0),
        }
    );

    let kept = consumer_state(&mut c);
    for e in a.iter().chain([&b[0], &m[0], &k1, &b[1]]) {
        assert_eq!(c.receive(e).unwrap(), Receipt::Duplicate, "{e:?}");
    }
    let changed_body = amount_event("a-2", "a", 2, 1, "confirmed", 4);
    let other_id = amount_event("a-2-again", "a", 2, 1, "confirmed", 3);
    let id_elsewhere = amount_event("a-1", "a", 4, 1, "released", 3);
    let skipped_other = amount_event("k-1-again", "k", 1, 1, "reserved", 2);
    for e in [&changed_body, &other_id, &id_elsewhere, &skipped_other] {
        assert_eq!(c.receive(e).unwrap(), Receipt::Conflict, "{e:?}");
    }
    assert_eq!(
        c.receive_batch(&[a[0].clone(), changed_body.clone(), m[0].clone()])
            .unwrap(),
        vec![Receipt::Duplicate, Receipt::Conflict, Receipt::Duplicate]
    );
    assert_eq!(
        consumer_state(&mut c),
        kept,
        "a redelivery stored something"
    );
    for f in ["a", "m", "k"] {
        assert_eq!(apply_step(&mut c, f, V1), Step::Idle, "{f}");
    }
    assert_eq!(c.effects().unwrap(), before.effects, "applied twice");

    // the flows go on with their next seq
    assert_eq!(c.receive(&m[1]).unwrap(), Receipt::Accepted);
    let k2 = amount_event("k-2", "k", 2, 1, "reserved", 2);
    assert_eq!(c.receive(&k2).unwrap(), Receipt::Accepted);
    clock.set(at(9_000));
    assert_eq!(apply_step(&mut c, "m", V1), applied_at(2));
    assert_eq!(apply_step(&mut c, "k", V1), applied_at(2));
    assert_eq!(projected(&mut c, "m"), (FlowState::Confirmed, Some(6), 2));
    assert_eq!(flow_effects(&mut c, "m"), effects_for(&m[..2]));

    assert_eq!(
        c.prune_inbox(at(5_000)).unwrap(),
        Pruned {
            rows: 0,
            fingerprints: 0
        }
    );
    assert_eq!(
        c.prune_inbox(at(1_000_000)).unwrap(),
        Pruned {
            rows: 3,
            fingerprints: 3
        },
        "b2, m2, k2"
    );
    assert_eq!(inbox_envelopes(&mut c), vec![p1.clone(), x1.clone()]);
    let status = c.consumer_status().unwrap();
    assert_eq!(
        (status.applied, status.skipped, status.pending),
        (8, 1, 1),
        "{status:?}"
    );
    let effects = c.effects().unwrap();
    assert_eq!(effects.len(), 8);

    drop(c);
    let (_p, mut c) = open_at::<B>(dir, &clock);
    for e in [&a[2], &b[1], &m[1], &k1] {
        assert_eq!(c.receive(e).unwrap(), Receipt::Duplicate, "{e:?}");
    }
    assert_eq!(c.receive(&changed_body).unwrap(), Receipt::Conflict);
    assert_eq!(process(&mut c, None, V1).len(), 1, "only p has work");
    assert_eq!(c.effects().unwrap(), [effects, effects_for([&p1])].concat());
}
