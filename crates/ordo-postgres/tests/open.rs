//! Opening stores on PostgreSQL: what is refused and written nothing, the
//! errors a caller sees, and seq allocation between two writers.

mod support;

use ordo_core::OutboxTx;
use std::sync::Arc;

use ordo_core::{ConsumerOps, ErrorKind, FlowId, SchemaVersion, StoreError, SystemClock};
use ordo_postgres::{PgConsumer, PgOptions, PgProducer};
use ordo_reservation::{consumer_schema, producer_schema};
use ordo_reservation::{Advance, AdvanceRequest, FlowState, Quantity, ReservationProducer};
use support::{admin_client, fresh_database, test_schema};

fn options(schema: &str) -> PgOptions {
    PgOptions {
        schema: Some(schema.into()),
        ..PgOptions::default()
    }
}

fn schema_exists(target: &str, schema: &str) -> bool {
    admin_client(target)
        .query_one("SELECT to_regnamespace($1) IS NOT NULL", &[&schema])
        .expect("read")
        .get(0)
}

fn refused<T>(result: Result<T, StoreError>, kind: ErrorKind, words: &str) {
    match result {
        Ok(_) => panic!("expected a refusal with {words:?}"),
        Err(e) => {
            assert_eq!(e.kind(), kind, "{e}");
            assert!(e.to_string().contains(words), "{e}");
        }
    }
}

#[test]
fn synchronous_commit_off_is_refused() {
    let (_dir, target) = fresh_database();
    let off = format!("{target}?options=-c%20synchronous_commit%3Doff");
    refused(
        PgProducer::open_with(
            &off,
            &producer_schema(),
            Arc::new(SystemClock),
            &options("ordo_off"),
        ),
        ErrorKind::Incompatible,
        "synchronous_commit = off",
    );
    assert!(!schema_exists(&target, "ordo_off"), "nothing was created");
}

#[test]
fn another_role_domain_or_newer_version_is_refused() {
    let (_dir, target) = fresh_database();
    let clock = Arc::new(SystemClock);
    // The template holds a reservation consumer in ordo_consumer.
    refused(
        PgProducer::open_with(
            &target,
            &producer_schema(),
            clock.clone(),
            &options("ordo_consumer"),
        ),
        ErrorKind::Incompatible,
        "not a producer store",
    );
    refused(
        PgConsumer::open_with(
            &target,
            &test_schema(),
            clock.clone(),
            &PgOptions::default(),
        ),
        ErrorKind::Incompatible,
        "belongs to domain \"reservation\"",
    );
    admin_client(&target)
        .batch_execute(
            "UPDATE ordo_consumer.ordo_meta SET value = '99' WHERE key = 'schema_version'",
        )
        .expect("age the store");
    refused(
        PgConsumer::open_with(&target, &consumer_schema(), clock, &PgOptions::default()),
        ErrorKind::Incompatible,
        "schema version 99",
    );
}

#[test]
fn open_existing_creates_nothing_and_a_foreign_schema_is_refused() {
    let (_dir, target) = fresh_database();
    let clock = Arc::new(SystemClock);
    refused(
        PgProducer::open_existing(&target, clock.clone(), &options("ordo_nothing")),
        ErrorKind::NotFound,
        "ordo_nothing",
    );
    assert!(!schema_exists(&target, "ordo_nothing"));
    admin_client(&target)
        .batch_execute("CREATE SCHEMA app; CREATE TABLE app.orders (id bigint)")
        .expect("an application's schema");
    refused(
        PgProducer::open_with(&target, &producer_schema(), clock, &options("app")),
        ErrorKind::Incompatible,
        "did not create",
    );
}

