//! Scenarios of many producers and many consumers (PROTOCOL.md section
//! 12), reported apart, each on real producer stores relaying to a real
//! consumer: a conflict that stops the rest of its flow in one delivery,
//! two named producers sharing flow ids, fan-out with one consumer down, a
//! key bound to one producer posting another's events, and a producer
//! restored from a backup, told apart from an ordinary conflict.

use serde_json::{json, Value};

use super::child::{Ctx, RELAY};
use super::expect::{envelope, STEPS};
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
    produce_on(ctx, "{P}", flow, steps, quantity)
}

/// Produces `steps` steps of `flow` with `quantity` on the producer store
/// `producer` (`{P}`, or a file of the scenario's directory).
fn produce_on(
    ctx: &Ctx,
    producer: &str,
    flow: &str,
    steps: usize,
    quantity: i64,
) -> Result<(), String> {
    let quantity = quantity.to_string();
    for (i, step) in STEPS.iter().take(steps).enumerate() {
        let seq = i.to_string();
        let to: &str = step;
        let args = [
            "advance",
            "--producer",
            producer,
            "--flow",
            flow,
            "--expected-seq",
            &seq,
            "--to",
            to,
            "--quantity",
            &quantity,
        ];
        ctx.ok(&args)?;
    }
    Ok(())
}

/// A producer store of its own in the scenario's directory, named `name`
/// at init (an SQLite file on either backend).
fn named_producer(ctx: &Ctx, file: &str, name: &str) -> Result<String, String> {
    let path = ctx.dir.join(file).display().to_string();
    ctx.ok(&["init", "--producer", &path, "--producer-name", name])?;
    Ok(path)
}

