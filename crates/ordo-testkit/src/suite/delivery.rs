//! docs/PROTOCOL.md section 8 on the producer side: the fair relay, delivery
//! bookkeeping (receipts, transient failures with backoff, quarantine and
//! its retry), the producer's status signals and outbox retention.
//!
//! Time is always controlled: explicit `now_ms` values, a `FixedClock` for
//! relay runs, and a [`ManualClock`] for the times the stores stamp
//! themselves. Nothing sleeps.

#[allow(unused_imports)]
use ordo_reservation::{
    Advance, ApplyOptions, EffectRecord, FlowState, Projection, ReservationConsumer,
    ReservationProducer,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

use ordo_core::ops::{ProducerStatus, RetryRefused};
use ordo_core::{
    Backoff, ConsumerOps, ConsumerStore, Delivery, Envelope, ErrorKind, EventId, FixedClock,
    FlowId, ProducerOps, ProducerStore, Receipt, Receive, RelayOptions, RelayPolicy, RelayReport,
    RelayStop, StoreError, Transport, TransportError, PRODUCER_REWOUND_REASON,
};

use crate::support::*;
use crate::Backend;

use FlowState::{Confirmed, Released, Reserved};

/// Checks a fair relay run that delivered every event of `events` (all due,
/// none conflicting) in rounds of `batch_len_max`: each round takes
/// `min(batch_len_max, flows with a head)` events, one per flow, each its
/// flow's head (lowest seq not yet delivered); the flows taken are the ones
/// served least recently (in an earlier round, or never), listed least
/// recently served first. Flows served in the same round are equally recent:
/// their order is not specified.
fn check_fair_rounds(deliveries: &[Delivery], events: &[Envelope], batch_len_max: usize) {
    let mut remaining: BTreeMap<FlowId, VecDeque<i64>> = BTreeMap::new();
    for e in by_flow_seq(events.iter().cloned()) {
        remaining
            .entry(e.flow_id.clone())
            .or_default()
            .push_back(e.seq.get());
    }
    // the round in which each flow was last served; 0: never
    let mut served: BTreeMap<FlowId, usize> = remaining.keys().map(|f| (f.clone(), 0)).collect();
    let mut rest = deliveries;
    let mut round_no = 0;
    while !rest.is_empty() {
        round_no += 1;
        let with_head: Vec<FlowId> = remaining
            .iter()
            .filter(|(_, seqs)| !seqs.is_empty())
            .map(|(f, _)| f.clone())
            .collect();
        let size = batch_len_max.min(with_head.len());
        assert!(
            size > 0 && rest.len() >= size,
            "round {round_no}: {} deliveries left for {size} heads: {rest:?}",
            rest.len()
        );
        let (round, tail) = rest.split_at(size);
        let taken: BTreeSet<&FlowId> = round.iter().map(|d| &d.flow_id).collect();
        assert_eq!(
            taken.len(),
            size,
            "round {round_no} takes one event per flow: {round:?}"
        );
        for d in round {
            assert_eq!(
                remaining[&d.flow_id].front(),
                Some(&d.seq.get()),
                "round {round_no}: {d:?} is not its flow's head"
            );
        }
        let last_served_taken = round.iter().map(|d| served[&d.flow_id]).max();
        let least_recent_left = with_head
            .iter()
            .filter(|f| !taken.contains(f))
            .map(|f| served[f])
            .min();
        if let (Some(taken), Some(left)) = (last_served_taken, least_recent_left) {
            assert!(
                taken <= left,
                "round {round_no} takes a flow served in round {taken} before one served in \
                 round {left}: {round:?} (served: {served:?})"
            );
        }
        assert!(
            round
                .windows(2)
                .all(|w| served[&w[0].flow_id] <= served[&w[1].flow_id]),
            "round {round_no} lists the least recently served flows first: {round:?} \
             (served: {served:?})"
        );
        for d in round {
            assert_eq!(d.receipt, Receipt::Accepted, "round {round_no}: {d:?}");
            remaining.get_mut(&d.flow_id).unwrap().pop_front();
            served.insert(d.flow_id.clone(), round_no);
        }
        rest = tail;
    }
    assert!(
        remaining.values().all(VecDeque::is_empty),
        "not delivered: {remaining:?}"
    );
}

/// `fair_round` (section 8, fair relay): at most one event per flow, its
/// head (lowest seq neither accepted nor quarantined); flows served least
/// recently first; at most `limit` events; none of the `skip` flows; picking
/// a round writes nothing. Recording receipts (`accepted` or `duplicate`)
/// serves a flow and moves its head.
pub fn fair_round_takes_each_flow_head_least_recently_served_first<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, _c) = open_at::<B>(dir, &clock);
    let a = commit_full_flow(&mut p, "A", 1);
    let b = commit_full_flow(&mut p, "B", 2);
    let c1 = commit(&mut p, &request("C", 0, Reserved, Some(3), 1));
    let now = T0 + 10;
    let heads = by_flow_seq([a[0].clone(), b[0].clone(), c1.clone()]);

    let round = fair_round(&mut p, 10, now);
    assert_eq!(by_flow_seq(round.clone()), heads, "one head per flow");
    let outbox = producer_state(&mut p);
    assert_eq!(
        fair_round(&mut p, 10, now),
        round,
        "a second pick sees the same round"
    );
    assert_eq!(
        producer_state(&mut p),
        outbox,
        "picking a round writes nothing"
    );
    for limit in [0, 1, 2, 3] {
        let part = fair_round(&mut p, limit, now);
        assert_eq!(part.len(), limit, "limit {limit}: {part:?}");
        assert!(
            part.iter().all(|e| heads.contains(e)),
            "limit {limit}: {part:?}"
        );
        let flows: BTreeSet<&FlowId> = part.iter().map(|e| &e.flow_id).collect();
        assert_eq!(flows.len(), limit, "limit {limit}: one per flow");
    }
    let skip: BTreeSet<FlowId> = [flow("B")].into();
    assert_eq!(
        by_flow_seq(p.fair_round(10, &skip, now).unwrap()),
        by_flow_seq([a[0].clone(), c1.clone()]),
        "a skipped flow is left out"
    );
    let skip_all: BTreeSet<FlowId> = [flow("A"), flow("B"), flow("C")].into();
    assert!(p.fair_round(10, &skip_all, now).unwrap().is_empty());

    // A is served alone: the flows never served come before it
    record_receipts(&mut p, &[(&a[0], Receipt::Accepted)], now);
    let round = fair_round(&mut p, 10, now);
    assert_eq!(round.len(), 3, "{round:?}");
    assert_eq!(round[2], a[1], "A, served last, comes last: {round:?}");
    assert_eq!(
        by_flow_seq(round[..2].to_vec()),
        by_flow_seq([b[0].clone(), c1.clone()])
    );
    assert_eq!(
        by_flow_seq(fair_round(&mut p, 2, now)),
        by_flow_seq([b[0].clone(), c1.clone()]),
        "a limited round takes the least recently served flows"
    );
    assert_eq!(
        p.fair_round(10, &skip, now).unwrap(),
        vec![c1.clone(), a[1].clone()]
    );

    // B and C are served in one later round: A is now the least recent
    record_receipts(
        &mut p,
        &[(&b[0], Receipt::Accepted), (&c1, Receipt::Accepted)],
        now,
    );
    assert_eq!(
        fair_round(&mut p, 10, now),
        vec![a[1].clone(), b[1].clone()],
        "C has no head; A was served before B"
    );
    assert_eq!(fair_round(&mut p, 1, now), vec![a[1].clone()]);
    record_receipts(&mut p, &[(&a[1], Receipt::Accepted)], now);
    assert_eq!(
        fair_round(&mut p, 10, now),
        vec![b[1].clone(), a[2].clone()]
    );
    assert_eq!(fair_round(&mut p, 1, now), vec![b[1].clone()]);
    // a duplicate receipt moves custody, so it serves the flow too
    record_receipts(&mut p, &[(&b[1], Receipt::Duplicate)], now);
    assert_eq!(
        fair_round(&mut p, 10, now),
        vec![a[2].clone(), b[2].clone()]
    );
    // a new event gives a drained flow a head again; C was served before A
    let c2 = commit(&mut p, &request("C", 1, Confirmed, None, 1));
    assert_eq!(
        fair_round(&mut p, 10, now),
        vec![c2.clone(), a[2].clone(), b[2].clone()]
    );
    record_receipts(
        &mut p,
        &[
            (&a[2], Receipt::Accepted),
            (&b[2], Receipt::Accepted),
            (&c2, Receipt::Accepted),
        ],
        now,
    );
    assert!(fair_round(&mut p, 10, now).is_empty());
    assert!(p.outbox().unwrap().iter().all(|r| r.accepted));
}

