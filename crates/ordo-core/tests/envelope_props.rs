//! Property tests of the envelope codec (`ordo_core::envelope`).
//!
//! Valid envelopes are generated with every field at and between its bounds
//! (identifiers of 1 to 100 characters of `[A-Za-z0-9_-]`, seq and schema
//! version in `1..=i64::MAX` with a bias towards 1, 2^53 and `i64::MAX`, an
//! event type of 1 to 100 bytes of any text, a payload that is any JSON
//! object of bounded depth and size) and the properties below are checked:
//!
//! - round trips: the stored text and `to_value` parse back to an equal
//!   envelope; the canonical body parses back to the same body hash (or, for
//!   a seq or schema version that the double rounds past `i64::MAX`, is
//!   refused on exactly that field); canonicalization is idempotent;
//! - the body ignores key order (at every level), whitespace, string escapes
//!   and the spelling of payload numbers (`5`, `5.0`, `5e0`, `50e-1`, ...);
//! - changing one field or one payload value changes the body hash;
//! - malformed input is refused with the expected error and never panics:
//!   arbitrary bytes, arbitrary JSON, and valid envelope text with one
//!   mutation whose outcome is known.
//!
//! Each property runs 256 cases (a few seconds in all); failures are shrunk
//! and printed, no regression file is written.

use std::fmt::Write as _;

use ordo_core::envelope::{canonical_json, parse_strict_json, BodyHash, FIELDS, OPTIONAL_FIELDS};
use ordo_core::{Envelope, EventId, EventType, FlowId, MalformedEnvelope, SchemaVersion, Seq};
use proptest::prelude::*;
use serde_json::{Map, Number, Value};

/// Every integer of magnitude at most 2^53 is exactly a double.
const EXACT: i64 = 1 << 53;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------

/// Characters that need or allow an escape, and some that do not (control
/// characters, quote, backslash, solidus, DEL, a non-ASCII letter, the JS line
/// separators, a BOM, a character outside the BMP).
const ESCAPE_HEAVY: &str =
    "[\\x00-\\x1f\"\\\\/\\x7f\u{80}\u{e9}\u{2028}\u{2029}\u{feff}\u{1f600}a-c]";

fn identifier() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => "[A-Za-z0-9_-]",
        1 => "[A-Za-z0-9_-]{100}",
        6 => "[A-Za-z0-9_-]{1,100}",
    ]
}

/// An integer in `1..=i64::MAX`, often at a bound or around 2^53.
fn positive() -> impl Strategy<Value = i64> {
    prop_oneof![
        1 => Just(1i64),
        1 => Just(i64::MAX),
        2 => 1..=16i64,
        2 => (i64::MAX - 1024)..=i64::MAX,
        2 => (EXACT - 4)..=(EXACT + 4),
        4 => 1..=i64::MAX,
    ]
}

fn truncate_to_bytes(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// An event type: 1 to 100 bytes of any text.
fn event_type() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "(?s).{1,100}",
        2 => proptest::string::string_regex(&format!("{ESCAPE_HEAVY}{{1,40}}")).unwrap(),
        1 => "[a-z.]{1,20}",
        1 => "[a-z]{100}",
        1 => Just("\u{e9}".repeat(50)),
        1 => Just("\u{1f600}".repeat(25)),
    ]
    .prop_map(|text| truncate_to_bytes(text, 100))
    .prop_filter("an event type is not empty", |text| !text.is_empty())
}

fn json_string() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => "(?s).{0,12}",
        2 => proptest::string::string_regex(&format!("{ESCAPE_HEAVY}{{0,12}}")).unwrap(),
        1 => "[a-z]{0,6}",
    ]
}

