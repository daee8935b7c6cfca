//! The envelope: the wire format of one event, its strict parser, its canonical
//! body (RFC 8785, JSON Canonicalization Scheme) and the hash of that body.
//!
//! Parsing refuses every transport-shell error of the protocol (not JSON,
//! invalid UTF-8, NaN or Infinity, a key repeated within any object, not an
//! object, a missing, extra or wrongly typed field, a field breaking its rule).
//! Semantic questions (is the schema known, is the payload valid, is the step
//! legal) are left to apply.

use std::fmt;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};

use crate::ids::{EventId, FlowId, InboxFlow, ProducerName, RuleViolation, SchemaVersion, Seq};

mod stream;

pub use stream::{parse_stream, StreamError};

/// The longest event type, in bytes.
pub const EVENT_TYPE_LEN_MAX: usize = 100;

/// The six top-level fields of an envelope, in the protocol's order.
pub const FIELDS: [&str; 6] = [
    "event_id",
    "flow_id",
    "seq",
    "schema_version",
    "type",
    "payload",
];

/// The optional top-level fields of an envelope (PROTOCOL.md section 12):
/// `producer`, the name of the producer store that appended it, left out
/// for [`ProducerName::DEFAULT`]; `headers`, left out when there are none.
pub const OPTIONAL_FIELDS: [&str; 2] = ["producer", "headers"];

/// The most headers an envelope carries.
pub const HEADERS_MAX: usize = 32;

/// The longest header name, in bytes (`[a-z0-9-]`).
pub const HEADER_NAME_LEN_MAX: usize = 64;

/// The longest header value, in bytes.
pub const HEADER_VALUE_LEN_MAX: usize = 1_024;

/// An envelope's headers (PROTOCOL.md section 12): at most
/// [`HEADERS_MAX`] string values by name, for correlation ids and W3C
/// trace context; part of the body.
pub type Headers = std::collections::BTreeMap<String, String>;

/// One event as it travels from producer to consumer.
///
/// Every value of this type satisfies the envelope rules of the protocol; the
/// payload is any JSON object and is only interpreted at apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// The event's identity.
    pub event_id: EventId,
    /// The flow the event belongs to.
    pub flow_id: FlowId,
    /// The event's position in its flow.
    pub seq: Seq,
    /// How the payload is to be read.
    pub schema_version: SchemaVersion,
    /// The event type: non-empty, at most [`EVENT_TYPE_LEN_MAX`] bytes.
    pub event_type: EventType,
    /// The payload object, uninterpreted.
    pub payload: Map<String, Value>,
    /// The name of the producer store that appended it: its namespace in
    /// every inbox. The default name is never written out (an envelope
    /// without `producer` is the default producer's, and one that names
    /// `"default"` is malformed, so that one event has one body).
    pub producer: ProducerName,
    /// The event's headers, set at append ([`Headers`]); none is never
    /// written out (`"headers":{}` is malformed, as for `producer`).
    pub headers: Headers,
}

crate::ids::checked_string! {
    /// An event type: a non-empty string of at most [`EVENT_TYPE_LEN_MAX`] bytes.
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    pub struct EventType;
    /// Builds an event type, refusing an empty string or one longer than 100 bytes.
    new: event_type => RuleViolation;
}

/// `value` if it is a non-empty string of at most [`EVENT_TYPE_LEN_MAX`] bytes.
fn event_type(value: String) -> Result<String, RuleViolation> {
    if value.is_empty() || value.len() > EVENT_TYPE_LEN_MAX {
        return Err(RuleViolation {
            rule: format!(
                "must be a non-empty string of at most {EVENT_TYPE_LEN_MAX} bytes (got {} bytes)",
                value.len()
            ),
        });
    }
    Ok(value)
}

/// A transport-shell error: the input is not an envelope. Nothing is stored
/// for such an input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MalformedEnvelope {
    /// The bytes are not valid UTF-8.
    #[error("input is not valid UTF-8 (invalid byte at offset {offset})")]
    NotUtf8 {
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
    /// The text is not one JSON value (syntax error, NaN, Infinity, a number out
    /// of range, a repeated key, trailing data).
    #[error("not valid JSON: {message}")]
    NotJson {
        /// What the JSON reader reported.
        message: String,
    },
    /// The JSON value is not an object.
    #[error("an envelope must be a JSON object (got {found})")]
    NotAnObject {
        /// The kind of JSON value found.
        found: &'static str,
    },
    /// A required field is absent.
    #[error("field `{field}` is missing")]
    MissingField {
        /// The missing field.
        field: &'static str,
    },
    /// A field that the protocol does not define is present.
    #[error("field `{field}` is not an envelope field (allowed: event_id, flow_id, seq, schema_version, type, payload)")]
    UnknownField {
        /// The unexpected field name.
        field: String,
    },
    /// A field has the wrong JSON type or breaks its rule.
    #[error("field `{field}` {rule}")]
    InvalidField {
        /// The field.
        field: &'static str,
        /// The rule it broke.
        rule: String,
    },
}

