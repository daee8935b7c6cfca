//! PROTOCOL.md section 12: custody per destination. Each destination of a
//! producer store keeps its own marks, quarantines, heads and consumer; a
//! row is settled (and may be pruned) once every destination its flow is
//! delivered to holds it; a destination begins a flow only at its start.

use std::path::Path;

#[allow(unused_imports)]
use ordo_reservation::{FlowState, ReservationConsumer, ReservationProducer};

use ordo_core::destination::{AbandonRequest, DestinationRefused, DestinationStart};
use ordo_core::{
    Backoff, DestinationName, DrainStop, Envelope, ProducerOps, ProducerStore, Receipt, StoreId,
};

use crate::support::*;
use crate::Backend;

use FlowState::{Confirmed, Released, Reserved};

fn name(text: &str) -> DestinationName {
    DestinationName::new(text).expect("a destination name")
}

/// Chooses `destination` for the producer's relay calls.
fn choose<P: ProducerOps + ?Sized>(p: &mut P, destination: &str) {
    p.use_destination(Some(&name(destination)))
        .expect("use_destination")
        .expect("a known destination");
}

/// The event ids `destination` has yet to hold, oldest first.
fn pending_at<P: ProducerStore + ProducerOps + ?Sized>(
    p: &mut P,
    destination: &str,
) -> Vec<String> {
    choose(p, destination);
    let pending = p.pending(100).expect("pending");
    pending.iter().map(|e| e.event_id.to_string()).collect()
}

/// Fair rounds at `destination` until it has nothing left to relay, their
/// events answered `receipt` at `at_ms`; returns them in delivery order.
fn deliver<P: ProducerStore + ReservationProducer + ?Sized>(
    p: &mut P,
    destination: &str,
    receipt: Receipt,
    at_ms: i64,
) -> Vec<Envelope> {
    choose(p, destination);
    let mut delivered = Vec::new();
    for _ in 0..100 {
        let round = p
            .fair_round(100, &Default::default(), at_ms)
            .expect("fair_round");
        if round.is_empty() {
            return delivered;
        }
        let receipts: Vec<(&Envelope, Receipt)> = round.iter().map(|e| (e, receipt)).collect();
        record_receipts(p, &receipts, at_ms);
        delivered.extend(round);
    }
    panic!("{destination}: still events to relay after 100 rounds")
}

fn ids(events: &[Envelope]) -> Vec<String> {
    events.iter().map(|e| e.event_id.to_string()).collect()
}

/// Each destination holds its own marks: one's receipts never move
/// another's custody; a row counts as accepted, and is pruned, only once
/// every destination its flow is delivered to holds it; each
/// destination's status counts its own backlog and the store's adds them.
pub fn destinations_keep_their_own_custody_and_prune_waits_for_all<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, _c) = open_at::<B>(dir, &clock);
    let a1 = commit(&mut p, &request("A", 0, Reserved, Some(1), 1));
    let added = p.add_destination(&name("billing"), DestinationStart::Start);
    assert_eq!(added.expect("add_destination"), Ok(()));
    let b1 = commit(&mut p, &request("B", 0, Reserved, Some(2), 1));
    let a2 = commit(&mut p, &request("A", 1, Confirmed, None, 1));
    let all = ids(&[a1.clone(), b1.clone(), a2.clone()]);
    assert_eq!(
        pending_at(&mut p, "billing"),
        all,
        "from start: every event"
    );

    let delivered = deliver(&mut p, "default", Receipt::Accepted, T0 + 1_000);
    assert_eq!(delivered.len(), 3, "default's round: {:?}", ids(&delivered));
    assert!(pending_at(&mut p, "default").is_empty());
    assert_eq!(
        pending_at(&mut p, "billing"),
        all,
        "billing's custody unmoved"
    );
    let entry = outbox_entry(&mut p, &a1);
    assert!(!entry.accepted, "billing does not hold it: {entry:?}");
    let by_name: Vec<(&str, bool)> = (entry.destinations.iter())
        .map(|c| (c.destination.as_str(), c.accepted))
        .collect();
    assert_eq!(by_name, [("billing", false), ("default", true)]);
    let status = p.producer_status(T0 + 2_000).expect("producer_status");
    assert_eq!(status.backlog, 3, "the sum over destinations");
    let destinations = p.destinations(T0 + 2_000).expect("destinations");
    let backlogs: Vec<(&str, u64)> = (destinations.iter())
        .map(|d| (d.name.as_str(), d.status.backlog))
        .collect();
    assert_eq!(backlogs, [("billing", 3), ("default", 0)]);
    assert_eq!(p.prune_outbox(T0 + 60_000).expect("prune").rows, 0);

    let delivered = deliver(&mut p, "billing", Receipt::Duplicate, T0 + 3_000);
    assert_eq!(
        ids(&delivered),
        ["A-1", "B-1", "A-2"],
        "one head per flow a round"
    );
    assert!(is_accepted(&mut p, &a1) && is_accepted(&mut p, &b1));
    assert_eq!(p.producer_status(T0 + 4_000).unwrap().backlog, 0);
    assert_eq!(p.prune_outbox(T0 + 60_000).expect("prune").rows, 3);
}

