//! `ordo.reservation`: the reference domain (the flow `new -> reserved ->
//! confirmed -> released` of `ordo-reservation`) driven from Python on a
//! producer or consumer store opened with `domain="reservation"`: its
//! `advance`, its apply with the built-in handler, and the snapshot of
//! `ordo snapshot --json`.
//!
//! Invariant: the domain's rules and SQL are `ordo-reservation`'s alone;
//! this module converts arguments and results, takes the store's lock with
//! the GIL released, and runs nothing of Python while it holds it.

use std::collections::HashMap;

use ordo::core::destination::Custody;
use ordo::core::ops::{InboxScope, OutboxEntry, WHOLE_READ_ROWS_MAX};
use ordo::core::{
    Drain, Envelope as CoreEnvelope, ErrorKind, FlowId, InboxRecord, ProducerName, RelayOptions,
    RelayPolicy, SchemaVersion, StoreError, StoreId,
};
use ordo::OpenSpec;
use ordo_reservation::{
    Advance, AdvanceError, AdvanceRequest, ApplyOptions, EffectRecord, FlowRecord, FlowState,
    Projection, Quantity, ReservationConsumer, ReservationProducer,
};
use pyo3::prelude::*;
use pyo3::types::PyModule;
use serde_json::{json, Map, Value};

use crate::consumer::Consumer;
use crate::convert::json_to_py;
use crate::errors::{invalid, rule, store_error, WrongDomain};
use crate::producer::Producer;
use crate::values::Report;

/// The built-in domain's name.
pub const DOMAIN: &str = ordo_reservation::DOMAIN;

/// The open specification of a store of `domain`: the built-in
/// reservation domain's own schema (its tables come with ordo, so
/// `migrations` must be empty), or the application's domain with its
/// `migrations`.
pub fn open_spec(
    producer: bool,
    domain: &str,
    migrations: Option<&Bound<'_, PyAny>>,
    name: Option<&str>,
) -> PyResult<OpenSpec> {
    // The arguments' types and names are checked the same for every domain.
    let spec = crate::store::open_spec(domain, migrations, name)?;
    if domain != DOMAIN {
        return Ok(spec);
    }
    if let Some(migrations) = migrations.filter(|m| !m.is_none()) {
        if migrations.len()? != 0 {
            return Err(invalid(
                "migrations: the reservation domain's tables come with ordo; open it with no migrations",
            ));
        }
    }
    let schema = if producer {
        ordo_reservation::producer_schema()
    } else {
        ordo_reservation::consumer_schema()
    };
    let mut spec = OpenSpec::domain(schema);
    if let Some(name) = name {
        let name = ProducerName::new(name).map_err(|e| rule("producer name", e))?;
        spec = spec.producer_name(name);
    }
    Ok(spec)
}

/// `WrongDomain` unless the store is the reservation domain's.
fn check_domain(role: &str, domain: &str) -> PyResult<()> {
    if domain == DOMAIN {
        return Ok(());
    }
    Err(WrongDomain::new_err(format!(
        "ordo.reservation works on stores of domain \"{DOMAIN}\"; this {role} store belongs to domain \"{domain}\""
    )))
}

fn closed() -> StoreError {
    StoreError::new(ErrorKind::Other, "the store was closed")
}

