//! docs/PROTOCOL.md section 5: the relay moves custody only on `accepted` or
//! `duplicate`, and the seed's `first-pending` policy can starve.

#[allow(unused_imports)]
use ordo_reservation::{FlowState, ReservationConsumer, ReservationProducer};
use std::path::Path;

use ordo_core::{
    ConsumerOps, Envelope, InboxStatus, ProducerOps, ProducerStore, Receipt, Receive, RelayError,
    RelayReport, RelayStop,
};

use crate::support::*;
use crate::Backend;

fn run<P: ProducerStore + ReservationProducer, C: ReservationConsumer>(
    p: &mut P,
    c: &mut C,
) -> RelayReport {
    relay_first_pending(p, c, None)
}

/// An event the consumer already holds comes back `duplicate` and is marked
/// accepted like an `accepted` one; a run with nothing pending delivers
/// nothing; relaying never touches the projection.
pub fn relay_marks_accepted_on_accepted_and_duplicate<B: Backend>(dir: &Path) {
    let (mut p, mut c) = B::open(dir);
    let e1 = commit(&mut p, &request("r", 0, FlowState::Reserved, Some(2), 1));
    let e2 = commit(&mut p, &request("r", 1, FlowState::Confirmed, None, 1));
    assert_eq!(c.receive(&e1).unwrap(), Receipt::Accepted);

    let report = run(&mut p, &mut c);
    assert_eq!(
        report,
        RelayReport {
            deliveries: vec![
                delivery(&e1, Receipt::Duplicate),
                delivery(&e2, Receipt::Accepted)
            ],
            refusals: vec![],
            transient_errors: 0,
            stop: RelayStop::Drained,
        }
    );
    assert!(is_accepted(&mut p, &e1), "duplicate moves custody");
    assert!(is_accepted(&mut p, &e2), "accepted moves custody");
    assert!(p.pending(10).unwrap().is_empty());
    let inbox = c.inbox().unwrap();
    assert_eq!(
        inbox.iter().map(|r| &r.envelope).collect::<Vec<_>>(),
        vec![&e1, &e2]
    );
    assert!(inbox.iter().all(|r| r.status == InboxStatus::Pending));
    assert!(c.projections().unwrap().is_empty(), "relay applied");
    assert!(c.effects().unwrap().is_empty(), "relay applied");

    let again = run(&mut p, &mut c);
    assert!(again.deliveries.is_empty(), "{again:?}");
    assert_eq!(again.stop, RelayStop::Drained);
}

/// A `conflict` (the consumer holds a different body under the event's id)
/// is reported and never marked accepted; the run stops there, so the next
/// event is not delivered; the consumer's row is not overwritten.
pub fn relay_never_marks_conflict_accepted<B: Backend>(dir: &Path) {
    let (mut p, mut c) = B::open(dir);
    let a = commit(&mut p, &request("a", 0, FlowState::Reserved, Some(2), 1));
    let b = commit(&mut p, &request("b", 0, FlowState::Reserved, Some(2), 1));
    let squatter = amount_event(a.event_id.as_str(), "a", 1, 1, "reserved", 3);
    assert_eq!(c.receive(&squatter).unwrap(), Receipt::Accepted);
    let consumer_before = consumer_state(&mut c);

    let report = run(&mut p, &mut c);
    assert_eq!(report.deliveries, vec![delivery(&a, Receipt::Conflict)]);
    assert!(!is_accepted(&mut p, &a), "a conflict must not move custody");
    assert!(
        !is_accepted(&mut p, &b),
        "first-pending stops at the conflict"
    );
    assert_eq!(p.pending(10).unwrap(), vec![a.clone(), b.clone()]);
    assert_eq!(
        consumer_state(&mut c),
        consumer_before,
        "conflict changed the consumer"
    );

    // an explicit delivery of the conflicting event is still a conflict
    let report = relay_one(&mut p, &mut c, &a.event_id).unwrap();
    assert_eq!(report.deliveries, vec![delivery(&a, Receipt::Conflict)]);
    assert!(!is_accepted(&mut p, &a));
    assert_eq!(consumer_state(&mut c), consumer_before);
}

