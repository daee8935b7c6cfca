//! External effects (EFFECTS.md): intents a handler records inside its
//! apply transaction, their keys, states and transitions, and the policy an
//! executor runs them under.
//!
//! The core decides, the stores keep: what a handler may record, the key
//! of an intent, which state an answer or an expired lease leads to, which
//! operator action a state allows, and when a retry is due are decided
//! here, as pure functions of the stored facts. A backend stores intents
//! and runs these decisions inside its transactions; an executor (the
//! runtime's, or the built-in webhook executor) makes the calls.
//!
//! Invariant: nothing here calls the outside world, reads a clock or draws
//! a random number: the caller hands in `now_ms` and the jitter.

mod decide;
mod intent;
mod policy;
mod store;

pub use decide::{
    after_answer, after_expired_lease, after_reconcile, claim_mode, operator_action, Answer,
    ClaimMode, EffectAction, OperatorRefusal, Reconciled, Settle, StoredAttempt,
};
pub use intent::{
    EffectKey, EffectName, Intent, IntentRecorder, EFFECT_NAME_LEN_MAX, INTENTS_PER_EVENT_MAX,
    REQUEST_BYTES_MAX,
};
pub use policy::{EffectPolicy, EFFECT_BACKOFF, LEASE_MARGIN_MS_MIN, MAX_ATTEMPTS_MAX};
pub use store::{
    claim, record, stored_state, ActionRefused, ClaimRound, ClaimWrite, Claimed, EffectCounts,
    EffectEntry, EffectFilter, EffectOps, EffectRow, EffectStore, EffectWriter, Policies,
    SettleColumns, CLAIM_LEN_MAX,
};

/// The state of an intent (EFFECTS.md "States").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EffectState {
    /// Recorded; waiting for its turn or its backoff.
    Pending,
    /// Claimed by an executor, with a lease and an attempt number,
    /// committed before the call is made.
    InFlight,
    /// The call answered success; its result is stored.
    Succeeded,
    /// A terminal answer, or retryable answers ran out of attempts.
    Failed,
    /// The call may or may not have happened; ordo will not call again by
    /// itself.
    OutcomeUnknown,
    /// An operator decided it will not happen.
    Skipped,
}

impl EffectState {
    /// Every state, in the order `status` reports them.
    pub const ALL: [EffectState; 6] = [
        EffectState::Pending,
        EffectState::InFlight,
        EffectState::Succeeded,
        EffectState::Failed,
        EffectState::OutcomeUnknown,
        EffectState::Skipped,
    ];

    /// The state's name, as stored and printed.
    pub const fn as_str(self) -> &'static str {
        match self {
            EffectState::Pending => "pending",
            EffectState::InFlight => "in_flight",
            EffectState::Succeeded => "succeeded",
            EffectState::Failed => "failed",
            EffectState::OutcomeUnknown => "outcome_unknown",
            EffectState::Skipped => "skipped",
        }
    }

    /// The state named `text`, if any.
    pub fn parse(text: &str) -> Option<EffectState> {
        EffectState::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Whether an intent in this state is settled for good (`prune` may
    /// remove it past its cutoff).
    pub const fn is_settled(self) -> bool {
        matches!(
            self,
            EffectState::Succeeded | EffectState::Failed | EffectState::Skipped
        )
    }

    /// Whether an ordered intent of the same flow recorded later waits
    /// while this one is in this state (EFFECTS.md "Order").
    pub const fn holds_its_flow(self) -> bool {
        matches!(
            self,
            EffectState::Pending | EffectState::InFlight | EffectState::OutcomeUnknown
        )
    }
}

impl std::fmt::Display for EffectState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for EffectState {
    type Err = crate::ids::RuleViolation;

    fn from_str(text: &str) -> Result<EffectState, Self::Err> {
        EffectState::parse(text).ok_or_else(|| crate::ids::RuleViolation {
            rule: format!(
                "an effect state is one of pending, in_flight, succeeded, failed, \
                 outcome_unknown, skipped (got {text:?})"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_their_names() {
        for state in EffectState::ALL {
            assert_eq!(EffectState::parse(state.as_str()), Some(state));
            assert_eq!(state.to_string().parse::<EffectState>().unwrap(), state);
        }
        assert!("done".parse::<EffectState>().is_err());
        let settled: Vec<_> = EffectState::ALL
            .into_iter()
            .filter(|s| s.is_settled())
            .collect();
        assert_eq!(
            settled,
            [
                EffectState::Succeeded,
                EffectState::Failed,
                EffectState::Skipped
            ]
        );
    }
}
