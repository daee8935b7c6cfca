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
//!
//! [`TestDomain`] is that handler, given the backend's own way to record.

use std::path::Path;

use ordo_core::envelope::EventType;
use ordo_core::ops::InboxScope;
use ordo_core::{
    process_all, ApplyContext, ApplyHandler, BlockCode, BlockReason, ConsumerOps, ConsumerStore,
    DrainStop, Envelope, EventId, FlowId, InboxStatus, Receive, SchemaVersion, Seq, Step,
    StoreError, Verdict,
};

use crate::support::inbox_flow;
use crate::Backend;

/// The code of an event of type `refuse`.
pub const REFUSED: BlockCode = BlockCode::from_static("refused");
/// The detail of an event of type `refuse`.
pub const REFUSED_DETAIL: &str = "refused by the test domain";
/// The code of an event of type `later` the handler does not take yet.
pub const NOT_YET: BlockCode = BlockCode::from_static("not_yet");

/// How a backend records an event in the test domain's own table: its
/// `(flow_id, seq)`, written through the apply transaction `Tx`.
pub type Record<Tx> = fn(&Tx, &Envelope) -> Result<(), StoreError>;

/// The test domain's handler (the contract above) on a backend whose apply
/// transaction is `Tx`.
pub struct TestDomain<Tx: ?Sized> {
    reevaluate: Vec<BlockCode>,
    record: Record<Tx>,
}

impl<Tx: ?Sized> TestDomain<Tx> {
    /// The handler that evaluates again the rows blocked with `reevaluate`
    /// and records through `record`.
    pub fn new(reevaluate: Vec<BlockCode>, record: Record<Tx>) -> TestDomain<Tx> {
        TestDomain { reevaluate, record }
    }
}

impl<Tx: ?Sized> ApplyHandler<Tx> for TestDomain<Tx> {
    fn apply(
        &mut self,
        cx: &mut ApplyContext<'_, Tx>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        let record = || (self.record)(cx, event);
        match event.event_type.as_str() {
            "record" => record().map(|()| Verdict::Apply),
            "refuse" => {
                record()?;
                Ok(Verdict::block_with(REFUSED, REFUSED_DETAIL))
            }
            "later" if self.reevaluate.contains(&NOT_YET) => record().map(|()| Verdict::Apply),
            "later" => Ok(Verdict::block(NOT_YET)),
            _ => Ok(Verdict::block(BlockCode::from_static("unknown_type"))),
        }
    }

    fn reevaluate(&self) -> &[BlockCode] {
        &self.reevaluate
    }
}

fn event(flow: &str, seq: i64, event_type: &str) -> Envelope {
    Envelope {
        event_id: EventId::new(format!("{flow}-{seq}")).unwrap(),
        flow_id: FlowId::new(flow).unwrap(),
        seq: Seq::new(seq).unwrap(),
        schema_version: SchemaVersion::V1,
        event_type: EventType::new(event_type).unwrap(),
        payload: serde_json::Map::new(),
        producer: ordo_core::ProducerName::default(),
        headers: Default::default(),
    }
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
    let step = c.apply_next_with(&inbox_flow("f"), &mut handler).unwrap();
    assert_eq!(step, Step::Applied { seq: Seq::FIRST });
    let refused = BlockReason::with_detail(REFUSED, REFUSED_DETAIL);
    let drain = ordo_core::drain(&mut c, &inbox_flow("f"), None, &mut handler, 16).unwrap();
    assert_eq!(
        (drain.applied, drain.stop),
        (0, DrainStop::Blocked(refused.clone()))
    );
    assert_eq!(
        B::handled(&mut c),
        [("f".to_owned(), 1)],
        "the block's record is undone"
    );

    let blocked = c.inbox_entries(true, InboxScope::All, 10).unwrap();
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
    assert_eq!(c.flows_with_work(&[NOT_YET]).unwrap(), [inbox_flow("g")]);
    // Evaluated again without the code: still blocked, nothing written.
    process_all(&mut c, None, &mut old, 16).unwrap();
    assert!(B::handled(&mut c).is_empty());

    let mut new = B::test_handler(vec![NOT_YET]);
    let drains = process_all(&mut c, None, &mut new, 16).unwrap();
    let by_flow: Vec<(String, u64)> = drains
        .iter()
        .map(|d| (d.flow.flow_id.to_string(), d.applied))
        .collect();
    // `h` is not visited: its only row is blocked with a code not listed.
    assert_eq!(by_flow, [("g".to_owned(), 2)]);
    assert_eq!(
        B::handled(&mut c),
        [("g".to_owned(), 1), ("g".to_owned(), 2)]
    );
    let h = c
        .inbox_entries(false, InboxScope::Flow(&inbox_flow("h")), 10)
        .unwrap();
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
        .apply_batch_with(
            &[(inbox_flow("a"), None), (inbox_flow("b"), None)],
            100,
            &mut handler,
        )
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

/// A call a store made to a handler: the `(flow_id, seq)` of its events.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    One(String),
    All(Vec<String>),
}

