//! The relay heads of several flows are taken in key order by an append,
//! as by a relay's bookkeeping, whatever order the session reads them in;
//! an append of one flow updates its heads without a locking read first.

mod support;

use std::sync::mpsc;
use std::time::Duration;

use ordo_core::{Envelope, ProducerStore};
use ordo_postgres::postgres::Client;
use support::fresh_database_alone;
use support::workers::{append, client, flow, producer, wait_until};

const BOUND: Duration = Duration::from_secs(120);

/// The next event of `flow` at `seq`, built by hand.
fn event(flow: &str, seq: i64) -> Envelope {
    Envelope::parse_str(&format!(
        r#"{{"event_id": "{flow}-{seq}-h", "flow_id": "{flow}", "seq": {seq},
            "schema_version": 1, "type": "t", "payload": {{}}}}"#
    ))
    .unwrap()
}

/// Whether another transaction holds the relay head of `flow` locked.
fn head_locked(checker: &mut Client, flow: &str) -> bool {
    let mut tx = checker.transaction().unwrap();
    let locked = tx
        .query(
            "SELECT 1 FROM ordo_producer.relay_head WHERE flow_id = $1
             FOR NO KEY UPDATE SKIP LOCKED",
            &[&flow],
        )
        .unwrap()
        .is_empty();
    tx.rollback().unwrap();
    locked
}

/// A writer appending to two flows in one batch, in a session told to
/// read every table in storage order (the later flow's head stored
/// first), waits for the first flow's head holding no later one: a relay
/// whose bookkeeping holds the first flow's head and asks for the second
/// never waits for it in a cycle.
#[test]
fn an_append_of_several_flows_takes_their_heads_in_key_order() {
    let (_serial, _dir, target) = fresh_database_alone();
    let storage_order = format!(
        "{target}?options=-c%20enable_indexscan%3Doff%20-c%20enable_bitmapscan%3Doff%20-c%20enable_indexonlyscan%3Doff"
    );
    let mut setup = producer(&target, "setup", 600_000);
    let (first, second) = (flow(1), flow(2));
    append(&mut setup, &second).unwrap();
    append(&mut setup, &first).unwrap();

    // Another transaction holds the first flow's relay head.
    let mut blocker = client(&target);
    let mut held = blocker.transaction().unwrap();
    held.execute(
        "SELECT 1 FROM ordo_producer.relay_head WHERE flow_id = $1 FOR NO KEY UPDATE",
        &[&first.as_str()],
    )
    .unwrap();

    let (done_tx, done) = mpsc::channel();
    let writer = {
        let (storage_order, first, second) = (storage_order.clone(), first.clone(), second.clone());
        std::thread::spawn(move || {
            let mut store = producer(&storage_order, "writer", 600_000);
            let appended =
                store.append_events(&[event(first.as_str(), 2), event(second.as_str(), 2)]);
            done_tx.send(()).unwrap();
            appended
        })
    };
    let mut checker = client(&target);
    wait_until("the writer waits for the first flow's head", BOUND, || {
        checker
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                 AND application_name = 'ordo-relay-writer' AND wait_event_type = 'Lock'",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
            == 1
    });
    assert!(
        !head_locked(&mut checker, second.as_str()),
        "the writer holds the second flow's head while it waits for the first"
    );
    assert!(done.try_recv().is_err(), "the writer waits");
    held.rollback().unwrap();
    writer.join().unwrap().expect("the writer commits");
}

/// An append of one flow moves each of its relay heads: the round finds
/// the new event due.
#[test]
fn an_append_of_one_flow_moves_its_heads() {
    let (_serial, _dir, target) = fresh_database_alone();
    let mut store = producer(&target, "one", 600_000);
    let f = flow(1);
    append(&mut store, &f).unwrap();
    store.append_events(&[event(f.as_str(), 2)]).unwrap();
    let mut checker = client(&target);
    let row = checker
        .query_one(
            "SELECT last_seq, relay_seq FROM ordo_producer.relay_head WHERE flow_id = $1",
            &[&f.as_str()],
        )
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (2, 1));
}
