//! Replays the committed corpus of the `receive_stream` fuzz target
//! (`fuzz/corpus/receive_stream/`) into a real consumer file, through the
//! same check the fuzzer runs.

use ordo_core::ConsumerOps;
use ordo_sqlite::ConsumerDb;
use ordo_testkit::fuzz::{check_receive_stream, replay_corpus};

#[test]
fn receive_stream_corpus_passes() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut consumer = ConsumerDb::open(
        dir.path().join("consumer.db"),
        &ordo_sqlite::Schema::new("fuzz").unwrap(),
    )
    .expect("open consumer.db");
    // Twice over the same file: the second pass meets every envelope the
    // first accepted.
    let mut rows = Vec::new();
    for _ in 0..2 {
        let files = replay_corpus("receive_stream", |data| {
            check_receive_stream(&mut consumer, data)
        });
        assert!(files > 0);
        rows.push(consumer.inbox().expect("the inbox reads").len());
    }
    // The corpus reaches the store, and the second pass stores nothing.
    assert!(rows[0] > 0, "no corpus file was received");
    assert_eq!(rows[0], rows[1]);
}
