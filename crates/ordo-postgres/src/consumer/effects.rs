//! Effect intents on PostgreSQL: written in the apply transaction of their
//! event, claimed and settled by executors, listed and repaired by
//! operators. The decisions are `ordo_core::effect`'s; this module only
//! reads and writes rows.
//!
//! Several executors may claim from one store at once, each on its own
//! connection: a claim reads in one READ COMMITTED transaction and locks
//! what it reads `FOR UPDATE SKIP LOCKED`, so that an intent another
//! executor holds is passed over, never taken twice; a row claimed and
//! committed meanwhile is read again at its current state and no longer
//! matches.

use ordo_core::effect::{
    self, ActionRefused, ClaimWrite, EffectAction, EffectCounts, EffectEntry, EffectFilter,
    EffectKey, EffectName, EffectOps, EffectRow, EffectState, EffectStore, EffectWriter, Intent,
    Settle, SettleColumns, StoredAttempt,
};
use ordo_core::store::sql_limit;
use ordo_core::{EventId, FlowId, ProducerName, Seq, StoreError};
use postgres::Row;

use super::PgConsumer;
use crate::conn::PgTx;
use crate::error::corrupt;
use crate::producer::read_snapshot;

const CONTEXT: &str = "consumer: effect intents";

/// Writes `intents`, each `pending` and due at `now_ms`, in one statement.
pub(super) fn insert_intents(tx: &PgTx, intents: &[Intent], now_ms: i64) -> Result<(), StoreError> {
    if intents.is_empty() {
        return Ok(());
    }
    let column = |f: fn(&Intent) -> &str| intents.iter().map(f).collect::<Vec<&str>>();
    let keys = column(|i| i.key.as_str());
    let names = column(|i| i.name.as_str());
    let producers = column(|i| i.producer.as_str());
    let flows = column(|i| i.flow_id.as_str());
    let event_ids = column(|i| i.event_id.as_str());
    let requests = column(|i| i.request.as_str());
    let seqs: Vec<i64> = intents.iter().map(|i| i.seq.get()).collect();
    let positions: Vec<i32> = intents.iter().map(|i| i.position as i32).collect();
    let written = tx.run(
        "consumer: cannot record an effect intent",
        "INSERT INTO {s}.effect_intent (key, name, producer, flow_id, seq, position, event_id,
             request, state, next_attempt_at_ms, recorded_at_ms, updated_at_ms)
         SELECT k, n, p, f, q, o, e, r, 'pending', $9, $9, $9
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[],
                     $6::integer[], $7::text[], $8::text[]) AS u(k, n, p, f, q, o, e, r)",
        &[
            &keys, &names, &producers, &flows, &seqs, &positions, &event_ids, &requests, &now_ms,
        ],
    )?;
    assert_eq!(written, intents.len() as u64, "every intent is written");
    Ok(())
}

/// The columns a claim reads, in [`effect_row`]'s order.
macro_rules! row_columns {
    () => {
        "i.key, i.name, i.producer, i.flow_id, i.seq, i.event_id, i.request, i.attempts,
         i.attempts_base, i.unknown_seen, coalesce(i.first_attempt_at_ms, 0), i.reconciling,
         i.last_error"
    };
}

/// An earlier intent of `i`'s flow that `i` waits for (EFFECTS.md
/// "Order"), when both are ordered: a correlated subquery over `i`, read
/// at the statement's start (the states committed by then).
macro_rules! waiting {
    () => {
        "SELECT e.key FROM {s}.effect_intent e
         WHERE e.flow_id = i.flow_id AND e.producer = i.producer
           AND (e.seq < i.seq OR (e.seq = i.seq AND e.position < i.position))
           AND e.state IN ('pending', 'in_flight', 'outcome_unknown')
           AND NOT EXISTS (SELECT 1 FROM {s}.effect_order o WHERE o.name = e.name AND NOT o.ordered)
           AND NOT EXISTS (SELECT 1 FROM {s}.effect_order o WHERE o.name = i.name AND NOT o.ordered)
         ORDER BY e.seq, e.position LIMIT 1"
    };
}