impl MalformedEnvelope {
    fn invalid(field: &'static str, rule: impl Into<String>) -> Self {
        MalformedEnvelope::InvalidField {
            field,
            rule: rule.into(),
        }
    }
}

/// Parses one JSON value from text, refusing a key repeated within any object.
///
/// NaN, Infinity and numbers out of the range of a double are refused by the
/// JSON reader itself.
pub fn parse_strict_json(text: &str) -> Result<Value, MalformedEnvelope> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = StrictValue::deserialize(&mut de)
        .map(|v| v.0)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| MalformedEnvelope::NotJson {
            message: e.to_string(),
        })?;
    Ok(value)
}

/// A JSON value whose objects never repeat a key.
struct StrictValue(Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number is not finite"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(StrictValue(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format!("key {key:?} is repeated")));
            }
            let StrictValue(value) = map.next_value_seed(StrictSeed)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

struct StrictSeed;

impl<'de> DeserializeSeed<'de> for StrictSeed {
    type Value = StrictValue;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<StrictValue, D::Error> {
        StrictValue::deserialize(deserializer)
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn positive_i64(field: &'static str, value: &Value) -> Result<i64, MalformedEnvelope> {
    if let Some(i) = value.as_i64().filter(|i| *i >= 1) {
        return Ok(i);
    }
    let rule = format!("must be an integer in 1..={}", i64::MAX);
    match value {
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                return Err(MalformedEnvelope::invalid(
                    field,
                    format!("{rule} (got {i})"),
                ));
            }
            if n.is_u64() {
                return Err(MalformedEnvelope::invalid(
                    field,
                    format!("{rule} (got {n})"),
                ));
            }
            Err(MalformedEnvelope::invalid(
                field,
                format!("{rule} (got the non-integer number {n})"),
            ))
        }
        other => Err(MalformedEnvelope::invalid(
            field,
            format!("{rule} (got {})", kind_of(other)),
        )),
    }
}

fn string_field<'v>(field: &'static str, value: &'v Value) -> Result<&'v str, MalformedEnvelope> {
    value.as_str().ok_or_else(|| {
        MalformedEnvelope::invalid(field, format!("must be a string (got {})", kind_of(value)))
    })
}

impl Envelope {
    /// The inbox flow it belongs to: its flow id in its producer's namespace.
    pub fn inbox_flow(&self) -> InboxFlow {
        InboxFlow::new(self.producer.clone(), self.flow_id.clone())
    }

    /// Whether it belongs to the inbox flow `flow`.
    pub fn is_of(&self, flow: &InboxFlow) -> bool {
        self.flow_id == flow.flow_id && self.producer == flow.producer
    }

    /// The payload decoded into the application's type, without copying it
    /// (`T` may borrow strings from it). A handler maps the error to a block
    /// reason of its own: the payload is checked at apply, not at receive.
    pub fn payload_as<'a, T: serde::Deserialize<'a>>(&'a self) -> Result<T, serde_json::Error> {
        T::deserialize(&self.payload)
    }

    /// Parses an envelope from raw bytes, refusing every transport-shell error.
    pub fn parse(bytes: &[u8]) -> Result<Envelope, MalformedEnvelope> {
        let text = std::str::from_utf8(bytes).map_err(|e| MalformedEnvelope::NotUtf8 {
            offset: e.valid_up_to(),
        })?;
        Envelope::parse_str(text)
    }

    /// Parses an envelope from text, refusing every transport-shell error.
    pub fn parse_str(text: &str) -> Result<Envelope, MalformedEnvelope> {
        Envelope::from_value(parse_strict_json(text)?)
    }

