//! The checks behind the fuzz targets of `fuzz/`, one function per target,
//! so that the fuzzers and the corpus replay tests run the same code.
//!
//! Each check takes arbitrary bytes and panics when ordo breaks one of its
//! promises on them: a parser panics, accepts something it cannot write back,
//! two parsers disagree, or a store accepts the same envelope twice. Input
//! that is refused cleanly passes.
//!
//! [`replay_corpus`] runs a check over every file of a target's committed
//! corpus (`fuzz/corpus/<target>/`).

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use ordo_core::envelope::{canonical_json, parse_stream, parse_strict_json, StreamError};
use ordo_core::ops::InboxScope;
use ordo_core::{ConsumerStore, Envelope, MalformedEnvelope, Receipt};

/// The most envelopes of one input that [`check_receive_stream`] receives;
/// a longer stream is only parsed, which keeps every run cheap.
pub const STREAM_ENVELOPES_MAX: usize = 16;

/// The most inbox rows of one flow read back per accepted envelope.
pub const READ_BACK_ROWS_MAX: usize = 256;

/// The most files a corpus may hold (a corpus is committed; it stays small).
pub const CORPUS_FILES_MAX: usize = 400;

/// The largest corpus file, in bytes.
pub const CORPUS_FILE_BYTES_MAX: u64 = 64 * 1024;

/// Target `envelope_parse`: [`Envelope::parse`] of arbitrary bytes. Invalid
/// UTF-8 is refused at its first invalid byte; otherwise the parse agrees
/// with [`Envelope::from_value`] of the strict JSON value, and an accepted
/// envelope passes [`check_round_trips`].
pub fn check_envelope_parse(data: &[u8]) {
    let parsed = Envelope::parse(data);
    let text = match std::str::from_utf8(data) {
        Ok(text) => text,
        Err(e) => {
            assert_eq!(
                parsed,
                Err(MalformedEnvelope::NotUtf8 {
                    offset: e.valid_up_to()
                })
            );
            return;
        }
    };
    assert_eq!(parsed, Envelope::parse_str(text));
    assert_eq!(
        parsed,
        parse_strict_json(text).and_then(Envelope::from_value),
        "parse_str and from_value disagree"
    );
    if let Ok(envelope) = parsed {
        check_round_trips(&envelope);
    }
}

/// Target `stored_body`: [`Envelope::from_stored`] of arbitrary text. It
/// accepts exactly what [`Envelope::parse_str`] accepts, as the same
/// envelope, and an accepted envelope passes [`check_round_trips`].
pub fn check_stored_body(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let stored = Envelope::from_stored(text);
    let parsed = Envelope::parse_str(text);
    match (&stored, &parsed) {
        (Ok(stored), Ok(parsed)) => {
            assert_eq!(stored, parsed, "from_stored and parse_str disagree");
            check_round_trips(stored);
        }
        (Err(_), Err(_)) => {}
        _ => panic!("from_stored gave {stored:?} where parse_str gave {parsed:?}"),
    }
}

/// The round trips every accepted envelope must survive:
///
/// - the stored text is the compact JSON of [`Envelope::to_value`] and reads
///   back (through [`Envelope::from_stored`] and [`Envelope::parse_str`]) to
///   an equal envelope with the same body hash;
/// - the canonical body is stable (canonicalizing it again changes nothing)
///   and parses back to an envelope with the same body, unless its seq or
///   schema version is a double rounded past `i64::MAX`, which is refused on
///   that field; with seq and schema version up to 2^53 the hash is the same.
pub fn check_round_trips(envelope: &Envelope) {
    let stored = envelope.stored_text();
    assert_eq!(stored, envelope.to_value().to_string());
    let again = Envelope::from_stored(&stored).expect("the stored text reads back");
    assert_eq!(&again, envelope, "stored text {stored}");
    assert_eq!(again.body_hash(), envelope.body_hash());
    assert_eq!(Envelope::parse_str(&stored).as_ref(), Ok(envelope));

    let body = envelope.body();
    assert_eq!(body, canonical_json(&envelope.to_value()));
    let value = parse_strict_json(&body).expect("a canonical body is strict JSON");
    assert_eq!(canonical_json(&value), body, "canonical body {body}");

    let hash = envelope.body_hash();
    assert_eq!(hash.as_str().len(), 64);
    const EXACT: i64 = 1 << 53;
    let rounds_past_i64 = |n: i64| n as f64 >= 9_223_372_036_854_775_808.0;
    let (seq, version) = (envelope.seq.get(), envelope.schema_version.get());
    match Envelope::parse_str(&body) {
        Ok(from_body) => {
            assert!(!rounds_past_i64(seq) && !rounds_past_i64(version));
            assert_eq!(from_body.body(), body);
            assert_eq!(from_body.event_id, envelope.event_id);
            assert_eq!(from_body.flow_id, envelope.flow_id);
            assert_eq!(from_body.event_type, envelope.event_type);
            if seq <= EXACT && version <= EXACT {
                assert_eq!(from_body.body_hash(), hash, "canonical body {body}");
            }
        }
        Err(MalformedEnvelope::InvalidField { field, .. }) => {
            let expected = if rounds_past_i64(seq) {
                "seq"
            } else {
                "schema_version"
            };
            assert!(rounds_past_i64(seq) || rounds_past_i64(version));
            assert_eq!(field, expected, "canonical body {body}");
        }
        Err(other) => panic!("canonical body {body} refused: {other}"),
    }
}

