//! The 22 scenarios of docs/PROTOCOL.md section 10. Each runs real `ordo` child
//! processes on its own two stores and returns what it observed and what the
//! protocol expects. Neither records race winners, process ids, paths or
//! times.

use ordo_core::crash;
use serde_json::{json, Value};

use super::child::{deliver_stdin, finish, Ctx, ADVANCE_RESERVED, APPLY, RELAY};
use super::expect::{conflict, envelope, event, receipt, Expect, STEPS};

/// What a scenario saw, and what it should have seen.
pub struct Outcome {
    pub observed: Value,
    pub expected: Value,
}

pub type ScenarioFn = fn(&Ctx) -> Result<Outcome, String>;

/// Every scenario of the seed's experiment, in the protocol's order.
pub const SEED: [(&str, ScenarioFn); 22] = [
    ("happy_path", happy_path),
    ("duplicate_delivery", duplicate_delivery),
    ("conflict_same_event_id", conflict_same_event_id),
    ("conflict_same_flow_seq", conflict_same_flow_seq),
    ("out_of_order_3_1_2", out_of_order_3_1_2),
    ("unknown_schema_blocked", unknown_schema_blocked),
    ("schema_v2_enabled_later", schema_v2_enabled_later),
    ("invalid_payload_blocked", invalid_payload_blocked),
    ("process_all_isolation", process_all_isolation),
    (
        "default_relay_conflict_can_starve",
        default_relay_conflict_can_starve,
    ),
    ("six_process_concurrency", six_process_concurrency),
    (
        "unsafe_dual_write_loses_event",
        unsafe_dual_write_loses_event,
    ),
    (
        "crash_producer_advance_before_commit",
        crash_producer_advance_before_commit,
    ),
    (
        "crash_producer_advance_after_commit",
        crash_producer_advance_after_commit,
    ),
    ("crash_relay_before_receive", crash_relay_before_receive),
    ("crash_relay_after_receive", crash_relay_after_receive),
    (
        "crash_relay_mark_before_commit",
        crash_relay_mark_before_commit,
    ),
    (
        "crash_consumer_receive_before_commit",
        crash_consumer_receive_before_commit,
    ),
    (
        "crash_consumer_receive_after_commit",
        crash_consumer_receive_after_commit,
    ),
    (
        "crash_consumer_apply_after_projection",
        crash_consumer_apply_after_projection,
    ),
    (
        "crash_consumer_apply_after_effect",
        crash_consumer_apply_after_effect,
    ),
    (
        "crash_consumer_apply_after_commit",
        crash_consumer_apply_after_commit,
    ),
];

const QUANTITY: i64 = 5;

fn committed(event: &Value) -> Value {
    json!({"outcome": "committed", "event": event})
}

fn delivery(flow: &str, seq: i64, receipt: &str) -> Value {
    delivery_of(&format!("{flow}-{seq}"), flow, seq, receipt)
}

/// One delivery of a relay's report, as `relay --json` lists it: a
/// `conflict` with its cause `conflict` (the scenarios deliver one event
/// of a flow a round).
pub(crate) fn delivery_of(event_id: &str, flow: &str, seq: i64, receipt: &str) -> Value {
    let mut delivery =
        json!({"event_id": event_id, "flow_id": flow, "seq": seq, "receipt": receipt});
    if receipt == "conflict" {
        delivery["cause"] = json!("conflict");
    }
    delivery
}

pub(crate) fn relayed(deliveries: Vec<Value>, stop: &str) -> Value {
    let total = deliveries.len();
    json!({"deliveries": deliveries, "stop": stop, "deliveries_total": total, "truncated": false,
           "refused": [], "refused_total": 0, "transient_errors": 0})
}

pub(crate) fn drained(flows: Vec<(&str, u64, &str, Option<&str>)>) -> Value {
    let total = flows.len();
    json!({"flows": flows.into_iter().map(|(flow, applied, stop, reason)| json!({
        "flow_id": flow, "producer": "default", "applied": applied, "stop": stop, "reason": reason,
        "detail": null,
    })).collect::<Vec<_>>(), "flows_total": total, "truncated": false})
}

fn receipts(list: &[Value]) -> Value {
    json!({ "receipts": list })
}

/// Produces `steps` steps of `flow` with the default quantity.
fn produce(ctx: &Ctx, flow: &str, steps: usize) -> Result<Vec<Value>, String> {
    let quantity = QUANTITY.to_string();
    (0..steps)
        .map(|i| ctx.advance(flow, i as i64, STEPS[i], &["--quantity", &quantity]))
        .collect()
}

