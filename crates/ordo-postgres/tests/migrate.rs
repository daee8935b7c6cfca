//! A store created by an earlier schema version is migrated forward when
//! opened: relay leases for its flows, apply cursors from 0, the list of
//! events not yet accepted, the leases moved into the heads; its state is
//! kept.

mod support;

use ordo_core::{Clock, ProducerOps, ProducerStore, Receive, SystemClock};
use support::workers::{append, client, consumer, fair_round_now, flow, producer};
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
    c.batch_execute(&support::undo_custody("ordo_producer"))
        .unwrap();
    c.batch_execute(
        "ALTER TABLE ordo_producer.outbox_head DROP COLUMN lease_owner,
             DROP COLUMN lease_fence, DROP COLUMN lease_expires_at_ms,
             DROP COLUMN lease_backend_pid;
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
         ALTER TABLE ordo_producer.outbox_head DROP COLUMN relay_stop_seq;
         ALTER TABLE ordo_testkit.inbox DROP COLUMN store_id;
         ALTER TABLE ordo_testkit.inbox_fingerprint DROP COLUMN store_id;
         UPDATE ordo_testkit.ordo_meta SET value = '1' WHERE key = 'schema_version';",
    )
    .unwrap();
    c.batch_execute(&support::undo_producer_namespaces("ordo_testkit"))
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
        "ordo_producer.relay_head",
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
        .query_one("SELECT count(*) FROM ordo_producer.custody_pending", &[])
        .unwrap()
        .get(0);
    assert_eq!(listed, 3, "every event not accepted is listed pending");
    assert_eq!(relay_store.pending(10).unwrap().len(), 3);
    let round = fair_round_now(&mut relay_store, 10);
    assert_eq!(round.len(), 3, "every flow has its lease");
    assert_eq!(relay_store.outbox().unwrap().len(), 3, "the outbox is kept");
}

/// Version 4 kept the leases in a table of their own: migrated, each
/// head holds its flow's lease as it was (holder, fence, expiry), so that
/// another relay passes the held flow by and the holder's bookkeeping
/// under its fence is still written.
#[test]
fn a_version_4_stores_leases_move_into_the_heads() {
    let dir = tempfile::tempdir().unwrap();
    let target = url(&database_for(dir.path()));
    let mut holder = producer(&target, "holder", 600_000);
    let (held, free) = (flow(7), flow(8));
    let first = append(&mut holder, &held).unwrap();
    let second = append(&mut holder, &free).unwrap();
    let round = fair_round_now(&mut holder, 1);
    assert_eq!(round, std::slice::from_ref(&first));
    let fence = holder.held_flows()[&held];
    let mut c = client(&target);
    c.batch_execute(&support::undo_custody("ordo_producer"))
        .unwrap();
    // Back to version 4: the leases in `relay_lease`, one row per head.
    c.batch_execute(
        "CREATE TABLE ordo_producer.relay_lease (
             flow_id       text   COLLATE \"C\" PRIMARY KEY,
             owner         text,
             fence         bigint NOT NULL DEFAULT 0,
             expires_at_ms bigint NOT NULL DEFAULT 0,
             backend_pid   integer
         ) WITH (fillfactor = 50);
         CREATE INDEX relay_lease_owner ON ordo_producer.relay_lease (owner) WHERE owner IS NOT NULL;
         INSERT INTO ordo_producer.relay_lease (flow_id, owner, fence, expires_at_ms, backend_pid)
             SELECT flow_id, lease_owner, lease_fence, lease_expires_at_ms, lease_backend_pid
             FROM ordo_producer.outbox_head;
         ALTER TABLE ordo_producer.outbox_head DROP COLUMN lease_owner,
             DROP COLUMN lease_fence, DROP COLUMN lease_expires_at_ms,
             DROP COLUMN lease_backend_pid;
         ALTER TABLE ordo_producer.outbox_head DROP COLUMN relay_stop_seq;
         UPDATE ordo_producer.ordo_meta SET value = '4' WHERE key = 'schema_version';",
    )
    .unwrap();
    let before: Vec<(String, Option<String>, i64, i64)> = c
        .query(
            "SELECT flow_id, owner, fence, expires_at_ms FROM ordo_producer.relay_lease
             ORDER BY flow_id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
        .collect();
    assert_eq!(before.len(), 2, "a lease row per flow");
    assert_eq!(
        (before[0].1.as_deref(), before[0].2),
        (Some(holder.owner()), fence),
        "the holder's lease"
    );

    let mut other = producer(&target, "other", 600_000);
    let after: Vec<(String, Option<String>, i64, i64)> = c
        .query(
            "SELECT flow_id, lease_owner, lease_fence, lease_expires_at_ms
             FROM ordo_producer.relay_head ORDER BY flow_id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
        .collect();
    assert_eq!(after, before, "every lease kept, in its head");
    let gone: Option<String> = c
        .query_one("SELECT to_regclass('ordo_producer.relay_lease')::text", &[])
        .unwrap()
        .get(0);
    assert_eq!(gone, None, "the lease table is dropped");

    let round = fair_round_now(&mut other, 10);
    assert_eq!(
        round,
        std::slice::from_ref(&second),
        "the held flow is passed by"
    );
    holder
        .record_receipts(
            &[(first.event_id.clone(), ordo_core::Receipt::Accepted)],
            SystemClock.now_ms(),
        )
        .expect("the holder's fence still holds");
    assert_eq!(
        other.pending(10).unwrap(),
        [second],
        "the held flow's event accepted"
    );
}
