//! The report of `ordo bench --destinations` as the contract prints it:
//! the JSON document of `--json`, and the text otherwise.

use ordo_lab::bench_destinations::{DestinationsReport, DestinationsRun};
use serde_json::{json, Value};

use crate::render_lab::round3;

fn destinations_run(report: &DestinationsReport, run: &DestinationsRun) -> Value {
    let per_destination: Vec<Value> = (run.per_destination.iter())
        .map(|d| {
            json!({
                "destination": d.name,
                "held": d.held,
                "applied": d.applied,
                "relay_seconds": round3(d.relay_seconds),
                "events_per_s": run.destination_events_per_s(d).round(),
                "transient_errors": d.transient_errors,
            })
        })
        .collect();
    let ratio = report.ratio_to_one(run).map(|r| {
        json!({
            "all_held_seconds": round3(r.all_held_seconds),
            "events_per_s": round3(r.events_per_s),
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
        "per_destination": per_destination,
        "ratio_to_1": ratio,
    })
}

/// `ordo bench --destinations`: one object per N.
pub fn destinations(report: &DestinationsReport) -> Value {
    json!({
        "flows": report.flows,
        "events": report.events(),
        "batch": report.batch,
        "runs": (report.runs.iter())
            .map(|run| destinations_run(report, run))
            .collect::<Vec<_>>(),
    })
}

pub fn destinations_text(report: &DestinationsReport) -> String {
    let mut lines = vec![
        format!(
            "{} flows, {} events appended per run, batch {}; every consumer read back, \
             each holding and having applied every event\n\
             held s: from the start of the append until every destination holds everything",
            report.flows,
            report.events(),
            report.batch
        ),
        format!(
            "{:>4} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7} {:>15} {:>10}",
            "N",
            "append s",
            "relay s",
            "held s",
            "apply s",
            "all ev/s",
            "x N=1 s",
            "per dest. ev/s",
            "x N=1 ev/s"
        ),
    ];
    for run in &report.runs {
        let ratio = report.ratio_to_one(run);
        let rates: Vec<f64> = (run.per_destination.iter())
            .map(|d| run.destination_events_per_s(d))
            .collect();
        let (least, most) = (
            rates.iter().copied().fold(f64::INFINITY, f64::min),
            rates.iter().copied().fold(0.0, f64::max),
        );
        let shown = |x: Option<f64>| x.map_or("-".to_owned(), |x| format!("{x:.2}"));
        lines.push(format!(
            "{:>4} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>9.0} {:>7} {:>15} {:>10}",
            run.destinations,
            run.append_seconds,
            run.relay_seconds,
            run.all_held_seconds(),
            run.apply_seconds,
            run.events_per_s(),
            shown(ratio.map(|r| r.all_held_seconds)),
            format!("{least:.0}..{most:.0}"),
            shown(ratio.map(|r| r.events_per_s)),
        ));
    }
    lines.join("\n")
}