    /// Parses text that [`Envelope::stored_text`] wrote (a stored outbox or
    /// inbox body), with every field rule checked and no key repeated, as
    /// [`Envelope::parse_str`] does, but read straight into the fields
    /// without building the top-level object first. Meant for text this
    /// library stored: an error means a damaged file, and its message is the
    /// JSON reader's.
    pub fn from_stored(text: &str) -> Result<Envelope, MalformedEnvelope> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Stored {
            event_id: String,
            flow_id: String,
            payload: StrictValue,
            schema_version: i64,
            seq: i64,
            #[serde(rename = "type")]
            event_type: String,
            // Present (null included) or left out: a null is no name.
            #[serde(default, deserialize_with = "present")]
            producer: Option<Value>,
            #[serde(default, deserialize_with = "present")]
            headers: Option<Value>,
        }
        // serde's reader of a struct also takes an array of its fields in
        // order; an envelope is only ever an object.
        if !text.trim_start().starts_with('{') {
            return Err(match parse_strict_json(text) {
                Ok(value) => MalformedEnvelope::NotAnObject {
                    found: kind_of(&value),
                },
                Err(e) => e,
            });
        }
        let stored: Stored =
            serde_json::from_str(text).map_err(|e| MalformedEnvelope::NotJson {
                message: e.to_string(),
            })?;
        let payload = match stored.payload.0 {
            Value::Object(payload) => payload,
            other => {
                return Err(MalformedEnvelope::invalid(
                    "payload",
                    format!("must be a JSON object (got {})", kind_of(&other)),
                ))
            }
        };
        Ok(Envelope {
            event_id: EventId::new(stored.event_id)
                .map_err(|e| MalformedEnvelope::invalid("event_id", e.rule))?,
            flow_id: FlowId::new(stored.flow_id)
                .map_err(|e| MalformedEnvelope::invalid("flow_id", e.rule))?,
            seq: Seq::new(stored.seq).map_err(|e| MalformedEnvelope::invalid("seq", e.rule))?,
            schema_version: SchemaVersion::new(stored.schema_version)
                .map_err(|e| MalformedEnvelope::invalid("schema_version", e.rule))?,
            event_type: EventType::new(stored.event_type)
                .map_err(|e| MalformedEnvelope::invalid("type", e.rule))?,
            payload,
            producer: producer_field(stored.producer.as_ref())?,
            headers: headers_field(stored.headers.as_ref())?,
        })
    }

    /// Builds an envelope from a JSON value that was parsed with
    /// [`parse_strict_json`] (no repeated keys), checking every field rule.
    pub fn from_value(value: Value) -> Result<Envelope, MalformedEnvelope> {
        let mut object = match value {
            Value::Object(object) => object,
            other => {
                return Err(MalformedEnvelope::NotAnObject {
                    found: kind_of(&other),
                })
            }
        };
        let known = |k: &str| FIELDS.contains(&k) || OPTIONAL_FIELDS.contains(&k);
        if let Some(extra) = object.keys().find(|k| !known(k.as_str())) {
            return Err(MalformedEnvelope::UnknownField {
                field: extra.clone(),
            });
        }
        for field in FIELDS {
            if !object.contains_key(field) {
                return Err(MalformedEnvelope::MissingField { field });
            }
        }
        let event_id = EventId::new(string_field("event_id", &object["event_id"])?)
            .map_err(|e| MalformedEnvelope::invalid("event_id", e.rule))?;
        let flow_id = FlowId::new(string_field("flow_id", &object["flow_id"])?)
            .map_err(|e| MalformedEnvelope::invalid("flow_id", e.rule))?;
        let seq = Seq::new(positive_i64("seq", &object["seq"])?)
            .map_err(|e| MalformedEnvelope::invalid("seq", e.rule))?;
        let schema_version =
            SchemaVersion::new(positive_i64("schema_version", &object["schema_version"])?)
                .map_err(|e| MalformedEnvelope::invalid("schema_version", e.rule))?;
        let event_type = EventType::new(string_field("type", &object["type"])?)
            .map_err(|e| MalformedEnvelope::invalid("type", e.rule))?;
        let payload = match object.remove("payload") {
            Some(Value::Object(payload)) => payload,
            Some(other) => {
                return Err(MalformedEnvelope::invalid(
                    "payload",
                    format!("must be a JSON object (got {})", kind_of(&other)),
                ))
            }
            None => return Err(MalformedEnvelope::MissingField { field: "payload" }),
        };
        let producer = producer_field(object.get("producer"))?;
        let headers = headers_field(object.get("headers"))?;
        Ok(Envelope {
            event_id,
            flow_id,
            seq,
            schema_version,
            event_type,
            payload,
            producer,
            headers,
        })
    }

    /// The envelope as a JSON object: the six protocol fields, and
    /// `producer` unless it is the default.
    pub fn to_value(&self) -> Value {
        let mut object = Map::new();
        object.insert("event_id".into(), self.event_id.as_str().into());
        object.insert("flow_id".into(), self.flow_id.as_str().into());
        object.insert("seq".into(), self.seq.get().into());
        object.insert("schema_version".into(), self.schema_version.get().into());
        object.insert("type".into(), self.event_type.as_str().into());
        object.insert("payload".into(), Value::Object(self.payload.clone()));
        if let Some(producer) = self.written_producer() {
            object.insert("producer".into(), producer.into());
        }
        if !self.headers.is_empty() {
            let headers = self
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().into()));
            object.insert("headers".into(), Value::Object(headers.collect()));
        }
        Value::Object(object)
    }

    /// The envelope as it is stored: compact JSON of [`Envelope::to_value`],
    /// integers in the i64/u64 range written exactly, other numbers as the
    /// shortest double. Parsing it gives back an equal envelope.
    pub fn stored_text(&self) -> String {
        serde_json::to_string(&self.stored()).expect("an envelope always serializes")
    }

    /// Appends [`Envelope::stored_text`] to `out`, as UTF-8: for a caller
    /// that writes many envelopes through one reused buffer.
    pub fn write_stored_text(&self, out: &mut Vec<u8>) {
        serde_json::to_writer(out, &self.stored()).expect("an envelope always serializes");
    }

    /// The fields as they are stored.
    fn stored(&self) -> StoredFields<'_> {
        StoredFields {
            event_id: self.event_id.as_str(),
            flow_id: self.flow_id.as_str(),
            headers: (!self.headers.is_empty()).then_some(&self.headers),
            payload: &self.payload,
            producer: self.written_producer(),
            schema_version: self.schema_version.get(),
            seq: self.seq.get(),
            event_type: self.event_type.as_str(),
        }
    }

    /// The producer's name as the body writes it: `None` for the default.
    fn written_producer(&self) -> Option<&str> {
        (!self.producer.is_default()).then(|| self.producer.as_str())
    }

    /// The canonical body: the RFC 8785 serialization of [`Envelope::to_value`].
    /// It is what duplicate and conflict decisions compare (through
    /// [`Envelope::body_hash`]); as RFC 8785 writes every number as a double,
    /// it is never what is stored.
    /// Key order and the spelling of numbers (`5` or `5.0`) do not change it.
    pub fn body(&self) -> String {
        canonical_json(&self.to_value())
    }

    /// The SHA-256 of [`Envelope::body`] followed by the exact decimal seq and
    /// schema version, as 64 lowercase hex characters. Two envelopes have the
    /// same hash exactly when they have the same body and the same seq and
    /// schema version (up to SHA-256 collisions): RFC 8785 writes numbers as
    /// doubles, which would merge two seqs or versions above 2^53.
    pub fn body_hash(&self) -> BodyHash {
        let mut text = Vec::with_capacity(512);
        if !self.write_body(&mut text) {
            text = self.body().into_bytes();
        }
        write_decimal(b'\n', self.seq.get(), &mut text);
        write_decimal(b'\n', self.schema_version.get(), &mut text);
        BodyHash::of_parts(&[&text])
    }

    /// Writes [`Envelope::body`] into `out` field by field, without building
    /// the JSON tree (and copying the payload) first; returns false, with
    /// `out` unfinished, where [`canonical_json`] would need `serde_jcs`.
    /// The keys in RFC 8785's order: ASCII names sort by their bytes.
    fn write_body(&self, out: &mut Vec<u8>) -> bool {
        let number = |value: i64, out: &mut Vec<u8>| {
            value.unsigned_abs() <= CANONICAL_INTEGER_MAX && {
                write_decimal(b':', value, out);
                true
            }
        };
        out.extend_from_slice(b"{\"event_id\":");
        write_string(self.event_id.as_str(), out);
        out.extend_from_slice(b",\"flow_id\":");
        write_string(self.flow_id.as_str(), out);
        if !self.headers.is_empty() {
            out.extend_from_slice(b",\"headers\":{");
            let mut names: Vec<&String> = self.headers.keys().collect();
            names.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            for (i, name) in names.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(name, out);
                out.push(b':');
                write_string(&self.headers[name], out);
            }
            out.push(b'}');
        }
        out.extend_from_slice(b",\"payload\":");
        if !write_object(&self.payload, out) {
            return false;
        }
        if let Some(producer) = self.written_producer() {
            out.extend_from_slice(b",\"producer\":");
            write_string(producer, out);
        }
        out.extend_from_slice(b",\"schema_version\"");
        if !number(self.schema_version.get(), out) {
            return false;
        }
        out.extend_from_slice(b",\"seq\"");
        if !number(self.seq.get(), out) {
            return false;
        }
        out.extend_from_slice(b",\"type\":");
        write_string(self.event_type.as_str(), out);
        out.push(b'}');
        true
    }
}

