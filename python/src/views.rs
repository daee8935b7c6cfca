//! The operator's views of a store as plain Python values, with the
//! command line's JSON keys: `store.status()` (that side's object of
//! `ordo status --json`), `consumer.inbox(status=None)` (the rows of
//! `ordo inbox list --json`) and `consumer.effects(state=None)` (the rows
//! of `ordo effects list --json`).
//!
//! The command line's rendering lives in the binary, not in a library
//! crate, so the objects are built here from the core types, key for key
//! as the command line builds them.
//!
//! Invariant: a view reads under the store's lock with the GIL released,
//! and changes nothing.

use ordo::core::effect::{EffectEntry, EffectFilter, EffectName, EffectState};
use ordo::core::ops::{age_s, ConsumerStatus, InboxEntry, InboxScope, ProducerStatus};
use ordo::core::{Clock, ErrorKind, StoreError, StoreId, SystemClock};
use pyo3::prelude::*;
use serde_json::{json, Map, Value};

use crate::convert::json_to_py;
use crate::errors::{invalid, rule, store_error};
use crate::store::{Shared, StoreKind};

/// The most rows a listing returns when no limit is given (the command
/// line's default).
pub const LIST_LIMIT_DEFAULT: usize = 1000;

/// The inbox statuses `consumer.inbox(status=...)` takes.
const INBOX_STATUSES: [&str; 4] = ["pending", "applied", "blocked", "skipped"];

/// Runs `read` on the store under its lock, the GIL released.
fn read<S: StoreKind, T: Send>(
    py: Python<'_>,
    shared: &Shared<S>,
    read: impl FnOnce(&mut S) -> Result<T, StoreError> + Send,
) -> PyResult<T> {
    let mut guard = shared.lock(py)?;
    py.detach(move || match guard.as_mut() {
        Some(store) => read(store),
        None => Err(StoreError::new(ErrorKind::Other, "the store was closed")),
    })
    .map_err(store_error)
}

/// A status's counters, as `ordo status --json` prints them for one
/// destination or for the whole store.
fn producer_counters(now_ms: i64, p: &ProducerStatus) -> Value {
    json!({
        "backlog": p.backlog,
        "oldest_pending_age_s": p.oldest_pending_age_s(now_ms),
        "quarantined": p.quarantined,
        "rewound": p.rewound,
        "backing_off": p.backing_off,
    })
}

/// The producer's object of `ordo status --json`.
pub fn producer_status(py: Python<'_>, shared: &Shared<ordo::Producer>) -> PyResult<Py<PyAny>> {
    let value = read(py, shared, |store| {
        let now_ms = SystemClock.now_ms();
        let handle = store.handle();
        let destinations = handle.destinations(now_ms)?;
        let total = ordo::core::destination::sum_statuses(destinations.iter().map(|d| &d.status));
        let mut value = producer_counters(now_ms, &total);
        value["store_id"] = handle.store_id().as_str().into();
        value["producer_name"] = handle.producer_name().as_str().into();
        let by_name: Map<String, Value> = destinations
            .iter()
            .map(|d| (d.name.to_string(), producer_counters(now_ms, &d.status)))
            .collect();
        value["destinations"] = Value::Object(by_name);
        Ok(value)
    })?;
    json_to_py(py, &value)
}

/// The consumer's counters as `ordo status --json` prints them.
fn consumer_counters(now_ms: i64, c: &ConsumerStatus, store_id: &StoreId) -> Value {
    json!({
        "store_id": store_id.as_str(),
        "pending": c.pending,
        "blocked": {"total": c.blocked_total(), "by_reason": c.blocked},
        "gaps": c.gaps.iter().map(|g| json!({
            "flow_id": g.flow_id.as_str(),
            "producer": g.producer.as_str(),
            "missing_seq": g.missing.get(),
            "since_ms": g.since_ms,
            "waiting_s": age_s(now_ms, g.since_ms),
        })).collect::<Vec<_>>(),
        "gaps_total": c.gaps_total,
        "applied": c.applied,
        "skipped": c.skipped,
    })
}

