//! Expected states, written as the snapshot JSON of the CLI contract, and the
//! comparison that names every differing field.

use serde_json::{json, Map, Value};

/// An envelope as the producer commits it: event id `FLOW-SEQ`, schema 1.
pub fn event(flow: &str, seq: i64, event_type: &str, amount: i64) -> Value {
    envelope(
        &format!("{flow}-{seq}"),
        flow,
        seq,
        1,
        event_type,
        json!({ "amount": amount }),
    )
}

/// Any envelope.
pub fn envelope(
    event_id: &str,
    flow: &str,
    seq: i64,
    schema: i64,
    event_type: &str,
    payload: Value,
) -> Value {
    json!({
        "event_id": event_id,
        "flow_id": flow,
        "seq": seq,
        "schema_version": schema,
        "type": event_type,
        "payload": payload,
    })
}

fn with(envelope: &Value, extra: Value) -> Value {
    let mut object: Map<String, Value> = envelope.as_object().cloned().unwrap_or_default();
    if let Value::Object(extra) = extra {
        object.extend(extra);
    }
    Value::Object(object)
}

pub const STEPS: [&str; 3] = ["reserved", "confirmed", "released"];

/// `receive`'s receipt of `envelope` (of the default producer), as the
/// CLI contract prints it.
pub fn receipt(envelope: &Value, receipt: &str) -> Value {
    json!({
        "event_id": envelope["event_id"],
        "flow_id": envelope["flow_id"],
        "seq": envelope["seq"],
        "producer": "default",
        "receipt": receipt,
    })
}

/// `receive`'s `conflict` receipt of `envelope` of cause `conflict`, naming
/// the event the consumer holds in its place.
pub fn conflict(envelope: &Value, held_event_id: &str) -> Value {
    with(
        &receipt(envelope, "conflict"),
        json!({"cause": "conflict", "held_event_id": held_event_id}),
    )
}

/// The full expected state of both files, built row by row in the order the
/// snapshot lists them.
#[derive(Default, Clone)]
pub struct Expect {
    flows: Vec<Value>,
    outbox: Vec<Value>,
    inbox: Vec<Value>,
    projection: Vec<Value>,
    effects: Vec<Value>,
}

impl Expect {
    pub fn new() -> Expect {
        Expect::default()
    }

    pub fn flow(mut self, flow: &str, state: &str, quantity: i64, last_seq: i64) -> Expect {
        self.flows.push(
            json!({"flow_id": flow, "state": state, "quantity": quantity, "last_seq": last_seq}),
        );
        self
    }

    pub fn outbox(mut self, envelope: &Value, accepted: bool) -> Expect {
        self.outbox
            .push(with(envelope, json!({ "accepted": accepted })));
        self
    }

    pub fn inbox(mut self, envelope: &Value, status: &str, reason: Option<&str>) -> Expect {
        self.inbox.push(with(
            envelope,
            json!({"status": status, "reason": reason, "detail": null}),
        ));
        self
    }

    pub fn projection(
        mut self,
        flow: &str,
        state: &str,
        quantity: i64,
        applied_seq: i64,
    ) -> Expect {
        self.projection.push(
            json!({"flow_id": flow, "producer": "default", "state": state, "quantity": quantity,
            "applied_seq": applied_seq}),
        );
        self
    }

    pub fn effect(mut self, flow: &str, seq: i64, event_id: &str) -> Expect {
        self.effects.push(
            json!({"flow_id": flow, "producer": "default", "seq": seq, "event_id": event_id}),
        );
        self
    }

    /// A flow produced through `steps` of the three steps with `quantity`,
    /// every event accepted, received and applied.
    pub fn delivered_flow(self, flow: &str, quantity: i64, steps: usize) -> Expect {
        let mut expect = self.flow(flow, STEPS[steps - 1], quantity, steps as i64);
        for (i, step) in STEPS.iter().take(steps).enumerate() {
            expect = expect.outbox(&event(flow, i as i64 + 1, step, quantity), true);
        }
        expect.applied_flow(flow, quantity, steps)
    }

    /// The consumer side of a flow whose first `steps` events were received
    /// and applied.
    pub fn applied_flow(self, flow: &str, quantity: i64, steps: usize) -> Expect {
        let mut expect = self;
        for (i, step) in STEPS.iter().take(steps).enumerate() {
            expect = expect.inbox(&event(flow, i as i64 + 1, step, quantity), "applied", None);
        }
        expect = expect.projection(flow, STEPS[steps - 1], quantity, steps as i64);
        for seq in 1..=steps as i64 {
            expect = expect.effect(flow, seq, &format!("{flow}-{seq}"));
        }
        expect
    }

    pub fn build(self) -> Value {
        json!({
            "producer": {"flows": self.flows, "outbox": self.outbox},
            "consumer": {
                "inbox": self.inbox,
                "projection": self.projection,
                "effects": self.effects,
            }
        })
    }
}

/// Every path at which `observed` differs from `expected`, with both values.
pub fn differences(expected: &Value, observed: &Value) -> Vec<String> {
    let mut out = Vec::new();
    diff(expected, observed, "", &mut out);
    out
}

fn diff(expected: &Value, observed: &Value, path: &str, out: &mut Vec<String>) {
    match (expected, observed) {
        (Value::Object(e), Value::Object(o)) => {
            for (key, value) in e {
                let sub = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match o.get(key) {
                    Some(other) => diff(value, other, &sub, out),
                    None => out.push(format!("{sub}: expected {value}, observed nothing")),
                }
            }
            for (key, value) in o {
                if !e.contains_key(key) {
                    let sub = if path.is_empty() {
                        key.clone()
                    } else {
                        format!("{path}.{key}")
                    };
                    out.push(format!("{sub}: expected nothing, observed {value}"));
                }
            }
        }
        (Value::Array(e), Value::Array(o)) => {
            for (i, (a, b)) in e.iter().zip(o).enumerate() {
                diff(a, b, &format!("{path}[{i}]"), out);
            }
            if e.len() != o.len() {
                out.push(format!(
                    "{path}: expected {} rows, observed {}",
                    e.len(),
                    o.len()
                ));
            }
        }
        _ if expected == observed => {}
        _ => out.push(format!("{path}: expected {expected}, observed {observed}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_the_field() {
        let expected = json!({"a": {"b": [1, 2]}, "c": "x"});
        assert!(differences(&expected, &expected).is_empty());
        let observed = json!({"a": {"b": [1, 3, 4]}, "d": true});
        let found = differences(&expected, &observed);
        assert_eq!(
            found,
            vec![
                "a.b[1]: expected 2, observed 3".to_string(),
                "a.b: expected 2 rows, observed 3".to_string(),
                "c: expected \"x\", observed nothing".to_string(),
                "d: expected nothing, observed true".to_string(),
            ]
        );
    }
}
