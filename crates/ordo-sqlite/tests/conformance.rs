//! The backend conformance suite of `ordo-testkit`, run against the SQLite
//! stores: `producer.db` and `consumer.db` in each test's own directory.

use std::path::Path;
use std::sync::Arc;

use ordo_core::BlockCode;
use ordo_core::Clock;
use ordo_sqlite::rusqlite::Connection;
use ordo_sqlite::{ConsumerDb, OpenOptions, ProducerDb, Schema};
use ordo_testkit::suite::generic::TestDomain;

/// The embedded default backend: two SQLite files.
struct Sqlite;

impl ordo_testkit::Backend for Sqlite {
    type Producer = ProducerDb;
    type Consumer = ConsumerDb;
    type TestHandler = TestDomain<Connection>;

    fn open_test_domain(dir: &Path) -> ConsumerDb {
        let schema = Schema::new("testkit")
            .expect("a domain name")
            .migration("CREATE TABLE handled (flow_id TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (flow_id, seq))");
        ConsumerDb::open(dir.join("test-domain.db"), &schema).expect("open test-domain.db")
    }

    fn test_handler(reevaluate: Vec<BlockCode>) -> TestDomain<Connection> {
        TestDomain::new(reevaluate, |tx, event| {
            tx.execute(
                "INSERT INTO handled (flow_id, seq) VALUES (?1, ?2)",
                ordo_sqlite::rusqlite::params![event.flow_id.as_str(), event.seq.get()],
            )?;
            Ok(())
        })
    }

    fn handled(consumer: &mut ConsumerDb) -> Vec<(String, i64)> {
        let mut stmt = consumer
            .connection()
            .prepare("SELECT flow_id, seq FROM handled ORDER BY flow_id, seq")
            .expect("read handled");
        stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .expect("read handled")
            .collect::<Result<_, _>>()
            .expect("read handled")
    }

    fn open_named_producer(
        dir: &Path,
        name: Option<ordo_core::ProducerName>,
    ) -> Result<ProducerDb, ordo_core::StoreError> {
        let options = OpenOptions {
            producer_name: name,
            ..OpenOptions::default()
        };
        let schema = Schema::new("named").expect("a domain name");
        ProducerDb::open_with(
            dir.join("named.db"),
            &schema,
            Arc::new(ordo_core::SystemClock),
            &options,
        )
    }

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

/// The rules of rounds that hand several events of a flow at once
/// (`--flow-events`).
mod deep {
    use super::Sqlite;
    use ordo_testkit::deep;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().expect("a temporary directory")
    }

    #[test]
    fn relay_leaves_what_follows_a_conflict_in_its_round_unmarked() {
        deep::relay_leaves_what_follows_a_conflict_in_its_round_unmarked::<Sqlite>(dir().path());
    }

    #[test]
    fn deep_round_hands_each_flow_from_its_head_in_seq_order() {
        deep::deep_round_hands_each_flow_from_its_head_in_seq_order::<Sqlite>(dir().path());
    }

    #[test]
    fn deep_round_leaves_out_what_the_destination_holds() {
        deep::deep_round_leaves_out_what_the_destination_holds::<Sqlite>(dir().path());
    }
}