/// A `fair` relay run (section 8) hands over, round after round, one head per
/// flow, least recently served flows first, until every flow is drained;
/// each flow's events arrive in seq order, whatever the round size.
pub fn relay_fair_serves_flows_round_robin_one_head_each<B: Backend>(dir: &Path) {
    for batch_len in [1, 2, 3, 256] {
        let case = dir.join(format!("batch-{batch_len}"));
        std::fs::create_dir(&case).expect("case directory");
        let clock = ManualClock::new(T0);
        let (mut p, mut c) = open_at::<B>(&case, &clock);
        // flows of 3, 1, 2 and 3 events, committed interleaved
        let steps = [
            ("A", 1),
            ("B", 1),
            ("C", 1),
            ("D", 1),
            ("A", 2),
            ("C", 2),
            ("D", 2),
            ("A", 3),
            ("D", 3),
        ];
        let events: Vec<Envelope> = steps
            .iter()
            .map(|&(f, s)| {
                let q = (s == 1).then_some(7);
                commit(&mut p, &request(f, s - 1, state_of_step(s), q, 1))
            })
            .collect();

        let report = relay_fair_at(&mut p, &mut c, None, batch_len, T0 + 1);
        assert_eq!(report.stop, RelayStop::Drained, "batch {batch_len}");
        assert_eq!(
            report.deliveries.len(),
            events.len(),
            "batch {batch_len}: {report:?}"
        );
        check_fair_rounds(&report.deliveries, &events, batch_len);
        assert!(
            p.outbox().unwrap().iter().all(|r| r.accepted),
            "batch {batch_len}"
        );
        assert_eq!(inbox_envelopes(&mut c), by_flow_seq(events.clone()));
        let again = relay_fair_at(&mut p, &mut c, None, batch_len, T0 + 2);
        assert!(again.deliveries.is_empty(), "batch {batch_len}: {again:?}");
    }
}