/// Scenario `default_relay_conflict_can_starve`: the consumer holds a
/// different event at A's `(flow, seq)`; three `first-pending` runs each
/// deliver only A and get `conflict`; B1 is never reached; an explicit
/// `relay_event` of B1 then succeeds; A is never marked accepted.
pub fn relay_first_pending_conflict_starves_later_events<B: Backend>(dir: &Path) {
    let (mut p, mut c) = B::open(dir);
    let a = commit(&mut p, &request("A", 0, FlowState::Reserved, Some(10), 1));
    let b1 = commit(&mut p, &request("B", 0, FlowState::Reserved, Some(20), 1));
    let b2 = commit(&mut p, &request("B", 1, FlowState::Confirmed, None, 1));
    // same (flow, seq) as A under another event id, same payload
    let other = amount_event("not-A-1", "A", 1, 1, "reserved", 10);
    assert_eq!(c.receive(&other).unwrap(), Receipt::Accepted);

    for attempt in 1..=3 {
        let report = run(&mut p, &mut c);
        assert_eq!(
            report.deliveries,
            vec![delivery(&a, Receipt::Conflict)],
            "run {attempt}"
        );
        assert!(!is_accepted(&mut p, &a), "run {attempt}: A marked accepted");
        assert!(!is_accepted(&mut p, &b1), "run {attempt}");
        assert!(
            inbox_row(&mut c, &b1.event_id).is_none(),
            "run {attempt}: B1 reached the consumer past a first-pending conflict"
        );
        assert!(inbox_row(&mut c, &a.event_id).is_none(), "run {attempt}");
    }

    let report = relay_one(&mut p, &mut c, &b1.event_id).unwrap();
    assert_eq!(
        report,
        RelayReport {
            deliveries: vec![delivery(&b1, Receipt::Accepted)],
            refusals: vec![],
            transient_errors: 0,
            stop: RelayStop::Drained,
        }
    );
    assert!(is_accepted(&mut p, &b1));
    assert!(!is_accepted(&mut p, &a), "A is never marked accepted");
    assert!(
        !is_accepted(&mut p, &b2),
        "relay_event delivers exactly one event"
    );
    assert_eq!(inbox_status(&mut c, &b1.event_id), InboxStatus::Pending);
    assert!(inbox_row(&mut c, &b2.event_id).is_none());
    assert_eq!(
        inbox_row(&mut c, &other.event_id).map(|r| r.envelope),
        Some(other)
    );
    // the starvation persists for the default policy
    let report = run(&mut p, &mut c);
    assert_eq!(report.deliveries, vec![delivery(&a, Receipt::Conflict)]);
    assert!(!is_accepted(&mut p, &a));
    assert!(!is_accepted(&mut p, &b2));
}

/// `relay_event` on an event already accepted delivers it again; the receipt
/// is `duplicate`, it stays accepted, and the consumer keeps one row.
pub fn relay_event_on_accepted_event_is_duplicate<B: Backend>(dir: &Path) {
    let (mut p, mut c) = B::open(dir);
    let events = commit_full_flow(&mut p, "x", 4);
    let report = run(&mut p, &mut c);
    assert_eq!(
        report.deliveries,
        events
            .iter()
            .map(|e| delivery(e, Receipt::Accepted))
            .collect::<Vec<_>>()
    );
    let consumer_before = consumer_state(&mut c);
    let outbox_before = p.outbox().unwrap();
    assert!(outbox_before.iter().all(|r| r.accepted));

    let report = relay_one(&mut p, &mut c, &events[1].event_id).unwrap();
    assert_eq!(
        report,
        RelayReport {
            deliveries: vec![delivery(&events[1], Receipt::Duplicate)],
            refusals: vec![],
            transient_errors: 0,
            stop: RelayStop::Drained,
        }
    );
    assert!(is_accepted(&mut p, &events[1]));
    assert_eq!(consumer_state(&mut c), consumer_before);
    assert_eq!(
        p.outbox()
            .unwrap()
            .into_iter()
            .map(|r| (r.envelope, r.accepted))
            .collect::<Vec<_>>(),
        outbox_before
            .into_iter()
            .map(|r| (r.envelope, r.accepted))
            .collect::<Vec<_>>()
    );
}

/// `relay_event` with an id that is not in the outbox is
/// `RelayError::UnknownEvent` naming it, and delivers nothing.
pub fn relay_event_unknown_id_errors<B: Backend>(dir: &Path) {
    let (mut p, mut c) = B::open(dir);
    let e = commit(&mut p, &request("u", 0, FlowState::Reserved, Some(1), 1));
    let unknown = event_id("u-2");
    match relay_one(&mut p, &mut c, &unknown) {
        Err(RelayError::UnknownEvent(id)) => assert_eq!(id, unknown),
        other => panic!("expected UnknownEvent, got {other:?}"),
    }
    assert!(c.inbox().unwrap().is_empty(), "nothing is delivered");
    assert!(!is_accepted(&mut p, &e));
}

/// `max` bounds a run's deliveries (stop `max`); the next run continues with
/// the oldest unaccepted event.
pub fn relay_respects_max<B: Backend>(dir: &Path) {
    let (mut p, mut c) = B::open(dir);
    let mut events = commit_full_flow(&mut p, "m", 8);
    events.extend(commit_full_flow(&mut p, "n", 9));
    let report = relay_first_pending(&mut p, &mut c, Some(2));
    assert_eq!(report.stop, RelayStop::Max);
    assert_eq!(
        report.deliveries,
        vec![
            delivery(&events[0], Receipt::Accepted),
            delivery(&events[1], Receipt::Accepted)
        ]
    );
    assert_eq!(p.pending(10).unwrap(), events[2..].to_vec());
    let report = relay_first_pending(&mut p, &mut c, Some(0));
    assert_eq!((report.deliveries.len(), report.stop), (0, RelayStop::Max));
    let report = relay_first_pending(&mut p, &mut c, Some(100));
    assert_eq!(report.stop, RelayStop::Drained);
    assert_eq!(report.deliveries.len(), 4);
    assert_eq!(inbox_envelopes(&mut c), events);
}