fn happy_path(ctx: &Ctx) -> Result<Outcome, String> {
    let advances = produce(ctx, "a", 3)?;
    let relay = ctx.relay(&[])?;
    let apply = ctx.apply(&[])?;
    let state = ctx.snapshot()?;
    Ok(Outcome {
        observed: json!({"advances": advances, "relay": relay, "apply": apply, "state": state}),
        expected: json!({
            "advances": (1..=3).map(|s| committed(&event("a", s, STEPS[s as usize - 1], QUANTITY))).collect::<Vec<_>>(),
            "relay": relayed((1..=3).map(|s| delivery("a", s, "accepted")).collect(), "drained"),
            "apply": drained(vec![("a", 3, "idle", None)]),
            "state": Expect::new().delivered_flow("a", QUANTITY, 3).build(),
        }),
    })
}

fn duplicate_delivery(ctx: &Ctx) -> Result<Outcome, String> {
    produce(ctx, "a", 1)?;
    let first = ctx.relay(&[])?;
    let second = ctx.relay(&["--event", "a-1"])?;
    let apply = ctx.apply(&[])?;
    let state = ctx.snapshot()?;
    Ok(Outcome {
        observed: json!({"first": first, "second": second, "apply": apply, "state": state}),
        expected: json!({
            "first": relayed(vec![delivery("a", 1, "accepted")], "drained"),
            "second": relayed(vec![delivery("a", 1, "duplicate")], "drained"),
            "apply": drained(vec![("a", 1, "idle", None)]),
            "state": Expect::new().delivered_flow("a", QUANTITY, 1).build(),
        }),
    })
}

/// Relays a-1, then receives `forged` directly: a conflict that changes
/// nothing in either file.
fn conflict_changes_nothing(ctx: &Ctx, forged: Value) -> Result<Outcome, String> {
    produce(ctx, "a", 1)?;
    ctx.relay(&[])?;
    let receive = ctx.receive(std::slice::from_ref(&forged))?;
    let state = ctx.snapshot()?;
    Ok(Outcome {
        observed: json!({"receive": receive, "state": state}),
        expected: json!({
            "receive": receipts(&[conflict(&forged, "a-1")]),
            "state": Expect::new()
                .flow("a", "reserved", QUANTITY, 1)
                .outbox(&event("a", 1, "reserved", QUANTITY), true)
                .inbox(&event("a", 1, "reserved", QUANTITY), "pending", None)
                .build(),
        }),
    })
}

fn conflict_same_event_id(ctx: &Ctx) -> Result<Outcome, String> {
    let changed_body = json!({"amount": QUANTITY + 1});
    conflict_changes_nothing(ctx, envelope("a-1", "a", 1, 1, "reserved", changed_body))
}

fn conflict_same_flow_seq(ctx: &Ctx) -> Result<Outcome, String> {
    let same_body = json!({"amount": QUANTITY});
    conflict_changes_nothing(ctx, envelope("other-1", "a", 1, 1, "reserved", same_body))
}

/// Three `receive` processes run at once, each blocked on its stdin pipe; the
/// parent releases seq 3, then 1, then 2, waiting for each to finish before
/// releasing the next and applying in between.
fn out_of_order_3_1_2(ctx: &Ctx) -> Result<Outcome, String> {
    produce(ctx, "a", 3)?;
    let events: Vec<Value> = (1..=3)
        .map(|s| event("a", s, STEPS[s as usize - 1], QUANTITY))
        .collect();
    let mut children = Vec::new();
    for _ in 0..3 {
        children.push(Some(ctx.spawn(&["receive", "--consumer", "{C}"], None)?));
    }
    let mut receipts_seen = Vec::new();
    let mut applies = Vec::new();
    for seq in [3usize, 1, 2] {
        let mut child = children[seq - 1]
            .take()
            .expect("each process is released once");
        let what = format!("receive seq {seq}");
        deliver_stdin(
            &mut child,
            format!("{}\n", events[seq - 1]).as_bytes(),
            &what,
        )?;
        let run = finish(child, &what)?;
        if run.code != 0 {
            return Err(format!("{what} exited {}: {}", run.code, run.stderr.trim()));
        }
        receipts_seen.push(run.json);
        applies.push(ctx.apply(&["--flow", "a"])?);
    }
    let state = ctx.snapshot()?;
    let expected_receipts = [3, 1, 2].map(|seq| receipts(&[receipt(&events[seq - 1], "accepted")]));
    Ok(Outcome {
        observed: json!({"receipts": receipts_seen, "applies": applies, "consumer": state["consumer"]}),
        expected: json!({
            "receipts": expected_receipts,
            "applies": [
                drained(vec![("a", 0, "gap", None)]),
                drained(vec![("a", 1, "gap", None)]),
                drained(vec![("a", 2, "idle", None)]),
            ],
            "consumer": Expect::new().applied_flow("a", QUANTITY, 3).build()["consumer"],
        }),
    })
}

