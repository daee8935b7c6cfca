//! The embedding API: a caller's own state change and its event commit in one
//! producer transaction; a caller's own projection and effect commit in the
//! consumer's apply transaction, or not at all.

use ordo_core::envelope::EventType;
use ordo_core::{
    ApplyOptions, BlockReason, ConsumerStore, DrainStop, Envelope, ErrorKind, EventId, FlowId,
    InboxStatus, ProducerStore, SchemaVersion, Seq, Step, StoreError,
};
use ordo_sqlite::rusqlite::{self, Connection};
use ordo_sqlite::{ApplyHandler, ConsumerDb, ProducerDb};
use serde_json::json;

fn event(flow: &str, seq: i64, kind: &str, amount: i64) -> Envelope {
    Envelope {
        event_id: EventId::new(format!("{flow}-{seq}")).unwrap(),
        flow_id: FlowId::new(flow).unwrap(),
        seq: Seq::new(seq).unwrap(),
        schema_version: SchemaVersion::V1,
        event_type: EventType::new(kind).unwrap(),
        payload: json!({ "amount": amount }).as_object().unwrap().clone(),
    }
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |row| row.get(0)).unwrap()
}

/// The ledger table of the [`Ledger`] handler.
const LEDGER: &str = "CREATE TABLE ledger (event_id TEXT PRIMARY KEY, amount INTEGER NOT NULL)";

/// A consumer file in `dir` with the caller's own tables created by `sql`.
fn consumer_with(dir: &tempfile::TempDir, sql: &str) -> ConsumerDb {
    let consumer = ConsumerDb::open(dir.path().join("consumer.db")).unwrap();
    consumer.connection().execute_batch(sql).unwrap();
    consumer
}

fn sql_err(e: rusqlite::Error) -> StoreError {
    StoreError::with_source(ErrorKind::Other, "test", e)
}

#[test]
fn own_state_and_event_commit_together_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let mut producer = ProducerDb::open(dir.path().join("producer.db")).unwrap();
    producer
        .write(|tx| {
            tx.sql()
                .execute_batch("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")
                .map_err(sql_err)
        })
        .unwrap();

    // Committed together.
    producer
        .write(|tx| {
            tx.sql()
                .execute("INSERT INTO orders VALUES ('o-1', 10)", [])
                .map_err(sql_err)?;
            assert_eq!(tx.last_seq(&FlowId::new("o-1").unwrap())?, 0);
            tx.append(&event("o-1", 1, "placed", 10))
        })
        .unwrap();
    assert_eq!(
        count(producer.connection(), "SELECT count(*) FROM orders"),
        1
    );
    assert_eq!(producer.outbox().unwrap().len(), 1);

    // The caller fails after appending: neither its row nor the event stays.
    let failed: Result<(), StoreError> = producer.write(|tx| {
        tx.sql()
            .execute("UPDATE orders SET total = 99 WHERE id = 'o-1'", [])
            .map_err(sql_err)?;
        tx.append(&event("o-1", 2, "changed", 99))?;
        Err(StoreError::new(
            ErrorKind::Other,
            "the caller changed its mind",
        ))
    });
    assert!(failed.is_err());
    assert_eq!(count(producer.connection(), "SELECT total FROM orders"), 10);
    assert_eq!(producer.outbox().unwrap().len(), 1);

    // A seq that is not the flow's next is refused and nothing is written.
    for wrong in [1, 3] {
        let refused = producer.write(|tx| {
            tx.sql()
                .execute("UPDATE orders SET total = 7 WHERE id = 'o-1'", [])
                .map_err(sql_err)?;
            tx.append(&event("o-1", wrong, "changed", 7))
        });
        let message = refused.unwrap_err().to_string();
        assert!(message.contains("last seq is 1"), "{message}");
    }
    assert_eq!(count(producer.connection(), "SELECT total FROM orders"), 10);
    let outbox = producer.outbox().unwrap();
    assert_eq!(outbox.len(), 1);
    assert_eq!(outbox[0].envelope, event("o-1", 1, "placed", 10));

    // A caller that ignores the refusal and commits commits nothing of it:
    // the refused append leaves no row, and the flow's next seq is still 2.
    for wrong in [1, 3] {
        producer
            .write(|tx| -> Result<(), StoreError> {
                assert!(tx.append(&event("o-1", wrong, "changed", 7)).is_err());
                assert_eq!(tx.last_seq(&FlowId::new("o-1").unwrap())?, 1);
                Ok(())
            })
            .unwrap();
    }
    assert_eq!(producer.outbox().unwrap().len(), 1);
    producer
        .write(|tx| tx.append(&event("o-1", 2, "changed", 7)))
        .unwrap();
    assert_eq!(producer.outbox().unwrap().len(), 2);
}

/// Keeps a running ledger in the consumer file; refuses negative amounts;
/// fails with a storage error on an amount of 13.
struct Ledger;