fn json_number() -> impl Strategy<Value = Number> {
    let bounds = prop_oneof![
        Just(i64::MIN),
        Just(i64::MAX),
        Just(-EXACT),
        Just(EXACT),
        Just(EXACT + 1),
        Just(-EXACT - 1),
    ];
    let floats = prop_oneof![
        Just(0.0f64),
        Just(-0.0),
        Just(0.1),
        Just(5e-324),
        Just(f64::MIN_POSITIVE),
        Just(f64::MAX),
        Just(f64::MIN),
        Just(1e21),
        Just(1e-7),
        Just(123_456_789.125),
        Just(9_007_199_254_740_993.0),
    ];
    prop_oneof![
        2 => (-1000i64..=1000).prop_map(Number::from),
        2 => any::<i64>().prop_map(Number::from),
        1 => any::<u64>().prop_map(Number::from),
        1 => bounds.prop_map(Number::from),
        1 => Just(Number::from(u64::MAX)),
        3 => any::<f64>().prop_filter_map("finite", Number::from_f64),
        1 => floats.prop_filter_map("finite", Number::from_f64),
    ]
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        json_number().prop_map(Value::Number),
        json_string().prop_map(Value::String),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(json_string(), inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn payload() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(json_string(), json_value(), 0..6)
        .prop_map(|map| map.into_iter().collect())
}

fn envelope() -> impl Strategy<Value = Envelope> {
    (
        identifier(),
        identifier(),
        positive(),
        positive(),
        event_type(),
        payload(),
        (producer(), headers()),
    )
        .prop_map(
            |(event_id, flow_id, seq, schema_version, event_type, payload, (producer, headers))| {
                Envelope {
                    event_id: EventId::new(event_id).unwrap(),
                    flow_id: FlowId::new(flow_id).unwrap(),
                    seq: Seq::new(seq).unwrap(),
                    schema_version: SchemaVersion::new(schema_version).unwrap(),
                    event_type: EventType::new(event_type).unwrap(),
                    payload,
                    producer,
                    headers,
                }
            },
        )
}

/// The default producer (never written out) or a named one.
fn producer() -> impl Strategy<Value = ordo_core::ProducerName> {
    prop_oneof![
        2 => Just(ordo_core::ProducerName::default()),
        1 => "[a-z][a-z0-9_-]{0,20}".prop_filter_map("not the default", |name| {
            ordo_core::ProducerName::new(name).ok().filter(|n| !n.is_default())
        }),
    ]
}

/// No headers (never written out) or a few, with values of any text.
fn headers() -> impl Strategy<Value = ordo_core::envelope::Headers> {
    prop::collection::btree_map("[a-z0-9-]{1,16}", json_string(), 0..4)
}

// ---------------------------------------------------------------------------
// A JSON writer with random key order, whitespace, escapes and number spelling
// ---------------------------------------------------------------------------

/// SplitMix64: a tiny deterministic generator driven by a proptest seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

/// Writes JSON text for a value. Object keys always come in a random
/// permutation (at every level); optionally with random whitespace between
/// tokens, random (valid) escapes in strings and keys, and every payload
/// integer of magnitude below 2^53 spelled as a random equal number.
struct Writer {
    rng: Rng,
    spaces: bool,
    escapes: bool,
    respell_integers: bool,
}

/// Spellings of an integer `n` with `|n| < 2^53` that denote the same double.
fn spellings(n: i64) -> Vec<String> {
    vec![
        format!("{n}"),
        format!("{n}.0"),
        format!("{n}e0"),
        format!("{n}.000"),
        format!("{n}E+0"),
        format!("{n}.0e-0"),
        format!("{}e-1", n * 10),
        format!("{}E-2", n * 100),
    ]
}

impl Writer {
    fn new(seed: u64) -> Writer {
        Writer {
            rng: Rng(seed),
            spaces: false,
            escapes: false,
            respell_integers: false,
        }
    }

    fn space(&mut self, out: &mut String) {
        if self.spaces {
            out.push_str([" ", "", "\n", "\t", "\r\n  "][self.rng.below(5)]);
        }
    }

    fn string(&mut self, text: &str, out: &mut String) {
        out.push('"');
        for c in text.chars() {
            let escape = self.escapes && self.rng.one_in(3);
            let upper = self.rng.one_in(2);
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\u{8}' if !escape => out.push_str("\\b"),
                '\u{c}' if !escape => out.push_str("\\f"),
                '\n' if !escape => out.push_str("\\n"),
                '\r' if !escape => out.push_str("\\r"),
                '\t' if !escape => out.push_str("\\t"),
                '/' if escape && upper => out.push_str("\\/"),
                c if escape || u32::from(c) < 0x20 => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        if upper {
                            write!(out, "\\u{unit:04X}").unwrap();
                        } else {
                            write!(out, "\\u{unit:04x}").unwrap();
                        }
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }

    fn number(&mut self, n: &Number, respell: bool, out: &mut String) {
        match n.as_i64() {
            Some(i) if respell && i.unsigned_abs() < EXACT.unsigned_abs() => {
                let all = spellings(i);
                out.push_str(&all[self.rng.below(all.len())]);
            }
            _ => out.push_str(&n.to_string()),
        }
    }

    fn value(&mut self, value: &Value, respell: bool, out: &mut String) {
        self.space(out);
        match value {
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Number(n) => self.number(n, respell, out),
            Value::String(s) => self.string(s, out),
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.value(item, respell, out);
                }
                self.space(out);
                out.push(']');
            }
            Value::Object(map) => self.object(map, |_| respell, out),
        }
        self.space(out);
    }

    fn object(
        &mut self,
        map: &Map<String, Value>,
        respell: impl Fn(&str) -> bool,
        out: &mut String,
    ) {
        let mut entries: Vec<(&String, &Value)> = map.iter().collect();
        // Fisher-Yates shuffle.
        for i in (1..entries.len()).rev() {
            let j = self.rng.below(i + 1);
            entries.swap(i, j);
        }
        out.push('{');
        for (i, (key, value)) in entries.into_iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            self.space(out);
            self.string(key, out);
            self.space(out);
            out.push(':');
            self.value(value, respell(key), out);
        }
        self.space(out);
        out.push('}');
    }

    /// Writes an envelope's JSON object; only numbers inside `payload` are
    /// respelled (seq and schema_version must stay integers).
    fn envelope(mut self, value: &Value) -> String {
        let mut out = String::new();
        self.space(&mut out);
        let respell = self.respell_integers;
        self.object(
            value.as_object().expect("an envelope is an object"),
            |key| respell && key == "payload",
            &mut out,
        );
        self.space(&mut out);
        out
    }
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Whether the double nearest to `n` is past `i64::MAX` (2^63): the canonical
/// body then writes a number that no longer fits a seq or schema version.
fn rounds_past_i64(n: i64) -> bool {
    n as f64 >= 9_223_372_036_854_775_808.0
}

