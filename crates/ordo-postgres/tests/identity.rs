//! Every store has an identity (PROTOCOL.md section 12): 32 lowercase
//! hexadecimal digits given when the store is created, its own, kept
//! across opens; a store of the second release is given one at its first
//! open by this release, and keeps it after.

mod support;

use std::sync::Arc;

use ordo_core::{ConsumerOps, ProducerOps, StoreId, SystemClock};
use ordo_postgres::{PgConsumer, PgOptions, PgProducer, Schema, SCHEMA_VERSION};
use support::{admin_client, fresh_database};

/// A domain of no tables of its own: its stores sit beside the template's.
fn domain() -> Schema {
    Schema::new("identity").unwrap()
}

/// Opens (or creates) the producer store (`producer`) or the consumer
/// store in `schema` of `target`, and returns its identity.
fn open(target: &str, producer: bool, schema: &str) -> StoreId {
    let options = PgOptions {
        schema: Some(schema.to_owned()),
        ..PgOptions::default()
    };
    let (domain, clock) = (domain(), Arc::new(SystemClock));
    if producer {
        let store = PgProducer::open_with(target, &domain, clock, &options).unwrap();
        store.store_id().clone()
    } else {
        let store = PgConsumer::open_with(target, &domain, clock, &options).unwrap();
        store.store_id().clone()
    }
}

fn stored_id(target: &str, schema: &str) -> Option<String> {
    admin_client(target)
        .query_opt(
            &format!("SELECT value FROM {schema}.ordo_meta WHERE key = 'store_id'"),
            &[],
        )
        .unwrap()
        .map(|row| row.get(0))
}

#[test]
fn every_store_has_an_identity_of_its_own_kept_across_opens() {
    let (_dir, target) = fresh_database();
    let producer = open(&target, true, "ident_p");
    assert_eq!(open(&target, true, "ident_p"), producer, "reopened");
    assert_eq!(
        stored_id(&target, "ident_p").as_deref(),
        Some(producer.as_str())
    );
    let consumer = open(&target, false, "ident_c");
    assert_eq!(open(&target, false, "ident_c"), consumer, "reopened");
    let second_producer = open(&target, true, "ident_p2");
    assert_ne!(producer, consumer);
    assert_ne!(producer, second_producer);
}

#[test]
fn a_second_release_store_is_given_an_identity_at_its_first_open() {
    let (_dir, target) = fresh_database();
    for (producer, schema) in [(true, "ident_p"), (false, "ident_c")] {
        let created = open(&target, producer, schema);
        // The second release's store: its tables at version 5 (no relay
        // stops, a consumer's rows without their delivering store), no
        // identity.
        let rows_without_sender = match producer {
            true => format!(
                "{}
                 ALTER TABLE {schema}.outbox_head DROP COLUMN relay_stop_seq;",
                support::undo_custody(schema)
            ),
            false => format!(
                "{}
                 ALTER TABLE {schema}.inbox DROP COLUMN store_id;
                 ALTER TABLE {schema}.inbox_fingerprint DROP COLUMN store_id;",
                support::undo_producer_namespaces(schema)
            ),
        };
        admin_client(&target)
            .batch_execute(&format!(
                "DELETE FROM {schema}.ordo_meta WHERE key = 'store_id';
                 UPDATE {schema}.ordo_meta SET value = '5' WHERE key = 'schema_version';
                 {rows_without_sender}"
            ))
            .unwrap();
        assert_eq!(stored_id(&target, schema), None);
        let given = open(&target, producer, schema);
        assert_ne!(given, created, "a new identity, not a remembered one");
        assert_eq!(stored_id(&target, schema).as_deref(), Some(given.as_str()));
        assert_eq!(open(&target, producer, schema), given, "kept after");
        let version: String = admin_client(&target)
            .query_one(
                &format!("SELECT value FROM {schema}.ordo_meta WHERE key = 'schema_version'"),
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(version, SCHEMA_VERSION.to_string());
    }
}

#[test]
fn a_damaged_identity_is_refused_as_corrupt() {
    let (_dir, target) = fresh_database();
    open(&target, true, "ident_p");
    admin_client(&target)
        .batch_execute("UPDATE ident_p.ordo_meta SET value = 'not-an-id' WHERE key = 'store_id'")
        .unwrap();
    let options = PgOptions {
        schema: Some("ident_p".into()),
        ..PgOptions::default()
    };
    let err = PgProducer::open_with(&target, &domain(), Arc::new(SystemClock), &options)
        .err()
        .expect("refused");
    assert_eq!(err.kind(), ordo_core::ErrorKind::Corrupt, "{err}");
    assert!(err.to_string().contains("\"not-an-id\""), "{err}");
}

/// The rest of the producer's name is the conformance suite's
/// (`a_producer_is_named_once_and_its_events_carry_the_name`); here, the
/// body that append writes names it and carries the traceparent given.
#[test]
fn append_writes_the_producers_name_and_a_traceparent_into_the_stored_body() {
    use ordo_core::{FlowId, OutboxTx, ProducerName, SchemaVersion};
    let (_dir, target) = fresh_database();
    let options = PgOptions {
        schema: Some("named_p".to_owned()),
        producer_name: Some(ProducerName::new("orders").unwrap()),
        ..PgOptions::default()
    };
    let mut store =
        PgProducer::open_with(&target, &domain(), Arc::new(SystemClock), &options).unwrap();
    let flow = FlowId::new("f").unwrap();
    let event = store
        .write(|tx| tx.append(&flow, "noted", SchemaVersion::V1, &serde_json::json!({})))
        .unwrap();
    assert_eq!(event.producer.as_str(), "orders");
    let body: String = admin_client(&target)
        .query_one("SELECT body FROM named_p.outbox", &[])
        .unwrap()
        .get(0);
    assert!(body.contains(r#""producer":"orders""#), "{body}");
    let text = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let traceparent = ordo_core::TraceParent::parse(text).unwrap();
    let traced = store
        .write(|tx| {
            let payload = serde_json::json!({});
            tx.append_traced(
                &flow,
                "noted",
                SchemaVersion::V1,
                &payload,
                Some(&traceparent),
            )
        })
        .unwrap();
    assert_eq!(traced.traceparent(), Some(traceparent));
    let body: String = admin_client(&target)
        .query_one("SELECT body FROM named_p.outbox WHERE seq = 2", &[])
        .unwrap()
        .get(0);
    let header = format!(r#""headers":{{"traceparent":"{text}"}}"#);
    assert!(body.contains(&header), "{body}");
    let mut untraced = traced.clone();
    untraced.headers.clear();
    assert_ne!(traced.body_hash(), untraced.body_hash());
}
