//! What an append decides before a backend writes: the event a flow's next
//! append makes, from the flow's last seq and the caller's type and
//! payload.
//!
//! Invariant: no I/O; the backend reads the last seq under its own lock and
//! writes the outbox row.

use crate::envelope::{Envelope, EventType};
use crate::error::AppendError;
use crate::ids::{EventId, FlowId, SchemaVersion, Seq};

/// The next event of `flow_id`, whose last appended seq is `last_seq` (0
/// for a new flow): seq `last_seq + 1`, event id `FLOW-SEQ`. A type breaking
/// the envelope's rules, a payload that does not serialize to a JSON
/// object, or a flow at the last seq is refused.
pub fn next_event<T: serde::Serialize + ?Sized>(
    flow_id: &FlowId,
    last_seq: i64,
    event_type: &str,
    schema_version: SchemaVersion,
    payload: &T,
) -> Result<Envelope, AppendError> {
    let event_type =
        EventType::new(event_type).map_err(|e| AppendError::Invalid(format!("type {e}")))?;
    let payload = match serde_json::to_value(payload) {
        Ok(serde_json::Value::Object(map)) => map,
        Ok(other) => {
            return Err(AppendError::Invalid(format!(
                "the payload must serialize to a JSON object, not {}",
                json_kind(&other)
            )))
        }
        Err(e) => return Err(AppendError::Invalid(format!("payload: {e}"))),
    };
    let seq = Seq::after(last_seq).ok_or_else(|| AppendError::SeqExhausted {
        flow_id: flow_id.clone(),
    })?;
    let event = Envelope {
        event_id: EventId::for_seq(flow_id, seq),
        flow_id: flow_id.clone(),
        seq,
        schema_version,
        event_type,
        payload,
        producer: crate::ids::ProducerName::default(),
        headers: Default::default(),
    };
    debug_assert_eq!(
        event.seq.get(),
        last_seq + 1,
        "a flow's seqs are contiguous"
    );
    Ok(event)
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_next_event_follows_the_last_seq_or_is_refused() {
        let flow = FlowId::new("f").unwrap();
        let v1 = SchemaVersion::V1;
        let event = next_event(&flow, 4, "noted", v1, &json!({"a": 1})).unwrap();
        assert_eq!((event.seq.get(), event.event_id.as_str()), (5, "f-5"));
        let refused = [
            (next_event(&flow, 0, "", v1, &json!({})), "type"),
            (
                next_event(&flow, 0, "noted", v1, &json!([1])),
                "not an array",
            ),
            (next_event(&flow, 0, "noted", v1, &json!(null)), "not null"),
        ];
        for (outcome, part) in refused {
            let error = outcome.unwrap_err();
            assert!(matches!(error, AppendError::Invalid(_)), "{error}");
            assert!(error.to_string().contains(part), "{error} names {part}");
        }
        let last = next_event(&flow, i64::MAX, "noted", v1, &json!({})).unwrap_err();
        assert!(matches!(last, AppendError::SeqExhausted { .. }), "{last}");
    }
}
