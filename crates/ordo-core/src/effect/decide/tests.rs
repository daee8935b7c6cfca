use super::*;
use serde_json::json;

const NOW: i64 = 100_000;

fn stored(attempts: u32, unknown_seen: bool) -> StoredAttempt {
    StoredAttempt {
        attempts,
        attempts_base: 0,
        unknown_seen,
        first_attempt_at_ms: NOW - 1_000,
    }
}

fn windowed(window_ms: u64) -> EffectPolicy {
    EffectPolicy {
        dedup_window_ms: Some(window_ms),
        ..EffectPolicy::default()
    }
}

fn retry() -> Answer {
    Answer::Retry {
        reason: "503".into(),
        after_ms: None,
    }
}

fn unknown() -> Answer {
    Answer::Unknown("timeout".into())
}

type Case = (EffectPolicy, bool, u32, bool, Answer, EffectState);

fn check(cases: Vec<Case>) {
    for (policy, hook, attempts, seen, answer, expected) in cases {
        let at = stored(attempts, seen);
        let settle = after_answer(&policy, hook, &at, answer.clone(), NOW, 0.5);
        assert_eq!(
            settle.state(),
            expected,
            "{policy:?} {hook} {attempts} {seen} {answer:?}"
        );
    }
}

#[test]
fn answers_move_an_attempt_as_the_transition_table_says() {
    use EffectState::*;
    let p = EffectPolicy::default();
    let ok = || Answer::Succeeded(json!({"id": 7}));
    let failed = || Answer::Failed("400".into());
    // (policy, reconcile hook, attempts, unknown seen, answer, expected state)
    check(vec![
        (p, false, 1, false, ok(), Succeeded),
        (p, false, 1, false, failed(), Failed),
        (p, false, 1, false, retry(), Pending),
        (p, false, 8, false, retry(), Failed),
        (p, false, 8, true, retry(), OutcomeUnknown),
        (p, false, 1, false, unknown(), OutcomeUnknown),
        (p, true, 1, false, unknown(), InFlight),
    ]);
}

#[test]
fn an_unknown_answer_within_a_dedup_window_is_sent_again() {
    use EffectState::*;
    let (day, short) = (windowed(3_600_000), windowed(5_000));
    check(vec![
        (day, false, 1, false, unknown(), Pending),
        (day, true, 1, false, unknown(), Pending),
        (day, false, 8, false, unknown(), OutcomeUnknown),
        (short, false, 1, false, unknown(), OutcomeUnknown),
        (short, true, 1, false, unknown(), InFlight),
    ]);
}

#[test]
fn a_retry_waits_the_backoff_and_never_less_than_retry_after() {
    let plain = EffectPolicy::default();
    let Settle::Pending {
        due_at_ms, unknown, ..
    } = after_answer(&plain, false, &stored(3, false), retry(), NOW, 0.999_999)
    else {
        panic!("a retry with attempts left is pending");
    };
    assert_eq!((due_at_ms, unknown), (NOW + 4_000, false));
    let late = Answer::Retry {
        reason: "429".into(),
        after_ms: Some(90_000),
    };
    let Settle::Pending { due_at_ms, .. } =
        after_answer(&plain, false, &stored(1, false), late, NOW, 0.0)
    else {
        panic!("pending");
    };
    assert_eq!(due_at_ms, NOW + 90_000);
    // An operator's retry grants max_attempts again.
    let granted = StoredAttempt {
        attempts_base: 8,
        ..stored(9, false)
    };
    assert_eq!(
        after_answer(&plain, false, &granted, retry(), NOW, 0.0).state(),
        EffectState::Pending
    );
}

#[test]
fn an_unknown_outcome_inside_the_window_is_sent_again_and_remembered() {
    let settle = after_answer(
        &windowed(3_600_000),
        false,
        &stored(1, false),
        unknown(),
        NOW,
        0.0,
    );
    assert_eq!(
        settle,
        Settle::Pending {
            due_at_ms: NOW,
            error: "timeout".into(),
            unknown: true
        }
    );
    // At the resend's claim, the window is checked again.
    let seen = stored(1, true);
    assert_eq!(
        claim_mode(&windowed(3_600_000), false, &seen, NOW),
        ClaimMode::Call
    );
    let closed = NOW + 3_600_000;
    assert_eq!(
        claim_mode(&windowed(3_600_000), false, &seen, closed),
        ClaimMode::Unknown
    );
    assert_eq!(
        claim_mode(&windowed(3_600_000), true, &seen, closed),
        ClaimMode::Reconcile
    );
    assert_eq!(
        claim_mode(&EffectPolicy::default(), false, &seen, closed),
        ClaimMode::Call
    );
}

#[test]
fn an_expired_lease_follows_the_unknown_path_and_a_reconcile_runs_once() {
    let plain = EffectPolicy::default();
    let at = stored(1, false);
    assert_eq!(
        after_expired_lease(&plain, false, &at, false, NOW).state(),
        EffectState::OutcomeUnknown
    );
    assert_eq!(
        after_expired_lease(&plain, true, &at, false, NOW).state(),
        EffectState::InFlight
    );
    assert_eq!(
        after_expired_lease(&plain, true, &at, true, NOW).state(),
        EffectState::OutcomeUnknown
    );
    assert_eq!(
        after_expired_lease(&windowed(3_600_000), false, &at, false, NOW).state(),
        EffectState::Pending
    );
    let found = |r| after_reconcile(&plain, &at, r, "timeout".into(), NOW, 0.0).state();
    assert_eq!(
        found(Reconciled::Succeeded(json!({}))),
        EffectState::Succeeded
    );
    assert_eq!(found(Reconciled::NotDone), EffectState::Pending);
    assert_eq!(found(Reconciled::CannotTell), EffectState::OutcomeUnknown);
    let last = stored(8, false);
    let not_done = after_reconcile(&plain, &last, Reconciled::NotDone, "t".into(), NOW, 0.0);
    assert_eq!(
        not_done.state(),
        EffectState::OutcomeUnknown,
        "unknown once, never failed"
    );
}

#[test]
fn operator_actions_follow_the_table() {
    use EffectState::*;
    let actions = [
        EffectAction::Retry,
        EffectAction::ResolveSucceeded(None),
        EffectAction::ResolveFailed,
        EffectAction::Skip,
    ];
    // Rows: the state; columns: retry, resolve succeeded, resolve failed, skip.
    let table = [
        (Pending, [Some(Pending), None, Some(Failed), Some(Skipped)]),
        (InFlight, [None, None, None, None]),
        (Succeeded, [None, None, None, None]),
        (
            Failed,
            [Some(Pending), Some(Succeeded), None, Some(Skipped)],
        ),
        (
            OutcomeUnknown,
            [Some(Pending), Some(Succeeded), Some(Failed), Some(Skipped)],
        ),
        (Skipped, [None, None, None, None]),
    ];
    for (state, row) in table {
        for (action, expected) in actions.iter().zip(row) {
            assert_eq!(
                operator_action(state, action).ok(),
                expected,
                "{state} {action:?}"
            );
        }
    }
}