#[test]
fn unreachable_server_and_bad_url_name_no_password() {
    let result = PgProducer::open(
        "postgres://someone:secret@127.0.0.1:1/db",
        &producer_schema(),
    );
    let error = result.err().expect("nothing listens on port 1");
    assert_eq!(error.kind(), ErrorKind::ConnectionLost, "{error}");
    let message = error.to_string();
    assert!(
        message.contains("postgres://someone@127.0.0.1:1/db"),
        "{message}"
    );
    assert!(!message.contains("secret"), "{message}");
    let error = PgProducer::open("postgres://a:b@host:notaport/db", &producer_schema())
        .err()
        .expect("not a URL");
    assert_eq!(error.kind(), ErrorKind::InvalidInput, "{error}");
    assert!(
        error
            .to_string()
            .contains("not a PostgreSQL connection URL"),
        "{error}"
    );
}

#[test]
fn errors_name_their_sqlstate() {
    let (_dir, target) = fresh_database();
    let consumer = PgConsumer::open(&target, &consumer_schema()).expect("open");
    let error = consumer
        .connection()
        .execute("SELECT * FROM no_such_table", &[])
        .expect_err("no such table");
    assert!(error.to_string().contains("SQLSTATE 42P01"), "{error}");
    assert_eq!(error.kind(), ErrorKind::Other);
}

#[test]
fn the_repair_log_refuses_update_and_delete() {
    let (_dir, target) = fresh_database();
    let mut client = admin_client(&target);
    client
        .batch_execute(
            "INSERT INTO ordo_consumer.repair_log (action, flow_id, seq, event_id, reason, decided_by, at_ms)
             VALUES ('skip', 'f', 1, 'f-1', 'r', 'me', 0)",
        )
        .expect("append");
    for statement in [
        "UPDATE ordo_consumer.repair_log SET reason = 'other'",
        "DELETE FROM ordo_consumer.repair_log",
        "TRUNCATE ordo_consumer.repair_log",
    ] {
        let error = client.batch_execute(statement).expect_err(statement);
        let message = error.as_db_error().map(|e| e.message().to_string());
        assert_eq!(
            message.as_deref(),
            Some("repair_log is append-only"),
            "{statement}"
        );
    }
    let mut consumer = PgConsumer::open(&target, &consumer_schema()).expect("open");
    assert_eq!(consumer.repairs().expect("read").len(), 1);
}

