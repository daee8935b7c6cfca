//! The experiment on PostgreSQL, run by the real binary against the server
//! of `ORDO_TEST_PG`: the scenarios pass with the same expectations as on
//! SQLite, each on a database of its own that is gone afterwards; the
//! scenarios about SQLite files are listed as not applicable; the flags go
//! together; a bad URL creates nothing and an unreachable server is named
//! without its password.

mod common;
mod pgdb;

use std::process::{Command, Output};

use pgdb::{serial, Watched};
use serde_json::{json, Value};

/// The seed's scenarios, all 22.
const SEED: [&str; 22] = [
    "happy_path",
    "duplicate_delivery",
    "conflict_same_event_id",
    "conflict_same_flow_seq",
    "out_of_order_3_1_2",
    "unknown_schema_blocked",
    "schema_v2_enabled_later",
    "invalid_payload_blocked",
    "process_all_isolation",
    "default_relay_conflict_can_starve",
    "six_process_concurrency",
    "unsafe_dual_write_loses_event",
    "crash_producer_advance_before_commit",
    "crash_producer_advance_after_commit",
    "crash_relay_before_receive",
    "crash_relay_after_receive",
    "crash_relay_mark_before_commit",
    "crash_consumer_receive_before_commit",
    "crash_consumer_receive_after_commit",
    "crash_consumer_apply_after_projection",
    "crash_consumer_apply_after_effect",
    "crash_consumer_apply_after_commit",
];
/// Every scenario beyond the seed, the one about SQLite's file lock included
/// (it is listed as not applicable).
const BEYOND: [&str; 6] = [
    "fair_relay_isolates_conflict",
    "transient_failure_backs_off",
    "quarantine_is_retried_only_by_an_operator",
    "skip_is_explicit_and_audited",
    "prune_keeps_identities",
    "status_alerts_on_thresholds",
];
const TRANSPORT: [&str; 2] = [
    "crash_serve_after_commit",
    "crash_relay_after_receive_over_http",
];
const TOPOLOGY: [&str; 5] = [
    "conflict_stops_its_flow_in_one_delivery",
    "two_producers_share_flow_ids",
    "fan_out_with_one_consumer_down",
    "bound_key_posts_for_another_producer",
    "restore_from_backup_is_detected",
];
/// What only an SQLite store can show, with its group.
const NOT_ON_POSTGRES: [(&str, &str, &str); 2] = [
    ("transient_failure_backs_off", "beyond", "SQLite"),
    ("restore_from_backup_is_detected", "topology", "file"),
];

