//! The three stages of the batched pipeline, one after the other, on fresh
//! files, without the `ordo bench` harness around them: a small program to
//! put under a profiler.
//!
//! ```text
//! cargo build --release -p ordo-reservation --example stages
//! target/release/examples/stages 10000 256
//! valgrind --tool=callgrind target/release/examples/stages 3000 256
//! callgrind_annotate --inclusive=yes callgrind.out.<pid>
//! ```
//!
//! Arguments: flows (each three events), the batch size B = K, and the
//! events of a flow per relay round (`relay --flow-events`, default 1).

#[allow(unused_imports)]
use ordo_reservation::{
    consumer_schema, producer_schema, AdvanceRequest, ApplyOptions, FlowState, Quantity,
    ReservationHandler, ReservationProducer,
};
use std::time::Instant;

use ordo_core::{process_all_each, relay, FlowId, RelayOptions, SchemaVersion, SystemClock};
use ordo_sqlite::{ConsumerDb, ProducerDb};

const STEPS: [FlowState; 3] = [
    FlowState::Reserved,
    FlowState::Confirmed,
    FlowState::Released,
];

fn argument(position: usize, name: &str, default: u64) -> u64 {
    match std::env::args().nth(position) {
        None => default,
        Some(text) => match text.parse::<u64>() {
            Ok(n) if n >= 1 => n,
            _ => {
                eprintln!("error: {name} must be a positive integer, got {text:?}");
                std::process::exit(2);
            }
        },
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let flows = argument(1, "flows", 10_000);
    let batch = argument(2, "batch", 256);
    let flow_events = argument(3, "flow events", 1);
    let dir = tempfile::tempdir()?;
    let mut producer = ProducerDb::open(dir.path().join("producer.db"), &producer_schema())?;
    let mut consumer = ConsumerDb::open(dir.path().join("consumer.db"), &consumer_schema())?;
    let events = flows * STEPS.len() as u64;
    let per_event = |started: Instant| started.elapsed().as_secs_f64() * 1e6 / events as f64;

    let started = Instant::now();
    for (step, state) in STEPS.iter().enumerate() {
        let mut first = 0;
        while first < flows {
            let last = (first + batch).min(flows);
            let mut requests = Vec::new();
            for i in first..last {
                requests.push(AdvanceRequest::new(
                    FlowId::new(format!("flow-{i:08}"))?,
                    step as i64,
                    *state,
                    Some(Quantity::new((i % 1000) as i64 + 1)?),
                    SchemaVersion::V1,
                )?);
            }
            for outcome in producer.advance_batch(&requests)? {
                outcome?;
            }
            first = last;
        }
    }
    println!("produce {:.1} us/event", per_event(started));

    let started = Instant::now();
    let options = RelayOptions {
        batch_len_max: usize::try_from(batch)?,
        flow_events_max: usize::try_from(flow_events)?,
        ..RelayOptions::default()
    };
    let report = relay(&mut producer, &mut consumer, &options, &SystemClock)?;
    println!("relay   {:.1} us/event", per_event(started));

    let started = Instant::now();
    let mut applied = 0;
    process_all_each(
        &mut consumer,
        None,
        &mut ReservationHandler::default(),
        batch,
        |drain| applied += drain.applied,
    )?;
    println!("apply   {:.1} us/event", per_event(started));

    if report.deliveries.len() as u64 != events || applied != events {
        return Err(format!(
            "moved {} and applied {applied} of {events} events",
            report.deliveries.len()
        )
        .into());
    }
    Ok(())
}