/// A conflict under the `fair` policy quarantines only the event that got
/// it: the other flows are delivered in the same run, the event is listed as
/// quarantined with its reason and is never retried automatically nor marked
/// accepted, and the rest of its own flow still moves into the consumer's
/// custody.
pub fn relay_fair_conflict_quarantines_only_that_event<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, mut c) = open_at::<B>(dir, &clock);
    let a1 = commit(&mut p, &request("A", 0, Reserved, Some(10), 1));
    clock.set(T0 + 1_000);
    let b = commit_full_flow(&mut p, "B", 20);
    let a2 = commit(&mut p, &request("A", 1, Confirmed, None, 1));
    let a3 = commit(&mut p, &request("A", 2, Released, None, 1));
    // the consumer holds another event at (A, 1)
    let other = amount_event("not-A-1", "A", 1, 1, "reserved", 10);
    assert_eq!(c.receive(&other).unwrap(), Receipt::Accepted);

    let now = T0 + 5_000;
    let report = relay_fair_at(&mut p, &mut c, None, 256, now);
    let of = |e: &Envelope| -> Vec<Receipt> {
        report
            .deliveries
            .iter()
            .filter(|d| d.event_id == e.event_id)
            .map(|d| d.receipt)
            .collect()
    };
    assert_eq!(of(&a1), vec![Receipt::Conflict], "{report:?}");
    for e in &b {
        assert_eq!(
            of(e),
            vec![Receipt::Accepted],
            "B in the same run: {report:?}"
        );
    }
    let a1_entry = outbox_entry(&mut p, &a1);
    assert_quarantined(&a1_entry);
    assert_eq!(
        (a1_entry.attempts, a1_entry.last_outcome.as_deref()),
        (1, Some("conflict"))
    );
    assert_eq!(
        p.outbox_entries(true, 100).unwrap(),
        vec![a1_entry.clone()],
        "only A1 is quarantined"
    );
    for e in b.iter().chain([&a2, &a3]) {
        assert!(!outbox_entry(&mut p, e).quarantined, "{e:?}");
    }

    // later runs never retry A1, but A's later events move into custody
    let report = relay_fair_at(&mut p, &mut c, None, 256, now + 1);
    let report_2 = relay_fair_at(&mut p, &mut c, None, 256, now + 2);
    for r in [&report, &report_2] {
        assert!(
            r.deliveries.iter().all(|d| d.event_id != a1.event_id),
            "a quarantined event is never retried automatically: {r:?}"
        );
    }
    for e in [&a2, &a3] {
        assert!(is_accepted(&mut p, e), "{e:?}");
    }
    let a1_entry = outbox_entry(&mut p, &a1);
    assert!(a1_entry.quarantined && !a1_entry.accepted, "{a1_entry:?}");
    assert_eq!(a1_entry.attempts, 1);
    assert_eq!(
        p.producer_status(now).unwrap(),
        ProducerStatus {
            backlog: 1,
            oldest_pending_created_at_ms: Some(T0),
            quarantined: 1,
            rewound: 0,
            backing_off: 0,
        }
    );
    assert!(fair_round(&mut p, 10, now).is_empty());
    // the first-pending policy still sees it (quarantined or not)
    assert_eq!(p.oldest_unaccepted(now).unwrap(), Some(a1.clone()));
    assert_eq!(
        inbox_row(&mut c, &other.event_id).map(|r| r.envelope),
        Some(other),
        "the consumer's row is not overwritten"
    );
    assert!(inbox_row(&mut c, &a1.event_id).is_none());
}

/// A conflict of cause `producer_rewound` (the consumer holds another body
/// at the event's identity, delivered by this same producer store)
/// quarantines the event with that reason and stops its flow there: nothing
/// of the flow from that seq on is handed over again, even what is appended
/// later, deep rounds included, while other flows go on. An operator's
/// retry of the event lifts the stop (PROTOCOL.md section 12).
pub fn relay_rewound_flow_stops_there_and_others_go_on<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, mut c) = open_at::<B>(dir, &clock);
    let a1 = commit(&mut p, &request("A", 0, Reserved, Some(10), 1));
    let a2 = commit(&mut p, &request("A", 1, Confirmed, None, 1));
    // The consumer holds another A2, from this very producer store.
    let held = amount_event("not-A-2", "A", 2, 1, "confirmed", 10);
    let sender = p.store_id().clone();
    let answers = c.receive_from(Some(&sender), &[held]).unwrap();
    assert_eq!(answers[0].receipt, Receipt::Accepted);
    let a3 = commit(&mut p, &request("A", 2, Released, None, 1));
    let b = commit_full_flow(&mut p, "B", 20);

    let now = T0 + 5_000;
    let report = relay_deep_at(&mut p, &mut c, 4, now);
    let of = |report: &RelayReport, e: &Envelope| -> Vec<Receipt> {
        (report.deliveries.iter())
            .filter(|d| d.event_id == e.event_id)
            .map(|d| d.receipt)
            .collect()
    };
    assert_eq!(of(&report, &a1), vec![Receipt::Accepted], "{report:?}");
    assert_eq!(
        of(&report, &a2),
        vec![Receipt::ProducerRewound],
        "{report:?}"
    );
    for e in &b {
        assert_eq!(of(&report, e), vec![Receipt::Accepted], "{report:?}");
    }
    let a2_entry = outbox_entry(&mut p, &a2);
    assert_quarantined(&a2_entry);
    assert_eq!(
        (
            a2_entry.quarantine_reason.as_deref(),
            a2_entry.quarantine_detail.as_deref(),
            a2_entry.last_outcome.as_deref()
        ),
        (
            Some("producer_rewound"),
            Some(PRODUCER_REWOUND_REASON),
            Some("producer_rewound")
        )
    );
    for at in [now + 1, now + 2] {
        let report = relay_deep_at(&mut p, &mut c, 4, at);
        assert!(report.deliveries.is_empty(), "{report:?}");
    }
    let a3_entry = outbox_entry(&mut p, &a3);
    assert!(!a3_entry.accepted && !a3_entry.quarantined, "{a3_entry:?}");
    assert!(
        inbox_row(&mut c, &a3.event_id).is_none(),
        "A3 never reached it"
    );

    p.retry_quarantined(&a2.event_id).unwrap().unwrap();
    // Handed over again, refused again; in a deep round (a PostgreSQL
    // producer) A3 travels with it and is `after_conflict`, not stored.
    let report = relay_deep_at(&mut p, &mut c, 4, now + 3);
    assert_eq!(
        of(&report, &a2),
        vec![Receipt::ProducerRewound],
        "{report:?}"
    );
    assert!(
        (report.deliveries.iter())
            .all(|d| d.event_id == a2.event_id || d.receipt == Receipt::AfterConflict),
        "{report:?}"
    );
    let report = relay_deep_at(&mut p, &mut c, 4, now + 4);
    assert!(report.deliveries.is_empty(), "{report:?}");
    assert!(inbox_row(&mut c, &a3.event_id).is_none(), "A3 never stored");
}

