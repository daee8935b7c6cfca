//! Small builders and readers shared by the suite, plus the consumer
//! invariant checker. Everything goes through the store traits.

#[allow(unused_imports)]
use ordo_reservation::{
    Advance, AdvanceRequest, ApplyOptions, EffectRecord, FlowRecord, FlowState, Projection,
    Quantity, ReservationConsumer, ReservationProducer,
};
use std::borrow::Borrow;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use ordo_core::ops::{InboxEntry, InboxScope, OutboxEntry};
use ordo_core::{
    BlockReason, Clock, Delivery, Drain, DrainStop, Envelope, EventId, FixedClock, FlowId,
    InboxFlow, InboxRecord, InboxStatus, OutboxRecord, ProducerName, ProducerStore, Receipt,
    RelayError, RelayOptions, RelayPolicy, RelayReport, RelayStop, SchemaVersion, Seq, Step,
    APPLY_BATCH_LEN_DEFAULT,
};
use serde_json::Value;

use crate::check::{check_end_state, EndState, Snapshot};
use crate::Backend;

/// Schema 1 only (the default consumer).
pub const V1: ApplyOptions = ApplyOptions { support_v2: false };
/// Schema 1 and 2.
pub const V2: ApplyOptions = ApplyOptions { support_v2: true };

/// A flow id; panics if invalid.
pub fn flow(id: &str) -> FlowId {
    FlowId::new(id).expect("test flow id")
}

/// The default producer's inbox flow `id`.
pub fn inbox_flow(id: &str) -> InboxFlow {
    InboxFlow::of_default(flow(id))
}

/// The inbox flow `id` of the producer named `producer`.
pub fn flow_of(producer: &str, id: &str) -> InboxFlow {
    let name = ProducerName::new(producer).expect("test producer name");
    InboxFlow::new(name, flow(id))
}

/// An event id; panics if invalid.
pub fn event_id(id: &str) -> EventId {
    EventId::new(id).expect("test event id")
}

/// A seq; panics if out of range.
pub fn seq(value: i64) -> Seq {
    Seq::new(value).expect("test seq")
}

/// The step one `apply_next` of `flow_id` reports; panics on a store error.
pub fn apply_step<C: ReservationConsumer + ?Sized>(
    consumer: &mut C,
    flow_id: &str,
    options: ApplyOptions,
) -> Step {
    consumer
        .apply_next(&inbox_flow(flow_id), options)
        .expect("apply_next")
}

/// The step of an apply that applied event `seq_value` of its flow.
pub fn applied_at(seq_value: i64) -> Step {
    Step::Applied {
        seq: seq(seq_value),
    }
}

/// The step of an apply that found event `seq_value` of its flow blocked
/// with `reason`.
pub fn blocked_at(seq_value: i64, reason: BlockReason) -> Step {
    Step::Blocked {
        seq: seq(seq_value),
        reason,
    }
}

/// A quantity; panics if out of range.
pub fn quantity(value: i64) -> Quantity {
    Quantity::new(value).expect("test quantity")
}

/// An envelope built from its JSON form through the strict codec, so that
/// every suite envelope is one a real consumer could receive.
pub fn envelope(
    event_id: &str,
    flow_id: &str,
    seq: i64,
    schema_version: i64,
    event_type: &str,
    payload: Value,
) -> Envelope {
    let value = serde_json::json!({
        "event_id": event_id,
        "flow_id": flow_id,
        "seq": seq,
        "schema_version": schema_version,
        "type": event_type,
        "payload": payload,
    });
    Envelope::from_value(value).expect("test envelope is well formed")
}

/// An [`envelope`] whose payload is `{"amount": amount}`.
pub fn amount_event(
    event_id: &str,
    flow_id: &str,
    seq: i64,
    schema_version: i64,
    event_type: &str,
    amount: i64,
) -> Envelope {
    let payload = serde_json::json!({ "amount": amount });
    envelope(event_id, flow_id, seq, schema_version, event_type, payload)
}

/// Parses envelope text through the strict codec; panics if malformed.
pub fn parse(text: &str) -> Envelope {
    Envelope::parse_str(text).expect("test envelope text is well formed")
}

