//! The effect intents as a consumer store keeps them, and the executor's
//! claim and record written once for every backend over [`EffectWriter`].
//!
//! Invariant: a claim commits before the call it allows is made, and an
//! outcome is written only under the attempt number that made it (the
//! fence): a late answer of an attempt whose lease was taken over changes
//! nothing, except an intent still `outcome_unknown` at that attempt,
//! which takes a definite answer.

use super::decide::{self, ClaimMode, Settle, StoredAttempt};
use super::intent::{EffectKey, EffectName};
use super::policy::EffectPolicy;
use super::EffectState;
use crate::error::StoreError;
use crate::ids::{EventId, FlowId, ProducerName, Seq};

/// The most intents one claim takes.
pub const CLAIM_LEN_MAX: usize = 256;

/// An intent as `effects list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectEntry {
    /// Its key.
    pub key: EffectKey,
    /// The effect's name.
    pub name: EffectName,
    /// The event's producer.
    pub producer: ProducerName,
    /// The event's flow.
    pub flow_id: FlowId,
    /// The event's seq.
    pub seq: Seq,
    /// Its state.
    pub state: EffectState,
    /// Attempts made.
    pub attempts: u32,
    /// The frozen request (JSON text).
    pub request: String,
    /// The result of a success (JSON text).
    pub result: Option<String>,
    /// Why the last attempt did not succeed.
    pub last_error: Option<String>,
    /// The key of the earlier intent of its flow it waits for, when it is
    /// ordered and waits.
    pub waiting_on: Option<EffectKey>,
    /// When a `pending` intent is due.
    pub next_attempt_at_ms: Option<i64>,
    /// When it last changed.
    pub updated_at_ms: i64,
}

/// Which intents a listing shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EffectFilter {
    /// Only this state.
    pub state: Option<EffectState>,
    /// Only this effect.
    pub name: Option<EffectName>,
    /// Only this producer's.
    pub producer: Option<ProducerName>,
}

/// The intents by state, and the age of the oldest one not settled.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EffectCounts {
    /// How many intents are in each state, in [`EffectState::ALL`]'s order.
    pub by_state: [u64; 6],
    /// Seconds since the oldest `pending` intent was recorded.
    pub oldest_pending_age_s: Option<f64>,
}

impl EffectCounts {
    /// How many intents are in `state`.
    pub fn of(&self, state: EffectState) -> u64 {
        let index = EffectState::ALL.iter().position(|s| *s == state);
        self.by_state[index.expect("every state is listed")]
    }

    /// Adds `n` intents of the stored state `text`; an unknown state is a
    /// corrupt store.
    pub fn count(&mut self, text: &str, n: i64) -> Result<(), StoreError> {
        let state = stored_state(text)?;
        let index = EffectState::ALL.iter().position(|s| *s == state);
        self.by_state[index.expect("every state is listed")] += n.max(0) as u64;
        Ok(())
    }
}

/// The state a row holds; anything else is a corrupt store.
pub fn stored_state(text: &str) -> Result<EffectState, StoreError> {
    EffectState::parse(text)
        .ok_or_else(|| StoreError::corrupt("consumer: effect_intent", format!("state {text:?}")))
}

/// One intent as a claim reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectRow {
    /// Its key.
    pub key: EffectKey,
    /// The effect's name.
    pub name: EffectName,
    /// The event's producer.
    pub producer: ProducerName,
    /// The event's flow.
    pub flow_id: FlowId,
    /// The event's seq.
    pub seq: Seq,
    /// The event's id.
    pub event_id: EventId,
    /// The frozen request.
    pub request: String,
    /// What the store holds of its attempts (`first_attempt_at_ms` 0 when
    /// none was made).
    pub attempt: StoredAttempt,
    /// Whether its lease is a reconcile hook's.
    pub reconciling: bool,
    /// Why the last attempt did not end it.
    pub last_error: Option<String>,
}

