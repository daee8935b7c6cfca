//! Hidden worker roles for multi-process scenarios and soaks: each is one
//! long-running `ordo` process doing what a producer, relay or applier
//! service would do. Also the wrong control `unsafe_dual_write`, which no safe
//! path calls.

#[allow(unused_imports)]
use ordo_reservation::{
    Advance, AdvanceError, AdvanceRequest, ApplyOptions, FlowState, Quantity, ReservationHandler,
    ReservationProducer,
};
use std::path::Path;
use std::time::Duration;

use ordo_core::StoreError;
use ordo_core::{
    process_all, relay, Clock, ErrorKind, FlowId, ProducerStore, RelayError, RelayOptions,
    SchemaVersion, SystemClock,
};
use serde_json::json;

use crate::args::WorkerCommand;
use crate::context::{clock, emit, open_consumer, open_producer};
use crate::Failure;

/// The pause of an idle relay or applier before it looks again.
const IDLE_PAUSE: Duration = Duration::from_millis(5);
/// Deliveries per relay round.
const RELAY_ROUND_LEN: u64 = 64;
/// Events per apply transaction.
const APPLY_BATCH_LEN: u64 = 64;

pub fn run(json_mode: bool, command: WorkerCommand) -> Result<(), Failure> {
    match command {
        WorkerCommand::Produce {
            producer,
            mut flows,
            count,
            quantity,
            spread_until_ms,
            spread_from_ms,
        } => {
            for i in 1..=count.unwrap_or(0) {
                flows
                    .push(FlowId::new(format!("flow-{i:07}")).map_err(|e| Failure::Usage(e.rule))?);
            }
            produce(
                json_mode,
                &producer,
                &flows,
                quantity,
                spread_from_ms.zip(spread_until_ms),
            )
        }
        WorkerCommand::Relay {
            producer,
            consumer,
            until,
        } => relay_until(json_mode, &producer, &consumer, &until),
        WorkerCommand::Apply { consumer, until } => apply_until(json_mode, &consumer, &until),
        WorkerCommand::UnsafeDualWrite {
            producer,
            flow,
            quantity,
        } => unsafe_dual_write(&producer, &flow, quantity),
    }
}

/// Advances every flow through all three steps, each step with the
/// `expected_seq` of that step: when another producer won the race the
/// outcome is `stale` and the step is already done.
fn produce(
    json_mode: bool,
    path: &Path,
    flows: &[FlowId],
    quantity: Quantity,
    spread: Option<(i64, i64)>,
) -> Result<(), Failure> {
    let mut producer = open_producer(path)?;
    let (mut committed, mut stale) = (0u64, 0u64);
    let steps = [
        FlowState::Reserved,
        FlowState::Confirmed,
        FlowState::Released,
    ];
    let mut advance = |flow: &FlowId, expected_seq: usize, to: FlowState| -> Result<(), Failure> {
        let request = AdvanceRequest::new(
            flow.clone(),
            expected_seq as i64,
            to,
            Some(quantity),
            SchemaVersion::V1,
        )
        .map_err(|e| Failure::Usage(e.to_string()))?;
        match producer.advance(&request) {
            Ok(Advance::Committed(_)) => committed += 1,
            Ok(Advance::Stale { .. }) => stale += 1,
            Ok(other) => return Err(Failure::Internal(format!("{flow}: unexpected {other:?}"))),
            Err(AdvanceError::Store(e)) => return Err(e.into()),
            Err(e) => return Err(Failure::Internal(e.to_string())),
        }
        Ok(())
    };
    match spread {
        // Step by step across all flows: racing producers meet on every step.
        None => {
            for (expected_seq, to) in steps.into_iter().enumerate() {
                for flow in flows {
                    advance(flow, expected_seq, to)?;
                }
            }
        }
        // Flow by flow on a schedule shared by every producer of the run, so
        // that a restarted producer takes up where the schedule is.
        Some((from_ms, until_ms)) => {
            let per_flow_ms = (until_ms - from_ms).max(0) as f64 / flows.len().max(1) as f64;
            for (i, flow) in flows.iter().enumerate() {
                let due_ms = from_ms + (per_flow_ms * i as f64) as i64;
                let wait_ms = due_ms - SystemClock.now_ms();
                if wait_ms > 0 {
                    std::thread::sleep(Duration::from_millis(wait_ms as u64));
                }
                for (expected_seq, to) in steps.into_iter().enumerate() {
                    advance(flow, expected_seq, to)?;
                }
            }
        }
    }
    emit(
        json_mode,
        &json!({"committed": committed, "stale": stale}),
        || format!("committed {committed}, stale {stale}"),
    );
    Ok(())
}

