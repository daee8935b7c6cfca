//! The backend conformance suite of `ordo-testkit`, run against the SQLite
//! stores: `producer.db` and `consumer.db` in each test's own directory.

use std::path::Path;

use ordo_sqlite::{ConsumerDb, ProducerDb};

/// The embedded default backend: two SQLite files.
struct Sqlite;

impl ordo_testkit::Backend for Sqlite {
    type Producer = ProducerDb;
    type Consumer = ConsumerDb;

    fn open(dir: &Path) -> (ProducerDb, ConsumerDb) {
        let producer = ProducerDb::open(dir.join("producer.db")).expect("open producer.db");
        let consumer = ConsumerDb::open(dir.join("consumer.db")).expect("open consumer.db");
        (producer, consumer)
    }
}

ordo_testkit::conformance_suite!(Sqlite);
