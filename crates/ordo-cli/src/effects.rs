//! `ordo effects list|retry|resolve|skip|run`: the consumer store's effect
//! intents (EFFECTS.md) as an operator sees and settles them.
//!
//! Invariant: every action opens an existing store only, and a refused one
//! (a bad or unknown key, a state that does not allow it, a bad `--result`)
//! exits 2 with nothing written.

use clap::Subcommand;
use ordo_core::effect::{
    EffectAction, EffectCounts, EffectEntry, EffectFilter, EffectKey, EffectName, EffectOps,
    EffectState,
};
use ordo_core::ProducerName;
use serde_json::{json, Value};

use crate::context::{emit, open_existing_consumer};
use crate::stores::{AnyConsumer, Location};
use crate::Failure;

/// The most rows `effects list` prints when `--limit` is not given.
const LIST_LIMIT_DEFAULT: &str = "1000";

#[derive(Debug, Subcommand)]
pub enum EffectsCommand {
    /// The effect intents, by flow and seq, with their states.
    List {
        /// The consumer store: an SQLite file or a postgres:// URL.
        #[arg(long, value_name = "C")]
        consumer: Location,
        /// Only intents in this state (pending, in_flight, succeeded, failed, outcome_unknown, skipped).
        #[arg(long, value_name = "STATE")]
        state: Option<EffectState>,
        /// Only this effect's intents.
        #[arg(long, value_name = "NAME", value_parser = effect_name)]
        name: Option<EffectName>,
        /// Only intents of this producer's events.
        #[arg(long, value_name = "NAME")]
        producer_name: Option<ProducerName>,
        /// At most N rows, N >= 1.
        #[arg(long, value_name = "N", default_value = LIST_LIMIT_DEFAULT,
              value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        limit: u64,
    },
    /// Execute due `webhook` intents (the built-in webhook executor).
    Run(crate::effects_run::RunArgs),
    /// Make a failed, outcome_unknown or pending intent due now, with more attempts, audited.
    Retry(Audited),
    /// Settle an outcome_unknown, failed or pending intent by hand, audited.
    Resolve {
        #[command(flatten)]
        audited: Audited,
        /// What happened: succeeded or failed.
        #[arg(long = "as", value_name = "succeeded|failed", value_parser = resolution)]
        resolution: EffectState,
        /// With --as succeeded, the result to store (JSON).
        #[arg(long, value_name = "JSON")]
        result: Option<String>,
    },
    /// Decide that a pending, failed or outcome_unknown intent will not happen, audited.
    Skip(Audited),
}

/// The intent an operator acts on, and who decided why.
#[derive(Debug, clap::Args)]
pub struct Audited {
    /// The consumer store: an SQLite file or a postgres:// URL.
    #[arg(long, value_name = "C")]
    consumer: Location,
    /// The intent's key, STORE_ID/PRODUCER/FLOW_ID/SEQ/NAME.
    #[arg(long, value_name = "KEY")]
    key: String,
    /// Who decided.
    #[arg(long, value_name = "WHO")]
    by: String,
    /// Why.
    #[arg(long, value_name = "WHY")]
    reason: String,
}

fn effect_name(value: &str) -> Result<EffectName, String> {
    EffectName::new(value).map_err(|e| e.rule)
}

fn resolution(value: &str) -> Result<EffectState, String> {
    match value {
        "succeeded" => Ok(EffectState::Succeeded),
        "failed" => Ok(EffectState::Failed),
        _ => Err("must be succeeded or failed".into()),
    }
}

/// The intents of `consumer`, whichever backend holds them.
pub fn ops(consumer: &mut AnyConsumer) -> &mut dyn EffectOps {
    match consumer {
        AnyConsumer::Sqlite(db) => db,
        AnyConsumer::Postgres(pg) => pg,
    }
}

pub fn run(json_mode: bool, command: EffectsCommand) -> Result<(), Failure> {
    match command {
        EffectsCommand::List {
            consumer,
            state,
            name,
            producer_name,
            limit,
        } => {
            let filter = EffectFilter {
                state,
                name,
                producer: producer_name,
            };
            list(json_mode, &consumer, &filter, limit as usize)
        }
        EffectsCommand::Run(args) => crate::effects_run::run(json_mode, &args),
        EffectsCommand::Retry(audited) => act(json_mode, &audited, EffectAction::Retry),
        EffectsCommand::Skip(audited) => act(json_mode, &audited, EffectAction::Skip),
        EffectsCommand::Resolve {
            audited,
            resolution,
            result,
        } => {
            let action = resolve_action(resolution, result.as_deref())?;
            act(json_mode, &audited, action)
        }
    }
}

