//! Effect intents on SQLite: written in the apply transaction, claimed and
//! settled by executors, listed and repaired by operators. The decisions
//! are `ordo_core::effect`'s; this module only reads and writes rows.

use ordo_core::effect::{
    self, ActionRefused, ClaimWrite, EffectAction, EffectCounts, EffectEntry, EffectFilter,
    EffectKey, EffectName, EffectOps, EffectRow, EffectState, EffectStore, EffectWriter, Intent,
    Settle, SettleColumns, StoredAttempt,
};
use ordo_core::{EventId, FlowId, ProducerName, Seq, StoreError};
use rusqlite::{params, Connection, OptionalExtension};

use super::schema::begin_write;
use super::ConsumerDb;
use crate::conn::{collect_rows, corrupt, exec_cached, row_cached, sql_error};

const CONTEXT: &str = "consumer: effect intents";

/// Writes `intents`, each `pending` and due at `now_ms`.
pub(super) fn insert_intents(
    tx: &Connection,
    intents: &[Intent],
    now_ms: i64,
) -> Result<(), StoreError> {
    for intent in intents {
        exec_cached(
            tx,
            "INSERT INTO effect_intent (key, name, producer, flow_id, seq, position, event_id,
                 request, state, next_attempt_at_ms, recorded_at_ms, updated_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending', ?9, ?9, ?9)",
            params![
                intent.key.as_str(),
                intent.name.as_str(),
                intent.producer.as_str(),
                intent.flow_id.as_str(),
                intent.seq.get(),
                intent.position,
                intent.event_id.as_str(),
                intent.request,
                now_ms,
            ],
        )
        .map_err(|e| sql_error("consumer: cannot record an effect intent", e))?;
    }
    Ok(())
}

/// The columns a claim reads, in [`effect_row`]'s order.
const ROW_COLUMNS: &str = "i.key, i.name, i.producer, i.flow_id, i.seq, i.event_id, i.request,
    i.attempts, i.attempts_base, i.unknown_seen, coalesce(i.first_attempt_at_ms, 0),
    i.reconciling, i.last_error";

type RawRow = (
    String,
    String,
    String,
    String,
    i64,
    String,
    String,
    i64,
    i64,
    bool,
    i64,
    bool,
    Option<String>,
);

fn raw_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawRow> {
    row.try_into()
}

fn effect_row(raw: RawRow) -> Result<EffectRow, StoreError> {
    let (key, name, producer, flow_id, seq, event_id, request, attempts, attempts_base) = (
        raw.0, raw.1, raw.2, raw.3, raw.4, raw.5, raw.6, raw.7, raw.8,
    );
    let (unknown_seen, first_attempt_at_ms, reconciling, last_error) =
        (raw.9, raw.10, raw.11, raw.12);
    let bad = |e: ordo_core::RuleViolation| corrupt(CONTEXT, e);
    Ok(EffectRow {
        key: EffectKey::new(key).map_err(bad)?,
        name: EffectName::new(name).map_err(bad)?,
        producer: ProducerName::new(producer).map_err(bad)?,
        flow_id: FlowId::new(flow_id).map_err(bad)?,
        seq: Seq::new(seq).map_err(bad)?,
        event_id: EventId::new(event_id).map_err(bad)?,
        request,
        attempt: StoredAttempt {
            attempts: count(attempts)?,
            attempts_base: count(attempts_base)?,
            unknown_seen,
            first_attempt_at_ms,
        },
        reconciling,
        last_error,
    })
}

fn count(n: i64) -> Result<u32, StoreError> {
    u32::try_from(n).map_err(|_| corrupt(CONTEXT, format!("attempts {n}")))
}

/// The executor's names as the JSON array `json_each` reads.
fn names_json(names: &[EffectName]) -> String {
    serde_json::Value::from(names.iter().map(|n| n.as_str()).collect::<Vec<_>>()).to_string()
}

/// One `BEGIN IMMEDIATE` transaction over the intents.
pub struct EffectTx<'a> {
    tx: rusqlite::Transaction<'a>,
}

impl EffectStore for ConsumerDb {
    type Writer<'a> = EffectTx<'a>;

    fn begin_effects(&mut self) -> Result<EffectTx<'_>, StoreError> {
        Ok(EffectTx {
            tx: begin_write(&mut self.conn)?,
        })
    }

    fn commit_effects(writer: EffectTx<'_>) -> Result<(), StoreError> {
        writer
            .tx
            .commit()
            .map_err(|e| sql_error("consumer: effect commit failed", e))
    }
}

