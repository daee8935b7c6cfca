//! External effects (docs/EFFECTS.md) on a backend's consumer store: intents
//! recorded by a handler in its apply transaction, claimed and run by the
//! runtime's executor, settled by its answers, by expired leases (with the
//! late answer's fence) and by operators, and pruned once settled.
//!
//! Time is always controlled: a [`ManualClock`] read by the store and the
//! executor alike.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use ordo_core::effect::{
    self, ActionRefused, Answer, EffectAction, EffectEntry, EffectFilter, EffectKey, EffectName,
    EffectOps, EffectPolicy, EffectState, Policies, Reconciled, Settle,
};
use ordo_core::{
    process_all, ApplyContext, BlockCode, ConsumerOps, ConsumerStore, Envelope, ErrorKind,
    InboxStatus, StoreError, Verdict,
};
use ordo_runtime::Executor;
use serde_json::json;

use crate::support::*;
use crate::Backend;

/// Records `notify` for every event; blocks `refused` after recording it;
/// records `notify` twice for `twice` (the second refused, its error
/// dropped by the handler).
fn handler<Tx: ?Sized>(cx: &mut ApplyContext<'_, Tx>, e: &Envelope) -> Result<Verdict, StoreError> {
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

fn receive_and_apply<C: ConsumerStore + ?Sized>(
    consumer: &mut C,
    events: &[Envelope],
) -> Result<(), StoreError> {
    for e in events {
        consumer.receive(e)?;
    }
    process_all(consumer, None, &mut handler::<C::Tx>, 256).map(drop)
}

fn event(flow_id: &str, seq: i64, kind: &str) -> Envelope {
    event_at(flow_id, seq, kind, json!({"n": seq}))
}

fn all<C: EffectOps + ?Sized>(consumer: &mut C) -> Vec<EffectEntry> {
    consumer
        .effects(&EffectFilter::default(), 100)
        .expect("effects")
}

/// The key ordo derives for the `notify` intent of `flow_id` at `seq`.
fn key_of<C: ConsumerOps + ?Sized>(consumer: &C, flow_id: &str, seq: i64) -> EffectKey {
    let store = consumer.store_id();
    EffectKey::new(format!("{store}/default/{flow_id}/{seq}/notify")).expect("a key")
}

/// An effect code counting its calls, answering `answers` in turn, then
/// success.
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

/// An executor named `owner` on the test's clock, running `notify` under
/// `policy` with `code`.
fn executor(
    owner: &str,
    clock: &ManualClock,
    policy: EffectPolicy,
    code: impl FnMut(&ordo_runtime::Effect) -> Answer + Send + 'static,
) -> Executor {
    let mut executor = Executor::new(owner, Arc::new(clock.clone()));
    executor.register("notify", policy, code).expect("register");
    executor
}

/// An intent commits with its event's apply; a blocked event leaves none,
/// and a refused intent (the same name twice for one event) fails the
/// whole apply, though the handler dropped the error: nothing of it
/// commits and the event stays pending.
pub fn effects_commit_with_the_apply_and_never_with_a_block_or_a_refusal<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (_p, mut c) = open_at::<B>(dir, &clock);
    let events = [event("o-1", 1, "placed"), event("o-1", 2, "refused")];
    receive_and_apply(&mut c, &events).expect("apply");
    let intents = all(&mut c);
    assert_eq!(intents.len(), 1, "the blocked event left none: {intents:?}");
    let intent = &intents[0];
    assert_eq!(intent.key, key_of(&c, "o-1", 1));
    assert_eq!((intent.state, intent.attempts), (EffectState::Pending, 0));
    assert_eq!(intent.request, r#"{"seq":1}"#);
    assert_eq!(intent.next_attempt_at_ms, Some(T0), "due at once");
    assert_eq!(intent.waiting_on, None);

    let error = receive_and_apply(&mut c, &[event("o-2", 1, "twice")]).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidInput, "{error}");
    assert_eq!(all(&mut c).len(), 1);
    let o2 = event("o-2", 1, "twice");
    assert_eq!(
        inbox_status(&mut c, &o2.event_id),
        InboxStatus::Pending,
        "the event was not applied"
    );
    let counts = c.effect_counts(T0 + 1_500).expect("counts");
    assert_eq!(counts.of(EffectState::Pending), 1);
    assert_eq!(counts.oldest_pending_age_s, Some(1.5));
}