fn unknown_schema_blocked(ctx: &Ctx) -> Result<Outcome, String> {
    let sent = envelope("x-1", "x", 1, 9, "reserved", json!({"amount": QUANTITY}));
    let receive = ctx.receive(std::slice::from_ref(&sent))?;
    let apply = ctx.apply(&[])?;
    let apply_v2 = ctx.apply(&["--support-v2"])?;
    let state = ctx.snapshot()?;
    Ok(Outcome {
        observed: json!({"receive": receive, "apply": apply, "apply_v2": apply_v2, "consumer": state["consumer"]}),
        expected: json!({
            "receive": receipts(&[receipt(&sent, "accepted")]),
            "apply": drained(vec![("x", 0, "blocked", Some("unsupported_schema"))]),
            "apply_v2": drained(vec![("x", 0, "blocked", Some("unsupported_schema"))]),
            "consumer": Expect::new().inbox(&sent, "blocked", Some("unsupported_schema")).build()["consumer"],
        }),
    })
}

fn schema_v2_enabled_later(ctx: &Ctx) -> Result<Outcome, String> {
    ctx.advance("a", 0, "reserved", &["--quantity", "5", "--schema", "2"])?;
    ctx.relay(&[])?;
    let before = ctx.apply(&[])?;
    let after = ctx.apply(&["--support-v2"])?;
    let state = ctx.snapshot()?;
    let v2 = envelope("a-1", "a", 1, 2, "reserved", json!({"units": QUANTITY}));
    Ok(Outcome {
        observed: json!({"before": before, "after": after, "state": state}),
        expected: json!({
            "before": drained(vec![("a", 0, "blocked", Some("unsupported_schema"))]),
            "after": drained(vec![("a", 1, "idle", None)]),
            "state": Expect::new()
                .flow("a", "reserved", QUANTITY, 1)
                .outbox(&v2, true)
                .inbox(&v2, "applied", None)
                .projection("a", "reserved", QUANTITY, 1)
                .effect("a", 1, "a-1")
                .build(),
        }),
    })
}

fn invalid_payload_blocked(ctx: &Ctx) -> Result<Outcome, String> {
    let sent = envelope("x-1", "x", 1, 1, "reserved", json!({"amount": 1_000_001}));
    let receive = ctx.receive(std::slice::from_ref(&sent))?;
    let apply = ctx.apply(&[])?;
    let state = ctx.snapshot()?;
    Ok(Outcome {
        observed: json!({"receive": receive, "apply": apply, "consumer": state["consumer"]}),
        expected: json!({
            "receive": receipts(&[receipt(&sent, "accepted")]),
            "apply": drained(vec![("x", 0, "blocked", Some("invalid_payload"))]),
            "consumer": Expect::new().inbox(&sent, "blocked", Some("invalid_payload")).build()["consumer"],
        }),
    })
}

fn process_all_isolation(ctx: &Ctx) -> Result<Outcome, String> {
    let blocked = envelope("b-1", "b", 1, 9, "reserved", json!({"amount": QUANTITY}));
    let gapped = envelope("g-2", "g", 2, 1, "confirmed", json!({"amount": QUANTITY}));
    ctx.receive(&[blocked.clone(), gapped.clone()])?;
    produce(ctx, "h", 3)?;
    ctx.relay(&[])?;
    let apply = ctx.apply(&[])?;
    let state = ctx.snapshot()?;
    let mut expected_consumer = Expect::new()
        .inbox(&blocked, "blocked", Some("unsupported_schema"))
        .inbox(&gapped, "pending", None)
        .applied_flow("h", QUANTITY, 3)
        .build();
    Ok(Outcome {
        observed: json!({"apply": apply, "consumer": state["consumer"]}),
        expected: json!({
            "apply": drained(vec![
                ("b", 0, "blocked", Some("unsupported_schema")),
                ("g", 0, "gap", None),
                ("h", 3, "idle", None),
            ]),
            "consumer": expected_consumer["consumer"].take(),
        }),
    })
}