impl ApplyHandler for Ledger {
    fn apply(
        &mut self,
        tx: &Connection,
        event: &Envelope,
        _options: ApplyOptions,
    ) -> Result<Result<(), BlockReason>, StoreError> {
        let amount = event.payload["amount"].as_i64().unwrap_or(0);
        tx.execute(
            "INSERT INTO ledger (event_id, amount) VALUES (?1, ?2)",
            rusqlite::params![event.event_id.as_str(), amount],
        )
        .map_err(sql_err)?;
        if amount == 13 {
            return Err(StoreError::new(
                ErrorKind::Busy,
                "the ledger service is busy",
            ));
        }
        if amount < 0 {
            return Ok(Err(BlockReason::InvalidPayload));
        }
        Ok(Ok(()))
    }
}

#[test]
fn own_projection_commits_with_the_inbox_mark_or_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut consumer = consumer_with(&dir, LEDGER);
    let flow = FlowId::new("acct").unwrap();
    let events = [
        event("acct", 1, "credit", 5),
        event("acct", 2, "credit", 13),
        event("acct", 3, "debit", -4),
    ];
    consumer.receive_batch(&events).unwrap();
    let options = ApplyOptions::default();

    assert_eq!(
        consumer
            .apply_next_with(&flow, &mut Ledger, options)
            .unwrap(),
        Step::Applied {
            seq: Seq::new(1).unwrap()
        }
    );
    assert_eq!(
        count(consumer.connection(), "SELECT count(*) FROM ledger"),
        1
    );

    // A storage error from the handler rolls the whole apply back.
    let error = consumer
        .apply_next_with(&flow, &mut Ledger, options)
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Busy);
    assert_eq!(
        count(consumer.connection(), "SELECT count(*) FROM ledger"),
        1
    );
    let inbox = consumer.inbox().unwrap();
    assert_eq!(inbox[1].status, InboxStatus::Pending);

    // Skip past it with an explicit repair, then a refusal blocks seq 3 and
    // leaves nothing of the handler's write behind.
    let request = ordo_core::ops::SkipRequest::new(
        flow.clone(),
        Seq::new(2).unwrap(),
        "ledger rejected it".into(),
        "ops".into(),
    )
    .unwrap();
    consumer.skip(&request, 1_000).unwrap().unwrap();
    assert_eq!(
        consumer
            .apply_next_with(&flow, &mut Ledger, options)
            .unwrap(),
        Step::Blocked {
            seq: Seq::new(3).unwrap(),
            reason: BlockReason::InvalidPayload
        }
    );
    assert_eq!(
        count(consumer.connection(), "SELECT count(*) FROM ledger"),
        1
    );
    let statuses: Vec<InboxStatus> = consumer.inbox().unwrap().iter().map(|r| r.status).collect();
    assert_eq!(
        statuses,
        vec![
            InboxStatus::Applied,
            InboxStatus::Skipped,
            InboxStatus::Blocked(BlockReason::InvalidPayload)
        ]
    );
}

/// In a batch, a block undoes only what the handler wrote for the blocked
/// event: the events before it in the batch, of its flow and of others,
/// commit with their writes, and the flows after it are still drained.
#[test]
fn a_block_in_a_batch_undoes_only_the_blocked_events_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut consumer = consumer_with(&dir, LEDGER);
    consumer
        .receive_batch(&[
            event("a", 1, "credit", 5),
            event("a", 2, "credit", 6),
            event("b", 1, "credit", 7),
            event("b", 2, "debit", -1),
            event("b", 3, "credit", 8),
            event("c", 1, "credit", 9),
        ])
        .unwrap();
    let flows: Vec<(FlowId, Option<u64>)> = ["a", "b", "c"]
        .iter()
        .map(|f| (FlowId::new(*f).unwrap(), None))
        .collect();
    let drains = consumer
        .apply_batch_with(&flows, 100, &mut Ledger, ApplyOptions::default())
        .unwrap();
    let stops: Vec<(u64, DrainStop)> = drains.iter().map(|d| (d.applied, d.stop)).collect();
    assert_eq!(
        stops,
        vec![
            (2, DrainStop::Idle),
            (1, DrainStop::Blocked(BlockReason::InvalidPayload)),
            (1, DrainStop::Idle)
        ]
    );
    let ledger: Vec<String> = consumer
        .connection()
        .prepare("SELECT event_id FROM ledger ORDER BY event_id")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(ledger, ["a-1", "a-2", "b-1", "c-1"]);
    let statuses: Vec<(String, InboxStatus)> = consumer
        .inbox()
        .unwrap()
        .into_iter()
        .map(|r| (r.envelope.event_id.as_str().to_owned(), r.status))
        .collect();
    assert_eq!(
        statuses,
        vec![
            ("a-1".to_owned(), InboxStatus::Applied),
            ("a-2".to_owned(), InboxStatus::Applied),
            ("b-1".to_owned(), InboxStatus::Applied),
            (
                "b-2".to_owned(),
                InboxStatus::Blocked(BlockReason::InvalidPayload)
            ),
            ("b-3".to_owned(), InboxStatus::Pending),
            ("c-1".to_owned(), InboxStatus::Applied),
        ]
    );
}

