//! W3C trace context (PROTOCOL.md section 12): an event's `traceparent`
//! header, parsed, and the span fields that carry it.
//!
//! An event carries its trace context as the header `traceparent`
//! (`VERSION-TRACEID-PARENTID-FLAGS`, W3C Trace Context). A well-formed
//! value is recorded as the field `traceparent` of the spans of the relay,
//! the inbox and the applier, one span per event where events differ; an
//! ill-formed one stays in the body and is ignored for tracing. With the
//! `otel` feature, an append without an explicit `traceparent` takes the
//! current OpenTelemetry context's, and each event's span is made a child
//! of the event's trace context.
//!
//! Invariant: no I/O; nothing here changes what is stored or delivered.

use std::fmt;

use crate::envelope::{Envelope, Headers};

/// The header that carries an event's trace context, and the HTTP request
/// header the relay sends with its round's.
pub const TRACEPARENT: &str = "traceparent";

/// The length of a version `00` traceparent, and of the part of a later
/// version's that this version reads.
const LEN_V00: usize = 55;

/// A well-formed W3C `traceparent`: version (two lowercase hex digits, not
/// `ff`), trace id (32 lowercase hex digits, not all zero), parent id (16,
/// not all zero) and flags (two). A version `00` value is exactly 55
/// characters; a later version's may go on after a `-`, and what follows
/// is kept as it was.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TraceParent {
    text: String,
}

/// Why a text is not a well-formed `traceparent`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a traceparent {0}")]
pub struct TraceParentError(String);

impl TraceParent {
    /// Parses `text` under the W3C rules above.
    pub fn parse(text: &str) -> Result<TraceParent, TraceParentError> {
        let refused = |rule: &str| Err(TraceParentError(rule.to_owned()));
        let bytes = text.as_bytes();
        if bytes.len() < LEN_V00 {
            return refused("has at least 55 characters (VERSION-TRACEID-PARENTID-FLAGS)");
        }
        if !bytes[..LEN_V00].is_ascii() {
            return refused("is ASCII in its first 55 characters");
        }
        let dashes = [2, 35, 52];
        if dashes.iter().any(|&at| bytes[at] != b'-') {
            return refused("has the form VERSION-TRACEID-PARENTID-FLAGS");
        }
        let version = &text[0..2];
        for (field, part) in [
            ("version", version),
            ("trace id", &text[3..35]),
            ("parent id", &text[36..52]),
            ("flags", &text[53..55]),
        ] {
            if !part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                return Err(TraceParentError(format!(
                    "{field} is lowercase hexadecimal digits"
                )));
            }
            if matches!(field, "trace id" | "parent id") && part.bytes().all(|b| b == b'0') {
                return Err(TraceParentError(format!("{field} is not all zero")));
            }
        }
        if version == "ff" {
            return refused("version is not ff");
        }
        if version == "00" && bytes.len() != LEN_V00 {
            return refused("of version 00 has exactly 55 characters");
        }
        if bytes.len() > LEN_V00 && bytes[LEN_V00] != b'-' {
            return refused("of a later version goes on after a '-'");
        }
        Ok(TraceParent {
            text: text.to_owned(),
        })
    }

    /// The version, as two hex digits.
    pub fn version(&self) -> &str {
        &self.text[0..2]
    }

    /// The trace id, as 32 hex digits.
    pub fn trace_id(&self) -> &str {
        &self.text[3..35]
    }

    /// The parent (span) id, as 16 hex digits.
    pub fn parent_id(&self) -> &str {
        &self.text[36..52]
    }

    /// The trace flags.
    pub fn flags(&self) -> u8 {
        u8::from_str_radix(&self.text[53..55], 16).expect("parsed as two hex digits")
    }

    /// Whether the `sampled` flag is set.
    pub fn sampled(&self) -> bool {
        self.flags() & 1 == 1
    }

    /// The canonical text (what [`TraceParent::parse`] read).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The version `00` traceparent of a trace id, parent id and flags
    /// given as numbers; `None` when either id is zero.
    pub fn from_ids(trace_id: u128, parent_id: u64, flags: u8) -> Option<TraceParent> {
        TraceParent::parse(&format!("00-{trace_id:032x}-{parent_id:016x}-{flags:02x}")).ok()
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for TraceParent {
    type Err = TraceParentError;

    fn from_str(text: &str) -> Result<TraceParent, TraceParentError> {
        TraceParent::parse(text)
    }
}

impl Envelope {
    /// The event's trace context: its `traceparent` header when well-formed,
    /// else `None` (an ill-formed value stays in the body and is ignored for
    /// tracing).
    pub fn traceparent(&self) -> Option<TraceParent> {
        traceparent_of(&self.headers)
    }
}

/// The well-formed `traceparent` of `headers`, if any.
pub fn traceparent_of(headers: &Headers) -> Option<TraceParent> {
    TraceParent::parse(headers.get(TRACEPARENT)?).ok()
}

/// The trace context of a batch handed over at once (a relay's round, an
/// HTTP delivery): the first well-formed `traceparent` of `events`.
pub fn first_traceparent(events: &[Envelope]) -> Option<TraceParent> {
    events.iter().find_map(Envelope::traceparent)
}

/// Records `traceparent` on `span`'s field `traceparent` (declared
/// `tracing::field::Empty` by the span) and, with the `otel` feature, makes
/// the span a child of that trace context. Call it before entering the
/// span; `None` records nothing.
pub fn follow(span: &tracing::Span, traceparent: Option<&TraceParent>) {
    let Some(traceparent) = traceparent else {
        return;
    };
    span.record(TRACEPARENT, traceparent.as_str());
    #[cfg(feature = "otel")]
    otel::set_parent(span, traceparent);
}

/// The span named `$name` of one event (its `event_id`, `flow_id` and
/// `seq`, and any further `Empty` fields named after the event), following
/// the event's own trace context ([`follow_event`]).
macro_rules! event_span {
    ($name:literal, $event:expr $(, $field:ident)*) => {{
        let event: &$crate::Envelope = $event;
        let span = tracing::debug_span!(
            $name,
            event_id = %event.event_id,
            flow_id = %event.flow_id,
            seq = event.seq.get(),
            traceparent = tracing::field::Empty,
            $($field = tracing::field::Empty,)*
        );
        $crate::trace::follow_event(&span, event);
        span
    }};
}
pub(crate) use event_span;

/// [`follow`] with `event`'s own trace context.
pub fn follow_event(span: &tracing::Span, event: &Envelope) {
    follow(span, event.traceparent().as_ref());
}

/// The headers an append writes: `headers`, with `traceparent` when
/// given, else (with the `otel` feature) the current OpenTelemetry
/// context's when the caller named none.
pub fn appended_headers(headers: &Headers, traceparent: Option<&TraceParent>) -> Headers {
    let mut headers = headers.clone();
    if let Some(traceparent) = traceparent {
        headers.insert(TRACEPARENT.to_owned(), traceparent.to_string());
    }
    #[cfg(feature = "otel")]
    if !headers.contains_key(TRACEPARENT) {
        if let Some(current) = otel::current() {
            headers.insert(TRACEPARENT.to_owned(), current.to_string());
        }
    }
    headers
}

#[cfg(feature = "otel")]
pub mod otel;

#[cfg(test)]
mod tests;