/// An envelope's fields as [`Envelope::stored_text`] writes them, without
/// building the JSON tree first: in the order of `to_value`'s keys (a
/// sorted map), so the text is exactly `to_value().to_string()` (a property
/// test holds it).
#[derive(serde::Serialize)]
struct StoredFields<'e> {
    event_id: &'e str,
    flow_id: &'e str,
    #[serde(skip_serializing_if = "Option::is_none")]
    headers: Option<&'e Headers>,
    payload: &'e Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    producer: Option<&'e str>,
    schema_version: i64,
    seq: i64,
    #[serde(rename = "type")]
    event_type: &'e str,
}

/// The optional `headers` field: absent, none; present, an object of at
/// most [`HEADERS_MAX`] string values ([`check_headers`]), not empty.
fn headers_field(value: Option<&Value>) -> Result<Headers, MalformedEnvelope> {
    let Some(value) = value else {
        return Ok(Headers::new());
    };
    let Value::Object(object) = value else {
        let found = kind_of(value);
        return Err(MalformedEnvelope::invalid(
            "headers",
            format!("must be a JSON object (got {found})"),
        ));
    };
    let mut headers = Headers::new();
    for (name, value) in object {
        let Value::String(text) = value else {
            let found = kind_of(value);
            return Err(MalformedEnvelope::invalid(
                "headers",
                format!("header {name:?} must be a string (got {found})"),
            ));
        };
        headers.insert(name.clone(), text.clone());
    }
    if headers.is_empty() {
        return Err(MalformedEnvelope::invalid(
            "headers",
            "must be left out when there are none (`{}` is never written)",
        ));
    }
    check_headers(&headers).map_err(|rule| MalformedEnvelope::invalid("headers", rule))?;
    Ok(headers)
}

