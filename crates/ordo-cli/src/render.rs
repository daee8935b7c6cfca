//! The JSON shapes of the CLI contract.

use ordo_core::destination::Custody;
use ordo_core::ops::OutboxEntry;
use ordo_core::{
    Answer, BlockReason, Delivery, Drain, Envelope, EventId, Handover, InboxRecord, Refusal,
    RelayStop, StoreId,
};
#[allow(unused_imports)]
use ordo_reservation::{Advance, EffectRecord, FlowRecord, Projection};
use serde_json::{json, Map, Value};

/// The envelope fields plus extra keys.
/// " (reason)" after a stop or status that has a block reason, else nothing.
pub fn reason_suffix(reason: Option<&BlockReason>) -> String {
    reason.map(|r| format!(" ({r})")).unwrap_or_default()
}

/// A time stored as milliseconds since the Unix epoch, for the text
/// output: RFC 3339 in UTC with milliseconds (`2026-12-02T13:04:05.123Z`).
/// A time RFC 3339 cannot write (before 1970, after 9999) stays as the
/// number it is, `N ms`.
pub fn utc_ms(ms: i64) -> String {
    const YEAR_10000_MS: u64 = 253_402_300_800_000;
    match u64::try_from(ms) {
        Ok(since) if since < YEAR_10000_MS => {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(since);
            humantime::format_rfc3339_millis(at).to_string()
        }
        _ => format!("{ms} ms"),
    }
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

/// What a one-shot relay run did, bounded for printing.
#[derive(Default)]
pub struct RelayRun {
    pub deliveries: Bounded<Delivery>,
    pub refusals: Bounded<Refusal>,
    pub transient_errors: u64,
}

impl RelayRun {
    pub fn note(&mut self, handover: Handover<'_>) {
        match handover {
            Handover::Delivered(d) => self.deliveries.push(d.clone()),
            Handover::Refused(r) => self.refusals.push(r.clone()),
            Handover::Failed(_) => self.transient_errors += 1,
        }
    }
}

pub fn relay(run: &RelayRun, stop: RelayStop) -> Value {
    let totals = ordo_core::report::RelayTotals {
        deliveries: run.deliveries.total,
        refused: run.refusals.total,
        truncated: run.deliveries.truncated() || run.refusals.truncated(),
        transient_errors: run.transient_errors,
    };
    ordo_core::report::relay(&run.deliveries.listed, &run.refusals.listed, stop, totals)
}

pub fn drains(drains: &Bounded<Drain>) -> Value {
    ordo_core::report::drains(&drains.listed, drains.total, drains.truncated())
}

pub fn flow(record: &FlowRecord) -> Value {
    json!({
        "flow_id": record.flow_id.as_str(),
        "state": record.state.as_str(),
        "quantity": record.quantity.map(|q| q.get()),
        "last_seq": record.last_seq,
    })
}

/// A row of `snapshot`'s outbox: `accepted` when every destination of its
/// flow holds it, and each destination's own bookkeeping of it.
pub fn outbox(entry: &OutboxEntry) -> Value {
    envelope_with(
        &entry.envelope,
        json!({"accepted": entry.accepted, "destinations": destinations(entry)}),
    )
}

/// A row's `destinations`, as `outbox list` and `snapshot` print them: by
/// name, each destination its flow is delivered to.
pub fn destinations(entry: &OutboxEntry) -> Value {
    let by_name: Map<String, Value> = (entry.destinations.iter())
        .map(|c| (c.destination.to_string(), custody(c)))
        .collect();
    Value::Object(by_name)
}

/// One destination's bookkeeping of a row, under the keys of a row's own.
fn custody(c: &Custody) -> Value {
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

/// A row of `snapshot`'s inbox: the envelope, its status, its `producer`
/// (`default` for an envelope without one) and `store_id`, the delivering
/// producer store's identity (`null` when unknown).
pub fn inbox(record: &InboxRecord, store_id: Option<&StoreId>) -> Value {
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

/// One receipt of `receive`, with the keys of HTTP.md's: `event_id`,
/// `flow_id`, `seq`, `producer`, `receipt`, and for a conflict `cause` and
/// `held_event_id`.
pub fn receipt(envelope: &Envelope, answer: &Answer) -> Value {
    let mut value = json!({
        "event_id": envelope.event_id.as_str(),
        "flow_id": envelope.flow_id.as_str(),
        "seq": envelope.seq.get(),
        "producer": envelope.producer.as_str(),
        "receipt": answer.receipt.as_str(),
    });
    if let Some(cause) = answer.receipt.cause() {
        value["cause"] = json!(cause);
        value["held_event_id"] = json!(answer.held_event_id.as_ref().map(EventId::as_str));
    }
    value
}

/// A receipt's line of `receive`'s text: a conflict's with its cause and
/// the held event (`none` when only a prune watermark remains).
pub fn receipt_line(envelope: &Envelope, answer: &Answer) -> String {
    let producer = match envelope.producer.as_str() {
        "default" => String::new(),
        name => format!(" (producer {name})"),
    };
    let cause = answer.receipt.cause().map_or_else(String::new, |cause| {
        let held = answer
            .held_event_id
            .as_ref()
            .map_or("none", EventId::as_str);
        format!(" ({cause}, held {held})")
    });
    format!(
        "{} {} seq {}{producer}: {}{cause}",
        envelope.event_id, envelope.flow_id, envelope.seq, answer.receipt
    )
}

/// The most entries a list of the output holds (docs/CLI.md "Bounded output").
pub const LISTED_MAX: usize = 10_000;

/// The first [`LISTED_MAX`] items of a stream, and how many there were.
#[derive(Debug)]
pub struct Bounded<T> {
    pub listed: Vec<T>,
    pub total: u64,
}

impl<T> Default for Bounded<T> {
    fn default() -> Self {
        Bounded {
            listed: Vec::new(),
            total: 0,
        }
    }
}

impl<T> Bounded<T> {
    pub fn push(&mut self, item: T) {
        self.total += 1;
        if self.listed.len() < LISTED_MAX {
            self.listed.push(item);
        }
    }

    pub fn truncated(&self) -> bool {
        self.total > self.listed.len() as u64
    }

    /// The text line that says how many were left out, if any.
    pub fn more_line(&self) -> Option<String> {
        self.truncated().then(|| {
            format!(
                "... and {} more not listed",
                self.total - self.listed.len() as u64
            )
        })
    }
}

pub fn projection(record: &Projection) -> Value {
    json!({
        "flow_id": record.flow_id.as_str(),
        "producer": record.producer.as_str(),
        "state": record.state.as_str(),
        "quantity": record.quantity.map(|q| q.get()),
        "applied_seq": record.applied_seq,
    })
}

pub fn effect(record: &EffectRecord) -> Value {
    json!({
        "flow_id": record.flow_id.as_str(),
        "producer": record.producer.as_str(),
        "seq": record.seq.get(),
        "event_id": record.event_id.as_str(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_rfc3339_utc_with_milliseconds() {
        let cases = [
            (0, "1970-01-01T00:00:00.000Z"),
            (1, "1970-01-01T00:00:00.001Z"),
            (1_700_000_005_000, "2023-11-14T22:13:25.000Z"),
            (1_796_216_645_123, "2026-12-02T13:04:05.123Z"),
            (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
            // What RFC 3339 cannot write stays a number.
            (253_402_300_800_000, "253402300800000 ms"),
            (-1, "-1 ms"),
            (i64::MIN, "-9223372036854775808 ms"),
            (i64::MAX, "9223372036854775807 ms"),
        ];
        for (ms, text) in cases {
            assert_eq!(utc_ms(ms), text, "{ms}");
        }
    }
}