/// The state reached by the `seq`-th step of a reservation flow (1, 2, 3).
pub fn state_of_step(seq: i64) -> FlowState {
    match seq {
        1 => FlowState::Reserved,
        2 => FlowState::Confirmed,
        3 => FlowState::Released,
        other => panic!("a reservation flow has three steps, not {other}"),
    }
}

/// The event a producer commits for step `seq` (1 to 3) of `flow_id` with
/// quantity `qty` in schema 1: the id the producer gives it, the step's type
/// and `{"amount": qty}`.
pub fn reservation_event(flow_id: &str, seq: i64, qty: i64) -> Envelope {
    let payload = serde_json::json!({ "amount": qty });
    event_at(flow_id, seq, state_of_step(seq).as_str(), payload)
}

/// An event of `flow_id` at `seq` in schema 1, under the id a producer
/// gives it ([`EventId::for_seq`]).
pub fn event_at(flow_id: &str, seq: i64, event_type: &str, payload: Value) -> Envelope {
    let id = EventId::for_seq(&flow(flow_id), self::seq(seq));
    envelope(id.as_str(), flow_id, seq, 1, event_type, payload)
}

/// The three events of a reservation flow, in seq order.
pub fn reservation_events(flow_id: &str, qty: i64) -> [Envelope; 3] {
    [1, 2, 3].map(|s| reservation_event(flow_id, s, qty))
}

/// An advance request; panics if the request's own rules refuse it.
pub fn request(
    flow_id: &str,
    expected_seq: i64,
    to: FlowState,
    qty: Option<i64>,
    schema_version: i64,
) -> AdvanceRequest {
    AdvanceRequest::new(
        flow(flow_id),
        expected_seq,
        to,
        qty.map(quantity),
        SchemaVersion::new(schema_version).expect("test schema version"),
    )
    .expect("test request is valid")
}

/// Advances and returns the committed event; panics on any other outcome.
pub fn commit<P: ProducerStore + ReservationProducer + ?Sized>(
    producer: &mut P,
    request: &AdvanceRequest,
) -> Envelope {
    match producer.advance(request) {
        Ok(Advance::Committed(event)) => event,
        other => panic!("advance {request:?}: expected a commit, got {other:?}"),
    }
}

/// Advances a new flow through all three steps in schema 1; returns the events.
pub fn commit_full_flow<P: ProducerStore + ReservationProducer + ?Sized>(
    producer: &mut P,
    flow_id: &str,
    qty: i64,
) -> Vec<Envelope> {
    (1..=3)
        .map(|s| {
            let q = (s == 1).then_some(qty);
            commit(producer, &request(flow_id, s - 1, state_of_step(s), q, 1))
        })
        .collect()
}

/// The producer's record of a flow, if it has one.
pub fn flow_record<P: ProducerStore + ReservationProducer + ?Sized>(
    producer: &mut P,
    flow_id: &str,
) -> Option<FlowRecord> {
    of_flow(producer.flows().expect("flows"), flow_id, |f| &f.flow_id).next()
}

/// The `(state, quantity, last_seq)` of a flow's record; panics if the
/// producer has none.
pub fn recorded<P: ProducerStore + ReservationProducer + ?Sized>(
    producer: &mut P,
    flow_id: &str,
) -> (FlowState, Option<i64>, i64) {
    let f = flow_record(producer, flow_id)
        .unwrap_or_else(|| panic!("the producer has no record of flow {flow_id}"));
    (f.state, f.quantity.map(Quantity::get), f.last_seq)
}

/// The envelopes of the outbox, in commit order.
pub fn outbox_envelopes<P: ProducerStore + ReservationProducer + ?Sized>(
    producer: &mut P,
) -> Vec<Envelope> {
    producer
        .outbox()
        .expect("outbox")
        .into_iter()
        .map(|r| r.envelope)
        .collect()
}