/// Target `receive_stream`: [`parse_stream`] of arbitrary bytes, then, for a
/// stream of 1 to [`STREAM_ENVELOPES_MAX`] envelopes, two receives of the
/// whole stream into `store`.
///
/// The parse agrees with [`Envelope::parse`] on a stream of one envelope and
/// names a line inside the input. The first receive never accepts an
/// envelope whose `event_id` or `(flow_id, seq)` it accepted earlier in the
/// same stream, and every envelope it accepts reads back from the inbox as it
/// was; the second receive accepts nothing, and finds each envelope the
/// first accepted a `duplicate`.
pub fn check_receive_stream(store: &mut impl ConsumerStore, data: &[u8]) {
    let parsed = parse_stream(data);
    match (&parsed, Envelope::parse(data)) {
        (Ok(envelopes), Ok(one)) => assert_eq!(envelopes, &[one]),
        (Ok(envelopes), Err(e)) => assert_ne!(envelopes.len(), 1, "parse refused: {e}"),
        (Err(_), Ok(one)) => panic!("parse took {one:?} where parse_stream gave {parsed:?}"),
        (Err(_), Err(_)) => {}
    }
    let envelopes = match parsed {
        Ok(envelopes) => envelopes,
        Err(error) => {
            check_stream_error(data, &error);
            return;
        }
    };
    if envelopes.is_empty() || envelopes.len() > STREAM_ENVELOPES_MAX {
        return;
    }
    let first = store
        .receive_batch(&envelopes)
        .expect("a parsed stream is received");
    assert_eq!(first.len(), envelopes.len());
    for (i, (envelope, receipt)) in envelopes.iter().zip(&first).enumerate() {
        if *receipt != Receipt::Accepted {
            continue;
        }
        let earlier = envelopes[..i]
            .iter()
            .zip(&first)
            .filter(|(_, receipt)| **receipt == Receipt::Accepted)
            .map(|(e, _)| e)
            .find(|e| {
                e.event_id == envelope.event_id
                    || (e.flow_id == envelope.flow_id && e.seq == envelope.seq)
            });
        assert!(
            earlier.is_none(),
            "envelope {} accepted after {earlier:?} in the same stream",
            i + 1
        );
        let rows = store
            .inbox_entries(
                false,
                InboxScope::Flow(&envelope.inbox_flow()),
                READ_BACK_ROWS_MAX,
            )
            .expect("the inbox reads back");
        match rows
            .iter()
            .find(|r| r.envelope.event_id == envelope.event_id)
        {
            Some(row) => assert_eq!(&row.envelope, envelope, "the inbox row differs"),
            None => assert_eq!(
                rows.len(),
                READ_BACK_ROWS_MAX,
                "accepted envelope {} is not in the inbox",
                envelope.event_id
            ),
        }
    }
    let second = store
        .receive_batch(&envelopes)
        .expect("a parsed stream is received again");
    assert_eq!(second.len(), envelopes.len());
    for (i, (then, now)) in first.iter().zip(&second).enumerate() {
        assert_ne!(*now, Receipt::Accepted, "envelope {} accepted twice", i + 1);
        if *then == Receipt::Accepted {
            assert_eq!(*now, Receipt::Duplicate, "envelope {}", i + 1);
        }
    }
}

/// A refused stream names a position inside the input.
fn check_stream_error(data: &[u8], error: &StreamError) {
    let lines = data.iter().filter(|b| **b == b'\n').count() + 1;
    match *error {
        StreamError::NotUtf8 { offset } => {
            let e = std::str::from_utf8(data).expect_err("refused as not UTF-8");
            assert_eq!(offset, e.valid_up_to());
        }
        StreamError::NotJson { line, .. } | StreamError::Envelope { line, .. } => {
            assert!((1..=lines).contains(&line), "{error} in {lines} lines");
        }
        StreamError::SharedLine { line, index } => {
            assert!((1..=lines).contains(&line), "{error} in {lines} lines");
            assert!(index >= 2, "{error}");
        }
        _ => panic!("an error this check does not know: {error}"),
    }
}

/// The committed corpus of a fuzz target: `fuzz/corpus/<target>/` of the
/// repository.
pub fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

/// Runs `check` on every file of [`corpus_dir`]`(target)` ([`replay_dir`]).
pub fn replay_corpus(target: &str, check: impl FnMut(&[u8])) -> usize {
    replay_dir(&corpus_dir(target), check)
}

/// Runs `check` on every file of `dir`, in name order, and returns how many
/// there were. Panics, naming the file, when a check fails; panics when the
/// directory is missing, empty, holds more than [`CORPUS_FILES_MAX`] files
/// or anything but files of at most [`CORPUS_FILE_BYTES_MAX`].
pub fn replay_dir(dir: &Path, mut check: impl FnMut(&[u8])) -> usize {
    let entries = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("corpus {} cannot be read: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("a corpus entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "corpus {} is empty", dir.display());
    assert!(
        files.len() <= CORPUS_FILES_MAX,
        "corpus {} holds {} files, more than {CORPUS_FILES_MAX}",
        dir.display(),
        files.len()
    );
    for path in &files {
        let size_bytes = std::fs::metadata(path).expect("a corpus file").len();
        assert!(
            path.is_file() && size_bytes <= CORPUS_FILE_BYTES_MAX,
            "{} is not a file of at most {CORPUS_FILE_BYTES_MAX} bytes",
            path.display()
        );
        let data = std::fs::read(path).expect("a corpus file reads");
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| check(&data))) {
            eprintln!("corpus file {} fails its check", path.display());
            resume_unwind(panic);
        }
    }
    files.len()
}