/// Runs `ordo ARGS` and returns its exit status, stdout and stderr; the
/// child's process id is handed to `pid`.
fn ordo_with_pid(args: &[&str], pid: &mut u32) -> (i32, String, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start ordo");
    *pid = child.id();
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().expect("wait for ordo");
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

fn ordo(args: &[&str]) -> (i32, String, String) {
    ordo_with_pid(args, &mut 0)
}

/// The server's URL with a password in it, which a server trusting the
/// role ignores (or the server's own, when it has one).
/// `ordo --json experiment --check --backend postgres --url URL`, to which
/// a caller adds the scenarios.
fn check_on(url: &str) -> Vec<&str> {
    vec![
        "--json",
        "experiment",
        "--check",
        "--backend",
        "postgres",
        "--url",
        url,
    ]
}

fn server_with_password() -> (String, String) {
    let server = pgdb::server();
    let (scheme, rest) = server.split_once("://").expect("a URL");
    let (user_info, host) = rest.split_once('@').expect("ORDO_TEST_PG names a user");
    let (user, password) = match user_info.split_once(':') {
        Some((user, own)) => (user, own.to_owned()),
        None => (user_info, "not-shown-anywhere".to_owned()),
    };
    (format!("{scheme}://{user}:{password}@{host}"), password)
}

#[test]
fn the_scenarios_pass_on_postgresql_each_on_a_database_that_is_gone_afterwards() {
    let mut databases = Watched::start("ordo_exp_");
    let (url, password) = server_with_password();
    let mut args = check_on(&url);
    for name in SEED
        .iter()
        .chain(&BEYOND)
        .chain(&TRANSPORT)
        .chain(&TOPOLOGY)
    {
        args.extend(["--only", name]);
    }
    let mut pid = 0;
    let (code, stdout, stderr) = ordo_with_pid(&args, &mut pid);
    assert_eq!(code, 0, "{stderr}\n{stdout}");
    let report: Value = serde_json::from_str(&stdout).expect("one JSON report");
    assert_eq!(report["backend"], "postgres");
    assert!(
        report["server"]
            .as_str()
            .is_some_and(|s| s.starts_with("postgres://")),
        "{}",
        report["server"]
    );
    let failures: Vec<&Value> = report["scenarios"]
        .as_array()
        .expect("scenarios")
        .iter()
        .filter(|s| s["passed"] != true)
        .collect();
    assert!(failures.is_empty(), "failed on PostgreSQL: {failures:#?}");
    assert_eq!(report["groups"]["seed"], json!({"passed": 22, "failed": 0}));
    assert_eq!(
        report["groups"]["beyond"],
        json!({"passed": 5, "failed": 0})
    );
    assert_eq!(
        report["groups"]["transport"],
        json!({"passed": 2, "failed": 0})
    );
    assert_eq!(
        report["groups"]["topology"],
        json!({"passed": 4, "failed": 0})
    );
    assert_eq!(report["passed"], 33);
    assert_eq!(report["failed"], 0);
    let ran = common::scenario_names(&report);
    let expected_ran: Vec<&str> = SEED
        .iter()
        .chain(&BEYOND)
        .chain(&TRANSPORT)
        .chain(&TOPOLOGY)
        .copied()
        .filter(|n| NOT_ON_POSTGRES.iter().all(|(name, _, _)| name != n))
        .collect();
    assert_eq!(ran, expected_ran);
    let not_applicable = report["not_applicable"].as_array().expect("a list");
    assert_eq!(
        not_applicable.len(),
        NOT_ON_POSTGRES.len(),
        "{not_applicable:?}"
    );
    for (seen, (name, group, why)) in not_applicable.iter().zip(NOT_ON_POSTGRES) {
        assert_eq!(
            (seen["name"].as_str(), seen["group"].as_str()),
            (Some(name), Some(group))
        );
        assert!(
            seen["reason"].as_str().is_some_and(|r| r.contains(why)),
            "{not_applicable:?}"
        );
    }
    assert!(
        !stdout.contains(&password) && !stderr.contains(&password),
        "the password is shown"
    );
    // Every database of the run was dropped: none of its process is left,
    // and the experiment's databases are those of before.
    let after = databases.now();
    let own = format!("ordo_exp_{}_{pid}_", ordo_lab::experiment::pg::machine());
    assert!(
        after.iter().all(|name| !name.starts_with(&own)),
        "left behind: {after:?}"
    );
    assert_eq!(after, databases.before);
}

#[test]
fn a_leftover_of_a_dead_run_is_dropped_and_nothing_else() {
    let mut databases = Watched::start("ordo_exp_");
    // A process id that no longer runs: a child that has exited.
    let mut dead = Command::new("true").spawn().expect("start true");
    let dead_pid = dead.id();
    dead.wait().expect("wait for true");
    let host = ordo_lab::experiment::pg::machine();
    let leftover = format!("ordo_exp_{host}_{dead_pid}_7");
    // Not a name of a run: kept.
    let not_ours = format!("ordo_exp_{host}_{dead_pid}_7_kept");
    // Another machine's run, whose process cannot be looked up here: kept.
    let elsewhere = format!("ordo_exp_{host}x_{dead_pid}_7");
    for name in [&leftover, &not_ours, &elsewhere] {
        databases
            .client
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .expect("drop a database");
        databases
            .client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create a database");
    }
    let server = pgdb::server();
    let (code, stdout, stderr) =
        ordo(&[&check_on(&server)[..], &["--only", "happy_path"]].concat());
    let after = databases.now();
    for name in [&not_ours, &elsewhere] {
        databases
            .client
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
            .expect("drop the test's database");
    }
    assert_eq!(code, 0, "{stderr}\n{stdout}");
    assert!(!after.contains(&leftover), "{after:?}");
    assert!(after.contains(&not_ours), "{after:?}");
    assert!(after.contains(&elsewhere), "{after:?}");
}

#[test]
fn flags_go_together_and_a_bad_url_creates_nothing() {
    let mut databases = Watched::start("ordo_exp_");
    let server = pgdb::server();
    let cases = pgdb::backend_url_misuses(&server, &[]);
    for (flags, message) in cases {
        let mut args = vec!["experiment", "--only", "happy_path"];
        args.extend(flags.iter().map(String::as_str));
        let (code, stdout, stderr) = ordo(&args);
        assert_eq!(code, 2, "{flags:?}: {stderr}");
        assert!(stdout.is_empty(), "{flags:?}: {stdout}");
        assert!(stderr.contains(message), "{flags:?}: {stderr}");
        assert!(!stderr.contains("sekret"), "{flags:?}: {stderr}");
    }
    assert_eq!(databases.now(), databases.before);
}

#[test]
fn an_unreachable_server_is_exit_1_named_without_its_password() {
    let _serial = serial();
    // Port 1 on the loopback interface: nothing listens there.
    let (code, stdout, stderr) = ordo(&[
        "experiment",
        "--only",
        "happy_path",
        "--backend",
        "postgres",
        "--url",
        "postgres://ordo:sekret@127.0.0.1:1",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr
            .contains("cannot connect to postgres://ordo@127.0.0.1:1: error connecting to server"),
        "{stderr}"
    );
    assert!(!stderr.contains("sekret"), "{stderr}");
}

#[test]
fn on_sqlite_the_report_keeps_its_shape() {
    let (code, stdout, stderr) = ordo(&["--json", "experiment", "--check", "--only", "happy_path"]);
    assert_eq!(code, 0, "{stderr}");
    let report: Value = serde_json::from_str(&stdout).expect("one JSON report");
    assert_eq!(
        common::keys(&report),
        ["failed", "groups", "passed", "scenarios"]
    );
    let (code, _, stderr) = ordo(&["experiment", "--only", "happy_path", "--backend", "sqlite"]);
    assert_eq!(code, 0, "{stderr}");
}