/// The outbox row of an event.
pub fn outbox_row<P: ProducerStore + ReservationProducer + ?Sized>(
    producer: &mut P,
    event: &Envelope,
) -> OutboxRecord {
    producer
        .outbox_event(&event.event_id)
        .expect("outbox_event")
        .unwrap_or_else(|| panic!("{} is not in the outbox", event.event_id))
}

/// Whether the outbox marks an event accepted.
pub fn is_accepted<P: ProducerStore + ReservationProducer + ?Sized>(
    producer: &mut P,
    event: &Envelope,
) -> bool {
    outbox_row(producer, event).accepted
}

/// The consumer's projection of a flow, if anything was applied to it.
pub fn projection<C: ReservationConsumer + ?Sized>(
    consumer: &mut C,
    flow_id: &str,
) -> Option<Projection> {
    let projections = consumer.projections().expect("projections");
    of_flow(projections, flow_id, |p| &p.flow_id).next()
}

/// The `(state, quantity, applied_seq)` of a flow's projection; an absent
/// projection is `(new, None, 0)`.
pub fn projected<C: ReservationConsumer + ?Sized>(
    consumer: &mut C,
    flow_id: &str,
) -> (FlowState, Option<i64>, i64) {
    let p = projection(consumer, flow_id).unwrap_or_else(|| Projection::empty(flow(flow_id)));
    (p.state, p.quantity.map(Quantity::get), p.applied_seq)
}

/// The effect records of a flow, in seq order.
pub fn flow_effects<C: ReservationConsumer + ?Sized>(
    consumer: &mut C,
    flow_id: &str,
) -> Vec<EffectRecord> {
    let effects = consumer.effects().expect("effects");
    of_flow(effects, flow_id, |e| &e.flow_id).collect()
}

/// The rows of the flow `flow_id`, in their order, as `id` reads a row's
/// flow.
fn of_flow<T>(rows: Vec<T>, flow_id: &str, id: impl Fn(&T) -> &FlowId) -> impl Iterator<Item = T> {
    let flow_id = flow(flow_id);
    rows.into_iter().filter(move |row| *id(row) == flow_id)
}

/// The effect records one applies for these events, in order.
pub fn effects_for<E: Borrow<Envelope>>(events: impl IntoIterator<Item = E>) -> Vec<EffectRecord> {
    events
        .into_iter()
        .map(|e| {
            let e = e.borrow();
            EffectRecord {
                producer: e.producer.clone(),
                flow_id: e.flow_id.clone(),
                seq: e.seq,
                event_id: e.event_id.clone(),
            }
        })
        .collect()
}

/// The inbox row stored under an event id.
pub fn inbox_row<C: ReservationConsumer + ?Sized>(
    consumer: &mut C,
    id: &EventId,
) -> Option<InboxRecord> {
    consumer
        .inbox()
        .expect("inbox")
        .into_iter()
        .find(|r| &r.envelope.event_id == id)
}

/// The status of the inbox row stored under an event id; panics if absent.
pub fn inbox_status<C: ReservationConsumer + ?Sized>(
    consumer: &mut C,
    id: &EventId,
) -> InboxStatus {
    inbox_row(consumer, id)
        .unwrap_or_else(|| panic!("{id} is not in the inbox"))
        .status
}

/// Everything the consumer's traits expose, for before/after comparisons.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumerState {
    /// Every inbox row.
    pub inbox: Vec<InboxRecord>,
    /// Every projection.
    pub projections: Vec<Projection>,
    /// Every effect.
    pub effects: Vec<EffectRecord>,
}

/// Reads [`ConsumerState`].
pub fn consumer_state<C: ReservationConsumer + ?Sized>(consumer: &mut C) -> ConsumerState {
    ConsumerState {
        inbox: consumer.inbox().expect("inbox"),
        projections: consumer.projections().expect("projections"),
        effects: consumer.effects().expect("effects"),
    }
}

/// Everything the producer's traits expose, for before/after comparisons.
#[derive(Debug, Clone, PartialEq)]
pub struct ProducerState {
    /// Every flow record.
    pub flows: Vec<FlowRecord>,
    /// Every outbox row, in commit order.
    pub outbox: Vec<OutboxRecord>,
}

