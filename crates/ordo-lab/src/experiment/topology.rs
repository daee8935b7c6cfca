//! Scenarios of many producers and many consumers (PROTOCOL.md section
//! 12), reported apart: a conflict that stops the rest of its flow in one
//! delivery, a key bound to one producer posting another's events, and a
//! producer restored from a backup, told apart from an ordinary conflict.

use serde_json::{json, Value};

use super::child::{Ctx, RELAY};
use super::expect::{envelope, event, STEPS};
use super::scenarios::{delivery_of, relayed, Outcome, ScenarioFn};
use crate::serve::{loopback_any, ServeSpec};

/// Every scenario of the group.
pub const TOPOLOGY: [(&str, ScenarioFn); 5] = [
    (
        "conflict_stops_its_flow_in_one_delivery",
        conflict_stops_its_flow_in_one_delivery,
    ),
    ("two_producers_share_flow_ids", two_producers_share_flow_ids),
    (
        "fan_out_with_one_consumer_down",
        fan_out_with_one_consumer_down,
    ),
    (
        "bound_key_posts_for_another_producer",
        bound_key_posts_for_another_producer,
    ),
    (
        "restore_from_backup_is_detected",
        restore_from_backup_is_detected,
    ),
];

/// The scenarios of this group that need what only an SQLite file has,
/// with the reason.
pub const SQLITE_ONLY: [(&str, &str); 1] = [(
    "restore_from_backup_is_detected",
    "backs the producer store up and restores it as a file (VACUUM INTO and a copy); \
     a PostgreSQL store is backed up and restored by the server's own tools",
)];

const QUANTITY: i64 = 5;
const SECRET: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

/// Produces `steps` steps of `flow` with `quantity`.
fn produce(ctx: &Ctx, flow: &str, steps: usize, quantity: i64) -> Result<(), String> {
    let quantity = quantity.to_string();
    for (i, step) in STEPS.iter().take(steps).enumerate() {
        ctx.advance(flow, i as i64, step, &["--quantity", &quantity])?;
    }
    Ok(())
}

/// The event ids and statuses of the consumer's inbox, in its order.
fn inbox(ctx: &Ctx) -> Result<Value, String> {
    let list = ctx.ok(&["inbox", "list", "--consumer", "{C}"])?;
    let rows = list["inbox"].as_array().cloned().unwrap_or_default();
    Ok(rows
        .iter()
        .map(|row| json!([row["event_id"], row["status"]]))
        .collect())
}

/// The custody marks of the producer's outbox, by event id.
fn outbox(ctx: &Ctx) -> Result<Value, String> {
    let list = ctx.ok(&["outbox", "list", "--producer", "{P}"])?;
    let rows = list["outbox"].as_array().cloned().unwrap_or_default();
    Ok(rows
        .iter()
        .map(|row| json!([row["event_id"], row["accepted"], row["quarantined"]]))
        .collect())
}

/// One delivery of several events of flow `a`: the first collides with
/// what the consumer holds, so the later ones of `a` are answered
/// `conflict` (cause `after_conflict`) and not stored, while flow `b` in
/// the same delivery is stored.
fn conflict_stops_its_flow_in_one_delivery(ctx: &Ctx) -> Result<Outcome, String> {
    let held = event("a", 1, "reserved", QUANTITY);
    ctx.receive(std::slice::from_ref(&held))?;
    let forged = event("a", 1, "reserved", QUANTITY + 1);
    let batch = [
        forged,
        event("a", 2, "confirmed", QUANTITY),
        event("b", 1, "reserved", QUANTITY),
        event("a", 3, "released", QUANTITY),
    ];
    let receipts = ctx.receive(&batch)?;
    Ok(Outcome {
        observed: json!({"receipts": receipts, "inbox": inbox(ctx)?}),
        expected: json!({
            "receipts": {"receipts": [
                {"event_id": "a-1", "receipt": "conflict"},
                {"event_id": "a-2", "receipt": "conflict"},
                {"event_id": "b-1", "receipt": "accepted"},
                {"event_id": "a-3", "receipt": "conflict"},
            ]},
            "inbox": [["a-1", "pending"], ["b-1", "pending"]],
        }),
    })
}