/// The consumer's object of `ordo status --json`, its effects included.
pub fn consumer_status(py: Python<'_>, shared: &Shared<ordo::Consumer>) -> PyResult<Py<PyAny>> {
    let value = read(py, shared, |store| {
        let now_ms = SystemClock.now_ms();
        let handle = store.handle();
        let status = handle.consumer_status()?;
        let mut value = consumer_counters(now_ms, &status, &handle.store_id().clone());
        let counts = handle.effect_counts(now_ms)?;
        let mut effects = Map::new();
        for state in EffectState::ALL {
            effects.insert(state.as_str().into(), counts.of(state).into());
        }
        effects.insert(
            "oldest_pending_age_s".into(),
            json!(counts.oldest_pending_age_s),
        );
        value["effects"] = Value::Object(effects);
        Ok(value)
    })?;
    json_to_py(py, &value)
}

/// One inbox row as `ordo inbox list --json` prints it: the envelope's
/// keys and the row's.
fn inbox_row(e: &InboxEntry) -> Value {
    let mut object = match e.envelope.to_value() {
        Value::Object(object) => object,
        _ => Map::new(),
    };
    let extra = json!({
        "status": e.status.as_str(),
        "reason": e.status.reason().map(|r| r.as_str()),
        "detail": e.status.reason().and_then(|r| r.detail.as_deref()),
        "received_at_ms": e.received_at_ms,
        "settled_at_ms": e.settled_at_ms,
        "producer": e.envelope.producer.as_str(),
        "store_id": e.store_id.as_ref().map(StoreId::as_str),
    });
    if let Value::Object(extra) = extra {
        object.extend(extra);
    }
    Value::Object(object)
}

/// The inbox rows, by flow then seq, only those of `status` when given,
/// at most `limit`.
pub fn inbox(
    py: Python<'_>,
    shared: &Shared<ordo::Consumer>,
    status: Option<&str>,
    limit: usize,
) -> PyResult<Py<PyAny>> {
    if let Some(status) = status {
        if !INBOX_STATUSES.contains(&status) {
            return Err(invalid(format!(
                "status is one of \"pending\", \"applied\", \"blocked\", \"skipped\" or None, not {status:?}"
            )));
        }
    }
    let status = status.map(str::to_owned);
    let rows = read(py, shared, move |store| {
        let handle = store.handle();
        let entries = match status.as_deref() {
            None => handle.inbox_entries(false, InboxScope::All, limit)?,
            Some("blocked") => handle.inbox_entries(true, InboxScope::All, limit)?,
            Some(wanted) => {
                let mut all = handle.inbox_entries(false, InboxScope::All, i64::MAX as usize)?;
                all.retain(|e| e.status.as_str() == wanted);
                all.truncate(limit);
                all
            }
        };
        Ok(entries.iter().map(inbox_row).collect::<Vec<_>>())
    })?;
    json_to_py(py, &Value::Array(rows))
}

/// A stored JSON text as a value (a text that does not parse stays a
/// string, as the command line shows it).
fn json_text(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// One intent as `ordo effects list --json` prints it.
pub fn effect_row(e: &EffectEntry) -> Value {
    json!({
        "key": e.key.as_str(),
        "name": e.name.as_str(),
        "producer": e.producer.as_str(),
        "flow_id": e.flow_id.as_str(),
        "seq": e.seq.get(),
        "state": e.state.as_str(),
        "attempts": e.attempts,
        "request": json_text(&e.request),
        "result": e.result.as_deref().map(json_text),
        "last_error": e.last_error,
        "waiting_on": e.waiting_on.as_ref().map(|k| k.as_str()),
        "next_attempt_at_ms": e.next_attempt_at_ms,
        "updated_at_ms": e.updated_at_ms,
    })
}

/// The effect intents, by flow and seq, only those in `state` and of
/// `name` when given, at most `limit`.
pub fn effects(
    py: Python<'_>,
    shared: &Shared<ordo::Consumer>,
    state: Option<&str>,
    name: Option<&str>,
    limit: usize,
) -> PyResult<Py<PyAny>> {
    let state = state
        .map(|s| s.parse::<EffectState>().map_err(|e| rule("state", e)))
        .transpose()?;
    let name = name
        .map(|n| EffectName::new(n).map_err(|e| rule("name", e)))
        .transpose()?;
    let filter = EffectFilter {
        state,
        name,
        producer: None,
    };
    let rows = read(py, shared, move |store| {
        let entries = store.handle().effects(&filter, limit)?;
        Ok(entries.iter().map(effect_row).collect::<Vec<_>>())
    })?;
    json_to_py(py, &Value::Array(rows))
}