/// The rules of an envelope's headers, the same at append and on the
/// wire: at most [`HEADERS_MAX`], names `[a-z0-9-]{1,64}`, values at most
/// [`HEADER_VALUE_LEN_MAX`] bytes. The rule broken, otherwise.
pub fn check_headers(headers: &Headers) -> Result<(), String> {
    if headers.len() > HEADERS_MAX {
        return Err(format!(
            "at most {HEADERS_MAX} headers (got {})",
            headers.len()
        ));
    }
    for (name, value) in headers {
        let name_ok = (1..=HEADER_NAME_LEN_MAX).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !name_ok {
            return Err(format!(
                "a header name must match [a-z0-9-]{{1,64}} (got {name:?})"
            ));
        }
        if value.len() > HEADER_VALUE_LEN_MAX {
            return Err(format!(
                "header {name:?} is {} bytes, at most {HEADER_VALUE_LEN_MAX}",
                value.len()
            ));
        }
    }
    Ok(())
}

/// A field that is present, whatever its value (serde reads a null
/// `Option` as absent).
fn present<'de, D: serde::Deserializer<'de>>(reader: D) -> Result<Option<Value>, D::Error> {
    <Value as serde::Deserialize>::deserialize(reader).map(Some)
}

/// The optional `producer` field: absent, the default producer; present, a
/// producer name other than the default (naming the default is malformed:
/// one event has one body).
fn producer_field(value: Option<&Value>) -> Result<ProducerName, MalformedEnvelope> {
    let Some(value) = value else {
        return Ok(ProducerName::default());
    };
    let name = ProducerName::new(string_field("producer", value)?)
        .map_err(|e| MalformedEnvelope::invalid("producer", e.rule))?;
    if name.is_default() {
        return Err(MalformedEnvelope::invalid(
            "producer",
            "must be left out for the default producer (\"default\" is never written)",
        ));
    }
    Ok(name)
}

/// The RFC 8785 canonical serialization of a JSON value.
///
/// Values whose numbers are all integers of magnitude at most 2^53 (every
/// envelope ordo writes) are written directly: such an integer is exactly a
/// double, and its ECMAScript spelling is its decimal spelling. Any other
/// number (a float, a larger integer) needs ECMAScript number formatting, and
/// then the whole value goes through `serde_jcs`. A property test holds both
/// paths to the same output.
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::with_capacity(256);
    if write_canonical(value, &mut out) {
        return String::from_utf8(out).expect("canonical JSON is written from UTF-8 pieces");
    }
    // Serializing a `serde_json::Value` cannot fail: every map key is a string
    // and every number is finite.
    serde_jcs::to_string(value).expect("a JSON value always has a canonical form")
}

/// The largest integer magnitude written directly by [`canonical_json`].
const CANONICAL_INTEGER_MAX: u64 = 1 << 53;

/// Writes the canonical form of `value` into `out`; returns false, with `out`
/// unfinished, at the first number it leaves to `serde_jcs`.
fn write_canonical(value: &Value, out: &mut Vec<u8>) -> bool {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => {
            let exact = match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => u <= CANONICAL_INTEGER_MAX,
                (None, Some(i)) => i.unsigned_abs() <= CANONICAL_INTEGER_MAX,
                (None, None) => false,
            };
            if !exact {
                return false;
            }
            // An integer's decimal spelling, written without a String.
            use std::io::Write;
            write!(out, "{n}").expect("writing into memory cannot fail");
        }
        // RFC 8785 escapes strings as ECMAScript's JSON.stringify does, which
        // is serde_json's escaping: `"`, `\\`, \b \t \n \f \r, the other
        // control characters as lowercase \u00xx, everything else literal.
        Value::String(text) => write_string(text, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                if !write_canonical(item, out) {
                    return false;
                }
            }
            out.push(b']');
        }
        Value::Object(map) => return write_object(map, out),
    }
    true
}