/// The `fair` policy (section 8): a conflict on one flow's event neither
/// starves other flows nor is marked accepted; every other flow's events
/// are delivered in order and marked accepted, whatever the round size.
pub fn relay_fair_conflict_does_not_starve_other_flows<B: Backend>(dir: &Path) {
    for batch_len in [1, 2, 256] {
        let case = dir.join(format!("batch-{batch_len}"));
        std::fs::create_dir(&case).expect("case directory");
        let (mut p, mut c) = B::open(&case);
        let a = commit(&mut p, &request("A", 0, FlowState::Reserved, Some(10), 1));
        let b = commit_full_flow(&mut p, "B", 20);
        let d = commit_full_flow(&mut p, "D", 30);
        let other = amount_event("not-A-1", "A", 1, 1, "reserved", 10);
        assert_eq!(c.receive(&other).unwrap(), Receipt::Accepted);

        let report = relay_fair(&mut p, &mut c, None, batch_len);
        assert_eq!(report.stop, RelayStop::Drained);
        let receipt_of = |e: &Envelope| {
            report
                .deliveries
                .iter()
                .filter(|d| d.event_id == e.event_id)
                .map(|d| d.receipt)
                .collect::<Vec<_>>()
        };
        assert_eq!(receipt_of(&a), vec![Receipt::Conflict], "batch {batch_len}");
        for e in b.iter().chain(&d) {
            assert_eq!(
                receipt_of(e),
                vec![Receipt::Accepted],
                "batch {batch_len}: {e:?}"
            );
            assert!(is_accepted(&mut p, e), "batch {batch_len}");
        }
        for flow_id in ["B", "D"] {
            let seqs: Vec<i64> = report
                .deliveries
                .iter()
                .filter(|d| d.flow_id.as_str() == flow_id)
                .map(|d| d.seq.get())
                .collect();
            assert_eq!(seqs, vec![1, 2, 3], "batch {batch_len}: per-flow order");
        }
        assert!(
            !is_accepted(&mut p, &a),
            "a conflict is never marked accepted"
        );
        let again = relay_fair(&mut p, &mut c, None, batch_len);
        assert!(
            again
                .deliveries
                .iter()
                .all(|d| d.receipt != Receipt::Accepted),
            "{again:?}"
        );
        assert!(!is_accepted(&mut p, &a));
        let mut inbox = inbox_envelopes(&mut c);
        inbox.retain(|e| e.flow_id.as_str() != "A");
        assert_eq!(inbox, [b.clone(), d.clone()].concat());
        assert_eq!(
            inbox_row(&mut c, &other.event_id).map(|r| r.envelope),
            Some(other)
        );
    }
}

/// PROTOCOL.md section 12: an event's well-formed `traceparent` is recorded
/// on the relay's, the inbox's and the applier's span of that event, and
/// on its round's; an ill-formed one stays in the body and is recorded on
/// no span.
pub fn traceparents_are_recorded_on_each_events_spans<B: Backend>(dir: &Path) {
    const TRACED: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const ILL_FORMED: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331";
    let (mut p, mut c) = B::open(dir);
    let mut events = reservation_events("t", 2);
    events[0]
        .headers
        .insert("traceparent".into(), ILL_FORMED.into());
    events[1]
        .headers
        .insert("traceparent".into(), TRACED.into());
    p.append_events(&events).unwrap();
    let spans = crate::spans::SpanCapture::new();
    spans.during(|| {
        relay_fair(&mut p, &mut c, None, 16);
        process(&mut c, None, V1);
    });
    let ids: Vec<String> = events.iter().map(|e| e.event_id.to_string()).collect();
    let expected = vec![
        (ids[0].clone(), None),
        (ids[1].clone(), Some(TRACED.to_owned())),
        (ids[2].clone(), None),
    ];
    for name in ["relay_event", "receive_event", "apply_event"] {
        assert_eq!(spans.traceparents(name), expected, "{name} spans");
    }
    let rounds: Vec<Option<String>> = spans
        .named("relay_batch")
        .iter()
        .map(|s| s.field("traceparent").map(str::to_owned))
        .collect();
    assert_eq!(rounds, [None, Some(TRACED.to_owned()), None]);
    let stored = inbox_envelopes(&mut c);
    assert_eq!(
        stored, events,
        "the headers are kept, the ill-formed one too"
    );
    assert_eq!(projected(&mut c, "t"), (FlowState::Released, Some(2), 3));
}
