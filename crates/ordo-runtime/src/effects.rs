//! The effect executor: the application's code per effect name, run for
//! the intents its handlers recorded (EFFECTS.md).
//!
//! A round claims what is due in one committed transaction (the claim
//! commits BEFORE any call), then calls each claimed intent's code and
//! records each answer under the attempt that made it. What the answer
//! means (success, retry after a backoff, failure, the unknown path) is
//! decided by `ordo_core::effect`; the executor only calls and records.

use std::collections::BTreeMap;
use std::sync::Arc;

use ordo_core::crash;
use ordo_core::effect::{
    self, Answer, Claimed, EffectKey, EffectName, EffectPolicy, EffectStore, Policies, Reconciled,
    Settle,
};
use ordo_core::{Clock, FlowId, ProducerName, RuleViolation, Seq, StoreError};

/// One intent as the application's effect code sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Effect {
    /// Its idempotency key: send it to a provider that deduplicates.
    pub key: EffectKey,
    /// The effect's name.
    pub name: EffectName,
    /// The frozen request.
    pub request: serde_json::Value,
    /// This attempt's number (1 for the first).
    pub attempt: u32,
    /// The producer of the event that recorded it.
    pub producer: ProducerName,
    /// The event's flow.
    pub flow_id: FlowId,
    /// The event's seq.
    pub seq: Seq,
}

/// An effect's code: makes the call and says what happened.
pub type EffectCode = Box<dyn FnMut(&Effect) -> Answer + Send>;

/// A reconcile hook: asks the provider whether an attempt whose outcome is
/// unknown happened.
pub type ReconcileCode = Box<dyn FnMut(&Effect) -> Reconciled + Send>;

struct Registered {
    code: EffectCode,
    reconcile: Option<ReconcileCode>,
    policy: EffectPolicy,
}

/// What one executor round did (`ordo effects run --json`'s keys).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EffectRound {
    /// Calls made.
    pub attempted: u64,
    /// Intents that ended `succeeded`.
    pub succeeded: u64,
    /// Intents that ended `failed`.
    pub failed: u64,
    /// Intents back to `pending` for another attempt.
    pub retried: u64,
    /// Intents that ended `outcome_unknown`.
    pub unknown: u64,
}

impl EffectRound {
    fn count(&mut self, settle: &Settle) {
        match settle {
            Settle::Succeeded { .. } => self.succeeded += 1,
            Settle::Failed { .. } => self.failed += 1,
            Settle::Pending { .. } => self.retried += 1,
            Settle::OutcomeUnknown { .. } => self.unknown += 1,
            Settle::Reconcile { .. } => {}
        }
    }

    /// Adds another round's counts.
    pub fn add(&mut self, other: &EffectRound) {
        self.attempted += other.attempted;
        self.succeeded += other.succeeded;
        self.failed += other.failed;
        self.retried += other.retried;
        self.unknown += other.unknown;
    }
}

/// The effect names an application executes, each with its code, policy
/// and optional reconcile hook.
pub struct Executor {
    effects: BTreeMap<EffectName, Registered>,
    owner: String,
    clock: Arc<dyn Clock>,
    batch_len_max: usize,
    ordered_registered: bool,
}

impl Executor {
    /// An executor named `owner` (its leases carry the name) with nothing
    /// registered, reading the time from `clock`.
    pub fn new(owner: impl Into<String>, clock: Arc<dyn Clock>) -> Executor {
        Executor {
            effects: BTreeMap::new(),
            owner: owner.into(),
            clock,
            batch_len_max: 16,
            ordered_registered: false,
        }
    }

    /// Runs `code` for the intents named `name`, under `policy`.
    pub fn register(
        &mut self,
        name: &str,
        policy: EffectPolicy,
        code: impl FnMut(&Effect) -> Answer + Send + 'static,
    ) -> Result<&mut Executor, RuleViolation> {
        let name = EffectName::new(name)?;
        let registered = Registered {
            code: Box::new(code),
            reconcile: None,
            policy: policy.checked()?,
        };
        self.effects.insert(name, registered);
        self.ordered_registered = false;
        Ok(self)
    }

    /// Asks `hook` about the attempts of `name` whose outcome is unknown.
    pub fn reconcile(
        &mut self,
        name: &str,
        hook: impl FnMut(&Effect) -> Reconciled + Send + 'static,
    ) -> Result<&mut Executor, RuleViolation> {
        let name = EffectName::new(name)?;
        let registered = self.effects.get_mut(&name).ok_or_else(|| RuleViolation {
            rule: format!("effect {name} is not registered"),
        })?;
        registered.reconcile = Some(Box::new(hook));
        Ok(self)
    }

