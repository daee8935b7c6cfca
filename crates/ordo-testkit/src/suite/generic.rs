//! The generic suite: the store's rules for any application's handler, run
//! with the test domain's handler ([`Backend::test_handler`]) on a consumer
//! store of the test domain ([`Backend::open_test_domain`]), with no
//! reservation rule involved.
//!
//! The test domain's contract, which each backend implements in its own
//! query language:
//! - an event of type `record` is recorded as `(flow_id, seq)` in the
//!   handler's own table and applied;
//! - an event of type `refuse` is recorded, then blocked with code
//!   [`REFUSED`] and detail [`REFUSED_DETAIL`] (the record must not stay);
//! - an event of type `later` is blocked with code [`NOT_YET`] and no
//!   detail, unless the handler was made with [`NOT_YET`] among its codes
//!   to evaluate again: then it is recorded and applied;
//! - any other type blocks with code `unknown_type`.

use std::path::Path;

use ordo_core::envelope::EventType;
use ordo_core::{
    process_all, BlockCode, BlockReason, ConsumerStore, DrainStop, Envelope, EventId, FlowId,
    InboxStatus, SchemaVersion, Seq, Step,
};

use crate::Backend;

/// The code of an event of type `refuse`.
pub const REFUSED: BlockCode = BlockCode::from_static("refused");
/// The detail of an event of type `refuse`.
pub const REFUSED_DETAIL: &str = "refused by the test domain";
/// The code of an event of type `later` the handler does not take yet.
pub const NOT_YET: BlockCode = BlockCode::from_static("not_yet");

fn event(flow: &str, seq: i64, event_type: &str) -> Envelope {
    Envelope {
        event_id: EventId::new(format!("{flow}-{seq}")).unwrap(),
        flow_id: FlowId::new(flow).unwrap(),
        seq: Seq::new(seq).unwrap(),
        schema_version: SchemaVersion::V1,
        event_type: EventType::new(event_type).unwrap(),
        payload: serde_json::Map::new(),
    }
}

fn flow(id: &str) -> FlowId {
    FlowId::new(id).unwrap()
}

/// A handler's writes commit with the inbox mark; a block undoes them, is
/// stored with the handler's own code and detail, listed by `inbox_entries`,
/// counted by the status under its code, and holds the flow.
pub fn generic_handler_writes_commit_with_the_mark_and_a_block_undoes_them<B: Backend>(dir: &Path) {
    let mut c = B::open_test_domain(dir);
    let events = [
        event("f", 1, "record"),
        event("f", 2, "refuse"),
        event("f", 3, "record"),
    ];
    c.receive_batch(&events).unwrap();
    let mut handler = B::test_handler(Vec::new());
    let step = c.apply_next_with(&flow("f"), &mut handler).unwrap();
    assert_eq!(step, Step::Applied { seq: Seq::FIRST });
    let refused = BlockReason::with_detail(REFUSED, REFUSED_DETAIL);
    let drain = ordo_core::drain(&mut c, &flow("f"), None, &mut handler, 16).unwrap();
    assert_eq!(
        (drain.applied, drain.stop),
        (0, DrainStop::Blocked(refused.clone()))
    );
    assert_eq!(
        B::handled(&mut c),
        [("f".to_owned(), 1)],
        "the block's record is undone"
    );

    let blocked = c.inbox_entries(true, None, 10).unwrap();
    assert_eq!(blocked.len(), 1);
    assert_eq!(blocked[0].envelope, events[1], "the body is unchanged");
    assert_eq!(blocked[0].status, InboxStatus::Blocked(refused));
    let status = c.consumer_status().unwrap();
    assert_eq!(status.blocked.get("refused"), Some(&1));
    assert_eq!((status.applied, status.pending), (1, 1));
}

/// Which blocked rows are evaluated again is the handler's choice, by code:
/// a handler without the code leaves them blocked; one that lists it is
/// offered them, and the flow moves on.
pub fn generic_reevaluation_is_the_handlers_choice<B: Backend>(dir: &Path) {
    let mut c = B::open_test_domain(dir);
    c.receive_batch(&[
        event("g", 1, "later"),
        event("g", 2, "record"),
        event("h", 1, "refuse"),
    ])
    .unwrap();
    let mut old = B::test_handler(Vec::new());
    process_all(&mut c, None, &mut old, 16).unwrap();
    assert!(B::handled(&mut c).is_empty());
    assert_eq!(c.flows_with_work(&[NOT_YET]).unwrap(), [flow("g")]);
    // Evaluated again without the code: still blocked, nothing written.
    process_all(&mut c, None, &mut old, 16).unwrap();
    assert!(B::handled(&mut c).is_empty());

    let mut new = B::test_handler(vec![NOT_YET]);
    let drains = process_all(&mut c, None, &mut new, 16).unwrap();
    let by_flow: Vec<(String, u64)> = drains
        .iter()
        .map(|d| (d.flow_id.to_string(), d.applied))
        .collect();
    // `h` is not visited: its only row is blocked with a code not listed.
    assert_eq!(by_flow, [("g".to_owned(), 2)]);
    assert_eq!(
        B::handled(&mut c),
        [("g".to_owned(), 1), ("g".to_owned(), 2)]
    );
    let h = c.inbox_entries(false, Some(&flow("h")), 10).unwrap();
    assert_eq!(
        h[0].status,
        InboxStatus::Blocked(BlockReason::with_detail(REFUSED, REFUSED_DETAIL)),
        "a code the handler does not list stays blocked"
    );
}

/// In a batch across flows, a block undoes only the blocked event's
/// writes: the events before it, of its flow and of others, commit.
pub fn generic_a_block_in_a_batch_undoes_only_its_own_writes<B: Backend>(dir: &Path) {
    let mut c = B::open_test_domain(dir);
    c.receive_batch(&[
        event("a", 1, "record"),
        event("a", 2, "refuse"),
        event("b", 1, "record"),
        event("b", 2, "record"),
    ])
    .unwrap();
    let mut handler = B::test_handler(Vec::new());
    let drains = c
        .apply_batch_with(&[(flow("a"), None), (flow("b"), None)], 100, &mut handler)
        .unwrap();
    assert_eq!(drains.len(), 2);
    assert_eq!(drains[0].applied, 1);
    assert!(matches!(drains[0].stop, DrainStop::Blocked(_)));
    assert_eq!((drains[1].applied, &drains[1].stop), (2, &DrainStop::Idle));
    assert_eq!(
        B::handled(&mut c),
        [
            ("a".to_owned(), 1),
            ("b".to_owned(), 1),
            ("b".to_owned(), 2)
        ]
    );
}
