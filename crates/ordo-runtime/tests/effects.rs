//! Effect intents end to end on real SQLite files: recorded by a handler in
//! its apply transaction, claimed and run by the executor, settled by its
//! answers, by expired leases and by operators (EFFECTS.md).

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::Arc;

use ordo_core::effect::{
    self, ActionRefused, Answer, EffectAction, EffectFilter, EffectKey, EffectOps, EffectPolicy,
    EffectState, Reconciled, Settle,
};
use ordo_core::{
    process_all, ApplyContext, BlockCode, Clock, ConsumerOps, Envelope, ErrorKind, Receive,
    StoreError, Verdict,
};
use ordo_runtime::Executor;
use ordo_sqlite::rusqlite::Connection;
use ordo_sqlite::{ConsumerDb, OpenOptions, Schema};
use serde_json::json;

const T0: i64 = 1_700_000_000_000;

/// A clock the test moves.
#[derive(Debug, Default)]
struct TestClock(AtomicI64);

impl Clock for TestClock {
    fn now_ms(&self) -> i64 {
        T0 + self.0.load(Ordering::SeqCst)
    }
}

impl TestClock {
    fn advance_ms(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

fn open(dir: &tempfile::TempDir) -> (ConsumerDb, Arc<TestClock>) {
    let clock = Arc::new(TestClock::default());
    let schema = Schema::new("shop").unwrap();
    let path = dir.path().join("shop.db");
    let db = ConsumerDb::open_with(&path, &schema, clock.clone(), &OpenOptions::default()).unwrap();
    (db, clock)
}

fn event(flow: &str, seq: i64, kind: &str) -> Envelope {
    Envelope::parse_str(&format!(
        r#"{{"event_id": "{flow}-{seq}", "flow_id": "{flow}", "seq": {seq},
            "schema_version": 1, "type": "{kind}", "payload": {{"n": {seq}}}}}"#
    ))
    .unwrap()
}

/// Records `notify` for every event; blocks `refused`; records `notify`
/// twice for `twice`.
fn handler(cx: &mut ApplyContext<Connection>, e: &Envelope) -> Result<Verdict, StoreError> {
    match e.event_type.as_str() {
        "refused" => {
            cx.effect("notify", &json!({"seq": e.seq.get()}))?;
            Ok(Verdict::block(BlockCode::from_static("refused")))
        }
        "twice" => {
            cx.effect("notify", &json!({}))?;
            let _dropped = cx.effect("notify", &json!({}));
            Ok(Verdict::Apply)
        }
        _ => {
            cx.effect("notify", &json!({"seq": e.seq.get()}))?;
            Ok(Verdict::Apply)
        }
    }
}

fn receive_and_apply(db: &mut ConsumerDb, events: &[Envelope]) -> Result<(), StoreError> {
    for e in events {
        db.receive(e)?;
    }
    process_all(db, None, &mut handler, 256).map(drop)
}

fn all(db: &mut ConsumerDb) -> Vec<effect::EffectEntry> {
    db.effects(&EffectFilter::default(), 100).unwrap()
}

fn key_of(db: &mut ConsumerDb, flow: &str, seq: i64) -> EffectKey {
    let store = db.store_id().clone();
    EffectKey::new(format!("{store}/default/{flow}/{seq}/notify")).unwrap()
}

#[test]
fn intents_commit_with_the_apply_and_roll_back_with_a_block_or_a_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let (mut db, _) = open(&dir);
    receive_and_apply(
        &mut db,
        &[event("o-1", 1, "placed"), event("o-1", 2, "refused")],
    )
    .unwrap();
    let intents = all(&mut db);
    assert_eq!(
        intents.len(),
        1,
        "the blocked event left no intent: {intents:?}"
    );
    let intent = &intents[0];
    assert_eq!(intent.key, key_of(&mut db, "o-1", 1));
    assert_eq!((intent.state, intent.attempts), (EffectState::Pending, 0));
    assert_eq!(intent.request, r#"{"seq":1}"#);

    // The same name twice for one event fails the whole apply, though the
    // handler dropped the error: nothing of it commits.
    let error = receive_and_apply(&mut db, &[event("o-2", 1, "twice")]).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidInput, "{error}");
    assert_eq!(all(&mut db).len(), 1);
    let inbox = db.inbox().unwrap();
    let o2 = inbox
        .iter()
        .find(|r| r.envelope.flow_id.as_str() == "o-2")
        .unwrap();
    assert_eq!(
        o2.status,
        ordo_core::InboxStatus::Pending,
        "the event was not applied"
    );
}

