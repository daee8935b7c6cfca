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
//! Arguments: flows (each three events), the batch size B = K, the events
//! of a flow per relay round (`relay --flow-events`, default 1), and the
//! shape: 1 (the default) runs each stage over every event before the
//! next; 2 relays and applies after each batch produced, so that an apply
//! batch holds one event of each flow, as in `ordo bench`'s pipelined run.

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

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

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

fn main() -> Result<()> {
    let flows = argument(1, "flows", 10_000);
    let batch = argument(2, "batch", 256);
    let flow_events = argument(3, "flow events", 1);
    let interleaved = match argument(4, "shape", 1) {
        1 => false,
        2 => true,
        other => {
            eprintln!("error: shape must be 1 (stage by stage) or 2 (interleaved), got {other}");
            std::process::exit(2);
        }
    };
    let dir = tempfile::tempdir()?;
    let mut pair = Pair {
        producer: ProducerDb::open(dir.path().join("producer.db"), &producer_schema())?,
        consumer: ConsumerDb::open(dir.path().join("consumer.db"), &consumer_schema())?,
        options: RelayOptions {
            batch_len_max: usize::try_from(batch)?,
            flow_events_max: usize::try_from(flow_events)?,
            ..RelayOptions::default()
        },
        batch,
        moved: 0,
        applied: 0,
    };
    let events = flows * STEPS.len() as u64;
    if interleaved {
        let started = Instant::now();
        for_each_batch(flows, batch, |requests| {
            pair.produce(requests)?;
            pair.relay()?;
            pair.apply()
        })?;
        println!("all     {:.1} us/event", per_event(started, events));
    } else {
        let started = Instant::now();
        for_each_batch(flows, batch, |requests| pair.produce(requests))?;
        println!("produce {:.1} us/event", per_event(started, events));
        let started = Instant::now();
        pair.relay()?;
        println!("relay   {:.1} us/event", per_event(started, events));
        let started = Instant::now();
        pair.apply()?;
        println!("apply   {:.1} us/event", per_event(started, events));
    }
    if pair.moved != events || pair.applied != events {
        let (moved, applied) = (pair.moved, pair.applied);
        return Err(format!("moved {moved} and applied {applied} of {events} events").into());
    }
    Ok(())
}

fn per_event(started: Instant, events: u64) -> f64 {
    started.elapsed().as_secs_f64() * 1e6 / events as f64
}

/// The advance requests of every flow's three steps, a batch at a time,
/// step by step, handed to `each`.
fn for_each_batch(
    flows: u64,
    batch: u64,
    mut each: impl FnMut(&[AdvanceRequest]) -> Result<()>,
) -> Result<()> {
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
            each(&requests)?;
            first = last;
        }
    }
    Ok(())
}

/// The two files and what went through them.
struct Pair {
    producer: ProducerDb,
    consumer: ConsumerDb,
    options: RelayOptions,
    batch: u64,
    moved: u64,
    applied: u64,
}

impl Pair {
    fn produce(&mut self, requests: &[AdvanceRequest]) -> Result<()> {
        for outcome in self.producer.advance_batch(requests)? {
            outcome?;
        }
        Ok(())
    }

    fn relay(&mut self) -> Result<()> {
        let report = relay(
            &mut self.producer,
            &mut self.consumer,
            &self.options,
            &SystemClock,
        )?;
        self.moved += report.deliveries.len() as u64;
        Ok(())
    }

    fn apply(&mut self) -> Result<()> {
        let mut applied = 0;
        process_all_each(
            &mut self.consumer,
            None,
            &mut ReservationHandler::default(),
            self.batch,
            |drain| applied += drain.applied,
        )?;
        self.applied += applied;
        Ok(())
    }
}
