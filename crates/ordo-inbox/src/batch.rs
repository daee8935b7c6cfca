//! The body of `POST /v1/events`: one envelope (an object) or a batch (an
//! array of 1 to `max_batch` envelopes), each item read by ordo-core's
//! strict codec ([`Envelope::parse_str`]).
//!
//! Invariant: the top level is read only far enough to split it into raw
//! items; every rule of an envelope is ordo-core's, applied to each item's
//! own text, so the server and `ordo receive` refuse the same inputs.

use std::fmt;

use ordo_core::envelope::parse_strict_json;
use ordo_core::{Envelope, MalformedEnvelope};
use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// Why a body is not a batch of envelopes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// Not JSON, not an object or array, or an empty array (400).
    #[error("{0}")]
    Body(String),
    /// More items than the server takes in one request (413).
    #[error("the batch holds more than {max_batch} envelopes")]
    TooMany {
        /// The most items of one request.
        max_batch: usize,
    },
    /// An item is malformed (400); `index` is its position in an array.
    #[error("{error}")]
    Item {
        /// The item's 0-based position, `None` for a single object.
        index: Option<usize>,
        /// What is wrong with it.
        error: MalformedEnvelope,
    },
}

/// Reads a request body into its envelopes, in order.
pub fn parse_batch(body: &[u8], max_batch: usize) -> Result<Vec<Envelope>, BatchError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        BatchError::Body(format!(
            "the body is not valid UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })?;
    match first_byte(text.as_bytes()) {
        Some(b'{') => Envelope::parse_str(text)
            .map(|envelope| vec![envelope])
            .map_err(|error| BatchError::Item { index: None, error }),
        Some(b'[') => parse_array(text, max_batch),
        _ => Err(BatchError::Body(match parse_strict_json(text) {
            Ok(_) => "the body must be a JSON object (one envelope) or array (a batch)".into(),
            Err(e) => format!("the body is {e}"),
        })),
    }
}

/// The first byte of a body that is not JSON whitespace.
fn first_byte(body: &[u8]) -> Option<u8> {
    body.iter()
        .copied()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
}

/// Whether a body is an array (a batch) rather than one object or
/// anything else, as [`parse_batch`] reads it.
pub fn is_array(body: &[u8]) -> bool {
    first_byte(body) == Some(b'[')
}

fn parse_array(text: &str, max_batch: usize) -> Result<Vec<Envelope>, BatchError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let items = de
        .deserialize_seq(RawItems { max_batch })
        .and_then(|items| de.end().map(|()| items))
        .map_err(|e| BatchError::Body(format!("the body is not valid JSON: {e}")))?;
    let Some(items) = items else {
        return Err(BatchError::TooMany { max_batch });
    };
    if items.is_empty() {
        return Err(BatchError::Body("the batch is an empty array".into()));
    }
    items
        .iter()
        .enumerate()
        .map(|(index, raw)| {
            Envelope::parse_str(raw.get()).map_err(|error| BatchError::Item {
                index: Some(index),
                error,
            })
        })
        .collect()
}

/// The raw items of an array, or `None` past `max_batch` of them (the rest
/// of the array is still read, so that the body is checked as JSON).
struct RawItems {
    max_batch: usize,
}

impl<'de> Visitor<'de> for RawItems {
    type Value = Option<Vec<&'de RawValue>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of envelopes")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<&RawValue>()? {
            if items.len() == self.max_batch {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                return Ok(None);
            }
            items.push(item);
        }
        Ok(Some(items))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str) -> String {
        format!(
            r#"{{"event_id":"{id}","flow_id":"f","seq":1,"schema_version":1,"type":"t","payload":{{}}}}"#
        )
    }

    #[test]
    fn an_object_and_an_array_are_read_in_order() {
        assert_eq!(parse_batch(item("a").as_bytes(), 2).unwrap().len(), 1);
        let body = format!(" [{}, {}]\n", item("a"), item("b"));
        let envelopes = parse_batch(body.as_bytes(), 2).unwrap();
        let ids: Vec<&str> = envelopes.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
    }

    #[test]
    fn bodies_that_are_not_batches_are_refused_without_an_index() {
        for body in ["", "nope", "5", "\"x\"", "[]", "[1,", "{} {}", "[{}] x"] {
            let error = parse_batch(body.as_bytes(), 4).expect_err(body);
            assert!(
                matches!(
                    error,
                    BatchError::Body(_) | BatchError::Item { index: None, .. }
                ),
                "{body}: {error:?}"
            );
        }
        assert!(matches!(parse_batch(b"\xff", 4), Err(BatchError::Body(_))));
    }

    #[test]
    fn a_malformed_item_is_named_by_its_index() {
        let repeated = r#"{"event_id":"a","event_id":"a","flow_id":"f","seq":1,"schema_version":1,"type":"t","payload":{}}"#;
        for bad in ["7", "{}", repeated, &item("a").replace("\"t\"", "5")] {
            let body = format!("[{}, {bad}]", item("a"));
            let error = parse_batch(body.as_bytes(), 4).expect_err(bad);
            assert!(
                matches!(error, BatchError::Item { index: Some(1), .. }),
                "{bad}: {error:?}"
            );
        }
    }

    #[test]
    fn more_items_than_the_bound_are_too_many() {
        let body = format!("[{}, {}, {}]", item("a"), item("b"), item("c"));
        assert_eq!(
            parse_batch(body.as_bytes(), 2),
            Err(BatchError::TooMany { max_batch: 2 })
        );
        assert_eq!(parse_batch(body.as_bytes(), 3).unwrap().len(), 3);
    }
}
