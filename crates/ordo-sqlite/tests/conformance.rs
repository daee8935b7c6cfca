//! The backend conformance suite of `ordo-testkit`, run against the SQLite
//! stores: `producer.db` and `consumer.db` in each test's own directory.

use std::path::Path;
use std::sync::Arc;

use ordo_core::Clock;
use ordo_sqlite::{ConsumerDb, OpenOptions, ProducerDb};

/// The embedded default backend: two SQLite files.
struct Sqlite;

impl ordo_testkit::Backend for Sqlite {
    type Producer = ProducerDb;
    type Consumer = ConsumerDb;

    fn open_with_clock(dir: &Path, clock: Arc<dyn Clock>) -> (ProducerDb, ConsumerDb) {
        let options = OpenOptions::default();
        let producer = ProducerDb::open_with(
            dir.join("producer.db"),
            &ordo_reservation::producer_schema(),
            clock.clone(),
            &options,
        )
        .expect("open producer.db");
        let consumer = ConsumerDb::open_with(
            dir.join("consumer.db"),
            &ordo_reservation::consumer_schema(),
            clock,
            &options,
        )
        .expect("open consumer.db");
        (producer, consumer)
    }
}

ordo_testkit::conformance_suite!(Sqlite);