/// A destination added `from now` is given only the flows begun after it,
/// each from its first event; one added `from start` begins every flow at
/// its start, and is refused (writing nothing) once a flow's start was
/// pruned. The other refusals write nothing either.
pub fn a_destination_begins_flows_at_their_start_and_refusals_write_nothing<B: Backend>(
    dir: &Path,
) {
    let clock = ManualClock::new(T0);
    let (mut p, _c) = open_at::<B>(dir, &clock);
    let a1 = commit(&mut p, &request("A", 0, Reserved, Some(1), 1));
    assert_eq!(
        p.add_destination(&name("late"), DestinationStart::Now)
            .unwrap(),
        Ok(())
    );
    let a2 = commit(&mut p, &request("A", 1, Confirmed, None, 1));
    let b1 = commit(&mut p, &request("B", 0, Reserved, Some(2), 1));
    assert_eq!(pending_at(&mut p, "late"), ids(std::slice::from_ref(&b1)));
    assert_eq!(pending_at(&mut p, "default"), ids(&[a1.clone(), a2, b1]));

    // A's start pruned: a destination from start would begin it midway.
    deliver(&mut p, "default", Receipt::Accepted, T0 + 1_000);
    deliver(&mut p, "late", Receipt::Accepted, T0 + 1_000);
    assert_eq!(p.prune_outbox(T0 + 60_000).unwrap().rows, 3);
    let before = p.destinations(T0).unwrap();
    let refused = p.add_destination(&name("audit"), DestinationStart::Start);
    assert_eq!(refused.unwrap(), Err(DestinationRefused::Pruned(flow("A"))));
    let taken = p.add_destination(&name("late"), DestinationStart::Now);
    assert_eq!(
        taken.unwrap(),
        Err(DestinationRefused::Exists(name("late")))
    );
    let unknown = p.remove_destination(&name("nowhere"), "ops", "test");
    assert_eq!(
        unknown.unwrap(),
        Err(DestinationRefused::Unknown(name("nowhere")))
    );
    assert_eq!(
        p.use_destination(None).unwrap(),
        Err(DestinationRefused::Ambiguous(2))
    );
    assert_eq!(p.destinations(T0).unwrap(), before, "nothing written");

    assert_eq!(
        p.remove_destination(&name("late"), "ops", "gone").unwrap(),
        Ok(())
    );
    let last = p.remove_destination(&name("default"), "ops", "test");
    assert_eq!(
        last.unwrap(),
        Err(DestinationRefused::Last(name("default")))
    );
    let repairs = p.producer_repairs().unwrap();
    let actions: Vec<(&str, Option<&str>)> = (repairs.iter())
        .map(|r| (r.action.as_str(), r.destination.as_deref()))
        .collect();
    assert_eq!(actions, [("destination_remove", Some("late"))]);
    let _ = commit(&mut p, &request("C", 0, Reserved, Some(3), 1));
    assert_eq!(
        pending_at(&mut p, "default"),
        ["C-1"],
        "one destination again"
    );
}

