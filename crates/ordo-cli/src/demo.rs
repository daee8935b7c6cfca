//! `ordo demo`: N flows through all three steps on two fresh SQLite files,
//! relayed and applied, with a check of the end state.

#[allow(unused_imports)]
use ordo_reservation::{
    Advance, AdvanceRequest, ApplyOptions, FlowState, Quantity, ReservationHandler,
    ReservationProducer,
};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use ordo_core::{
    process_all, relay, ConsumerStore, DrainStop, FlowId, InboxStatus, RelayOptions, SchemaVersion,
    SystemClock,
};
use ordo_sqlite::{ConsumerDb, ProducerDb};
use serde_json::json;

use crate::args::DemoArgs;
use crate::context::emit;
use crate::Failure;

const FILES: [&str; 2] = ["producer.db", "consumer.db"];
/// Deliveries per relay round, so the progress bar moves.
const RELAY_ROUND_LEN: u64 = 256;

fn progress(len: u64, label: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>8} [{bar:40}] {pos}/{len} {per_sec}")
            .expect("the template is valid")
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_owned());
    bar
}

/// Makes room for fresh files in `dir`: refuses existing ones unless `force`.
fn prepare_dir(dir: &Path, force: bool) -> Result<(), Failure> {
    if dir.exists() && !dir.is_dir() {
        return Err(Failure::Usage(format!(
            "--dir {} is not a directory",
            dir.display()
        )));
    }
    for name in FILES {
        let path = dir.join(name);
        if path.exists() && !force {
            return Err(Failure::Usage(format!(
                "{} already exists; pass --force to replace it",
                path.display()
            )));
        }
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Failure::Internal(format!("cannot create {}: {e}", dir.display())))?;
    for name in FILES {
        for suffix in ["", "-wal", "-shm"] {
            let path = dir.join(format!("{name}{suffix}"));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Failure::Internal(format!(
                        "cannot remove {}: {e}",
                        path.display()
                    )))
                }
            }
        }
    }
    Ok(())
}

