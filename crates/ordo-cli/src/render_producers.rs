//! What `ordo bench --producers` prints: the direct and batched baselines
//! and one run per producer count, as JSON and as text.

use ordo_lab::bench_producers::{ProducersReport, ProducersRun};
use serde_json::{json, Value};

use crate::render_lab::round3;

fn producers_run(run: &ProducersRun) -> Value {
    let l = &run.latency;
    let p = &run.per_producer;
    json!({
        "producers": run.producers,
        "events": run.events,
        "commits": run.commits,
        "seconds": round3(run.seconds),
        "events_per_s": run.events_per_s().round(),
        "events_per_commit": round3(run.events_per_commit()),
        "f_commits_per_s": run.f().round(),
        "f_before_after": [run.f_before_after.0.round(), run.f_before_after.1.round()],
        "ratio_to_f": round3(run.ratio_to_f()),
        "latency_ms": {"p50": l.p50_ms, "p99": l.p99_ms, "p999": l.p999_ms, "max": l.max_ms},
        "per_producer": {"min": p.min, "max": p.max, "mean": round3(p.mean)},
    })
}

/// `ordo bench --producers`: the direct baseline and one object per N.
pub fn producers(report: &ProducersReport) -> Value {
    let f = report.f_spread();
    json!({
        "flow_ids": report.flow_ids.name(),
        "f_commits_per_s": f.median.round(),
        "f_range": [f.min.round(), f.max.round()],
        "direct": producers_run(&report.direct),
        "batched": producers_run(&report.batched),
        "producers": report.runs.iter().map(|run| {
            let mut value = producers_run(run);
            value["ratio_to_direct"] = json!(round3(report.ratio_to_direct(run)));
            value["ratio_to_batched"] = json!(round3(report.ratio_to_batched(run)));
            value
        }).collect::<Vec<_>>(),
    })
}

pub fn producers_text(report: &ProducersReport) -> String {
    let f = report.f_spread();
    let mut lines = vec![
        format!(
            "F = {:.0} commits/s (range {:.0}..{:.0}), {} flow ids",
            f.median,
            f.min,
            f.max,
            report.flow_ids.name()
        ),
        format!(
            "{:>9} {:>10} {:>7} {:>8} {:>8} {:>8} {:>9} {:>22}",
            "producers",
            "events/s",
            "x F",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "ev/commit",
            "per producer min..max"
        ),
    ];
    let row = |name: String, run: &ProducersRun| {
        let l = &run.latency;
        let p = &run.per_producer;
        format!(
            "{name:>9} {:>10.0} {:>7.2} {:>8.3} {:>8.3} {:>8.3} {:>9.1} {:>22}",
            run.events_per_s(),
            run.ratio_to_f(),
            l.p50_ms,
            l.p99_ms,
            l.p999_ms,
            run.events_per_commit(),
            format!("{}..{} (mean {:.0})", p.min, p.max, p.mean),
        )
    };
    lines.push(row("direct".into(), &report.direct));
    lines.push(row("batched".into(), &report.batched));
    lines.extend(
        report
            .runs
            .iter()
            .map(|run| row(run.producers.to_string(), run)),
    );
    lines.push(format!(
        "{:>9} {:>10} {:>10}",
        "producers", "x direct", "x batched"
    ));
    lines.extend(report.runs.iter().map(|run| {
        format!(
            "{:>9} {:>10.3} {:>10.3}",
            run.producers,
            report.ratio_to_direct(run),
            report.ratio_to_batched(run)
        )
    }));
    lines.join("\n")
}