/// A conflict at one destination quarantines the event there only;
/// abandoning the flow for that destination (audited) retires its marks
/// there, settles the rows the other holds, and gives its later events no
/// mark there; a second abandon is refused.
pub fn abandon_retires_a_flow_for_one_destination_only<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, _c) = open_at::<B>(dir, &clock);
    p.add_destination(&name("billing"), DestinationStart::Start)
        .unwrap()
        .unwrap();
    let a1 = commit(&mut p, &request("A", 0, Reserved, Some(1), 1));
    let b1 = commit(&mut p, &request("B", 0, Reserved, Some(2), 1));
    deliver(&mut p, "default", Receipt::Accepted, T0 + 1_000);
    choose(&mut p, "billing");
    record_receipts(
        &mut p,
        &[(&a1, Receipt::Conflict), (&b1, Receipt::Accepted)],
        T0,
    );
    let entry = outbox_entry(&mut p, &a1);
    assert_quarantined(&entry);
    let billing = p.destinations(T0).unwrap();
    assert_eq!(billing[0].status.quarantined, 1, "{billing:?}");

    let abandon = AbandonRequest {
        destination: name("billing"),
        flow: flow("A"),
        by: "ops".into(),
        reason: "conflict for good".into(),
    };
    let repair = p.abandon_flow(&abandon).unwrap().expect("abandoned");
    assert_eq!(
        (repair.seq, repair.event_id.as_deref()),
        (Some(1), Some("A-1"))
    );
    assert!(!is_accepted(&mut p, &a1), "billing never holds it");
    let pruned = p.prune_outbox(T0 + 3_600_000).unwrap().rows;
    assert_eq!(pruned, 2, "the rows no destination waits for are settled");
    let a2 = commit(&mut p, &request("A", 1, Confirmed, None, 1));
    assert!(
        pending_at(&mut p, "billing").is_empty(),
        "no mark at billing"
    );
    assert_eq!(
        pending_at(&mut p, "default"),
        ids(std::slice::from_ref(&a2))
    );
    let status = p.destinations(T0).unwrap();
    assert_eq!(
        (status[0].status.backlog, status[0].status.quarantined),
        (0, 0)
    );
    let again = p.abandon_flow(&abandon).unwrap();
    assert_eq!(
        again,
        Err(DestinationRefused::AlreadyAbandoned {
            flow: flow("A"),
            destination: name("billing")
        })
    );
    let actions: Vec<String> = (p.producer_repairs().unwrap().iter())
        .map(|r| r.action.clone())
        .collect();
    assert_eq!(actions, ["abandon"]);
}

/// A destination records the consumer store of its first delivery and
/// refuses another's receipts afterwards, marking nothing; another
/// destination records its own.
pub fn a_destination_keeps_to_the_consumer_of_its_first_delivery<B: Backend>(dir: &Path) {
    let (mut p, _c) = B::open(dir);
    p.add_destination(&name("billing"), DestinationStart::Start)
        .unwrap()
        .unwrap();
    let a1 = commit(&mut p, &request("A", 0, Reserved, Some(1), 1));
    let b1 = commit(&mut p, &request("B", 0, Reserved, Some(2), 1));
    let store_id = |digit: &str| StoreId::new(digit.repeat(32)).expect("a store id");
    let (first, second) = (store_id("a"), store_id("b"));
    let at = clock_now();
    choose(&mut p, "default");
    assert_eq!(
        p.recorded_consumer().unwrap(),
        None,
        "none before the first"
    );
    p.check_consumer(&second)
        .expect("anyone before the first delivery");
    let marks = [(a1.event_id.clone(), Receipt::Accepted)];
    p.record_receipts_from(Some(&first), &marks, at).unwrap();
    assert_eq!(p.recorded_consumer().unwrap(), Some(first.clone()));
    p.check_consumer(&first).expect("its own consumer");
    let before = p.destinations(at).unwrap();
    assert!(
        p.check_consumer(&second).is_err(),
        "checked before a delivery"
    );
    assert_eq!(
        p.destinations(at).unwrap(),
        before,
        "the check writes nothing"
    );
    let other = [(b1.event_id.clone(), Receipt::Accepted)];
    let refused = p.record_receipts_from(Some(&second), &other, at);
    assert!(refused.is_err(), "another consumer store: {refused:?}");
    assert_eq!(pending_at(&mut p, "default"), ["B-1"], "nothing marked");
    p.record_receipts_from(Some(&first), &other, at).unwrap();
    choose(&mut p, "billing");
    p.record_receipts_from(Some(&second), &marks, at).unwrap();
    let recorded: Vec<(String, Option<StoreId>)> = (p.destinations(at).unwrap().into_iter())
        .map(|d| (d.name.to_string(), d.consumer_store_id))
        .collect();
    assert_eq!(
        recorded,
        [
            ("billing".to_owned(), Some(second)),
            ("default".to_owned(), Some(first))
        ]
    );
}

fn clock_now() -> i64 {
    use ordo_core::Clock;
    clock().now_ms()
}