/// `event` appended by the producer named `producer`.
fn of(producer: &str, mut event: Value) -> Value {
    event["producer"] = json!(producer);
    event
}

/// Two producers, `orders` and `payments`, and the default one all use
/// flow `a` with the same event ids: each `(producer, flow)` is its own
/// flow at the consumer, so nothing of one is a duplicate or a conflict of
/// another's. A collision in `payments`' `a` stops only that flow for the
/// rest of its delivery; apply drains the three flows apart, each onto its
/// own projection; the listing of one producer's flow shows its rows only.
fn two_producers_share_flow_ids(ctx: &Ctx) -> Result<Outcome, String> {
    let first = [
        of("orders", event("a", 1, "reserved", QUANTITY)),
        of("payments", event("a", 1, "reserved", QUANTITY + 2)),
        event("a", 1, "reserved", QUANTITY + 4),
        of("orders", event("a", 2, "confirmed", QUANTITY)),
        of("payments", event("a", 2, "confirmed", QUANTITY + 2)),
    ];
    let stored = ctx.receive(&first)?;
    let second = [
        of("payments", event("a", 2, "confirmed", QUANTITY + 3)),
        of("payments", event("a", 3, "released", QUANTITY + 2)),
        of("orders", event("a", 3, "released", QUANTITY)),
    ];
    let collided = ctx.receive(&second)?;
    let applied = ctx.apply(&[])?;
    let listed = ctx.ok(&[
        "inbox",
        "list",
        "--consumer",
        "{C}",
        "--producer-name",
        "payments",
        "--flow",
        "a",
    ])?;
    let payments_rows: Vec<Value> = (listed["inbox"].as_array().cloned().unwrap_or_default())
        .iter()
        .map(|row| json!([row["producer"], row["event_id"], row["status"]]))
        .collect();
    let projection = ctx.snapshot()?["consumer"]["projection"].clone();
    let accepted = |id: &str| json!({"event_id": id, "receipt": "accepted"});
    let flow = |producer: &str, applied: u64| {
        json!({"flow_id": "a", "producer": producer, "applied": applied, "stop": "idle",
               "reason": null, "detail": null})
    };
    let projected = |producer: &str, state: &str, quantity: i64, seq: i64| {
        json!({"flow_id": "a", "producer": producer, "state": state, "quantity": quantity,
               "applied_seq": seq})
    };
    let first_receipts = ["a-1", "a-1", "a-1", "a-2", "a-2"].map(accepted);
    Ok(Outcome {
        observed: json!({
            "first": stored,
            "second": collided,
            "apply": applied,
            "payments_a": payments_rows,
            "projection": projection,
        }),
        expected: json!({
            "first": {"receipts": first_receipts},
            "second": {"receipts": [
                {"event_id": "a-2", "receipt": "conflict"},
                {"event_id": "a-3", "receipt": "conflict"},
                accepted("a-3"),
            ]},
            "apply": {"flows": [flow("default", 1), flow("orders", 3), flow("payments", 2)],
                      "flows_total": 3, "truncated": false},
            "payments_a": [["payments", "a-1", "applied"], ["payments", "a-2", "applied"]],
            "projection": [
                projected("default", "reserved", QUANTITY + 4, 1),
                projected("orders", "released", QUANTITY, 3),
                projected("payments", "confirmed", QUANTITY + 2, 2),
            ],
        }),
    })
}

/// The producer's per-destination numbers of `status`, as `[backlog,
/// backing_off]` by destination, at `now_ms`.
fn per_destination(ctx: &Ctx, now_ms: i64) -> Result<Value, String> {
    let status = ctx.run_at(now_ms, &["status", "--producer", "{P}"])?;
    let status = status.json_if_ok("status")?;
    let destinations = status["producer"]["destinations"].as_object().cloned();
    Ok(destinations
        .unwrap_or_default()
        .into_iter()
        .map(|(name, d)| (name, json!([d["backlog"], d["backing_off"]])))
        .collect())
}

