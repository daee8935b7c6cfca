//! Scenarios beyond the seed (docs/PROTOCOL.md section 8), reported apart from
//! the seed's 22: fair relay, backoff, quarantine, audited repair, retention
//! and alerting. Times come from a fixed clock (`ORDO_NOW_MS`), so ages and
//! backoff are exact without sleeping.

use serde_json::{json, Value};

use super::child::{advance_args, deliver_stdin, finish, without_store_ids, Ctx, NOW_ENV, RELAY};
use super::expect::{conflict, envelope, event, receipt};
use super::scenarios::{delivery_of, drained, relayed, Outcome, ScenarioFn};

/// Every scenario beyond the seed.
pub const BEYOND: [(&str, ScenarioFn); 6] = [
    ("fair_relay_isolates_conflict", fair_relay_isolates_conflict),
    ("transient_failure_backs_off", transient_failure_backs_off),
    (
        "quarantine_is_retried_only_by_an_operator",
        quarantine_is_retried_only_by_an_operator,
    ),
    ("skip_is_explicit_and_audited", skip_is_explicit_and_audited),
    ("prune_keeps_identities", prune_keeps_identities),
    ("status_alerts_on_thresholds", status_alerts_on_thresholds),
];

/// The fixed time of these scenarios.
const T0: i64 = 1_700_000_000_000;

fn at(ctx: &Ctx, now_ms: i64, args: &[&str]) -> Result<Value, String> {
    ctx.run_at(now_ms, args)?.json_if_ok(&args.join(" "))
}

fn produce(ctx: &Ctx, now_ms: i64, flow: &str, steps: usize) -> Result<(), String> {
    for (i, step) in ["reserved", "confirmed", "released"]
        .iter()
        .take(steps)
        .enumerate()
    {
        let expected = i.to_string();
        at(
            ctx,
            now_ms,
            &advance_args(flow, &expected, step, &["--quantity", "5"]),
        )?;
    }
    Ok(())
}

/// The delivery bookkeeping of one outbox row, without times.
fn bookkeeping(ctx: &Ctx, now_ms: i64, event_id: &str) -> Result<Value, String> {
    let list = at(ctx, now_ms, &["outbox", "list", "--producer", "{P}"])?;
    let row = list["outbox"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["event_id"] == event_id))
        .cloned()
        .ok_or_else(|| format!("{event_id} is not in the outbox"))?;
    Ok(json!({
        "accepted": row["accepted"],
        "quarantined": row["quarantined"],
        "quarantine_detail": row["quarantine_detail"],
        "attempts": row["attempts"],
        "last_outcome": row["last_outcome"],
    }))
}

const CONFLICT_REASON: &str =
    "conflict: the consumer holds a different body under this event id, or another event id at this (flow_id, seq)";

fn fair_relay_isolates_conflict(ctx: &Ctx) -> Result<Outcome, String> {
    produce(ctx, T0, "a", 1)?;
    produce(ctx, T0, "b", 3)?;
    // The consumer already holds another body under a-1 (one it cannot apply).
    let forged = envelope("a-1", "a", 1, 9, "reserved", json!({"amount": 5}));
    ctx.receive(std::slice::from_ref(&forged))?;
    let relay = at(ctx, T0, &RELAY)?;
    let apply = at(ctx, T0, &["apply", "--consumer", "{C}"])?;
    let quarantined = at(
        ctx,
        T0,
        &["outbox", "list", "--producer", "{P}", "--quarantined"],
    )?;
    let status = at(
        ctx,
        T0,
        &["status", "--producer", "{P}", "--consumer", "{C}"],
    )?;
    let state = ctx.snapshot()?;
    Ok(Outcome {
        observed: json!({
            "relay": relay,
            "apply": apply,
            "quarantined": quarantined["outbox"].as_array().map(|rows| rows.iter().map(|r| r["event_id"].clone()).collect::<Vec<_>>()),
            "a_1": bookkeeping(ctx, T0, "a-1")?,
            "status_quarantined": status["producer"]["quarantined"],
            "projection": state["consumer"]["projection"],
        }),
        expected: json!({
            "relay": relayed(vec![
                delivery_of("a-1", "a", 1, "conflict"),
                delivery_of("b-1", "b", 1, "accepted"),
                delivery_of("b-2", "b", 2, "accepted"),
                delivery_of("b-3", "b", 3, "accepted"),
            ], "drained"),
            "apply": drained(vec![("a", 0, "blocked", Some("unsupported_schema")), ("b", 3, "idle", None)]),
            "quarantined": ["a-1"],
            "a_1": {"accepted": false, "quarantined": true, "quarantine_detail": CONFLICT_REASON, "attempts": 1, "last_outcome": "conflict"},
            "status_quarantined": 1,
            "projection": [{"flow_id": "b", "producer": "default", "state": "released", "quantity": 5, "applied_seq": 3}],
        }),
    })
}