/// A flow's intents run in (seq, recording order): the second waits on
/// the first (listed with its key) until the first is settled, and a
/// retryable answer makes the first due again no sooner than its
/// Retry-After.
pub fn effects_run_in_order_per_flow_and_retry_after_the_backoff<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (_p, mut c) = open_at::<B>(dir, &clock);
    let events = [event("o-1", 1, "placed"), event("o-1", 2, "paid")];
    receive_and_apply(&mut c, &events).expect("apply");
    let (first, second) = (key_of(&c, "o-1", 1), key_of(&c, "o-1", 2));
    assert_eq!(all(&mut c)[1].waiting_on.as_ref(), Some(&first));

    let calls = Arc::new(AtomicU32::new(0));
    let retry = Answer::Retry {
        reason: "503".into(),
        after_ms: Some(2_000),
    };
    let code = counting(&calls, vec![retry]);
    let mut executor = executor("exec-1", &clock, EffectPolicy::default(), code);
    let round = executor.run_once(&mut c).expect("run");
    assert_eq!((round.attempted, round.retried), (1, 1), "only the first");
    let pending = &all(&mut c)[0];
    assert_eq!(pending.state, EffectState::Pending);
    assert!(
        pending.next_attempt_at_ms >= Some(T0 + 2_000),
        "{pending:?}"
    );
    assert!(pending
        .last_error
        .as_ref()
        .is_some_and(|e| e.contains("503")));
    let round = executor.run_once(&mut c).expect("run");
    assert_eq!(round.attempted, 0, "not due before Retry-After");
    clock.set(T0 + 2_001);
    let round = executor.run_once(&mut c).expect("run");
    assert_eq!((round.attempted, round.succeeded), (1, 1));
    let round = executor.run_once(&mut c).expect("run");
    assert_eq!(
        (round.attempted, round.succeeded),
        (1, 1),
        "then the second"
    );
    let settled = all(&mut c);
    assert!(
        settled.iter().all(|i| i.state == EffectState::Succeeded),
        "{settled:?}"
    );
    assert_eq!((settled[0].key.clone(), settled[0].attempts), (first, 2));
    assert_eq!((settled[1].key.clone(), settled[1].attempts), (second, 1));
    assert_eq!(settled[0].result.as_deref(), Some(r#"{"ok":true}"#));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// An unknown answer without a dedup window or reconcile hook ends
/// `outcome_unknown`: never called again by itself, its flow waiting on
/// it, until an operator's retry. Refused actions write nothing; the one
/// taken is in the repair log.
pub fn effects_an_unknown_outcome_waits_for_an_operator<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (_p, mut c) = open_at::<B>(dir, &clock);
    let events = [event("o-1", 1, "placed"), event("o-1", 2, "paid")];
    receive_and_apply(&mut c, &events).expect("apply");
    let first = key_of(&c, "o-1", 1);
    let calls = Arc::new(AtomicU32::new(0));
    let unknown = Answer::Unknown("reset after the request was sent".into());
    let code = counting(&calls, vec![unknown]);
    let mut executor = executor("exec-1", &clock, EffectPolicy::default(), code);

    assert_eq!(executor.run_once(&mut c).expect("run").unknown, 1);
    clock.set(T0 + 3_600_000);
    let round = executor.run_once(&mut c).expect("run");
    assert_eq!(round.attempted, 0, "nothing calls it again");
    let listed = all(&mut c);
    assert_eq!(listed[0].state, EffectState::OutcomeUnknown);
    assert_eq!(
        listed[1].waiting_on.as_ref(),
        Some(&first),
        "its flow waits"
    );

    let missing = key_of(&c, "o-9", 1);
    let refused = c.act_on_effect(&missing, &EffectAction::Skip, "ops", "why");
    assert!(matches!(refused, Ok(Err(ActionRefused::Unknown(_)))));
    let entry = c
        .act_on_effect(
            &first,
            &EffectAction::Retry,
            "ops",
            "provider says not done",
        )
        .expect("act")
        .expect("retry allowed");
    assert_eq!(entry.state, EffectState::Pending);
    assert_eq!(entry.next_attempt_at_ms, Some(T0 + 3_600_000), "due now");
    let round = executor.run_once(&mut c).expect("run");
    assert_eq!((round.attempted, round.succeeded), (1, 1));
    let after = all(&mut c);
    let refused = c.act_on_effect(&first, &EffectAction::Skip, "ops", "late");
    assert!(
        matches!(refused, Ok(Err(ActionRefused::State(_)))),
        "{refused:?}"
    );
    assert_eq!(all(&mut c), after, "a refusal writes nothing");
    let logged: Vec<_> = c.repairs().expect("repairs");
    let logged: Vec<_> = logged
        .iter()
        .map(|r| {
            (
                r.action.as_str(),
                r.flow_id.as_str(),
                r.seq.get(),
                r.by.as_str(),
            )
        })
        .collect();
    assert_eq!(logged, [("effect_retry", "o-1", 1, "ops")]);
}

/// Inside the provider's dedup window an unknown attempt is sent again
/// under the same key, with the next attempt number.
pub fn effects_a_dedup_window_sends_again_under_the_same_key<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (_p, mut c) = open_at::<B>(dir, &clock);
    receive_and_apply(&mut c, &[event("o-1", 1, "placed")]).expect("apply");
    let keys = Arc::new(Mutex::new(Vec::new()));
    let seen = keys.clone();
    let policy = EffectPolicy {
        dedup_window_ms: Some(86_400_000),
        ..EffectPolicy::default()
    };
    let mut executor = executor("exec-1", &clock, policy, move |e| {
        let mut seen = seen.lock().expect("lock");
        seen.push((e.key.clone(), e.attempt));
        match seen.len() {
            1 => Answer::Unknown("timeout".into()),
            _ => Answer::Succeeded(json!({})),
        }
    });
    assert_eq!(executor.run_once(&mut c).expect("run").retried, 1);
    assert_eq!(executor.run_once(&mut c).expect("run").succeeded, 1);
    let keys = keys.lock().expect("lock");
    let first = key_of(&c, "o-1", 1);
    assert_eq!(*keys, [(first.clone(), 1), (first, 2)]);
}