/// Reads [`ProducerState`].
pub fn producer_state<P: ProducerStore + ReservationProducer + ?Sized>(
    producer: &mut P,
) -> ProducerState {
    ProducerState {
        flows: producer.flows().expect("flows"),
        outbox: producer.outbox().expect("outbox"),
    }
}

/// Checks what must hold of a reservation consumer at every instant, by
/// the shared checker ([`crate::check`]): the inbox ordered by flow then seq
/// with one row per `(flow, seq)` and per event id; per flow, the settled
/// rows exactly seqs `1..=k` and the projection at the last applied one, at
/// that step's state with a quantity; one effect per applied row, with its
/// event id, and no other.
pub fn check_consumer_invariants<C: ReservationConsumer + ?Sized>(consumer: &mut C) {
    let state = consumer_state(consumer);
    let snapshot = Snapshot::consumer((state.inbox, state.projections, state.effects));
    let violations = check_end_state(&snapshot, &EndState::default());
    assert!(
        violations.is_empty(),
        "consumer invariants broken: {violations:#?}"
    );
}

/// The clock the suite's relay runs read.
pub fn clock() -> ordo_core::SystemClock {
    ordo_core::SystemClock
}

/// The most deliveries an unbounded suite relay run may make: far more than
/// any suite scenario holds, so a relay that never drains (for example one
/// that never records custody) fails an assertion instead of hanging.
pub const RELAY_DELIVERIES_MAX: u64 = 1_000;

fn run_relay<P, C>(
    producer: &mut P,
    consumer: &mut C,
    options: RelayOptions,
    clock: &dyn Clock,
) -> RelayReport
where
    P: ProducerStore + ReservationProducer + ?Sized,
    C: ReservationConsumer + ?Sized,
{
    let bounded = RelayOptions {
        max: Some(options.max.unwrap_or(RELAY_DELIVERIES_MAX)),
        ..options
    };
    let report = ordo_core::relay(producer, consumer, &bounded, clock).expect("relay");
    if options.max.is_none() {
        assert_eq!(
            report.stop,
            RelayStop::Drained,
            "an unbounded relay run did not drain within {RELAY_DELIVERIES_MAX} deliveries"
        );
    }
    report
}

/// One relay run under `first-pending` (the seed's policy), bounded by `max`
/// (`None`: until drained, which must happen within
/// [`RELAY_DELIVERIES_MAX`] deliveries).
pub fn relay_first_pending<P, C>(
    producer: &mut P,
    consumer: &mut C,
    max: Option<u64>,
) -> RelayReport
where
    P: ProducerStore + ReservationProducer + ?Sized,
    C: ReservationConsumer + ?Sized,
{
    let options = RelayOptions {
        policy: RelayPolicy::FirstPending,
        max,
        ..RelayOptions::default()
    };
    run_relay(producer, consumer, options, &clock())
}

/// One relay run under the `fair` policy with rounds of `batch_len_max`,
/// bounded as [`relay_first_pending`].
pub fn relay_fair<P, C>(
    producer: &mut P,
    consumer: &mut C,
    max: Option<u64>,
    batch_len_max: usize,
) -> RelayReport
where
    P: ProducerStore + ReservationProducer + ?Sized,
    C: ReservationConsumer + ?Sized,
{
    run_relay(producer, consumer, fair(max, batch_len_max), &clock())
}

/// Delivers exactly one event by id (`relay --event`).
pub fn relay_one<P, C>(
    producer: &mut P,
    consumer: &mut C,
    event_id: &EventId,
) -> Result<RelayReport, RelayError>
where
    P: ProducerStore + ReservationProducer + ?Sized,
    C: ReservationConsumer + ?Sized,
{
    ordo_core::relay_event(producer, consumer, event_id, &clock())
}

/// [`ordo_core::drain`] with the default number of events per transaction.
pub fn drain_flow<C: ReservationConsumer + ?Sized>(
    consumer: &mut C,
    flow_id: &str,
    limit: Option<u64>,
    options: ApplyOptions,
) -> Drain {
    consumer
        .drain(
            &inbox_flow(flow_id),
            limit,
            options,
            APPLY_BATCH_LEN_DEFAULT,
        )
        .expect("drain")
}