/// Advances the flow ``flow_id`` by one step to ``to`` (``"reserved"``,
/// ``"confirmed"`` or ``"released"``) when its last seq is
/// ``expected_seq``: the flow's new state and its event commit together in
/// one transaction, or nothing is written. ``quantity`` (1..1000000) is
/// required for ``"reserved"`` and, when given later, must be the flow's;
/// ``schema_version`` is the payload's schema (1: ``{"amount": q}``, 2:
/// ``{"units": q}``). Returns ``"committed"``, ``"stale"`` (the flow's last
/// seq is another) or ``"invalid_transition"`` (not the flow's next step).
#[pyfunction]
#[pyo3(signature = (producer, flow_id, expected_seq, to, quantity=None, schema_version=None))]
fn advance(
    py: Python<'_>,
    producer: &Bound<'_, Producer>,
    flow_id: &Bound<'_, PyAny>,
    expected_seq: &Bound<'_, PyAny>,
    to: &Bound<'_, PyAny>,
    quantity: Option<&Bound<'_, PyAny>>,
    schema_version: Option<&Bound<'_, PyAny>>,
) -> PyResult<&'static str> {
    let producer = producer.get();
    check_domain("producer", &producer.shared.domain)?;
    let flow_id = crate::str_arg(flow_id, "flow_id")?;
    let flow_id = FlowId::new(flow_id).map_err(|e| rule("flow_id", e))?;
    let expected_seq = crate::int_arg(expected_seq, "expected_seq")?;
    let to = crate::str_arg(to, "to")?;
    let to = FlowState::parse(&to).ok_or_else(|| {
        invalid(format!(
            "to: one of \"reserved\", \"confirmed\", \"released\", not {to:?}"
        ))
    })?;
    let quantity = match quantity.filter(|q| !q.is_none()) {
        Some(q) => {
            let q = crate::int_arg(q, "quantity")?;
            Some(Quantity::new(q).map_err(|e| rule("quantity", e))?)
        }
        None => None,
    };
    let schema_version = match schema_version {
        Some(v) => crate::int_arg(v, "schema_version")?,
        None => 1,
    };
    let schema_version =
        SchemaVersion::new(schema_version).map_err(|e| rule("schema_version", e))?;
    let request = AdvanceRequest::new(flow_id, expected_seq, to, quantity, schema_version)
        .map_err(|e| invalid(e.to_string()))?;
    let mut guard = producer.shared.lock(py)?;
    let outcome = py.detach(|| match guard.as_mut() {
        Some(ordo::Producer::Sqlite(db)) => db.advance(&request),
        Some(ordo::Producer::Postgres(db)) => db.advance(&request),
        None => Err(AdvanceError::Store(closed())),
    });
    drop(guard);
    match outcome {
        Ok(Advance::Committed(_)) => Ok("committed"),
        Ok(Advance::Stale { .. }) => Ok("stale"),
        Ok(Advance::InvalidTransition { .. }) => Ok("invalid_transition"),
        Err(AdvanceError::Refused(refused)) => Err(invalid(refused.to_string())),
        Err(AdvanceError::Store(e)) => Err(store_error(e)),
        Err(other) => Err(crate::errors::error(other.to_string())),
    }
}

/// The apply report: the command line's `apply --json` object.
fn drains_value(drains: &[Drain]) -> Value {
    ordo::core::report::drains(drains, drains.len() as u64, false)
}

/// Applies every flow's received events once, in seq order, with the
/// reference domain's handler (as ``ordo apply``): each event updates the
/// flow's projection and writes one effect row in the apply transaction,
/// or is blocked (``unsupported_schema``, ``invalid_payload``,
/// ``invalid_transition``) and stops its flow there. ``support_v2=True``
/// decodes schema 2 too, and evaluates again the rows blocked for
/// ``unsupported_schema``. Returns a report with the keys of ``ordo apply
/// --json``.
#[pyfunction]
#[pyo3(signature = (consumer, support_v2=false))]
fn apply(py: Python<'_>, consumer: &Bound<'_, Consumer>, support_v2: bool) -> PyResult<Report> {
    let consumer = consumer.get();
    check_domain("consumer", &consumer.shared.domain)?;
    let options = ApplyOptions { support_v2 };
    let batch = ordo::core::store::APPLY_BATCH_LEN_DEFAULT;
    let mut guard = consumer.shared.lock(py)?;
    let drains = py.detach(|| match guard.as_mut() {
        Some(ordo::Consumer::Sqlite(db)) => db.process_all(None, options, batch),
        Some(ordo::Consumer::Postgres(db)) => db.process_all(None, options, batch),
        None => Err(closed()),
    });
    drop(guard);
    let drains = drains.map_err(store_error)?;
    Report::of(py, &drains_value(&drains))
}