/// An executor that claimed and died leaves an expired lease: the next
/// claim never calls again; without a hook, or when the hook cannot tell,
/// the intent is `outcome_unknown`, else what the hook found. The dead
/// attempt's late answer is fenced: a retryable one changes nothing, a
/// definite one is taken only by an intent still unknown at that attempt.
pub fn effects_an_expired_lease_is_unknown_unless_reconcile_can_tell<B: Backend>(dir: &Path) {
    let hooks = [
        None,
        Some(Reconciled::Succeeded(json!({"found": true}))),
        Some(Reconciled::CannotTell),
    ];
    for (n, hook) in hooks.into_iter().enumerate() {
        let clock = ManualClock::new(T0);
        let dir = dir.join(n.to_string());
        std::fs::create_dir_all(&dir).expect("a directory of its own");
        let (_p, mut c) = open_at::<B>(&dir, &clock);
        receive_and_apply(&mut c, &[event("o-1", 1, "placed")]).expect("apply");
        let claimed = effect::claim(&mut c, &DeadExecutor, "dead", T0, 8).expect("claim");
        assert_eq!(claimed.claimed.len(), 1);
        assert_eq!(all(&mut c)[0].state, EffectState::InFlight);
        clock.set(T0 + EffectPolicy::default().lease_ms as i64);

        let calls = Arc::new(AtomicU32::new(0));
        let code = counting(&calls, vec![]);
        let mut executor = executor("exec-2", &clock, EffectPolicy::default(), code);
        if let Some(found) = hook.clone() {
            executor
                .reconcile("notify", move |_| found.clone())
                .expect("hook");
        }
        executor.run_once(&mut c).expect("run");
        assert_eq!(calls.load(Ordering::SeqCst), 0, "not called: {hook:?}");
        let expected = match hook {
            Some(Reconciled::Succeeded(_)) => EffectState::Succeeded,
            _ => EffectState::OutcomeUnknown,
        };
        assert_eq!(all(&mut c)[0].state, expected, "{hook:?}");

        let late = &claimed.claimed[0];
        let retry = Settle::Pending {
            due_at_ms: 0,
            error: "late".into(),
            unknown: false,
        };
        assert!(!effect::record(&mut c, late, &retry, clock.now()).expect("record"));
        assert_eq!(all(&mut c)[0].state, expected, "{hook:?}");
        let success = Settle::Succeeded {
            result: "{}".into(),
        };
        let taken = effect::record(&mut c, late, &success, clock.now()).expect("record");
        assert_eq!(taken, expected == EffectState::OutcomeUnknown, "{hook:?}");
        assert_eq!(all(&mut c)[0].state, EffectState::Succeeded, "{hook:?}");
    }
}

/// Pruning the inbox removes the intents settled before the cutoff and
/// keeps those not settled.
pub fn effects_prune_removes_settled_intents<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (_p, mut c) = open_at::<B>(dir, &clock);
    let events = [event("o-1", 1, "placed"), event("o-2", 1, "placed")];
    receive_and_apply(&mut c, &events).expect("apply");
    let calls = Arc::new(AtomicU32::new(0));
    let failed = Answer::Failed("400".into());
    let code = counting(&calls, vec![failed]);
    let mut executor = executor("exec-1", &clock, EffectPolicy::default(), code);
    executor.batch_len_max(1);
    assert_eq!(executor.run_once(&mut c).expect("run").failed, 1);
    c.prune_inbox(T0).expect("prune");
    assert_eq!(all(&mut c).len(), 2, "settled at the cutoff: kept");
    clock.set(T0 + 10);
    c.prune_inbox(T0 + 10).expect("prune");
    let left: Vec<_> = all(&mut c).into_iter().map(|i| i.key).collect();
    assert_eq!(left, [key_of(&c, "o-2", 1)], "the failed one pruned");
}

/// The claim of an executor that dies before it calls.
struct DeadExecutor;

impl Policies for DeadExecutor {
    fn of(&self, _: &EffectName) -> Option<(EffectPolicy, bool)> {
        Some((EffectPolicy::default(), false))
    }

    fn names(&self) -> Vec<EffectName> {
        vec![EffectName::new("notify").expect("a name")]
    }
}