/// Whether a byte is JSON whitespace (RFC 8259: space, tab, LF, CR).
fn is_json_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// One step of a path into a JSON value.
#[derive(Debug, Clone)]
enum Step {
    Index(usize),
    Key(String),
}

/// The paths (as indices into arrays or keys into objects) of every value
/// inside `value`, `value` itself included as the empty path.
fn paths(value: &Value, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(prefix.clone());
    match value {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                prefix.push(Step::Index(i));
                paths(item, prefix, out);
                prefix.pop();
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                prefix.push(Step::Key(key.clone()));
                paths(item, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn at_mut<'v>(mut value: &'v mut Value, path: &[Step]) -> &'v mut Value {
    for step in path {
        value = match step {
            Step::Index(i) => &mut value[*i],
            Step::Key(key) => value.get_mut(key).expect("the path exists"),
        };
    }
    value
}

/// A key spelled with its first character as a `\u` escape (the same key
/// once decoded).
fn escaped_key(key: &str) -> String {
    let mut chars = key.chars();
    let Some(first) = chars.next() else {
        return "\"\"".to_owned();
    };
    let mut out = String::from("\"");
    let mut units = [0u16; 2];
    for unit in first.encode_utf16(&mut units) {
        write!(out, "\\u{unit:04x}").unwrap();
    }
    let rest = serde_json::to_string(chars.as_str()).unwrap();
    out.push_str(&rest[1..]);
    out
}

/// Asserts what every successfully parsed envelope satisfies.
fn check_consistent(env: &Envelope) -> Result<(), TestCaseError> {
    prop_assert_eq!(&Envelope::parse_str(&env.stored_text()).unwrap(), env);
    prop_assert_eq!(hash_of(env), env.body_hash());
    Ok(())
}

/// The documented definition of the body hash: the canonical body, then the
/// exact seq and schema version.
fn hash_of(env: &Envelope) -> BodyHash {
    BodyHash::of(&format!(
        "{}\n{}\n{}",
        env.body(),
        env.seq,
        env.schema_version
    ))
}

// ---------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    /// The stored text and `to_value` give back an equal envelope.
    #[test]
    fn stored_text_and_value_round_trip(env in envelope()) {
        let stored = env.stored_text();
        prop_assert_eq!(&Envelope::parse_str(&stored).unwrap(), &env);
        prop_assert_eq!(&Envelope::from_stored(&stored).unwrap(), &env);
        prop_assert_eq!(&Envelope::parse(stored.as_bytes()).unwrap(), &env);
        prop_assert_eq!(&Envelope::parse_str(&env.to_value().to_string()).unwrap(), &env);
        prop_assert_eq!(Envelope::from_value(env.to_value()).unwrap(), env);
    }

    /// The canonical body is canonical JSON (idempotent) and parses back to an
    /// envelope with the same body (and hash, up to 2^53), unless the double of seq or schema version
    /// is 2^63, which no seq or schema version can hold: then exactly that
    /// field is refused.
    #[test]
    fn canonical_body_parses_back_to_the_same_hash(env in envelope()) {
        let body = env.body();
        let hash = env.body_hash();
        prop_assert_eq!(hash.as_str().len(), 64);
        prop_assert!(hash.as_str().bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
        prop_assert_eq!(&hash_of(&env), &hash);
        prop_assert_eq!(&body, &canonical_json(&env.to_value()));

        let value = parse_strict_json(&body).expect("a canonical body is strict JSON");
        prop_assert_eq!(&canonical_json(&value), &body, "canonicalization is idempotent");

        let seq_out = rounds_past_i64(env.seq.get());
        let version_out = rounds_past_i64(env.schema_version.get());
        match Envelope::parse_str(&body) {
            Ok(again) => {
                prop_assert!(!seq_out && !version_out);
                prop_assert_eq!(&again.body(), &body);
                if env.seq.get() <= EXACT && env.schema_version.get() <= EXACT {
                    prop_assert_eq!(again.body_hash(), hash);
                }
                prop_assert_eq!(&again.event_id, &env.event_id);
                prop_assert_eq!(&again.flow_id, &env.flow_id);
                prop_assert_eq!(&again.event_type, &env.event_type);
                if env.seq.get() <= EXACT {
                    prop_assert_eq!(again.seq, env.seq);
                }
                if env.schema_version.get() <= EXACT {
                    prop_assert_eq!(again.schema_version, env.schema_version);
                }
            }
            Err(MalformedEnvelope::InvalidField { field, .. }) => {
                let expected = if seq_out { "seq" } else { "schema_version" };
                prop_assert!(seq_out || version_out, "refused {field} for {body}");
                prop_assert_eq!(field, expected);
            }
            Err(other) => prop_assert!(false, "canonical body refused: {other}: {body}"),
        }
    }
}

// ---------------------------------------------------------------------------
// Key order, whitespace, escapes and number spelling
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    /// Keys in a random order at every level (with, optionally, whitespace
    /// between tokens and escapes in strings) parse to an equal envelope with
    /// the same body and hash.
    #[test]
    fn key_order_whitespace_and_escapes_do_not_matter(
        env in envelope(),
        seed in any::<u64>(),
        spaces in any::<bool>(),
        escapes in any::<bool>(),
    ) {
        let text = Writer { spaces, escapes, ..Writer::new(seed) }.envelope(&env.to_value());
        let parsed = Envelope::parse_str(&text);
        prop_assert!(parsed.is_ok(), "{:?} for {}", parsed, text);
        let parsed = parsed.unwrap();
        prop_assert_eq!(parsed.body(), env.body());
        prop_assert_eq!(parsed.body_hash(), env.body_hash());
        prop_assert_eq!(parsed, env);
    }

    /// Every payload integer below 2^53 written as `N.0`, `Ne0`, `N.000`,
    /// `NE+0`, `(10N)e-1`, ... gives the same body and hash as `N`.
    #[test]
    fn integer_spelling_does_not_matter(
        env in envelope(),
        n in prop_oneof![
            Just(0i64),
            Just(EXACT - 1),
            Just(1 - EXACT),
            -1000i64..=1000,
            (1 - EXACT)..EXACT,
        ],
        key in json_string(),
        nested in any::<bool>(),
        seed in any::<u64>(),
        spelling in 0usize..8,
    ) {
        let mut env = env;
        let number = Value::Number(n.into());
        let inserted = if nested { serde_json::json!({ "deep": [number] }) } else { number };
        env.payload.insert(key.clone(), inserted.clone());

        // One chosen spelling of N, everything else plain.
        let mut plain = env.clone();
        plain.payload.remove(&key);
        let placeholder = "ORDO_SPELLING_PLACEHOLDER";
        plain.payload.insert(key.clone(), Value::String(placeholder.into()));
        let template = plain.stored_text();
        prop_assume!(template.matches(placeholder).count() == 1);
        let spelled = spellings(n)[spelling].clone();
        let spelled = if nested { format!("{{\"deep\":[{spelled}]}}") } else { spelled };
        let text = template.replace(&format!("\"{placeholder}\""), &spelled);
        let parsed = Envelope::parse_str(&text).unwrap();
        prop_assert_eq!(parsed.body(), env.body(), "{}", text);
        prop_assert_eq!(parsed.body_hash(), env.body_hash());

        // Every payload integer below 2^53 respelled at random.
        let writer = Writer { respell_integers: true, ..Writer::new(seed) };
        let text = writer.envelope(&env.to_value());
        let parsed = Envelope::parse_str(&text).unwrap();
        prop_assert_eq!(parsed.body(), env.body(), "{}", text);
        prop_assert_eq!(parsed.body_hash(), env.body_hash());
        prop_assert_eq!(parsed.seq, env.seq);
        prop_assert_eq!(parsed.schema_version, env.schema_version);
    }
}