/// An envelope's keys plus `extra`'s.
fn envelope_with(envelope: &CoreEnvelope, extra: Value) -> Value {
    let mut object = match envelope.to_value() {
        Value::Object(object) => object,
        _ => Map::new(),
    };
    if let Value::Object(extra) = extra {
        object.extend(extra);
    }
    Value::Object(object)
}

fn flow_value(record: &FlowRecord) -> Value {
    json!({
        "flow_id": record.flow_id.as_str(),
        "state": record.state.as_str(),
        "quantity": record.quantity.map(|q| q.get()),
        "last_seq": record.last_seq,
    })
}

fn custody_value(c: &Custody) -> Value {
    json!({
        "accepted": c.accepted,
        "accepted_at_ms": c.accepted_at_ms,
        "attempts": c.attempts,
        "last_outcome": c.last_outcome,
        "last_error": c.last_error,
        "next_attempt_at_ms": c.next_attempt_at_ms,
        "quarantined": c.quarantined,
        "quarantine_reason": c.quarantine_reason,
        "quarantine_detail": c.quarantine_detail,
        "abandoned": c.abandoned,
    })
}

fn outbox_value(entry: &OutboxEntry) -> Value {
    let destinations: Map<String, Value> = (entry.destinations.iter())
        .map(|c| (c.destination.to_string(), custody_value(c)))
        .collect();
    envelope_with(
        &entry.envelope,
        json!({"accepted": entry.accepted, "destinations": destinations}),
    )
}

fn inbox_value(record: &InboxRecord, store_id: Option<&StoreId>) -> Value {
    envelope_with(
        &record.envelope,
        json!({
            "status": record.status.as_str(),
            "reason": record.status.reason().map(|r| r.as_str()),
            "detail": record.status.reason().and_then(|r| r.detail.as_deref()),
            "producer": record.envelope.producer.as_str(),
            "store_id": store_id.map(StoreId::as_str),
        }),
    )
}

fn projection_value(record: &Projection) -> Value {
    json!({
        "flow_id": record.flow_id.as_str(),
        "producer": record.producer.as_str(),
        "state": record.state.as_str(),
        "quantity": record.quantity.map(|q| q.get()),
        "applied_seq": record.applied_seq,
    })
}

fn effect_value(record: &EffectRecord) -> Value {
    json!({
        "flow_id": record.flow_id.as_str(),
        "producer": record.producer.as_str(),
        "seq": record.seq.get(),
        "event_id": record.event_id.as_str(),
    })
}

/// The producer's side of `ordo snapshot --json`, read in one read
/// transaction.
fn producer_value(producer: &mut ordo::Producer) -> Result<Value, StoreError> {
    let (flows, outbox) = match producer {
        ordo::Producer::Sqlite(db) => ordo_reservation::producer_snapshot_entries(db)?,
        ordo::Producer::Postgres(db) => {
            ordo_reservation::postgres::pg_producer_snapshot_entries(db)?
        }
    };
    let handle = producer.handle();
    Ok(json!({
        "store_id": handle.store_id().as_str(),
        "producer_name": handle.producer_name().as_str(),
        "flows": flows.iter().map(flow_value).collect::<Vec<_>>(),
        "outbox": outbox.iter().map(outbox_value).collect::<Vec<_>>(),
    }))
}

/// An inbox row's identity.
type InboxKey = (String, String, i64);

fn inbox_key(envelope: &CoreEnvelope) -> InboxKey {
    (
        envelope.producer.as_str().to_owned(),
        envelope.flow_id.as_str().to_owned(),
        envelope.seq.get(),
    )
}

