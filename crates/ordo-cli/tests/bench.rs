//! `ordo bench` as a process: its JSON shape, its commit accounting, and its
//! refusals; over HTTP, its request and event counts. Speeds are never
//! asserted; only what each run must count.

mod common;

use common::bench;
use serde_json::Value;

#[track_caller]
fn phase(run: &Value, name: &str, events: u64) -> (f64, f64) {
    let p = &run[name];
    assert_eq!(p["events"], events, "{name}: {run:#}");
    assert!(p["events_per_s"].as_f64().unwrap() > 0.0, "{name}: {run:#}");
    assert!(p["ratio_to_f"].as_f64().unwrap() > 0.0, "{name}: {run:#}");
    (
        p["commits_per_event"].as_f64().unwrap(),
        p["fsyncs_per_event"].as_f64().unwrap(),
    )
}

#[test]
fn bench_counts_every_event_and_every_commit() {
    let v = bench(&["--flows", "40", "--batch", "8", "--rate", "2000"]).json();
    assert_eq!(v["flows"], 40);
    assert_eq!(v["events"], 120);
    let f_range = v["f_range"].as_array().unwrap();
    assert!(f_range[0].as_f64().unwrap() > 0.0);
    assert!(f_range[0].as_f64().unwrap() <= f_range[1].as_f64().unwrap());

    // Unbatched: one synced commit per advance, per receive and per apply;
    // the relay's mark is the fourth commit, unsynced.
    let unbatched = &v["unbatched"];
    assert_eq!(unbatched["batch"], 1);
    assert!(unbatched["f_commits_per_s"].as_f64().unwrap() > 0.0);
    // Every run carries the calibrations before and after it, and its F is
    // their geometric mean.
    for run in [
        unbatched,
        &v["runs"][0],
        &v["concurrent"],
        &v["pipelined"],
        &v["offered"],
    ] {
        let pair = run["f_before_after"].as_array().unwrap();
        let (before, after) = (pair[0].as_f64().unwrap(), pair[1].as_f64().unwrap());
        assert!(before > 0.0 && after > 0.0, "{run:#}");
        let f = run["f_commits_per_s"].as_f64().unwrap();
        assert!((f - (before * after).sqrt()).abs() <= 1.0, "{run:#}");
    }
    assert_eq!(phase(unbatched, "produce", 120), (1.0, 1.0));
    assert_eq!(phase(unbatched, "relay", 120), (2.0, 1.0));
    assert_eq!(phase(unbatched, "apply", 120), (1.0, 1.0));
    assert_eq!(phase(unbatched, "end_to_end", 120), (4.0, 3.0));

    // B = K = 8: 15 produce transactions (5 per step), 15 relay rounds of
    // two commits (one synced), and applies of at most 8 events each.
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    let batched = &runs[0];
    assert_eq!(batched["batch"], 8);
    assert_eq!(phase(batched, "produce", 120), (0.125, 0.125));
    assert_eq!(phase(batched, "relay", 120), (0.25, 0.125));
    let (apply_commits, apply_fsyncs) = phase(batched, "apply", 120);
    assert!(
        apply_commits >= 0.125 && apply_commits == apply_fsyncs,
        "{batched:#}"
    );

    let concurrent = &v["concurrent"];
    assert_eq!(concurrent["events"], 120);
    assert!(
        concurrent["fsyncs_per_event"].as_f64().unwrap()
            <= concurrent["commits_per_event"].as_f64().unwrap()
    );
    let latency = &concurrent["latency_ms"];
    assert!(latency["p50"].as_f64().unwrap() <= latency["p99"].as_f64().unwrap());
    // Producer-file and consumer-file work on two threads: every event
    // applied, each relay round one synced receive and one unsynced mark.
    let pipelined = &v["pipelined"];
    assert_eq!(pipelined["events"], 120);
    assert_eq!(pipelined["batch"], 8);
    assert!(
        pipelined["fsyncs_per_event"].as_f64().unwrap()
            < pipelined["commits_per_event"].as_f64().unwrap(),
        "{pipelined:#}"
    );
    assert_eq!(v["offered"]["offered_per_s"], 2000);
    assert_eq!(v["offered"]["events"], 120);

    // S_sqlite, before the first run and after the last: every event's
    // rows written once, four commits per round of 8 flows (the accepted
    // mark unsynced); every run's rate as a ratio to it.
    assert!(v["s_sqlite"].as_f64().unwrap() > 0.0, "{v:#}");
    let skeletons = v["s_sqlite_runs"].as_array().unwrap();
    assert_eq!(skeletons.len(), 2);
    for s in skeletons {
        assert_eq!(
            (s["events"].as_u64(), s["batch"].as_u64()),
            (Some(120), Some(8))
        );
        assert!(s["events_per_s"].as_f64().unwrap() > 0.0, "{s:#}");
        assert_eq!(s["commits_per_event"], 0.5, "{s:#}");
        assert_eq!(s["fsyncs_per_event"], 0.375, "{s:#}");
        let rows = &s["rows_written"];
        for (table, per_event) in [
            ("app_state", 1),
            ("head", 2),
            ("outbox", 2),
            ("outbox_pending", 2),
            ("inbox", 2),
            ("apply_cursor", 1),
            ("projection", 1),
        ] {
            assert_eq!(rows[table], 120 * per_event, "{table}: {s:#}");
        }
    }
    for run in [unbatched, batched, concurrent, pipelined, &v["offered"]] {
        assert!(run["ratio_to_s"].as_f64().unwrap() > 0.0, "{run:#}");
    }
}