// ---------------------------------------------------------------------------
// Distinct bodies
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    /// A different event id, flow id or type gives a different hash.
    #[test]
    fn a_changed_identifier_or_type_changes_the_hash(
        env in envelope(),
        field in 0usize..3,
        id in identifier(),
        event_type in event_type(),
    ) {
        let mut changed = env.clone();
        match field {
            0 => changed.event_id = EventId::new(id).unwrap(),
            1 => changed.flow_id = FlowId::new(id).unwrap(),
            _ => changed.event_type = EventType::new(event_type).unwrap(),
        }
        prop_assume!(changed != env);
        prop_assert_ne!(changed.body_hash(), env.body_hash());
    }

    /// A different seq or schema version always gives a different hash, also
    /// above 2^53 where the canonical body alone would round them together.
    #[test]
    fn a_changed_seq_or_schema_version_changes_the_hash(
        env in envelope(),
        seq_field in any::<bool>(),
        value in prop_oneof![
            positive(),
            (EXACT - 4)..=(EXACT + 4),
            (i64::MAX - 1024)..=i64::MAX,
        ],
        delta in -3i64..=3,
    ) {
        let mut changed = env.clone();
        let old = if seq_field { env.seq.get() } else { env.schema_version.get() };
        // Either an unrelated value or a close neighbour of the old one.
        let new = match old.checked_add(delta) {
            _ if delta == 0 => value,
            Some(new) if new >= 1 => new,
            _ => old - delta,
        };
        prop_assume!(new != old);
        if seq_field {
            changed.seq = Seq::new(new).unwrap();
        } else {
            changed.schema_version = SchemaVersion::new(new).unwrap();
        }
        prop_assert_ne!(changed.body_hash(), env.body_hash());
    }

    /// Changing one payload value (wrapping it in an array, replacing it with a
    /// canonically different value, removing or adding a key) changes the hash.
    #[test]
    fn a_changed_payload_value_changes_the_hash(
        env in envelope(),
        pick in any::<prop::sample::Index>(),
        mode in 0usize..4,
        replacement in json_value(),
        new_key in json_string(),
    ) {
        let mut payload = Value::Object(env.payload.clone());
        let mut all = Vec::new();
        paths(&payload, &mut Vec::new(), &mut all);
        let path = pick.get(&all).clone();
        // The payload itself must stay an object: only a key is added to it.
        let mode = if path.is_empty() { 2 } else { mode };
        let target = at_mut(&mut payload, &path);
        match mode {
            0 => {
                let old = target.take();
                *target = Value::Array(vec![old]);
            }
            1 => {
                prop_assume!(canonical_json(target) != canonical_json(&replacement));
                *target = replacement;
            }
            2 => match target {
                Value::Object(map) => {
                    let mut key = new_key;
                    while map.contains_key(&key) {
                        key.push('+');
                    }
                    map.insert(key, replacement);
                }
                Value::Array(items) => items.push(replacement),
                // A leaf: wrap it instead.
                leaf => {
                    let old = leaf.take();
                    *leaf = Value::Array(vec![old]);
                }
            },
            _ => match path.split_last() {
                Some((Step::Key(key), parent)) => {
                    let key = key.clone();
                    let parent = at_mut(&mut payload, parent);
                    parent.as_object_mut().unwrap().remove(&key);
                }
                Some((Step::Index(i), parent)) => {
                    let i = *i;
                    let parent = at_mut(&mut payload, parent);
                    parent.as_array_mut().unwrap().remove(i);
                }
                None => prop_assume!(false),
            },
        }
        let mut changed = env.clone();
        changed.payload = match payload {
            Value::Object(map) => map,
            _ => unreachable!("the payload stays an object"),
        };
        prop_assert_ne!(changed.body_hash(), env.body_hash());
    }
}