/// The columns a listing reads, in [`entry`]'s order: the last one is the
/// key a `pending` intent waits on.
macro_rules! entry_columns {
    () => {
        concat!(
            "i.key, i.name, i.producer, i.flow_id, i.seq, i.state, i.attempts, i.request,
             i.result, i.last_error, i.next_attempt_at_ms, i.updated_at_ms,
             CASE WHEN i.state = 'pending' THEN (",
            waiting!(),
            ") END"
        )
    };
}

const EXPIRED_SQL: &str = concat!(
    "SELECT ",
    row_columns!(),
    " FROM {s}.effect_intent i
     WHERE i.state = 'in_flight' AND i.lease_until_ms <= $1 AND i.name = ANY($2::text[])
     ORDER BY i.lease_until_ms LIMIT $3
     FOR UPDATE OF i SKIP LOCKED"
);

const DUE_SQL: &str = concat!(
    "SELECT ",
    row_columns!(),
    " FROM {s}.effect_intent i
     WHERE i.state = 'pending' AND i.next_attempt_at_ms <= $1 AND i.name = ANY($2::text[])
       AND NOT EXISTS (",
    waiting!(),
    ") ORDER BY i.next_attempt_at_ms, i.flow_id, i.producer, i.seq, i.position LIMIT $3
     FOR UPDATE OF i SKIP LOCKED"
);

const LIST_SQL: &str = concat!(
    "SELECT ",
    entry_columns!(),
    " FROM {s}.effect_intent i
     WHERE ($1::text IS NULL OR i.state = $1::text) AND ($2::text IS NULL OR i.name = $2::text)
       AND ($3::text IS NULL OR i.producer = $3::text)
     ORDER BY i.flow_id, i.producer, i.seq, i.position LIMIT $4"
);

const ENTRY_SQL: &str = concat!(
    "SELECT ",
    entry_columns!(),
    " FROM {s}.effect_intent i WHERE i.key = $1"
);

fn bad(e: ordo_core::RuleViolation) -> StoreError {
    corrupt(CONTEXT, e)
}

fn count(n: i32) -> Result<u32, StoreError> {
    u32::try_from(n).map_err(|_| corrupt(CONTEXT, format!("attempts {n}")))
}

fn effect_row(row: &Row) -> Result<EffectRow, StoreError> {
    Ok(EffectRow {
        key: EffectKey::new(row.get::<_, String>(0)).map_err(bad)?,
        name: EffectName::new(row.get::<_, String>(1)).map_err(bad)?,
        producer: ProducerName::new(row.get::<_, String>(2)).map_err(bad)?,
        flow_id: FlowId::new(row.get::<_, String>(3)).map_err(bad)?,
        seq: Seq::new(row.get(4)).map_err(bad)?,
        event_id: EventId::new(row.get::<_, String>(5)).map_err(bad)?,
        request: row.get(6),
        attempt: StoredAttempt {
            attempts: count(row.get(7))?,
            attempts_base: count(row.get(8))?,
            unknown_seen: row.get(9),
            first_attempt_at_ms: row.get(10),
        },
        reconciling: row.get(11),
        last_error: row.get(12),
    })
}

fn entry(row: &Row) -> Result<EffectEntry, StoreError> {
    let state = effect::stored_state(row.get(5))?;
    let waiting_on: Option<String> = row.get(12);
    Ok(EffectEntry {
        key: EffectKey::new(row.get::<_, String>(0)).map_err(bad)?,
        name: EffectName::new(row.get::<_, String>(1)).map_err(bad)?,
        producer: ProducerName::new(row.get::<_, String>(2)).map_err(bad)?,
        flow_id: FlowId::new(row.get::<_, String>(3)).map_err(bad)?,
        seq: Seq::new(row.get(4)).map_err(bad)?,
        state,
        attempts: count(row.get(6))?,
        request: row.get(7),
        result: row.get(8),
        last_error: row.get(9),
        waiting_on: waiting_on.map(EffectKey::new).transpose().map_err(bad)?,
        next_attempt_at_ms: (state == EffectState::Pending).then(|| row.get(10)),
        updated_at_ms: row.get(11),
    })
}

/// The executor's names as one `text[]` parameter.
fn names_param(names: &[EffectName]) -> Vec<&str> {
    names.iter().map(EffectName::as_str).collect()
}

/// One READ COMMITTED transaction over the intents, on the store's
/// connection; rolled back when dropped uncommitted.
pub struct PgEffectTx<'a> {
    tx: &'a PgTx,
    txid: i64,
    commits: &'a mut u64,
    open: bool,
}

impl Drop for PgEffectTx<'_> {
    fn drop(&mut self) {
        if self.open {
            self.tx.rollback();
        }
    }
}

impl EffectStore for PgConsumer {
    type Writer<'a> = PgEffectTx<'a>;

    fn begin_effects(&mut self) -> Result<PgEffectTx<'_>, StoreError> {
        let txid = self
            .conn
            .begin_with(CONTEXT, "BEGIN ISOLATION LEVEL READ COMMITTED")?;
        Ok(PgEffectTx {
            tx: &self.conn,
            txid,
            commits: &mut self.commits,
            open: true,
        })
    }

    fn commit_effects(mut writer: PgEffectTx<'_>) -> Result<(), StoreError> {
        writer.open = false;
        writer
            .tx
            .commit("consumer: effect commit failed", writer.txid)?;
        *writer.commits += 1;
        Ok(())
    }
}