#[test]
fn bench_refuses_bad_input_before_measuring() {
    bench(&["--flows", "0"]).usage("--flows");
    bench(&["--batch", "0"]).usage("--batch");
    bench(&["--plot", "out.svg"]).usage("--plot needs --sweep");
    bench(&["--sweep", "--plot", "out.png"]).usage(".svg");
    bench(&["--transport", "http", "--sweep"]).usage("--transport http");
    bench(&["--transport", "http", "--growth"]).usage("--transport http");
    bench(&["--transport", "http", "--clients", "0"]).usage("--clients");
}

#[track_caller]
fn request_latency(value: &Value, requests: u64) {
    let l = &value["request_latency_ms"];
    assert_eq!(l["samples"], requests, "{value:#}");
    let (p50, p99, max) = (
        l["p50"].as_f64().unwrap(),
        l["p99"].as_f64().unwrap(),
        l["max"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{value:#}");
}

#[test]
fn bench_over_http_counts_every_request_and_every_event() {
    let v = bench(&[
        "--transport",
        "http",
        "--flows",
        "20",
        "--batch",
        "8",
        "--clients",
        "4",
        "--load-seconds",
        "1",
    ])
    .json();
    assert_eq!(v["transport"], "http");
    assert_eq!(
        (v["flows"].as_u64(), v["events"].as_u64()),
        (Some(20), Some(60))
    );
    assert_eq!(v["batch"], 8);
    let relay = &v["relay"];
    for name in ["in_process", "http"] {
        let run = &relay[name];
        assert_eq!(run["events"], 60, "{name}: {run:#}");
        assert!(run["events_per_s"].as_f64().unwrap() > 0.0, "{run:#}");
        // At most 8 events a round: at least 60 / 8 rounds.
        let requests = run["requests"].as_u64().unwrap();
        assert!(requests >= 8, "{name}: {run:#}");
        request_latency(run, requests);
    }
    assert!(relay["ratio"].as_f64().unwrap() > 0.0);
    assert_eq!(relay["ratio_target"], 0.7);

    let load = &v["load"];
    assert_eq!(load["clients"], 4);
    assert_eq!(load["batch"], 8);
    let requests = load["requests"].as_u64().unwrap();
    // Each client posts at least once before its window closes.
    assert!(requests >= 4, "{load:#}");
    assert_eq!(load["failed_requests"], 0, "{load:#}");
    assert_eq!(load["first_failure"], Value::Null);
    assert_eq!(load["accepted"], requests * 8, "{load:#}");
    assert_eq!(load["stored"], load["accepted"], "{load:#}");
    request_latency(load, requests);
    assert!(load["server_peak_memory_bytes"].as_u64().unwrap() > 0);
    // Every event posted to `ordo serve` is applied by the applier process
    // and has its lag.
    let wake = &v["wake"];
    assert_eq!(wake["backend"], "sqlite", "{wake:#}");
    assert_eq!(wake["events"], 200, "{wake:#}");
    assert_eq!(wake["lag_ms"]["samples"], 200, "{wake:#}");
    let (p50, p99, max) = (
        wake["lag_ms"]["p50"].as_f64().unwrap(),
        wake["lag_ms"]["p99"].as_f64().unwrap(),
        wake["lag_ms"]["max"].as_f64().unwrap(),
    );
    assert!(0.0 <= p50 && p50 <= p99 && p99 <= max, "{wake:#}");
    assert!(
        wake["idle_cpu_ms_per_s"].as_f64().unwrap() >= 0.0,
        "{wake:#}"
    );
    assert_eq!(v["problems"], serde_json::json!([]));
    bench(&["--producers", "0"]).usage("--producers");
    bench(&["--producers", "1025"]).usage("--producers");
    bench(&["--producers", "4", "--growth"]).usage("--growth");
    bench(&["--flow-ids", "random"]).usage("--producers");
    bench(&["--producers", "4", "--flow-ids", "uuid"]).usage("--flow-ids");
}

#[test]
fn bench_producers_reports_each_count_with_latency_and_fairness() {
    // A count given twice is measured twice, each run on its own file.
    let args = ["--producers", "1,4,1", "--producers-seconds", "1"];
    let v = bench(&[&args[..], &["--flow-ids", "random"]].concat()).json();
    assert_eq!(v["flow_ids"], "random", "{v:#}");
    assert!(v["f_commits_per_s"].as_f64().unwrap() > 0.0, "{v:#}");
    assert_eq!(v["direct"]["producers"], 1, "{v:#}");
    // The batched baseline commits whole batches of 256 events.
    let batched = &v["batched"];
    assert_eq!(batched["producers"], 1, "{v:#}");
    let batched_events = batched["events"].as_u64().unwrap();
    assert!(batched_events > 0, "{v:#}");
    assert_eq!(batched["events_per_commit"], 256.0, "{v:#}");
    let rate = |run: &serde_json::Value| run["events_per_s"].as_f64().unwrap();
    let runs = v["producers"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{v:#}");
    for (run, n) in runs.iter().zip([1u64, 4, 1]) {
        assert_eq!(run["producers"], n, "{run:#}");
        let events = run["events"].as_u64().unwrap();
        assert!(
            events > 0 && run["events_per_s"].as_f64().unwrap() > 0.0,
            "{run:#}"
        );
        assert!(run["ratio_to_f"].as_f64().unwrap() > 0.0, "{run:#}");
        let l = &run["latency_ms"];
        let (p50, p99, p999) = (
            l["p50"].as_f64().unwrap(),
            l["p99"].as_f64().unwrap(),
            l["p999"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p99 && p99 <= p999, "{run:#}");
        let p = &run["per_producer"];
        let (min, max) = (p["min"].as_u64().unwrap(), p["max"].as_u64().unwrap());
        assert!(0 < min && min <= max, "{run:#}");
        assert_eq!(
            p["mean"].as_f64().unwrap() * n as f64,
            events as f64,
            "{run:#}"
        );
        assert!(run["commits"].as_u64().unwrap() <= events, "{run:#}");
        // The ratios are to the baselines of the same run (as rounded).
        for (key, base) in [
            ("ratio_to_direct", &v["direct"]),
            ("ratio_to_batched", batched),
        ] {
            let ratio = run[key].as_f64().unwrap();
            let expected = rate(run) / rate(base);
            assert!(
                (ratio - expected).abs() <= 0.002 + expected * 0.01,
                "{key}: {run:#}"
            );
        }
    }
}