// ---------------------------------------------------------------------------
// Malformed input
// ---------------------------------------------------------------------------

/// One change to a valid envelope's text whose outcome is known.
#[derive(Debug, Clone)]
enum Mutation {
    /// Remove one of the six fields: `MissingField`.
    Delete(usize),
    /// Repeat a top-level field (plain or `\u`-escaped key, same or other
    /// value): `NotJson`.
    DuplicateTop {
        field: usize,
        escaped: bool,
        value: Value,
    },
    /// Repeat a key in an object inside the payload: `NotJson`.
    DuplicateInPayload {
        pick: prop::sample::Index,
        key: prop::sample::Index,
        escaped: bool,
        value: Value,
    },
    /// Replace a field's value by one of the wrong type or out of its rule:
    /// `InvalidField`.
    WrongValue { field: usize, raw: usize },
    /// Add a field the protocol does not define: `UnknownField`.
    Unknown(String, Value),
    /// Append bytes: valid only when they are all JSON whitespace.
    Append(Vec<u8>),
    /// Cut the text short: never valid.
    Truncate(prop::sample::Index),
    /// Put the envelope in an array or a string: `NotAnObject`.
    Wrap(bool),
    /// Replace the payload by another object: still valid.
    NewPayload(Map<String, Value>),
}

