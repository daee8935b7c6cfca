//! Stores of other domains (docs/CLI.md "Additions of the second release"):
//! `init --domain`, one side at a time, the reservation-only commands'
//! refusal, and the commands that work on any domain.

mod common;

use common::*;
use ordo_core::OutboxTx;

/// A producer and a consumer store of the domain `orders`, made by `init`.
fn orders_lab() -> Lab {
    let lab = Lab::new();
    let out = lab.run(&[
        "init",
        "--producer",
        &lab.p,
        "--consumer",
        &lab.c,
        "--domain",
        "orders",
        "--json",
    ]);
    assert_eq!(
        out.json(),
        serde_json::json!({"producer": lab.p, "consumer": lab.c})
    );
    lab
}

/// [`orders_lab`] whose consumer has received `o-1`, the first event of flow
/// `o`, of type `event_type` with an empty payload.
fn orders_lab_holding(event_type: &str) -> Lab {
    let lab = orders_lab();
    lab.receive(&format!(
        r#"{{"event_id":"o-1","flow_id":"o","seq":1,"schema_version":1,"type":"{event_type}","payload":{{}}}}"#
    ));
    lab
}

#[test]
fn reservation_only_commands_refuse_other_domains_and_write_nothing() {
    let lab = orders_lab();
    let before = lab.files();
    let refusal = |store: &str| {
        format!("{store} belongs to domain \"orders\"; its handler runs in the application")
    };
    for json in [false, true] {
        let mut advance = first_advance(&lab.p, "f");
        let mut apply = vec!["apply", "--consumer", &lab.c];
        let mut retry = vec!["inbox", "retry", "--consumer", &lab.c, "--flow", "f"];
        if json {
            advance.push("--json");
            apply.push("--json");
            retry.push("--json");
        }
        lab.run(&advance).usage(&refusal(&lab.p));
        lab.run(&apply).usage(&refusal(&lab.c));
        lab.run(&retry).usage(&refusal(&lab.c));
    }
    lab.files().assert_unchanged(&before, "refused commands");
}

#[test]
fn init_never_changes_a_stores_domain() {
    let lab = orders_lab();
    let before = lab.files();
    lab.run(&["init", "--producer", &lab.p, "--domain", "shipping"])
        .usage("belongs to domain \"orders\"");
    lab.run(&["init", "--consumer", &lab.c, "--domain", "reservation"])
        .usage("belongs to domain \"orders\"");
    lab.run(&["init", "--consumer", &lab.c, "--domain", "Bad.Name"])
        .usage("--domain");
    // without --domain, init on an existing store is a no-op
    let out = lab.run(&["init", "--producer", &lab.p, "--consumer", &lab.c]);
    assert_eq!(out.code, 0, "{out:#?}");
    lab.files()
        .assert_unchanged(&before, "init on existing stores");
}

#[test]
fn one_side_init_and_snapshot_leave_the_other_side_alone() {
    let lab = Lab::new();
    let out = lab.run(&["init", "--consumer", &lab.c, "--json"]);
    assert_eq!(out.json(), serde_json::json!({"consumer": lab.c}));
    assert!(
        !std::path::Path::new(&lab.p).exists(),
        "only the consumer is created"
    );
    let snapshot = lab
        .run(&["snapshot", "--consumer", &lab.c, "--json"])
        .json();
    assert_eq!(keys(&snapshot), ["consumer"]);
    assert!(!std::path::Path::new(&lab.p).exists());
}

#[test]
fn other_domains_work_with_the_generic_commands() {
    let lab = orders_lab();
    let envelope = r#"{"event_id":"o-1","flow_id":"o","seq":1,"schema_version":1,"type":"order_placed","payload":{"total_cents":1200}}"#;
    let receipts = lab.receive(envelope);
    assert_eq!(receipts["receipts"][0]["receipt"], "accepted");
    let snapshot = lab.snapshot();
    assert_eq!(snapshot["producer"]["flows"], serde_json::json!([]));
    assert_applied(&snapshot, serde_json::json!([]), &[]);
    assert_eq!(snapshot["consumer"]["inbox"][0]["status"], "pending");
    let inbox = lab
        .run(&["inbox", "list", "--consumer", &lab.c, "--json"])
        .json();
    assert_eq!(inbox["inbox"][0]["event_id"], "o-1");
    let status = lab
        .run(&[
            "status",
            "--producer",
            &lab.p,
            "--consumer",
            &lab.c,
            "--json",
        ])
        .json();
    assert_eq!(status["consumer"]["pending"], 1);
}

