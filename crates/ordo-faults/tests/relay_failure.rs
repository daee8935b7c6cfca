//! A relay round the consumer refuses transiently is recorded on the
//! producer as a failure with its backoff; when that recording fails too,
//! the relay returns both errors, neither swallowed.

use std::sync::Arc;
use std::time::Duration;

use ordo_core::{ErrorKind, FlowId, RelayError, RelayOptions, SchemaVersion, SystemClock};
use ordo_faults::{Fault, FaultPlan};
use ordo_reservation::{AdvanceRequest, FlowState, Quantity, ReservationProducer};
use ordo_sqlite::rusqlite::Connection;
use ordo_sqlite::{ConsumerDb, OpenOptions, ProducerDb};

#[test]
fn a_failure_to_record_a_relay_failure_keeps_both_errors() {
    let producer_dir = tempfile::tempdir().unwrap();
    let consumer_dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::arm(producer_dir.path());
    let clock = Arc::new(SystemClock);
    let short = OpenOptions {
        busy_timeout: Duration::from_millis(20),
        ..OpenOptions::default()
    };
    let mut producer = ProducerDb::open_with(
        producer_dir.path().join("producer.db"),
        &ordo_reservation::producer_schema(),
        clock.clone(),
        &short,
    )
    .unwrap();
    let consumer_path = consumer_dir.path().join("consumer.db");
    let mut consumer = ConsumerDb::open_with(
        &consumer_path,
        &ordo_reservation::consumer_schema(),
        clock,
        &short,
    )
    .unwrap();
    let request = AdvanceRequest::new(
        FlowId::new("f").unwrap(),
        0,
        FlowState::Reserved,
        Some(Quantity::new(1).unwrap()),
        SchemaVersion::V1,
    )
    .unwrap();
    producer.advance(&request).unwrap();

    // The consumer is busy, and the producer's disk refuses writes.
    let locker = Connection::open(&consumer_path).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    plan.set(Fault::ReadOnly);
    let error = ordo_core::relay(
        &mut producer,
        &mut consumer,
        &RelayOptions::default(),
        &SystemClock,
    )
    .expect_err("neither side can take the round");
    match &error {
        RelayError::FailureUnrecorded {
            delivery,
            recording,
        } => {
            assert_eq!(delivery.kind(), Some(ErrorKind::Busy), "{error}");
            assert_eq!(recording.kind(), ErrorKind::ReadOnly, "{error}");
        }
        other => panic!("expected both errors, got {other:?}"),
    }
    assert_eq!(error.kind(), Some(ErrorKind::Busy));
    let text = error.to_string();
    assert!(text.contains("recording the failure also failed"), "{text}");
    plan.set(Fault::None);
    locker.execute_batch("ROLLBACK").unwrap();
}
