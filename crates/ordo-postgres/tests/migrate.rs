//! A store created by the first schema version is migrated forward when
//! opened: relay leases for its flows, apply cursors from 0, the list of
//! events not yet accepted; its state is kept.

mod support;

use std::collections::BTreeSet;

use ordo_core::{Clock, ConsumerStore, ProducerStore, SystemClock};
use support::workers::{append, client, consumer, flow, producer};
use support::{database_for, url};

#[test]
fn a_version_1_store_is_migrated_forward_keeping_its_state() {
    let dir = tempfile::tempdir().unwrap();
    let target = url(&database_for(dir.path()));
    {
        let mut source = producer(&target, "before", 60_000);
        let mut inbox = consumer(&target, "before");
        for i in 0..3 {
            let event = append(&mut source, &flow(i)).unwrap();
            inbox.receive(&event).unwrap();
        }
    }
    // Back to version 1, as that version left both schemas.
    let mut c = client(&target);
    c.batch_execute(
        "DROP TABLE ordo_producer.relay_lease;
         UPDATE ordo_producer.ordo_meta SET value = '1' WHERE key = 'schema_version';
         DELETE FROM ordo_testkit.inbox_cursor;
         ALTER TABLE ordo_testkit.inbox_cursor DROP CONSTRAINT inbox_cursor_applied_seq_check;
         ALTER TABLE ordo_testkit.inbox_cursor ADD CONSTRAINT inbox_cursor_applied_seq_check
             CHECK (applied_seq >= 1);
         ALTER TABLE ordo_producer.outbox_head RESET (fillfactor);
         ALTER TABLE ordo_producer.outbox RESET (fillfactor);
         DROP TABLE ordo_producer.outbox_pending;
         CREATE INDEX outbox_unaccepted ON ordo_producer.outbox (position) WHERE NOT accepted;
         ALTER TABLE ordo_testkit.inbox_cursor RESET (fillfactor);
         UPDATE ordo_testkit.ordo_meta SET value = '1' WHERE key = 'schema_version';",
    )
    .unwrap();

    let mut relay_store = producer(&target, "after", 60_000);
    let _inbox = consumer(&target, "after");
    for schema in ["ordo_producer", "ordo_testkit"] {
        let version: String = c
            .query_one(
                &format!("SELECT value FROM {schema}.ordo_meta WHERE key = 'schema_version'"),
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(
            version,
            ordo_postgres::SCHEMA_VERSION.to_string(),
            "{schema}"
        );
    }
    let cursors: i64 = c
        .query_one(
            "SELECT count(*) FROM ordo_testkit.inbox_cursor WHERE applied_seq = 0",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(cursors, 3, "a cursor row per flow with events");
    for table in [
        "ordo_producer.relay_lease",
        "ordo_producer.outbox_head",
        "ordo_producer.outbox",
        "ordo_testkit.inbox_cursor",
    ] {
        let options: Option<Vec<String>> = c
            .query_one(
                &format!("SELECT reloptions FROM pg_class WHERE oid = '{table}'::regclass"),
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(
            options,
            Some(vec!["fillfactor=50".to_owned()]),
            "{table}: room for HOT updates"
        );
    }
    let listed: i64 = c
        .query_one("SELECT count(*) FROM ordo_producer.outbox_pending", &[])
        .unwrap()
        .get(0);
    assert_eq!(listed, 3, "every event not accepted is listed pending");
    assert_eq!(relay_store.pending(10).unwrap().len(), 3);
    let round = relay_store
        .fair_round(10, &BTreeSet::new(), SystemClock.now_ms())
        .unwrap();
    assert_eq!(round.len(), 3, "every flow has its lease row");
    assert_eq!(relay_store.outbox().unwrap().len(), 3, "the outbox is kept");
}