impl EffectOps for ConsumerDb {
    fn register_order(&mut self, order: &[(EffectName, bool)]) -> Result<(), StoreError> {
        let tx = begin_write(&mut self.conn)?;
        for (name, ordered) in order {
            exec_cached(
                &tx,
                "INSERT INTO effect_order (name, ordered) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET ordered = excluded.ordered",
                params![name.as_str(), ordered],
            )
            .map_err(|e| sql_error("consumer: cannot record the effects' order", e))?;
        }
        tx.commit()
            .map_err(|e| sql_error("consumer: cannot record the effects' order", e))
    }

    fn effects(
        &mut self,
        filter: &EffectFilter,
        limit: usize,
    ) -> Result<Vec<EffectEntry>, StoreError> {
        list(&self.conn, filter, limit)
    }

    fn effect(&mut self, key: &EffectKey) -> Result<Option<EffectEntry>, StoreError> {
        entry_of(&self.conn, key)
    }

    fn effect_counts(&mut self, now_ms: i64) -> Result<EffectCounts, StoreError> {
        counts(&self.conn, now_ms)
    }

    fn act_on_effect(
        &mut self,
        key: &EffectKey,
        action: &EffectAction,
        by: &str,
        reason: &str,
    ) -> Result<Result<EffectEntry, ActionRefused>, StoreError> {
        let now_ms = self.clock.now_ms();
        let tx = begin_write(&mut self.conn)?;
        let Some(state) = state_of(&tx, key)? else {
            return Ok(Err(ActionRefused::Unknown(key.clone())));
        };
        let to = match effect::operator_action(state, action) {
            Ok(to) => to,
            Err(refusal) => return Ok(Err(refusal.into())),
        };
        write_action(&tx, key, action, to, now_ms)?;
        log_action(&tx, key, action, (by, reason), now_ms)?;
        let entry = entry_of(&tx, key)?.expect("the intent acted on exists");
        tx.commit()
            .map_err(|e| sql_error("consumer: cannot commit an effect action", e))?;
        Ok(Ok(entry))
    }
}

fn state_of(tx: &Connection, key: &EffectKey) -> Result<Option<EffectState>, StoreError> {
    let state: Option<String> = row_cached(
        tx,
        "SELECT state FROM effect_intent WHERE key = ?1",
        [key.as_str()],
        |row| row.get(0),
    )
    .optional()
    .map_err(|e| sql_error(CONTEXT, e))?;
    state.map(|s| effect::stored_state(&s)).transpose()
}

/// Moves the intent to `to` as the operator's `action` says.
fn write_action(
    tx: &Connection,
    key: &EffectKey,
    action: &EffectAction,
    to: EffectState,
    now_ms: i64,
) -> Result<(), StoreError> {
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
    let changed = exec_cached(
        tx,
        "UPDATE effect_intent SET state = ?2, updated_at_ms = ?3, settled_at_ms = ?4,
             result = coalesce(?5, result),
             next_attempt_at_ms = CASE WHEN ?6 THEN ?3 ELSE next_attempt_at_ms END,
             attempts_base = CASE WHEN ?6 THEN attempts ELSE attempts_base END
         WHERE key = ?1",
        params![key.as_str(), to.as_str(), now_ms, settled, result, retry],
    )
    .map_err(|e| sql_error("consumer: cannot act on an effect intent", e))?;
    assert_eq!(changed, 1, "the intent acted on exists");
    Ok(())
}

fn log_action(
    tx: &Connection,
    key: &EffectKey,
    action: &EffectAction,
    (by, reason): (&str, &str),
    now_ms: i64,
) -> Result<(), StoreError> {
    exec_cached(
        tx,
        "INSERT INTO repair_log (action, flow_id, seq, event_id, reason, decided_by, at_ms,
                                 producer, store_id, key)
         SELECT ?2, flow_id, seq, event_id, ?3, ?4, ?5, producer, NULL, key
         FROM effect_intent WHERE key = ?1",
        params![key.as_str(), action.log_name(), reason, by, now_ms],
    )
    .map_err(|e| sql_error("consumer: cannot log an effect action", e))?;
    Ok(())
}