fn transient_failure_backs_off(ctx: &Ctx) -> Result<Outcome, String> {
    produce(ctx, T0, "a", 1)?;
    at(ctx, T0, &["init", "--producer", "{P}", "--consumer", "{C}"])?;
    // Another process holds the consumer's write lock: the consumer is busy.
    let lock =
        ordo_sqlite::rusqlite::Connection::open(ctx.consumer()).map_err(|e| e.to_string())?;
    lock.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| e.to_string())?;
    let busy = ctx.run_at(
        T0,
        &[
            "relay",
            "--producer",
            "{P}",
            "--consumer",
            "{C}",
            "--busy-timeout-ms",
            "50",
        ],
    )?;
    lock.execute_batch("ROLLBACK").map_err(|e| e.to_string())?;
    drop(lock);
    let list = at(ctx, T0, &["outbox", "list", "--producer", "{P}"])?;
    let row = &list["outbox"][0];
    let next = row["next_attempt_at_ms"].as_i64().unwrap_or(0);
    let not_yet = at(ctx, T0, &RELAY)?;
    let later = at(ctx, T0 + 1_000, &RELAY)?;
    Ok(Outcome {
        observed: json!({
            "busy_exit_code": busy.code,
            "busy_round_failed_transiently": busy.json["transient_errors"],
            "busy_deliveries": busy.json["deliveries_total"],
            "attempts": row["attempts"],
            "last_outcome": row["last_outcome"],
            "last_error_recorded": row["last_error"].as_str().is_some_and(|e| !e.is_empty()),
            "next_attempt_within_first_backoff": next > T0 && next <= T0 + 101,
            "relay_before_next_attempt": not_yet,
            "relay_after_next_attempt": later,
            "a_1": bookkeeping(ctx, T0 + 1_000, "a-1")?,
        }),
        expected: json!({
            "busy_exit_code": 0,
            "busy_round_failed_transiently": 1,
            "busy_deliveries": 0,
            "attempts": 1,
            "last_outcome": "error",
            "last_error_recorded": true,
            "next_attempt_within_first_backoff": true,
            "relay_before_next_attempt": relayed(vec![], "drained"),
            "relay_after_next_attempt": relayed(vec![delivery_of("a-1", "a", 1, "accepted")], "drained"),
            "a_1": {"accepted": true, "quarantined": false, "quarantine_detail": null, "attempts": 2, "last_outcome": "accepted"},
        }),
    })
}

fn quarantine_is_retried_only_by_an_operator(ctx: &Ctx) -> Result<Outcome, String> {
    produce(ctx, T0, "a", 1)?;
    let forged = envelope("a-1", "a", 1, 1, "reserved", json!({"amount": 6}));
    ctx.receive(std::slice::from_ref(&forged))?;
    let first = at(ctx, T0, &RELAY)?;
    let again = at(ctx, T0 + 3_600_000, &RELAY)?;
    let retry = at(ctx, T0, &["outbox", "retry", "--producer", "{P}", "a-1"])?;
    let after_retry = at(ctx, T0, &RELAY)?;
    let retry_unquarantined = ctx.run_at(T0, &["outbox", "retry", "--producer", "{P}", "b-1"])?;
    let conflict = relayed(vec![delivery_of("a-1", "a", 1, "conflict")], "drained");
    Ok(Outcome {
        observed: json!({
            "first": first,
            "an_hour_later": again,
            "retry": retry,
            "after_retry": after_retry,
            "a_1": bookkeeping(ctx, T0, "a-1")?,
            "retry_unknown_exit_code": retry_unquarantined.code,
        }),
        expected: json!({
            "first": conflict,
            "an_hour_later": relayed(vec![], "drained"),
            "retry": {"event_id": "a-1", "retried": true},
            "after_retry": conflict,
            "a_1": {"accepted": false, "quarantined": true, "quarantine_detail": CONFLICT_REASON, "attempts": 2, "last_outcome": "conflict"},
            "retry_unknown_exit_code": 2,
        }),
    })
}

