//! `parse_stream` of arbitrary bytes, and two receives of what it accepts
//! into one consumer file per process: see
//! `ordo_testkit::fuzz::check_receive_stream`.
//!
//! The file lives in a directory `ordo-fuzz-receive-*` of the temporary
//! directory (`TMPDIR`), kept after the process ends; `smoke.sh` points
//! `TMPDIR` at a directory it removes.

#![no_main]

use std::sync::{Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use ordo_sqlite::ConsumerDb;

static CONSUMER: OnceLock<Mutex<ConsumerDb>> = OnceLock::new();

fn consumer() -> &'static Mutex<ConsumerDb> {
    CONSUMER.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("ordo-fuzz-receive-")
            .tempdir()
            .expect("a temporary directory")
            .keep();
        let consumer = ConsumerDb::open(
            dir.join("consumer.db"),
            &ordo_sqlite::Schema::new("fuzz").unwrap(),
        )
        .expect("open consumer.db");
        Mutex::new(consumer)
    })
}

fuzz_target!(|data: &[u8]| {
    let mut consumer = consumer().lock().expect("one fuzz thread");
    ordo_testkit::fuzz::check_receive_stream(&mut *consumer, data);
});
