//! A producer restored from an older backup, on real files: it keeps its
//! store identity but forgot what it committed after the backup, so what it
//! commits again collides with what the consumer holds from it. The inbox
//! answers `conflict` of cause `producer_rewound`, the relay quarantines
//! that flow's event with that reason, every other flow (new ones included)
//! goes on, and the consumer's state is unchanged (PROTOCOL.md section 12).

use std::path::Path;

use ordo_core::{
    relay, ConsumerOps, FlowId, OutboxTx, ProducerOps, Receipt, RelayOptions, SchemaVersion,
    SystemClock, PRODUCER_REWOUND_REASON,
};
use ordo_sqlite::{ConsumerDb, ProducerDb, Schema};
use serde_json::json;

fn flow(id: &str) -> FlowId {
    FlowId::new(id).unwrap()
}

fn append(producer: &mut ProducerDb, flow_id: &str, amount: i64) {
    producer
        .write(|tx| {
            tx.append(
                &flow(flow_id),
                "placed",
                SchemaVersion::V1,
                &json!({ "amount": amount }),
            )
        })
        .unwrap();
}

fn relay_all(producer: &mut ProducerDb, consumer: &mut ConsumerDb) -> Vec<(String, Receipt)> {
    let report = relay(producer, consumer, &RelayOptions::default(), &SystemClock).unwrap();
    (report.deliveries.iter())
        .map(|d| (d.event_id.as_str().to_owned(), d.receipt))
        .collect()
}

/// Copies the producer's file to `backup` as SQLite's own backup does.
fn back_up(producer: &ProducerDb, backup: &Path) {
    producer
        .connection()
        .execute("VACUUM INTO ?1", [backup.to_str().unwrap()])
        .unwrap();
}

/// Puts `backup` in place of the producer's file `path` (and its WAL).
fn restore(backup: &Path, path: &Path) {
    for suffix in ["-wal", "-shm"] {
        let side = path.with_file_name(format!(
            "{}{suffix}",
            path.file_name().unwrap().to_str().unwrap()
        ));
        let _ = std::fs::remove_file(side);
    }
    std::fs::copy(backup, path).unwrap();
}

#[test]
fn a_restored_producer_is_told_apart_and_only_its_colliding_flows_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (p, c, backup) = (
        dir.path().join("p.db"),
        dir.path().join("c.db"),
        dir.path().join("b.db"),
    );
    let schema = Schema::new("ledger").unwrap();
    let mut producer = ProducerDb::open(&p, &schema).unwrap();
    let mut consumer = ConsumerDb::open(&c, &schema).unwrap();
    let id = producer.store_id().clone();
    append(&mut producer, "f", 1);
    relay_all(&mut producer, &mut consumer);
    back_up(&producer, &backup);
    // After the backup: f's seq 2 and g's seq 1 are committed and delivered.
    append(&mut producer, "f", 2);
    append(&mut producer, "g", 3);
    assert_eq!(relay_all(&mut producer, &mut consumer).len(), 2);
    let inbox_before = consumer.inbox().unwrap();
    drop(producer);

    restore(&backup, &p);
    let mut producer = ProducerDb::open(&p, &schema).unwrap();
    assert_eq!(
        producer.store_id(),
        &id,
        "a restored store keeps its identity"
    );
    // It commits again what it forgot, with other bodies, and a new flow.
    append(&mut producer, "f", 20);
    append(&mut producer, "g", 30);
    append(&mut producer, "h", 4);
    let mut delivered = relay_all(&mut producer, &mut consumer);
    delivered.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        delivered,
        vec![
            ("f-2".to_owned(), Receipt::ProducerRewound),
            ("g-1".to_owned(), Receipt::ProducerRewound),
            ("h-1".to_owned(), Receipt::Accepted),
        ]
    );
    let quarantined = producer.outbox_entries(true, 10).unwrap();
    assert_eq!(quarantined.len(), 2, "{quarantined:?}");
    for entry in &quarantined {
        assert_eq!(entry.quarantine_reason.as_deref(), Some("producer_rewound"));
        assert_eq!(
            entry.quarantine_detail.as_deref(),
            Some(PRODUCER_REWOUND_REASON)
        );
        assert_eq!(entry.last_outcome.as_deref(), Some("producer_rewound"));
    }
    // The consumer holds what it held, and the new flow.
    let inbox_after = consumer.inbox().unwrap();
    assert_eq!(inbox_after.len(), inbox_before.len() + 1);
    for record in &inbox_before {
        assert!(inbox_after.contains(record), "{record:?} changed");
    }
    // Nothing more of a rewound flow is delivered, even what is appended
    // later; other flows go on.
    append(&mut producer, "f", 21);
    append(&mut producer, "h", 5);
    let delivered = relay_all(&mut producer, &mut consumer);
    assert_eq!(delivered, vec![("h-2".to_owned(), Receipt::Accepted)]);
    assert_eq!(relay_all(&mut producer, &mut consumer), vec![]);
    // An operator's retry of the rewound event lifts the stop: it is handed
    // over again (and refused again, since the consumer still holds the
    // other body), and the flow stops there once more.
    let f2 = ordo_core::EventId::new("f-2").unwrap();
    producer.retry_quarantined(&f2).unwrap().unwrap();
    assert_eq!(
        relay_all(&mut producer, &mut consumer),
        vec![("f-2".to_owned(), Receipt::ProducerRewound)]
    );
    assert_eq!(relay_all(&mut producer, &mut consumer), vec![]);
    assert_eq!(consumer.inbox().unwrap().len(), inbox_before.len() + 2);
}