impl EffectOps for PgConsumer {
    fn register_order(&mut self, order: &[(EffectName, bool)]) -> Result<(), StoreError> {
        let names: Vec<&str> = order.iter().map(|(name, _)| name.as_str()).collect();
        let ordered: Vec<bool> = order.iter().map(|(_, ordered)| *ordered).collect();
        let context = "consumer: cannot record the effects' order";
        self.write(context, |tx, _| {
            tx.run(
                context,
                "INSERT INTO {s}.effect_order (name, ordered)
                 SELECT * FROM unnest($1::text[], $2::boolean[])
                 ON CONFLICT (name) DO UPDATE SET ordered = excluded.ordered",
                &[&names, &ordered],
            )
            .map(drop)
        })
    }

    fn effects(
        &mut self,
        filter: &EffectFilter,
        limit: usize,
    ) -> Result<Vec<EffectEntry>, StoreError> {
        let rows = self.conn.rows(
            "consumer: cannot list the effect intents",
            LIST_SQL,
            &[
                &filter.state.map(EffectState::as_str),
                &filter.name.as_ref().map(EffectName::as_str),
                &filter.producer.as_ref().map(ProducerName::as_str),
                &sql_limit(limit),
            ],
        )?;
        rows.iter().map(entry).collect()
    }

    fn effect(&mut self, key: &EffectKey) -> Result<Option<EffectEntry>, StoreError> {
        let row = self.conn.row(
            "consumer: cannot read an effect intent",
            ENTRY_SQL,
            &[&key.as_str()],
        )?;
        row.as_ref().map(entry).transpose()
    }

    fn effect_counts(&mut self, now_ms: i64) -> Result<EffectCounts, StoreError> {
        let context = "consumer: cannot count the effect intents";
        read_snapshot(&self.conn, context, |tx| {
            let mut counts = EffectCounts::default();
            let by_state = tx.rows(
                context,
                "SELECT state, count(*) FROM {s}.effect_intent GROUP BY state",
                &[],
            )?;
            for row in by_state {
                counts.count(row.get(0), row.get(1))?;
            }
            let oldest: Option<i64> = tx
                .row(
                    context,
                    "SELECT min(recorded_at_ms) FROM {s}.effect_intent WHERE state = 'pending'",
                    &[],
                )?
                .and_then(|row| row.get(0));
            counts.oldest_pending_age_s = oldest.map(|at| (now_ms - at).max(0) as f64 / 1_000.0);
            Ok(counts)
        })
    }

    fn act_on_effect(
        &mut self,
        key: &EffectKey,
        action: &EffectAction,
        by: &str,
        reason: &str,
    ) -> Result<Result<EffectEntry, ActionRefused>, StoreError> {
        let now_ms = self.clock.now_ms();
        // A refusal rolls back: nothing is written.
        let outcome = self.conn.in_tx(ACT, |tx| {
            match act_in_tx(tx, key, action, (by, reason), now_ms)? {
                Ok(entry) => Ok(entry),
                Err(refused) => Err(Refusal::Refused(refused)),
            }
        });
        match outcome {
            Ok(entry) => {
                self.commits += 1;
                Ok(Ok(entry))
            }
            Err(Refusal::Refused(refused)) => Ok(Err(refused)),
            Err(Refusal::Store(e)) => Err(e),
        }
    }
}

const ACT: &str = "consumer: cannot act on an effect intent";

/// An operator's action refused, or a store failure, either of which
/// rolls back.
enum Refusal {
    Refused(ActionRefused),
    Store(StoreError),
}

impl From<StoreError> for Refusal {
    fn from(e: StoreError) -> Refusal {
        Refusal::Store(e)
    }
}