/// One destination's failures never delay another (PROTOCOL.md section
/// 12): while a flow's head backs off after a failed delivery at one
/// destination, and later stays quarantined there, the other
/// destination's relay rounds deliver that same flow's events as they
/// come, in order; each destination's bookkeeping and signals show only
/// its own.
pub fn one_destinations_failures_never_delay_another<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, mut c) = open_at::<B>(dir, &clock);
    p.add_destination(&name("billing"), DestinationStart::Start)
        .unwrap()
        .unwrap();
    let a1 = commit(&mut p, &request("A", 0, Reserved, Some(4), 1));
    let a2 = commit(&mut p, &request("A", 1, Confirmed, None, 1));

    // Billing's delivery of A's head fails: A backs off there, a minute.
    choose(&mut p, "billing");
    let failed_at = T0 + 100;
    assert_eq!(fair_round(&mut p, 10, failed_at), std::slice::from_ref(&a1));
    let backoff = Backoff {
        base_ms: 60_000,
        cap_ms: 60_000,
        floor_ms: 60_000,
    };
    let failed = std::slice::from_ref(&a1.event_id);
    p.record_failure(failed, "billing unreachable", failed_at, &backoff)
        .unwrap();
    let custody = |p: &mut B::Producer, e: &Envelope| {
        let entry = outbox_entry(p, e);
        (entry.destinations.iter())
            .map(|c| {
                let outcome = c.last_outcome.clone();
                (
                    c.destination.to_string(),
                    c.attempts,
                    outcome,
                    c.quarantined,
                )
            })
            .collect::<Vec<_>>()
    };
    let error = Some("error".to_owned());
    assert_eq!(
        custody(&mut p, &a1),
        [
            ("billing".to_owned(), 1, error.clone(), false),
            ("default".to_owned(), 0, None, false)
        ]
    );
    let soon = failed_at + 1_000;
    assert!(
        fair_round(&mut p, 10, soon).is_empty(),
        "A waits at billing"
    );

    // Meanwhile default's relay delivers the whole flow, in order.
    choose(&mut p, "default");
    let report = relay_fair_at(&mut p, &mut c, None, 256, soon);
    assert_eq!(
        report.deliveries,
        [
            delivery(&a1, Receipt::Accepted),
            delivery(&a2, Receipt::Accepted)
        ]
    );
    let signals = |p: &mut B::Producer, at: i64| {
        (p.destinations(at).unwrap().into_iter())
            .map(|d| {
                let s = d.status;
                (d.name.to_string(), s.backlog, s.backing_off, s.quarantined)
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        signals(&mut p, soon),
        [
            ("billing".to_owned(), 2, 1, 0),
            ("default".to_owned(), 0, 0, 0)
        ]
    );
    choose(&mut p, "billing");
    assert!(
        fair_round(&mut p, 10, soon).is_empty(),
        "still waiting there"
    );

    // Once due at billing, A's head is refused there for good: quarantined
    // at billing alone, and default goes on with A's next event.
    let due = failed_at + 60_001;
    assert_eq!(fair_round(&mut p, 10, due), std::slice::from_ref(&a1));
    record_receipts(&mut p, &[(&a1, Receipt::Conflict)], due);
    let a3 = commit(&mut p, &request("A", 2, Released, None, 1));
    assert_eq!(
        fair_round(&mut p, 10, due),
        std::slice::from_ref(&a2),
        "billing goes on past its quarantined event, at its own pace"
    );
    choose(&mut p, "default");
    let report = relay_fair_at(&mut p, &mut c, None, 256, due);
    assert_eq!(report.deliveries, [delivery(&a3, Receipt::Accepted)]);
    let conflict = Some("conflict".to_owned());
    assert_eq!(
        custody(&mut p, &a1),
        [
            ("billing".to_owned(), 2, conflict, true),
            ("default".to_owned(), 1, Some("accepted".to_owned()), false)
        ]
    );
    assert_eq!(
        signals(&mut p, due),
        [
            ("billing".to_owned(), 3, 0, 1),
            ("default".to_owned(), 0, 0, 0)
        ]
    );
    assert_eq!(pending_at(&mut p, "billing"), ids(&[a1, a2.clone(), a3]));
    let a2_at_billing = outbox_entry(&mut p, &a2).destinations[0].clone();
    assert_eq!(
        (a2_at_billing.destination.as_str(), a2_at_billing.attempts),
        ("billing", 0)
    );
    let drains = process(&mut c, None, V1);
    assert_eq!(drain_stops(&drains), [("A", 3, DrainStop::Idle)]);
    assert_eq!(projected(&mut c, "A"), (Released, Some(4), 3));
}