/// The consumer's side of `ordo snapshot --json`: its rows in one read
/// transaction, each inbox row with its delivering store read right after
/// (read again, up to three times, when a row was pruned in between), as
/// the command line reads them.
fn consumer_value(consumer: &mut ordo::Consumer) -> Result<Value, StoreError> {
    for _ in 0..3 {
        let (inbox, projections, effects) = match consumer {
            ordo::Consumer::Sqlite(db) => ordo_reservation::consumer_snapshot(db)?,
            ordo::Consumer::Postgres(db) => ordo_reservation::postgres::pg_consumer_snapshot(db)?,
        };
        let handle = consumer.handle();
        let entries = handle.inbox_entries(false, InboxScope::All, WHOLE_READ_ROWS_MAX)?;
        let store_ids: HashMap<InboxKey, Option<StoreId>> = (entries.into_iter())
            .map(|e| (inbox_key(&e.envelope), e.store_id))
            .collect();
        let rows: Option<Vec<Value>> = (inbox.iter())
            .map(|r| (store_ids.get(&inbox_key(&r.envelope))).map(|id| inbox_value(r, id.as_ref())))
            .collect();
        let Some(rows) = rows else { continue };
        return Ok(json!({
            "store_id": handle.store_id().as_str(),
            "inbox": rows,
            "projection": projections.iter().map(projection_value).collect::<Vec<_>>(),
            "effects": effects.iter().map(effect_value).collect::<Vec<_>>(),
        }));
    }
    Err(StoreError::new(
        ErrorKind::Busy,
        "inbox rows were pruned while the snapshot read them, each time; run it again",
    ))
}

/// The stores' rows as ``ordo snapshot --json`` prints them: a dict with
/// ``"producer"`` (``store_id``, ``producer_name``, ``flows``, ``outbox``)
/// when a producer is given and ``"consumer"`` (``store_id``, ``inbox``,
/// ``projection``, ``effects``) when a consumer is given. Each side is read
/// in one read transaction; the two sides together are not one snapshot.
#[pyfunction]
#[pyo3(signature = (producer=None, consumer=None))]
fn snapshot(
    py: Python<'_>,
    producer: Option<&Bound<'_, Producer>>,
    consumer: Option<&Bound<'_, Consumer>>,
) -> PyResult<Py<PyAny>> {
    let mut value = Map::new();
    if let Some(producer) = producer {
        let producer = producer.get();
        check_domain("producer", &producer.shared.domain)?;
        let mut guard = producer.shared.lock(py)?;
        let side = py.detach(|| match guard.as_mut() {
            Some(p) => producer_value(p),
            None => Err(closed()),
        });
        drop(guard);
        value.insert("producer".into(), side.map_err(store_error)?);
    }
    if let Some(consumer) = consumer {
        let consumer = consumer.get();
        check_domain("consumer", &consumer.shared.domain)?;
        let mut guard = consumer.shared.lock(py)?;
        let side = py.detach(|| match guard.as_mut() {
            Some(c) => consumer_value(c),
            None => Err(closed()),
        });
        drop(guard);
        value.insert("consumer".into(), side.map_err(store_error)?);
    }
    json_to_py(py, &Value::Object(value))
}

/// The options of `ordo.relay(..., policy=...)`: `"fair"` (ordo's
/// default: a conflict holds back only its own flow) or `"first-pending"`
/// (the original experiment's: always the oldest unaccepted event, so a
/// permanent conflict starves every later one).
pub fn relay_options(policy: Option<&Bound<'_, PyAny>>) -> PyResult<RelayOptions> {
    let policy = match policy.filter(|p| !p.is_none()) {
        None => RelayPolicy::Fair,
        Some(p) => match crate::str_arg(p, "policy")?.as_str() {
            "fair" => RelayPolicy::Fair,
            "first-pending" => RelayPolicy::FirstPending,
            other => {
                return Err(invalid(format!(
                    "policy: \"fair\" or \"first-pending\", not {other:?}"
                )))
            }
        },
    };
    Ok(RelayOptions {
        policy,
        ..RelayOptions::default()
    })
}

/// The native part of `ordo.reservation`, added to the native module as
/// its attribute `reservation`.
pub fn module(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    let m = PyModule::new(py, "reservation")?;
    m.add_function(wrap_pyfunction!(advance, &m)?)?;
    m.add_function(wrap_pyfunction!(apply, &m)?)?;
    m.add_function(wrap_pyfunction!(snapshot, &m)?)?;
    m.add("DOMAIN", DOMAIN)?;
    Ok(m)
}
