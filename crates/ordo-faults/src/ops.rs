//! The one module that calls ordo's store API: the operations under test,
//! the state they start from, and how a directory's state is read. When the
//! API changes, this file is what changes.
//!
//! Every operation works on `producer.db` and `consumer.db` in one
//! directory, opens the stores itself and closes them before it returns, as
//! a process would. Times are fixed ([`T0_MS`]), so two runs of an operation
//! from the same files write the same rows.

#[allow(unused_imports)]
use ordo_reservation::{
    Advance, AdvanceError, FlowState, ReservationConsumer, ReservationProducer,
};
use std::path::Path;
use std::sync::Arc;

use ordo_core::ops::{ConsumerStatus, RepairRecord, SkipRequest};
use ordo_core::{
    ConsumerOps, Envelope, FixedClock, InboxFlow, ProducerOps, Receive, RelayError, RelayOptions,
    RelayPolicy, RelayStop, StoreError,
};
use ordo_sqlite::{ConsumerDb, OpenOptions, ProducerDb};
use ordo_testkit::support::{
    check_consumer_invariants, flow, request, reservation_events, seq, ConsumerState,
    ProducerState, V1,
};

/// The time every store and operation reads, in milliseconds since the epoch.
pub const T0_MS: i64 = 1_700_000_000_000;

/// The database files of a directory, producer first.
pub const FILES: [&str; 2] = ["producer.db", "consumer.db"];

/// How many flows the operations work on (`f00`, `f01`, …); each has three
/// events, so that the batched operations write several pages per commit.
const FLOWS_LEN: usize = 24;

/// The quantity of every flow.
const QUANTITY: i64 = 7;

/// The deliveries of the relay round: the head of every flow but the first.
const RELAY_ROUND_LEN: u64 = FLOWS_LEN as u64 - 1;

/// The most events an apply batch may apply: more than the flows hold.
const APPLY_EVENTS_MAX: u64 = 3 * FLOWS_LEN as u64;

/// An ordo operation run under faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// The producer advances flow `f01` from `reserved` to `confirmed`.
    ProducerAdvance,
    /// One relay round (fair policy): hands the head event (seq 1) of every
    /// flow but `f00`, whose events were delivered before, to the consumer
    /// in one transaction and records the receipts in one producer
    /// transaction. The run is bounded to those deliveries, so it is exactly
    /// one round.
    RelayRound,
    /// The consumer receives the events of every flow but `f00` and one
    /// duplicate of `f00` in one batch.
    ReceiveBatch,
    /// The consumer applies the pending events of every flow but `f00` in
    /// one batch.
    ApplyBatch,
    /// An operator skips `f01`'s first event in the inbox.
    InboxSkip,
    /// The consumer prunes the applied events of the first half of the
    /// flows.
    InboxPrune,
}

impl Operation {
    /// Every operation.
    pub const ALL: [Operation; 6] = [
        Operation::ProducerAdvance,
        Operation::RelayRound,
        Operation::ReceiveBatch,
        Operation::ApplyBatch,
        Operation::InboxSkip,
        Operation::InboxPrune,
    ];

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Operation::ProducerAdvance => "producer advance",
            Operation::RelayRound => "relay round",
            Operation::ReceiveBatch => "receive batch",
            Operation::ApplyBatch => "apply batch",
            Operation::InboxSkip => "inbox skip",
            Operation::InboxPrune => "inbox prune",
        }
    }

    /// Creates the files in the empty `dir` and brings them to the state
    /// the operation starts from.
    pub fn setup(self, dir: &Path) -> Result<(), StoreError> {
        let (mut producer, mut consumer) = open(dir)?;
        let flows = flow_ids();
        match self {
            Operation::ProducerAdvance => {
                for id in &flows {
                    advance(&mut producer, id, 0, FlowState::Reserved)?;
                }
            }
            Operation::RelayRound => {
                advance_all(&mut producer)?;
                relay(&mut producer, &mut consumer, RelayPolicy::FirstPending, 3)?;
            }
            Operation::ReceiveBatch => {
                consumer.receive_batch(&reservation_events(&flows[0], QUANTITY))?;
            }
            Operation::ApplyBatch | Operation::InboxSkip => {
                receive_all(&mut consumer)?;
                apply(&mut consumer, &flows[..1])?;
            }
            Operation::InboxPrune => {
                receive_all(&mut consumer)?;
                apply(&mut consumer, &flows[..FLOWS_LEN / 2])?;
            }
        }
        Ok(())
    }

    /// Runs the operation once on the files of `dir`.
    pub fn run(self, dir: &Path) -> Result<(), StoreError> {
        let (mut producer, mut consumer) = open(dir)?;
        let flows = flow_ids();
        match self {
            Operation::ProducerAdvance => {
                advance(&mut producer, &flows[1], 1, FlowState::Confirmed)
            }
            Operation::RelayRound => relay(
                &mut producer,
                &mut consumer,
                RelayPolicy::Fair,
                RELAY_ROUND_LEN,
            ),
            Operation::ReceiveBatch => {
                let mut events = vec![reservation_events(&flows[0], QUANTITY)[0].clone()];
                for id in &flows[1..] {
                    events.extend(reservation_events(id, QUANTITY));
                }
                consumer.receive_batch(&events).map(drop)
            }
            Operation::ApplyBatch => apply(&mut consumer, &flows[1..]),
            Operation::InboxSkip => skip(&mut consumer, &flows[1]),
            Operation::InboxPrune => consumer.prune_inbox(T0_MS + 1).map(drop),
        }
    }

    /// Which file's change the operation promises durable when it returns
    /// `Ok`: `(producer, consumer)`. A relay round promises the consumer's
    /// receive (custody); its accepted marks on the producer are a hint,
    /// committed without a sync.
    pub fn durable_on_ok(self) -> (bool, bool) {
        match self {
            Operation::ProducerAdvance => (true, false),
            _ => (false, true),
        }
    }

    /// Whether the consumer keeps every inbox row it applied, so that the
    /// testkit's consumer invariants hold before and after (pruning removes
    /// applied rows by design).
    pub fn keeps_applied_rows(self) -> bool {
        self != Operation::InboxPrune
    }
}