/// What a claim writes on a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimWrite<'a> {
    /// The attempt number the claim holds (the next one for a call, the
    /// unknown one for a reconcile).
    pub attempt: u32,
    /// Whether the lease is a reconcile hook's (no call is made under it).
    pub reconciling: bool,
    /// The executor holding the lease.
    pub owner: &'a str,
    /// When the lease expires.
    pub lease_until_ms: i64,
    /// When the claim commits.
    pub now_ms: i64,
}

/// One open write transaction of a consumer store over its intents.
pub trait EffectWriter {
    /// `in_flight` intents of `names` whose lease expired by `now_ms`, at
    /// most `limit`, locked for this transaction.
    fn expired(
        &mut self,
        names: &[EffectName],
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<EffectRow>, StoreError>;

    /// `pending` intents of `names` due by `now_ms` that wait for no
    /// earlier intent of their flow (EFFECTS.md "Order"), at most `limit`,
    /// locked for this transaction (others' locked ones are passed over).
    fn due(
        &mut self,
        names: &[EffectName],
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<EffectRow>, StoreError>;

    /// Claims `row` (read by this transaction) as `in_flight`.
    fn claim(&mut self, row: &EffectRow, claim: &ClaimWrite<'_>) -> Result<(), StoreError>;

    /// Writes `settle` for the attempt `attempt` of `key`, under the
    /// fence; false when the fence refused it (nothing written).
    fn settle(
        &mut self,
        key: &EffectKey,
        attempt: u32,
        settle: &Settle,
        now_ms: i64,
    ) -> Result<bool, StoreError>;
}

/// A consumer store's intents as operators and executors read and repair
/// them; object-safe, so that a console or command holds any backend's
/// store behind one `dyn`.
pub trait EffectOps {
    /// Records which effects are ordered (an executor's policies), so that
    /// claims and listings wait as the executor's policy says.
    fn register_order(&mut self, order: &[(EffectName, bool)]) -> Result<(), StoreError>;

    /// Up to `limit` intents that `filter` selects, by flow and seq.
    fn effects(
        &mut self,
        filter: &EffectFilter,
        limit: usize,
    ) -> Result<Vec<EffectEntry>, StoreError>;

    /// The intent of `key`, if any.
    fn effect(&mut self, key: &EffectKey) -> Result<Option<EffectEntry>, StoreError>;

    /// The intents by state.
    fn effect_counts(&mut self, now_ms: i64) -> Result<EffectCounts, StoreError>;

    /// An operator's `action` on the intent `key`, with the repair log's
    /// row, in one transaction; `Ok(Err(..))` when no such intent exists or
    /// its state refuses the action (nothing written).
    fn act_on_effect(
        &mut self,
        key: &EffectKey,
        action: &decide::EffectAction,
        by: &str,
        reason: &str,
    ) -> Result<Result<EffectEntry, ActionRefused>, StoreError>;
}

/// A consumer store's intents in write transactions, for the executor's
/// claim and record ([`claim`], [`record`]).
pub trait EffectStore: EffectOps {
    /// One open write transaction.
    type Writer<'a>: EffectWriter
    where
        Self: 'a;

    /// Begins a write transaction over the intents.
    fn begin_effects(&mut self) -> Result<Self::Writer<'_>, StoreError>;

    /// Commits it.
    fn commit_effects(writer: Self::Writer<'_>) -> Result<(), StoreError>;
}

/// Why an operator's action on an intent was refused. Nothing is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionRefused {
    /// No intent has the key.
    #[error("no effect intent has the key {0}")]
    Unknown(EffectKey),
    /// The intent's state does not allow the action.
    #[error(transparent)]
    State(#[from] decide::OperatorRefusal),
}

/// The policy and reconcile hook an executor has for one effect name.
pub trait Policies {
    /// The policy of `name`, and whether a reconcile hook exists for it;
    /// `None` for a name this executor does not run.
    fn of(&self, name: &EffectName) -> Option<(EffectPolicy, bool)>;

    /// The names this executor runs.
    fn names(&self) -> Vec<EffectName>;
}

/// One intent an executor claimed: it makes the call (`reconcile` none), or
/// runs the reconcile hook for the unknown attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The row as claimed.
    pub row: EffectRow,
    /// The attempt number the claim holds.
    pub attempt: u32,
    /// Why the attempt's outcome is unknown, when the hook is to run.
    pub reconcile: Option<String>,
}

/// What one claim did: the intents claimed, and how many it settled itself
/// (expired leases and closed windows ending `outcome_unknown` or back to
/// `pending`).
#[derive(Debug, Default)]
pub struct ClaimRound {
    /// The intents to run.
    pub claimed: Vec<Claimed>,
    /// Intents the claim moved without a call.
    pub settled: Vec<(EffectKey, Settle)>,
}

/// Claims up to `limit` intents of the executor's names for `owner` at
/// `now_ms`, in one committed transaction: expired leases first (the
/// unknown path), then due intents. `jitter` draws each backoff in
/// `[0, 1)`.
pub fn claim<S: EffectStore + ?Sized>(
    store: &mut S,
    policies: &dyn Policies,
    owner: &str,
    now_ms: i64,
    limit: usize,
) -> Result<ClaimRound, StoreError> {
    let names = policies.names();
    let limit = limit.clamp(1, CLAIM_LEN_MAX);
    let mut round = ClaimRound::default();
    let mut w = store.begin_effects()?;
    for row in w.expired(&names, now_ms, limit)? {
        let (policy, hook) = policies
            .of(&row.name)
            .expect("expired reads only its names");
        let lease_until_ms = now_ms + policy.lease_ms as i64;
        let settle =
            decide::after_expired_lease(&policy, hook, &row.attempt, row.reconciling, now_ms);
        take(
            &mut w,
            &mut round,
            row,
            settle,
            owner,
            lease_until_ms,
            now_ms,
        )?;
    }
    let left = limit.saturating_sub(round.claimed.len());
    if left > 0 {
        for row in w.due(&names, now_ms, left)? {
            let (policy, hook) = policies.of(&row.name).expect("due reads only its names");
            let lease_until_ms = now_ms + policy.lease_ms as i64;
            let settle = match decide::claim_mode(&policy, hook, &row.attempt, now_ms) {
                ClaimMode::Call => None,
                ClaimMode::Reconcile => Some(window_closed(Settle::Reconcile {
                    error: String::new(),
                })),
                ClaimMode::Unknown => Some(window_closed(Settle::OutcomeUnknown {
                    error: String::new(),
                })),
            };
            match settle {
                None => call(&mut w, &mut round, row, owner, lease_until_ms, now_ms)?,
                Some(settle) => take(
                    &mut w,
                    &mut round,
                    row,
                    settle,
                    owner,
                    lease_until_ms,
                    now_ms,
                )?,
            }
        }
    }
    S::commit_effects(w)?;
    Ok(round)
}

/// The unknown path's `settle` for a resend whose dedup window closed.
fn window_closed(settle: Settle) -> Settle {
    let error = "an earlier attempt's outcome is unknown and the dedup window closed".to_string();
    match settle {
        Settle::Reconcile { .. } => Settle::Reconcile { error },
        _ => Settle::OutcomeUnknown { error },
    }
}

/// Claims the due `row` for its next attempt.
fn call<W: EffectWriter>(
    w: &mut W,
    round: &mut ClaimRound,
    row: EffectRow,
    owner: &str,
    lease_until_ms: i64,
    now_ms: i64,
) -> Result<(), StoreError> {
    let attempt = row.attempt.attempts + 1;
    let claim = ClaimWrite {
        attempt,
        reconciling: false,
        owner,
        lease_until_ms,
        now_ms,
    };
    w.claim(&row, &claim)?;
    // What the store holds once the claim commits: this attempt counted,
    // and the first one's time set.
    let mut row = row;
    row.attempt.attempts = attempt;
    if attempt == 1 {
        row.attempt.first_attempt_at_ms = now_ms;
    }
    round.claimed.push(Claimed {
        row,
        attempt,
        reconcile: None,
    });
    Ok(())
}

/// Takes `row` as `settle` says without a call: a reconcile under a new
/// lease at the same attempt, or a state written at once.
fn take<W: EffectWriter>(
    w: &mut W,
    round: &mut ClaimRound,
    row: EffectRow,
    settle: Settle,
    owner: &str,
    lease_until_ms: i64,
    now_ms: i64,
) -> Result<(), StoreError> {
    let attempt = row.attempt.attempts;
    if let Settle::Reconcile { error } = settle {
        let claim = ClaimWrite {
            attempt,
            reconciling: true,
            owner,
            lease_until_ms,
            now_ms,
        };
        w.claim(&row, &claim)?;
        round.claimed.push(Claimed {
            row,
            attempt,
            reconcile: Some(error),
        });
        return Ok(());
    }
    // Held for this transaction first (a due row is `pending`), then moved.
    let claim = ClaimWrite {
        attempt,
        reconciling: false,
        owner,
        lease_until_ms,
        now_ms,
    };
    w.claim(&row, &claim)?;
    let written = w.settle(&row.key, attempt, &settle, now_ms)?;
    assert!(written, "a row locked by the claim takes its settle");
    round.settled.push((row.key, settle));
    Ok(())
}

/// Writes `settle` for the claimed attempt in its own transaction; false
/// when the fence refused it (the lease was taken over and the intent
/// moved on).
pub fn record<S: EffectStore + ?Sized>(
    store: &mut S,
    claimed: &Claimed,
    settle: &Settle,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let mut w = store.begin_effects()?;
    let written = w.settle(&claimed.row.key, claimed.attempt, settle, now_ms)?;
    if written {
        S::commit_effects(w)?;
    }
    Ok(written)
}

/// The columns a store writes for a [`Settle`] under its fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettleColumns<'a> {
    /// The state.
    pub state: EffectState,
    /// The result of a success.
    pub result: Option<&'a str>,
    /// Why the attempt did not succeed.
    pub error: Option<&'a str>,
    /// When a `pending` intent is due again.
    pub due_at_ms: Option<i64>,
    /// Whether the attempt's outcome was unknown (remembered).
    pub unknown: bool,
    /// Whether the lease is kept for the reconcile hook.
    pub reconciling: bool,
    /// A definite answer (success or failure), which an `outcome_unknown`
    /// intent at the same attempt still takes.
    pub definite: bool,
}

impl<'a> SettleColumns<'a> {
    /// The columns of `settle` written at `now_ms`.
    pub fn of(settle: &'a Settle, now_ms: i64) -> SettleColumns<'a> {
        let mut w = SettleColumns {
            state: settle.state(),
            result: None,
            error: None,
            due_at_ms: None,
            unknown: false,
            reconciling: false,
            definite: false,
        };
        match settle {
            Settle::Succeeded { result } => (w.result, w.definite) = (Some(result.as_str()), true),
            Settle::Failed { error } => (w.error, w.definite) = (Some(error.as_str()), true),
            Settle::Pending {
                due_at_ms,
                error,
                unknown,
            } => {
                w.due_at_ms = Some((*due_at_ms).max(now_ms));
                (w.error, w.unknown) = (Some(error.as_str()), *unknown);
            }
            Settle::Reconcile { error } => {
                (w.error, w.unknown, w.reconciling) = (Some(error.as_str()), true, true);
            }
            Settle::OutcomeUnknown { error } => (w.error, w.unknown) = (Some(error.as_str()), true),
        }
        w
    }
}
