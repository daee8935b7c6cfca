//! Runs the real program on real files and reads what it left behind.

use ordo_core::OutboxTx;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use ordo_core::{FlowId, SchemaVersion, SystemClock};
use ordo_sqlite::rusqlite::Connection;
use ordo_sqlite::{OpenOptions, ProducerDb};
use serde_json::json;

fn run(dir: &Path, orders: u32) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_orders-example"))
        .arg(dir)
        .arg(orders.to_string())
        .output()
        .unwrap();
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    output
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn shipping(dir: &Path) -> Connection {
    let conn = Connection::open(dir.join("shipping.db")).unwrap();
    let orders = dir.join("orders.db");
    conn.execute("ATTACH ?1 AS o", [orders.to_str().unwrap()])
        .unwrap();
    conn
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |row| row.get(0)).unwrap()
}

#[test]
fn every_order_reaches_shipping_once_across_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(dir.path(), 60);
    assert!(output.status.success(), "{output:?}");
    assert!(stdout(&output).contains("nothing lost, nothing doubled"));

    let conn = shipping(dir.path());
    assert_eq!(count(&conn, "SELECT count(*) FROM o.orders"), 60);
    assert_eq!(count(&conn, "SELECT count(*) FROM shipments"), 60);
    // 60 placed, 20 paid, 20 cancelled: one applied event each, in order.
    assert_eq!(count(&conn, "SELECT count(*) FROM o.outbox"), 100);
    assert_eq!(
        count(&conn, "SELECT count(*) FROM inbox WHERE status = 'applied'"),
        100
    );
    assert_eq!(count(&conn, "SELECT sum(events) FROM shipments"), 100);
    let disagreeing = count(
        &conn,
        "SELECT count(*) FROM o.orders JOIN shipments USING (order_id)
         WHERE (o.orders.status, shipments.status) NOT IN
               (VALUES ('placed', 'pending'), ('paid', 'ready'), ('cancelled', 'cancelled'))",
    );
    assert_eq!(disagreeing, 0);
    assert_eq!(
        count(
            &conn,
            "SELECT count(*) FROM shipments WHERE status = 'ready'"
        ),
        20
    );

    // A second run on the same files goes on from where the first stopped.
    let output = run(dir.path(), 9);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(count(&conn, "SELECT count(*) FROM shipments"), 69);
    assert_eq!(
        count(&conn, "SELECT sum(events) FROM shipments"),
        100 + 9 + 6
    );
}

/// Appends an event a newer orders release might send, straight through
/// ordo, as that release would.
fn inject(dir: &Path, order_id: &str, event_type: &str, payload: serde_json::Value) {
    let path = dir.join("orders.db");
    let mut producer =
        ProducerDb::open_existing(path, Arc::new(SystemClock), &OpenOptions::default()).unwrap();
    let flow = FlowId::new(order_id).unwrap();
    producer
        .write(|tx| tx.append(&flow, event_type, SchemaVersion::V1, &payload))
        .unwrap();
}

fn blocked(conn: &Connection, order_id: &str) -> Vec<(String, String, String)> {
    let mut stmt = conn
        .prepare(
            "SELECT type, reason, detail FROM inbox
             WHERE flow_id = ?1 AND status = 'blocked' ORDER BY seq",
        )
        .unwrap();
    let rows = stmt
        .query_map([order_id], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

#[test]
fn an_unknown_event_type_and_a_bad_payload_are_held_blocked_with_their_codes() {
    let dir = tempfile::tempdir().unwrap();
    assert!(run(dir.path(), 6).status.success());
    let conn = shipping(dir.path());
    let before: String = conn
        .query_row(
            "SELECT status FROM shipments WHERE order_id = 'order-2'",
            [],
            |row| row.get(0),
        )
        .unwrap();

    inject(
        dir.path(),
        "order-1",
        "order_refunded",
        json!({ "order_id": "order-1" }),
    );
    inject(dir.path(), "order-2", "order_paid", json!({ "order": 2 }));
    let output = run(dir.path(), 0);
    assert!(output.status.success(), "{output:?}");
    let out = stdout(&output);
    assert!(out.contains("order-1-3 unknown_event_type"), "{out}");
    assert!(out.contains("2 blocked"), "{out}");

    let refunded = blocked(&conn, "order-1");
    assert_eq!(refunded.len(), 1);
    assert_eq!(refunded[0].0, "order_refunded");
    assert_eq!(refunded[0].1, "unknown_event_type");
    assert!(
        refunded[0].2.contains("order_refunded"),
        "{:?}",
        refunded[0]
    );
    let paid = blocked(&conn, "order-2");
    assert_eq!(paid.len(), 1);
    assert_eq!(
        (paid[0].0.as_str(), paid[0].1.as_str()),
        ("order_paid", "bad_payload")
    );
    assert!(paid[0].2.contains("order_id"), "{:?}", paid[0]);
    // The blocked events changed nothing in shipping.
    let after: String = conn
        .query_row(
            "SELECT status FROM shipments WHERE order_id = 'order-2'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(after, before);
    assert_eq!(count(&conn, "SELECT sum(events) FROM shipments"), 6 + 4);
}

#[test]
fn an_effect_applied_twice_or_lost_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    assert!(run(dir.path(), 6).status.success());
    let conn = shipping(dir.path());
    conn.execute(
        "UPDATE shipments SET events = events + 1 WHERE order_id = 'order-3'",
        [],
    )
    .unwrap();
    conn.execute(
        "UPDATE shipments SET status = 'pending' WHERE order_id = 'order-4'",
        [],
    )
    .unwrap();
    let output = run(dir.path(), 0);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(
        errors.contains("order-3: 2 events applied, 3 in its shipment"),
        "{errors}"
    );
    assert!(errors.contains("order-4 is cancelled"), "{errors}");
    assert!(!stdout(&output).contains("nothing lost"));
}