#[test]
fn one_side_status_and_prune_report_only_that_side() {
    let lab = orders_lab_holding("order_placed");
    let status = lab.run(&["status", "--consumer", &lab.c, "--json"]).json();
    assert_eq!(keys(&status), ["breaches", "consumer", "ok"]);
    assert_eq!(status["consumer"]["pending"], 1);
    let mut orders = ordo_sqlite::ProducerDb::open_existing(
        &lab.p,
        std::sync::Arc::new(ordo_core::SystemClock),
        &ordo_sqlite::OpenOptions::default(),
    )
    .unwrap();
    let flow = ordo_core::FlowId::new("o").unwrap();
    let payload = serde_json::json!({});
    orders
        .write(|tx| {
            tx.append(
                &flow,
                "order_placed",
                ordo_core::SchemaVersion::V1,
                &payload,
            )
        })
        .unwrap();
    drop(orders);
    let status = lab.run(&[
        "status",
        "--producer",
        &lab.p,
        "--max-backlog",
        "0",
        "--json",
    ]);
    assert_eq!(status.code, 3, "{status:#?}");
    let pruned = lab
        .run(&[
            "prune",
            "--producer",
            &lab.p,
            "--older-than",
            "7d",
            "--json",
        ])
        .json();
    assert_eq!(keys(&pruned), ["cutoff_ms", "producer"]);
    let text = lab.run(&["prune", "--consumer", &lab.c, "--older-than", "7d"]);
    assert_eq!(
        text.stdout,
        "pruned 0 settled inbox rows (kept 0 fingerprints) older than 7d\n"
    );
}

#[test]
fn init_adopt_installs_ordo_beside_the_applications_tables() {
    let lab = Lab::new();
    let app = ordo_sqlite::rusqlite::Connection::open(&lab.p).unwrap();
    app.execute_batch(
        "CREATE TABLE orders (order_id TEXT PRIMARY KEY); INSERT INTO orders VALUES ('o-1');",
    )
    .unwrap();
    drop(app);
    let before = lab.files();
    lab.run(&["init", "--producer", &lab.p, "--domain", "orders"])
        .usage("ordo did not create");
    lab.files()
        .assert_unchanged(&before, "init without --adopt");
    let out = lab.run(&[
        "init",
        "--producer",
        &lab.p,
        "--domain",
        "orders",
        "--adopt",
        "--json",
    ]);
    assert_eq!(out.json(), serde_json::json!({"producer": lab.p}));
    let app = ordo_sqlite::rusqlite::Connection::open(&lab.p).unwrap();
    let orders: i64 = app
        .query_row("SELECT count(*) FROM orders", [], |row| row.get(0))
        .unwrap();
    assert_eq!(orders, 1, "the application's rows stay");
    drop(app);
    let status = lab.run(&["status", "--producer", &lab.p, "--json"]).json();
    assert_eq!(status["producer"]["backlog"], 0);
}

#[test]
fn inbox_list_shows_an_applications_own_block_code_and_detail() {
    use ordo_core::{ApplyContext, BlockCode, ConsumerStore, Envelope, StoreError, Verdict};
    use ordo_sqlite::rusqlite::Connection;

    let lab = orders_lab_holding("order_refunded");
    let mut consumer =
        ordo_sqlite::ConsumerDb::open(&lab.c, &ordo_sqlite::Schema::new("orders").unwrap())
            .unwrap();
    const UNKNOWN: BlockCode = BlockCode::from_static("unknown_event_type");
    let mut handler =
        |_: &mut ApplyContext<Connection>, event: &Envelope| -> Result<Verdict, StoreError> {
            Ok(Verdict::block_with(
                UNKNOWN,
                format!("no handler for {}", event.event_type),
            ))
        };
    consumer
        .apply_next_with(
            &ordo_core::InboxFlow::of_default(ordo_core::FlowId::new("o").unwrap()),
            &mut handler,
        )
        .unwrap();
    drop(consumer);

    let listed = lab
        .run(&["inbox", "list", "--consumer", &lab.c, "--blocked", "--json"])
        .json();
    let row = &listed["inbox"][0];
    assert_eq!(row["event_id"], "o-1");
    assert_eq!(row["status"], "blocked");
    assert_eq!(row["reason"], "unknown_event_type");
    assert_eq!(row["detail"], "no handler for order_refunded");
    let status = lab.run(&["status", "--consumer", &lab.c, "--json"]).json();
    assert_eq!(
        status["consumer"]["blocked"]["by_reason"]["unknown_event_type"],
        1
    );
}
