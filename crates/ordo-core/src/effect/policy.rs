//! How an executor runs one effect's intents: attempts, the provider's
//! deduplication window, order, and the timing of a call and its lease.

use crate::backoff::Backoff;
use crate::ids::RuleViolation;

/// The wait between attempts after a retryable answer: exponential from
/// 1 s, doubling up to 60 s, with full jitter; never sooner than a
/// `Retry-After` (EFFECTS.md "Policy").
pub const EFFECT_BACKOFF: Backoff = Backoff {
    base_ms: 1_000,
    cap_ms: 60_000,
    floor_ms: 0,
};

/// The least margin of a lease over the call's timeout: an executor whose
/// call timed out still has this long to record the outcome before its
/// lease can be taken for the unknown path.
pub const LEASE_MARGIN_MS_MIN: u64 = 5_000;

/// The most attempts a policy may allow.
pub const MAX_ATTEMPTS_MAX: u32 = 1_000;

/// An effect's policy, given by the application per effect name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectPolicy {
    /// The most attempts (default 8; an operator's retry grants as many
    /// again).
    pub max_attempts: u32,
    /// How long the provider deduplicates by the key, when it does
    /// (default: it does not). Within the window an attempt whose outcome
    /// is unknown is sent again under the same key.
    pub dedup_window_ms: Option<u64>,
    /// Whether the intents of one flow run in order (default true).
    /// Unordered intents neither wait nor are waited on.
    pub ordered: bool,
    /// The longest a call may take (default 10,000).
    pub timeout_ms: u64,
    /// How long a claim holds an intent (default 30,000): at least
    /// [`LEASE_MARGIN_MS_MIN`] more than `timeout_ms`.
    pub lease_ms: u64,
}

impl Default for EffectPolicy {
    fn default() -> Self {
        EffectPolicy {
            max_attempts: 8,
            dedup_window_ms: None,
            ordered: true,
            timeout_ms: 10_000,
            lease_ms: 30_000,
        }
    }
}

impl EffectPolicy {
    /// The policy if its values hold together: 1 to
    /// [`MAX_ATTEMPTS_MAX`] attempts, a positive timeout, and a lease at
    /// least [`LEASE_MARGIN_MS_MIN`] longer than the timeout.
    pub fn checked(self) -> Result<EffectPolicy, RuleViolation> {
        let refuse = |rule: String| Err(RuleViolation { rule });
        if !(1..=MAX_ATTEMPTS_MAX).contains(&self.max_attempts) {
            return refuse(format!(
                "max attempts must be 1..={MAX_ATTEMPTS_MAX} (got {})",
                self.max_attempts
            ));
        }
        if self.timeout_ms == 0 {
            return refuse("the timeout must be at least 1 ms".into());
        }
        if self.lease_ms < self.timeout_ms.saturating_add(LEASE_MARGIN_MS_MIN) {
            return refuse(format!(
                "the lease ({} ms) must exceed the timeout ({} ms) by at least {LEASE_MARGIN_MS_MIN} ms",
                self.lease_ms, self.timeout_ms
            ));
        }
        if self.dedup_window_ms == Some(0) {
            return refuse("a dedup window must be at least 1 ms".into());
        }
        Ok(self)
    }

    /// Whether an intent first attempted at `first_attempt_at_ms` may be
    /// sent again under its key by a claim at `now_ms`: the provider
    /// deduplicates, and the call would end (`now + timeout`) inside the
    /// window.
    pub fn resend_allowed(&self, first_attempt_at_ms: i64, now_ms: i64) -> bool {
        self.dedup_window_ms.is_some_and(|window_ms| {
            now_ms.saturating_add(self.timeout_ms as i64)
                < first_attempt_at_ms.saturating_add(window_ms as i64)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_holds_together_or_is_refused() {
        assert!(EffectPolicy::default().checked().is_ok());
        let bad = [
            EffectPolicy {
                max_attempts: 0,
                ..Default::default()
            },
            EffectPolicy {
                timeout_ms: 0,
                ..Default::default()
            },
            EffectPolicy {
                lease_ms: 14_999,
                ..Default::default()
            },
            EffectPolicy {
                dedup_window_ms: Some(0),
                ..Default::default()
            },
        ];
        for policy in bad {
            assert!(policy.checked().is_err(), "{policy:?}");
        }
        let edge = EffectPolicy {
            lease_ms: 15_000,
            ..Default::default()
        };
        assert!(edge.checked().is_ok());
    }

    #[test]
    fn a_resend_must_end_inside_the_window() {
        let none = EffectPolicy::default();
        assert!(!none.resend_allowed(0, 0));
        let windowed = EffectPolicy {
            dedup_window_ms: Some(60_000),
            ..Default::default()
        };
        assert!(windowed.resend_allowed(0, 49_999));
        assert!(!windowed.resend_allowed(0, 50_000));
    }
}