/// A receipt for an event that is no longer in the outbox (another relay
/// recorded it first and `prune` removed it meanwhile) is not an error: it
/// is passed over, and the other receipts of the call are recorded.
pub fn receipts_for_events_pruned_meanwhile_are_not_an_error<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, _c) = open_at::<B>(dir, &clock);
    let a = commit(&mut p, &request("a", 0, Reserved, Some(1), 1));
    let b = commit(&mut p, &request("b", 0, Reserved, Some(2), 1));
    let gone = commit(&mut p, &request("g", 0, Reserved, Some(3), 1));
    record_receipts(&mut p, &[(&gone, Receipt::Accepted)], T0 + 1);
    let pruned = p.prune_outbox(T0 + 2).unwrap();
    assert_eq!(pruned.rows, 1, "the settled event is pruned");
    let before = outbox_entries(&mut p);
    p.record_receipts(
        &[
            (a.event_id.clone(), Receipt::Accepted),
            (gone.event_id.clone(), Receipt::Duplicate),
            (b.event_id.clone(), Receipt::Conflict),
        ],
        T0 + 3,
    )
    .expect("a receipt for a pruned event is passed over");
    let after = outbox_entries(&mut p);
    assert_ne!(after, before, "the other receipts are recorded");
    assert!(after[0].accepted, "{:?}", after[0]);
    assert!(after[1].quarantined, "{:?}", after[1]);
    assert!(fair_round(&mut p, 10, T0 + 3).is_empty());
}

/// `record_receipts`: `accepted` and `duplicate` mark the event accepted
/// (custody moved) with the time, the attempt and the outcome; `conflict`
/// quarantines it with a reason and never marks it accepted; rows without a
/// receipt are untouched. `outbox_entries` shows all of it in commit order;
/// `outbox_entries(true, ..)` lists only quarantined rows.
pub fn record_receipts_moves_custody_or_quarantines<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, _c) = open_at::<B>(dir, &clock);
    let e1 = commit(&mut p, &request("a", 0, Reserved, Some(1), 1));
    let e2 = commit(&mut p, &request("b", 0, Reserved, Some(2), 1));
    let e3 = commit(&mut p, &request("c", 0, Reserved, Some(3), 1));
    let e4 = commit(&mut p, &request("a", 1, Confirmed, None, 1));
    let fresh = outbox_entries(&mut p);
    assert_eq!(
        fresh.iter().map(|e| &e.envelope).collect::<Vec<_>>(),
        vec![&e1, &e2, &e3, &e4],
        "commit order"
    );
    for entry in &fresh {
        assert!(!entry.accepted && !entry.quarantined, "{entry:?}");
        assert_eq!(
            (
                entry.attempts,
                &entry.last_outcome,
                &entry.last_error,
                &entry.quarantine_reason
            ),
            (0, &None, &None, &None),
            "{entry:?}"
        );
        assert_eq!(
            (entry.created_at_ms, entry.accepted_at_ms),
            (T0, None),
            "{entry:?}"
        );
        assert!(
            entry.next_attempt_at_ms <= T0,
            "a new event is due: {entry:?}"
        );
    }

    let t1 = T0 + 5_000;
    record_receipts(
        &mut p,
        &[
            (&e1, Receipt::Accepted),
            (&e2, Receipt::Duplicate),
            (&e3, Receipt::Conflict),
        ],
        t1,
    );
    let entries = outbox_entries(&mut p);
    assert_eq!(
        entries.iter().map(|e| &e.envelope).collect::<Vec<_>>(),
        vec![&e1, &e2, &e3, &e4]
    );
    for (entry, outcome) in [(&entries[0], "accepted"), (&entries[1], "duplicate")] {
        assert!(entry.accepted && !entry.quarantined, "{entry:?}");
        assert_eq!(entry.quarantine_reason, None);
        assert_eq!(entry.attempts, 1, "{entry:?}");
        assert_eq!(entry.last_outcome.as_deref(), Some(outcome));
        assert_eq!(entry.accepted_at_ms, Some(t1), "{entry:?}");
        assert_eq!(entry.created_at_ms, T0);
    }
    let conflicted = &entries[2];
    assert_quarantined(conflicted);
    assert_eq!(
        (
            conflicted.attempts,
            conflicted.last_outcome.as_deref(),
            conflicted.accepted_at_ms
        ),
        (1, Some("conflict"), None)
    );
    assert_eq!(
        entries[3], fresh[3],
        "an event without a receipt is untouched"
    );
    assert_eq!(
        p.outbox()
            .unwrap()
            .iter()
            .map(|r| r.accepted)
            .collect::<Vec<_>>(),
        vec![true, true, false, false]
    );
    assert_eq!(p.pending(10).unwrap(), vec![e3.clone(), e4.clone()]);

    assert_eq!(
        p.outbox_entries(true, 10).unwrap(),
        vec![conflicted.clone()]
    );
    assert!(p.outbox_entries(true, 0).unwrap().is_empty());
    assert_eq!(p.outbox_entries(false, 2).unwrap(), entries[..2].to_vec());
    assert_eq!(
        p.producer_status(t1).unwrap(),
        ProducerStatus {
            backlog: 2,
            oldest_pending_created_at_ms: Some(T0),
            quarantined: 1,
            rewound: 0,
            backing_off: 0,
        }
    );
    assert_eq!(
        fair_round(&mut p, 10, t1),
        vec![e4.clone()],
        "c's only event is quarantined, b's is accepted"
    );

    // another conflict: one more attempt, still quarantined
    let t2 = t1 + 1_000;
    record_receipts(&mut p, &[(&e3, Receipt::Conflict)], t2);
    let entry = outbox_entry(&mut p, &e3);
    assert!(entry.quarantined && !entry.accepted, "{entry:?}");
    assert_eq!(entry.attempts, 2);

    // a receipt that moves custody (an explicit delivery once the consumer
    // side was repaired) marks it accepted and ends the quarantine
    let t3 = t2 + 1_000;
    record_receipts(&mut p, &[(&e3, Receipt::Duplicate)], t3);
    let entry = outbox_entry(&mut p, &e3);
    assert!(entry.accepted && !entry.quarantined, "{entry:?}");
    assert_eq!(
        (
            entry.attempts,
            entry.last_outcome.as_deref(),
            entry.accepted_at_ms
        ),
        (3, Some("duplicate"), Some(t3))
    );
    assert!(p.outbox_entries(true, 10).unwrap().is_empty());
    assert_eq!(
        p.producer_status(t3).unwrap(),
        ProducerStatus {
            backlog: 1,
            oldest_pending_created_at_ms: Some(T0),
            quarantined: 0,
            rewound: 0,
            backing_off: 0,
        }
    );
    // the bookkeeping survives a reopen
    let entries = outbox_entries(&mut p);
    drop(p);
    let (mut p, _c) = open_at::<B>(dir, &clock);
    assert_eq!(outbox_entries(&mut p), entries);
}

