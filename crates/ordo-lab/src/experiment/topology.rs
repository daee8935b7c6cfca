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
pub const TOPOLOGY: [(&str, ScenarioFn); 4] = [
    (
        "conflict_stops_its_flow_in_one_delivery",
        conflict_stops_its_flow_in_one_delivery,
    ),
    ("two_producers_share_flow_ids", two_producers_share_flow_ids),
    (
        "bound_key_posts_for_another_producer",
        bound_key_posts_for_another_producer,
    ),
    (
        "restore_from_backup_is_detected",
        restore_from_backup_is_detected,
    ),
];

/// The scenario of this group that needs what only an SQLite file has,
/// with the reason.
pub const SQLITE_ONLY: (&str, &str) = (
    "restore_from_backup_is_detected",
    "backs the producer store up and restores it as a file (VACUUM INTO and a copy); \
     a PostgreSQL store is backed up and restored by the server's own tools",
);

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
