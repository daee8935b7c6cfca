//! What a handler records: an intent's name, its frozen request, and the key
//! ordo derives for it (EFFECTS.md "The intent").

use crate::envelope::Envelope;
use crate::error::{ErrorKind, StoreError};
use crate::identity::StoreId;
use crate::ids::{FlowId, ProducerName, RuleViolation, Seq};

/// The most intents one event may record.
pub const INTENTS_PER_EVENT_MAX: usize = 8;

/// The largest request, in bytes of its JSON text.
pub const REQUEST_BYTES_MAX: usize = 256 * 1024;

/// The longest effect name, in characters.
pub const EFFECT_NAME_LEN_MAX: usize = 64;

/// `value` if it matches `[a-z][a-z0-9_]{0,63}`.
fn effect_name(value: String) -> Result<String, RuleViolation> {
    let mut chars = value.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase());
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if first_ok && rest_ok && value.len() <= EFFECT_NAME_LEN_MAX {
        return Ok(value);
    }
    Err(RuleViolation {
        rule: format!("an effect name must match [a-z][a-z0-9_]{{0,63}} (got {value:?})"),
    })
}

crate::ids::checked_string! {
    /// The name of an effect (`notify`, `webhook`, `capture_payment`):
    /// `[a-z][a-z0-9_]{0,63}`. An executor runs the intents of the names it
    /// was given code for.
    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub struct EffectName;
    /// Builds an effect name, refusing anything but `[a-z][a-z0-9_]{0,63}`.
    new: effect_name => RuleViolation;
}

/// `value` if it has the shape of a key: five parts separated by `/`, each a
/// valid store identity, producer name, flow id, seq and effect name.
fn effect_key(value: String) -> Result<String, RuleViolation> {
    let bad = |why: &str| RuleViolation {
        rule: format!("an effect key is STORE_ID/PRODUCER/FLOW_ID/SEQ/NAME ({why}; got {value:?})"),
    };
    let parts: Vec<&str> = value.split('/').collect();
    let [store, producer, flow, seq, name] = parts[..] else {
        return Err(bad("five parts"));
    };
    StoreId::new(store).map_err(|e| bad(&e.to_string()))?;
    ProducerName::new(producer).map_err(|e| bad(&e.rule))?;
    FlowId::new(flow).map_err(|e| bad(&format!("flow id {}", e.rule)))?;
    let seq: i64 = seq.parse().map_err(|_| bad("seq is not an integer"))?;
    Seq::new(seq).map_err(|e| bad(&format!("seq {}", e.rule)))?;
    EffectName::new(name).map_err(|e| bad(&e.rule))?;
    Ok(value)
}

crate::ids::checked_string! {
    /// An intent's idempotency key, derived by ordo and never chosen by the
    /// handler: `STORE_ID/PRODUCER/FLOW_ID/SEQ/NAME`, where STORE_ID is the
    /// consumer store's identity. No part can contain `/`.
    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub struct EffectKey;
    /// Checks `value` as a key (an operator's `--key`).
    new: effect_key => RuleViolation;
}

impl EffectKey {
    /// The key of the intent `name` of the event `(producer, flow_id, seq)`
    /// applied by the consumer store `store`.
    pub fn derive(
        store: &StoreId,
        producer: &ProducerName,
        flow_id: &FlowId,
        seq: Seq,
        name: &EffectName,
    ) -> EffectKey {
        let key = format!("{store}/{producer}/{flow_id}/{seq}/{name}");
        debug_assert!(effect_key(key.clone()).is_ok(), "a derived key is a key");
        EffectKey(key)
    }
}

/// An intent as a store writes it: recorded by the handler for one event,
/// in the event's apply transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// Its key.
    pub key: EffectKey,
    /// The effect's name.
    pub name: EffectName,
    /// The event's producer.
    pub producer: ProducerName,
    /// The event's flow.
    pub flow_id: FlowId,
    /// The event's seq.
    pub seq: Seq,
    /// The event's id.
    pub event_id: crate::ids::EventId,
    /// Its place among the event's intents (0 first): intents of a flow run
    /// in `(seq, position)` order.
    pub position: u32,
    /// The request, a JSON object's text, frozen under the key.
    pub request: String,
}

