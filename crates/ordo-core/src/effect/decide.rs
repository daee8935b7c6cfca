//! The transitions of EFFECTS.md as pure decisions: given what the store
//! holds of an attempt and what happened to it, the state it moves to.

use super::policy::{EffectPolicy, EFFECT_BACKOFF};
use super::EffectState;

/// What the store holds of an intent's latest attempt when its fate is
/// decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredAttempt {
    /// Attempts made so far, this one included.
    pub attempts: u32,
    /// Attempts made before the last operator retry (each retry grants the
    /// policy's `max_attempts` again).
    pub attempts_base: u32,
    /// Whether an earlier attempt of this intent had an unknown outcome.
    pub unknown_seen: bool,
    /// When the intent's first attempt was claimed.
    pub first_attempt_at_ms: i64,
}

impl StoredAttempt {
    fn attempts_left(&self, policy: &EffectPolicy) -> u32 {
        let used = self.attempts.saturating_sub(self.attempts_base);
        policy.max_attempts.saturating_sub(used)
    }
}

/// What the application's effect code (or the webhook executor) answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The effect happened; its result.
    Succeeded(serde_json::Value),
    /// The provider did not act and may be asked again, not sooner than
    /// `after_ms` when it said so.
    Retry {
        /// Why.
        reason: String,
        /// The provider's `Retry-After`, in ms.
        after_ms: Option<u64>,
    },
    /// A terminal answer: it will not happen.
    Failed(String),
    /// Whether the provider acted cannot be told.
    Unknown(String),
}

/// What a reconcile hook found out about an attempt whose outcome was
/// unknown.
#[derive(Debug, Clone, PartialEq)]
pub enum Reconciled {
    /// It happened; its result.
    Succeeded(serde_json::Value),
    /// It did not happen: as a retryable answer.
    NotDone,
    /// It cannot tell.
    CannotTell,
}

/// The state an intent moves to, with what is written beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// `succeeded`, with the result's JSON text.
    Succeeded {
        /// The result.
        result: String,
    },
    /// `failed`.
    Failed {
        /// Why.
        error: String,
    },
    /// Back to `pending`, due at `due_at_ms`.
    Pending {
        /// When it is due again.
        due_at_ms: i64,
        /// Why the attempt did not end it.
        error: String,
        /// Whether the attempt's outcome was unknown (remembered: running
        /// out of attempts then ends `outcome_unknown`, never `failed`).
        unknown: bool,
    },
    /// The attempt's outcome is unknown and the application gave a
    /// reconcile hook: the caller runs it once for this attempt and
    /// decides with [`after_reconcile`].
    Reconcile {
        /// Why the outcome is unknown.
        error: String,
    },
    /// `outcome_unknown`, until an operator acts.
    OutcomeUnknown {
        /// Why.
        error: String,
    },
}

impl Settle {
    /// The state this moves the intent to (`Reconcile` keeps it
    /// `in_flight` while the hook runs).
    pub fn state(&self) -> EffectState {
        match self {
            Settle::Succeeded { .. } => EffectState::Succeeded,
            Settle::Failed { .. } => EffectState::Failed,
            Settle::Pending { .. } => EffectState::Pending,
            Settle::Reconcile { .. } => EffectState::InFlight,
            Settle::OutcomeUnknown { .. } => EffectState::OutcomeUnknown,
        }
    }
}

/// The state after `answer` to the attempt `stored`, at `now_ms`;
/// `jitter_unit` in `[0, 1)` draws the backoff.
pub fn after_answer(
    policy: &EffectPolicy,
    has_reconcile: bool,
    stored: &StoredAttempt,
    answer: Answer,
    now_ms: i64,
    jitter_unit: f64,
) -> Settle {
    match answer {
        Answer::Succeeded(result) => Settle::Succeeded {
            result: result.to_string(),
        },
        Answer::Failed(error) => Settle::Failed { error },
        Answer::Retry { reason, after_ms } => {
            retry_or_end(policy, stored, reason, after_ms, now_ms, jitter_unit, false)
        }
        Answer::Unknown(error) => unknown_path(policy, has_reconcile, stored, error, now_ms),
    }
}

/// The state after the lease of the attempt `stored` expired (its executor
/// died or hung: a crash before the call cannot be told from one after
/// it). `reconciling` when the lease was a reconcile hook's, which then
/// ran once for that attempt already.
pub fn after_expired_lease(
    policy: &EffectPolicy,
    has_reconcile: bool,
    stored: &StoredAttempt,
    reconciling: bool,
    now_ms: i64,
) -> Settle {
    let error = "the lease expired: the executor died or hung during the attempt".to_string();
    if reconciling {
        return Settle::OutcomeUnknown {
            error: format!("{error} (its reconcile did not finish)"),
        };
    }
    unknown_path(policy, has_reconcile, stored, error, now_ms)
}

/// The state after a reconcile hook's finding about the unknown attempt
/// `stored`.
pub fn after_reconcile(
    policy: &EffectPolicy,
    stored: &StoredAttempt,
    found: Reconciled,
    error: String,
    now_ms: i64,
    jitter_unit: f64,
) -> Settle {
    match found {
        Reconciled::Succeeded(result) => Settle::Succeeded {
            result: result.to_string(),
        },
        Reconciled::NotDone => {
            let reason = format!("{error}; reconciled: not done");
            retry_or_end(policy, stored, reason, None, now_ms, jitter_unit, true)
        }
        Reconciled::CannotTell => Settle::OutcomeUnknown {
            error: format!("{error}; reconcile cannot tell"),
        },
    }
}

