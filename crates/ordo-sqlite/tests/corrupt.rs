//! Rows changed outside ordo are reported as a damaged file, the same way
//! by every reader, never counted as something they are not.

use ordo_core::{ConsumerOps, Envelope, ErrorKind, Receive};
use ordo_sqlite::rusqlite::Connection;
use ordo_sqlite::{ConsumerDb, Schema};
use ordo_testkit::support::envelope;
use serde_json::json;

/// Event `seq` of `flow`, of type `placed`.
fn event(flow: &str, seq: i64) -> Envelope {
    envelope(
        &format!("{flow}-{seq}"),
        flow,
        seq,
        1,
        "placed",
        json!({ "total": 1 }),
    )
}

#[test]
fn an_unknown_inbox_status_is_corrupt_for_the_status_and_the_inbox_alike() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("consumer.db");
    let mut consumer = ConsumerDb::open(&path, &Schema::new("app").unwrap()).unwrap();
    consumer
        .receive_batch(&[event("a", 1), event("b", 1)])
        .unwrap();
    let status = consumer.consumer_status().unwrap();
    assert_eq!(status.pending, 2);

    let outside = Connection::open(&path).unwrap();
    outside
        .execute_batch(
            "PRAGMA ignore_check_constraints = ON;
             UPDATE inbox SET status = 'weird' WHERE event_id = 'b-1';",
        )
        .unwrap();
    drop(outside);

    let error = consumer.consumer_status().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupt, "{error}");
    assert!(error.to_string().contains("weird"), "{error}");
    let error = consumer.inbox().unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupt, "{error}");
}
