//! The JSON objects of the reports of relay and apply, as the command
//! line's `relay --json` and `apply --json` print them (CLI.md): written
//! once here, for the command line and for every binding that returns the
//! same report.
//!
//! Invariant: a listing may be bounded by its caller; the totals and
//! `truncated` say how much it left out.

use serde_json::{json, Value};

use crate::outcome::Drain;
use crate::relay::{Delivery, Refusal, RelayStop};

/// One flow's drain: `{"flow_id","producer","applied","stop","reason","detail"}`.
pub fn drain(d: &Drain) -> Value {
    json!({
        "flow_id": d.flow.flow_id.as_str(),
        "producer": d.flow.producer.as_str(),
        "applied": d.applied,
        "stop": d.stop.as_str(),
        "reason": d.stop.reason().map(|r| r.as_str()),
        "detail": d.stop.reason().and_then(|r| r.detail.as_deref()),
    })
}

/// The apply report: `{"flows","flows_total","truncated"}`, of the drains
/// `listed` out of `total`.
pub fn drains(listed: &[Drain], total: u64, truncated: bool) -> Value {
    let flows: Vec<Value> = listed.iter().map(drain).collect();
    json!({ "flows": flows, "flows_total": total, "truncated": truncated })
}

/// One delivery: `{"event_id","flow_id","seq","receipt"}`, and `cause` for
/// a conflict.
pub fn delivery(d: &Delivery) -> Value {
    let mut delivery = json!({
        "event_id": d.event_id.as_str(),
        "flow_id": d.flow_id.as_str(),
        "seq": d.seq.get(),
        "receipt": d.receipt.as_str(),
    });
    if let Some(cause) = d.receipt.cause() {
        delivery["cause"] = json!(cause);
    }
    delivery
}

/// One refusal: `{"event_id","flow_id","seq","reason","detail"}`.
pub fn refusal(r: &Refusal) -> Value {
    json!({
        "event_id": r.event_id.as_str(),
        "flow_id": r.flow_id.as_str(),
        "seq": r.seq.get(),
        "reason": r.reason.as_str(),
        "detail": r.message,
    })
}

/// The counts of a relay report beside its listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayTotals {
    /// Deliveries in all.
    pub deliveries: u64,
    /// Refusals in all.
    pub refused: u64,
    /// Whether a listing left some out.
    pub truncated: bool,
    /// Rounds that failed transiently.
    pub transient_errors: u64,
}

/// The relay report: `{"deliveries","deliveries_total","refused",
/// "refused_total","stop","transient_errors","truncated"}`.
pub fn relay(
    deliveries: &[Delivery],
    refusals: &[Refusal],
    stop: RelayStop,
    totals: RelayTotals,
) -> Value {
    let listed: Vec<Value> = deliveries.iter().map(delivery).collect();
    let refused: Vec<Value> = refusals.iter().map(refusal).collect();
    json!({
        "deliveries": listed,
        "stop": stop.as_str(),
        "deliveries_total": totals.deliveries,
        "truncated": totals.truncated,
        "refused": refused,
        "refused_total": totals.refused,
        "transient_errors": totals.transient_errors,
    })
}