/// The wall clock, in ms since the epoch.
fn wall_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// One producer, two destinations: `default` to the consumer, `billing`
/// to a consumer that is down (nothing listens at its address). The
/// consumer up gets every event; billing's custody backs off on its own,
/// keeps its backlog and so holds pruning back; once billing's consumer is
/// up (a file of its own) it gets every flow from seq 1 and pruning goes on.
fn fan_out_with_one_consumer_down(ctx: &Ctx) -> Result<Outcome, String> {
    ctx.ok(&["init", "--producer", "{P}", "--consumer", "{C}"])?;
    let billing = ctx.dir.join("billing.db").display().to_string();
    ctx.ok(&["init", "--consumer", &billing])?;
    ctx.ok(&["destination", "add", "--producer", "{P}", "billing"])?;
    produce(ctx, "a", 2, QUANTITY)?;
    produce(ctx, "b", 1, QUANTITY)?;
    let start_ms = wall_ms();
    let later = |minutes: i64| start_ms + minutes * 60_000;
    let relay = |now_ms: i64, destination: &str, to: &[&str]| {
        let args = [
            &["relay", "--producer", "{P}", "--destination", destination],
            to,
        ]
        .concat();
        ctx.run_at(now_ms, &args)?.json_if_ok("relay")
    };
    let up = relay(later(1), "default", &["--consumer", "{C}"])?;
    let down = relay(later(1), "billing", &["--to", "http://127.0.0.1:1"])?;
    let while_down = per_destination(ctx, later(1))?;
    let prune = |now_ms: i64| {
        let args = ["prune", "--producer", "{P}", "--older-than", "0s"];
        ctx.run_at(now_ms, &args)?.json_if_ok("prune")
    };
    let held_back = prune(later(2))?["producer"]["removed"].clone();
    let back_up = relay(later(60), "billing", &["--consumer", &billing])?;
    let after = per_destination(ctx, later(60))?;
    let pruned = prune(later(61))?["producer"]["removed"].clone();
    let delivered = |receipts: &[(&str, &str, i64)]| {
        let deliveries = receipts
            .iter()
            .map(|(id, flow, seq)| delivery_of(id, flow, *seq, "accepted"))
            .collect();
        relayed(deliveries, "drained")
    };
    let all = [("a-1", "a", 1), ("b-1", "b", 1), ("a-2", "a", 2)];
    let mut failed = relayed(vec![], "drained");
    failed["transient_errors"] = json!(1);
    Ok(Outcome {
        observed: json!({
            "up": up, "down": down, "while_down": while_down, "held_back": held_back,
            "back_up": back_up, "after": after, "pruned": pruned,
        }),
        expected: json!({
            "up": delivered(&all),
            "down": failed,
            // The failed round held each flow's head (one event of a flow
            // a round): those two back off, a-2 waits behind a-1.
            "while_down": {"default": [0, 0], "billing": [3, 2]},
            "held_back": 0,
            "back_up": delivered(&all),
            "after": {"default": [0, 0], "billing": [0, 0]},
            "pruned": 3,
        }),
    })
}

/// Writes a key file of `text` in the scenario's directory, readable by
/// its owner only.
fn key_file(ctx: &Ctx, name: &str, text: &str) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let path = ctx.dir.join(name);
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path.display().to_string())
}