/// EFFECTS.md "Unknown": a resend inside the dedup window, else the
/// reconcile hook, else `outcome_unknown`.
fn unknown_path(
    policy: &EffectPolicy,
    has_reconcile: bool,
    stored: &StoredAttempt,
    error: String,
    now_ms: i64,
) -> Settle {
    let resend = stored.attempts_left(policy) > 0
        && policy.resend_allowed(stored.first_attempt_at_ms, now_ms);
    if resend {
        return Settle::Pending {
            due_at_ms: now_ms,
            error,
            unknown: true,
        };
    }
    if has_reconcile {
        return Settle::Reconcile { error };
    }
    Settle::OutcomeUnknown { error }
}

/// A retryable answer: back to `pending` after the backoff while attempts
/// are left, else `failed`, or `outcome_unknown` once any attempt was
/// unknown.
fn retry_or_end(
    policy: &EffectPolicy,
    stored: &StoredAttempt,
    reason: String,
    after_ms: Option<u64>,
    now_ms: i64,
    jitter_unit: f64,
    unknown: bool,
) -> Settle {
    let unknown_seen = unknown || stored.unknown_seen;
    if stored.attempts_left(policy) == 0 {
        let error = format!("{reason}; no attempts left of {}", policy.max_attempts);
        return if unknown_seen {
            Settle::OutcomeUnknown { error }
        } else {
            Settle::Failed { error }
        };
    }
    let backoff = crate::Backoff {
        floor_ms: after_ms.unwrap_or(0),
        ..EFFECT_BACKOFF
    };
    let used = stored.attempts.saturating_sub(stored.attempts_base).max(1);
    let delay_ms = backoff.delay_ms(used, jitter_unit);
    Settle::Pending {
        due_at_ms: now_ms.saturating_add(delay_ms.min(i64::MAX as u64) as i64),
        error: reason,
        unknown: unknown_seen,
    }
}

/// What an executor's claim of a due `pending` intent does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimMode {
    /// Makes the next attempt: `in_flight` with attempt n+1.
    Call,
    /// The intent's unknown attempt may no longer be sent again (its dedup
    /// window closed): the reconcile hook runs for it under a lease.
    Reconcile,
    /// As `Reconcile`, without a hook: `outcome_unknown` at once.
    Unknown,
}

/// How a claim at `now_ms` takes the due `pending` intent `stored`:
/// EFFECTS.md checks the dedup window at each resend's claim.
pub fn claim_mode(
    policy: &EffectPolicy,
    has_reconcile: bool,
    stored: &StoredAttempt,
    now_ms: i64,
) -> ClaimMode {
    let resend = stored.unknown_seen && policy.dedup_window_ms.is_some();
    if !resend || policy.resend_allowed(stored.first_attempt_at_ms, now_ms) {
        ClaimMode::Call
    } else if has_reconcile {
        ClaimMode::Reconcile
    } else {
        ClaimMode::Unknown
    }
}

/// An operator's action on an intent (audited in the consumer's repair
/// log).
#[derive(Debug, Clone, PartialEq)]
pub enum EffectAction {
    /// Due now, with `max_attempts` more attempts.
    Retry,
    /// Settled as succeeded, with an optional result.
    ResolveSucceeded(Option<serde_json::Value>),
    /// Settled as failed.
    ResolveFailed,
    /// It will not happen.
    Skip,
}

impl EffectAction {
    /// The action's name in the repair log.
    pub fn log_name(&self) -> &'static str {
        match self {
            EffectAction::Retry => "effect_retry",
            EffectAction::ResolveSucceeded(_) => "effect_resolve_succeeded",
            EffectAction::ResolveFailed => "effect_resolve_failed",
            EffectAction::Skip => "effect_skip",
        }
    }
}

/// An operator action the intent's state does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{action} is not allowed on an intent that is {state}")]
pub struct OperatorRefusal {
    /// The action refused.
    pub action: &'static str,
    /// The intent's state.
    pub state: EffectState,
}

/// The state `action` moves an intent in `state` to (EFFECTS.md
/// "Transitions"), or the refusal.
pub fn operator_action(
    state: EffectState,
    action: &EffectAction,
) -> Result<EffectState, OperatorRefusal> {
    use EffectState::*;
    let allowed: &[EffectState] = match action {
        EffectAction::Retry => &[Failed, OutcomeUnknown, Pending],
        EffectAction::ResolveSucceeded(_) => &[OutcomeUnknown, Failed],
        EffectAction::ResolveFailed => &[OutcomeUnknown, Pending],
        EffectAction::Skip => &[Pending, Failed, OutcomeUnknown],
    };
    if !allowed.contains(&state) {
        return Err(OperatorRefusal {
            action: action.log_name(),
            state,
        });
    }
    Ok(match action {
        EffectAction::Retry => Pending,
        EffectAction::ResolveSucceeded(_) => Succeeded,
        EffectAction::ResolveFailed => Failed,
        EffectAction::Skip => Skipped,
    })
}

#[cfg(test)]
mod tests;