/// Wrong values per field (raw JSON), each refused by that field's rule.
fn wrong_values(field: &str) -> Vec<String> {
    let long_id = format!("\"{}\"", "a".repeat(101));
    let long_type = format!("\"{}\"", "\u{1f600}".repeat(26));
    let strings: Vec<String> = match field {
        "event_id" | "flow_id" => vec![
            "7".into(),
            "true".into(),
            "null".into(),
            "[]".into(),
            "{}".into(),
            "\"\"".into(),
            "\"a b\"".into(),
            "\"a.b\"".into(),
            "\"\\u00e9\"".into(),
            "\"a\\n\"".into(),
            long_id,
        ],
        "seq" | "schema_version" => vec![
            "0".into(),
            "-1".into(),
            "1.0".into(),
            "1e0".into(),
            "1.5".into(),
            "\"1\"".into(),
            "9223372036854775808".into(),
            "18446744073709551615".into(),
            "-9223372036854775808".into(),
            "1e300".into(),
            "null".into(),
            "false".into(),
            "[1]".into(),
            "{}".into(),
        ],
        "type" => vec![
            "7".into(),
            "null".into(),
            "[]".into(),
            "{}".into(),
            "false".into(),
            "\"\"".into(),
            long_type,
            format!("\"{}\"", "t".repeat(101)),
        ],
        _ => vec![
            "[]".into(),
            "null".into(),
            "\"{}\"".into(),
            "1".into(),
            "true".into(),
            "[{}]".into(),
        ],
    };
    strings
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let garbage = prop_oneof![
        prop::collection::vec(any::<u8>(), 1..8),
        prop::collection::vec(prop::sample::select(b" \t\n\r".to_vec()), 1..4),
        "(?s).{1,4}".prop_map(String::into_bytes),
        Just(b"{}".to_vec()),
        Just(b"}".to_vec()),
        Just(b",".to_vec()),
        Just(vec![0xff]),
        Just("\u{a0}".as_bytes().to_vec()),
    ];
    prop_oneof![
        (0usize..6).prop_map(Mutation::Delete),
        (0usize..6, any::<bool>(), json_leaf()).prop_map(|(field, escaped, value)| {
            Mutation::DuplicateTop {
                field,
                escaped,
                value,
            }
        }),
        (
            any::<prop::sample::Index>(),
            any::<prop::sample::Index>(),
            any::<bool>(),
            json_leaf()
        )
            .prop_map(|(pick, key, escaped, value)| Mutation::DuplicateInPayload {
                pick,
                key,
                escaped,
                value
            }),
        (0usize..6, 0usize..16).prop_map(|(field, raw)| Mutation::WrongValue { field, raw }),
        (json_string(), json_leaf())
            .prop_filter("not an envelope field", |(key, _)| {
                !FIELDS.contains(&key.as_str()) && !OPTIONAL_FIELDS.contains(&key.as_str())
            })
            .prop_map(|(key, value)| Mutation::Unknown(key, value)),
        garbage.prop_map(Mutation::Append),
        any::<prop::sample::Index>().prop_map(Mutation::Truncate),
        any::<bool>().prop_map(Mutation::Wrap),
        payload().prop_map(Mutation::NewPayload),
    ]
}

/// Writes `value` (an envelope object) with the entry
/// `"ORDO_PLACEHOLDER":null` of the object at `path` replaced by
/// `key_text:value_text`.
fn write_with_extra_entry(
    value: &Value,
    path: &[&str],
    steps: &[Step],
    key_text: &str,
    value_text: &str,
    seed: u64,
) -> Option<String> {
    const PLACEHOLDER: &str = "ORDO_PLACEHOLDER";
    let mut value = value.clone();
    let mut target = &mut value;
    for key in path {
        target = target.get_mut(*key).expect("the path exists");
    }
    let target = at_mut(target, steps);
    target
        .as_object_mut()
        .expect("the target is an object")
        .insert(PLACEHOLDER.into(), Value::Null);
    let text = Writer::new(seed).envelope(&value);
    let entry = format!("\"{PLACEHOLDER}\":null");
    (text.matches(&entry).count() == 1)
        .then(|| text.replace(&entry, &format!("{key_text}:{value_text}")))
}

