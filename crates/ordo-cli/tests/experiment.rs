//! The experiment run by the real binary: all 22 scenarios pass, and those
//! beyond them and of the HTTP transport; each crash point leaves the state
//! of docs/PROTOCOL.md section 9, and a wrong expectation makes `--check`
//! fail with the field named.

mod common;

use serde_json::Value;

/// Runs `ordo ARGS`: its exit status, its stdout as JSON (`Null` if empty,
/// a string if not JSON) and its stderr.
fn ordo(args: &[&str]) -> (i32, Value, String) {
    let out = common::run(args);
    let stdout = out.stdout.trim();
    let json = if stdout.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(stdout).unwrap_or_else(|_| Value::String(out.stdout.clone()))
    };
    (out.code, json, out.stderr)
}

/// Runs one scenario and returns its report entry.
fn scenario(name: &str) -> Value {
    let (code, report, stderr) = ordo(&["experiment", "--check", "--json", "--only", name]);
    assert_eq!(code, 0, "{name}: {stderr}");
    assert_eq!(report["passed"], 1, "{name}");
    let entry = report["scenarios"][0].clone();
    assert_eq!(entry["name"], name);
    entry
}

fn rows<'a>(state: &'a Value, side: &str, table: &str) -> &'a Vec<Value> {
    state[side][table].as_array().expect("a table is an array")
}

#[test]
fn the_whole_experiment_passes_22_of_22_seed_and_every_beyond_transport_and_topology_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("report.json");
    let output_s = output.to_str().unwrap();
    let (code, report, stderr) = ordo(&["experiment", "--check", "--json", "--output", output_s]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        report["groups"]["seed"],
        serde_json::json!({"passed": 22, "failed": 0})
    );
    assert_eq!(
        report["groups"]["beyond"],
        serde_json::json!({"passed": 6, "failed": 0})
    );
    assert_eq!(
        report["groups"]["transport"],
        serde_json::json!({"passed": 2, "failed": 0})
    );
    assert_eq!(
        report["groups"]["topology"],
        serde_json::json!({"passed": 5, "failed": 0})
    );
    assert_eq!(report["passed"], 35);
    assert_eq!(report["failed"], 0);
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&output).unwrap()).unwrap();
    assert_eq!(written["scenarios"], report["scenarios"]);
    let names = common::scenario_names(&report);
    assert_eq!(names.len(), 35);
    for name in [
        "fair_relay_isolates_conflict",
        "transient_failure_backs_off",
        "skip_is_explicit_and_audited",
        "prune_keeps_identities",
        "happy_path",
        "out_of_order_3_1_2",
        "six_process_concurrency",
        "unsafe_dual_write_loses_event",
        "default_relay_conflict_can_starve",
        "crash_serve_after_commit",
        "crash_relay_after_receive_over_http",
        "conflict_stops_its_flow_in_one_delivery",
        "bound_key_posts_for_another_producer",
        "restore_from_backup_is_detected",
    ] {
        assert!(names.contains(&name), "{name} missing");
    }
    for s in report["scenarios"].as_array().unwrap() {
        assert_eq!(s["passed"], true, "{}", s["name"]);
        assert_eq!(s["observed"], s["expected"], "{}", s["name"]);
    }
}

#[test]
fn a_wrong_expectation_fails_check_with_the_field_named() {
    let dir = tempfile::tempdir().unwrap();
    let name = "crash_relay_after_receive";
    let (code, mut report, _) = ordo(&["experiment", "--json", "--only", name]);
    assert_eq!(code, 0);
    report["scenarios"][0]["expected"]["after_crash"]["producer"]["outbox"][0]["accepted"] =
        Value::Bool(true);
    let wrong = dir.path().join("wrong.json");
    std::fs::write(&wrong, report.to_string()).unwrap();
    // `ordo experiment MODE --only NAME --expected WRONG`.
    let against_wrong = |mode: &str| {
        ordo(&[
            "experiment",
            mode,
            "--only",
            name,
            "--expected",
            wrong.to_str().unwrap(),
        ])
    };
    let (code, stdout, stderr) = against_wrong("--check");
    assert_ne!(code, 0);
    let text = stdout.as_str().expect("text mode prints text, not JSON");
    assert!(text.contains("0 passed, 1 failed"), "{text}");
    assert!(
        stderr.contains("crash_relay_after_receive: after_crash.producer.outbox[0].accepted: expected true, observed false"),
        "{stderr}"
    );
    // Without --check the same mismatch is reported but does not fail.
    let (code, report, _) = against_wrong("--json");
    assert_eq!(code, 0);
    assert_eq!(report["failed"], 1);
    assert_eq!(
        report["scenarios"][0]["differences"][0],
        "after_crash.producer.outbox[0].accepted: expected true, observed false"
    );
}