/// Counts consecutive `Busy` failures; past the limit the worker gives up
/// with the error, as a service would report it.
struct BusyRetries(u32);

impl BusyRetries {
    /// Consecutive busy failures tolerated before giving up.
    const MAX: u32 = 1_000;

    fn retry(&mut self, error: StoreError) -> Result<(), Failure> {
        self.0 += 1;
        if self.0 > Self::MAX {
            return Err(error.into());
        }
        std::thread::sleep(IDLE_PAUSE);
        Ok(())
    }
}

/// Relays until `until` exists and every event that is not quarantined has
/// been accepted (events still backing off are waited for).
fn relay_until(
    json_mode: bool,
    producer: &Path,
    consumer: &Path,
    until: &Path,
) -> Result<(), Failure> {
    let mut producer = open_producer(producer)?;
    let mut consumer = open_consumer(consumer)?;
    let clock = clock();
    let options = RelayOptions {
        max: Some(RELAY_ROUND_LEN),
        ..RelayOptions::default()
    };
    let mut busy = BusyRetries(0);
    let mut delivered = 0u64;
    loop {
        let finishing = until.exists();
        let report = match relay(&mut producer, &mut consumer, &options, clock.as_ref()) {
            Ok(report) => report,
            Err(RelayError::Store(e)) if e.kind() == ErrorKind::Busy => {
                busy.retry(e)?;
                continue;
            }
            Err(RelayError::Store(e)) => return Err(e.into()),
            Err(e) => return Err(Failure::Internal(e.to_string())),
        };
        busy.0 = 0;
        delivered += report.deliveries.len() as u64;
        if report.deliveries.is_empty() {
            if finishing {
                let status = producer.producer_status(clock.now_ms())?;
                if status.backlog == status.quarantined {
                    break;
                }
            }
            std::thread::sleep(IDLE_PAUSE);
        }
    }
    emit(json_mode, &json!({ "delivered": delivered }), || {
        format!("delivered {delivered}")
    });
    Ok(())
}

/// Applies until `until` exists and a round after that applies nothing.
fn apply_until(json_mode: bool, consumer: &Path, until: &Path) -> Result<(), Failure> {
    let mut consumer = open_consumer(consumer)?;
    let mut busy = BusyRetries(0);
    let mut applied = 0u64;
    loop {
        let finishing = until.exists();
        let drains = match process_all(
            &mut consumer,
            None,
            &mut ReservationHandler::default(),
            APPLY_BATCH_LEN,
        ) {
            Ok(drains) => drains,
            Err(e) if e.kind() == ErrorKind::Busy => {
                busy.retry(e)?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        busy.0 = 0;
        let round: u64 = drains.iter().map(|d| d.applied).sum();
        applied += round;
        if round == 0 {
            if finishing {
                break;
            }
            std::thread::sleep(IDLE_PAUSE);
        }
    }
    emit(json_mode, &json!({ "applied": applied }), || {
        format!("applied {applied}")
    });
    Ok(())
}

/// THE WRONG CONTROL. Commits the flow's new state in one transaction, then
/// exits with status 81 before the transaction that would have recorded the
/// event: the state has moved and the event is lost. It exists only to show
/// the failure that `advance` prevents.
fn unsafe_dual_write(path: &Path, flow: &FlowId, quantity: Quantity) -> Result<(), Failure> {
    let mut producer = open_producer(path)?;
    producer.write(|tx| -> Result<(), ordo_core::StoreError> {
        tx.sql()
            .execute(
                "INSERT INTO flow (flow_id, state, quantity) VALUES (?1, 'reserved', ?2)",
                ordo_sqlite::rusqlite::params![flow.as_str(), quantity.get()],
            )
            .map_err(|e| {
                ordo_core::StoreError::with_source(ErrorKind::Other, "unsafe_dual_write", e)
            })?;
        Ok(())
    })?;
    std::process::exit(super::UNSAFE_EXIT_STATUS);
}