fn skip_is_explicit_and_audited(ctx: &Ctx) -> Result<Outcome, String> {
    let e1 = envelope("x-1", "x", 1, 1, "reserved", json!({"amount": 5}));
    let e2 = envelope("x-2", "x", 2, 1, "confirmed", json!({"amount": 0}));
    let e3 = envelope("x-3", "x", 3, 1, "confirmed", json!({"amount": 5}));
    ctx.receive(&[e1.clone(), e2.clone(), e3.clone()])?;
    let first = at(ctx, T0, &["apply", "--consumer", "{C}"])?;
    let skip = |seq: &str| {
        ctx.run_at(
            T0,
            &[
                "inbox",
                "skip",
                "--consumer",
                "{C}",
                "--flow",
                "x",
                "--seq",
                seq,
                "--reason",
                "amount 0 was a typo; x-3 corrects it",
                "--by",
                "alice",
            ],
        )
    };
    let not_next = skip("3")?;
    let already_applied = skip("1")?;
    let skipped = skip("2")?;
    let then = at(ctx, T0, &["apply", "--consumer", "{C}"])?;
    let repairs = at(ctx, T0, &["inbox", "repairs", "--consumer", "{C}"])?;
    let state = ctx.snapshot()?;
    let repair = json!({"id": 1, "action": "skip", "producer": "default", "flow_id": "x",
        "store_id": null, "seq": 2, "event_id": "x-2", "key": null,
        "reason": "amount 0 was a typo; x-3 corrects it", "by": "alice", "at_ms": T0});
    Ok(Outcome {
        observed: json!({
            "first": first,
            "not_next_exit_code": not_next.code,
            "already_applied_exit_code": already_applied.code,
            "skip": skipped.json,
            "then": then,
            "repairs": repairs,
            "inbox_status": state["consumer"]["inbox"].as_array().map(|rows| rows.iter().map(|r| r["status"].clone()).collect::<Vec<_>>()),
            "effects": state["consumer"]["effects"],
        }),
        expected: json!({
            "first": drained(vec![("x", 1, "blocked", Some("invalid_payload"))]),
            "not_next_exit_code": 2,
            "already_applied_exit_code": 2,
            "skip": {"repair": repair},
            "then": drained(vec![("x", 1, "idle", None)]),
            "repairs": {"repairs": [repair]},
            "inbox_status": ["applied", "skipped", "applied"],
            "effects": [
                {"flow_id": "x", "producer": "default", "seq": 1, "event_id": "x-1"},
                {"flow_id": "x", "producer": "default", "seq": 3, "event_id": "x-3"},
            ],
        }),
    })
}

