//! Replays the committed corpora of the pure fuzz targets (`fuzz/corpus/`)
//! through the same checks the fuzzers run.

use ordo_testkit::fuzz::{check_envelope_parse, check_stored_body, replay_corpus, replay_dir};

#[test]
fn envelope_parse_corpus_passes() {
    let files = replay_corpus("envelope_parse", check_envelope_parse);
    assert!(files > 0);
}

#[test]
fn stored_body_corpus_passes() {
    let files = replay_corpus("stored_body", check_stored_body);
    assert!(files > 0);
}

#[test]
#[should_panic(expected = "cannot be read")]
fn a_missing_corpus_fails_the_replay() {
    replay_corpus("no_such_target", check_envelope_parse);
}

#[test]
#[should_panic(expected = "is empty")]
fn an_empty_corpus_fails_the_replay() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    replay_dir(dir.path(), check_envelope_parse);
}