/// The drain of `flow_id` that applied `applied` events and stopped at
/// `stop`.
pub fn drained(flow_id: &str, applied: u64, stop: DrainStop) -> Drain {
    Drain {
        flow: inbox_flow(flow_id),
        applied,
        stop,
    }
}

/// Each drain as `(flow, applied, stop)`, in order, to compare with a list.
pub fn drain_stops(drains: &[Drain]) -> Vec<(&str, u64, DrainStop)> {
    drains
        .iter()
        .map(|d| (d.flow.flow_id.as_str(), d.applied, d.stop.clone()))
        .collect()
}

/// [`ordo_core::process_all`] with the default number of events per
/// transaction.
pub fn process<C: ReservationConsumer + ?Sized>(
    consumer: &mut C,
    limit: Option<u64>,
    options: ApplyOptions,
) -> Vec<Drain> {
    consumer
        .process_all(limit, options, APPLY_BATCH_LEN_DEFAULT)
        .expect("process_all")
}

/// [`relay_fair`] at a fixed time `now_ms` (what the relay reads to decide
/// which events are due and stamps on the receipts it records).
pub fn relay_fair_at<P, C>(
    producer: &mut P,
    consumer: &mut C,
    max: Option<u64>,
    batch_len_max: usize,
    now_ms: i64,
) -> RelayReport
where
    P: ProducerStore + ReservationProducer + ?Sized,
    C: ReservationConsumer + ?Sized,
{
    run_relay(
        producer,
        consumer,
        fair(max, batch_len_max),
        &FixedClock(now_ms),
    )
}

/// The options of a `fair` relay run.
/// A `fair` relay run at `now_ms` whose rounds take up to
/// `flow_events_max` events of each flow (so that one delivery carries
/// several events of a flow).
pub fn relay_deep_at<P, C>(
    producer: &mut P,
    consumer: &mut C,
    flow_events_max: usize,
    now_ms: i64,
) -> RelayReport
where
    P: ProducerStore + ReservationProducer + ?Sized,
    C: ReservationConsumer + ?Sized,
{
    let options = RelayOptions {
        flow_events_max,
        ..fair(None, 256)
    };
    run_relay(producer, consumer, options, &FixedClock(now_ms))
}

fn fair(max: Option<u64>, batch_len_max: usize) -> RelayOptions {
    RelayOptions {
        policy: RelayPolicy::Fair,
        max,
        batch_len_max,
        ..RelayOptions::default()
    }
}

/// The delivery of an event with a receipt, as a relay report lists it.
pub fn delivery(event: &Envelope, receipt: Receipt) -> Delivery {
    Delivery {
        event_id: event.event_id.clone(),
        flow_id: event.flow_id.clone(),
        seq: event.seq,
        receipt,
    }
}

/// The deliveries of a relay report ordered by flow, to compare runs whose
/// order across flows is not specified.
pub fn deliveries_by_flow(report: &RelayReport) -> Vec<Delivery> {
    let mut deliveries = report.deliveries.clone();
    deliveries.sort_by(|x, y| x.flow_id.cmp(&y.flow_id));
    deliveries
}

/// [`ProducerStore::fair_round`] with no flow set aside.
pub fn fair_round<P: ProducerStore + ReservationProducer + ?Sized>(
    producer: &mut P,
    limit: usize,
    now_ms: i64,
) -> Vec<Envelope> {
    producer
        .fair_round(limit, &BTreeSet::new(), now_ms)
        .expect("fair_round")
}

/// [`ProducerStore::record_receipts`] for these events at `now_ms`.
pub fn record_receipts<P: ProducerStore + ReservationProducer + ?Sized>(
    producer: &mut P,
    receipts: &[(&Envelope, Receipt)],
    now_ms: i64,
) {
    let receipts: Vec<(EventId, Receipt)> = receipts
        .iter()
        .map(|(event, receipt)| (event.event_id.clone(), *receipt))
        .collect();
    producer
        .record_receipts(&receipts, now_ms)
        .expect("record_receipts");
}