/// The producer `payments` relays with key `k1`, which the server binds
/// to `orders`: answered 403, the relay exits 1 and nothing is stored or
/// marked. A relay whose own key file binds `k1` to `orders` exits 2
/// before sending anything.
fn bound_key_posts_for_another_producer(ctx: &Ctx) -> Result<Outcome, String> {
    ctx.ok(&["init", "--producer", "{P}", "--producer-name", "payments"])?;
    ctx.ok(&["init", "--consumer", "{C}"])?;
    produce(ctx, "a", 1, QUANTITY)?;
    let bound = key_file(
        ctx,
        "server.keys",
        &format!("k1 {SECRET} producer=orders\n"),
    )?;
    let unbound = key_file(ctx, "relay.keys", &format!("k1 {SECRET}\n"))?;
    let relay_bound = key_file(
        ctx,
        "relay-bound.keys",
        &format!("k1 {SECRET} producer=orders\n"),
    )?;
    let consumer = ctx.consumer();
    let flags = ["--keys".to_owned(), bound];
    let served = crate::serve::start(&ServeSpec {
        exe: &ctx.exe,
        consumer: &consumer,
        listen: loopback_any(),
        crash_point: None,
        log: Some(&ctx.dir.join("serve.log")),
        flags: &flags,
    })?;
    let url = format!("http://{}", served.addr);
    let relay = |keys: &str| {
        let args = [
            "relay",
            "--producer",
            "{P}",
            "--to",
            &url,
            "--key-id",
            "k1",
            "--key-file",
            keys,
        ];
        ctx.run(&args, b"", None)
    };
    let refused = relay(&unbound);
    let mismatched = relay(&relay_bound);
    served.stop();
    let (refused, mismatched) = (refused?, mismatched?);
    Ok(Outcome {
        observed: json!({
            "relay_exit_code": refused.code,
            "relay_bound_exit_code": mismatched.code,
            "inbox": inbox(ctx)?,
            "outbox": outbox(ctx)?,
        }),
        expected: json!({
            "relay_exit_code": 1,
            "relay_bound_exit_code": 2,
            "inbox": [],
            "outbox": [["a-1", false, false]],
        }),
    })
}

/// Backs the producer up after `a-1` was delivered, goes on with `b-1`,
/// restores the backup and commits `b-1` again with another body, and a
/// new flow `c`. The consumer answers `b-1` `conflict` of cause
/// `producer_rewound` (its row came from this same store); the relay
/// quarantines `b-1`, counts it as rewound and delivers `c-1`; the
/// consumer keeps its `b-1`.
fn restore_from_backup_is_detected(ctx: &Ctx) -> Result<Outcome, String> {
    produce(ctx, "a", 1, QUANTITY)?;
    ctx.ok(&RELAY)?;
    let backup = ctx.dir.join("backup.db");
    let conn =
        ordo_sqlite::rusqlite::Connection::open(ctx.producer()).map_err(|e| e.to_string())?;
    conn.execute("VACUUM INTO ?1", [backup.display().to_string()])
        .map_err(|e| format!("cannot back the producer up: {e}"))?;
    drop(conn);
    produce(ctx, "b", 1, QUANTITY)?;
    ctx.ok(&RELAY)?;
    restore(ctx, &backup)?;
    produce(ctx, "b", 1, QUANTITY + 1)?;
    produce(ctx, "c", 1, QUANTITY)?;
    let relay = ctx.ok(&RELAY)?;
    let status = ctx.ok(&["status", "--producer", "{P}"])?;
    let mut rewound = delivery_of("b-1", "b", 1, "conflict");
    rewound["cause"] = json!("producer_rewound");
    let held = envelope("b-1", "b", 1, 1, "reserved", json!({"amount": QUANTITY}));
    let stored = ctx.ok(&["inbox", "list", "--consumer", "{C}"])?;
    let held_b1 = stored["inbox"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["event_id"] == "b-1"))
        .map(|row| row["payload"].clone());
    Ok(Outcome {
        observed: json!({
            "relay": relay,
            "quarantined": status["producer"]["quarantined"],
            "rewound": status["producer"]["rewound"],
            "inbox": inbox(ctx)?,
            "held_b_1": held_b1,
        }),
        expected: json!({
            "relay": relayed(vec![rewound, delivery_of("c-1", "c", 1, "accepted")], "drained"),
            "quarantined": 1,
            "rewound": 1,
            "inbox": [["a-1", "pending"], ["b-1", "pending"], ["c-1", "pending"]],
            "held_b_1": held["payload"],
        }),
    })
}

/// Puts the backup in place of the producer's file (its WAL and shared
/// memory files gone with it).
fn restore(ctx: &Ctx, backup: &std::path::Path) -> Result<(), String> {
    let producer = ctx.producer();
    for side in ["-wal", "-shm"] {
        let path = format!("{}{side}", producer.display());
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{path}: {e}")),
        }
    }
    std::fs::copy(backup, &producer)
        .map(|_| ())
        .map_err(|e| format!("cannot restore the producer: {e}"))
}