fn named(event: &Envelope) -> String {
    format!("{}{}", event.flow_id, event.seq)
}

/// The test handler, with every call the store made to it recorded.
struct Calls<H> {
    inner: H,
    calls: Vec<Call>,
}

impl<Tx: ?Sized, H: ApplyHandler<Tx>> ApplyHandler<Tx> for Calls<H> {
    fn apply(
        &mut self,
        tx: &mut ApplyContext<'_, Tx>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        self.calls.push(Call::One(named(event)));
        self.inner.apply(tx, event)
    }

    /// Each event through the test handler, stopping at the first block.
    fn apply_all(
        &mut self,
        tx: &mut ApplyContext<'_, Tx>,
        events: &[Envelope],
    ) -> Result<Option<Verdict>, StoreError> {
        self.calls
            .push(Call::All(events.iter().map(named).collect()));
        for event in events {
            if let Verdict::Block(reason) = self.inner.apply(tx, event)? {
                return Ok(Some(Verdict::Block(reason)));
            }
        }
        Ok(Some(Verdict::Apply))
    }

    fn reevaluate(&self) -> &[BlockCode] {
        self.inner.reevaluate()
    }
}

fn one(name: &str) -> Call {
    Call::One(name.to_owned())
}

fn all(names: &[&str]) -> Call {
    Call::All(names.iter().map(|n| n.to_string()).collect())
}

/// A batch hands the events it applies to the handler in one
/// `apply_all` call, in the batch's order; when that call blocks, nothing
/// of it stays, and the same events are offered again one at a time, so
/// that only the blocked one is held. A single apply is one `apply` call.
pub fn generic_a_batch_hands_its_events_to_the_handler_at_once<B: Backend>(dir: &Path) {
    let mut c = B::open_test_domain(dir);
    c.receive_batch(&[
        event("a", 1, "record"),
        event("a", 2, "record"),
        event("b", 1, "record"),
        event("c", 1, "record"),
        event("c", 2, "refuse"),
        event("d", 1, "record"),
        event("e", 1, "record"),
    ])
    .unwrap();
    let mut handler = Calls {
        inner: B::test_handler(Vec::new()),
        calls: Vec::new(),
    };
    let drains = c
        .apply_batch_with(
            &[(inbox_flow("a"), None), (inbox_flow("b"), None)],
            100,
            &mut handler,
        )
        .unwrap();
    assert_eq!(handler.calls, [all(&["a1", "a2", "b1"])]);
    let applied: Vec<u64> = drains.iter().map(|d| d.applied).collect();
    assert_eq!(applied, [2, 1]);

    handler.calls.clear();
    let drains = c
        .apply_batch_with(
            &[(inbox_flow("c"), None), (inbox_flow("d"), None)],
            100,
            &mut handler,
        )
        .unwrap();
    assert_eq!(
        handler.calls,
        [all(&["c1", "c2", "d1"]), one("c1"), one("c2"), one("d1")],
        "a block in the batch call: the events again, one at a time"
    );
    assert_eq!((drains[0].applied, drains[1].applied), (1, 1));
    assert!(matches!(drains[0].stop, DrainStop::Blocked(_)));
    let handled: Vec<String> = B::handled(&mut c)
        .into_iter()
        .map(|(flow, seq)| format!("{flow}{seq}"))
        .collect();
    assert_eq!(
        handled,
        ["a1", "a2", "b1", "c1", "d1"],
        "c2's record is undone"
    );

    handler.calls.clear();
    assert_eq!(
        c.apply_next_with(&inbox_flow("e"), &mut handler).unwrap(),
        Step::Applied { seq: Seq::FIRST }
    );
    assert_eq!(handler.calls, [one("e1")]);
}