/// The intents a handler records during one apply call, checked as they
/// come: at most [`INTENTS_PER_EVENT_MAX`] per event, a name once per
/// event, a request that is a JSON object of at most
/// [`REQUEST_BYTES_MAX`] bytes. A refusal is returned to the handler AND
/// kept, so that the apply fails even when the handler drops the error.
#[derive(Debug)]
pub struct IntentRecorder {
    store_id: StoreId,
    intents: Vec<Intent>,
    refused: Option<String>,
}

impl IntentRecorder {
    /// A recorder for the consumer store `store_id`.
    pub fn new(store_id: StoreId) -> IntentRecorder {
        IntentRecorder {
            store_id,
            intents: Vec::new(),
            refused: None,
        }
    }

    /// Records the intent `name` with `request` for `event`.
    pub fn record(
        &mut self,
        event: &Envelope,
        name: &str,
        request: &(impl serde::Serialize + ?Sized),
    ) -> Result<EffectKey, StoreError> {
        let intent = self.intent(event, name, request).inspect_err(|e| {
            self.refused.get_or_insert_with(|| e.to_string());
        })?;
        let key = intent.key.clone();
        self.intents.push(intent);
        Ok(key)
    }

    fn intent(
        &self,
        event: &Envelope,
        name: &str,
        request: &(impl serde::Serialize + ?Sized),
    ) -> Result<Intent, StoreError> {
        let refuse = |why: String| {
            StoreError::new(
                ErrorKind::InvalidInput,
                format!(
                    "effect {name:?} of {} seq {}: {why}",
                    event.inbox_flow(),
                    event.seq
                ),
            )
        };
        let name = EffectName::new(name).map_err(|e| refuse(e.rule))?;
        let of_event: Vec<&Intent> = self.intents.iter().filter(|i| is_of(i, event)).collect();
        if of_event.iter().any(|i| i.name == name) {
            return Err(refuse("recorded twice for one event".into()));
        }
        if of_event.len() >= INTENTS_PER_EVENT_MAX {
            return Err(refuse(format!(
                "more than {INTENTS_PER_EVENT_MAX} intents for one event"
            )));
        }
        let request = request_text(request).map_err(refuse)?;
        Ok(Intent {
            key: EffectKey::derive(
                &self.store_id,
                &event.producer,
                &event.flow_id,
                event.seq,
                &name,
            ),
            name,
            producer: event.producer.clone(),
            flow_id: event.flow_id.clone(),
            seq: event.seq,
            event_id: event.event_id.clone(),
            position: of_event.len() as u32,
            request,
        })
    }

    /// The intents recorded for `events`, in recording order, or the first
    /// refusal: an apply with a refused intent fails whole. Intents of
    /// other events than `events` are a handler's error too.
    pub fn take(&mut self, events: &[Envelope]) -> Result<Vec<Intent>, StoreError> {
        if let Some(why) = self.refused.take() {
            self.intents.clear();
            return Err(StoreError::new(ErrorKind::InvalidInput, why));
        }
        let intents = std::mem::take(&mut self.intents);
        if let Some(stray) = intents.iter().find(|i| !events.iter().any(|e| is_of(i, e))) {
            return Err(StoreError::new(
                ErrorKind::InvalidInput,
                format!(
                    "effect {} names {} seq {}, which is not an event of this apply call",
                    stray.name, stray.flow_id, stray.seq
                ),
            ));
        }
        Ok(intents)
    }

    /// Keeps `why` as a refusal: the apply fails whole.
    pub fn refuse(&mut self, why: String) {
        self.refused.get_or_insert(why);
    }

    /// Forgets every intent recorded (the events blocked).
    pub fn discard(&mut self) {
        self.intents.clear();
        self.refused = None;
    }
}

fn is_of(intent: &Intent, event: &Envelope) -> bool {
    intent.seq == event.seq && intent.flow_id == event.flow_id && intent.producer == event.producer
}

