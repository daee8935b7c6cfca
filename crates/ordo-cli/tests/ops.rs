//! Process-level tests of the operator commands (README "JSON added to the
//! contract" and "Operating ordo"): `outbox list|retry`, `inbox
//! list|retry|skip|repairs`, `status`, `prune` and `--busy-timeout-ms`, on
//! the real binary and real SQLite files, with the clock fixed by
//! `ORDO_NOW_MS` so that every time in the output is exact.

mod common;

#[allow(unused_imports)]
use ordo_reservation::ReservationProducer;
use std::time::{Duration, Instant};

use common::{assert_applied, envelope, keys, reservation, sorted, without_store_ids, Lab, Out};
use ordo_core::envelope::FIELDS as ENVELOPE_KEYS;
use ordo_sqlite::rusqlite;
use serde_json::{json, Value};

/// The fixed "now" most tests start at (ms since the epoch).
const T0: i64 = 1_700_000_000_000;
const SECOND: i64 = 1_000;
const MINUTE: i64 = 60 * SECOND;
const HOUR: i64 = 60 * MINUTE;
const DAY: i64 = 24 * HOUR;

/// The reason the producer records on an event quarantined by a conflict.
const CONFLICT_REASON: &str = "conflict: the consumer holds a different body under this event id, or another event id at this (flow_id, seq)";

/// A lab whose every command runs at a controlled time.
struct Ops {
    lab: Lab,
}

impl Ops {
    fn new() -> Ops {
        let lab = Lab::new();
        lab.at(T0);
        Ops { lab }
    }

    /// Sets the clock of the following commands.
    fn at(&self, now_ms: i64) -> &Ops {
        self.lab.at(now_ms);
        self
    }

    fn p(&self) -> &str {
        &self.lab.p
    }

    fn c(&self) -> &str {
        &self.lab.c
    }

    fn run(&self, args: &[&str]) -> Out {
        self.lab.run(args)
    }

    /// `ordo ARGS --json`, expected to exit 0; its JSON.
    #[track_caller]
    fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        self.run(&args).json()
    }

    /// `ordo advance`, expected to commit.
    #[track_caller]
    fn advance(&self, flow: &str, expected_seq: i64, to: &str, quantity: Option<i64>) {
        let out = self.lab.advance(flow, expected_seq, to, quantity);
        assert_eq!(out["outcome"], "committed", "{out}");
    }

    /// Advances `flow` through all three steps.
    #[track_caller]
    fn full_flow(&self, flow: &str, quantity: i64) {
        self.lab.full_flow(flow, quantity);
    }

    #[track_caller]
    fn relay(&self, extra: &[&str]) -> Value {
        self.lab.relay(extra)
    }

    /// `ordo receive` with one envelope per line.
    #[track_caller]
    fn receive(&self, envelopes: &[String]) -> Value {
        self.lab.receive(&envelopes.join("\n"))
    }

    #[track_caller]
    fn apply(&self, extra: &[&str]) -> Value {
        self.lab.apply(extra)
    }

    #[track_caller]
    fn snapshot(&self) -> Value {
        self.lab.snapshot()
    }

    /// `ordo outbox <command> --json` on the producer, or `ordo inbox
    /// <command> --json` on the consumer, with extra arguments (any exit
    /// status).
    fn store_out(&self, store: &str, command: &str, extra: &[&str]) -> Out {
        let (flag, path) = match store {
            "outbox" => ("--producer", self.p()),
            _ => ("--consumer", self.c()),
        };
        let mut args = vec![store, command, "--json", flag, path];
        args.extend_from_slice(extra);
        self.run(&args)
    }

    /// The rows of `ordo outbox list`.
    #[track_caller]
    fn outbox(&self, extra: &[&str]) -> Value {
        only_key(self.store_out("outbox", "list", extra).json(), "outbox")
    }

    /// The rows of `ordo inbox list`.
    #[track_caller]
    fn inbox(&self, extra: &[&str]) -> Value {
        only_key(self.store_out("inbox", "list", extra).json(), "inbox")
    }

    /// The entries of `ordo inbox repairs`.
    #[track_caller]
    fn repairs(&self) -> Value {
        only_key(
            self.json(&["inbox", "repairs", "--consumer", self.c()]),
            "repairs",
        )
    }

    /// `ordo status --json` with extra arguments (any exit status).
    fn status_out(&self, extra: &[&str]) -> Out {
        self.lab.run_both("status", extra)
    }

    /// `ordo status --json`, expected to exit 0, without the stores'
    /// identities ([`without_store_ids`]).
    #[track_caller]
    fn status(&self) -> Value {
        without_store_ids(self.status_out(&[]).json())
    }

    /// `ordo prune --older-than D --json` (any exit status).
    fn prune_out(&self, older_than: &str) -> Out {
        self.lab.run_both("prune", &["--older-than", older_than])
    }

    /// `ordo inbox skip --json` with these flags (any exit status).
    fn skip_flags_out(&self, flags: &[(&str, &str)]) -> Out {
        let args: Vec<&str> = flags.iter().flat_map(|(f, v)| [*f, *v]).collect();
        self.store_out("inbox", "skip", &args)
    }

    /// `ordo inbox skip --json` (any exit status).
    fn skip_out(&self, flow: &str, seq: &str, reason: &str, by: &str) -> Out {
        self.skip_flags_out(&[
            ("--flow", flow),
            ("--seq", seq),
            ("--reason", reason),
            ("--by", by),
        ])
    }
}

/// The one member of `out`, which must be named `key`.
#[track_caller]
fn only_key(out: Value, key: &str) -> Value {
    assert_eq!(keys(&out), [key], "{out}");
    out[key].clone()
}

/// The `key` of every row, in order.
#[track_caller]
fn column<'v>(rows: &'v Value, key: &str) -> Vec<&'v Value> {
    rows.as_array()
        .unwrap_or_else(|| panic!("not an array: {rows}"))
        .iter()
        .map(|r| &r[key])
        .collect()
}

/// The event ids of the rows, in order.
#[track_caller]
fn ids(rows: &Value) -> Vec<&str> {
    column(rows, "event_id")
        .into_iter()
        .map(|v| v.as_str().expect("event_id is a string"))
        .collect()
}

/// The row of `rows` whose `event_id` is `id`.
#[track_caller]
fn row<'v>(rows: &'v Value, id: &str) -> &'v Value {
    common::row(rows, "event_id", id)
}

/// Asserts the `skipped` and `applied` counts of `ordo status`.
#[track_caller]
fn assert_settled(ops: &Ops, skipped: i64, applied: i64) {
    let status = ops.status();
    assert_eq!(status["consumer"]["skipped"], json!(skipped));
    assert_eq!(status["consumer"]["applied"], json!(applied));
}

/// Asserts that two snapshots hold the same projection and effects.
#[track_caller]
fn assert_same_applied(snapshot: &Value, before: &Value) {
    assert_eq!(
        snapshot["consumer"]["projection"],
        before["consumer"]["projection"]
    );
    assert_eq!(
        snapshot["consumer"]["effects"],
        before["consumer"]["effects"]
    );
}