fn counting(
    calls: &Arc<AtomicU32>,
    answers: Vec<Answer>,
) -> impl FnMut(&ordo_runtime::Effect) -> Answer + Send + 'static {
    let calls = calls.clone();
    let mut answers = answers.into_iter();
    move |_| {
        calls.fetch_add(1, Ordering::SeqCst);
        answers
            .next()
            .unwrap_or(Answer::Succeeded(json!({"ok": true})))
    }
}

#[test]
fn an_executor_runs_a_flows_intents_in_order_and_retries_after_the_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let (mut db, clock) = open(&dir);
    receive_and_apply(
        &mut db,
        &[event("o-1", 1, "placed"), event("o-1", 2, "paid")],
    )
    .unwrap();
    let (first, second) = (key_of(&mut db, "o-1", 1), key_of(&mut db, "o-1", 2));
    let waiting = all(&mut db);
    assert_eq!(waiting[1].waiting_on.as_ref(), Some(&first));

    let calls = Arc::new(AtomicU32::new(0));
    let retry = Answer::Retry {
        reason: "503".into(),
        after_ms: Some(2_000),
    };
    let mut executor = Executor::new("exec-1", clock.clone());
    executor
        .register(
            "notify",
            EffectPolicy::default(),
            counting(&calls, vec![retry]),
        )
        .unwrap();

    let round = executor.run_once(&mut db).unwrap();
    assert_eq!(
        (round.attempted, round.retried),
        (1, 1),
        "only the flow's first intent"
    );
    let round = executor.run_once(&mut db).unwrap();
    assert_eq!(
        round.attempted, 0,
        "not due before the backoff and Retry-After"
    );
    clock.advance_ms(2_001);
    let round = executor.run_once(&mut db).unwrap();
    assert_eq!((round.attempted, round.succeeded), (1, 1));
    let round = executor.run_once(&mut db).unwrap();
    assert_eq!(
        (round.attempted, round.succeeded),
        (1, 1),
        "then the second"
    );
    let settled = all(&mut db);
    assert!(
        settled.iter().all(|i| i.state == EffectState::Succeeded),
        "{settled:?}"
    );
    assert_eq!((settled[0].key.clone(), settled[0].attempts), (first, 2));
    assert_eq!((settled[1].key.clone(), settled[1].attempts), (second, 1));
    assert_eq!(settled[0].result.as_deref(), Some(r#"{"ok":true}"#));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[test]
fn an_unknown_outcome_is_never_called_again_until_an_operator_acts() {
    let dir = tempfile::tempdir().unwrap();
    let (mut db, clock) = open(&dir);
    receive_and_apply(
        &mut db,
        &[event("o-1", 1, "placed"), event("o-1", 2, "paid")],
    )
    .unwrap();
    let first = key_of(&mut db, "o-1", 1);
    let calls = Arc::new(AtomicU32::new(0));
    let mut executor = Executor::new("exec-1", clock.clone());
    let unknown = Answer::Unknown("reset after the request was sent".into());
    executor
        .register(
            "notify",
            EffectPolicy::default(),
            counting(&calls, vec![unknown]),
        )
        .unwrap();

    assert_eq!(executor.run_once(&mut db).unwrap().unknown, 1);
    clock.advance_ms(3_600_000);
    assert_eq!(
        executor.run_once(&mut db).unwrap().attempted,
        0,
        "nothing calls it again"
    );
    let listed = all(&mut db);
    assert_eq!(listed[0].state, EffectState::OutcomeUnknown);
    assert_eq!(
        listed[1].waiting_on.as_ref(),
        Some(&first),
        "its flow waits on it"
    );

    // Refusals write nothing.
    let missing = EffectKey::new(format!("{}/default/o-9/1/notify", db.store_id())).unwrap();
    let refused = db
        .act_on_effect(&missing, &EffectAction::Skip, "ops", "why")
        .unwrap();
    assert!(matches!(refused, Err(ActionRefused::Unknown(_))));
    let counts = db.effect_counts(T0).unwrap();
    assert_eq!(counts.of(EffectState::OutcomeUnknown), 1);

    // The operator decides to call again: due now, more attempts.
    let entry = db
        .act_on_effect(
            &first,
            &EffectAction::Retry,
            "ops",
            "provider says not done",
        )
        .unwrap()
        .unwrap();
    assert_eq!(entry.state, EffectState::Pending);
    let round = executor.run_once(&mut db).unwrap();
    assert_eq!((round.attempted, round.succeeded), (1, 1));
    let refused = db
        .act_on_effect(&first, &EffectAction::Skip, "ops", "late")
        .unwrap();
    assert!(
        matches!(refused, Err(ActionRefused::State(_))),
        "{refused:?}"
    );
    let logged: Vec<(String, String)> = db
        .connection()
        .prepare("SELECT action, key FROM repair_log ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(logged, [("effect_retry".to_string(), first.to_string())]);
}

#[test]
fn inside_the_dedup_window_an_unknown_attempt_is_sent_again_under_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let (mut db, clock) = open(&dir);
    receive_and_apply(&mut db, &[event("o-1", 1, "placed")]).unwrap();
    let keys = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = keys.clone();
    let policy = EffectPolicy {
        dedup_window_ms: Some(86_400_000),
        ..EffectPolicy::default()
    };
    let mut executor = Executor::new("exec-1", clock.clone());
    executor
        .register("notify", policy, move |e| {
            let mut seen = seen.lock().unwrap();
            seen.push((e.key.clone(), e.attempt));
            match seen.len() {
                1 => Answer::Unknown("timeout".into()),
                _ => Answer::Succeeded(json!({})),
            }
        })
        .unwrap();
    assert_eq!(executor.run_once(&mut db).unwrap().retried, 1);
    assert_eq!(executor.run_once(&mut db).unwrap().succeeded, 1);
    let keys = keys.lock().unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0].0, keys[1].0, "the same key both times");
    assert_eq!((keys[0].1, keys[1].1), (1, 2));
}