/// `--as` and `--result` as an action; `--result` that is not JSON, or
/// given with `--as failed`, is invalid input.
fn resolve_action(resolution: EffectState, result: Option<&str>) -> Result<EffectAction, Failure> {
    let result = result
        .map(serde_json::from_str::<Value>)
        .transpose()
        .map_err(|e| Failure::Usage(format!("--result must be JSON ({e})")))?;
    match (resolution, result) {
        (EffectState::Succeeded, result) => Ok(EffectAction::ResolveSucceeded(result)),
        (_, None) => Ok(EffectAction::ResolveFailed),
        (_, Some(_)) => Err(Failure::Usage(
            "--result goes with --as succeeded only".into(),
        )),
    }
}

fn list(
    json_mode: bool,
    consumer: &Location,
    filter: &EffectFilter,
    limit: usize,
) -> Result<(), Failure> {
    let mut store = open_existing_consumer(consumer)?;
    let mut entries = ops(&mut store).effects(filter, limit.saturating_add(1))?;
    let truncated = entries.len() > limit;
    entries.truncate(limit);
    let rows: Vec<Value> = entries.iter().map(entry).collect();
    let value = json!({"effects": rows, "truncated": truncated});
    emit(json_mode, &value, || {
        let mut lines: Vec<String> = entries.iter().map(line).collect();
        lines.push(format!("{} intents", entries.len()));
        if truncated {
            lines.push(format!("(more than {limit}; raise --limit)"));
        }
        lines.join("\n")
    });
    Ok(())
}

fn act(json_mode: bool, audited: &Audited, action: EffectAction) -> Result<(), Failure> {
    let key = EffectKey::new(audited.key.clone())
        .map_err(|e| Failure::Usage(format!("--key: {}", e.rule)))?;
    ordo_core::destination::check_who_why(&audited.by, &audited.reason).map_err(Failure::Usage)?;
    let mut store = open_existing_consumer(&audited.consumer)?;
    let acted = ops(&mut store)
        .act_on_effect(&key, &action, &audited.by, &audited.reason)?
        .map_err(|refused| Failure::Usage(refused.to_string()))?;
    let value = json!({
        "action": action.log_name(),
        "by": audited.by,
        "reason": audited.reason,
        "effect": entry(&acted),
    });
    emit(json_mode, &value, || {
        format!("{}: {}", action.log_name(), line(&acted))
    });
    Ok(())
}

/// A stored JSON text as a value (a text that does not parse stays a
/// string, so nothing is hidden).
fn json_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// One intent as `effects list --json` prints it.
pub fn entry(e: &EffectEntry) -> Value {
    json!({
        "key": e.key.as_str(),
        "name": e.name.as_str(),
        "producer": e.producer.as_str(),
        "flow_id": e.flow_id.as_str(),
        "seq": e.seq.get(),
        "state": e.state.as_str(),
        "attempts": e.attempts,
        "request": json_value(&e.request),
        "result": e.result.as_deref().map(json_value),
        "last_error": e.last_error,
        "waiting_on": e.waiting_on.as_ref().map(|k| k.as_str()),
        "next_attempt_at_ms": e.next_attempt_at_ms,
        "updated_at_ms": e.updated_at_ms,
    })
}

fn line(e: &EffectEntry) -> String {
    let mut text = format!(
        "{} {}: {} (attempts {})",
        e.key, e.name, e.state, e.attempts
    );
    if let Some(error) = &e.last_error {
        text.push_str(&format!(", last error: {error}"));
    }
    if let Some(waiting) = &e.waiting_on {
        text.push_str(&format!(", waiting on {waiting}"));
    }
    text
}

/// The intents by state for `status`.
pub fn status_counts(consumer: &mut AnyConsumer, now_ms: i64) -> Result<EffectCounts, Failure> {
    Ok(ops(consumer).effect_counts(now_ms)?)
}

/// `status`'s text line of the intents.
pub fn counts_line(counts: &EffectCounts) -> String {
    let states: Vec<String> = (EffectState::ALL.iter())
        .map(|s| format!("{} {}", s.as_str().replace('_', " "), counts.of(*s)))
        .collect();
    let oldest = (counts.oldest_pending_age_s).map_or("-".to_owned(), |age| format!("{age:.1} s"));
    format!("effects: {} (oldest pending {oldest})", states.join(", "))
}

/// `status`'s effects object.
pub fn counts_value(counts: &EffectCounts) -> Value {
    let mut object = serde_json::Map::new();
    for state in EffectState::ALL {
        object.insert(state.as_str().into(), counts.of(state).into());
    }
    object.insert(
        "oldest_pending_age_s".into(),
        json!(counts.oldest_pending_age_s),
    );
    Value::Object(object)
}
