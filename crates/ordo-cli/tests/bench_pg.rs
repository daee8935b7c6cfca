//! `ordo bench --backend postgres` as a process, on the server of
//! `ORDO_TEST_PG`: a tiny run counts every event it produced, relayed and
//! applied for each worker count, with positive rates and ratios to F_pg,
//! and leaves no database behind; flags that do not go together and URLs
//! that do not parse are refused (exit 2, nothing created); an unreachable
//! server is exit 1, named without its password. Speeds are never asserted.

mod common;
mod pgdb;

use common::run;
use ordo_lab::skeleton_pg;
use pgdb::{serial, Watched};
use serde_json::Value;

fn number(value: &Value, key: &str) -> f64 {
    value[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number: {value:#}"))
}

/// The two numbers of `value[key]`.
fn pair(value: &Value, key: &str) -> (f64, f64) {
    let number = |i: usize| {
        value[key][i]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} is not a pair of numbers: {value:#}"))
    };
    (number(0), number(1))
}

#[test]
fn a_tiny_run_counts_every_event_per_worker_count_and_leaves_no_database() {
    let mut databases = Watched::start("ordo_bench_");
    let server = pgdb::server();
    let args = [
        "--json",
        "bench",
        "--backend",
        "postgres",
        "--url",
        server.as_str(),
        "--workers",
        "1,2",
        "--flows",
        "20",
        "--batch",
        "8",
    ];
    let v = run(&args).json();
    assert_eq!(v["backend"], "postgres", "{v:#}");
    assert!(
        v["server"].as_str().unwrap().starts_with("postgres://"),
        "{v:#}"
    );
    assert_eq!(v["flows"], 20, "{v:#}");
    assert_eq!(v["batch"], 8, "{v:#}");
    assert!(v["producers"].as_u64().unwrap() >= 1, "{v:#}");
    let f_pg = number(&v, "f_pg");
    let range = pair(&v, "f_pg_range");
    assert!(
        0.0 < range.0 && range.0 <= f_pg && f_pg <= range.1,
        "the median of the calibrations lies in their range: {v:#}"
    );
    // S_pg: measured before the first run and after the last, each with
    // every event of the runs' flows; S_pg is their geometric mean.
    let s_pg = number(&v, "s_pg");
    let skeletons = v["s_pg_runs"].as_array().expect("the S_pg measurements");
    assert_eq!(skeletons.len(), 2, "{v:#}");
    let rates: Vec<f64> = skeletons
        .iter()
        .map(|s| number(s, "events_per_s"))
        .collect();
    for skeleton in skeletons {
        assert_eq!(skeleton["events"], 60, "{skeleton:#}");
        assert!(skeleton["clients"].as_u64().unwrap() >= 1, "{skeleton:#}");
        assert!(number(skeleton, "events_per_s") > 0.0, "{skeleton:#}");
        assert!(
            number(skeleton, "wal_bytes_per_event") >= 200.0,
            "{skeleton:#}"
        );
    }
    assert!(
        ((rates[0] * rates[1]).sqrt() - s_pg).abs() <= 1.0,
        "S_pg is the geometric mean of its measurements: {v:#}"
    );
    let mut calibrations = Vec::new();
    let runs = v["workers"]
        .as_array()
        .expect("one object per worker count");
    let counts: Vec<u64> = runs
        .iter()
        .map(|r| r["workers"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [1, 2], "{v:#}");
    for run in runs {
        // Every event produced was relayed and applied, and only those.
        assert_eq!(run["events"], 60, "{run:#}");
        assert!(run["deliveries"].as_u64().unwrap() >= 60, "{run:#}");
        let events_per_s = number(run, "events_per_s");
        assert!(events_per_s > 0.0, "{run:#}");
        let (before, after) = pair(run, "f_pg_before_after");
        if let Some(&last) = calibrations.last() {
            assert_eq!(before, last, "a run starts with the last one's F_pg: {v:#}");
        }
        calibrations.extend([before, after]);
        let run_f = number(run, "f_pg");
        assert!(
            (run_f - (before * after).sqrt()).abs() <= 1.0,
            "a run's F_pg is the geometric mean of the calibrations around it: {run:#}"
        );
        let to_s = number(run, "ratio_to_s");
        assert!(
            (to_s - events_per_s / s_pg).abs() <= 0.01 * to_s + 0.002,
            "the ratio is events per second over S_pg: {v:#}"
        );
        let ratio = number(run, "ratio_to_f");
        assert!(ratio > 0.0, "{run:#}");
        assert!(
            (ratio - events_per_s / run_f).abs() <= 0.01 * ratio + 0.002,
            "the ratio is events per second over the run's F_pg: {v:#}"
        );
        for key in [
            "seconds",
            "produce_per_s",
            "relay_per_s",
            "commits_per_event",
        ] {
            assert!(number(run, key) > 0.0, "{key}: {run:#}");
        }
        // Each event's outbox and inbox rows, with their bodies, are in
        // the WAL written during the run.
        assert!(
            number(run, "wal_bytes_per_event") >= 200.0,
            "wal_bytes_per_event: {run:#}"
        );
    }
    let least = calibrations.iter().copied().fold(f64::INFINITY, f64::min);
    let greatest = calibrations.iter().copied().fold(0.0, f64::max);
    assert_eq!(
        (least, greatest),
        range,
        "the range is the calibrations': {v:#}"
    );
    assert_eq!(
        databases.now(),
        databases.before,
        "a database was left behind"
    );

    // The text report: F_pg, then one row per worker count.
    let out = run(&args[1..]);
    let text = out.text();
    assert!(text.starts_with("F_pg = "), "{text}");
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("S_pg = ")),
        "{text}"
    );
    let rows: Vec<&str> = text
        .lines()
        .filter(|line| line.split_whitespace().nth(1) == Some("60"))
        .collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert_eq!(
        databases.now(),
        databases.before,
        "a database was left behind"
    );
}

/// `--transport http` with a server: the HTTP bench, whose wake part
/// receives into and applies from a PostgreSQL store (a database of its
/// own, dropped after).
#[test]
fn the_http_bench_measures_its_wake_part_on_postgres_and_leaves_no_database() {
    let mut databases = Watched::start("ordo_bench_");
    let server = pgdb::server();
    let v = run(&[
        "--json",
        "bench",
        "--transport",
        "http",
        "--backend",
        "postgres",
        "--url",
        &server,
        "--flows",
        "20",
        "--batch",
        "8",
        "--clients",
        "2",
        "--load-seconds",
        "1",
    ])
    .json();
    let wake = &v["wake"];
    assert_eq!(wake["backend"], "postgres", "{wake:#}");
    assert_eq!(wake["events"], 200, "{wake:#}");
    assert_eq!(wake["lag_ms"]["samples"], 200, "{wake:#}");
    let (p50, p99) = (
        number(&wake["lag_ms"], "p50"),
        number(&wake["lag_ms"], "p99"),
    );
    assert!(0.0 <= p50 && p50 <= p99, "{wake:#}");
    assert!(number(wake, "idle_cpu_ms_per_s") >= 0.0, "{wake:#}");
    assert_eq!(v["problems"], serde_json::json!([]));
    assert_eq!(databases.now(), databases.before);
}

#[test]
fn bad_input_is_exit_2_and_creates_nothing() {
    let mut databases = Watched::start("ordo_bench_");
    let server = pgdb::server();
    // The command's own misuses.
    let own: [(&[&str], &str); 4] = [
        (&["--workers", "2"], "--workers needs --backend postgres"),
        (
            &["--backend", "postgres", "--url", "mysql://root@127.0.0.1"],
            "not a postgres:// or postgresql:// URL",
        ),
        (
            &["--backend", "postgres", "--url", &server, "--sweep"],
            "without --sweep",
        ),
        (
            &[
                "--backend",
                "postgres",
                "--url",
                &server,
                "--transport",
                "http",
                "--workers",
                "2",
            ],
            "without --transport http",
        ),
    ];
    let cases = pgdb::backend_url_misuses(&server, &own);
    common::refuses_each(&["bench"], &cases);
    // Out of range: refused by the argument parser.
    for workers in ["0", "6", "1,x"] {
        let out = run(&[
            "bench",
            "--backend",
            "postgres",
            "--url",
            &server,
            "--workers",
            workers,
        ]);
        assert_eq!(out.code, 2, "--workers {workers}: {out:#?}");
        assert_eq!(out.stdout, "", "--workers {workers}: {out:#?}");
    }
    assert_eq!(databases.now(), databases.before);
}

#[test]
fn an_unreachable_server_is_exit_1_named_without_its_password() {
    run(&[
        "bench",
        "--backend",
        "postgres",
        "--url",
        common::UNREACHABLE_PG,
    ])
    .unreachable_server();
}

/// The S_pg measurement's end check fails when a step of one event is
/// missing: an event applied again pending, a flow left due.
#[test]
fn the_skeletons_end_check_finds_a_missing_step() {
    let _serial = serial();
    let database = pgdb::Database::create();
    let url = database.url();
    let refused = skeleton_pg::measure(&url, 0, 8, &ordo_lab::Silent).expect_err("no flows");
    assert!(
        matches!(refused, ordo_lab::LabError::Usage(_)),
        "{refused:?}"
    );
    let tables: i64 = database
        .client()
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(tables, 0, "a refused measurement creates nothing");
    let measured = skeleton_pg::measure(&url, 20, 8, &ordo_lab::Silent).expect("measured");
    assert_eq!(measured.events, 60);
    skeleton_pg::verify(&url, 60).expect("every event went through every step");
    let mut client = database.client();
    client
        .batch_execute("UPDATE inbox SET status = 'pending' WHERE flow_id = 'flow-0' AND seq = 3")
        .unwrap();
    let refused = skeleton_pg::verify(&url, 60).expect_err("an event is not applied");
    assert!(refused.to_string().contains("59 applied"), "{refused}");
    client
        .batch_execute(
            "UPDATE inbox SET status = 'applied' WHERE flow_id = 'flow-0';
             UPDATE head SET relay_seq = 3 WHERE flow_id = 'flow-1'",
        )
        .unwrap();
    let refused = skeleton_pg::verify(&url, 60).expect_err("a flow is left due");
    assert!(
        refused.to_string().contains("1 flows still due"),
        "{refused}"
    );
}