fn default_relay_conflict_can_starve(ctx: &Ctx) -> Result<Outcome, String> {
    produce(ctx, "a", 1)?;
    produce(ctx, "b", 1)?;
    let forged = envelope(
        "a-1",
        "a",
        1,
        1,
        "reserved",
        json!({"amount": QUANTITY + 1}),
    );
    ctx.receive(std::slice::from_ref(&forged))?;
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(ctx.relay(&["--policy", "first-pending"])?);
    }
    let explicit = ctx.relay(&["--event", "b-1"])?;
    let state = ctx.snapshot()?;
    let conflict = relayed(vec![delivery("a", 1, "conflict")], "drained");
    Ok(Outcome {
        observed: json!({"runs": runs, "explicit": explicit, "state": state}),
        expected: json!({
            "runs": [conflict.clone(), conflict.clone(), conflict],
            "explicit": relayed(vec![delivery("b", 1, "accepted")], "drained"),
            "state": Expect::new()
                .flow("a", "reserved", QUANTITY, 1)
                .flow("b", "reserved", QUANTITY, 1)
                .outbox(&event("a", 1, "reserved", QUANTITY), false)
                .outbox(&event("b", 1, "reserved", QUANTITY), true)
                .inbox(&forged, "pending", None)
                .inbox(&event("b", 1, "reserved", QUANTITY), "pending", None)
                .build(),
        }),
    })
}

const CONCURRENT_FLOWS: [&str; 6] = ["c1", "c2", "c3", "c4", "c5", "c6"];