/// `record_failure` (a transient delivery failure): one more attempt, last
/// outcome `error` with the error, and a next attempt strictly after the
/// failure and no later than the backoff's first ceiling after it (plus the
/// one millisecond that a zero draw needs to be strictly later). Until then the flow is
/// held back (its later events too, head of line) and no other flow is;
/// `producer_status` counts it as backing off. From then on it is delivered.
pub fn record_failure_backs_off_only_that_flow<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, mut c) = open_at::<B>(dir, &clock);
    let a1 = commit(&mut p, &request("a", 0, Reserved, Some(4), 1));
    let a2 = commit(&mut p, &request("a", 1, Confirmed, None, 1));
    clock.set(T0 + 50);
    let b1 = commit(&mut p, &request("b", 0, Reserved, Some(5), 1));
    let backoff = Backoff {
        base_ms: 1_000,
        cap_ms: 4_000,
        floor_ms: 0,
    };
    let failed_at = T0 + 100;
    let untouched = outbox_entries(&mut p);
    p.record_failure(
        std::slice::from_ref(&a1.event_id),
        "consumer busy",
        failed_at,
        &backoff,
    )
    .unwrap();

    let entry = outbox_entry(&mut p, &a1);
    assert_eq!(entry.attempts, 1, "{entry:?}");
    assert_eq!(entry.last_outcome.as_deref(), Some("error"));
    assert_eq!(entry.last_error.as_deref(), Some("consumer busy"));
    assert!(!entry.accepted && !entry.quarantined, "{entry:?}");
    assert_eq!(entry.quarantine_reason, None);
    let next = entry.next_attempt_at_ms;
    assert!(
        next > failed_at && next <= failed_at + 1_000 + 1,
        "next attempt {} ms after the failure; the first ceiling is 1000 ms",
        next - failed_at
    );
    let entries = outbox_entries(&mut p);
    assert_eq!(entries[1..], untouched[1..], "only a1 records the failure");

    assert_eq!(
        p.producer_status(failed_at).unwrap(),
        ProducerStatus {
            backlog: 3,
            oldest_pending_created_at_ms: Some(T0),
            quarantined: 0,
            rewound: 0,
            backing_off: 1,
        }
    );
    assert_eq!(p.producer_status(next).unwrap().backing_off, 0);

    for now in [failed_at, next - 1] {
        assert_eq!(
            fair_round(&mut p, 10, now),
            vec![b1.clone()],
            "at {now}: flow a is held back, b is not"
        );
        assert_eq!(
            p.oldest_unaccepted(now).unwrap(),
            None,
            "first-pending waits for the oldest event's next attempt"
        );
    }
    assert_eq!(
        by_flow_seq(fair_round(&mut p, 10, next)),
        vec![a1.clone(), b1.clone()]
    );
    assert_eq!(p.oldest_unaccepted(next).unwrap(), Some(a1.clone()));

    // a run before the next attempt delivers only b
    let report = relay_fair_at(&mut p, &mut c, None, 256, next - 1);
    assert_eq!(report.deliveries, vec![delivery(&b1, Receipt::Accepted)]);
    assert!(inbox_row(&mut c, &a1.event_id).is_none());
    assert!(
        inbox_row(&mut c, &a2.event_id).is_none(),
        "a2 waits behind its flow's head"
    );
    // from the next attempt on, a is delivered, in order
    let report = relay_fair_at(&mut p, &mut c, None, 256, next);
    assert_eq!(
        report.deliveries,
        vec![
            delivery(&a1, Receipt::Accepted),
            delivery(&a2, Receipt::Accepted)
        ]
    );
    let entry = outbox_entry(&mut p, &a1);
    assert!(entry.accepted, "{entry:?}");
    assert_eq!(
        (entry.attempts, entry.last_outcome.as_deref()),
        (2, Some("accepted"))
    );
    assert_eq!(
        p.producer_status(next).unwrap(),
        ProducerStatus {
            backlog: 0,
            oldest_pending_created_at_ms: None,
            quarantined: 0,
            rewound: 0,
            backing_off: 0,
        }
    );
}

