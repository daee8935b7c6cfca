//! Effect intents on a real server: recorded with the apply of their event,
//! one statement per batch, and gone with a blocked or refused apply
//! (EFFECTS.md "The intent").

mod support;

use std::sync::Arc;

use ordo_core::{
    process_all, ApplyContext, BlockCode, ConsumerOps, Envelope, ErrorKind, Receive, StoreError,
    SystemClock, Verdict,
};
use ordo_postgres::{PgConsumer, PgTx};
use serde_json::json;
use support::{admin_client, fresh_database, test_options, test_schema};

fn event(flow: &str, seq: i64, kind: &str) -> Envelope {
    Envelope::parse_str(&format!(
        r#"{{"event_id": "{flow}-{seq}", "flow_id": "{flow}", "seq": {seq},
            "schema_version": 1, "type": "{kind}", "payload": {{}}}}"#
    ))
    .unwrap()
}

fn handler(cx: &mut ApplyContext<PgTx>, e: &Envelope) -> Result<Verdict, StoreError> {
    cx.effect("notify", &json!({"seq": e.seq.get()}))?;
    match e.event_type.as_str() {
        "refused" => Ok(Verdict::block(BlockCode::from_static("refused"))),
        "twice" => {
            let _dropped = cx.effect("notify", &json!({}));
            Ok(Verdict::Apply)
        }
        _ => Ok(Verdict::Apply),
    }
}

#[test]
fn intents_commit_with_their_apply_and_never_with_a_block_or_a_refusal() {
    let (_dir, target) = fresh_database();
    let options = test_options();
    let schema = options.schema.clone().unwrap();
    let mut inbox =
        PgConsumer::open_with(&target, &test_schema(), Arc::new(SystemClock), &options).unwrap();
    let events = [
        event("o-1", 1, "placed"),
        event("o-1", 2, "paid"),
        event("o-1", 3, "refused"),
    ];
    for e in &events {
        inbox.receive(e).unwrap();
    }
    process_all(&mut inbox, None, &mut handler, 256).unwrap();
    inbox.receive(&event("o-2", 1, "twice")).unwrap();
    let error = process_all(&mut inbox, None, &mut handler, 256).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidInput, "{error}");

    let sql = format!(
        "SELECT key, flow_id, seq, position, event_id, request, state
         FROM {schema}.effect_intent ORDER BY flow_id, seq"
    );
    let rows: Vec<(String, String, i64, i32, String, String, String)> = admin_client(&target)
        .query(&sql, &[])
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
                r.get(6),
            )
        })
        .collect();
    let store = inbox.store_id().to_string();
    let expected: Vec<_> = [1, 2]
        .map(|seq| {
            (
                format!("{store}/default/o-1/{seq}/notify"),
                "o-1".to_string(),
                seq,
                0,
                format!("o-1-{seq}"),
                format!(r#"{{"seq":{seq}}}"#),
                "pending".to_string(),
            )
        })
        .into();
    assert_eq!(rows, expected, "only the applied events' intents");
}
