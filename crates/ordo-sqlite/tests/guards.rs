//! The inbox's own guards on a real file: a row settled, or a cursor moved,
//! by anything but the apply that holds the flow is never marked over or
//! moved back; the apply fails as a corrupt store and writes nothing.

use ordo_core::envelope::EventType;
use ordo_core::{
    ConsumerStore, Envelope, ErrorKind, EventId, FlowId, InboxStatus, SchemaVersion, Seq, Verdict,
};
use ordo_sqlite::rusqlite::{params, Connection};
use ordo_sqlite::{ConsumerDb, Schema};
use serde_json::json;

fn event(flow: &str, seq: i64) -> Envelope {
    let flow_id = FlowId::new(flow).unwrap();
    let seq = Seq::new(seq).unwrap();
    Envelope {
        event_id: EventId::for_seq(&flow_id, seq),
        flow_id,
        seq,
        schema_version: SchemaVersion::V1,
        event_type: EventType::new("noted").unwrap(),
        payload: json!({}).as_object().unwrap().clone(),
    }
}

fn consumer(dir: &std::path::Path) -> ConsumerDb {
    let schema = Schema::new("guards").unwrap();
    ConsumerDb::open(dir.join("consumer.db"), &schema).unwrap()
}

fn statuses(consumer: &mut ConsumerDb) -> Vec<InboxStatus> {
    consumer
        .inbox()
        .unwrap()
        .into_iter()
        .map(|r| r.status)
        .collect()
}

fn cursor(dir: &std::path::Path) -> Option<i64> {
    let conn = Connection::open(dir.join("consumer.db")).unwrap();
    conn.query_row(
        "SELECT applied_seq FROM inbox_cursor WHERE flow_id = 'f'",
        [],
        |row| row.get(0),
    )
    .ok()
}

#[test]
fn a_row_settled_under_its_apply_is_not_marked_applied_over() {
    let dir = tempfile::tempdir().unwrap();
    let mut inbox = consumer(dir.path());
    inbox.receive(&event("f", 1)).unwrap();
    let cursor_before = cursor(dir.path());
    let mut settle = |tx: &Connection, e: &Envelope| {
        tx.execute(
            "UPDATE inbox SET status = 'skipped', settled_at_ms = 0 WHERE flow_id = ?1 AND seq = ?2",
            params![e.flow_id.as_str(), e.seq.get()],
        )?;
        Ok(Verdict::Apply)
    };
    let flow = FlowId::new("f").unwrap();
    let error = inbox.apply_next_with(&flow, &mut settle).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupt, "{error}");
    assert_eq!(statuses(&mut inbox), [InboxStatus::Pending]);
    assert_eq!(cursor(dir.path()), cursor_before);
    let error = inbox
        .apply_batch_with(&[(flow, None)], 10, &mut settle)
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupt, "{error}");
    assert_eq!(statuses(&mut inbox), [InboxStatus::Pending]);
}

#[test]
fn a_cursor_moved_past_under_an_apply_is_not_moved_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut inbox = consumer(dir.path());
    inbox.receive(&event("f", 1)).unwrap();
    let mut jump = |tx: &Connection, _: &Envelope| {
        tx.execute(
            "INSERT INTO inbox_cursor (flow_id, applied_seq) VALUES ('f', 5)
             ON CONFLICT (flow_id) DO UPDATE SET applied_seq = 5",
            [],
        )?;
        Ok(Verdict::Apply)
    };
    let flow = FlowId::new("f").unwrap();
    for batch in [false, true] {
        let error = if batch {
            inbox.apply_batch_with(&[(flow.clone(), None)], 10, &mut jump)
        } else {
            inbox.apply_next_with(&flow, &mut jump).map(|_| Vec::new())
        }
        .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Corrupt, "{error}");
        assert_eq!(statuses(&mut inbox), [InboxStatus::Pending]);
        assert_eq!(cursor(dir.path()), None, "nothing was committed");
    }
}
