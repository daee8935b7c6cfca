//! Rules for a backend whose relay rounds hand over several events of a
//! flow at once (`RelayOptions::flow_events_max`, `relay --flow-events`:
//! the PostgreSQL producer; an SQLite producer hands a flow's head alone,
//! so these never apply to it). Each function takes a fresh, empty
//! directory of its own and panics when the backend breaks the rule; the
//! backend's own tests call them.

use std::path::Path;

use ordo_core::{Envelope, Receipt, Receive};
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
