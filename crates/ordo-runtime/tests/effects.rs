//! Effect intents on a real SQLite file, for what the conformance suite
//! cannot read through the store traits: the repair log row of an
//! operator's action names the intent's key. The executor's behaviour on
//! every backend (order, backoff, the unknown path, fences, operators,
//! pruning) is the suite's (`ordo_testkit::suite`, run by each backend).

use std::sync::Arc;

use ordo_core::effect::{ActionRefused, EffectAction, EffectKey, EffectOps, EffectState};
use ordo_core::{
    process_all, ApplyContext, ConsumerOps, Envelope, Receive, StoreError, SystemClock, Verdict,
};
use ordo_sqlite::rusqlite::Connection;
use ordo_sqlite::{ConsumerDb, OpenOptions, Schema};
use serde_json::json;

fn handler(cx: &mut ApplyContext<Connection>, e: &Envelope) -> Result<Verdict, StoreError> {
    cx.effect("notify", &json!({"seq": e.seq.get()}))?;
    Ok(Verdict::Apply)
}

#[test]
fn an_operators_action_is_logged_with_the_intents_key() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema::new("shop").unwrap();
    let path = dir.path().join("shop.db");
    let clock = Arc::new(SystemClock);
    let mut db = ConsumerDb::open_with(&path, &schema, clock, &OpenOptions::default()).unwrap();
    let event = Envelope::parse_str(
        r#"{"event_id": "o-1-1", "flow_id": "o-1", "seq": 1,
            "schema_version": 1, "type": "placed", "payload": {}}"#,
    )
    .unwrap();
    db.receive(&event).unwrap();
    process_all(&mut db, None, &mut handler, 256).unwrap();
    let key = EffectKey::new(format!("{}/default/o-1/1/notify", db.store_id())).unwrap();
    let skipped = db
        .act_on_effect(&key, &EffectAction::Skip, "ops", "not wanted")
        .unwrap()
        .unwrap();
    assert_eq!(skipped.state, EffectState::Skipped);
    let refused = db
        .act_on_effect(&key, &EffectAction::Retry, "ops", "again")
        .unwrap();
    assert!(
        matches!(refused, Err(ActionRefused::State(_))),
        "{refused:?}"
    );
    let logged: Vec<(String, String, String)> = db
        .connection()
        .prepare("SELECT action, key, reason FROM repair_log ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let expected = ("effect_skip".to_string(), key.to_string());
    assert_eq!(logged, [(expected.0, expected.1, "not wanted".to_string())]);
}