/// Records each event's amount in a table where a repeated amount makes
/// SQLite roll the whole transaction back, and ignores that error.
struct Careless;

impl ApplyHandler for Careless {
    fn apply(
        &mut self,
        tx: &Connection,
        event: &Envelope,
        _options: ApplyOptions,
    ) -> Result<Result<(), BlockReason>, StoreError> {
        let _ = tx.execute(
            "INSERT INTO amounts (event_id, amount) VALUES (?1, ?2)",
            rusqlite::params![event.event_id.as_str(), event.payload["amount"].as_i64()],
        );
        Ok(Ok(()))
    }
}

/// When SQLite ends the transaction under a handler that carries on, the
/// apply fails and nothing of it stands: not the events before it in the
/// batch, not the inbox marks or the cursor written after it.
#[test]
fn a_transaction_ended_under_the_handler_applies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut consumer = consumer_with(
        &dir,
        "CREATE TABLE amounts (event_id TEXT PRIMARY KEY,
                               amount INTEGER UNIQUE ON CONFLICT ROLLBACK);
         INSERT INTO amounts VALUES ('earlier', 7);",
    );
    consumer
        .receive_batch(&[
            event("a", 1, "credit", 1),
            event("a", 2, "credit", 7),
            event("a", 3, "credit", 3),
        ])
        .unwrap();
    let flow = FlowId::new("a").unwrap();
    let statuses = |consumer: &mut ConsumerDb| -> Vec<InboxStatus> {
        consumer.inbox().unwrap().iter().map(|r| r.status).collect()
    };

    // In a batch (no savepoint per event).
    let error = consumer
        .apply_batch_with(
            &[(flow.clone(), None)],
            100,
            &mut Careless,
            ApplyOptions::default(),
        )
        .unwrap_err();
    assert!(error.to_string().contains("transaction ended"), "{error}");
    assert_eq!(statuses(&mut consumer), vec![InboxStatus::Pending; 3]);
    assert_eq!(
        count(consumer.connection(), "SELECT count(*) FROM amounts"),
        1
    );

    // One event at a time (with its savepoint): the first applies, the
    // second fails and leaves it as it was.
    consumer
        .apply_next_with(&flow, &mut Careless, ApplyOptions::default())
        .unwrap();
    let error = consumer
        .apply_next_with(&flow, &mut Careless, ApplyOptions::default())
        .unwrap_err();
    assert!(error.to_string().contains("transaction ended"), "{error}");
    assert_eq!(
        statuses(&mut consumer),
        vec![
            InboxStatus::Applied,
            InboxStatus::Pending,
            InboxStatus::Pending
        ]
    );
    assert_eq!(
        count(consumer.connection(), "SELECT count(*) FROM amounts"),
        2
    );
}

fn synchronous(conn: &Connection) -> i64 {
    conn.query_row("PRAGMA synchronous", [], |row| row.get(0))
        .unwrap()
}

/// The relay's bookkeeping commits with `synchronous=NORMAL` (1); every
/// other write on the producer file, before or after it, runs with `FULL`
/// (2), and the handle counts only those as synced.
#[test]
fn only_delivery_bookkeeping_commits_unsynced() {
    let dir = tempfile::tempdir().unwrap();
    let mut producer = ProducerDb::open(dir.path().join("producer.db")).unwrap();
    let mut consumer = ConsumerDb::open(dir.path().join("consumer.db")).unwrap();
    let in_write = |producer: &mut ProducerDb, seq: i64| {
        producer
            .write(|tx| -> Result<i64, StoreError> {
                tx.append(&event("o-1", seq, "placed", 1))?;
                Ok(synchronous(tx.sql()))
            })
            .unwrap()
    };
    assert_eq!(in_write(&mut producer, 1), 2);
    let (commits, synced) = (producer.commits(), producer.synced_commits());

    let delivered = producer.fair_round(10, &Default::default(), 0).unwrap();
    let receipts = consumer.receive_batch(&delivered).unwrap();
    let receipts: Vec<_> = delivered
        .iter()
        .map(|e| e.event_id.clone())
        .zip(receipts)
        .collect();
    producer.record_receipts(&receipts, 0).unwrap();
    assert_eq!(
        synchronous(producer.connection()),
        1,
        "the marks commit unsynced"
    );
    assert_eq!(producer.commits(), commits + 1);
    assert_eq!(producer.synced_commits(), synced);
    assert_eq!(
        synchronous(consumer.connection()),
        2,
        "receive stays synced"
    );

    // The next write is synced again, inside its transaction.
    assert_eq!(in_write(&mut producer, 2), 2);
    assert_eq!(producer.synced_commits(), synced + 1);
    assert_eq!(
        producer
            .outbox()
            .unwrap()
            .iter()
            .filter(|r| r.accepted)
            .count(),
        1
    );
}