/// Every number as an f64, so that `2` and `2.0` compare equal while the
/// values themselves are compared exactly.
fn numbers_as_f64(value: &Value) -> Value {
    match value {
        Value::Number(n) => json!(n.as_f64().expect("a finite number")),
        Value::Array(items) => Value::Array(items.iter().map(numbers_as_f64).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), numbers_as_f64(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[track_caller]
fn assert_same_numbers(actual: &Value, expected: &Value) {
    assert_eq!(
        numbers_as_f64(actual),
        numbers_as_f64(expected),
        "\nactual:   {actual}\nexpected: {expected}"
    );
}

/// `receive`'s receipt of an envelope of the default producer (CLI.md).
fn receipt(event_id: &str, flow_id: &str, seq: i64, receipt: &str) -> Value {
    json!({"event_id": event_id, "flow_id": flow_id, "seq": seq, "producer": "default", "receipt": receipt})
}

/// `receive`'s `conflict` receipt of cause `conflict`, naming the held event.
fn conflict(event_id: &str, flow_id: &str, seq: i64, held: Option<&str>) -> Value {
    let mut value = receipt(event_id, flow_id, seq, "conflict");
    value["cause"] = json!("conflict");
    value["held_event_id"] = json!(held);
    value
}

fn reserved(flow: &str, seq: i64, amount: i64) -> String {
    reservation(flow, seq, "reserved", amount)
}

fn confirmed(flow: &str, seq: i64, amount: i64) -> String {
    reservation(flow, seq, "confirmed", amount)
}

fn released(flow: &str, seq: i64, amount: i64) -> String {
    reservation(flow, seq, "released", amount)
}

/// A schema-2 reservation (`{"units": q}`).
fn reserved_v2(flow: &str, seq: i64, units: i64) -> String {
    envelope(
        &format!("{flow}-{seq}"),
        flow,
        seq,
        2,
        "reserved",
        json!({ "units": units }),
    )
}

// ---------------------------------------------------------------- outbox

/// A-1 quarantined (the consumer already holds a different A-1), B-1 and
/// A-2 accepted, C-1 pending (committed after the relay).
fn quarantine_lab() -> Ops {
    let ops = Ops::new();
    ops.at(T0).advance("A", 0, "reserved", Some(5));
    ops.at(T0 + 100).advance("B", 0, "reserved", Some(2));
    ops.at(T0 + 200).advance("A", 1, "confirmed", None);
    let receipts = ops.at(T0 + 300).receive(&[reserved("A", 1, 9)]);
    assert_eq!(
        receipts,
        json!({"receipts": [receipt("A-1", "A", 1, "accepted")]})
    );
    let relay = ops.at(T0 + 400).relay(&[]);
    let mut deliveries: Vec<(String, String)> = relay["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["event_id"].as_str().unwrap().to_owned(),
                d["receipt"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    deliveries.sort();
    assert_eq!(
        deliveries,
        [
            ("A-1".to_owned(), "conflict".to_owned()),
            ("B-1".to_owned(), "accepted".to_owned()),
        ],
        "a flow whose head got a conflict is skipped for the rest of the run: {relay}"
    );
    // The next run hands over the rest of A: custody moves past the
    // quarantined event, apply keeps the order.
    assert_eq!(
        ops.at(T0 + 450).relay(&[]),
        json!({"deliveries": [{"event_id": "A-2", "flow_id": "A", "seq": 2, "receipt": "accepted"}], "stop": "drained", "deliveries_total": 1, "truncated": false, "refused": [], "refused_total": 0, "transient_errors": 0})
    );
    ops.at(T0 + 500).advance("C", 0, "reserved", Some(1));
    ops
}

#[test]
fn outbox_list_shows_every_row_with_its_bookkeeping() {
    let ops = quarantine_lab();
    let all = ops.at(T0 + 600).outbox(&[]);
    assert_eq!(ids(&all), ["A-1", "B-1", "A-2", "C-1"], "oldest first");
    let mut expected_keys = ENVELOPE_KEYS.to_vec();
    expected_keys.extend([
        "accepted",
        "quarantined",
        "quarantine_reason",
        "quarantine_detail",
        "destinations",
        "attempts",
        "last_outcome",
        "last_error",
        "next_attempt_at_ms",
        "created_at_ms",
        "accepted_at_ms",
    ]);
    for r in all.as_array().unwrap() {
        assert_eq!(keys(r), sorted(&expected_keys), "{r}");
    }
    assert_eq!(
        row(&all, "A-1")["destinations"],
        json!({"default": {
            "accepted": false, "accepted_at_ms": null, "attempts": 1,
            "last_outcome": "conflict", "last_error": null, "next_attempt_at_ms": 0,
            "quarantined": true, "quarantine_reason": "conflict",
            "quarantine_detail": CONFLICT_REASON, "abandoned": false,
        }}),
        "one destination, default"
    );
    let all = json!(all
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.as_object_mut().unwrap().remove("destinations");
            r
        })
        .collect::<Vec<_>>());
    assert_eq!(
        row(&all, "A-1"),
        &json!({
            "event_id": "A-1", "flow_id": "A", "seq": 1, "schema_version": 1,
            "type": "reserved", "payload": {"amount": 5},
            "accepted": false, "quarantined": true, "quarantine_reason": "conflict",
            "quarantine_detail": CONFLICT_REASON,
            "attempts": 1, "last_outcome": "conflict", "last_error": null,
            "next_attempt_at_ms": 0, "created_at_ms": T0, "accepted_at_ms": null,
        })
    );
    assert_eq!(
        row(&all, "B-1"),
        &json!({
            "event_id": "B-1", "flow_id": "B", "seq": 1, "schema_version": 1,
            "type": "reserved", "payload": {"amount": 2},
            "accepted": true, "quarantined": false, "quarantine_reason": null,
            "quarantine_detail": null, "attempts": 1, "last_outcome": "accepted", "last_error": null,
            "next_attempt_at_ms": 0, "created_at_ms": T0 + 100, "accepted_at_ms": T0 + 400,
        })
    );
    assert_eq!(row(&all, "A-2")["accepted"], json!(true));
    assert_eq!(row(&all, "A-2")["payload"], json!({"amount": 5}));
    assert_eq!(row(&all, "A-2")["type"], "confirmed");
    assert_eq!(
        row(&all, "C-1"),
        &json!({
            "event_id": "C-1", "flow_id": "C", "seq": 1, "schema_version": 1,
            "type": "reserved", "payload": {"amount": 1},
            "accepted": false, "quarantined": false, "quarantine_reason": null,
            "quarantine_detail": null, "attempts": 0, "last_outcome": null, "last_error": null,
            "next_attempt_at_ms": 0, "created_at_ms": T0 + 500, "accepted_at_ms": null,
        })
    );

    let quarantined = ops.outbox(&["--quarantined"]);
    assert_eq!(ids(&quarantined), ["A-1"]);
    assert_eq!(quarantined[0]["quarantine_detail"], CONFLICT_REASON);
    assert_eq!(ids(&ops.outbox(&["--limit", "2"])), ["A-1", "B-1"]);
    assert_eq!(ids(&ops.outbox(&["--limit", "1"])), ["A-1"]);
    assert_eq!(
        ids(&ops.outbox(&["--limit", "4"])),
        ["A-1", "B-1", "A-2", "C-1"]
    );
    assert_eq!(
        ids(&ops.outbox(&["--limit", "1", "--quarantined"])),
        ["A-1"]
    );

    let text = ops.run(&["outbox", "list", "--producer", ops.p()]);
    let lines: Vec<&str> = text.text().lines().collect();
    assert_eq!(
        lines,
        [
            format!(
                "A-1 A seq 1 reserved: QUARANTINED ({CONFLICT_REASON}), attempts 1, last conflict"
            ),
            "B-1 B seq 1 reserved: accepted, attempts 1, last accepted".to_owned(),
            "A-2 A seq 2 confirmed: accepted, attempts 1, last accepted".to_owned(),
            "C-1 C seq 1 reserved: pending, attempts 0, last -".to_owned(),
            "4 rows".to_owned(),
        ]
    );

    let before = ops.lab.files();
    for bad in ["0", "-1", "abc"] {
        ops.store_out("outbox", "list", &["--limit", bad])
            .usage("--limit");
    }
    ops.lab
        .files()
        .assert_unchanged(&before, "outbox list --limit");
}

#[test]
fn outbox_retry_clears_a_quarantine_and_the_relay_tries_once_more() {
    let ops = quarantine_lab();
    // Never retried automatically, however late.
    assert_eq!(
        ops.at(T0 + DAY).relay(&["--event", "C-1"])["deliveries"][0]["receipt"],
        "accepted"
    );
    assert_eq!(
        ops.relay(&[]),
        json!({"deliveries": [], "stop": "drained", "deliveries_total": 0, "truncated": false, "refused": [], "refused_total": 0, "transient_errors": 0}),
        "a quarantined event was retried automatically"
    );
    assert_eq!(row(&ops.outbox(&[]), "A-1")["attempts"], json!(1));

    let retried = ops.store_out("outbox", "retry", &["A-1"]).json();
    assert_eq!(retried, json!({"event_id": "A-1", "retried": true}));
    assert_eq!(ops.outbox(&["--quarantined"]), json!([]));
    let a1 = row(&ops.outbox(&[]), "A-1").clone();
    assert_eq!(a1["quarantined"], json!(false));
    assert_eq!(a1["quarantine_reason"], json!(null));
    assert_eq!(a1["accepted"], json!(false));
    assert_eq!(a1["attempts"], json!(1));
    let status = ops.status();
    assert_eq!(status["producer"]["quarantined"], json!(0));
    assert_eq!(status["producer"]["backlog"], json!(1));

    // The relay tries it exactly once more: the consumer still holds the
    // other body, so it is quarantined again.
    assert_eq!(
        ops.at(T0 + DAY + 1).relay(&[]),
        json!({"deliveries": [{"event_id": "A-1", "flow_id": "A", "seq": 1, "receipt": "conflict", "cause": "conflict"}], "stop": "drained", "deliveries_total": 1, "truncated": false, "refused": [], "refused_total": 0, "transient_errors": 0})
    );
    let a1 = row(&ops.outbox(&["--quarantined"]), "A-1").clone();
    assert_eq!(a1["attempts"], json!(2));
    assert_eq!(a1["last_outcome"], "conflict");
    assert_eq!(a1["quarantine_reason"], "conflict");
    assert_eq!(a1["quarantine_detail"], CONFLICT_REASON);
    assert_eq!(
        ops.relay(&[]),
        json!({"deliveries": [], "stop": "drained", "deliveries_total": 0, "truncated": false, "refused": [], "refused_total": 0, "transient_errors": 0})
    );

    // Text output.
    let out = ops.run(&["outbox", "retry", "--producer", ops.p(), "A-1"]);
    assert_eq!(
        out.text(),
        "A-1: quarantine cleared; the next relay tries it once more\n"
    );
    assert_eq!(out.stderr, "");
}

#[test]
fn outbox_retry_of_an_unknown_or_unquarantined_event_exits_2_and_changes_nothing() {
    // No producer file: refused without creating one.
    let fresh = Ops::new();
    fresh
        .store_out("outbox", "retry", &["A-1"])
        .usage("A-1: no such event in the outbox");
    fresh.lab.assert_no_files();

    let ops = quarantine_lab();
    let before = ops.lab.files();
    let snapshot = ops.snapshot();
    let outbox = ops.outbox(&[]);
    for (id, message) in [
        ("Z-1", "error: Z-1: no such event in the outbox"),
        ("B-1", "error: B-1 is not quarantined"),
        ("A-2", "error: A-2 is not quarantined"),
        ("C-1", "error: C-1 is not quarantined"),
    ] {
        let out = ops.store_out("outbox", "retry", &[id]);
        out.usage(id);
        assert_eq!(out.stderr.trim_end(), message);
    }
    ops.store_out("outbox", "retry", &[""]).usage("EVENT_ID");
    ops.store_out("outbox", "retry", &[]).usage("EVENT_ID");
    ops.lab.files().assert_unchanged(&before, "refused retry");
    assert_eq!(ops.snapshot(), snapshot);
    assert_eq!(ops.outbox(&[]), outbox);
}

// ---------------------------------------------------------------- inbox

/// x: a schema-2 reservation then a confirmation (blocked for
/// unsupported_schema); y: a confirmation on a new flow (blocked,
/// invalid_transition); z: seq 2 only (gap). Received at T0, applied at
/// T0 + 1 s.
fn blocked_lab() -> Ops {
    let ops = Ops::new();
    ops.at(T0).receive(&[
        reserved_v2("x", 1, 3),
        confirmed("x", 2, 3),
        confirmed("y", 1, 3),
        confirmed("z", 2, 3),
    ]);
    let applied = ops.at(T0 + SECOND).apply(&[]);
    assert_eq!(
        applied,
        json!({"flows": [
            {"flow_id": "x", "producer": "default", "applied": 0, "stop": "blocked", "reason": "unsupported_schema", "detail": null},
            {"flow_id": "y", "producer": "default", "applied": 0, "stop": "blocked", "reason": "invalid_transition", "detail": null},
            {"flow_id": "z", "producer": "default", "applied": 0, "stop": "gap", "reason": null, "detail": null},
        ], "flows_total": 3, "truncated": false})
    );
    ops
}

#[test]
fn inbox_list_filters_blocked_rows_flows_and_limits() {
    let ops = blocked_lab();
    let all = ops.inbox(&[]);
    assert_eq!(ids(&all), ["x-1", "x-2", "y-1", "z-2"], "by flow and seq");
    let mut expected_keys = ENVELOPE_KEYS.to_vec();
    expected_keys.extend([
        "status",
        "reason",
        "detail",
        "received_at_ms",
        "settled_at_ms",
        "producer",
        "store_id",
    ]);
    for r in all.as_array().unwrap() {
        assert_eq!(keys(r), sorted(&expected_keys), "{r}");
    }
    assert_eq!(
        all,
        json!([
            {"event_id": "x-1", "flow_id": "x", "seq": 1, "schema_version": 2, "type": "reserved",
             "payload": {"units": 3}, "status": "blocked", "reason": "unsupported_schema", "detail": null,
             "received_at_ms": T0, "settled_at_ms": null, "producer": "default", "store_id": null},
            {"event_id": "x-2", "flow_id": "x", "seq": 2, "schema_version": 1, "type": "confirmed",
             "payload": {"amount": 3}, "status": "pending", "reason": null, "detail": null,
             "received_at_ms": T0, "settled_at_ms": null, "producer": "default", "store_id": null},
            {"event_id": "y-1", "flow_id": "y", "seq": 1, "schema_version": 1, "type": "confirmed",
             "payload": {"amount": 3}, "status": "blocked", "reason": "invalid_transition", "detail": null,
             "received_at_ms": T0, "settled_at_ms": null, "producer": "default", "store_id": null},
            {"event_id": "z-2", "flow_id": "z", "seq": 2, "schema_version": 1, "type": "confirmed",
             "payload": {"amount": 3}, "status": "pending", "reason": null, "detail": null,
             "received_at_ms": T0, "settled_at_ms": null, "producer": "default", "store_id": null},
        ])
    );

    let blocked = ops.inbox(&["--blocked"]);
    assert_eq!(ids(&blocked), ["x-1", "y-1"]);
    assert_eq!(
        column(&blocked, "reason"),
        [&json!("unsupported_schema"), &json!("invalid_transition")]
    );
    assert_eq!(ids(&ops.inbox(&["--flow", "x"])), ["x-1", "x-2"]);
    assert_eq!(ids(&ops.inbox(&["--flow", "x", "--limit", "1"])), ["x-1"]);
    assert_eq!(ids(&ops.inbox(&["--flow", "z"])), ["z-2"]);
    assert_eq!(ids(&ops.inbox(&["--blocked", "--flow", "y"])), ["y-1"]);
    assert_eq!(ops.inbox(&["--blocked", "--flow", "z"]), json!([]));
    assert_eq!(ops.inbox(&["--flow", "nope"]), json!([]));
    assert_eq!(ids(&ops.inbox(&["--limit", "3"])), ["x-1", "x-2", "y-1"]);
    assert_eq!(ids(&ops.inbox(&["--blocked", "--limit", "1"])), ["x-1"]);

    let text = ops.run(&["inbox", "list", "--consumer", ops.c()]);
    assert_eq!(
        text.text().lines().collect::<Vec<_>>(),
        [
            "x-1 x seq 1 reserved: blocked (unsupported_schema)",
            "x-2 x seq 2 confirmed: pending",
            "y-1 y seq 1 confirmed: blocked (invalid_transition)",
            "z-2 z seq 2 confirmed: pending",
            "4 rows",
        ]
    );

    let before = ops.lab.files();
    for bad in ["0", "-1", "x"] {
        ops.store_out("inbox", "list", &["--limit", bad])
            .usage("--limit");
    }
    ops.store_out("inbox", "list", &["--flow", ""])
        .usage("--flow");
    ops.lab.files().assert_unchanged(&before, "inbox list");
}

#[test]
fn inbox_retry_applies_a_schema_2_row_as_stored_only_with_support_v2() {
    let ops = blocked_lab();
    let retry = |flow_and_extra: &[&str]| {
        ops.store_out("inbox", "retry", &[&["--flow"], flow_and_extra].concat())
            .json()
    };

    // Without --support-v2 the row is re-evaluated and blocked again.
    let out =
        ops.at(T0 + 2 * SECOND)
            .run(&["inbox", "retry", "--consumer", ops.c(), "--flow", "x"]);
    assert_eq!(
        out.text(),
        "x: reopened 1 blocked rows, applied 0, stop blocked (unsupported_schema)\n"
    );
    assert_eq!(
        retry(&["x"]),
        json!({"flow_id": "x", "producer": "default", "reopened": 1, "applied": 0, "stop": "blocked", "reason": "unsupported_schema", "detail": null})
    );
    let x = ops.inbox(&["--flow", "x"]);
    assert_eq!(column(&x, "status"), [&json!("blocked"), &json!("pending")]);
    assert_eq!(column(&x, "reason")[0], &json!("unsupported_schema"));
    assert_eq!(column(&x, "settled_at_ms"), [&json!(null), &json!(null)]);

    // With it, the stored schema-2 row is applied as stored, and the flow continues.
    ops.at(T0 + 3 * SECOND);
    assert_eq!(
        retry(&["x", "--support-v2"]),
        json!({"flow_id": "x", "producer": "default", "reopened": 1, "applied": 2, "stop": "idle", "reason": null, "detail": null})
    );
    assert_eq!(
        ops.inbox(&["--flow", "x"]),
        json!([
            {"event_id": "x-1", "flow_id": "x", "seq": 1, "schema_version": 2, "type": "reserved",
             "payload": {"units": 3}, "status": "applied", "reason": null, "detail": null,
             "received_at_ms": T0, "settled_at_ms": T0 + 3 * SECOND, "producer": "default", "store_id": null},
            {"event_id": "x-2", "flow_id": "x", "seq": 2, "schema_version": 1, "type": "confirmed",
             "payload": {"amount": 3}, "status": "applied", "reason": null, "detail": null,
             "received_at_ms": T0, "settled_at_ms": T0 + 3 * SECOND, "producer": "default", "store_id": null},
        ])
    );
    let snapshot = ops.snapshot();
    assert_applied(
        &snapshot,
        json!([{"flow_id": "x", "producer": "default", "state": "confirmed", "quantity": 3, "applied_seq": 2}]),
        &[("x", 1), ("x", 2)],
    );
    // Nothing blocked left on x: nothing reopened, nothing applied twice.
    assert_eq!(
        retry(&["x", "--support-v2"]),
        json!({"flow_id": "x", "producer": "default", "reopened": 0, "applied": 0, "stop": "idle", "reason": null, "detail": null})
    );

    // A row that stays invalid is blocked again with its reason.
    assert_eq!(
        retry(&["y", "--support-v2"]),
        json!({"flow_id": "y", "producer": "default", "reopened": 1, "applied": 0, "stop": "blocked", "reason": "invalid_transition", "detail": null})
    );
    let y = ops.inbox(&["--flow", "y"]);
    assert_eq!(column(&y, "status"), [&json!("blocked")]);
    assert_eq!(column(&y, "reason"), [&json!("invalid_transition")]);
    // A gap stays a gap.
    assert_eq!(
        retry(&["z"]),
        json!({"flow_id": "z", "producer": "default", "reopened": 0, "applied": 0, "stop": "gap", "reason": null, "detail": null})
    );
    assert_eq!(
        ops.snapshot()["consumer"]["effects"],
        snapshot["consumer"]["effects"]
    );

    let before = ops.lab.files();
    ops.store_out("inbox", "retry", &["--flow", ""])
        .usage("--flow");
    ops.store_out("inbox", "retry", &[]).usage("--flow");
    ops.lab.files().assert_unchanged(&before, "inbox retry");
}

/// w: seq 1 applied, seq 2 a second `reserved` (blocked,
/// invalid_transition), seqs 3 and 4 pending behind it; g: seq 2 only (gap).
fn skip_lab() -> Ops {
    let ops = Ops::new();
    ops.at(T0).receive(&[
        reserved("w", 1, 3),
        reserved("w", 2, 3),
        confirmed("w", 3, 3),
        released("w", 4, 3),
        confirmed("g", 2, 3),
    ]);
    assert_eq!(
        ops.at(T0 + SECOND).apply(&[]),
        json!({"flows": [
            {"flow_id": "g", "producer": "default", "applied": 0, "stop": "gap", "reason": null, "detail": null},
            {"flow_id": "w", "producer": "default", "applied": 1, "stop": "blocked", "reason": "invalid_transition", "detail": null},
        ], "flows_total": 2, "truncated": false})
    );
    ops
}

#[test]
fn inbox_skip_refusals_exit_2_and_write_nothing() {
    // No consumer file: refused without creating one.
    let fresh = Ops::new();
    fresh
        .skip_out("w", "1", "r", "alice")
        .usage("flow w seq 1 is not stored in the inbox");
    fresh.lab.assert_no_files();

    let ops = skip_lab();
    let snapshot = ops.snapshot();
    let before = ops.lab.files();
    let long_reason = "r".repeat(1001);
    let long_by = "b".repeat(101);
    let cases: Vec<([&str; 4], &str)> = vec![
        (
            ["w", "1", "r", "alice"],
            "error: flow w seq 1 is already applied or skipped (applied through seq 1)",
        ),
        (
            ["w", "3", "r", "alice"],
            "error: flow w seq 3 is not the flow's next seq (2); only the next one can be skipped",
        ),
        (
            ["w", "5", "r", "alice"],
            "error: flow w seq 5 is not the flow's next seq (2); only the next one can be skipped",
        ),
        (
            ["g", "1", "r", "alice"],
            "error: flow g seq 1 is not stored in the inbox; a missing event cannot be skipped",
        ),
        (
            ["g", "2", "r", "alice"],
            "error: flow g seq 2 is not the flow's next seq (1); only the next one can be skipped",
        ),
        (
            ["nope", "1", "r", "alice"],
            "error: flow nope seq 1 is not stored in the inbox; a missing event cannot be skipped",
        ),
        (
            ["w", "2", "", "alice"],
            "error: --reason must be 1 to 1000 bytes of text (got 0 bytes)",
        ),
        (
            ["w", "2", "   ", "alice"],
            "error: --reason must be 1 to 1000 bytes of text (got 3 bytes)",
        ),
        (
            ["w", "2", &long_reason, "alice"],
            "error: --reason must be 1 to 1000 bytes of text (got 1001 bytes)",
        ),
        (
            ["w", "2", "r", ""],
            "error: --by must be 1 to 100 bytes of text (got 0 bytes)",
        ),
        (
            ["w", "2", "r", &long_by],
            "error: --by must be 1 to 100 bytes of text (got 101 bytes)",
        ),
    ];
    for ([flow, seq, reason, by], message) in &cases {
        let out = ops.at(T0 + 5 * SECOND).skip_out(flow, seq, reason, by);
        out.usage("");
        assert_eq!(out.stderr.trim_end(), *message, "{flow} {seq}");
    }
    for seq in ["0", "-1", "abc", "1.0", "9223372036854775808"] {
        let out = ops.skip_out("w", seq, "r", "alice");
        out.usage("--seq");
        assert!(
            out.stderr
                .contains("must be an integer in 1..=9223372036854775807"),
            "{out:#?}"
        );
    }
    // Each required flag left out in turn.
    let flags = [
        ("--flow", "w"),
        ("--seq", "2"),
        ("--reason", "r"),
        ("--by", "a"),
    ];
    for missing in ["--by", "--reason", "--flow"] {
        let given: Vec<(&str, &str)> = flags
            .into_iter()
            .filter(|(flag, _)| *flag != missing)
            .collect();
        ops.skip_flags_out(&given).usage(missing);
    }

    ops.lab.files().assert_unchanged(&before, "refused skip");
    assert_eq!(ops.snapshot(), snapshot);
    assert_eq!(ops.repairs(), json!([]));
}

#[test]
fn inbox_skip_is_audited_apply_continues_past_it_and_the_log_is_append_only() {
    let ops = skip_lab();
    let reason = "duplicate reservation sent by the old checkout (ticket 42)";
    let first = ops.at(T0 + 5 * SECOND).skip_out("w", "2", reason, "alice");
    assert_eq!(first.stderr, "");
    let first = first.json();
    assert_eq!(keys(&first), ["repair"]);
    let repair1 = json!({
        "id": 1, "action": "skip", "producer": "default", "flow_id": "w", "store_id": null, "seq": 2, "event_id": "w-2",
        "reason": reason, "by": "alice", "at_ms": T0 + 5 * SECOND, "key": null,
    });
    assert_eq!(first, json!({ "repair": repair1 }));
    assert_eq!(
        row(&ops.inbox(&["--flow", "w"]), "w-2"),
        &json!({"event_id": "w-2", "flow_id": "w", "seq": 2, "schema_version": 1, "type": "reserved",
                "payload": {"amount": 3}, "status": "skipped", "reason": null, "detail": null,
                "received_at_ms": T0, "settled_at_ms": T0 + 5 * SECOND, "producer": "default", "store_id": null})
    );
    // Settled now: a second skip of the same seq is refused.
    ops.skip_out("w", "2", reason, "alice")
        .usage("flow w seq 2 is already applied or skipped (applied through seq 2)");

    // Apply continues past the skipped event; it has no effect.
    assert_eq!(
        ops.at(T0 + 6 * SECOND).apply(&[]),
        json!({"flows": [
            {"flow_id": "g", "producer": "default", "applied": 0, "stop": "gap", "reason": null, "detail": null},
            {"flow_id": "w", "producer": "default", "applied": 2, "stop": "idle", "reason": null, "detail": null},
        ], "flows_total": 2, "truncated": false})
    );
    let snapshot = ops.snapshot();
    assert_applied(
        &snapshot,
        json!([{"flow_id": "w", "producer": "default", "state": "released", "quantity": 3, "applied_seq": 4}]),
        &[("w", 1), ("w", 3), ("w", 4)],
    );
    assert_eq!(
        column(&ops.inbox(&["--flow", "w"]), "status"),
        [
            &json!("applied"),
            &json!("skipped"),
            &json!("applied"),
            &json!("applied")
        ]
    );

    // A pending (not blocked) next event may be skipped too; text output.
    ops.at(T0 + 7 * SECOND).receive(&[reserved("v", 1, 1)]);
    let out = ops.at(T0 + 8 * SECOND).run(&[
        "inbox",
        "skip",
        "--consumer",
        ops.c(),
        "--flow",
        "v",
        "--seq",
        "1",
        "--reason",
        "order cancelled by phone",
        "--by",
        "bob",
    ]);
    assert_eq!(
        out.text(),
        "skipped v seq 1 (v-1) by bob: order cancelled by phone [repair 2]\n"
    );
    let repair2 = json!({
        "id": 2, "action": "skip", "producer": "default", "flow_id": "v", "store_id": null, "seq": 1, "event_id": "v-1",
        "reason": "order cancelled by phone", "by": "bob", "at_ms": T0 + 8 * SECOND, "key": null,
    });
    assert_eq!(ops.repairs(), json!([repair1, repair2]));
    let text = ops.run(&["inbox", "repairs", "--consumer", ops.c()]);
    assert_eq!(
        text.text().lines().collect::<Vec<_>>(),
        [
            // T0 + 5 s and T0 + 8 s, in RFC 3339 UTC.
            format!("#1 at 2023-11-14T22:13:25.000Z: skip w seq 2 (w-2) by alice: {reason}"),
            "#2 at 2023-11-14T22:13:28.000Z: skip v seq 1 (v-1) by bob: order cancelled by phone"
                .to_owned(),
            "2 repairs".to_owned(),
        ]
    );
    assert_settled(&ops, 2, 3);

    // The database itself refuses to change the log.
    {
        let conn = rusqlite::Connection::open(ops.c()).expect("open the consumer file");
        for sql in [
            "UPDATE repair_log SET reason = 'nothing happened' WHERE id = 1",
            "UPDATE repair_log SET decided_by = 'mallory'",
            "DELETE FROM repair_log WHERE id = 2",
            "DELETE FROM repair_log",
        ] {
            let error = conn
                .execute(sql, [])
                .expect_err(&format!("{sql} must be refused"));
            assert!(
                error.to_string().contains("repair_log is append-only"),
                "{sql}: {error}"
            );
        }
    }
    assert_eq!(ops.repairs(), json!([repair1, repair2]));

    // Pruning keeps the log and the counts; a skipped event redelivered
    // after pruning is still a duplicate, and is not applied.
    let pruned = ops.at(T0 + DAY).prune_out("1h").json();
    assert_eq!(pruned["consumer"]["removed"], json!(5), "{pruned}");
    assert_eq!(ops.repairs(), json!([repair1, repair2]));
    assert_settled(&ops, 2, 3);
    assert_eq!(
        ops.receive(&[reserved("w", 2, 3), reserved("v", 1, 1)]),
        json!({"receipts": [
            receipt("w-2", "w", 2, "duplicate"),
            receipt("v-1", "v", 1, "duplicate"),
        ]})
    );
    assert_eq!(
        ops.snapshot()["consumer"]["effects"],
        snapshot["consumer"]["effects"]
    );
}

// ---------------------------------------------------------------- status

/// Producer: A-1 quarantined (committed at T0), B-1 pending (T0 + 10 s).
/// Consumer: A-1 (the other body) applied; x-1 blocked (unsupported_schema),
/// y-1 blocked (invalid_transition); z waits for seq 1 since T0 + 30 s.
fn status_lab() -> Ops {
    let ops = Ops::new();
    ops.at(T0).advance("A", 0, "reserved", Some(5));
    ops.at(T0 + 10 * SECOND)
        .advance("B", 0, "reserved", Some(2));
    ops.at(T0 + 20 * SECOND).receive(&[
        reserved("A", 1, 9),
        reserved_v2("x", 1, 3),
        confirmed("y", 1, 3),
    ]);
    assert_eq!(
        ops.relay(&["--event", "A-1"]),
        json!({"deliveries": [{"event_id": "A-1", "flow_id": "A", "seq": 1, "receipt": "conflict", "cause": "conflict"}], "stop": "drained", "deliveries_total": 1, "truncated": false, "refused": [], "refused_total": 0, "transient_errors": 0})
    );
    ops.apply(&[]);
    ops.at(T0 + 30 * SECOND).receive(&[confirmed("z", 3, 3)]);
    ops.at(T0 + 40 * SECOND).receive(&[confirmed("z", 2, 3)]);
    ops.at(T0 + 60 * SECOND);
    ops
}

fn status_doc(breaches: Value) -> Value {
    let ok = breaches.as_array().unwrap().is_empty();
    json!({
        "producer": {
            "backlog": 2, "oldest_pending_age_s": 60, "quarantined": 1, "rewound": 0, "backing_off": 0,
            "destinations": {"default": {"backlog": 2, "oldest_pending_age_s": 60, "quarantined": 1, "rewound": 0, "backing_off": 0}},
        },
        "consumer": {
            "pending": 2,
            "blocked": {"total": 2, "by_reason": {"invalid_transition": 1, "unsupported_schema": 1}},
            "gaps": [{"flow_id": "z", "producer": "default", "missing_seq": 1, "since_ms": T0 + 30 * SECOND, "waiting_s": 30}],
            "gaps_total": 1,
            "applied": 1,
            "skipped": 0,
            "effects": {"pending": 0, "in_flight": 0, "succeeded": 0, "failed": 0, "outcome_unknown": 0, "skipped": 0, "oldest_pending_age_s": null},
        },
        "breaches": breaches,
        "ok": ok,
    })
}

#[test]
fn status_reports_every_signal_with_exact_ages() {
    let ops = status_lab();
    let out = ops.status_out(&[]);
    assert_eq!(out.stderr, "");
    let status = out.json();
    assert_eq!(keys(&status), ["breaches", "consumer", "ok", "producer"]);
    assert_eq!(
        keys(&status["producer"]),
        [
            "backing_off",
            "backlog",
            "destinations",
            "oldest_pending_age_s",
            "producer_name",
            "quarantined",
            "rewound",
            "store_id"
        ]
    );
    assert_eq!(
        keys(&status["consumer"]),
        [
            "applied",
            "blocked",
            "effects",
            "gaps",
            "gaps_total",
            "pending",
            "skipped",
            "store_id"
        ]
    );
    assert_same_numbers(&without_store_ids(status), &status_doc(json!([])));

    // Ages follow the clock.
    let later = ops.at(T0 + 90 * SECOND + 500).status();
    assert_eq!(
        later["producer"]["oldest_pending_age_s"].as_f64(),
        Some(90.5)
    );
    assert_eq!(
        later["consumer"]["gaps"][0]["waiting_s"].as_f64(),
        Some(60.5)
    );

    // Empty files: nothing pending, no age.
    let empty = Ops::new();
    assert_same_numbers(
        &empty.status(),
        &json!({
            "producer": {
                "backlog": 0, "oldest_pending_age_s": null, "quarantined": 0, "rewound": 0, "backing_off": 0,
                "destinations": {"default": {"backlog": 0, "oldest_pending_age_s": null, "quarantined": 0, "rewound": 0, "backing_off": 0}},
            },
            "consumer": {"pending": 0, "blocked": {"total": 0, "by_reason": {}}, "gaps": [],
                         "gaps_total": 0, "applied": 0, "skipped": 0,
                         "effects": {"pending": 0, "in_flight": 0, "succeeded": 0, "failed": 0,
                                     "outcome_unknown": 0, "skipped": 0, "oldest_pending_age_s": null}},
            "breaches": [],
            "ok": true,
        }),
    );

    let text =
        ops.at(T0 + 60 * SECOND)
            .run(&["status", "--producer", ops.p(), "--consumer", ops.c()]);
    let lines: Vec<&str> = text.text().lines().collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(
        lines[0],
        "producer: backlog 2 (oldest 60.0 s), quarantined 1, backing off 0"
    );
    assert!(
        lines[1].starts_with("consumer: pending 2, blocked 2"),
        "{lines:?}"
    );
    assert_eq!(lines[2], "  gap: z waits for seq 1 since 30.0 s");
}

/// With nothing pending the text claims no age ("oldest -"), and JSON's
/// `oldest_pending_age_s` is null: on fresh files, and once every event
/// is accepted.
#[test]
fn status_with_an_empty_backlog_claims_no_oldest_age() {
    let ops = Ops::new();
    let text = |ops: &Ops| {
        let out = ops.run(&["status", "--producer", ops.p(), "--consumer", ops.c()]);
        out.text().lines().next().unwrap_or_default().to_owned()
    };
    let empty_line = "producer: backlog 0 (oldest -), quarantined 0, backing off 0";
    assert_eq!(text(&ops), empty_line);
    assert_eq!(
        ops.status()["producer"]["oldest_pending_age_s"],
        json!(null)
    );

    ops.full_flow("A", 2);
    ops.relay(&[]);
    let later = ops.at(T0 + MINUTE);
    assert_eq!(later.status()["producer"]["backlog"], json!(0));
    assert_eq!(
        later.status()["producer"]["oldest_pending_age_s"],
        json!(null)
    );
    assert_eq!(text(later), empty_line);
    let out = later.run(&["status", "--producer", later.p()]);
    assert_eq!(out.text(), format!("{empty_line}\n"));
}

#[test]
fn status_thresholds_exit_3_only_when_exceeded() {
    let ops = status_lab();
    // Equal to every threshold: not a breach.
    let out = ops.status_out(&[
        "--max-backlog",
        "2",
        "--max-age",
        "60",
        "--max-blocked",
        "2",
        "--max-quarantined",
        "1",
    ]);
    assert_same_numbers(&without_store_ids(out.json()), &status_doc(json!([])));

    for (flag, threshold, signal, value) in [
        ("--max-backlog", 1, "backlog", 2),
        ("--max-age", 59, "oldest_pending_age_s", 60),
        ("--max-blocked", 1, "blocked", 2),
        ("--max-quarantined", 0, "quarantined", 1),
    ] {
        let threshold_text = threshold.to_string();
        let out = ops.status_out(&[flag, &threshold_text]);
        assert_eq!(out.code, 3, "{flag} {threshold}: {out:#?}");
        assert_eq!(out.stderr, "", "{flag}");
        let status =
            without_store_ids(serde_json::from_str(&out.stdout).expect("one JSON document"));
        assert_same_numbers(
            &status,
            &status_doc(json!([{"signal": signal, "value": value, "threshold": threshold}])),
        );
        assert_eq!(status["ok"], json!(false));
    }

    // All at once, in a fixed order; text output names each breach.
    let all = [
        "--max-backlog",
        "0",
        "--max-age",
        "0",
        "--max-blocked",
        "0",
        "--max-quarantined",
        "0",
    ];
    let out = ops.status_out(&all);
    assert_eq!(out.code, 3, "{out:#?}");
    let status = without_store_ids(serde_json::from_str(&out.stdout).unwrap());
    assert_same_numbers(
        &status,
        &status_doc(json!([
            {"signal": "backlog", "value": 2, "threshold": 0},
            {"signal": "oldest_pending_age_s", "value": 60, "threshold": 0},
            {"signal": "blocked", "value": 2, "threshold": 0},
            {"signal": "quarantined", "value": 1, "threshold": 0},
        ])),
    );
    let mut args = vec!["status", "--producer", ops.p(), "--consumer", ops.c()];
    args.extend(all);
    let out = ops.run(&args);
    assert_eq!(out.code, 3, "{out:#?}");
    let alerts: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("ALERT "))
        .collect();
    assert_eq!(alerts.len(), 4, "{out:#?}");
    for (line, signal) in
        alerts
            .iter()
            .zip(["backlog", "oldest_pending_age_s", "blocked", "quarantined"])
    {
        assert!(line.starts_with(&format!("ALERT {signal} = ")), "{line}");
    }

    // Thresholds on empty files are never breached.
    let empty = Ops::new();
    let out = empty.status_out(&all);
    assert_eq!(out.json()["ok"], json!(true));
}

/// A producer file restored from an older backup commits again what the
/// consumer already holds from it: the relay's receipt is `conflict` of
/// cause `producer_rewound`, `status` counts it in `quarantined` and in
/// `rewound`, and `--max-rewound` alerts (exit 3) past its threshold.
#[test]
fn status_counts_a_rewound_producer_and_alerts_past_max_rewound() {
    let ops = Ops::new();
    ops.lab.init();
    ops.lab.advance("A", 0, "reserved", Some(2));
    ops.relay(&[]);
    let backup = ops.lab.path("backup.db");
    rusqlite::Connection::open(ops.p())
        .and_then(|conn| conn.execute("VACUUM INTO ?1", [&backup]))
        .expect("back the producer up");
    ops.lab.advance("B", 0, "reserved", Some(1));
    ops.relay(&[]);
    for side in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{side}", ops.p()));
    }
    std::fs::copy(&backup, ops.p()).expect("restore the producer");
    // What the restored store forgot, committed again with another body.
    let again = ops.lab.advance("B", 0, "reserved", Some(5));
    assert_eq!(again["outcome"], "committed", "{again}");
    let relayed = ops.relay(&[]);
    let delivery = &relayed["deliveries"][0];
    assert_eq!(
        (delivery["receipt"].as_str(), delivery["cause"].as_str()),
        (Some("conflict"), Some("producer_rewound")),
        "{relayed}"
    );
    let status = ops.status();
    assert_eq!(status["producer"]["quarantined"], json!(1), "{status}");
    assert_eq!(status["producer"]["rewound"], json!(1), "{status}");
    assert_eq!(ops.status_out(&["--max-rewound", "1"]).code, 0);
    let out = ops.status_out(&["--max-rewound", "0"]);
    assert_eq!(out.code, 3, "{out:#?}");
    let alert: Value = serde_json::from_str(&out.stdout).expect("one JSON document");
    assert_eq!(
        alert["breaches"],
        json!([{"signal": "rewound", "value": 1, "threshold": 0}])
    );
    let text = ops.lab.run(&["status", "--producer", ops.p()]);
    assert!(
        text.text().contains("quarantined 1 (rewound 1)"),
        "{}",
        text.text()
    );
}

#[test]
fn status_invalid_thresholds_exit_2_and_create_nothing() {
    let ops = Ops::new();
    for flag in [
        "--max-backlog",
        "--max-age",
        "--max-blocked",
        "--max-quarantined",
        "--max-rewound",
    ] {
        for bad in ["-1", "abc", "1.5", ""] {
            ops.status_out(&[flag, bad]).usage(flag);
        }
        ops.status_out(&[flag]).usage(flag);
    }
    ops.lab.assert_no_files();
}

// ---------------------------------------------------------------- prune

#[test]
fn prune_duration_parsing() {
    let ops = Ops::new();
    for bad in ["abc", "-1s", "", "1x", "7"] {
        ops.prune_out(bad).usage("--older-than");
    }
    ops.lab.run_both("prune", &[]).usage("--older-than");
    ops.lab.assert_no_files();

    for (text, ms) in [
        ("7d", 7 * DAY),
        ("12h", 12 * HOUR),
        ("30m", 30 * MINUTE),
        ("1s", SECOND),
        ("90m", 90 * MINUTE),
    ] {
        assert_eq!(
            ops.prune_out(text).json(),
            json!({"cutoff_ms": T0 - ms, "producer": {"removed": 0},
                   "consumer": {"removed": 0, "fingerprints": 0}}),
            "{text}"
        );
    }
    let before = ops.lab.files();
    for bad in ["abc", "-1s", "", "1x"] {
        ops.prune_out(bad).usage("--older-than");
    }
    ops.lab
        .files()
        .assert_unchanged(&before, "invalid --older-than");
    let out = ops.run(&[
        "prune",
        "--producer",
        ops.p(),
        "--consumer",
        ops.c(),
        "--older-than",
        "30m",
    ]);
    assert_eq!(
        out.text(),
        "pruned 0 accepted outbox rows and 0 settled inbox rows (kept 0 fingerprints) older than 30m\n"
    );
}

#[test]
fn prune_removes_only_old_delivered_and_settled_rows_and_keeps_fingerprints() {
    let ops = Ops::new();
    // At T0: A through all three steps; Q quarantined (the consumer holds
    // another Q-1, applied); C-1 committed but never relayed; x-1 blocked,
    // z-2 pending behind a gap.
    ops.at(T0).full_flow("A", 4);
    ops.receive(&[
        reserved("Q", 1, 9),
        reserved_v2("x", 1, 3),
        confirmed("z", 2, 3),
    ]);
    ops.advance("Q", 0, "reserved", Some(1));
    let relay = ops.relay(&[]);
    assert_eq!(relay["deliveries"].as_array().unwrap().len(), 4, "{relay}");
    ops.apply(&[]);
    ops.advance("C", 0, "reserved", Some(1));
    // At T0 + 1 h: B delivered and applied.
    ops.at(T0 + HOUR).advance("B", 0, "reserved", Some(2));
    ops.relay(&["--event", "B-1"]);
    ops.apply(&[]);
    let before = ops.snapshot();
    assert_eq!(
        ids(&ops.outbox(&[])),
        ["A-1", "A-2", "A-3", "Q-1", "C-1", "B-1"]
    );
    assert_eq!(
        ids(&ops.inbox(&[])),
        ["A-1", "A-2", "A-3", "B-1", "Q-1", "x-1", "z-2"]
    );

    // Strictly older than the cutoff: rows settled exactly at it stay.
    ops.at(T0 + 2 * HOUR);
    assert_eq!(
        ops.prune_out("2h").json(),
        json!({"cutoff_ms": T0, "producer": {"removed": 0},
               "consumer": {"removed": 0, "fingerprints": 0}})
    );
    assert_eq!(ops.snapshot(), before);

    assert_eq!(
        ops.prune_out("61m").json(),
        json!({"cutoff_ms": T0 + 59 * MINUTE, "producer": {"removed": 3},
               "consumer": {"removed": 4, "fingerprints": 4}})
    );
    let outbox = ops.outbox(&[]);
    assert_eq!(ids(&outbox), ["Q-1", "C-1", "B-1"]);
    assert_eq!(row(&outbox, "Q-1")["quarantined"], json!(true));
    assert_eq!(row(&outbox, "C-1")["accepted"], json!(false));
    assert_eq!(ids(&ops.inbox(&[])), ["B-1", "x-1", "z-2"]);
    let after = ops.snapshot();
    assert_same_applied(&after, &before);
    assert_eq!(after["producer"]["flows"], before["producer"]["flows"]);
    let status = ops.status();
    assert_eq!(status["consumer"]["applied"], json!(5), "pruned rows count");
    assert_eq!(status["producer"]["backlog"], json!(2));

    // A late redelivery of a pruned event: same body duplicate, changed
    // body or another id at its seq conflict; nothing stored, nothing applied.
    let changed = envelope("A-2", "A", 2, 1, "confirmed", json!({"amount": 5}));
    let other_id = envelope("A-2b", "A", 2, 1, "confirmed", json!({"amount": 4}));
    // (Each conflict in a delivery of its own: after one, nothing more of
    // its flow is decided in that delivery.)
    assert_eq!(
        ops.receive(&[
            reserved("A", 1, 4),
            confirmed("A", 2, 4),
            reserved("Q", 1, 9),
            changed,
        ]),
        json!({"receipts": [
            receipt("A-1", "A", 1, "duplicate"),
            receipt("A-2", "A", 2, "duplicate"),
            receipt("Q-1", "Q", 1, "duplicate"),
            conflict("A-2", "A", 2, Some("A-2")),
        ]})
    );
    assert_eq!(
        ops.receive(&[other_id]),
        json!({"receipts": [conflict("A-2b", "A", 2, Some("A-2"))]})
    );
    assert_eq!(ids(&ops.inbox(&[])), ["B-1", "x-1", "z-2"]);
    assert_eq!(
        ops.apply(&[]),
        json!({"flows": [{"flow_id": "z", "producer": "default", "applied": 0, "stop": "gap", "reason": null, "detail": null}], "flows_total": 1, "truncated": false})
    );
    // The quarantined event still conflicts with the pruned row's fingerprint.
    ops.store_out("outbox", "retry", &["Q-1"]).json();
    assert_eq!(
        ops.relay(&["--event", "Q-1"]),
        json!({"deliveries": [{"event_id": "Q-1", "flow_id": "Q", "seq": 1, "receipt": "conflict", "cause": "conflict"}], "stop": "drained", "deliveries_total": 1, "truncated": false, "refused": [], "refused_total": 0, "transient_errors": 0})
    );
    assert_eq!(ops.snapshot()["consumer"], after["consumer"]);

    // Later, B goes too; pending, quarantined, blocked and gapped rows never do.
    assert_eq!(
        ops.at(T0 + 100 * DAY).prune_out("1s").json(),
        json!({"cutoff_ms": T0 + 100 * DAY - SECOND, "producer": {"removed": 1},
               "consumer": {"removed": 1, "fingerprints": 1}})
    );
    assert_eq!(ids(&ops.outbox(&[])), ["Q-1", "C-1"]);
    assert_eq!(ids(&ops.inbox(&[])), ["x-1", "z-2"]);
    assert_eq!(
        ops.receive(&[reserved("B", 1, 2)]),
        json!({"receipts": [receipt("B-1", "B", 1, "duplicate")]})
    );
    assert_same_applied(&ops.snapshot(), &before);
    assert_eq!(ops.status()["consumer"]["applied"], json!(5));

    // The pruned flow goes on: its next seq is produced, delivered and
    // applied once.
    ops.advance("B", 1, "confirmed", None);
    assert_eq!(
        ops.relay(&["--event", "B-2"])["deliveries"][0]["receipt"],
        "accepted"
    );
    assert_eq!(
        ops.apply(&["--flow", "B"]),
        json!({"flows": [{"flow_id": "B", "producer": "default", "applied": 1, "stop": "idle", "reason": null, "detail": null}], "flows_total": 1, "truncated": false})
    );
    let effects = ops.snapshot()["consumer"]["effects"].clone();
    let b: Vec<&Value> = effects
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["flow_id"] == "B")
        .collect();
    assert_eq!(
        b,
        [
            &json!({"flow_id": "B", "producer": "default", "seq": 1, "event_id": "B-1"}),
            &json!({"flow_id": "B", "producer": "default", "seq": 2, "event_id": "B-2"}),
        ]
    );
}

