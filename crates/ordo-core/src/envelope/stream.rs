//! A stream of envelopes, as `receive` reads it: either one JSON object
//! (which may span lines) or one object per line; blank lines are ignored.
//! Every envelope is parsed as strictly as [`Envelope::parse`] parses one.

use serde_json::Value;

use super::{Envelope, MalformedEnvelope, StrictValue};

/// Why a stream of envelopes was refused, with where. Lines and envelope
/// indexes count from 1; nothing of a refused stream is meant to be stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The bytes are not valid UTF-8.
    #[error("input is not valid UTF-8 (invalid byte at offset {offset})")]
    NotUtf8 {
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
    /// The text at `line` is not one strict JSON value (a syntax error, NaN,
    /// Infinity, a number out of range, a repeated key). `error` is always
    /// [`MalformedEnvelope::NotJson`].
    #[error("line {line}: {error}")]
    NotJson {
        /// The line the value starts on.
        line: usize,
        /// What the JSON reader reported.
        error: MalformedEnvelope,
    },
    /// Envelope `index` starts on the line where envelope `index - 1` ends:
    /// two envelopes share line `line`.
    #[error("line {line}: envelope {index} starts on the line where envelope {} ends (one envelope per line)", index - 1)]
    SharedLine {
        /// The line both envelopes are on.
        line: usize,
        /// The second envelope on that line.
        index: usize,
    },
    /// Envelope `index`, starting on `line`, is JSON but not an envelope.
    #[error("envelope {index} (line {line}): {error}")]
    Envelope {
        /// The envelope's position in the stream.
        index: usize,
        /// The line it starts on.
        line: usize,
        /// The rule it broke.
        error: MalformedEnvelope,
    },
}

/// Parses every envelope of a stream, in input order: one JSON object (which
/// may span lines) or one object per line, blank lines ignored. Refuses the
/// whole stream at its first error, naming the line (and envelope) where it
/// is. Empty or blank input is an empty stream.
pub fn parse_stream(bytes: &[u8]) -> Result<Vec<Envelope>, StreamError> {
    let text = std::str::from_utf8(bytes).map_err(|e| StreamError::NotUtf8 {
        offset: e.valid_up_to(),
    })?;
    let mut envelopes = Vec::new();
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<StrictValue>();
    // Lines are counted from where the previous value ended, so the whole
    // input is scanned once.
    let (mut counted_to, mut line) = (0, 1);
    // The line the previous value ended on, if there was one.
    let mut previous_end_line = None;
    // Every value takes at least one byte, so the stream ends within
    // `text.len() + 1` values.
    for _ in 0..=text.len() {
        let start = values.byte_offset();
        let start = start + text[start..].len() - text[start..].trim_start().len();
        line += count_newlines(&text[counted_to..start]);
        let value: Value = match values.next() {
            None => return Ok(envelopes),
            Some(Ok(value)) => value.0,
            Some(Err(e)) => {
                return Err(StreamError::NotJson {
                    line,
                    error: MalformedEnvelope::NotJson {
                        message: e.to_string(),
                    },
                })
            }
        };
        let index = envelopes.len() + 1;
        if previous_end_line == Some(line) {
            return Err(StreamError::SharedLine { line, index });
        }
        let end = values.byte_offset();
        let end_line = line + count_newlines(&text[start..end]);
        (counted_to, previous_end_line) = (end, Some(end_line));
        let envelope = Envelope::from_value(value).map_err(|error| StreamError::Envelope {
            index,
            line,
            error,
        })?;
        envelopes.push(envelope);
        line = end_line;
    }
    unreachable!(
        "a stream of {} bytes holds at most that many values",
        text.len()
    )
}

fn count_newlines(text: &str) -> usize {
    text.bytes().filter(|b| *b == b'\n').count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(id: &str) -> String {
        format!(
            r#"{{"event_id":"{id}","flow_id":"f","seq":1,"schema_version":1,"type":"t","payload":{{}}}}"#
        )
    }

    /// Streams and the event ids they hold, or the error.
    #[test]
    fn streams_and_their_outcomes() {
        let (a, b) = (envelope("a"), envelope("b"));
        let pretty = "{\n \"event_id\": \"p\",\n \"flow_id\": \"f\",\n \"seq\": 1,\n \
                      \"schema_version\": 1,\n \"type\": \"t\",\n \"payload\": {\n  \"k\": [\n   1\n  ]\n }\n}\n";
        let accepted: Vec<(String, Vec<&str>)> = vec![
            (String::new(), vec![]),
            ("\n \n\t\r\n".into(), vec![]),
            (a.clone(), vec!["a"]),
            (format!("{a}\n"), vec!["a"]),
            (format!("\n\n{a}  \n\n{b}\r\n"), vec!["a", "b"]),
            (pretty.into(), vec!["p"]),
            (format!("{pretty}{a}\n"), vec!["p", "a"]),
        ];
        for (input, ids) in &accepted {
            let envelopes = parse_stream(input.as_bytes()).expect(input);
            let got: Vec<&str> = envelopes.iter().map(|e| e.event_id.as_str()).collect();
            assert_eq!(&got, ids, "{input:?}");
        }
        let not_utf8 = parse_stream(b"{\"a\"\xff");
        assert_eq!(not_utf8, Err(StreamError::NotUtf8 { offset: 4 }));
    }

    /// Regression: `{..} {..}` on one line was read as two envelopes, though
    /// a stream is one object (which may span lines) or one object per line.
    #[test]
    fn two_envelopes_on_one_line_are_malformed() {
        let (a, b) = (envelope("a"), envelope("b"));
        let pretty = "{\n \"event_id\": \"p\",\n \"flow_id\": \"f\",\n \"seq\": 1,\n \
                      \"schema_version\": 1,\n \"type\": \"t\",\n \"payload\": {}\n}";
        let cases: Vec<(String, usize, usize)> = vec![
            (format!("{a} {b}"), 1, 2),
            (format!("{a}{b}\n"), 1, 2),
            (format!("{a}\t{b}\r\n"), 1, 2),
            (format!("\n{a}\n\n{b} {a}\n"), 4, 3),
            (format!("{pretty} {a}\n"), 8, 2),
            (format!("{a} {pretty}\n"), 1, 2),
        ];
        for (input, line, index) in &cases {
            let (line, index) = (*line, *index);
            assert_eq!(
                parse_stream(input.as_bytes()),
                Err(StreamError::SharedLine { line, index }),
                "{input:?}"
            );
            // The same envelopes one per line (each of them on its own
            // lines) are a valid stream.
            let apart = input
                .replace("} {", "}\n{")
                .replace("}{", "}\n{")
                .replace("}\t{", "}\n{");
            assert_eq!(
                parse_stream(apart.as_bytes()).unwrap().len(),
                index,
                "{apart:?}"
            );
        }
    }

    #[test]
    fn errors_name_the_line_and_envelope() {
        let a = envelope("a");
        let cases = [
            (
                format!("{a}\n{{\"a\":1,\"a\":2}}\n"),
                "line 2: not valid JSON",
            ),
            (format!("{a} trailing"), "line 1: not valid JSON"),
            (format!("{a}\n\n[1]\n"), "envelope 2 (line 3): an envelope"),
            (
                format!("{a}\n{a} {a}"),
                "line 2: envelope 3 starts on the line where envelope 2 ends",
            ),
        ];
        for (input, expected) in &cases {
            let message = parse_stream(input.as_bytes()).unwrap_err().to_string();
            assert!(message.starts_with(expected), "{input:?}: {message}");
        }
    }
}