#[test]
fn an_expired_lease_is_unknown_unless_the_reconcile_hook_can_tell() {
    for hook in [
        None,
        Some(Reconciled::Succeeded(json!({"found": true}))),
        Some(Reconciled::CannotTell),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (mut db, clock) = open(&dir);
        receive_and_apply(&mut db, &[event("o-1", 1, "placed")]).unwrap();
        // An executor that claimed and died: its claim committed, no answer.
        let dead = DeadExecutor;
        let claimed = effect::claim(&mut db, &dead, "dead", clock.now_ms(), 8).unwrap();
        assert_eq!(claimed.claimed.len(), 1);
        clock.advance_ms(EffectPolicy::default().lease_ms as i64);

        let calls = Arc::new(AtomicU32::new(0));
        let mut executor = Executor::new("exec-2", clock.clone());
        executor
            .register("notify", EffectPolicy::default(), counting(&calls, vec![]))
            .unwrap();
        if let Some(found) = hook.clone() {
            executor
                .reconcile("notify", move |_| found.clone())
                .unwrap();
        }
        executor.run_once(&mut db).unwrap();
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "never called again: {hook:?}"
        );
        let state = all(&mut db)[0].state;
        let expected = match hook {
            Some(Reconciled::Succeeded(_)) => EffectState::Succeeded,
            _ => EffectState::OutcomeUnknown,
        };
        assert_eq!(state, expected, "{hook:?}");

        // The dead executor's late answer: a definite one is taken by an
        // intent still unknown at that attempt, nothing else is.
        let late = &claimed.claimed[0];
        let retry = Settle::Pending {
            due_at_ms: 0,
            error: "late".into(),
            unknown: false,
        };
        assert!(!effect::record(&mut db, late, &retry, clock.now_ms()).unwrap());
        let success = Settle::Succeeded {
            result: "{}".into(),
        };
        let taken = effect::record(&mut db, late, &success, clock.now_ms()).unwrap();
        assert_eq!(taken, expected == EffectState::OutcomeUnknown, "{hook:?}");
    }
}

#[test]
fn prune_removes_settled_intents_past_the_cutoff() {
    let dir = tempfile::tempdir().unwrap();
    let (mut db, clock) = open(&dir);
    receive_and_apply(
        &mut db,
        &[event("o-1", 1, "placed"), event("o-2", 1, "placed")],
    )
    .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let mut executor = Executor::new("exec-1", clock.clone());
    let failed = Answer::Failed("400".into());
    executor
        .register(
            "notify",
            EffectPolicy::default(),
            counting(&calls, vec![failed]),
        )
        .unwrap();
    executor.batch_len_max(1);
    executor.run_once(&mut db).unwrap();
    clock.advance_ms(10);
    let pending = key_of(&mut db, "o-2", 1);
    db.prune_inbox(clock.now_ms()).unwrap();
    let left: Vec<_> = all(&mut db).into_iter().map(|i| i.key).collect();
    assert_eq!(
        left,
        [pending],
        "the failed one is pruned, the pending one kept"
    );
}

/// The claim of an executor that dies before it calls.
struct DeadExecutor;

impl effect::Policies for DeadExecutor {
    fn of(&self, _: &effect::EffectName) -> Option<(EffectPolicy, bool)> {
        Some((EffectPolicy::default(), false))
    }

    fn names(&self) -> Vec<effect::EffectName> {
        vec![effect::EffectName::new("notify").unwrap()]
    }
}