/// Repeated transient failures wait, each time, a jittered time of at most
/// `min(cap, base * 2^(n-1))` after the n-th failure (plus the millisecond
/// that keeps the next attempt strictly after the failure): the ceilings 1,
/// 2 and 4 s, then the 4 s cap. The waits are drawn, not
/// fixed: across many events they differ and reach past the early ceilings.
pub fn record_failure_waits_stay_within_the_backoff_ceiling<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, _c) = open_at::<B>(dir, &clock);
    let events: Vec<Envelope> = (0..10)
        .map(|i| commit(&mut p, &request(&format!("f{i}"), 0, Reserved, Some(1), 1)))
        .collect();
    let ids: Vec<EventId> = events.iter().map(|e| e.event_id.clone()).collect();
    let backoff = Backoff {
        base_ms: 1_000,
        cap_ms: 4_000,
        floor_ms: 0,
    };
    let ceilings: [i64; 7] = [1_000, 2_000, 4_000, 4_000, 4_000, 4_000, 4_000];
    let mut now = T0 + 1;
    let mut capped_waits = Vec::new();
    for (n, ceiling) in ceilings.into_iter().enumerate() {
        let attempt = n as u64 + 1;
        p.record_failure(&ids, "consumer unreachable", now, &backoff)
            .unwrap();
        let mut latest = now;
        for e in &events {
            let entry = outbox_entry(&mut p, e);
            assert_eq!(entry.attempts, attempt, "{entry:?}");
            assert_eq!(entry.last_outcome.as_deref(), Some("error"));
            assert!(!entry.accepted && !entry.quarantined);
            let wait = entry.next_attempt_at_ms - now;
            assert!(
                (1..=ceiling + 1).contains(&wait),
                "failure {attempt}: waits {wait} ms; the ceiling is {ceiling} ms"
            );
            if ceiling == 4_000 {
                capped_waits.push(wait);
            }
            latest = latest.max(entry.next_attempt_at_ms);
        }
        assert_eq!(p.producer_status(now).unwrap().backing_off, 10);
        assert!(fair_round(&mut p, 100, now).is_empty());
        now = latest;
        assert_eq!(p.producer_status(now).unwrap().backing_off, 0);
        assert_eq!(fair_round(&mut p, 100, now).len(), 10);
    }
    let distinct: BTreeSet<i64> = capped_waits.iter().copied().collect();
    assert!(
        distinct.len() > 1,
        "{} waits under a 4 s ceiling are all {distinct:?}: no jitter",
        capped_waits.len()
    );
    assert!(
        capped_waits.iter().any(|&w| w > 2_001),
        "{} waits under a 4 s ceiling never pass 2 s: {capped_waits:?}",
        capped_waits.len()
    );
}

/// A consumer that fails every delivery as a busy store while `down`.
struct Flaky<C> {
    inner: C,
    down: bool,
}

const BUSY: &str = "consumer busy (suite)";

impl<C: ConsumerStore> Transport for Flaky<C> {
    fn deliver(
        &mut self,
        sender: Option<&ordo_core::StoreId>,
        events: &[Envelope],
    ) -> Result<Vec<Receipt>, TransportError> {
        if self.down {
            return Err(StoreError::new(ErrorKind::Busy, BUSY).into());
        }
        self.inner.deliver(sender, events)
    }
}

/// A transient failure at the end of time saturates: the next attempt is
/// due at `i64::MAX`, which a relay at `i64::MAX` finds due, and never
/// wraps into the past.
pub fn relay_failure_at_the_end_of_time_saturates<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, c) = open_at::<B>(dir, &clock);
    let mut c = Flaky {
        inner: c,
        down: true,
    };
    let a1 = commit(&mut p, &request("a", 0, Reserved, Some(1), 1));
    let options = RelayOptions {
        max: Some(RELAY_DELIVERIES_MAX),
        ..RelayOptions::default()
    };
    let end = FixedClock(i64::MAX);
    let failed = ordo_core::relay(&mut p, &mut c, &options, &end).unwrap();
    assert_eq!(failed.transient_errors, 1, "{failed:?}");
    assert!(failed.deliveries.is_empty(), "{failed:?}");
    let entry = outbox_entry(&mut p, &a1);
    assert_eq!(entry.attempts, 1, "{entry:?}");
    assert_eq!(entry.next_attempt_at_ms, i64::MAX, "{entry:?}");
    c.down = false;
    let report = ordo_core::relay(&mut p, &mut c, &options, &end).unwrap();
    assert_eq!(report.deliveries, vec![delivery(&a1, Receipt::Accepted)]);
}