/// A row blocked before and evaluated again is offered alone, under its
/// own savepoint, after the events of the batch before it and before those
/// after it.
pub fn generic_a_reevaluated_row_keeps_its_place_in_the_batch<B: Backend>(dir: &Path) {
    let mut c = B::open_test_domain(dir);
    c.receive_batch(&[event("g", 1, "later"), event("g", 2, "record")])
        .unwrap();
    let mut old = B::test_handler(Vec::new());
    let step = c.apply_next_with(&inbox_flow("g"), &mut old).unwrap();
    assert!(matches!(step, Step::Blocked { .. }), "{step:?}");
    c.receive_batch(&[event("a", 1, "record")]).unwrap();

    let mut handler = Calls {
        inner: B::test_handler(vec![NOT_YET]),
        calls: Vec::new(),
    };
    let drains = c
        .apply_batch_with(
            &[(inbox_flow("a"), None), (inbox_flow("g"), None)],
            100,
            &mut handler,
        )
        .unwrap();
    assert_eq!(handler.calls, [all(&["a1"]), one("g1"), all(&["g2"])]);
    assert_eq!((drains[0].applied, drains[1].applied), (1, 2));
    assert_eq!(
        B::handled(&mut c),
        [
            ("a".to_owned(), 1),
            ("g".to_owned(), 1),
            ("g".to_owned(), 2)
        ]
    );
}

/// A batch that visits many flows still drains one flow's many events up to
/// its limit, however few of them it read ahead with the others.
pub fn generic_a_batch_drains_a_long_flow_among_short_ones<B: Backend>(dir: &Path) {
    let mut c = B::open_test_domain(dir);
    let mut events: Vec<Envelope> = (1..=6).map(|seq| event("a", seq, "record")).collect();
    events.extend(["b", "c", "d"].map(|f| event(f, 1, "record")));
    c.receive_batch(&events).unwrap();
    let mut handler = B::test_handler(Vec::new());
    let flows = ["a", "b", "c", "d"].map(|f| (inbox_flow(f), None));
    let drains = c.apply_batch_with(&flows, 5, &mut handler).unwrap();
    let seen: Vec<(String, u64, DrainStop)> = drains
        .into_iter()
        .map(|d| (d.flow.flow_id.to_string(), d.applied, d.stop))
        .collect();
    assert_eq!(seen, [("a".to_owned(), 5, DrainStop::Limit)]);
    let drains = c.apply_batch_with(&flows, 5, &mut handler).unwrap();
    let applied: Vec<(String, u64)> = drains
        .into_iter()
        .map(|d| (d.flow.flow_id.to_string(), d.applied))
        .collect();
    assert_eq!(
        applied,
        [("a", 1), ("b", 1), ("c", 1), ("d", 1)].map(|(f, n)| (f.to_owned(), n))
    );
    assert_eq!(B::handled(&mut c).len(), 9);
}