/// Polls until another backend waits for a lock; the loop is bounded by a
/// count, not a time.
fn wait_for_a_lock_waiter(target: &str) {
    let mut client = admin_client(target);
    for _ in 0..100_000 {
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .expect("read")
            .get(0);
        if waiting > 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    panic!("the second writer never waited for the flow's head");
}

#[test]
fn a_racing_writer_of_the_same_flow_waits_then_is_stale() {
    let (_dir, target) = fresh_database();
    let flow = FlowId::new("race").expect("a flow id");
    let mut first = PgProducer::open(&target, &producer_schema()).expect("open");
    let mut second = PgProducer::open(&target, &producer_schema()).expect("open");
    let request = AdvanceRequest::new(
        flow.clone(),
        0,
        FlowState::Reserved,
        Some(Quantity::new(3).expect("a quantity")),
        SchemaVersion::new(1).expect("a version"),
    )
    .expect("a request");
    let mut racer = None;
    first
        .write(|tx| -> Result<(), ordo_core::AppendError> {
            assert_eq!(tx.last_seq(&flow)?, 0);
            // The head is locked: the second writer starts now, and waits.
            racer = Some(std::thread::spawn(move || second.advance(&request)));
            wait_for_a_lock_waiter(&target);
            let payload = serde_json::json!({"quantity": 3});
            tx.append(
                &flow,
                "reserved",
                SchemaVersion::new(1).expect("v1"),
                &payload,
            )?;
            Ok(())
        })
        .expect("the first writer commits");
    let racer = racer.expect("the racer started");
    let outcome = racer.join().expect("the racer ends").expect("no error");
    assert_eq!(outcome, Advance::Stale { last_seq: 1 });
}

#[test]
fn a_transaction_sees_its_own_appends_in_the_heads_it_locked() {
    let (_dir, target) = fresh_database();
    let (f, g) = (FlowId::new("own-f").unwrap(), FlowId::new("own-g").unwrap());
    let mut producer = PgProducer::open(&target, &producer_schema()).expect("open");
    let v1 = SchemaVersion::new(1).expect("v1");
    let payload = serde_json::json!({"quantity": 3});
    producer
        .write(|tx| -> Result<(), ordo_core::AppendError> {
            assert_eq!(tx.last_seq(&f)?, 0);
            let first = tx.append(&f, "reserved", v1, &payload)?;
            assert_eq!(first.seq.get(), 1);
            assert_eq!(tx.last_seq(&f)?, 1, "the head moved by this transaction");
            let heads = tx.last_seqs([&f, &g])?;
            assert_eq!((heads["own-f"], heads["own-g"]), (1, 0));
            match tx.append_envelope(&first) {
                Err(ordo_core::AppendError::NotNext { last_seq, .. }) => assert_eq!(last_seq, 1),
                other => panic!("a second seq 1 is refused as not next: {other:?}"),
            }
            assert_eq!(tx.append(&f, "confirmed", v1, &payload)?.seq.get(), 2);
            assert_eq!(tx.append(&g, "reserved", v1, &payload)?.seq.get(), 1);
            Ok(())
        })
        .expect("commits");
    producer
        .write(|tx| -> Result<(), ordo_core::AppendError> {
            let heads = tx.last_seqs([&g, &f])?;
            assert_eq!((heads["own-f"], heads["own-g"]), (2, 1), "as committed");
            Ok(())
        })
        .expect("reads");
}

#[test]
fn domain_migrations_run_forward_once_and_a_newer_store_is_refused() {
    let (_dir, target) = fresh_database();
    let clock = Arc::new(SystemClock);
    let first = ordo_postgres::Schema::new("mig")
        .expect("a domain")
        .migration("CREATE TABLE mig_orders (id bigint PRIMARY KEY)");
    let second = first
        .clone()
        .migration("ALTER TABLE mig_orders ADD COLUMN note text");
    let opts = options("ordo_mig");
    for schema in [&first, &first, &second, &second] {
        // Migration 1 runs once: a second CREATE TABLE would fail.
        PgConsumer::open_with(&target, schema, clock.clone(), &opts).expect("open");
    }
    let columns: i64 = admin_client(&target)
        .query_one(
            "SELECT count(*) FROM information_schema.columns WHERE table_name = 'mig_orders'",
            &[],
        )
        .expect("read")
        .get(0);
    assert_eq!(columns, 2);
    refused(
        PgConsumer::open_with(&target, &first, clock, &opts),
        ErrorKind::Incompatible,
        "are at version 2; this application knows up to 1",
    );
}

#[test]
fn schema_names_outside_the_safe_set_are_refused() {
    for name in ["Upper", "pg_catalog", "with space", "semi;colon", ""] {
        let error = PgProducer::open_with(
            "postgres://nobody@127.0.0.1:1/none",
            &producer_schema(),
            Arc::new(SystemClock),
            &options(name),
        )
        .err()
        .expect("refused before connecting");
        assert!(error.to_string().contains("schema name"), "{name}: {error}");
        assert_eq!(error.kind(), ErrorKind::InvalidInput, "{name}: {error}");
    }
}

#[test]
fn open_or_create_creates_a_missing_store_and_opens_another_domains_as_it_is() {
    let (_dir, target) = fresh_database();
    let clock = Arc::new(SystemClock);
    // Domains without migrations: a domain's own tables live outside the
    // store's schema, in the database's search path.
    let ledger = ordo_core::domain::Schema::new("ledger").expect("a domain name");
    let created = PgConsumer::open_or_create(&target, &ledger, clock.clone(), &options("either"))
        .expect("a missing store is created");
    assert_eq!(created.domain(), "ledger");
    drop(created);
    // An existing store is opened as it is: another domain's schema
    // neither refuses it nor migrates it.
    let other = ordo_core::domain::Schema::new("billing").expect("a domain name");
    let opened = PgConsumer::open_or_create(&target, &other, clock, &options("either"))
        .expect("an existing store of another domain");
    assert_eq!(opened.domain(), "ledger");
}