    /// The most intents one round claims (default 16; 1 to
    /// [`effect::CLAIM_LEN_MAX`]).
    pub fn batch_len_max(&mut self, intents: usize) -> &mut Executor {
        self.batch_len_max = intents.clamp(1, effect::CLAIM_LEN_MAX);
        self
    }

    /// Claims what is due and runs it: one round. An intent is called at
    /// most once per round; what a round leaves due, the next one takes.
    pub fn run_once<S: EffectStore + ?Sized>(
        &mut self,
        store: &mut S,
    ) -> Result<EffectRound, StoreError> {
        if self.effects.is_empty() {
            return Ok(EffectRound::default());
        }
        self.register_order(store)?;
        let now_ms = self.clock.now_ms();
        let claimed = effect::claim(
            store,
            &Names(&self.effects),
            &self.owner,
            now_ms,
            self.batch_len_max,
        )?;
        let mut round = EffectRound::default();
        for (_, settle) in &claimed.settled {
            round.count(settle);
        }
        if !claimed.claimed.is_empty() {
            crash::point(crash::EFFECT_AFTER_CLAIM);
        }
        for one in &claimed.claimed {
            self.run_one(store, one, &mut round)?;
        }
        Ok(round)
    }

    fn register_order<S: EffectStore + ?Sized>(&mut self, store: &mut S) -> Result<(), StoreError> {
        if !self.ordered_registered {
            let order: Vec<(EffectName, bool)> = self
                .effects
                .iter()
                .map(|(name, r)| (name.clone(), r.policy.ordered))
                .collect();
            store.register_order(&order)?;
            self.ordered_registered = true;
        }
        Ok(())
    }

    /// Calls (or reconciles) one claimed intent and records what came of it.
    fn run_one<S: EffectStore + ?Sized>(
        &mut self,
        store: &mut S,
        claimed: &Claimed,
        round: &mut EffectRound,
    ) -> Result<(), StoreError> {
        let registered = self
            .effects
            .get_mut(&claimed.row.name)
            .expect("claims only its names");
        let effect = effect_of(claimed)?;
        let settle = match &claimed.reconcile {
            Some(error) => reconciled(
                registered,
                &effect,
                claimed,
                error.clone(),
                self.clock.now_ms(),
            ),
            None => {
                round.attempted += 1;
                let answer = (registered.code)(&effect);
                crash::point(crash::EFFECT_AFTER_CALL);
                let now_ms = self.clock.now_ms();
                let hook = registered.reconcile.is_some();
                let settle = effect::after_answer(
                    &registered.policy,
                    hook,
                    &claimed.row.attempt,
                    answer,
                    now_ms,
                    fastrand::f64(),
                );
                match settle {
                    Settle::Reconcile { error } => {
                        if !effect::record(
                            store,
                            claimed,
                            &Settle::Reconcile {
                                error: error.clone(),
                            },
                            now_ms,
                        )? {
                            return Ok(());
                        }
                        reconciled(registered, &effect, claimed, error, self.clock.now_ms())
                    }
                    settle => settle,
                }
            }
        };
        if effect::record(store, claimed, &settle, self.clock.now_ms())? {
            round.count(&settle);
            crash::point(crash::EFFECT_AFTER_RECORD);
        }
        Ok(())
    }
}

/// Runs the reconcile hook once for the unknown attempt of `claimed`.
fn reconciled(
    registered: &mut Registered,
    effect: &Effect,
    claimed: &Claimed,
    error: String,
    now_ms: i64,
) -> Settle {
    let hook = registered
        .reconcile
        .as_mut()
        .expect("a reconcile claim has a hook");
    let found = hook(effect);
    let stored = effect::StoredAttempt {
        unknown_seen: true,
        ..claimed.row.attempt
    };
    effect::after_reconcile(
        &registered.policy,
        &stored,
        found,
        error,
        now_ms,
        fastrand::f64(),
    )
}

fn effect_of(claimed: &Claimed) -> Result<Effect, StoreError> {
    let row = &claimed.row;
    let request = serde_json::from_str(&row.request)
        .map_err(|e| StoreError::corrupt("consumer: effect_intent request", e))?;
    Ok(Effect {
        key: row.key.clone(),
        name: row.name.clone(),
        request,
        attempt: claimed.attempt,
        producer: row.producer.clone(),
        flow_id: row.flow_id.clone(),
        seq: row.seq,
    })
}

/// The executor's registrations as the claim reads them.
struct Names<'a>(&'a BTreeMap<EffectName, Registered>);

impl Policies for Names<'_> {
    fn of(&self, name: &EffectName) -> Option<(EffectPolicy, bool)> {
        self.0.get(name).map(|r| (r.policy, r.reconcile.is_some()))
    }

    fn names(&self) -> Vec<EffectName> {
        self.0.keys().cloned().collect()
    }
}