/// A time in milliseconds since the Unix epoch (November 2023) from which
/// the suite counts when it controls time.
pub const T0: i64 = 1_700_000_000_000;

/// A clock that a test sets by hand. Clones share one time, so a test keeps
/// one and hands another to the stores (see [`open_at`]).
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock standing at `now_ms`.
    pub fn new(now_ms: i64) -> ManualClock {
        ManualClock(Arc::new(AtomicI64::new(now_ms)))
    }

    /// Moves the clock (forwards or backwards) to `now_ms`.
    pub fn set(&self, now_ms: i64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }

    /// The time the clock stands at.
    pub fn now(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now()
    }
}

/// Opens a backend's stores reading their time from `clock`.
pub fn open_at<B: Backend>(dir: &Path, clock: &ManualClock) -> (B::Producer, B::Consumer) {
    B::open_with_clock(dir, Arc::new(clock.clone()))
}

/// Skips with the store's clock set to `at_ms` (a skip records the time it
/// commits, read from the store's clock).
pub fn skip_at<C: ordo_core::ConsumerStore + ?Sized>(
    consumer: &mut C,
    clock: &ManualClock,
    request: &ordo_core::ops::SkipRequest,
    at_ms: i64,
) -> Result<Result<ordo_core::ops::RepairRecord, ordo_core::ops::SkipRefused>, ordo_core::StoreError>
{
    clock.set(at_ms);
    consumer.skip(request)
}

/// Every outbox row with its delivery bookkeeping, in commit order.
pub fn outbox_entries<P: ProducerStore + ReservationProducer + ?Sized>(
    producer: &mut P,
) -> Vec<OutboxEntry> {
    producer
        .outbox_entries(false, usize::MAX)
        .expect("outbox_entries")
}

/// The bookkeeping of one outbox row; panics if the event is not there.
pub fn outbox_entry<P: ProducerStore + ReservationProducer + ?Sized>(
    producer: &mut P,
    event: &Envelope,
) -> OutboxEntry {
    outbox_entries(producer)
        .into_iter()
        .find(|e| e.envelope.event_id == event.event_id)
        .unwrap_or_else(|| panic!("{} is not in the outbox", event.event_id))
}

/// Asserts that an outbox row is quarantined, not accepted, and says why:
/// a reason code and a text that is not blank.
#[track_caller]
pub fn assert_quarantined(entry: &OutboxEntry) {
    assert!(
        entry.quarantined && !entry.accepted,
        "a quarantined row, never accepted: {entry:?}"
    );
    let reason = entry.quarantine_reason.as_deref();
    assert!(
        matches!(
            reason,
            Some("conflict" | "producer_rewound" | "too_large" | "rejected_by_consumer")
        ),
        "a quarantine has a reason code: {entry:?}"
    );
    let detail = entry.quarantine_detail.as_deref();
    assert!(
        detail.is_some_and(|r| !r.trim().is_empty()),
        "a quarantine has a text: {entry:?}"
    );
}

/// Every inbox row with its times, ordered by flow then seq.
pub fn inbox_entries<C: ReservationConsumer + ?Sized>(consumer: &mut C) -> Vec<InboxEntry> {
    consumer
        .inbox_entries(false, InboxScope::All, usize::MAX)
        .expect("inbox_entries")
}

/// The envelopes of the inbox, ordered by flow then seq.
pub fn inbox_envelopes<C: ReservationConsumer + ?Sized>(consumer: &mut C) -> Vec<Envelope> {
    consumer
        .inbox()
        .expect("inbox")
        .into_iter()
        .map(|r| r.envelope)
        .collect()
}

/// Envelopes sorted by flow then seq, to compare sets of events whose order
/// is not specified.
pub fn by_flow_seq(events: impl IntoIterator<Item = Envelope>) -> Vec<Envelope> {
    let mut events: Vec<Envelope> = events.into_iter().collect();
    events.sort_by(|a, b| (&a.flow_id, a.seq).cmp(&(&b.flow_id, b.seq)));
    events
}
