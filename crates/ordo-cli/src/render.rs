//! The JSON shapes of the CLI contract.

use ordo_core::{BlockReason, Drain, Envelope, InboxRecord, OutboxRecord, RelayReport};
#[allow(unused_imports)]
use ordo_reservation::{Advance, EffectRecord, FlowRecord, Projection};
use serde_json::{json, Map, Value};

/// The envelope fields plus extra keys.
/// " (reason)" after a stop or status that has a block reason, else nothing.
pub fn reason_suffix(reason: Option<&BlockReason>) -> String {
    reason.map(|r| format!(" ({r})")).unwrap_or_default()
}

/// The envelope fields plus `extra`.
pub fn envelope_with(envelope: &Envelope, extra: Value) -> Value {
    let mut object: Map<String, Value> = match envelope.to_value() {
        Value::Object(object) => object,
        _ => unreachable!("an envelope is an object"),
    };
    if let Value::Object(extra) = extra {
        object.extend(extra);
    }
    Value::Object(object)
}

pub fn advance(outcome: &Advance) -> Value {
    match outcome {
        Advance::Committed(event) => json!({"outcome": "committed", "event": event.to_value()}),
        Advance::Stale { last_seq } => json!({"outcome": "stale", "last_seq": last_seq}),
        Advance::InvalidTransition { from, to } => {
            json!({"outcome": "invalid_transition", "from": from.as_str(), "to": to.as_str()})
        }
    }
}

pub fn relay(report: &RelayReport) -> Value {
    let deliveries: Vec<Value> = report
        .deliveries
        .iter()
        .map(|d| {
            json!({
                "event_id": d.event_id.as_str(),
                "flow_id": d.flow_id.as_str(),
                "seq": d.seq.get(),
                "receipt": d.receipt.as_str(),
            })
        })
        .collect();
    json!({"deliveries": deliveries, "stop": report.stop.as_str()})
}

pub fn drains(drains: &[Drain]) -> Value {
    let flows: Vec<Value> = drains
        .iter()
        .map(|d| {
            json!({
                "flow_id": d.flow_id.as_str(),
                "applied": d.applied,
                "stop": d.stop.as_str(),
                "reason": d.stop.reason().map(|r| r.as_str()),
            })
        })
        .collect();
    json!({ "flows": flows })
}

pub fn flow(record: &FlowRecord) -> Value {
    json!({
        "flow_id": record.flow_id.as_str(),
        "state": record.state.as_str(),
        "quantity": record.quantity.map(|q| q.get()),
        "last_seq": record.last_seq,
    })
}

pub fn outbox(record: &OutboxRecord) -> Value {
    envelope_with(&record.envelope, json!({"accepted": record.accepted}))
}

pub fn inbox(record: &InboxRecord) -> Value {
    envelope_with(
        &record.envelope,
        json!({
            "status": record.status.as_str(),
            "reason": record.status.reason().map(|r| r.as_str()),
        }),
    )
}

pub fn projection(record: &Projection) -> Value {
    json!({
        "flow_id": record.flow_id.as_str(),
        "state": record.state.as_str(),
        "quantity": record.quantity.map(|q| q.get()),
        "applied_seq": record.applied_seq,
    })
}

pub fn effect(record: &EffectRecord) -> Value {
    json!({
        "flow_id": record.flow_id.as_str(),
        "seq": record.seq.get(),
        "event_id": record.event_id.as_str(),
    })
}