impl EffectWriter for EffectTx<'_> {
    fn expired(
        &mut self,
        names: &[EffectName],
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<EffectRow>, StoreError> {
        let sql = format!(
            "SELECT {ROW_COLUMNS} FROM effect_intent i
             WHERE i.state = 'in_flight' AND i.lease_until_ms <= ?1
               AND i.name IN (SELECT value FROM json_each(?2))
             ORDER BY i.lease_until_ms LIMIT ?3"
        );
        let params = params![now_ms, names_json(names), limit as i64];
        collect_rows(&self.tx, CONTEXT, &sql, params, raw_row, effect_row)
    }

    fn due(
        &mut self,
        names: &[EffectName],
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<EffectRow>, StoreError> {
        let sql = format!(
            "SELECT {ROW_COLUMNS} FROM effect_intent i
             WHERE i.state = 'pending' AND i.next_attempt_at_ms <= ?1
               AND i.name IN (SELECT value FROM json_each(?2))
               AND NOT EXISTS ({WAITING})
             ORDER BY i.next_attempt_at_ms, i.flow_id, i.producer, i.seq, i.position LIMIT ?3"
        );
        let params = params![now_ms, names_json(names), limit as i64];
        collect_rows(&self.tx, CONTEXT, &sql, params, raw_row, effect_row)
    }

    fn claim(&mut self, row: &EffectRow, claim: &ClaimWrite<'_>) -> Result<(), StoreError> {
        let changed = exec_cached(
            &self.tx,
            "UPDATE effect_intent SET state = 'in_flight', attempts = ?2, reconciling = ?3,
                 lease_owner = ?4, lease_until_ms = ?5,
                 first_attempt_at_ms = coalesce(first_attempt_at_ms, ?6), updated_at_ms = ?6
             WHERE key = ?1 AND (state = 'pending' OR state = 'in_flight')",
            params![
                row.key.as_str(),
                claim.attempt,
                claim.reconciling,
                claim.owner,
                claim.lease_until_ms,
                claim.now_ms,
            ],
        )
        .map_err(|e| sql_error("consumer: cannot claim an effect intent", e))?;
        assert_eq!(changed, 1, "a claimed row was read by the claim");
        Ok(())
    }

    fn settle(
        &mut self,
        key: &EffectKey,
        attempt: u32,
        settle: &Settle,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let w = SettleColumns::of(settle, now_ms);
        let changed = exec_cached(
            &self.tx,
            "UPDATE effect_intent SET state = ?3, result = coalesce(?4, result), last_error = ?5,
                 next_attempt_at_ms = coalesce(?6, next_attempt_at_ms),
                 unknown_seen = unknown_seen OR ?7, reconciling = ?8,
                 lease_owner = CASE WHEN ?8 THEN lease_owner END,
                 lease_until_ms = CASE WHEN ?8 THEN lease_until_ms END,
                 settled_at_ms = ?9, updated_at_ms = ?10
             WHERE key = ?1 AND attempts = ?2
               AND (state = 'in_flight' OR (state = 'outcome_unknown' AND ?11))",
            params![
                key.as_str(),
                attempt,
                w.state.as_str(),
                w.result,
                w.error,
                w.due_at_ms,
                w.unknown,
                w.reconciling,
                w.state.is_settled().then_some(now_ms),
                now_ms,
                w.definite,
            ],
        )
        .map_err(|e| sql_error("consumer: cannot record an effect's outcome", e))?;
        Ok(changed == 1)
    }
}

/// An earlier intent of `i`'s flow that `i` waits for (EFFECTS.md
/// "Order"), when both are ordered: a correlated subquery over `i`.
const WAITING: &str = "SELECT e.key FROM effect_intent e
    WHERE e.flow_id = i.flow_id AND e.producer = i.producer
      AND (e.seq < i.seq OR (e.seq = i.seq AND e.position < i.position))
      AND (e.state = 'pending' OR e.state = 'in_flight' OR e.state = 'outcome_unknown')
      AND NOT EXISTS (SELECT 1 FROM effect_order o WHERE o.name = e.name AND o.ordered = 0)
      AND NOT EXISTS (SELECT 1 FROM effect_order o WHERE o.name = i.name AND o.ordered = 0)
    ORDER BY e.seq, e.position LIMIT 1";

/// The columns a listing reads.
const ENTRY_COLUMNS: &str = "i.key, i.name, i.producer, i.flow_id, i.seq, i.state, i.attempts,
    i.request, i.result, i.last_error, i.next_attempt_at_ms, i.updated_at_ms";

type RawEntry = (
    String,
    String,
    String,
    String,
    i64,
    String,
    i64,
    String,
    Option<String>,
    Option<String>,
    i64,
    i64,
    Option<String>,
);

fn raw_entry(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawEntry> {
    row.try_into()
}

fn entry(raw: RawEntry) -> Result<EffectEntry, StoreError> {
    let (key, name, producer, flow_id, seq, state, attempts) =
        (raw.0, raw.1, raw.2, raw.3, raw.4, raw.5, raw.6);
    let (request, result, last_error, next_attempt_at_ms, updated_at_ms, waiting_on) =
        (raw.7, raw.8, raw.9, raw.10, raw.11, raw.12);
    let bad = |e: ordo_core::RuleViolation| corrupt(CONTEXT, e);
    let state = effect::stored_state(&state)?;
    Ok(EffectEntry {
        key: EffectKey::new(key).map_err(bad)?,
        name: EffectName::new(name).map_err(bad)?,
        producer: ProducerName::new(producer).map_err(bad)?,
        flow_id: FlowId::new(flow_id).map_err(bad)?,
        seq: Seq::new(seq).map_err(bad)?,
        state,
        attempts: count(attempts)?,
        request,
        result,
        last_error,
        waiting_on: waiting_on.map(EffectKey::new).transpose().map_err(bad)?,
        next_attempt_at_ms: (state == EffectState::Pending).then_some(next_attempt_at_ms),
        updated_at_ms,
    })
}

fn list(
    conn: &Connection,
    filter: &EffectFilter,
    limit: usize,
) -> Result<Vec<EffectEntry>, StoreError> {
    let sql = format!(
        "SELECT {ENTRY_COLUMNS},
             CASE WHEN i.state = 'pending' THEN ({WAITING}) END
         FROM effect_intent i
         WHERE (?1 IS NULL OR i.state = ?1) AND (?2 IS NULL OR i.name = ?2)
           AND (?3 IS NULL OR i.producer = ?3)
         ORDER BY i.flow_id, i.producer, i.seq, i.position LIMIT ?4"
    );
    let params = params![
        filter.state.map(EffectState::as_str),
        filter.name.as_ref().map(EffectName::as_str),
        filter.producer.as_ref().map(ProducerName::as_str),
        limit as i64,
    ];
    collect_rows(conn, CONTEXT, &sql, params, raw_entry, entry)
}

fn entry_of(conn: &Connection, key: &EffectKey) -> Result<Option<EffectEntry>, StoreError> {
    let sql = format!(
        "SELECT {ENTRY_COLUMNS}, CASE WHEN i.state = 'pending' THEN ({WAITING}) END
         FROM effect_intent i WHERE i.key = ?1"
    );
    let mut rows = collect_rows(conn, CONTEXT, &sql, [key.as_str()], raw_entry, entry)?;
    Ok(rows.pop())
}

fn counts(conn: &Connection, now_ms: i64) -> Result<EffectCounts, StoreError> {
    let mut counts = EffectCounts::default();
    let by_state = collect_rows(
        conn,
        CONTEXT,
        "SELECT state, count(*) FROM effect_intent GROUP BY state",
        [],
        |row| Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?)),
        Ok,
    )?;
    for (state, n) in by_state {
        counts.count(&state, n)?;
    }
    let oldest: Option<i64> = row_cached(
        conn,
        "SELECT min(recorded_at_ms) FROM effect_intent WHERE state = 'pending'",
        [],
        |row| row.get(0),
    )
    .map_err(|e| sql_error(CONTEXT, e))?;
    counts.oldest_pending_age_s = oldest.map(|at| (now_ms - at).max(0) as f64 / 1_000.0);
    Ok(counts)
}

/// Removes intents settled (`succeeded`, `failed`, `skipped`) before
/// `cutoff_ms`; how many.
pub(crate) fn prune_settled(tx: &Connection, cutoff_ms: i64) -> Result<u64, StoreError> {
    exec_cached(
        tx,
        "DELETE FROM effect_intent WHERE settled_at_ms < ?1
           AND (state = 'succeeded' OR state = 'failed' OR state = 'skipped')",
        [cutoff_ms],
    )
    .map(|n| n as u64)
    .map_err(|e| sql_error("consumer: cannot prune effect intents", e))
}