/// A relay round that the consumer fails transiently (busy) is counted in
/// the run's report (the run goes on with other flows), and every event of that round (each flow's head, not the
/// events behind them) records the attempt, the error and a next attempt
/// within the backoff. Runs before the next attempts deliver nothing; once
/// they are due, everything is delivered in order.
pub fn relay_transient_failure_backs_off_the_whole_round<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, c) = open_at::<B>(dir, &clock);
    let mut c = Flaky {
        inner: c,
        down: true,
    };
    let a = commit_full_flow(&mut p, "a", 3);
    let b1 = commit(&mut p, &request("b", 0, Reserved, Some(4), 1));
    let options = RelayOptions {
        policy: RelayPolicy::Fair,
        max: Some(RELAY_DELIVERIES_MAX),
        batch_len_max: 256,
        flow_events_max: 1,
        backoff: Backoff {
            base_ms: 500,
            cap_ms: 500,
            floor_ms: 0,
        },
    };
    let failed_at = T0 + 10;
    // The run goes on after the failed round: nothing else is due, so it
    // ends drained, the failure counted and nothing delivered.
    let failed = ordo_core::relay(&mut p, &mut c, &options, &FixedClock(failed_at)).unwrap();
    assert_eq!(failed.transient_errors, 1, "{failed:?}");
    assert!(failed.deliveries.is_empty(), "{failed:?}");
    assert_eq!(failed.stop, RelayStop::Drained);
    let mut due = failed_at;
    for head in [&a[0], &b1] {
        let entry = outbox_entry(&mut p, head);
        assert_eq!(entry.attempts, 1, "{entry:?}");
        assert_eq!(entry.last_outcome.as_deref(), Some("error"));
        assert_eq!(entry.last_error.as_deref(), Some(BUSY));
        assert!(!entry.accepted && !entry.quarantined, "{entry:?}");
        let wait = entry.next_attempt_at_ms - failed_at;
        assert!(
            (1..=501).contains(&wait),
            "waits {wait} ms; the ceiling is 500 ms"
        );
        due = due.max(entry.next_attempt_at_ms);
    }
    for behind in &a[1..] {
        let entry = outbox_entry(&mut p, behind);
        assert_eq!(
            (entry.attempts, entry.last_outcome.as_deref()),
            (0, None),
            "not in the failed round: {entry:?}"
        );
    }
    assert!(c.inner.inbox().unwrap().is_empty());
    assert_eq!(
        p.producer_status(failed_at).unwrap(),
        ProducerStatus {
            backlog: 4,
            oldest_pending_created_at_ms: Some(T0),
            quarantined: 0,
            rewound: 0,
            backing_off: 2,
        }
    );

    c.down = false;
    let report = ordo_core::relay(&mut p, &mut c, &options, &FixedClock(failed_at)).unwrap();
    assert_eq!(
        (report.deliveries.len(), report.stop),
        (0, RelayStop::Drained),
        "nothing is due before the backoff ends: {report:?}"
    );
    let report = ordo_core::relay(&mut p, &mut c, &options, &FixedClock(due)).unwrap();
    assert_eq!(report.stop, RelayStop::Drained);
    let mut delivered = report.deliveries.clone();
    delivered.sort_by(|x, y| (&x.flow_id, x.seq).cmp(&(&y.flow_id, y.seq)));
    assert_eq!(
        delivered,
        a.iter()
            .chain([&b1])
            .map(|e| delivery(e, Receipt::Accepted))
            .collect::<Vec<_>>()
    );
    assert!(p.outbox().unwrap().iter().all(|r| r.accepted));
    assert_eq!(
        inbox_envelopes(&mut c.inner),
        [a.to_vec(), vec![b1]].concat()
    );
}

/// `retry_quarantined` refuses, writing nothing, an unknown event id and an
/// event that is not quarantined (accepted, never delivered, or already
/// retried). A retry clears the quarantine without counting an attempt and
/// makes the event deliverable again; delivered into the same conflict, it
/// is quarantined again with its second attempt, never accepted.
pub fn retry_quarantined_refusals_change_nothing_and_retry_requeues<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, mut c) = open_at::<B>(dir, &clock);
    let a1 = commit(&mut p, &request("A", 0, Reserved, Some(10), 1));
    let b1 = commit(&mut p, &request("B", 0, Reserved, Some(20), 1));
    let other = amount_event("not-A-1", "A", 1, 1, "reserved", 10);
    assert_eq!(c.receive(&other).unwrap(), Receipt::Accepted);
    let now = T0 + 100;
    let report = relay_fair_at(&mut p, &mut c, None, 256, now);
    assert_eq!(
        deliveries_by_flow(&report),
        vec![
            delivery(&a1, Receipt::Conflict),
            delivery(&b1, Receipt::Accepted)
        ]
    );
    assert!(outbox_entry(&mut p, &a1).quarantined);
    let c1 = commit(&mut p, &request("C", 0, Reserved, Some(30), 1));

    let before = outbox_entries(&mut p);
    let unknown = event_id("nope-1");
    assert_eq!(
        p.retry_quarantined(&unknown).unwrap(),
        Err(RetryRefused::Unknown(unknown))
    );
    for e in [&b1, &c1] {
        assert_eq!(
            p.retry_quarantined(&e.event_id).unwrap(),
            Err(RetryRefused::NotQuarantined(e.event_id.clone()))
        );
    }
    assert_eq!(
        outbox_entries(&mut p),
        before,
        "a refused retry writes nothing"
    );
    assert_eq!(fair_round(&mut p, 10, now), vec![c1.clone()]);

    assert_eq!(p.retry_quarantined(&a1.event_id).unwrap(), Ok(()));
    let entry = outbox_entry(&mut p, &a1);
    assert!(!entry.quarantined && !entry.accepted, "{entry:?}");
    assert_eq!(entry.quarantine_reason, None);
    assert_eq!(entry.attempts, 1, "a retry is not an attempt");
    assert!(p.outbox_entries(true, 10).unwrap().is_empty());
    assert_eq!(
        p.producer_status(now).unwrap(),
        ProducerStatus {
            backlog: 2,
            oldest_pending_created_at_ms: Some(T0),
            quarantined: 0,
            rewound: 0,
            backing_off: 0,
        }
    );
    assert_eq!(
        by_flow_seq(fair_round(&mut p, 10, now)),
        vec![a1.clone(), c1.clone()],
        "the retried event is deliverable again"
    );
    let after_retry = outbox_entries(&mut p);
    assert_eq!(
        p.retry_quarantined(&a1.event_id).unwrap(),
        Err(RetryRefused::NotQuarantined(a1.event_id.clone()))
    );
    assert_eq!(outbox_entries(&mut p), after_retry);

    // the consumer still holds another event at (A, 1)
    let report = relay_fair_at(&mut p, &mut c, None, 256, now + 1);
    assert_eq!(
        deliveries_by_flow(&report),
        vec![
            delivery(&a1, Receipt::Conflict),
            delivery(&c1, Receipt::Accepted)
        ]
    );
    let entry = outbox_entry(&mut p, &a1);
    assert!(entry.quarantined && !entry.accepted, "{entry:?}");
    assert_eq!(
        (entry.attempts, entry.last_outcome.as_deref()),
        (2, Some("conflict"))
    );
    assert_eq!(p.producer_status(now + 1).unwrap().quarantined, 1);
    assert_eq!(
        inbox_row(&mut c, &other.event_id).map(|r| r.envelope),
        Some(other)
    );
}