#[test]
fn an_unknown_scenario_is_a_usage_error() {
    let (code, stdout, stderr) = ordo(&["experiment", "--only", "no_such_scenario"]);
    assert_eq!(code, 2);
    assert_eq!(stdout, Value::Null);
    assert!(
        stderr.starts_with("error: --only no_such_scenario"),
        "{stderr}"
    );
}

#[test]
fn unsafe_dual_write_exits_81_and_loses_the_event() {
    let s = scenario("unsafe_dual_write_loses_event");
    let observed = &s["observed"];
    assert_eq!(observed["exit_code"], 81);
    let flows = rows(&observed["state"], "producer", "flows");
    assert_eq!(flows.len(), 1);
    assert_eq!(flows[0]["state"], "reserved");
    assert!(rows(&observed["state"], "producer", "outbox").is_empty());
    assert!(rows(&observed["state"], "consumer", "inbox").is_empty());
    assert!(observed["relay"]["deliveries"]
        .as_array()
        .unwrap()
        .is_empty());
}

#[test]
fn out_of_order_3_1_2_reports_gap_until_seq_2_arrives() {
    let s = scenario("out_of_order_3_1_2");
    let applies = s["observed"]["applies"].as_array().unwrap();
    let stops: Vec<(&str, u64)> = applies
        .iter()
        .map(|a| {
            (
                a["flows"][0]["stop"].as_str().unwrap(),
                a["flows"][0]["applied"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(stops, vec![("gap", 0), ("gap", 1), ("idle", 2)]);
    let effects = rows(&s["observed"], "consumer", "effects");
    let seqs: Vec<i64> = effects.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
}

#[test]
fn six_processes_end_with_every_flow_released_once() {
    let s = scenario("six_process_concurrency");
    let observed = &s["observed"];
    assert_eq!(
        observed["exit_codes"],
        serde_json::json!([0, 0, 0, 0, 0, 0])
    );
    let projection = rows(&observed["state"], "consumer", "projection");
    assert!(!projection.is_empty());
    assert!(projection
        .iter()
        .all(|p| p["state"] == "released" && p["applied_seq"] == 3));
    let effects = rows(&observed["state"], "consumer", "effects");
    assert_eq!(effects.len(), projection.len() * 3);
    let outbox = rows(&observed["state"], "producer", "outbox");
    assert_eq!(outbox.len(), effects.len());
    assert!(outbox.iter().all(|r| r["accepted"] == true));
}

/// Checks a crash scenario: the child exited 73, the state after the crash
/// has the listed table sizes, and the recovery did what section 9 says.
fn crash_case(name: &str, after_crash: &[(&str, &str, usize)], check: impl Fn(&Value)) {
    let s = scenario(name);
    let observed = &s["observed"];
    assert_eq!(observed["exit_code"], 73, "{name}");
    for (side, table, len) in after_crash {
        assert_eq!(
            rows(&observed["after_crash"], side, table).len(),
            *len,
            "{name}: {side}.{table} after the crash"
        );
    }
    check(observed);
}

#[test]
fn crash_producer_advance_before_commit_leaves_nothing() {
    crash_case(
        "crash_producer_advance_before_commit",
        &[("producer", "flows", 0), ("producer", "outbox", 0)],
        |o| assert_eq!(o["recovery"]["outcome"], "committed"),
    );
}

#[test]
fn crash_producer_advance_after_commit_keeps_state_and_event() {
    crash_case(
        "crash_producer_advance_after_commit",
        &[("producer", "flows", 1), ("producer", "outbox", 1)],
        |o| {
            assert_eq!(o["recovery"]["outcome"], "stale");
            assert_eq!(o["recovery"]["last_seq"], 1);
        },
    );
}

fn unaccepted(o: &Value) -> bool {
    o["after_crash"]["producer"]["outbox"][0]["accepted"] == false
}

#[test]
fn crash_relay_before_receive_leaves_the_inbox_empty() {
    crash_case(
        "crash_relay_before_receive",
        &[("consumer", "inbox", 0), ("producer", "outbox", 1)],
        |o| {
            assert!(unaccepted(o));
            assert_eq!(o["recovery"]["deliveries"][0]["receipt"], "accepted");
            assert_eq!(o["state"]["producer"]["outbox"][0]["accepted"], true);
        },
    );
}

fn stored_then_duplicate(name: &str) {
    crash_case(
        name,
        &[("consumer", "inbox", 1), ("producer", "outbox", 1)],
        |o| {
            assert!(unaccepted(o), "{name}: not marked after the crash");
            assert_eq!(o["recovery"]["deliveries"][0]["receipt"], "duplicate");
            assert_eq!(o["state"]["producer"]["outbox"][0]["accepted"], true);
            assert_eq!(o["state"]["consumer"]["inbox"].as_array().unwrap().len(), 1);
        },
    );
}

#[test]
fn crash_relay_after_receive_is_recovered_as_duplicate() {
    stored_then_duplicate("crash_relay_after_receive");
}

#[test]
fn crash_relay_mark_before_commit_is_recovered_as_duplicate() {
    stored_then_duplicate("crash_relay_mark_before_commit");
}

#[test]
fn crash_consumer_receive_before_commit_stores_nothing() {
    crash_case(
        "crash_consumer_receive_before_commit",
        &[("consumer", "inbox", 0)],
        |o| {
            assert!(unaccepted(o));
            assert_eq!(o["recovery"]["deliveries"][0]["receipt"], "accepted");
        },
    );
}

#[test]
fn crash_consumer_receive_after_commit_is_recovered_as_duplicate() {
    stored_then_duplicate("crash_consumer_receive_after_commit");
}

fn rolled_back(name: &str) {
    crash_case(
        name,
        &[
            ("consumer", "projection", 0),
            ("consumer", "effects", 0),
            ("consumer", "inbox", 1),
        ],
        |o| {
            assert_eq!(
                o["after_crash"]["consumer"]["inbox"][0]["status"],
                "pending"
            );
            assert_eq!(o["recovery"]["flows"][0]["applied"], 1);
            assert_eq!(
                o["state"]["consumer"]["effects"].as_array().unwrap().len(),
                1
            );
        },
    );
}

#[test]
fn crash_consumer_apply_after_projection_rolls_back() {
    rolled_back("crash_consumer_apply_after_projection");
}

#[test]
fn crash_consumer_apply_after_effect_rolls_back() {
    rolled_back("crash_consumer_apply_after_effect");
}

#[test]
fn crash_consumer_apply_after_commit_applies_exactly_once() {
    crash_case(
        "crash_consumer_apply_after_commit",
        &[("consumer", "projection", 1), ("consumer", "effects", 1)],
        |o| {
            assert_eq!(
                o["after_crash"]["consumer"]["inbox"][0]["status"],
                "applied"
            );
            assert_eq!(
                o["after_crash"]["consumer"]["inbox"][1]["status"],
                "pending"
            );
            assert_eq!(o["recovery"]["flows"][0]["applied"], 1);
            let effects = o["state"]["consumer"]["effects"].as_array().unwrap();
            assert_eq!(effects.len(), 2);
            assert_eq!(effects[0]["seq"], 1);
            assert_eq!(effects[1]["seq"], 2);
        },
    );
}

/// A crash around the wire: the event is in the inbox and not accepted;
/// the relay's retry over HTTP is answered `duplicate` and marks it.
fn stored_then_duplicate_over_http(o: &Value) {
    let after_crash = &o["after_crash"];
    assert_eq!(rows(after_crash, "consumer", "inbox").len(), 1, "{o:#}");
    assert_eq!(
        rows(after_crash, "producer", "outbox")[0]["accepted"],
        false
    );
    assert_eq!(o["retry_exit_code"], 0);
    assert_eq!(o["retry"]["deliveries"][0]["receipt"], "duplicate", "{o:#}");
    assert_eq!(o["outbox"]["accepted"], true);
    assert_eq!(o["outbox"]["last_outcome"], "duplicate");
    assert_eq!(rows(&o["state"], "consumer", "inbox").len(), 1);
}

#[test]
fn crash_serve_after_commit_is_a_transient_failure_then_a_duplicate() {
    let s = scenario("crash_serve_after_commit");
    let o = &s["observed"];
    assert_eq!(o["serve_exit_code"], 73);
    // The relay saw a broken connection: exit 0, nothing delivered, the
    // attempt recorded as an error.
    assert_eq!(o["relay"]["exit_code"], 0);
    assert_eq!(o["relay"]["transient_errors"], 1);
    assert_eq!(o["relay"]["deliveries"], serde_json::json!([]));
    assert_eq!(o["after_crash_outbox"]["last_outcome"], "error");
    stored_then_duplicate_over_http(o);
}

#[test]
fn crash_relay_after_receive_over_http_is_recovered_as_duplicate() {
    let s = scenario("crash_relay_after_receive_over_http");
    let o = &s["observed"];
    assert_eq!(o["relay_exit_code"], 73);
    stored_then_duplicate_over_http(o);
}

#[test]
fn a_short_soak_survives_sigkill_with_every_invariant() {
    let (code, result, stderr) = ordo(&[
        "soak",
        "--seconds",
        "3",
        "--flows",
        "60",
        "--seed",
        "7",
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(result["verdict"], "ok", "{result}");
    assert!(result["kills"].as_u64().unwrap() > 0, "{result}");
    assert_eq!(result["events"], 180);
    assert_eq!(result["seed"], 7);
    assert!(result["violations"].as_array().unwrap().is_empty());
}