proptest! {
    #![proptest_config(config())]

    /// Arbitrary bytes never panic the parser; whatever it accepts is a
    /// consistent envelope.
    #[test]
    fn arbitrary_bytes_are_refused_without_panic(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..256),
            "(?s).{0,64}".prop_map(String::into_bytes),
            r#"[{}\[\]",:0-9a-z_ .eE+\-\\]{0,96}"#.prop_map(String::into_bytes),
            r#"\{"(event_id|flow_id|seq|schema_version|type|payload)":[{}\[\]",:0-9a-z_ .\-]{0,64}"#
                .prop_map(String::into_bytes),
        ],
    ) {
        if let Ok(env) = Envelope::parse(&bytes) {
            check_consistent(&env)?;
        }
        if std::str::from_utf8(&bytes).is_err() {
            let refused = matches!(Envelope::parse(&bytes), Err(MalformedEnvelope::NotUtf8 { .. }));
            prop_assert!(refused);
        }
    }

    /// Arbitrary JSON is refused unless it is an object of exactly the six
    /// fields; a non-object is refused as such.
    #[test]
    fn arbitrary_json_is_refused_unless_an_envelope(value in json_value(), seed in any::<u64>()) {
        let text = match &value {
            Value::Object(_) => Writer::new(seed).envelope(&value),
            _ => value.to_string(),
        };
        match Envelope::parse_str(&text) {
            Ok(env) => {
                let map = value.as_object().unwrap();
                prop_assert_eq!(map.len(), 6);
                check_consistent(&env)?;
            }
            Err(MalformedEnvelope::NotAnObject { .. }) => prop_assert!(!value.is_object()),
            Err(MalformedEnvelope::NotJson { message }) => {
                prop_assert!(false, "generated JSON refused as not JSON: {message}: {text}");
            }
            Err(_) => prop_assert!(value.is_object()),
        }
    }

    /// One random byte of a valid envelope's text changed: never a panic;
    /// anything accepted is consistent.
    #[test]
    fn a_changed_byte_never_panics(
        env in envelope(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut bytes = env.stored_text().into_bytes();
        let at = at.index(bytes.len());
        bytes[at] = byte;
        if let Ok(parsed) = Envelope::parse(&bytes) {
            check_consistent(&parsed)?;
        }
    }

    /// One mutation of a valid envelope's text gives exactly the expected
    /// outcome.
    #[test]
    fn mutated_envelopes_give_the_expected_outcome(
        env in envelope(),
        mutation in mutation(),
        seed in any::<u64>(),
    ) {
        let value = env.to_value();
        let text = Writer::new(seed).envelope(&value);
        let object = |value: &Value| value.as_object().unwrap().clone();
        match mutation.clone() {
            Mutation::Delete(i) => {
                let mut map = object(&value);
                map.remove(FIELDS[i]);
                let text = Writer::new(seed).envelope(&Value::Object(map));
                prop_assert_eq!(
                    Envelope::parse_str(&text),
                    Err(MalformedEnvelope::MissingField { field: FIELDS[i] })
                );
            }
            Mutation::DuplicateTop { field, escaped, value: other } => {
                let key = FIELDS[field];
                let key_text = if escaped { escaped_key(key) } else { format!("\"{key}\"") };
                let value_text = if other.is_null() {
                    value[key].to_string()
                } else {
                    other.to_string()
                };
                let text = write_with_extra_entry(&value, &[], &[], &key_text, &value_text, seed);
                let text = text.expect("the placeholder is unique at top level");
                let result = Envelope::parse(text.as_bytes());
                let refused = matches!(
                    &result,
                    Err(MalformedEnvelope::NotJson { message }) if message.contains("repeated")
                );
                prop_assert!(refused, "{:?} for {}", result, text);
            }
            Mutation::DuplicateInPayload { pick, key, escaped, value: other } => {
                let payload = value["payload"].clone();
                let mut all = Vec::new();
                paths(&payload, &mut Vec::new(), &mut all);
                let objects: Vec<&Vec<Step>> = all
                    .iter()
                    .filter(|path| {
                        let mut v = &payload;
                        for step in path.iter() {
                            v = match step {
                                Step::Index(i) => &v[*i],
                                Step::Key(k) => &v[k.as_str()],
                            };
                        }
                        v.is_object()
                    })
                    .collect();
                let steps = pick.get(&objects);
                let mut base = value.clone();
                let target = at_mut(base.get_mut("payload").unwrap(), steps);
                let map = target.as_object_mut().unwrap();
                if map.is_empty() {
                    map.insert("k".into(), Value::Bool(true));
                }
                let keys: Vec<String> = map.keys().cloned().collect();
                let repeated = key.get(&keys).clone();
                let key_text = if escaped {
                    escaped_key(&repeated)
                } else {
                    serde_json::to_string(&repeated).unwrap()
                };
                let text = write_with_extra_entry(
                    &base,
                    &["payload"],
                    steps,
                    &key_text,
                    &other.to_string(),
                    seed,
                );
                prop_assume!(text.is_some());
                let text = text.unwrap();
                let result = Envelope::parse(text.as_bytes());
                let refused = matches!(
                    &result,
                    Err(MalformedEnvelope::NotJson { message }) if message.contains("repeated")
                );
                prop_assert!(refused, "{:?} for {}", result, text);
            }
            Mutation::WrongValue { field, raw } => {
                let key = FIELDS[field];
                let all = wrong_values(key);
                let raw = &all[raw % all.len()];
                let mut map = object(&value);
                map.insert(key.into(), serde_json::from_str(raw).unwrap());
                let text = Writer::new(seed).envelope(&Value::Object(map));
                let result = Envelope::parse_str(&text);
                let refused = matches!(
                    &result,
                    Err(MalformedEnvelope::InvalidField { field, .. }) if *field == key
                );
                prop_assert!(refused, "{:?} for {}", result, text);
            }
            Mutation::Unknown(key, extra) => {
                let mut map = object(&value);
                map.insert(key.clone(), extra);
                let text = Writer::new(seed).envelope(&Value::Object(map));
                prop_assert_eq!(
                    Envelope::parse_str(&text),
                    Err(MalformedEnvelope::UnknownField { field: key })
                );
            }
            Mutation::Append(garbage) => {
                let mut bytes = text.clone().into_bytes();
                bytes.extend_from_slice(&garbage);
                let result = Envelope::parse(&bytes);
                if garbage.iter().copied().all(is_json_space) {
                    prop_assert_eq!(result, Ok(env));
                } else {
                    prop_assert!(result.is_err(), "accepted {:?}", bytes);
                }
            }
            Mutation::Truncate(at) => {
                let bytes = text.as_bytes();
                let cut = &bytes[..at.index(bytes.len())];
                prop_assert!(Envelope::parse(cut).is_err());
            }
            Mutation::Wrap(in_array) => {
                let (wrapped, found) = if in_array {
                    (format!("[{text}]"), "an array")
                } else {
                    (serde_json::to_string(&text).unwrap(), "a string")
                };
                prop_assert_eq!(
                    Envelope::parse_str(&wrapped),
                    Err(MalformedEnvelope::NotAnObject { found })
                );
            }
            Mutation::NewPayload(payload) => {
                let mut map = object(&value);
                map.insert("payload".into(), Value::Object(payload.clone()));
                let text = Writer::new(seed).envelope(&Value::Object(map));
                let mut expected = env.clone();
                expected.payload = payload;
                prop_assert_eq!(Envelope::parse_str(&text), Ok(expected));
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Integers the canonical body would round
// ---------------------------------------------------------------------------

/// The canonical body writes seq and schema version as doubles (RFC 8785);
/// the body hash adds both exactly, so envelopes whose seq or schema version
/// differ only above 2^53 never share a hash.
#[test]
fn seq_and_schema_version_above_2_pow_53_have_distinct_hashes() {
    let text = |seq: i64, version: i64| {
        format!(
            r#"{{"event_id":"e","flow_id":"f","seq":{seq},"schema_version":{version},"type":"t","payload":{{}}}}"#
        )
    };
    let parse = |text: String| Envelope::parse_str(&text).unwrap();
    let base = parse(text(EXACT, EXACT));
    assert_ne!(base, parse(text(EXACT + 1, EXACT)));
    assert_ne!(base, parse(text(EXACT, EXACT + 1)));
    assert_ne!(
        base.body_hash(),
        parse(text(EXACT + 1, EXACT)).body_hash(),
        "seq 2^53 and 2^53 + 1 share a body"
    );
    assert_ne!(
        base.body_hash(),
        parse(text(EXACT, EXACT + 1)).body_hash(),
        "schema_version 2^53 and 2^53 + 1 share a body"
    );
    assert_ne!(
        parse(text(i64::MAX, 1)).body_hash(),
        parse(text(i64::MAX - 1, 1)).body_hash(),
        "seq i64::MAX and i64::MAX - 1 share a body"
    );
}

// ---------------------------------------------------------------------------
// The direct canonical writer against serde_jcs
// ---------------------------------------------------------------------------

/// JSON values whose numbers are all integers, around the 2^53 edge of the
/// direct writer among them, so that most cases take the direct path.
fn integer_json_value() -> impl Strategy<Value = Value> {
    let integer = prop_oneof![
        4 => (-1000i64..=1000).prop_map(Number::from),
        1 => (-EXACT..=EXACT).prop_map(Number::from),
        1 => prop_oneof![
            Just(EXACT),
            Just(-EXACT),
            Just(EXACT + 1),
            Just(-EXACT - 1),
            Just(i64::MAX),
            Just(i64::MIN),
        ]
        .prop_map(Number::from),
        1 => Just(Number::from(u64::MAX)),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        integer.prop_map(Value::Number),
        json_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(json_string(), inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(config())]

    /// `canonical_json` writes exactly what serde_jcs writes, for any value:
    /// directly when every number is an integer up to 2^53, through serde_jcs
    /// otherwise.
    #[test]
    fn canonical_json_is_serde_jcs(value in prop_oneof![json_value(), integer_json_value()]) {
        prop_assert_eq!(canonical_json(&value), serde_jcs::to_string(&value).unwrap());
    }

    /// The stored text is the compact JSON of `to_value`, key for key.
    #[test]
    fn stored_text_is_the_compact_value(env in envelope()) {
        prop_assert_eq!(env.stored_text(), env.to_value().to_string());
    }

    /// The same for whole envelopes, whose body is hashed.
    #[test]
    fn canonical_body_is_serde_jcs(env in envelope()) {
        prop_assert_eq!(env.body(), serde_jcs::to_string(&env.to_value()).unwrap());
    }
}

/// Keys are ordered by UTF-16 code units, not by UTF-8 bytes: U+1F600 (a
/// surrogate pair, 0xD83D first) sorts before U+FEFF, though its UTF-8 bytes
/// sort after.
#[test]
fn canonical_keys_follow_utf16_order() {
    let value: Value = serde_json::json!({"\u{feff}": 1, "\u{1f600}": 2, "a": 3});
    assert_eq!(
        canonical_json(&value),
        "{\"a\":3,\"\u{1f600}\":2,\"\u{feff}\":1}"
    );
    assert_eq!(
        canonical_json(&value),
        serde_jcs::to_string(&value).unwrap()
    );
}
