//! The report of `ordo bench --destinations` as the contract prints it:
//! the JSON document of `--json`, and the text otherwise.

use ordo_lab::bench_destinations::{DestinationsReport, DestinationsRun, RelayLimit, ThreadTime};
use serde_json::{json, Value};

use crate::render_lab::round3;

/// Where relay threads' time went, as `{"cpu_seconds",
/// "runqueue_seconds","blocked_seconds"}`, or `null` when unknown.
fn thread_time(time: Option<ThreadTime>) -> Value {
    time.map_or(Value::Null, |t| {
        json!({
            "cpu_seconds": round3(t.cpu_seconds),
            "runqueue_seconds": round3(t.runqueue_seconds),
            "blocked_seconds": round3(t.blocked_seconds),
        })
    })
}

fn destinations_run(report: &DestinationsReport, run: &DestinationsRun) -> Value {
    let per_destination: Vec<Value> = (run.per_destination.iter())
        .map(|d| {
            json!({
                "destination": d.name,
                "held": d.held,
                "applied": d.applied,
                "relay_seconds": round3(d.relay_seconds),
                "events_per_s": run.destination_events_per_s(d).round(),
                "relay_events_per_s": run.destination_relay_events_per_s(d).round(),
                "relay_ratio_to_1": report.destination_ratio_to_one(run, d).map(round3),
                "relay_time": thread_time(d.time),
                "transient_errors": d.transient_errors,
            })
        })
        .collect();
    let ratio = report.ratio_to_one(run);
    let ratio_to_1 = ratio.map(|r| {
        json!({
            "all_held_seconds": round3(r.all_held_seconds),
            "events_per_s": round3(r.events_per_s),
            "relay_events_per_s": round3(r.relay_events_per_s),
        })
    });
    json!({
        "destinations": run.destinations,
        "flows": run.flows,
        "events": run.events,
        "seconds": round3(run.seconds()),
        "append_seconds": round3(run.append_seconds),
        "relay_seconds": round3(run.relay_seconds),
        "all_held_seconds": round3(run.all_held_seconds()),
        "apply_seconds": round3(run.apply_seconds),
        "events_per_s": run.events_per_s().round(),
        "relay_events_per_s": run.relay_events_per_s().round(),
        "relay_events_per_s_per_destination": run.relay_events_per_s_per_destination().round(),
        "ratio_per_destination_to_1": ratio.map(|r| round3(r.per_destination)),
        "relay_time": thread_time(run.relay_time()),
        "relay_limit": run.relay_time().map(|t| t.limit().as_str()),
        "per_destination": per_destination,
        "ratio_to_1": ratio_to_1,
    })
}

/// `ordo bench --destinations`: one object per N.
pub fn destinations(report: &DestinationsReport) -> Value {
    json!({
        "flows": report.flows,
        "events": report.events(),
        "batch": report.batch,
        "cores": report.cores,
        "runs": (report.runs.iter())
            .map(|run| destinations_run(report, run))
            .collect::<Vec<_>>(),
    })
}

/// What limits the relay phase of `run`, as its relay threads' time says,
/// with the share of the machine's `cores` their CPU time filled.
fn relay_limit(run: &DestinationsRun, cores: usize) -> String {
    let n = run.destinations;
    let Some(time) = run.relay_time() else {
        return format!("N = {n}: where the relays' time went is unknown here");
    };
    let limit = match time.limit() {
        RelayLimit::Cpu => "on a core: their own work limits them",
        RelayLimit::Cores => "waiting for a core: the cores limit them",
        RelayLimit::Blocked => {
            "blocked: the producer file's one writer (every destination's custody marks \
             commit there, one at a time) and the disk's syncs limit them"
        }
    };
    let filled = time.cpu_seconds / (run.relay_seconds.max(1e-9) * cores.max(1) as f64);
    format!(
        "N = {n}: the relays spent {:.2} s on a core, {:.2} s waiting for one, {:.2} s \
         blocked ({:.0}% of the {cores} cores' time on them); most {limit}",
        time.cpu_seconds,
        time.runqueue_seconds,
        time.blocked_seconds,
        filled * 100.0
    )
}

pub fn destinations_text(report: &DestinationsReport) -> String {
    let mut lines = vec![
        format!(
            "{} flows, {} events appended per run, batch {}, {} core(s); every consumer read \
             back, each holding and having applied every event\n\
             relay ev/s: the relay phase alone (after the append), all destinations and per \
             destination (least..most); x N=1: per destination against the one destination's \
             of N = 1; cpu/queue/blocked: the relay threads' seconds on a core, waiting for \
             one, and neither",
            report.flows,
            report.events(),
            report.batch,
            report.cores
        ),
        format!(
            "{:>4} {:>8} {:>8} {:>8} {:>10} {:>15} {:>7} {:>20}",
            "N",
            "append s",
            "relay s",
            "apply s",
            "relay ev/s",
            "per dest. ev/s",
            "x N=1",
            "cpu/queue/blocked s"
        ),
    ];
    for run in &report.runs {
        let rates: Vec<f64> = (run.per_destination.iter())
            .map(|d| run.destination_relay_events_per_s(d))
            .collect();
        let (least, most) = (
            rates.iter().copied().fold(f64::INFINITY, f64::min),
            rates.iter().copied().fold(0.0, f64::max),
        );
        let ratio = report.ratio_to_one(run).map(|r| r.per_destination);
        let time = run.relay_time().map_or("-".to_owned(), |t| {
            let (cpu, queue, blocked) = (t.cpu_seconds, t.runqueue_seconds, t.blocked_seconds);
            format!("{cpu:.2}/{queue:.2}/{blocked:.2}")
        });
        lines.push(format!(
            "{:>4} {:>8.3} {:>8.3} {:>8.3} {:>10.0} {:>15} {:>7} {:>20}",
            run.destinations,
            run.append_seconds,
            run.relay_seconds,
            run.apply_seconds,
            run.relay_events_per_s(),
            format!("{least:.0}..{most:.0}"),
            ratio.map_or("-".to_owned(), |x| format!("{x:.2}")),
            time,
        ));
    }
    lines.extend((report.runs.iter()).map(|run| relay_limit(run, report.cores)));
    lines.join("\n")
}