/// One `relay` run from the producer store `producer` to the consumer.
fn relay_from(ctx: &Ctx, producer: &str, extra: &[&str]) -> Result<Value, String> {
    let args = [
        &["relay", "--producer", producer, "--consumer", "{C}"],
        extra,
    ]
    .concat();
    ctx.ok(&args)
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

/// The custody marks of the outbox of `producer`, by event id: accepted,
/// quarantined and the quarantine's reason.
fn marks(ctx: &Ctx, producer: &str) -> Result<Value, String> {
    let list = ctx.ok(&["outbox", "list", "--producer", producer])?;
    let rows = list["outbox"].as_array().cloned().unwrap_or_default();
    Ok(rows
        .iter()
        .map(|row| {
            json!([
                row["event_id"],
                row["accepted"],
                row["quarantined"],
                row["quarantine_reason"]
            ])
        })
        .collect())
}

/// Two producer stores set up under one name, `orders` (a second instance
/// given the first one's name): the consumer holds the first one's `a-1`;
/// the second appends `a-1` with another quantity, then `a-2`, `a-3` and
/// `b-1`, and relays with `--flow-events 4`. Its producer store hands
/// flow `a` over in one delivery: `a-1` is answered `conflict`, cause
/// `conflict` (another store delivered the held row), and quarantined;
/// `a-2` and `a-3` `conflict`, cause `after_conflict`: not stored, left
/// unmarked in the outbox; `b-1` of the same delivery is stored.
fn conflict_stops_its_flow_in_one_delivery(ctx: &Ctx) -> Result<Outcome, String> {
    let first = named_producer(ctx, "first.db", "orders")?;
    ctx.ok(&["init", "--producer", "{P}", "--producer-name", "orders"])?;
    ctx.ok(&["init", "--consumer", "{C}"])?;
    produce_on(ctx, &first, "a", 1, QUANTITY)?;
    relay_from(ctx, &first, &[])?;
    produce(ctx, "a", 3, QUANTITY + 1)?;
    produce(ctx, "b", 1, QUANTITY)?;
    let delivery = relay_from(ctx, "{P}", &["--flow-events", "4"])?;
    let mut conflict = delivery_of("a-1", "a", 1, "conflict");
    let after = |id: &str, seq: i64| {
        let mut after = delivery_of(id, "a", seq, "conflict");
        after["cause"] = json!("after_conflict");
        after
    };
    conflict["cause"] = json!("conflict");
    let accepted = delivery_of("b-1", "b", 1, "accepted");
    let delivered = vec![conflict, after("a-2", 2), after("a-3", 3), accepted];
    let stored = ctx.ok(&["inbox", "list", "--consumer", "{C}"])?;
    let held_a1 = (stored["inbox"].as_array())
        .and_then(|rows| rows.iter().find(|row| row["event_id"] == "a-1"))
        .map(|row| row["payload"].clone());
    Ok(Outcome {
        observed: json!({
            "delivery": delivery, "outbox": marks(ctx, "{P}")?,
            "inbox": inbox(ctx)?, "held_a_1": held_a1,
        }),
        expected: json!({
            "delivery": relayed(delivered, "drained"),
            "outbox": [
                ["a-1", false, true, "conflict"],
                ["a-2", false, false, null],
                ["a-3", false, false, null],
                ["b-1", true, false, null],
            ],
            "inbox": [["a-1", "pending"], ["b-1", "pending"]],
            "held_a_1": {"amount": QUANTITY},
        }),
    })
}

/// The identity (`store_id`) of the producer store `producer`.
fn store_id(ctx: &Ctx, producer: &str) -> Result<Value, String> {
    let status = ctx.ok(&["status", "--producer", producer])?;
    Ok(status["producer"]["store_id"].clone())
}

/// The consumer's rows of every producer, each as `[producer, event_id,
/// status, the name of the store that delivered it]`.
fn inbox_by_store(ctx: &Ctx, stores: &[(&str, Value)]) -> Result<Value, String> {
    let list = ctx.ok(&["inbox", "list", "--consumer", "{C}"])?;
    let rows = list["inbox"].as_array().cloned().unwrap_or_default();
    let delivered_by = |id: &Value| {
        (stores.iter())
            .find(|(_, store_id)| store_id == id)
            .map(|(name, _)| *name)
    };
    let mut rows: Vec<Value> = (rows.iter())
        .map(|row| {
            let by = delivered_by(&row["store_id"]);
            json!([row["producer"], row["event_id"], row["status"], by])
        })
        .collect();
    rows.sort_by_key(|row| row.to_string());
    Ok(Value::Array(rows))
}

/// Two producer stores, named `orders` and `payments` at init, both
/// append flow `a` (so both have events `a-1` and `a-2`, with other
/// quantities) and relay to one consumer: each `(producer, flow)` is its
/// own flow there, so nothing of one is a duplicate or a conflict of the
/// other's (`orders`' `a-1` handed over again after `payments`' is its own
/// duplicate); every row names the store that delivered it; apply drains
/// the two flows apart, each onto its own projection; the listing of one
/// producer's flow shows its rows only.
fn two_producers_share_flow_ids(ctx: &Ctx) -> Result<Outcome, String> {
    ctx.ok(&["init", "--producer", "{P}", "--producer-name", "orders"])?;
    ctx.ok(&["init", "--consumer", "{C}"])?;
    let payments = named_producer(ctx, "payments.db", "payments")?;
    produce(ctx, "a", 3, QUANTITY)?;
    produce_on(ctx, &payments, "a", 2, QUANTITY + 2)?;
    let orders_relay = relay_from(ctx, "{P}", &[])?;
    let payments_relay = relay_from(ctx, &payments, &[])?;
    let orders_again = relay_from(ctx, "{P}", &["--event", "a-1"])?;
    let stores = [
        ("orders", store_id(ctx, "{P}")?),
        ("payments", store_id(ctx, &payments)?),
    ];
    let stored = inbox_by_store(ctx, &stores)?;
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
    let delivered = |seqs: i64, receipt: &str| {
        let deliveries = (1..=seqs)
            .map(|seq| delivery_of(&format!("a-{seq}"), "a", seq, receipt))
            .collect();
        relayed(deliveries, "drained")
    };
    let flow = |producer: &str, applied: u64| {
        json!({"flow_id": "a", "producer": producer, "applied": applied, "stop": "idle",
               "reason": null, "detail": null})
    };
    let projected = |producer: &str, state: &str, quantity: i64, seq: i64| {
        json!({"flow_id": "a", "producer": producer, "state": state, "quantity": quantity,
               "applied_seq": seq})
    };
    let row = |producer: &str, id: &str| json!([producer, id, "pending", producer]);
    Ok(Outcome {
        observed: json!({
            "orders_relay": orders_relay,
            "payments_relay": payments_relay,
            "orders_again": orders_again,
            "stored": stored,
            "apply": applied,
            "payments_a": payments_rows,
            "projection": projection,
        }),
        expected: json!({
            "orders_relay": delivered(3, "accepted"),
            "payments_relay": delivered(2, "accepted"),
            "orders_again": delivered(1, "duplicate"),
            "stored": [
                row("orders", "a-1"), row("orders", "a-2"), row("orders", "a-3"),
                row("payments", "a-1"), row("payments", "a-2"),
            ],
            "apply": {"flows": [flow("orders", 3), flow("payments", 2)],
                      "flows_total": 2, "truncated": false},
            "payments_a": [["payments", "a-1", "applied"], ["payments", "a-2", "applied"]],
            "projection": [
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