fn prune_keeps_identities(ctx: &Ctx) -> Result<Outcome, String> {
    produce(ctx, T0, "a", 3)?;
    at(ctx, T0, &RELAY)?;
    at(ctx, T0, &["apply", "--consumer", "{C}"])?;
    let prune = at(
        ctx,
        T0 + 60_000,
        &[
            "prune",
            "--producer",
            "{P}",
            "--consumer",
            "{C}",
            "--older-than",
            "1s",
        ],
    )?;
    let original = event("a", 1, "reserved", 5);
    let changed = event("a", 1, "reserved", 6);
    let other_id = envelope("other-1", "a", 1, 1, "reserved", json!({"amount": 5}));
    let second = event("a", 2, "confirmed", 5);
    // Each conflict in a delivery of its own: after one, nothing more of
    // its flow is decided in that delivery.
    let sent = [original, second, changed];
    let receive = ctx.receive(&sent)?;
    let intruder = ctx.receive(std::slice::from_ref(&other_id))?;
    let apply = at(ctx, T0 + 60_000, &["apply", "--consumer", "{C}"])?;
    let state = ctx.snapshot()?;
    Ok(Outcome {
        observed: json!({
            "prune": {"producer": prune["producer"], "consumer": prune["consumer"]},
            "receive": receive,
            "intruder": intruder,
            "apply": apply,
            "outbox_rows": state["producer"]["outbox"].as_array().map(Vec::len),
            "inbox_rows": state["consumer"]["inbox"].as_array().map(Vec::len),
            "effects": state["consumer"]["effects"].as_array().map(Vec::len),
            "projection": state["consumer"]["projection"],
            "flows": state["producer"]["flows"],
        }),
        expected: json!({
            "prune": {"producer": {"removed": 3}, "consumer": {"removed": 3, "fingerprints": 3}},
            // The pruned rows' fingerprints name the held events.
            "receive": {"receipts": [
                receipt(&sent[0], "duplicate"),
                receipt(&sent[1], "duplicate"),
                conflict(&sent[2], "a-1"),
            ]},
            "intruder": {"receipts": [conflict(&other_id, "a-1")]},
            "apply": drained(vec![]),
            "outbox_rows": 0,
            "inbox_rows": 0,
            "effects": 3,
            "projection": [{"flow_id": "a", "producer": "default", "state": "released", "quantity": 5, "applied_seq": 3}],
            "flows": [{"flow_id": "a", "state": "released", "quantity": 5, "last_seq": 3}],
        }),
    })
}

fn status_alerts_on_thresholds(ctx: &Ctx) -> Result<Outcome, String> {
    produce(ctx, T0, "a", 1)?;
    let gapped = envelope("g-2", "g", 2, 1, "confirmed", json!({"amount": 5}));
    let blocked = envelope("b-1", "b", 1, 9, "reserved", json!({"amount": 5}));
    at(ctx, T0, &["init", "--producer", "{P}", "--consumer", "{C}"])?;
    let input = format!("{gapped}\n{blocked}\n");
    let mut receive = ctx.spawn_env(
        &["receive", "--consumer", "{C}"],
        None,
        &[(NOW_ENV, T0.to_string())],
    )?;
    deliver_stdin(&mut receive, input.as_bytes(), "receive")?;
    finish(receive, "receive")?;
    at(ctx, T0, &["apply", "--consumer", "{C}"])?;
    let now = T0 + 120_000;
    let calm = ctx.run_at(now, &["status", "--producer", "{P}", "--consumer", "{C}"])?;
    let alert = ctx.run_at(
        now,
        &[
            "status",
            "--producer",
            "{P}",
            "--consumer",
            "{C}",
            "--max-backlog",
            "0",
            "--max-age",
            "60",
            "--max-blocked",
            "0",
            "--max-quarantined",
            "0",
        ],
    )?;
    Ok(Outcome {
        observed: json!({"calm_exit_code": calm.code, "calm": without_store_ids(calm.json), "alert_exit_code": alert.code, "breaches": alert.json["breaches"]}),
        expected: json!({
            "calm_exit_code": 0,
            "calm": {
                "producer": {"backlog": 1, "oldest_pending_age_s": 120.0, "quarantined": 0, "rewound": 0, "backing_off": 0,
                    "destinations": {"default": {"backlog": 1, "oldest_pending_age_s": 120.0, "quarantined": 0, "rewound": 0, "backing_off": 0}}},
                "consumer": {
                    "pending": 1,
                    "blocked": {"total": 1, "by_reason": {"unsupported_schema": 1}},
                    "gaps": [{"flow_id": "g", "producer": "default", "missing_seq": 1, "since_ms": T0, "waiting_s": 120.0}],
                    "gaps_total": 1,
                    "applied": 0,
                    "skipped": 0,
                    "effects": {"pending": 0, "in_flight": 0, "succeeded": 0, "failed": 0,
                        "outcome_unknown": 0, "skipped": 0, "oldest_pending_age_s": null},
                },
                "breaches": [],
                "ok": true,
            },
            "alert_exit_code": 3,
            "breaches": [
                {"signal": "backlog", "value": 1, "threshold": 0},
                {"signal": "oldest_pending_age_s", "value": 120.0, "threshold": 60},
                {"signal": "blocked", "value": 1, "threshold": 0},
            ],
        }),
    })
}