fn seconds(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

pub fn run(json_mode: bool, args: DemoArgs) -> Result<(), Failure> {
    prepare_dir(&args.dir, args.force)?;
    let mut producer = ordo_reservation::open_producer(args.dir.join(FILES[0]))?;
    let mut consumer = ordo_reservation::open_consumer(args.dir.join(FILES[1]))?;
    let flows: Vec<FlowId> = (1..=args.flows)
        .map(|i| FlowId::new(format!("flow-{i:07}")).expect("demo flow ids are identifiers"))
        .collect();
    let steps = [
        FlowState::Reserved,
        FlowState::Confirmed,
        FlowState::Released,
    ];
    let events = args.flows * steps.len() as u64;

    let started = Instant::now();
    let bar = progress(events, "produce");
    let mut produced = 0u64;
    for (i, flow_id) in flows.iter().enumerate() {
        let quantity = Quantity::new((i as i64 % 1_000) + 1).expect("1..=1000 is a quantity");
        for (expected_seq, to) in steps.iter().enumerate() {
            let request = AdvanceRequest::new(
                flow_id.clone(),
                expected_seq as i64,
                *to,
                Some(quantity),
                SchemaVersion::V1,
            )
            .map_err(|e| Failure::Internal(e.to_string()))?;
            match producer
                .advance(&request)
                .map_err(|e| Failure::Internal(e.to_string()))?
            {
                Advance::Committed(_) => produced += 1,
                other => {
                    return Err(Failure::Internal(format!(
                        "demo advance of {flow_id} was {other:?}"
                    )))
                }
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let produce_time = started.elapsed();

    let started = Instant::now();
    let bar = progress(events, "relay");
    let mut delivered = 0u64;
    loop {
        let report = relay(
            &mut producer,
            &mut consumer,
            &RelayOptions {
                max: Some(RELAY_ROUND_LEN),
                ..RelayOptions::default()
            },
            &SystemClock,
        )
        .map_err(|e| Failure::Internal(e.to_string()))?;
        let accepted = report
            .deliveries
            .iter()
            .filter(|d| d.receipt.moves_custody())
            .count() as u64;
        delivered += accepted;
        bar.inc(accepted);
        if report.deliveries.len() as u64 != accepted {
            return Err(Failure::Internal("demo relay met a conflict".into()));
        }
        if report.deliveries.is_empty() {
            break;
        }
    }
    bar.finish_and_clear();
    let relay_time = started.elapsed();

    let started = Instant::now();
    let bar = progress(args.flows, "apply");
    let mut applied = 0u64;
    let mut blocked = 0u64;
    for chunk in consumer.flows_with_work(&[])?.chunks(64) {
        for flow_id in chunk {
            let drain = ordo_core::drain(
                &mut consumer,
                flow_id,
                None,
                &mut ReservationHandler::default(),
                ordo_core::APPLY_BATCH_LEN_DEFAULT,
            )?;
            applied += drain.applied;
            if matches!(drain.stop, DrainStop::Blocked(_)) {
                blocked += 1;
            }
        }
        bar.inc(chunk.len() as u64);
    }
    // Nothing may remain: a second pass must find no work.
    let leftover = process_all(
        &mut consumer,
        None,
        &mut ReservationHandler::default(),
        ordo_core::APPLY_BATCH_LEN_DEFAULT,
    )?;
    bar.finish_and_clear();
    let apply_time = started.elapsed();

    let problems = check_end_state(&mut producer, &mut consumer, &flows, leftover.len())?;
    let value = json!({
        "flows": args.flows,
        "produced": produced,
        "delivered": delivered,
        "applied": applied,
        "blocked": blocked,
        "seconds": {
            "produce": seconds(produce_time),
            "relay": seconds(relay_time),
            "apply": seconds(apply_time),
        },
        "ok": problems.is_empty(),
        "problems": problems,
        "dir": args.dir.display().to_string(),
    });
    emit(json_mode, &value, || {
        let rate = |n: u64, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
        let mut lines = vec![
            format!("flows      {}", args.flows),
            format!(
                "produced   {produced:>8} events in {:>7.3} s ({:.0}/s)",
                produce_time.as_secs_f64(),
                rate(produced, produce_time)
            ),
            format!(
                "delivered  {delivered:>8} events in {:>7.3} s ({:.0}/s)",
                relay_time.as_secs_f64(),
                rate(delivered, relay_time)
            ),
            format!(
                "applied    {applied:>8} events in {:>7.3} s ({:.0}/s)",
                apply_time.as_secs_f64(),
                rate(applied, apply_time)
            ),
            format!("blocked    {blocked:>8} flows"),
        ];
        if problems.is_empty() {
            lines.push(format!(
                "end state OK: every flow released, exactly one effect per event ({})",
                args.dir.display()
            ));
        } else {
            lines.push("end state WRONG:".into());
            lines.extend(problems.iter().map(|p| format!("  {p}")));
        }
        lines.join("\n")
    });
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Failure::Check(format!(
            "demo end state check failed: {}",
            problems.join("; ")
        )))
    }
}

/// Every flow released on both sides, every event accepted and applied,
/// exactly one effect per (flow, seq), and nothing left to apply.
fn check_end_state(
    producer: &mut ProducerDb,
    consumer: &mut ConsumerDb,
    flows: &[FlowId],
    leftover_flows: usize,
) -> Result<Vec<String>, Failure> {
    let mut problems = Vec::new();
    let (producer_flows, outbox) = ordo_reservation::producer_snapshot(producer)?;
    let (inbox, projections, effects) = ordo_reservation::consumer_snapshot(consumer)?;
    let expected_events = flows.len() * 3;
    let not_released = producer_flows
        .iter()
        .filter(|f| f.state != FlowState::Released)
        .count();
    if producer_flows.len() != flows.len() || not_released > 0 {
        problems.push(format!(
            "producer: {} flows, {not_released} not released (expected {} released)",
            producer_flows.len(),
            flows.len()
        ));
    }
    let unaccepted = outbox.iter().filter(|r| !r.accepted).count();
    if outbox.len() != expected_events || unaccepted > 0 {
        problems.push(format!(
            "outbox: {} events, {unaccepted} not accepted (expected {expected_events} accepted)",
            outbox.len()
        ));
    }
    let not_applied = inbox
        .iter()
        .filter(|r| r.status != InboxStatus::Applied)
        .count();
    if inbox.len() != expected_events || not_applied > 0 {
        problems.push(format!(
            "inbox: {} events, {not_applied} not applied (expected {expected_events} applied)",
            inbox.len()
        ));
    }
    let released = projections
        .iter()
        .filter(|p| p.state == FlowState::Released && p.applied_seq == 3)
        .count();
    if projections.len() != flows.len() || released != flows.len() {
        problems.push(format!(
            "projection: {} flows, {released} released at seq 3 (expected {})",
            projections.len(),
            flows.len()
        ));
    }
    let distinct: BTreeSet<(String, i64)> = effects
        .iter()
        .map(|e| (e.flow_id.to_string(), e.seq.get()))
        .collect();
    if effects.len() != expected_events || distinct.len() != expected_events {
        problems.push(format!(
            "effects: {} records for {} distinct (flow, seq) (expected exactly one per event, {expected_events})",
            effects.len(),
            distinct.len()
        ));
    }
    if leftover_flows > 0 {
        problems.push(format!("{leftover_flows} flows still had work after apply"));
    }
    Ok(problems)
}