/// The request's JSON text: an object of at most [`REQUEST_BYTES_MAX`]
/// bytes.
fn request_text(request: &(impl serde::Serialize + ?Sized)) -> Result<String, String> {
    let value = serde_json::to_value(request).map_err(|e| format!("request: {e}"))?;
    if !value.is_object() {
        return Err("the request must be a JSON object".into());
    }
    let text = value.to_string();
    if text.len() > REQUEST_BYTES_MAX {
        return Err(format!(
            "the request is {} bytes, more than {REQUEST_BYTES_MAX}",
            text.len()
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::EventType;
    use crate::ids::SchemaVersion;

    fn store() -> StoreId {
        StoreId::new("0123456789abcdef0123456789abcdef").unwrap()
    }

    fn event(flow: &str, seq: i64) -> Envelope {
        let flow_id = FlowId::new(flow).unwrap();
        let seq = Seq::new(seq).unwrap();
        Envelope {
            event_id: crate::ids::EventId::for_seq(&flow_id, seq),
            flow_id,
            seq,
            schema_version: SchemaVersion::V1,
            event_type: EventType::new("placed").unwrap(),
            payload: Default::default(),
            producer: ProducerName::new("orders").unwrap(),
            headers: Default::default(),
        }
    }

    #[test]
    fn names_and_keys_are_checked() {
        for good in ["a", "notify", "capture_payment2", &"a".repeat(64)] {
            assert!(EffectName::new(good).is_ok(), "{good}");
        }
        for bad in ["", "Notify", "1a", "a-b", "a/b", &"a".repeat(65)] {
            assert!(EffectName::new(bad).is_err(), "{bad}");
        }
        let name = EffectName::new("notify").unwrap();
        let e = event("o-1", 3);
        let key = EffectKey::derive(&store(), &e.producer, &e.flow_id, e.seq, &name);
        assert_eq!(
            key.as_str(),
            "0123456789abcdef0123456789abcdef/orders/o-1/3/notify"
        );
        assert_eq!(EffectKey::new(key.as_str()).unwrap(), key);
        let bad_keys = [
            "x/orders/o-1/3/notify",
            "0123456789abcdef0123456789abcdef/orders/o-1/0/notify",
            "0123456789abcdef0123456789abcdef/orders/o-1/3",
            "0123456789abcdef0123456789abcdef/orders/o-1/3/notify/x",
            "0123456789abcdef0123456789abcdef/Orders/o-1/3/notify",
        ];
        for bad in bad_keys {
            assert!(EffectKey::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_recorder_keeps_the_limits_and_remembers_a_refusal() {
        let (one, two) = (event("o-1", 1), event("o-1", 2));
        let mut recorder = IntentRecorder::new(store());
        let request = serde_json::json!({"to": "a@example.com"});
        recorder.record(&one, "notify", &request).unwrap();
        recorder.record(&two, "notify", &request).unwrap();
        let taken = recorder.take(&[one.clone(), two.clone()]).unwrap();
        assert_eq!(taken.len(), 2);
        assert_eq!((taken[0].position, taken[1].seq.get()), (0, 2));

        // The same name twice for one event: refused, and the take fails
        // even though the handler went on.
        recorder.record(&one, "notify", &request).unwrap();
        assert!(recorder.record(&one, "notify", &request).is_err());
        assert_eq!(
            recorder
                .take(std::slice::from_ref(&one))
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidInput
        );

        for n in 0..INTENTS_PER_EVENT_MAX {
            recorder.record(&one, &format!("e{n}"), &request).unwrap();
        }
        assert!(recorder.record(&one, "one_more", &request).is_err());
        recorder.discard();
        assert!(recorder
            .take(std::slice::from_ref(&one))
            .unwrap()
            .is_empty());

        for bad in [serde_json::json!([1]), serde_json::json!("text")] {
            assert!(recorder.record(&one, "notify", &bad).is_err());
            recorder.discard();
        }
        let big = serde_json::json!({"blob": "x".repeat(REQUEST_BYTES_MAX)});
        assert!(recorder.record(&one, "notify", &big).is_err());
        recorder.discard();

        recorder.record(&two, "notify", &request).unwrap();
        let stray = recorder.take(&[one]).unwrap_err();
        assert!(
            stray
                .to_string()
                .contains("not an event of this apply call"),
            "{stray}"
        );
    }
}
