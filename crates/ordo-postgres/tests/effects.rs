//! Effect intents on a real server: recorded with the apply of their event,
//! one statement per batch, and gone with a blocked or refused apply
//! (EFFECTS.md "The intent"); claimed by several executors at once, each
//! intent by one of them, in order per flow; repaired by operators with
//! the repair log naming the key. The behaviour both backends share is
//! the conformance suite's (`ordo_testkit::suite`).

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ordo_core::effect::{
    self, ActionRefused, EffectAction, EffectFilter, EffectKey, EffectName, EffectOps,
    EffectPolicy, EffectState, Policies, Settle,
};
use ordo_core::{
    process_all, ApplyContext, BlockCode, Clock, ConsumerOps, Envelope, ErrorKind, Receive,
    StoreError, SystemClock, Verdict,
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

/// Records `first` then `second` for every event.
fn two_intents(cx: &mut ApplyContext<PgTx>, e: &Envelope) -> Result<Verdict, StoreError> {
    cx.effect("first", &json!({"seq": e.seq.get()}))?;
    cx.effect("second", &json!({"seq": e.seq.get()}))?;
    Ok(Verdict::Apply)
}

/// The policies of an executor running `first` and `second`.
struct Both;

impl Policies for Both {
    fn of(&self, _: &EffectName) -> Option<(EffectPolicy, bool)> {
        Some((EffectPolicy::default(), false))
    }

    fn names(&self) -> Vec<EffectName> {
        ["first", "second"]
            .map(|n| EffectName::new(n).unwrap())
            .into()
    }
}

const FLOWS: usize = 50;
const SEQS: i64 = 2;
const INTENTS: usize = FLOWS * SEQS as usize * 2;
const EXECUTORS: usize = 3;

/// One call an executor made: when (in the order of all calls), which
/// intent, and which executor.
type Call = (u64, EffectKey, usize);

/// One executor on its own connection: claims and runs what is due until
/// every intent was called, each call numbered in the order of all calls.
fn run_executor(target: &str, me: usize, next: &AtomicU64, calls: &Mutex<Vec<Call>>) {
    let options = test_options();
    let clock = Arc::new(SystemClock);
    let mut store = PgConsumer::open_with(target, &test_schema(), clock, &options).unwrap();
    let owner = format!("exec-{me}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while calls.lock().unwrap().len() < INTENTS {
        assert!(Instant::now() < deadline, "the executors stalled");
        let now_ms = SystemClock.now_ms();
        let round = effect::claim(&mut store, &Both, &owner, now_ms, 4).unwrap();
        assert!(round.settled.is_empty(), "nothing expires: {round:?}");
        if round.claimed.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        for claimed in &round.claimed {
            assert_eq!(claimed.attempt, 1, "{claimed:?}");
            let n = next.fetch_add(1, Ordering::SeqCst);
            calls.lock().unwrap().push((n, claimed.row.key.clone(), me));
            let success = Settle::Succeeded {
                result: format!(r#"{{"by":{me}}}"#),
            };
            let written = effect::record(&mut store, claimed, &success, SystemClock.now_ms());
            assert!(
                written.unwrap(),
                "the executor holding the attempt records it"
            );
        }
    }
}

/// Three executors, each on its own connection, claim from 200 intents of
/// 50 flows at once: every intent is called exactly once, and each flow's
/// intents in (seq, recording order), one after the other's outcome.
#[test]
fn several_executors_never_claim_one_intent_twice_and_keep_each_flows_order() {
    let (_dir, target) = fresh_database();
    let options = test_options();
    let mut inbox =
        PgConsumer::open_with(&target, &test_schema(), Arc::new(SystemClock), &options).unwrap();
    for flow in 0..FLOWS {
        for seq in 1..=SEQS {
            inbox
                .receive(&event(&format!("f-{flow}"), seq, "placed"))
                .unwrap();
        }
    }
    process_all(&mut inbox, None, &mut two_intents, 256).unwrap();
    let intents = inbox.effects(&EffectFilter::default(), 1_000).unwrap();
    assert_eq!(intents.len(), INTENTS);

    let next = AtomicU64::new(0);
    let calls = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for me in 0..EXECUTORS {
            let (target, next, calls) = (&target, &next, &calls);
            s.spawn(move || run_executor(target, me, next, calls));
        }
    });
    let mut calls = calls.into_inner().unwrap();
    calls.sort();
    let mut keys: Vec<&EffectKey> = calls.iter().map(|(_, key, _)| key).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), INTENTS, "every intent called exactly once");
    assert_eq!(calls.len(), INTENTS, "no intent called twice");

    // Each flow's calls, in the order they were made, are its intents in
    // (seq, position) order: the listing's order.
    let listed = inbox.effects(&EffectFilter::default(), 1_000).unwrap();
    for flow in 0..FLOWS {
        let flow_id = format!("f-{flow}");
        let expected: Vec<&EffectKey> = listed
            .iter()
            .filter(|i| i.flow_id.as_str() == flow_id)
            .map(|i| &i.key)
            .collect();
        let made: Vec<&EffectKey> = calls
            .iter()
            .filter(|(_, key, _)| key.as_str().contains(&format!("/{flow_id}/")))
            .map(|(_, key, _)| key)
            .collect();
        assert_eq!(made, expected, "{flow_id}");
    }
    assert!(
        listed
            .iter()
            .all(|i| i.state == EffectState::Succeeded && i.attempts == 1),
        "{listed:?}"
    );
    let counts = inbox.effect_counts(SystemClock.now_ms()).unwrap();
    assert_eq!(counts.of(EffectState::Succeeded), INTENTS as u64);
    assert_eq!(counts.oldest_pending_age_s, None);
    let by: Vec<usize> = (0..EXECUTORS)
        .map(|me| calls.iter().filter(|c| c.2 == me).count())
        .collect();
    eprintln!("calls by executor: {by:?}");
}

/// An operator's action is written to the repair log with the intent's
/// key, in the same transaction as the change; a refused one writes
/// nothing.
#[test]
fn an_operators_action_is_logged_with_the_intents_key() {
    let (_dir, target) = fresh_database();
    let options = test_options();
    let schema = options.schema.clone().unwrap();
    let mut inbox =
        PgConsumer::open_with(&target, &test_schema(), Arc::new(SystemClock), &options).unwrap();
    inbox.receive(&event("o-1", 1, "placed")).unwrap();
    process_all(&mut inbox, None, &mut handler, 256).unwrap();
    let key = EffectKey::new(format!("{}/default/o-1/1/notify", inbox.store_id())).unwrap();
    let skipped = inbox
        .act_on_effect(&key, &EffectAction::Skip, "ops", "not wanted")
        .unwrap()
        .unwrap();
    assert_eq!(skipped.state, EffectState::Skipped);
    let refused = inbox
        .act_on_effect(&key, &EffectAction::Retry, "ops", "again")
        .unwrap();
    assert!(
        matches!(refused, Err(ActionRefused::State(_))),
        "{refused:?}"
    );
    let sql = format!("SELECT action, key, decided_by, reason FROM {schema}.repair_log");
    let logged: Vec<(String, String, String, String)> = admin_client(&target)
        .query(&sql, &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let expected = ("effect_skip", key.as_str(), "ops", "not wanted");
    let expected = (
        expected.0.to_string(),
        expected.1.to_string(),
        expected.2.to_string(),
        expected.3.to_string(),
    );
    assert_eq!(logged, [expected]);
}
