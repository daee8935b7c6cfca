//! The reports of the lab as the contract prints them: the JSON document of
//! `--json`, and the text otherwise.

use std::path::Path;

use ordo_lab::bench::{
    BenchReport, Calibration, GrowthRun, Phase, PipelineRun, SequentialRun, ThroughputReport,
    DRIFT_FLAGGED_PERCENT,
};
use ordo_lab::bench_http::{HttpBenchReport, RelayRun, RequestLatency, RATIO_TARGET};
use ordo_lab::bench_pg::{PgBenchReport, WorkersRun};
use ordo_lab::demo::DemoReport;
use ordo_lab::experiment::ExperimentReport;
use ordo_lab::skeleton_pg::SkeletonRun;
use ordo_lab::soak::{Role, SoakReport};
use ordo_lab::worker::WorkerReport;
use serde_json::{json, Value};
use std::time::Duration;

use crate::Failure;

fn internal<E: std::fmt::Display>(e: E) -> Failure {
    Failure::Internal(e.to_string())
}

pub(crate) fn seconds(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

pub fn demo(report: &DemoReport) -> Value {
    let problems = report.problems();
    json!({
        "flows": report.options.flows,
        "produced": report.produced,
        "delivered": report.delivered,
        "applied": report.applied,
        "blocked": report.blocked,
        "seconds": {
            "produce": seconds(report.produce_time),
            "relay": seconds(report.relay_time),
            "apply": seconds(report.apply_time),
        },
        "ok": problems.is_empty(),
        "problems": problems,
        "dir": report.options.dir.display().to_string(),
    })
}

pub fn demo_text(report: &DemoReport) -> String {
    let (produced, delivered, applied) = (report.produced, report.delivered, report.applied);
    let (produce_time, relay_time, apply_time) =
        (report.produce_time, report.relay_time, report.apply_time);
    let mut lines = vec![
        format!("flows      {}", report.options.flows),
        format!(
            "produced   {produced:>8} events in {:>7.3} s ({:.0}/s)",
            produce_time.as_secs_f64(),
            report.produced_per_s()
        ),
        format!(
            "delivered  {delivered:>8} events in {:>7.3} s ({:.0}/s)",
            relay_time.as_secs_f64(),
            report.delivered_per_s()
        ),
        format!(
            "applied    {applied:>8} events in {:>7.3} s ({:.0}/s)",
            apply_time.as_secs_f64(),
            report.applied_per_s()
        ),
        format!("blocked    {:>8} flows", report.blocked),
    ];
    let problems = report.problems();
    if problems.is_empty() {
        lines.push(format!(
            "end state OK: every flow released, exactly one effect per event ({})",
            report.options.dir.display()
        ));
    } else {
        lines.push("end state WRONG:".into());
        lines.extend(problems.iter().map(|p| format!("  {p}")));
    }
    lines.join("\n")
}

pub fn experiment(report: &ExperimentReport) -> Value {
    let mut value = json!({
        "scenarios": report.scenarios.iter().map(|r| json!({
            "name": r.name,
            "group": r.group,
            "passed": r.passed(),
            "observed": r.observed,
            "expected": r.expected,
            "differences": r.differences,
        })).collect::<Vec<_>>(),
        "passed": report.passed(),
        "failed": report.failed(),
        "groups": report.groups().iter().map(|g| {
            (g.group.to_owned(), json!({"passed": g.passed, "failed": g.failed}))
        }).collect::<serde_json::Map<_, _>>(),
    });
    // On SQLite the report is the contract's as it always was; on another
    // backend it also names the backend, its server and what did not apply.
    if report.backend != "sqlite" {
        value["backend"] = json!(report.backend);
        value["server"] = json!(report.server);
        value["not_applicable"] = report
            .not_applicable
            .iter()
            .map(|n| json!({"name": n.name, "group": n.group, "reason": n.reason}))
            .collect();
    }
    value
}

pub fn experiment_text(report: &ExperimentReport) -> String {
    let mut lines = Vec::new();
    for r in report.scenarios.iter().filter(|r| !r.passed()) {
        for d in &r.differences {
            lines.push(format!("{}: {d}", r.name));
        }
    }
    if report.backend == "sqlite" {
        lines.push(format!(
            "{} passed, {} failed",
            report.passed(),
            report.failed()
        ));
    } else {
        for n in &report.not_applicable {
            lines.push(format!("{}: not applicable: {}", n.name, n.reason));
        }
        lines.push(format!(
            "{} passed, {} failed, {} not applicable ({} on {})",
            report.passed(),
            report.failed(),
            report.not_applicable.len(),
            report.backend,
            report.server.as_deref().unwrap_or("")
        ));
    }
    lines.join("\n")
}

/// Counts by role, as JSON.
fn by_role(counts: &std::collections::BTreeMap<Role, u64>) -> Value {
    counts
        .iter()
        .map(|(r, n)| (r.as_str().to_owned(), json!(n)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Counts by role, as text.
fn by_role_text(counts: &std::collections::BTreeMap<Role, u64>) -> String {
    counts
        .iter()
        .map(|(role, n)| format!("{} {n}", role.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn soak(report: &SoakReport) -> Value {
    let violations = report.violations();
    let mut value = json!({
        "seconds": report.seconds,
        "flows": report.flows,
        "seed": report.seed,
        "transport": report.transport.name,
        "server_moves": report.server_moves,
        "kills": report.kills(),
        "kills_by_role": by_role(&report.kills_by_role),
        "events": report.events,
        "faults_armed": report.faults_armed,
        "fault_exits": report.fault_exits,
        "acknowledged": report.acknowledged,
        "violations": violations,
        "verdict": if violations.is_empty() { "ok" } else { "violated" },
    });
    // On SQLite the report keeps its shape; on PostgreSQL it also names the
    // backend, its server, the workers, the connections ended, and the
    // database when kept.
    if let Some(pg) = &report.postgres {
        let extra = json!({
            "backend": report.backend(),
            "server": pg.server,
            "relays": report.relays,
            "appliers": report.appliers,
            "terminations": pg.terminations(),
            "terminations_by_role": by_role(&pg.terminations_by_role),
            "leases_left": pg.leases_left,
            "converge_seconds": seconds(report.converge),
            "database": pg.kept,
        });
        if let (Some(value), Some(extra)) = (value.as_object_mut(), extra.as_object()) {
            value.extend(extra.clone());
        }
    }
    if let Some(topology) = &report.topology {
        crate::render_topology::extend(&mut value, report, topology);
    }
    value
}

pub fn soak_text(report: &SoakReport) -> String {
    let mut lines = vec![
        format!("seed     {}", report.seed),
        format!("transport {}", report.transport.name),
        format!(
            "kills    {} (SIGKILL) over {} s: {}",
            report.kills(),
            report.seconds,
            by_role_text(&report.kills_by_role)
        ),
        format!("events   {}", report.events),
        format!(
            "faults   {} workers armed, {} stopped by a fault and started again",
            report.faults_armed, report.fault_exits
        ),
    ];
    if report.server_moves > 0 {
        lines.push(format!(
            "server   took a new port {} time(s): its port was not free again in time",
            report.server_moves
        ));
    }
    if let Some(pg) = &report.postgres {
        lines.insert(
            1,
            format!(
                "backend  postgres on {}: {} relays, {} appliers",
                pg.server, report.relays, report.appliers
            ),
        );
        lines.push(format!(
            "ended    {} connections (pg_terminate_backend): {}",
            pg.terminations(),
            by_role_text(&pg.terminations_by_role)
        ));
        lines.push(format!(
            "converge {:.3} s; {} acknowledged events checked; {} leases left by relays that could not release them",
            report.converge.as_secs_f64(),
            report.acknowledged,
            pg.leases_left
        ));
        if let Some(database) = &pg.kept {
            lines.push(format!("database {database} (kept)"));
        }
    }
    if let Some(topology) = &report.topology {
        crate::render_topology::lines(&mut lines, report, topology);
    }
    let violations = report.violations();
    if violations.is_empty() {
        lines.push("verdict  ok: nothing lost, each event once, one effect per (producer, flow, seq), in order, every flow released".into());
    } else {
        lines.push("verdict  VIOLATED".into());
        lines.extend(violations.iter().map(|v| format!("  {v}")));
    }
    lines.join("\n")
}

/// A worker's final line.
pub fn worker(report: WorkerReport) -> (Value, String) {
    match report {
        WorkerReport::Produced { committed, stale } => (
            json!({"committed": committed, "stale": stale}),
            format!("committed {committed}, stale {stale}"),
        ),
        WorkerReport::Relayed { delivered } => (
            json!({ "delivered": delivered }),
            format!("delivered {delivered}"),
        ),
        WorkerReport::Applied { applied } => {
            (json!({ "applied": applied }), format!("applied {applied}"))
        }
    }
}

fn workers_run(report: &PgBenchReport, run: &WorkersRun) -> Value {
    json!({
        "workers": run.workers,
        "events": run.events,
        "seconds": round3(run.seconds),
        "events_per_s": run.events_per_s().round(),
        "f_pg": run.f_pg().round(),
        "f_pg_before_after": [run.f_before_after.0.round(), run.f_before_after.1.round()],
        "ratio_to_f": round3(run.ratio_to_f()),
        "ratio_to_s": round3(report.ratio_to_s(run)),
        "produce_per_s": run.produce_per_s().round(),
        "relay_per_s": run.relay_per_s().round(),
        "deliveries": run.deliveries,
        "commits_per_event": round3(run.commits_per_event()),
        "wal_bytes_per_event": run.wal_bytes_per_event().round(),
    })
}

/// `ordo bench --backend postgres`: F_pg and one object per worker count.
pub fn bench_pg(report: &PgBenchReport) -> Value {
    let f = report.f_pg_spread();
    json!({
        "backend": "postgres",
        "server": report.server,
        "f_pg": f.median.round(),
        "f_pg_range": [f.min.round(), f.max.round()],
        "s_pg": report.s_pg().round(),
        "s_pg_runs": report.skeletons.iter().map(skeleton_run).collect::<Vec<_>>(),
        "flows": report.flows,
        "batch": report.batch,
        "producers": report.producers,
        "workers": report
            .runs
            .iter()
            .map(|run| workers_run(report, run))
            .collect::<Vec<_>>(),
    })
}

fn skeleton_run(run: &SkeletonRun) -> Value {
    json!({
        "clients": run.clients,
        "events": run.events,
        "seconds": round3(run.seconds),
        "events_per_s": run.events_per_s().round(),
        "wal_bytes_per_event": run.wal_bytes_per_event().round(),
    })
}

pub fn bench_pg_text(report: &PgBenchReport) -> String {
    let f = report.f_pg_spread();
    let s = report.s_pg_spread();
    let mut lines = vec![
        format!(
            "F_pg = {:.0} commits/s, {:.0} to {:.0} ({}: single-row commits, synchronous_commit on, \
             before the first run and after each; each run's ratio is to the F_pg around it)",
            f.median, f.min, f.max, report.server
        ),
        format!(
            "S_pg = {:.0} events/s, {:.0} to {:.0}, {:.0} WAL B/ev ({} clients on a database of \
             their own, each event's protocol rows and nothing else: no leases, fences, checks \
             or handler; before the first run and after the last; each run's ratio is to S_pg)",
            report.s_pg(),
            s.min,
            s.max,
            report.s_pg_wal_bytes_per_event(),
            report.skeletons.first().map_or(0, |s| s.clients),
        ),
        format!(
            "{} flows ({} events) per run, batch {}, {} producer threads",
            report.flows,
            report.events_per_run(),
            report.batch,
            report.producers
        ),
        format!(
            "{:>7} {:>8} {:>8} {:>10} {:>7} {:>7} {:>7} {:>10} {:>10} {:>10} {:>9}",
            "workers",
            "events",
            "seconds",
            "events/s",
            "F_pg",
            "x F_pg",
            "x S_pg",
            "produce/s",
            "relay/s",
            "ev/commit",
            "WAL B/ev"
        ),
    ];
    lines.extend(report.runs.iter().map(|run| {
        format!(
            "{:>7} {:>8} {:>8.2} {:>10.0} {:>7.0} {:>7.2} {:>7.2} {:>10.0} {:>10.0} {:>10.2} {:>9.0}",
            run.workers,
            run.events,
            run.seconds,
            run.events_per_s(),
            run.f_pg(),
            run.ratio_to_f(),
            report.ratio_to_s(run),
            run.produce_per_s(),
            run.relay_per_s(),
            run.events_per_commit(),
            run.wal_bytes_per_event(),
        )
    }));
    lines.join("\n")
}

pub fn bench(report: &BenchReport) -> Value {
    match report {
        BenchReport::Growth {
            without_pruning,
            with_pruning,
        } => json!({
            "growth": {
                "without_pruning": growth(without_pruning),
                "with_pruning": growth(with_pruning),
            }
        }),
        BenchReport::Throughput(report) => throughput(report),
        BenchReport::Http(report) => http_bench(report),
    }
}

/// The text of a bench report from its JSON document (`value`, as
/// [`bench()`] renders it).
pub fn bench_text(report: &BenchReport, value: &Value) -> String {
    match report {
        BenchReport::Growth { .. } => growth_text(&value["growth"]),
        BenchReport::Throughput(report) => throughput_text(report, value),
        BenchReport::Http(_) => http_bench_text(value),
    }
}

fn request_latency(l: &RequestLatency) -> Value {
    json!({"p50": round3(l.p50_ms), "p99": round3(l.p99_ms), "max": round3(l.max_ms), "samples": l.samples})
}

fn relay_run(run: &RelayRun) -> Value {
    json!({
        "events": run.events,
        "seconds": round3(run.seconds),
        "events_per_s": run.events_per_s().round(),
        "requests": run.latency.samples,
        "request_latency_ms": request_latency(&run.latency),
    })
}

fn http_bench(report: &HttpBenchReport) -> Value {
    let load = &report.load;
    json!({
        "transport": "http",
        "flows": report.flows,
        "events": report.events(),
        "batch": report.batch,
        "relay": {
            "in_process": relay_run(&report.in_process),
            "http": relay_run(&report.http),
            "ratio": round3(report.ratio()),
            "ratio_target": RATIO_TARGET,
        },
        "load": {
            "clients": load.clients,
            "seconds": round3(load.seconds),
            "batch": load.batch,
            "requests": load.requests,
            "failed_requests": load.failed_requests,
            "first_failure": load.first_failure,
            "accepted": load.accepted,
            "stored": load.stored,
            "requests_per_s": load.requests_per_s().round(),
            "events_per_s": load.events_per_s().round(),
            "request_latency_ms": request_latency(&load.latency),
            "server_peak_memory_bytes": load.server_peak_memory_bytes,
        },
        "wake": {
            "backend": report.wake.backend,
            "events": report.wake.events,
            "lag_ms": request_latency(&report.wake.lag),
            "idle_cpu_ms_per_s": round3(report.wake.idle_cpu_ms_per_s),
        },
        "problems": report.problems(),
    })
}

fn http_bench_text(v: &Value) -> String {
    let relay = &v["relay"];
    let run = |name: &str, r: &Value| {
        format!(
            "{name:<17} {} events in {} s: {} events/s, {} requests, latency per request p50 {} ms p99 {} ms",
            r["events"], r["seconds"], r["events_per_s"], r["requests"],
            r["request_latency_ms"]["p50"], r["request_latency_ms"]["p99"]
        )
    };
    let load = &v["load"];
    let memory = load["server_peak_memory_bytes"]
        .as_u64()
        .map_or("unknown".to_owned(), mib);
    let mut lines = vec![
        format!("flows {}, events {}, batch {}", v["flows"], v["events"], v["batch"]),
        run("relay in process", &relay["in_process"]),
        run("relay over HTTP", &relay["http"]),
        format!(
            "HTTP / in process: {} (target {})",
            relay["ratio"], relay["ratio_target"]
        ),
        format!(
            "{} clients for {} s: {} requests of {} events ({} requests/s, {} events/s), {} not answered 200, {} accepted, {} stored; latency p50 {} ms p99 {} ms max {} ms",
            load["clients"], load["seconds"], load["requests"], load["batch"], load["requests_per_s"],
            load["events_per_s"], load["failed_requests"], load["accepted"], load["stored"],
            load["request_latency_ms"]["p50"], load["request_latency_ms"]["p99"], load["request_latency_ms"]["max"]
        ),
        format!("server peak memory (VmHWM) {memory}"),
        format!(
            "serve to an applier process on {}: {} events, receive-to-apply lag p50 {} ms p99 {} ms max {} ms; idle applier {} ms CPU per s",
            v["wake"]["backend"].as_str().unwrap_or_default(), v["wake"]["events"], v["wake"]["lag_ms"]["p50"], v["wake"]["lag_ms"]["p99"],
            v["wake"]["lag_ms"]["max"], v["wake"]["idle_cpu_ms_per_s"]
        ),
    ];
    for problem in v["problems"].as_array().into_iter().flatten() {
        lines.push(format!("PROBLEM {}", problem.as_str().unwrap_or_default()));
    }
    lines.join("\n")
}

fn growth(g: &GrowthRun) -> Value {
    json!({
        "events": g.events,
        "producer_bytes": g.producer_bytes,
        "consumer_bytes": g.consumer_bytes,
        "producer_bytes_per_event": round3(g.producer_bytes_per_event()),
        "consumer_bytes_per_event": round3(g.consumer_bytes_per_event()),
        "bytes_after_each_round": g.bytes_after_each_round.iter().map(|(p, c)| json!([p, c])).collect::<Vec<_>>(),
    })
}

fn sequential(report: &ThroughputReport, run: &SequentialRun) -> Value {
    let (events, c) = (run.events, &run.calibration);
    let mut value = json!({
        "ratio_to_s": round3(report.ratio_to_s(run.end_to_end().events_per_s(events))),
        "batch": run.batch,
        "produce": phase_json(events, &run.produce, c),
        "relay": phase_json(events, &run.relay, c),
        "apply": phase_json(events, &run.apply, c),
        "end_to_end": phase_json(events, &run.end_to_end(), c),
    });
    calibrated(&mut value, c);
    value
}

fn pipeline(report: &ThroughputReport, run: &PipelineRun) -> Value {
    let mut value = phase_json(run.events, &run.phase, &run.calibration);
    value["batch"] = json!(run.batch);
    let to_s = report.ratio_to_s(run.phase.events_per_s(run.events));
    value["ratio_to_s"] = json!(round3(to_s));
    let l = &run.latency;
    value["latency_ms"] =
        json!({"p50": l.p50_ms, "p99": l.p99_ms, "max": l.max_ms, "samples": l.samples});
    if let Some(rate) = run.offered_per_s {
        value["offered_per_s"] = json!(rate);
    }
    calibrated(&mut value, &run.calibration);
    value
}

/// A run's F (the geometric mean of the calibrations before and after
/// it) and both calibrations.
fn calibrated(value: &mut Value, calibration: &Calibration) {
    value["f_commits_per_s"] = json!(calibration.f().round());
    value["f_before_after"] = json!([calibration.before.round(), calibration.after.round()]);
}

fn throughput(report: &ThroughputReport) -> Value {
    // The run's F in one number: the median of all calibrations.
    let f = report.f_spread();
    let runs: Vec<Value> = report.runs.iter().map(|r| sequential(report, r)).collect();
    let unbatched = report.unbatched.as_ref().map_or(Value::Null, |run| {
        let mut value = sequential(report, run);
        value["flows"] = json!(run.flows);
        value
    });
    json!({
        "f_commits_per_s": f.median.round(),
        "f_range": [f.min.round(), f.max.round()],
        "flows": report.flows,
        "events": report.events(),
        "s_sqlite": report.s_sqlite().round(),
        "s_sqlite_runs": report.skeletons.iter().map(sqlite_skeleton_run).collect::<Vec<_>>(),
        "runs": runs,
        "unbatched": unbatched,
        "concurrent": pipeline(report, &report.concurrent),
        "pipelined": pipeline(report, &report.pipelined),
        "offered": pipeline(report, &report.offered),
        "peak_memory_bytes": report.peak_memory_bytes,
    })
}

fn sqlite_skeleton_run(run: &ordo_lab::skeleton_sqlite::SkeletonRun) -> Value {
    let rows = run
        .written
        .by_table()
        .map(|(t, n)| (t.to_owned(), json!(n)));
    json!({
        "batch": run.batch,
        "events": run.events,
        "seconds": round3(run.seconds),
        "events_per_s": run.events_per_s().round(),
        "commits_per_event": round3(run.commits_per_event()),
        "fsyncs_per_event": round3(run.fsyncs_per_event()),
        "rows_written": serde_json::Map::from_iter(rows),
    })
}

/// Draws the sweep's runs (`runs`, as rendered) into an SVG file.
pub fn draw(path: &Path, runs: &Value, report: &ThroughputReport) -> Result<(), Failure> {
    let f = report.f_spread();
    let runs = runs.as_array().map(Vec::as_slice).unwrap_or_default();
    draw_runs(path, runs, f.min, f.max)
}

/// A phase's figures, its ratio to the F around its run included.
fn phase_json(events: u64, phase: &Phase, calibration: &Calibration) -> Value {
    let rate = phase.events_per_s(events);
    json!({
        "events": events,
        "seconds": round3(phase.seconds),
        "events_per_s": rate.round(),
        "commits_per_event": round3(phase.commits_per_event(events)),
        "fsyncs_per_event": round3(phase.fsyncs_per_event(events)),
        "ratio_to_f": round3(calibration.ratio_to_f(rate)),
    })
}

/// Bytes as MiB with one decimal.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn growth_text(g: &Value) -> String {
    let line = |name: &str, v: &Value| {
        format!(
            "{name:<16} {} events: producer.db {} bytes ({} per event), consumer.db {} bytes ({} per event)",
            v["events"], v["producer_bytes"], v["producer_bytes_per_event"], v["consumer_bytes"], v["consumer_bytes_per_event"]
        )
    };
    [
        line("without pruning", &g["without_pruning"]),
        line("with pruning", &g["with_pruning"]),
    ]
    .join("\n")
}

/// The column heads of the sequential runs, and the format of their rows.
const SEQUENTIAL_HEADS: [&str; 8] = [
    "batch",
    "F/s",
    "produce/s (x F)",
    "relay/s (x F)",
    "apply/s (x F)",
    "end-to-end/s (x F)",
    "commits/event",
    "fsyncs/event",
];

fn sequential_row(cells: [String; 8]) -> String {
    let [batch, f, produce, relay, apply, end_to_end, commits, fsyncs] = cells;
    format!(
        "{batch:>6} {f:>8} {produce:>20} {relay:>20} {apply:>20} {end_to_end:>20} {commits:>14} {fsyncs:>13}"
    )
}

/// A run's F, starred when it moved too much around the run.
fn f_cell(r: &Value, drifted: bool) -> String {
    let flag = if drifted { "*" } else { "" };
    format!("{}{flag}", r["f_commits_per_s"])
}

/// A sequential run's row; serde_json's Display ignores width, so every
/// cell is a String first.
fn sequential_text(r: &Value, drifted: bool) -> String {
    let rate = |p: &Value| {
        format!(
            "{} ({:.2})",
            p["events_per_s"],
            p["ratio_to_f"].as_f64().unwrap_or(0.0)
        )
    };
    sequential_row([
        r["batch"].to_string(),
        f_cell(r, drifted),
        rate(&r["produce"]),
        rate(&r["relay"]),
        rate(&r["apply"]),
        rate(&r["end_to_end"]),
        r["end_to_end"]["commits_per_event"].to_string(),
        r["end_to_end"]["fsyncs_per_event"].to_string(),
    ])
}

/// The lines of the three pipelines.
fn pipelines_text(report: &ThroughputReport, v: &Value) -> [String; 3] {
    let (c, p, o) = (&v["concurrent"], &v["pipelined"], &v["offered"]);
    [
        format!(
            "concurrent (3 threads, B={}, F {}/s): {} events/s = {} x F, {} commits/event, {} fsyncs/event, latency p50 {} ms p99 {} ms",
            c["batch"], f_cell(c, report.concurrent.calibration.drifted()), c["events_per_s"], c["ratio_to_f"], c["commits_per_event"], c["fsyncs_per_event"], c["latency_ms"]["p50"], c["latency_ms"]["p99"]
        ),
        format!(
            "pipelined (2 threads: producer file, consumer file; B={}, F {}/s): {} events/s = {} x F = {} x S_sqlite, {} fsyncs/event, latency p50 {} ms p99 {} ms",
            p["batch"], f_cell(p, report.pipelined.calibration.drifted()), p["events_per_s"], p["ratio_to_f"], p["ratio_to_s"], p["fsyncs_per_event"], p["latency_ms"]["p50"], p["latency_ms"]["p99"]
        ),
        format!(
            "offered {} events/s: achieved {} events/s, commit-to-applied p50 {} ms, p99 {} ms, max {} ms",
            o["offered_per_s"], o["events_per_s"], o["latency_ms"]["p50"], o["latency_ms"]["p99"], o["latency_ms"]["max"]
        ),
    ]
}

/// The text of a throughput report from its JSON document (`v`).
fn throughput_text(report: &ThroughputReport, v: &Value) -> String {
    let s = report.s_sqlite_spread();
    let mut lines = vec![
        format!(
            "F (fsync-bound single-row commits on this disk), measured between the runs: {} to {} /s",
            v["f_range"][0], v["f_range"][1]
        ),
        format!(
            "S_sqlite (each event's protocol rows by hand, pipelined on two files, nothing else; before the first run and after the last): {} events/s, {:.0} to {:.0}",
            v["s_sqlite"], s.min, s.max
        ),
        format!("flows {}, events {}", v["flows"], v["events"]),
        sequential_row(SEQUENTIAL_HEADS.map(str::to_owned)),
    ];
    let unbatched = report.unbatched.iter().zip([&v["unbatched"]]);
    let runs = report
        .runs
        .iter()
        .zip(v["runs"].as_array().into_iter().flatten());
    for (run, r) in unbatched.chain(runs) {
        lines.push(sequential_text(r, run.calibration.drifted()));
    }
    lines.extend(pipelines_text(report, v));
    if report.drifted() {
        lines.push(format!(
            "* F moved by more than {DRIFT_FLAGGED_PERCENT:.0} % between the calibrations before and after this run: its ratios are unreliable, run again"
        ));
    }
    if let Some(bytes) = report.peak_memory_bytes {
        lines.push(format!("peak memory {}", mib(bytes)));
    }
    lines.join("\n")
}

/// Throughput of each phase against batch size, on log-2 axes.
fn draw_runs(path: &Path, runs: &[Value], f_min: f64, f_max: f64) -> Result<(), Failure> {
    use plotters::prelude::*;
    let series = ["produce", "relay", "apply", "end_to_end"];
    let points = |phase: &str| -> Vec<(f64, f64)> {
        runs.iter()
            .map(|r| {
                (
                    (r["batch"].as_f64().unwrap_or(1.0)).log2(),
                    r[phase]["ratio_to_f"].as_f64().unwrap_or(0.0),
                )
            })
            .collect()
    };
    let y_max = series
        .iter()
        .flat_map(|s| points(s))
        .map(|(_, y)| y)
        .fold(1.0, f64::max)
        * 1.1;
    let x_max = points("produce")
        .iter()
        .map(|(x, _)| *x)
        .fold(1.0, f64::max);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(internal)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("ordo throughput / F (F measured around each run: {f_min:.0} to {f_max:.0} commits/s)"),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(internal)?;
    chart
        .configure_mesh()
        .x_desc("batch size (log2)")
        .y_desc("events/s as a multiple of F")
        .draw()
        .map_err(internal)?;
    let colors = [RED, BLUE, GREEN, BLACK];
    for (name, color) in series.iter().zip(colors) {
        chart
            .draw_series(LineSeries::new(points(name), color.stroke_width(2)))
            .map_err(internal)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(internal)?;
    root.present().map_err(internal)?;
    Ok(())
}
