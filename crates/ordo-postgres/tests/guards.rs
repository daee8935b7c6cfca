//! The inbox's own guards on a real server: a row settled, or a cursor
//! moved, by anything but the apply that holds the flow is never marked
//! over or moved back; the apply fails as a corrupt store and writes
//! nothing.

mod support;

use std::sync::Arc;

use ordo_core::envelope::EventType;
use ordo_core::{
    ConsumerStore, Envelope, ErrorKind, EventId, FlowId, InboxStatus, SchemaVersion, Seq,
    StoreError, SystemClock, Verdict,
};
use ordo_postgres::{PgConsumer, PgTx};
use serde_json::json;
use support::{admin_client, fresh_database, test_options, test_schema};

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

fn statuses(consumer: &mut PgConsumer) -> Vec<InboxStatus> {
    consumer
        .inbox()
        .unwrap()
        .into_iter()
        .map(|r| r.status)
        .collect()
}

fn cursor(target: &str, schema: &str) -> Option<i64> {
    admin_client(target)
        .query_opt(
            &format!("SELECT applied_seq FROM {schema}.inbox_cursor WHERE flow_id = 'f'"),
            &[],
        )
        .unwrap()
        .map(|row| row.get(0))
}

fn open(target: &str) -> PgConsumer {
    PgConsumer::open_with(
        target,
        &test_schema(),
        Arc::new(SystemClock),
        &test_options(),
    )
    .unwrap()
}

fn settle(tx: &PgTx, e: &Envelope) -> Result<Verdict, StoreError> {
    let sql = format!(
        "UPDATE {}.inbox SET status = 'skipped', settled_at_ms = 0 WHERE flow_id = $1 AND seq = $2",
        tx.ordo_schema()
    );
    tx.execute(&sql, &[&e.flow_id.as_str(), &e.seq.get()])?;
    Ok(Verdict::Apply)
}

fn jump(tx: &PgTx, _: &Envelope) -> Result<Verdict, StoreError> {
    let sql = format!(
        "UPDATE {}.inbox_cursor SET applied_seq = 5 WHERE flow_id = 'f'",
        tx.ordo_schema()
    );
    tx.execute(&sql, &[])?;
    Ok(Verdict::Apply)
}

#[test]
fn a_row_settled_under_its_apply_is_not_marked_applied_over() {
    let (_dir, target) = fresh_database();
    let mut inbox = open(&target);
    inbox.receive(&event("f", 1)).unwrap();
    let schema = test_options().schema.unwrap();
    let before = cursor(&target, &schema);
    let flow = FlowId::new("f").unwrap();
    let error = inbox.apply_next_with(&flow, &mut settle).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupt, "{error}");
    let error = inbox
        .apply_batch_with(&[(flow, None)], 10, &mut settle)
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Corrupt, "{error}");
    assert_eq!(statuses(&mut inbox), [InboxStatus::Pending]);
    assert_eq!(cursor(&target, &schema), before);
}

#[test]
fn a_cursor_moved_past_under_an_apply_is_not_moved_back() {
    let (_dir, target) = fresh_database();
    let mut inbox = open(&target);
    inbox.receive(&event("f", 1)).unwrap();
    let schema = test_options().schema.unwrap();
    let before = cursor(&target, &schema);
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
        assert_eq!(cursor(&target, &schema), before, "nothing was committed");
    }
}