/// Writes the canonical form of the object `map` into `out`, as
/// [`write_canonical`] does.
fn write_object(map: &Map<String, Value>, out: &mut Vec<u8>) -> bool {
    if utf16_ordered(map) {
        return write_entries(map.iter(), out);
    }
    // Keys in the order of their UTF-16 code units, as RFC 8785 asks.
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    entries.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
    write_entries(entries.into_iter(), out)
}

/// Writes an object of `entries`, in their order, as [`write_canonical`]
/// does.
fn write_entries<'a>(
    entries: impl Iterator<Item = (&'a String, &'a Value)>,
    out: &mut Vec<u8>,
) -> bool {
    out.push(b'{');
    for (i, (key, item)) in entries.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(key, out);
        out.push(b':');
        if !write_canonical(item, out) {
            return false;
        }
    }
    out.push(b'}');
    true
}

/// Whether `map` iterates its keys in the order of their UTF-16 code
/// units already, so that they need no sorting: in increasing byte order,
/// none with a character from U+E000 up (a lead byte from 0xEE), the only
/// characters whose UTF-16 order differs from their UTF-8 byte order.
fn utf16_ordered(map: &Map<String, Value>) -> bool {
    let plain = |key: &str| key.bytes().all(|b| b < 0xEE);
    let mut keys = map.keys();
    let Some(mut previous) = keys.next() else {
        return true;
    };
    if !plain(previous) {
        return false;
    }
    for key in keys {
        if !plain(key) || key.as_bytes() <= previous.as_bytes() {
            return false;
        }
        previous = key;
    }
    true
}

/// Writes `separator`, then `value` in decimal, without a String.
fn write_decimal(separator: u8, value: i64, out: &mut Vec<u8>) {
    use std::io::Write;
    out.push(separator);
    write!(out, "{value}").expect("writing into memory cannot fail");
}

fn write_string(text: &str, out: &mut Vec<u8>) {
    serde_json::to_writer(&mut *out, text).expect("writing a string into memory cannot fail");
}

/// The SHA-256 of a canonical body, as lowercase hex.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BodyHash(String);

impl BodyHash {
    /// Hashes a canonical body.
    pub fn of(body: &str) -> BodyHash {
        BodyHash::of_parts(&[body.as_bytes()])
    }

