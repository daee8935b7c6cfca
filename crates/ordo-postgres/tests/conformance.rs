//! The backend conformance suite of `ordo-testkit`, run against the
//! PostgreSQL stores: each test's private directory maps to its own
//! database (see `support`), both stores in it.

mod support;

use std::path::Path;
use std::sync::Arc;

use ordo_core::{BlockCode, Clock, SystemClock};
use ordo_postgres::{PgConsumer, PgOptions, PgProducer, PgTx};
use ordo_reservation::{consumer_schema, producer_schema};
use ordo_testkit::suite::generic::TestDomain;
use support::{database_for, test_options, test_schema, url};

/// The PostgreSQL backend: both stores in the test's own database.
struct Postgres;

impl ordo_testkit::Backend for Postgres {
    type Producer = PgProducer;
    type Consumer = PgConsumer;
    type TestHandler = TestDomain<PgTx>;

    fn open_with_clock(dir: &Path, clock: Arc<dyn Clock>) -> (PgProducer, PgConsumer) {
        let target = url(&database_for(dir));
        let options = PgOptions::default();
        let producer = PgProducer::open_with(&target, &producer_schema(), clock.clone(), &options)
            .expect("open the producer");
        let consumer = PgConsumer::open_with(&target, &consumer_schema(), clock, &options)
            .expect("open the consumer");
        (producer, consumer)
    }

    fn open_named_producer(
        dir: &Path,
        name: Option<ordo_core::ProducerName>,
    ) -> Result<PgProducer, ordo_core::StoreError> {
        let options = PgOptions {
            schema: Some("named_producer".to_owned()),
            producer_name: name,
            ..PgOptions::default()
        };
        let schema = ordo_postgres::Schema::new("named").expect("a domain name");
        let target = url(&database_for(dir));
        PgProducer::open_with(&target, &schema, Arc::new(SystemClock), &options)
    }

    fn open_test_domain(dir: &Path) -> PgConsumer {
        let target = url(&database_for(dir));
        PgConsumer::open_with(
            &target,
            &test_schema(),
            Arc::new(SystemClock),
            &test_options(),
        )
        .expect("open the test domain")
    }

    fn test_handler(reevaluate: Vec<BlockCode>) -> TestDomain<PgTx> {
        TestDomain::new(reevaluate, |tx, event| {
            tx.execute(
                "INSERT INTO handled (flow_id, seq) VALUES ($1, $2)",
                &[&event.flow_id.as_str(), &event.seq.get()],
            )?;
            Ok(())
        })
    }

    fn handled(consumer: &mut PgConsumer) -> Vec<(String, i64)> {
        consumer
            .connection()
            .query(
                "SELECT flow_id, seq FROM handled ORDER BY flow_id, seq",
                &[],
            )
            .expect("read handled")
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect()
    }
}

ordo_testkit::conformance_suite!(Postgres);

/// One round of several events of a flow, the first a conflict (the
/// PostgreSQL producer's rounds, `--flow-events`).
#[test]
fn relay_leaves_what_follows_a_conflict_in_its_round_unmarked() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    ordo_testkit::deep::relay_leaves_what_follows_a_conflict_in_its_round_unmarked::<Postgres>(
        dir.path(),
    );
}

#[test]
fn deep_round_hands_each_flow_from_its_head_in_seq_order() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    ordo_testkit::deep::deep_round_hands_each_flow_from_its_head_in_seq_order::<Postgres>(
        dir.path(),
    );
}

#[test]
fn deep_round_leaves_out_what_the_destination_holds() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    ordo_testkit::deep::deep_round_leaves_out_what_the_destination_holds::<Postgres>(dir.path());
}