/// `prune_outbox` removes only accepted rows accepted strictly before the
/// cutoff; unaccepted rows (never delivered, backing off or quarantined)
/// stay whatever their age. Seq allocation is unaffected: the next advance
/// of a pruned flow still gets the next seq, and an old expected seq is
/// still stale.
pub fn prune_outbox_removes_only_old_accepted_rows<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, _c) = open_at::<B>(dir, &clock);
    let p1 = commit(&mut p, &request("P", 0, Reserved, Some(1), 1));
    let q1 = commit(&mut p, &request("Q", 0, Reserved, Some(2), 1));
    let p2 = commit(&mut p, &request("P", 1, Confirmed, None, 1));
    let r1 = commit(&mut p, &request("R", 0, Reserved, Some(3), 1));
    let s1 = commit(&mut p, &request("S", 0, Reserved, Some(4), 1));
    let t1 = commit(&mut p, &request("T", 0, Reserved, Some(5), 1));
    record_receipts(
        &mut p,
        &[(&p1, Receipt::Accepted), (&r1, Receipt::Conflict)],
        T0 + 2_000,
    );
    record_receipts(&mut p, &[(&q1, Receipt::Duplicate)], T0 + 5_000);
    p.record_failure(
        std::slice::from_ref(&t1.event_id),
        "unreachable",
        T0 + 2_000,
        &Backoff::default(),
    )
    .unwrap();
    let flows = p.flows().unwrap();
    let ids = |p: &mut B::Producer| -> Vec<EventId> {
        p.outbox()
            .unwrap()
            .into_iter()
            .map(|r| r.envelope.event_id)
            .collect()
    };

    assert_eq!(
        p.prune_outbox(T0 + 2_000).unwrap().rows,
        0,
        "accepted at the cutoff is not before it"
    );
    assert_eq!(ids(&mut p).len(), 6);
    assert_eq!(p.prune_outbox(T0 + 2_001).unwrap().rows, 1);
    assert_eq!(
        ids(&mut p),
        [&q1, &p2, &r1, &s1, &t1].map(|e| e.event_id.clone())
    );
    assert_eq!(p.outbox_event(&p1.event_id).unwrap(), None);
    assert_eq!(p.prune_outbox(T0 + 2_001).unwrap().rows, 0);
    let kept = outbox_entries(&mut p);
    assert_eq!(p.prune_outbox(T0 + 1_000_000_000).unwrap().rows, 1);
    assert_eq!(
        outbox_entries(&mut p),
        kept[1..].to_vec(),
        "unaccepted rows are kept with their bookkeeping"
    );
    assert!(outbox_entry(&mut p, &r1).quarantined);
    assert_eq!(p.flows().unwrap(), flows, "flows are not pruned");

    // seq allocation goes on past the pruned rows
    assert_eq!(
        p.advance(&request("Q", 0, Reserved, Some(2), 1)).unwrap(),
        Advance::Stale { last_seq: 1 }
    );
    let q2 = commit(&mut p, &request("Q", 1, Confirmed, None, 1));
    assert_eq!(q2, reservation_event("Q", 2, 2));
    let p3 = commit(&mut p, &request("P", 2, Released, None, 1));
    assert_eq!(p3, reservation_event("P", 3, 1));
    assert_eq!(
        by_flow_seq(fair_round(&mut p, 10, T0 + 2_000)),
        vec![p2.clone(), q2.clone(), s1.clone()],
        "R is quarantined, T is backing off"
    );
    drop(p);
    let (mut p, _c) = open_at::<B>(dir, &clock);
    assert_eq!(
        p.advance(&request("P", 2, Released, None, 1)).unwrap(),
        Advance::Stale { last_seq: 3 }
    );
    assert_eq!(
        ids(&mut p),
        [&p2, &r1, &s1, &t1, &q2, &p3].map(|e| e.event_id.clone())
    );
}