    /// Hashes the concatenation of `parts`.
    fn of_parts(parts: &[&[u8]]) -> BodyHash {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update(part);
        }
        let digest = hasher.finalize();
        let mut hex = String::with_capacity(64);
        for byte in digest.iter() {
            hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
            hex.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
        }
        BodyHash(hex)
    }

    /// Accepts a stored hash (64 lowercase hex characters).
    pub fn from_hex(hex: &str) -> Result<BodyHash, RuleViolation> {
        if hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            Ok(BodyHash(hex.to_owned()))
        } else {
            Err(RuleViolation {
                rule: "must be 64 lowercase hex characters".into(),
            })
        }
    }

    /// The hash as hex text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BodyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"event_id":"e-1","flow_id":"f","seq":1,"schema_version":1,"type":"placed","payload":{"total":5}}"#;

    /// GOOD with `producer` set to `value` (a JSON text).
    fn with_producer(value: &str) -> String {
        GOOD.replacen('{', &format!(r#"{{"producer":{value},"#), 1)
    }

    /// GOOD with `headers` set to `value` (a JSON text).
    fn with_headers(value: &str) -> String {
        GOOD.replacen('{', &format!(r#"{{"headers":{value},"#), 1)
    }

    #[test]
    fn headers_are_optional_strings_within_their_limits() {
        let plain = Envelope::parse_str(GOOD).unwrap();
        assert!(plain.headers.is_empty());
        assert!(!plain.stored_text().contains("headers"));
        let traced =
            Envelope::parse_str(&with_headers(r#"{"traceparent":"00-ab-cd-01","x-id":"7"}"#))
                .unwrap();
        assert_eq!(traced.headers["traceparent"], "00-ab-cd-01");
        let stored = traced.stored_text();
        assert_eq!(Envelope::from_stored(&stored).unwrap(), traced);
        assert_eq!(traced.to_value().to_string(), stored);
        assert_ne!(traced.body_hash(), plain.body_hash());
        let many: Vec<String> = (0..=HEADERS_MAX)
            .map(|i| format!(r#""h{i}":"v""#))
            .collect();
        let long = format!(r#"{{"a":"{}"}}"#, "x".repeat(HEADER_VALUE_LEN_MAX + 1));
        let longest = format!(r#"{{"a":"{}"}}"#, "x".repeat(HEADER_VALUE_LEN_MAX));
        assert!(Envelope::parse_str(&with_headers(&longest)).is_ok());
        for (value, words) in [
            ("{}".to_string(), "must be left out when there are none"),
            (r#"{"a":1}"#.into(), "must be a string"),
            (r#"{"a":null}"#.into(), "must be a string"),
            ("[]".into(), "must be a JSON object"),
            ("null".into(), "must be a JSON object"),
            (r#"{"A":"v"}"#.into(), "a header name must match"),
            (r#"{"":"v"}"#.into(), "a header name must match"),
            (format!("{{{}}}", many.join(",")), "at most 32 headers"),
            (long, "at most 1024"),
        ] {
            let text = with_headers(&value);
            let refused = Envelope::parse_str(&text).unwrap_err().to_string();
            assert!(refused.contains(words), "{value}: {refused}");
            assert!(
                Envelope::from_stored(&text).is_err(),
                "{value} read from a stored body"
            );
        }
    }

    #[test]
    fn the_producer_is_optional_and_never_written_as_the_default() {
        let default = Envelope::parse_str(GOOD).unwrap();
        assert!(default.producer.is_default());
        assert!(!default.stored_text().contains("producer"));
        let named = Envelope::parse_str(&with_producer(r#""orders""#)).unwrap();
        assert_eq!(named.producer.as_str(), "orders");
        let stored = named.stored_text();
        assert!(stored.contains(r#""producer":"orders""#), "{stored}");
        assert_eq!(Envelope::from_stored(&stored).unwrap(), named);
        assert_eq!(Envelope::parse_str(&stored).unwrap(), named);
        assert_eq!(named.to_value().to_string(), stored);
        assert_ne!(named.body_hash(), default.body_hash());
        for (value, words) in [
            (r#""default""#, "must be left out for the default producer"),
            (r#""Orders""#, "a producer name must match"),
            ("7", "must be a string"),
            ("null", "must be a string"),
        ] {
            let text = with_producer(value);
            let refused = Envelope::parse_str(&text).unwrap_err().to_string();
            assert!(refused.contains(words), "{value}: {refused}");
            let stored = Envelope::from_stored(&text);
            assert!(stored.is_err(), "{value} read from a stored body");
        }
    }

    fn replace(field: &str, raw: &str) -> String {
        let mut value: Value = serde_json::from_str(GOOD).unwrap();
        let object = value.as_object_mut().unwrap();
        let parsed: Value = serde_json::from_str(raw).unwrap();
        object.insert(field.into(), parsed);
        value.to_string()
    }

    #[test]
    fn good_envelope_parses() {
        let env = Envelope::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(env.event_id.as_str(), "e-1");
        assert_eq!(env.seq.get(), 1);
        assert_eq!(env.payload["total"], 5);
    }

    #[test]
    fn malformed_envelopes_are_refused_with_the_field_named() {
        let long_id = format!("\"{}\"", "a".repeat(101));
        let long_type = format!("\"{}\"", "t".repeat(101));
        let mut cases: Vec<(String, &str)> = vec![
            ("not json".into(), "not valid JSON"),
            ("[1,2]".into(), "must be a JSON object"),
            (
                r#"["e-1","f",{"total":5},1,1,"reserved"]"#.into(),
                "must be a JSON object",
            ),
            ("\"text\"".into(), "must be a JSON object"),
            ("".into(), "not valid JSON"),
            (format!("{GOOD} {{}}"), "not valid JSON"),
            (GOOD.replace("\"seq\":1", "\"seq\":NaN"), "not valid JSON"),
            (
                GOOD.replace("\"seq\":1", "\"seq\":Infinity"),
                "not valid JSON",
            ),
            (
                GOOD.replace("{\"total\":5}", "{\"total\":1e400}"),
                "not valid JSON",
            ),
            (GOOD.replace("\"seq\":1", "\"seq\":1,\"seq\":1"), "repeated"),
            (
                GOOD.replace("{\"total\":5}", "{\"total\":5,\"total\":6}"),
                "repeated",
            ),
            (GOOD.replace(",\"seq\":1", ""), "`seq` is missing"),
            (
                GOOD.replace(",\"payload\":{\"total\":5}", ""),
                "`payload` is missing",
            ),
            (
                GOOD.replace("\"seq\":1", "\"seq\":1,\"extra\":true"),
                "`extra` is not an envelope field",
            ),
        ];
        // Each field given each of these values, and the words of its refusal.
        let bad_fields: [(&str, &[&str], &str); 8] = [
            (
                "seq",
                &[
                    "0",
                    "-3",
                    "1.0",
                    "1.5",
                    "\"1\"",
                    "9223372036854775808",
                    "null",
                ],
                "`seq` must be an integer",
            ),
            (
                "schema_version",
                &["0", "\"1\""],
                "`schema_version` must be an integer",
            ),
            (
                "event_id",
                &["\"\"", &long_id, "\"a b\""],
                "`event_id` must be 1 to 100",
            ),
            ("event_id", &["7"], "`event_id` must be a string"),
            (
                "flow_id",
                &["\"flow.1\"", "\"fl\\u00f6w\""],
                "`flow_id` must be 1 to 100",
            ),
            (
                "type",
                &["\"\"", &long_type],
                "`type` must be a non-empty string",
            ),
            ("type", &["[]"], "`type` must be a string"),
            (
                "payload",
                &["[]", "null"],
                "`payload` must be a JSON object",
            ),
        ];
        for (field, values, expected) in bad_fields {
            cases.extend(values.iter().map(|value| (replace(field, value), expected)));
        }
        for (input, expected) in &cases {
            let err = Envelope::parse(input.as_bytes()).expect_err(input);
            let message = err.to_string();
            assert!(
                message.contains(expected),
                "input {input}: message {message:?} lacks {expected:?}"
            );
            // The reader of stored bodies refuses every one of them too,
            // with the JSON reader's words for the shape errors.
            assert!(
                Envelope::from_stored(input).is_err(),
                "from_stored took {input}"
            );
        }
        assert_eq!(
            Envelope::from_stored(GOOD).unwrap(),
            Envelope::parse_str(GOOD).unwrap()
        );
    }

    #[test]
    fn invalid_utf8_is_refused() {
        let mut bytes = GOOD.as_bytes().to_vec();
        bytes[20] = 0xff;
        assert!(matches!(
            Envelope::parse(&bytes),
            Err(MalformedEnvelope::NotUtf8 { offset: 20 })
        ));
    }

    #[test]
    fn bounds_of_seq_and_ids() {
        let max = replace("seq", &i64::MAX.to_string());
        assert_eq!(Envelope::parse_str(&max).unwrap().seq.get(), i64::MAX);
        let id100 = replace("flow_id", &format!("\"{}\"", "f".repeat(100)));
        assert!(Envelope::parse_str(&id100).is_ok());
        let type100 = replace("type", &format!("\"{}\"", "t".repeat(100)));
        assert!(Envelope::parse_str(&type100).is_ok());
    }

    #[test]
    fn stored_text_keeps_large_integers_exact() {
        let max = replace("seq", &i64::MAX.to_string());
        let max = max.replace("{\"total\":5}", "{\"total\":9007199254740993}");
        let env = Envelope::parse_str(&max).unwrap();
        let again = Envelope::parse_str(&env.stored_text()).unwrap();
        assert_eq!(again, env);
        assert_eq!(again.seq.get(), i64::MAX);
        assert_eq!(again.payload["total"].as_u64(), Some(9_007_199_254_740_993));
        assert_eq!(again.body_hash(), env.body_hash());
    }

    #[test]
    fn stored_text_written_into_a_buffer_is_appended_and_the_same() {
        let env = Envelope::parse_str(&with_headers("{\"a\":\"1\"}")).unwrap();
        let mut out = b"kept".to_vec();
        env.write_stored_text(&mut out);
        assert_eq!(&out[..4], b"kept");
        assert_eq!(std::str::from_utf8(&out[4..]).unwrap(), env.stored_text());
    }

    #[test]
    fn body_ignores_key_order_and_number_spelling() {
        let a = Envelope::parse_str(GOOD).unwrap();
        let b = Envelope::parse_str(
            r#"{"payload":{"total":5.0},"type":"placed","schema_version":1,"seq":1,"flow_id":"f","event_id":"e-1"}"#,
        )
        .unwrap();
        assert_eq!(a.body(), b.body());
        assert_eq!(a.body_hash(), b.body_hash());
        assert_eq!(
            a.body(),
            r#"{"event_id":"e-1","flow_id":"f","payload":{"total":5},"schema_version":1,"seq":1,"type":"placed"}"#
        );
        let c = Envelope::parse_str(&GOOD.replace("5}", "6}")).unwrap();
        assert_ne!(a.body_hash(), c.body_hash());
    }
    #[test]
    fn payload_decodes_into_the_applications_type_or_says_why_not() {
        #[derive(Debug, PartialEq, serde::Deserialize)]
        struct Placed<'a> {
            total: i64,
            #[serde(borrow)]
            note: Option<&'a str>,
        }
        let env = Envelope::parse_str(
            r#"{"event_id":"e-1","flow_id":"f","seq":1,"schema_version":1,"type":"placed","payload":{"total":5,"note":"gift"}}"#,
        )
        .unwrap();
        assert_eq!(
            env.payload_as::<Placed>().unwrap(),
            Placed {
                total: 5,
                note: Some("gift")
            }
        );
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Wrong {
            total: String,
        }
        let error = env.payload_as::<Wrong>().unwrap_err();
        assert!(error.to_string().contains("invalid type"), "{error}");
    }
}