/// The operator's `action` on `key` inside an open transaction: the
/// state read under a row lock, the decision the core's, the change and
/// its repair log row.
fn act_in_tx(
    tx: &PgTx,
    key: &EffectKey,
    action: &EffectAction,
    (by, reason): (&str, &str),
    now_ms: i64,
) -> Result<Result<EffectEntry, ActionRefused>, StoreError> {
    let stored = tx.row(
        ACT,
        "SELECT state FROM {s}.effect_intent WHERE key = $1 FOR UPDATE",
        &[&key.as_str()],
    )?;
    let Some(stored) = stored else {
        return Ok(Err(ActionRefused::Unknown(key.clone())));
    };
    let state = effect::stored_state(stored.get(0))?;
    let to = match effect::operator_action(state, action) {
        Ok(to) => to,
        Err(refusal) => return Ok(Err(refusal.into())),
    };
    let result = match action {
        EffectAction::ResolveSucceeded(result) => Some(
            result
                .clone()
                .unwrap_or(serde_json::Value::Null)
                .to_string(),
        ),
        _ => None,
    };
    let settled = to.is_settled().then_some(now_ms);
    let retry = matches!(action, EffectAction::Retry);
    let changed = tx.run(
        ACT,
        "UPDATE {s}.effect_intent SET state = $2, updated_at_ms = $3, settled_at_ms = $4,
             result = coalesce($5, result),
             next_attempt_at_ms = CASE WHEN $6 THEN $3 ELSE next_attempt_at_ms END,
             attempts_base = CASE WHEN $6 THEN attempts ELSE attempts_base END
         WHERE key = $1",
        &[
            &key.as_str(),
            &to.as_str(),
            &now_ms,
            &settled,
            &result,
            &retry,
        ],
    )?;
    assert_eq!(changed, 1, "the intent acted on is locked");
    tx.run(
        "consumer: cannot log an effect action",
        "INSERT INTO {s}.repair_log (action, flow_id, seq, event_id, reason, decided_by, at_ms,
                                     producer, store_id, key)
         SELECT $2::text, flow_id, seq, event_id, $3::text, $4::text, $5::bigint, producer, NULL,
                key
         FROM {s}.effect_intent WHERE key = $1",
        &[&key.as_str(), &action.log_name(), &reason, &by, &now_ms],
    )?;
    let entry = tx.row(ACT, ENTRY_SQL, &[&key.as_str()])?;
    let entry = entry.expect("the intent acted on exists");
    Ok(Ok(self::entry(&entry)?))
}

impl EffectWriter for PgEffectTx<'_> {
    fn expired(
        &mut self,
        names: &[EffectName],
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<EffectRow>, StoreError> {
        let rows = self.tx.rows(
            "consumer: cannot read the expired effect leases",
            EXPIRED_SQL,
            &[&now_ms, &names_param(names), &sql_limit(limit)],
        )?;
        rows.iter().map(effect_row).collect()
    }

    fn due(
        &mut self,
        names: &[EffectName],
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<EffectRow>, StoreError> {
        let rows = self.tx.rows(
            "consumer: cannot read the due effect intents",
            DUE_SQL,
            &[&now_ms, &names_param(names), &sql_limit(limit)],
        )?;
        rows.iter().map(effect_row).collect()
    }

    fn claim(&mut self, row: &EffectRow, claim: &ClaimWrite<'_>) -> Result<(), StoreError> {
        let attempt = i32::try_from(claim.attempt)
            .map_err(|_| corrupt(CONTEXT, format!("attempt {}", claim.attempt)))?;
        let changed = self.tx.run(
            "consumer: cannot claim an effect intent",
            "UPDATE {s}.effect_intent SET state = 'in_flight', attempts = $2, reconciling = $3,
                 lease_owner = $4, lease_until_ms = $5,
                 first_attempt_at_ms = coalesce(first_attempt_at_ms, $6), updated_at_ms = $6
             WHERE key = $1 AND state IN ('pending', 'in_flight')",
            &[
                &row.key.as_str(),
                &attempt,
                &claim.reconciling,
                &claim.owner,
                &claim.lease_until_ms,
                &claim.now_ms,
            ],
        )?;
        assert_eq!(changed, 1, "a claimed row was read and locked by the claim");
        Ok(())
    }

    fn settle(
        &mut self,
        key: &EffectKey,
        attempt: u32,
        settle: &Settle,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let Ok(attempt) = i32::try_from(attempt) else {
            return Ok(false);
        };
        let w = SettleColumns::of(settle, now_ms);
        let changed = self.tx.run(
            "consumer: cannot record an effect's outcome",
            "UPDATE {s}.effect_intent SET state = $3, result = coalesce($4, result),
                 last_error = $5, next_attempt_at_ms = coalesce($6, next_attempt_at_ms),
                 unknown_seen = unknown_seen OR $7, reconciling = $8,
                 lease_owner = CASE WHEN $8 THEN lease_owner END,
                 lease_until_ms = CASE WHEN $8 THEN lease_until_ms END,
                 settled_at_ms = $9, updated_at_ms = $10
             WHERE key = $1 AND attempts = $2
               AND (state = 'in_flight' OR (state = 'outcome_unknown' AND $11))",
            &[
                &key.as_str(),
                &attempt,
                &w.state.as_str(),
                &w.result,
                &w.error,
                &w.due_at_ms,
                &w.unknown,
                &w.reconciling,
                &w.state.is_settled().then_some(now_ms),
                &now_ms,
                &w.definite,
            ],
        )?;
        Ok(changed == 1)
    }
}