/// Two producers race on the same flows with the same `expected_seq`, two
/// relays and two appliers run at once. Phases end through marker files the
/// parent writes once the previous phase's processes have exited.
fn six_process_concurrency(ctx: &Ctx) -> Result<Outcome, String> {
    let flows = CONCURRENT_FLOWS.join(",");
    let produced = ctx.dir.join("produced.done");
    let relayed_marker = ctx.dir.join("relayed.done");
    let produced_s = produced.display().to_string();
    let relayed_s = relayed_marker.display().to_string();
    let quantity = QUANTITY.to_string();
    let produce_args = [
        "worker",
        "produce",
        "--producer",
        "{P}",
        "--flows",
        &flows,
        "--quantity",
        &quantity,
    ];
    let relay_args = [
        "worker",
        "relay",
        "--producer",
        "{P}",
        "--consumer",
        "{C}",
        "--until",
        &produced_s,
    ];
    let apply_args = [
        "worker",
        "apply",
        "--consumer",
        "{C}",
        "--until",
        &relayed_s,
    ];
    // Create both files first so that no worker races on creating them.
    ctx.ok(&["init", "--producer", "{P}", "--consumer", "{C}"])?;
    let mut producers = vec![
        ctx.spawn(&produce_args, None)?,
        ctx.spawn(&produce_args, None)?,
    ];
    let mut relays = vec![ctx.spawn(&relay_args, None)?, ctx.spawn(&relay_args, None)?];
    let mut appliers = vec![ctx.spawn(&apply_args, None)?, ctx.spawn(&apply_args, None)?];
    let mut codes = Vec::new();
    let mut committed = 0;
    for (role, group, marker) in [
        ("produce", &mut producers, Some(&produced)),
        ("relay", &mut relays, Some(&relayed_marker)),
        ("apply", &mut appliers, None),
    ] {
        for child in group.drain(..) {
            let run = finish(child, &format!("worker {role}"))?;
            if role == "produce" {
                committed += run.json["committed"].as_u64().unwrap_or(0);
            }
            codes.push(run.code);
        }
        if let Some(marker) = marker {
            std::fs::write(marker, b"done")
                .map_err(|e| format!("cannot write {}: {e}", marker.display()))?;
        }
    }
    let state = ctx.snapshot()?;
    let mut expect = Expect::new();
    for flow in CONCURRENT_FLOWS {
        expect = expect.flow(flow, "released", QUANTITY, 3);
    }
    // The outbox lists events in commit order, which depends on the race; the
    // comparison uses them sorted by flow and seq instead.
    let mut outbox = state["producer"]["outbox"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    outbox.sort_by_key(|row| {
        (
            row["flow_id"].as_str().unwrap_or("").to_owned(),
            row["seq"].as_i64(),
        )
    });
    for flow in CONCURRENT_FLOWS {
        for seq in 1..=3 {
            expect = expect.outbox(&event(flow, seq, STEPS[seq as usize - 1], QUANTITY), true);
        }
    }
    for flow in CONCURRENT_FLOWS {
        expect = expect.applied_flow(flow, QUANTITY, 3);
    }
    let mut expected_state = expect.build();
    let mut observed_state = state;
    observed_state["producer"]["outbox"] = Value::Array(outbox);
    // Effects are listed by flow then seq; applied_flow adds them flow by flow.
    Ok(Outcome {
        observed: json!({"exit_codes": codes, "committed": committed, "state": observed_state.take()}),
        expected: json!({
            "exit_codes": [0, 0, 0, 0, 0, 0],
            "committed": CONCURRENT_FLOWS.len() * 3,
            "state": expected_state.take(),
        }),
    })
}

fn unsafe_dual_write_loses_event(ctx: &Ctx) -> Result<Outcome, String> {
    let run = ctx.run(
        &[
            "worker",
            "unsafe-dual-write",
            "--producer",
            "{P}",
            "--flow",
            "a",
            "--quantity",
            "5",
        ],
        b"",
        None,
    )?;
    let relay = ctx.relay(&[])?;
    let apply = ctx.apply(&[])?;
    let state = ctx.snapshot()?;
    Ok(Outcome {
        observed: json!({"exit_code": run.code, "relay": relay, "apply": apply, "state": state}),
        expected: json!({
            "exit_code": crate::worker::UNSAFE_EXIT_STATUS,
            "relay": relayed(vec![], "drained"),
            "apply": drained(vec![]),
            // The state moved to reserved; no event exists to tell the consumer.
            "state": Expect::new().flow("a", "reserved", QUANTITY, 0).build(),
        }),
    })
}

/// Runs `args` with `point` armed, takes both files, recovers with
/// `recovery` in a fresh process and takes both files again; compares the
/// exit status (73) and the three observations with `expected`
/// (after the crash, the recovery's output, the final state).
fn crash_and_recover(
    ctx: &Ctx,
    args: &[&str],
    point: &str,
    recovery: &[&str],
    expected: [Value; 3],
) -> Result<Outcome, String> {
    let run = ctx.run(args, b"", Some(point))?;
    let after_crash = ctx.snapshot()?;
    let recovered = ctx.ok(recovery)?;
    let state = ctx.snapshot()?;
    let [after_crash_expected, recovery_expected, state_expected] = expected;
    Ok(Outcome {
        observed: json!({"exit_code": run.code, "after_crash": after_crash, "recovery": recovered, "state": state}),
        expected: json!({
            "exit_code": crash::CRASH_EXIT_STATUS,
            "after_crash": after_crash_expected,
            "recovery": recovery_expected,
            "state": state_expected,
        }),
    })
}

fn reserved_flow() -> Expect {
    Expect::new().flow("a", "reserved", QUANTITY, 1)
}

fn crash_producer_advance_before_commit(ctx: &Ctx) -> Result<Outcome, String> {
    let e1 = event("a", 1, "reserved", QUANTITY);
    crash_and_recover(
        ctx,
        &ADVANCE_RESERVED,
        crash::PRODUCER_ADVANCE_BEFORE_COMMIT,
        &ADVANCE_RESERVED,
        [
            Expect::new().build(),
            committed(&e1),
            reserved_flow().outbox(&e1, false).build(),
        ],
    )
}

fn crash_producer_advance_after_commit(ctx: &Ctx) -> Result<Outcome, String> {
    let e1 = event("a", 1, "reserved", QUANTITY);
    let expected_state = reserved_flow().outbox(&e1, false).build();
    crash_and_recover(
        ctx,
        &ADVANCE_RESERVED,
        crash::PRODUCER_ADVANCE_AFTER_COMMIT,
        &ADVANCE_RESERVED,
        [
            expected_state.clone(),
            json!({"outcome": "stale", "last_seq": 1}),
            expected_state,
        ],
    )
}

/// A relay crashed at `point` after producing one event; the next relay recovers.
fn relay_crash(ctx: &Ctx, point: &str, stored: bool, receipt: &str) -> Result<Outcome, String> {
    ctx.ok(&ADVANCE_RESERVED)?;
    let e1 = event("a", 1, "reserved", QUANTITY);
    let mut after = reserved_flow().outbox(&e1, false);
    if stored {
        after = after.inbox(&e1, "pending", None);
    }
    crash_and_recover(
        ctx,
        &RELAY,
        point,
        &RELAY,
        [
            after.build(),
            relayed(vec![delivery("a", 1, receipt)], "drained"),
            reserved_flow()
                .outbox(&e1, true)
                .inbox(&e1, "pending", None)
                .build(),
        ],
    )
}

fn crash_relay_before_receive(ctx: &Ctx) -> Result<Outcome, String> {
    relay_crash(ctx, crash::RELAY_BEFORE_RECEIVE, false, "accepted")
}

fn crash_relay_after_receive(ctx: &Ctx) -> Result<Outcome, String> {
    relay_crash(ctx, crash::RELAY_AFTER_RECEIVE, true, "duplicate")
}

fn crash_relay_mark_before_commit(ctx: &Ctx) -> Result<Outcome, String> {
    relay_crash(ctx, crash::RELAY_MARK_BEFORE_COMMIT, true, "duplicate")
}

fn crash_consumer_receive_before_commit(ctx: &Ctx) -> Result<Outcome, String> {
    relay_crash(
        ctx,
        crash::CONSUMER_RECEIVE_BEFORE_COMMIT,
        false,
        "accepted",
    )
}

fn crash_consumer_receive_after_commit(ctx: &Ctx) -> Result<Outcome, String> {
    relay_crash(ctx, crash::CONSUMER_RECEIVE_AFTER_COMMIT, true, "duplicate")
}

/// An apply crashed at `point` inside its transaction: everything rolls back
/// and the next apply applies once.
fn apply_rollback_crash(ctx: &Ctx, point: &str) -> Result<Outcome, String> {
    ctx.ok(&ADVANCE_RESERVED)?;
    ctx.ok(&RELAY)?;
    let e1 = event("a", 1, "reserved", QUANTITY);
    crash_and_recover(
        ctx,
        &APPLY,
        point,
        &APPLY,
        [
            reserved_flow()
                .outbox(&e1, true)
                .inbox(&e1, "pending", None)
                .build(),
            drained(vec![("a", 1, "idle", None)]),
            Expect::new().delivered_flow("a", QUANTITY, 1).build(),
        ],
    )
}

fn crash_consumer_apply_after_projection(ctx: &Ctx) -> Result<Outcome, String> {
    apply_rollback_crash(ctx, crash::CONSUMER_APPLY_AFTER_PROJECTION)
}

fn crash_consumer_apply_after_effect(ctx: &Ctx) -> Result<Outcome, String> {
    apply_rollback_crash(ctx, crash::CONSUMER_APPLY_AFTER_EFFECT)
}

fn crash_consumer_apply_after_commit(ctx: &Ctx) -> Result<Outcome, String> {
    produce(ctx, "a", 2)?;
    ctx.ok(&RELAY)?;
    let e1 = event("a", 1, "reserved", QUANTITY);
    let e2 = event("a", 2, "confirmed", QUANTITY);
    crash_and_recover(
        ctx,
        // One event per transaction, so the crash falls between the two events.
        &["apply", "--consumer", "{C}", "--batch", "1"],
        crash::CONSUMER_APPLY_AFTER_COMMIT,
        &APPLY,
        [
            Expect::new()
                .flow("a", "confirmed", QUANTITY, 2)
                .outbox(&e1, true)
                .outbox(&e2, true)
                .inbox(&e1, "applied", None)
                .inbox(&e2, "pending", None)
                .projection("a", "reserved", QUANTITY, 1)
                .effect("a", 1, "a-1")
                .build(),
            drained(vec![("a", 1, "idle", None)]),
            Expect::new().delivered_flow("a", QUANTITY, 2).build(),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_crash_point_has_its_scenario() {
        let all = super::super::scenario_names();
        for point in crash::CRASH_POINTS {
            let name = format!("crash_{}", point.replace('.', "_"));
            assert!(all.iter().any(|(_, n)| *n == name), "no scenario {name}");
        }
        let mut every: Vec<&str> = all.iter().map(|(_, n)| n.as_str()).collect();
        every.sort_unstable();
        every.dedup();
        assert_eq!(every.len(), all.len(), "scenario names are unique");
        let hops = crate::transports::networked().count();
        assert_eq!(all.len(), 22 + 6 + 2 * hops + 5);
        let mut names: Vec<&str> = SEED.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 22);
    }
}