// ---------------------------------------------------------------- busy timeout

#[test]
fn busy_timeout_bounds_the_wait_for_a_locked_consumer_and_the_relay_backs_off() {
    let ops = Ops::new();
    ops.at(T0).advance("A", 0, "reserved", Some(4));
    ops.lab.init();

    let lock = rusqlite::Connection::open(ops.c()).expect("open the consumer file");
    lock.execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    let started = Instant::now();
    let out = ops.lab.relay_out(&["--busy-timeout-ms", "50"]);
    let elapsed = started.elapsed();
    // A one-shot relay records the transient failure and goes on: exit 0,
    // nothing delivered, the round counted as failed.
    let report = out.json();
    assert_eq!(report["deliveries_total"], json!(0), "{out:#?}");
    assert_eq!(report["transient_errors"], json!(1), "{out:#?}");
    assert!(
        out.stderr.contains("database is locked"),
        "the warning names the lock: {out:#?}"
    );
    assert!(
        elapsed < Duration::from_secs(5),
        "--busy-timeout-ms 50 waited {elapsed:?}"
    );

    // The failure is recorded on the producer side, with a backoff.
    let a1 = row(&ops.outbox(&[]), "A-1").clone();
    assert_eq!(a1["accepted"], json!(false));
    assert_eq!(a1["quarantined"], json!(false));
    assert_eq!(a1["attempts"], json!(1));
    assert_eq!(a1["last_outcome"], "error");
    assert!(
        a1["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("database is locked")),
        "{a1}"
    );
    let next = a1["next_attempt_at_ms"].as_i64().expect("an integer");
    assert!(
        next > T0 && next <= T0 + 101,
        "next attempt {next} not in (now, now + 100 ms + 1]"
    );
    let status = ops.status();
    assert_eq!(status["producer"]["backing_off"], json!(1));
    assert_eq!(status["producer"]["backlog"], json!(1));
    lock.execute_batch("ROLLBACK").expect("release the lock");
    drop(lock);

    // The relay honours the backoff, then delivers.
    assert_eq!(
        ops.relay(&[]),
        json!({"deliveries": [], "stop": "drained", "deliveries_total": 0, "truncated": false, "refused": [], "refused_total": 0, "transient_errors": 0})
    );
    assert_eq!(
        ops.at(next).relay(&[]),
        json!({"deliveries": [{"event_id": "A-1", "flow_id": "A", "seq": 1, "receipt": "accepted"}], "stop": "drained", "deliveries_total": 1, "truncated": false, "refused": [], "refused_total": 0, "transient_errors": 0})
    );
    let a1 = row(&ops.outbox(&[]), "A-1").clone();
    assert_eq!(a1["accepted"], json!(true));
    assert_eq!(a1["attempts"], json!(2));
    assert_eq!(a1["last_outcome"], "accepted");
    assert_eq!(a1["accepted_at_ms"], json!(next));
    assert_eq!(ops.status()["producer"]["backing_off"], json!(0));

    for bad in ["-1", "abc", "3600001"] {
        ops.lab
            .relay_out(&["--busy-timeout-ms", bad])
            .usage("--busy-timeout-ms");
    }
}