/// What the store API shows of a directory's two files.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The producer file.
    pub producer: ProducerState,
    /// The consumer file.
    pub consumer: ConsumerSide,
}

/// What the store API shows of the consumer file.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumerSide {
    /// Inbox, projections, effects.
    pub state: ConsumerState,
    /// The repair log.
    pub repairs: Vec<RepairRecord>,
    /// The alerting signals (counts of pending, blocked, applied, skipped
    /// and pruned events among them).
    pub status: ConsumerStatus,
}

/// Reads the state of `dir`'s files through the store API.
pub fn state(dir: &Path) -> Result<Snapshot, StoreError> {
    let (mut producer, mut consumer) = open(dir)?;
    Ok(Snapshot {
        producer: ProducerState {
            flows: producer.flows()?,
            outbox: producer.outbox()?,
        },
        consumer: ConsumerSide {
            state: ConsumerState {
                inbox: consumer.inbox()?,
                projections: consumer.projections()?,
                effects: consumer.effects()?,
            },
            repairs: consumer.repairs()?,
            status: consumer.consumer_status()?,
        },
    })
}

/// Checks the testkit's consumer invariants on `dir`'s consumer file
/// (panics on a violation).
pub fn check_invariants(dir: &Path) -> Result<(), StoreError> {
    let (_, mut consumer) = open(dir)?;
    check_consumer_invariants(&mut consumer);
    Ok(())
}

fn open(dir: &Path) -> Result<(ProducerDb, ConsumerDb), StoreError> {
    let clock = Arc::new(FixedClock(T0_MS));
    let options = OpenOptions::default();
    let producer = ProducerDb::open_with(
        dir.join(FILES[0]),
        &ordo_reservation::producer_schema(),
        clock.clone(),
        &options,
    )?;
    let consumer = ConsumerDb::open_with(
        dir.join(FILES[1]),
        &ordo_reservation::consumer_schema(),
        clock,
        &options,
    )?;
    Ok((producer, consumer))
}

/// Advances `flow_id` from `expected_seq` to `to`; anything but a commit is
/// a broken setup.
fn advance(
    producer: &mut ProducerDb,
    flow_id: &str,
    expected_seq: i64,
    to: FlowState,
) -> Result<(), StoreError> {
    let quantity = (expected_seq == 0).then_some(QUANTITY);
    match producer.advance(&request(flow_id, expected_seq, to, quantity, 1)) {
        Ok(Advance::Committed(_)) => Ok(()),
        Ok(other) => panic!("advance {flow_id} from {expected_seq}: {other:?}"),
        Err(AdvanceError::Store(e)) => Err(e),
        Err(e) => panic!("advance {flow_id} from {expected_seq}: {e}"),
    }
}

/// The flow ids, in order.
fn flow_ids() -> Vec<String> {
    (0..FLOWS_LEN).map(|i| format!("f{i:02}")).collect()
}

fn advance_all(producer: &mut ProducerDb) -> Result<(), StoreError> {
    for id in &flow_ids() {
        for (expected_seq, to) in [
            (0, FlowState::Reserved),
            (1, FlowState::Confirmed),
            (2, FlowState::Released),
        ] {
            advance(producer, id, expected_seq, to)?;
        }
    }
    Ok(())
}

/// One relay run under `policy` of at most `max` deliveries, every event in
/// one round.
fn relay(
    producer: &mut ProducerDb,
    consumer: &mut ConsumerDb,
    policy: RelayPolicy,
    max: u64,
) -> Result<(), StoreError> {
    let options = RelayOptions {
        policy,
        max: Some(max),
        batch_len_max: usize::try_from(max).expect("a small max"),
        ..RelayOptions::default()
    };
    match ordo_core::relay(producer, consumer, &options, &FixedClock(T0_MS)) {
        Ok(report) => {
            assert!(
                report.stop == RelayStop::Drained || report.stop == RelayStop::Max,
                "relay stopped with {:?}",
                report.stop
            );
            Ok(())
        }
        Err(RelayError::Store(e)) => Err(e),
        Err(e) => panic!("relay: {e}"),
    }
}

fn receive_all(consumer: &mut ConsumerDb) -> Result<(), StoreError> {
    let events: Vec<Envelope> = flow_ids()
        .iter()
        .flat_map(|id| reservation_events(id, QUANTITY))
        .collect();
    consumer.receive_batch(&events).map(drop)
}

fn apply(consumer: &mut ConsumerDb, flows: &[String]) -> Result<(), StoreError> {
    let flows: Vec<(InboxFlow, Option<u64>)> = flows
        .iter()
        .map(|id| (InboxFlow::of_default(flow(id)), None))
        .collect();
    consumer.apply_batch(&flows, APPLY_EVENTS_MAX, V1).map(drop)
}

fn skip(consumer: &mut ConsumerDb, flow_id: &str) -> Result<(), StoreError> {
    let request = SkipRequest::new(
        InboxFlow::of_default(flow(flow_id)),
        seq(1),
        "a fault test skips it".to_owned(),
        "ordo-faults".to_owned(),
    )
    .expect("a valid skip request");
    match consumer.skip(&request)? {
        Ok(_) => Ok(()),
        Err(refused) => panic!("skip: {refused}"),
    }
}
