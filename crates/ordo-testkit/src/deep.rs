//! Rules for a backend whose relay rounds hand over several events of a
//! flow at once (`RelayOptions::flow_events_max`, `relay --flow-events`:
//! both backends' producers). Each function takes a fresh, empty
//! directory of its own and panics when the backend breaks the rule; the
//! backend's own tests call them.

use std::collections::BTreeSet;
use std::path::Path;

use ordo_core::{Envelope, FlowId, ProducerStore, Receipt, Receive};
use ordo_reservation::ApplyOptions;
use ordo_reservation::FlowState::{Confirmed, Released, Reserved};

use crate::support::*;
use crate::Backend;

/// When one delivery carries several events of a flow and the first is a
/// conflict, the later ones are answered `after_conflict` and the relay
/// leaves them unmarked (PROTOCOL.md section 12): only the conflicting
/// event is quarantined, the later ones are neither accepted, nor
/// quarantined, nor counted as attempted, and the consumer stored none of
/// them; another flow of the same delivery is delivered.
pub fn relay_leaves_what_follows_a_conflict_in_its_round_unmarked<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, mut c) = open_at::<B>(dir, &clock);
    let a1 = commit(&mut p, &request("A", 0, Reserved, Some(10), 1));
    let a2 = commit(&mut p, &request("A", 1, Confirmed, None, 1));
    let a3 = commit(&mut p, &request("A", 2, Released, None, 1));
    let b = commit_full_flow(&mut p, "B", 20);
    // the consumer holds another event at (A, 1)
    let other = amount_event("not-A-1", "A", 1, 1, "reserved", 10);
    assert_eq!(c.receive(&other).unwrap(), Receipt::Accepted);

    let report = relay_deep_at(&mut p, &mut c, 3, T0 + 5_000);
    let receipts = |events: &[&Envelope]| -> Vec<Receipt> {
        let delivered = |e: &&Envelope| report.deliveries.iter().find(|d| d.event_id == e.event_id);
        events
            .iter()
            .map(|e| delivered(e).expect("delivered").receipt)
            .collect()
    };
    let after = Receipt::AfterConflict;
    assert_eq!(
        receipts(&[&a1, &a2, &a3]),
        [Receipt::Conflict, after, after],
        "{report:?}"
    );
    assert_eq!(
        receipts(&b.iter().collect::<Vec<_>>()),
        [Receipt::Accepted; 3]
    );
    assert_quarantined(&outbox_entry(&mut p, &a1));
    for e in [&a2, &a3] {
        let entry = outbox_entry(&mut p, e);
        assert!(!entry.accepted && !entry.quarantined, "{entry:?}");
        assert_eq!((entry.attempts, entry.last_outcome), (0, None), "unmarked");
        assert!(inbox_row(&mut c, &e.event_id).is_none(), "not stored");
    }
    for e in &b {
        assert!(is_accepted(&mut p, e), "{e:?}");
    }
}

/// The event ids of a round, in the order handed.
fn ids(round: &[Envelope]) -> Vec<&str> {
    round.iter().map(|e| e.event_id.as_str()).collect()
}

/// A deeper round hands each due flow's head and the events after it, in
/// seq order, up to `flow_events_max` of each flow and the round's limit
/// in all, the flows least recently served first; once the receipts are
/// recorded every head has moved past what the destination holds, and
/// every event is applied in order.
pub fn deep_round_hands_each_flow_from_its_head_in_seq_order<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, mut c) = open_at::<B>(dir, &clock);
    let a = commit_full_flow(&mut p, "A", 10);
    let b = commit_full_flow(&mut p, "B", 20);
    let none = BTreeSet::new();
    let round = p.fair_round_deep(3, 2, &none, T0).expect("a round");
    assert_eq!(
        ids(&round),
        ids(&[a[0].clone(), a[1].clone(), b[0].clone()])
    );
    let round = p.fair_round_deep(100, 2, &none, T0).expect("a round");
    let expected = [&a[0], &a[1], &b[0], &b[1]].map(|e| e.event_id.as_str());
    assert_eq!(ids(&round), expected);

    let report = relay_deep_at(&mut p, &mut c, 3, T0 + 5_000);
    assert_eq!(report.deliveries.len(), 6, "{report:?}");
    for e in a.iter().chain(&b) {
        assert!(is_accepted(&mut p, e), "{e:?}");
    }
    assert!(p
        .fair_round_deep(100, 3, &none, T0 + 5_000)
        .unwrap()
        .is_empty());
    let applied: u64 = process(&mut c, None, ApplyOptions::default())
        .iter()
        .map(|d| d.applied)
        .sum();
    assert_eq!(applied, 6);
    check_consumer_invariants(&mut c);
}

/// A deeper round leaves out the events the destination already holds
/// (here one relayed by id), hands the rest of the flow behind its head,
/// and never a flow set aside.
pub fn deep_round_leaves_out_what_the_destination_holds<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (mut p, mut c) = open_at::<B>(dir, &clock);
    let a = commit_full_flow(&mut p, "A", 10);
    let b = commit_full_flow(&mut p, "B", 20);
    relay_one(&mut p, &mut c, &a[1].event_id).expect("relay A's second event");
    assert!(is_accepted(&mut p, &a[1]));
    let skip: BTreeSet<FlowId> = [flow("B")].into();
    let round = p
        .fair_round_deep(100, 3, &skip, T0 + 60_000)
        .expect("a round");
    assert_eq!(ids(&round), [&a[0], &a[2]].map(|e| e.event_id.as_str()));
    let report = relay_deep_at(&mut p, &mut c, 3, T0 + 60_000);
    let mut handed: Vec<&str> = report
        .deliveries
        .iter()
        .map(|d| d.event_id.as_str())
        .collect();
    handed.sort_unstable();
    let mut expected: Vec<&str> = [&a[0], &a[2], &b[0], &b[1], &b[2]]
        .iter()
        .map(|e| e.event_id.as_str())
        .collect();
    expected.sort_unstable();
    assert_eq!(handed, expected, "{report:?}");
    for e in a.iter().chain(&b) {
        assert!(is_accepted(&mut p, e), "{e:?}");
    }
}
