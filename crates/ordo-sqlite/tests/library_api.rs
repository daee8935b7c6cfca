//! The embedding API on real files: an application's own state change and
//! its events commit in one producer transaction; its handler's writes
//! commit with the inbox mark in the consumer's apply transaction, or not at
//! all; its tables are migrated once, forward, in its own domain; the runner
//! applies everything exactly once across restarts.

use ordo_core::OutboxTx;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ordo_core::envelope::EventType;
use ordo_core::ops::{InboxScope, SkipRequest};
use ordo_core::{
    process_all, AppendError, ApplyContext, ApplyHandler, BlockCode, BlockReason, ConsumerOps,
    ConsumerStore, DrainStop, Envelope, ErrorKind, EventId, FlowId, InboxFlow, InboxStatus,
    ProducerOps, ProducerStore, Receive, SchemaVersion, Seq, Step, StoreError, SystemClock,
    Verdict,
};
use ordo_reservation::{ReservationConsumer, ReservationProducer};
use ordo_runtime::{Runner, RunnerOptions};
use ordo_sqlite::rusqlite::{params, Connection};
use ordo_sqlite::{ConsumerDb, OpenOptions, ProducerDb, Schema};
use serde_json::json;

fn inbox_flow(id: &str) -> InboxFlow {
    InboxFlow::of_default(flow(id))
}

fn flow(id: &str) -> FlowId {
    FlowId::new(id).unwrap()
}

fn seq(value: i64) -> Seq {
    Seq::new(value).unwrap()
}

fn event(flow_id: &str, at: i64, kind: &str, amount: i64) -> Envelope {
    Envelope {
        event_id: EventId::for_seq(&flow(flow_id), seq(at)),
        flow_id: flow(flow_id),
        seq: seq(at),
        schema_version: SchemaVersion::V1,
        event_type: EventType::new(kind).unwrap(),
        payload: json!({ "amount": amount }).as_object().unwrap().clone(),
        producer: ordo_core::ProducerName::default(),
        headers: Default::default(),
    }
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |row| row.get(0)).unwrap()
}

fn strings(conn: &Connection, sql: &str) -> Vec<String> {
    conn.prepare(sql)
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn statuses(consumer: &mut ConsumerDb) -> Vec<(String, InboxStatus)> {
    consumer
        .inbox()
        .unwrap()
        .into_iter()
        .map(|r| (r.envelope.event_id.as_str().to_owned(), r.status))
        .collect()
}

#[track_caller]
fn assert_statuses(consumer: &mut ConsumerDb, expected: &[(&str, InboxStatus)]) {
    let expected: Vec<(String, InboxStatus)> = expected
        .iter()
        .map(|(id, status)| (id.to_string(), status.clone()))
        .collect();
    assert_eq!(statuses(consumer), expected);
}

fn orders_schema() -> Schema {
    Schema::new("orders")
        .unwrap()
        .migration("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER NOT NULL)")
}

/// The consumer side of the tests' ledger domain: one row per applied
/// event, without a key, so that an event applied twice would show twice.
fn ledger_schema() -> Schema {
    Schema::new("ledger").unwrap().migration(
        "CREATE TABLE ledger (event_id TEXT NOT NULL, flow_id TEXT NOT NULL,
                              seq INTEGER NOT NULL, amount INTEGER NOT NULL)",
    )
}

fn ledger_consumer(dir: &Path) -> ConsumerDb {
    ConsumerDb::open(dir.join("consumer.db"), &ledger_schema()).unwrap()
}

const NEGATIVE_AMOUNT: BlockCode = BlockCode::from_static("negative_amount");

/// The status of an event the ledger blocked for its negative amount.
fn negative() -> InboxStatus {
    InboxStatus::Blocked(BlockReason::code(NEGATIVE_AMOUNT))
}

/// Keeps a ledger in the consumer file; blocks negative amounts with its own
/// code; fails with a busy storage error on an amount of 13.
struct Ledger;

impl ApplyHandler<Connection> for Ledger {
    fn apply(
        &mut self,
        tx: &mut ApplyContext<'_, Connection>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        let amount = event.payload["amount"].as_i64().unwrap_or(0);
        tx.execute(
            "INSERT INTO ledger (event_id, flow_id, seq, amount) VALUES (?1, ?2, ?3, ?4)",
            params![
                event.event_id.as_str(),
                event.flow_id.as_str(),
                event.seq.get(),
                amount
            ],
        )?;
        if amount == 13 {
            return Err(StoreError::new(
                ErrorKind::Busy,
                "the ledger service is busy",
            ));
        }
        if amount < 0 {
            return Ok(Verdict::block(NEGATIVE_AMOUNT));
        }
        Ok(Verdict::Apply)
    }
}

#[test]
fn own_state_and_event_commit_together_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let mut producer = ProducerDb::open(dir.path().join("producer.db"), &orders_schema()).unwrap();
    let o1 = flow("o-1");

    // Committed together.
    producer
        .write(|tx| -> Result<(), AppendError> {
            tx.sql()
                .execute("INSERT INTO orders VALUES ('o-1', 10)", [])?;
            assert_eq!(tx.last_seq(&o1)?, 0);
            tx.append_envelope(&event("o-1", 1, "placed", 10))
        })
        .unwrap();
    assert_eq!(
        count(producer.connection(), "SELECT count(*) FROM orders"),
        1
    );
    assert_eq!(producer.outbox().unwrap().len(), 1);

    // The caller fails after appending: neither its row nor the event stays.
    let failed = producer.write(|tx| -> Result<(), StoreError> {
        tx.sql()
            .execute("UPDATE orders SET total = 99 WHERE id = 'o-1'", [])?;
        tx.append(&o1, "changed", SchemaVersion::V1, &json!({ "amount": 99 }))
            .unwrap();
        Err(StoreError::new(
            ErrorKind::Other,
            "the caller changed its mind",
        ))
    });
    assert!(failed.is_err());
    assert_eq!(count(producer.connection(), "SELECT total FROM orders"), 10);
    assert_eq!(producer.outbox().unwrap().len(), 1);

    // A seq that is not the flow's next is refused, and a caller passing the
    // refusal on commits nothing.
    for wrong in [1, 3] {
        let refused = producer.write(|tx| -> Result<(), AppendError> {
            tx.sql()
                .execute("UPDATE orders SET total = 7 WHERE id = 'o-1'", [])?;
            tx.append_envelope(&event("o-1", wrong, "changed", 7))
        });
        match refused {
            Err(AppendError::NotNext {
                flow_id,
                seq: refused_seq,
                last_seq: 1,
            }) => {
                assert_eq!(flow_id, o1);
                assert_eq!(refused_seq, seq(wrong));
            }
            other => panic!("seq {wrong}: {other:?}"),
        }
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
                assert!(tx
                    .append_envelope(&event("o-1", wrong, "changed", 7))
                    .is_err());
                assert_eq!(tx.last_seq(&o1)?, 1);
                Ok(())
            })
            .unwrap();
    }
    assert_eq!(producer.outbox().unwrap().len(), 1);
    producer
        .write(|tx| tx.append_envelope(&event("o-1", 2, "changed", 7)))
        .unwrap();
    assert_eq!(producer.outbox().unwrap().len(), 2);
}

#[test]
fn a_handlers_writes_commit_with_the_inbox_mark_or_roll_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut consumer = ledger_consumer(dir.path());
    let acct = inbox_flow("acct");
    consumer
        .receive_batch(&[
            event("acct", 1, "credit", 5),
            event("acct", 2, "credit", 13),
            event("acct", 3, "debit", -4),
        ])
        .unwrap();

    assert_eq!(
        consumer.apply_next_with(&acct, &mut Ledger).unwrap(),
        Step::Applied { seq: seq(1) }
    );
    assert_eq!(
        count(consumer.connection(), "SELECT count(*) FROM ledger"),
        1
    );

    // An error from the handler rolls the whole apply back.
    let error = consumer.apply_next_with(&acct, &mut Ledger).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Busy);
    assert_eq!(
        count(consumer.connection(), "SELECT count(*) FROM ledger"),
        1
    );
    assert_eq!(consumer.inbox().unwrap()[1].status, InboxStatus::Pending);

    // Skip past it with an explicit repair; then a block on seq 3 leaves
    // nothing of the handler's write behind.
    let request = SkipRequest::new(
        acct.clone(),
        seq(2),
        "ledger rejected it".into(),
        "ops".into(),
    )
    .unwrap();
    consumer.skip(&request).unwrap().unwrap();
    assert_eq!(
        consumer.apply_next_with(&acct, &mut Ledger).unwrap(),
        Step::Blocked {
            seq: seq(3),
            reason: BlockReason::code(NEGATIVE_AMOUNT)
        }
    );
    assert_eq!(
        count(consumer.connection(), "SELECT count(*) FROM ledger"),
        1
    );
    assert_statuses(
        &mut consumer,
        &[
            ("acct-1", InboxStatus::Applied),
            ("acct-2", InboxStatus::Skipped),
            ("acct-3", negative()),
        ],
    );
}

/// In a batch, a block undoes only what the handler wrote for the blocked
/// event: the events before it in the batch, of its flow and of others,
/// commit with their writes, and the flows after it are still drained.
#[test]
fn a_block_in_a_batch_undoes_only_the_blocked_events_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut consumer = ledger_consumer(dir.path());
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
    let flows: Vec<(InboxFlow, Option<u64>)> = ["a", "b", "c"]
        .iter()
        .map(|f| (inbox_flow(f), None))
        .collect();
    let drains = consumer.apply_batch_with(&flows, 100, &mut Ledger).unwrap();
    let stops: Vec<(u64, DrainStop)> = drains.into_iter().map(|d| (d.applied, d.stop)).collect();
    let blocked = BlockReason::code(NEGATIVE_AMOUNT);
    assert_eq!(
        stops,
        vec![
            (2, DrainStop::Idle),
            (1, DrainStop::Blocked(blocked.clone())),
            (1, DrainStop::Idle)
        ]
    );
    assert_eq!(
        strings(
            consumer.connection(),
            "SELECT event_id FROM ledger ORDER BY event_id"
        ),
        ["a-1", "a-2", "b-1", "c-1"]
    );
    assert_statuses(
        &mut consumer,
        &[
            ("a-1", InboxStatus::Applied),
            ("a-2", InboxStatus::Applied),
            ("b-1", InboxStatus::Applied),
            ("b-2", InboxStatus::Blocked(blocked)),
            ("b-3", InboxStatus::Pending),
            ("c-1", InboxStatus::Applied),
        ],
    );
}

/// Records each event's amount in a table where a repeated amount makes
/// SQLite roll the whole transaction back, and ignores that error.
fn careless(tx: &mut ApplyContext<Connection>, event: &Envelope) -> Result<Verdict, StoreError> {
    let _ = tx.execute(
        "INSERT INTO amounts (event_id, amount) VALUES (?1, ?2)",
        params![event.event_id.as_str(), event.payload["amount"].as_i64()],
    );
    Ok(Verdict::Apply)
}

/// When SQLite ends the transaction under a handler that carries on, the
/// apply fails and nothing of it stands: not the events before it in the
/// batch, not the inbox marks or the cursor written after it.
#[test]
fn a_transaction_ended_under_the_handler_applies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema::new("amounts").unwrap().migration(
        "CREATE TABLE amounts (event_id TEXT PRIMARY KEY,
                               amount INTEGER UNIQUE ON CONFLICT ROLLBACK);
         INSERT INTO amounts VALUES ('earlier', 7);",
    );
    let mut consumer = ConsumerDb::open(dir.path().join("consumer.db"), &schema).unwrap();
    consumer
        .receive_batch(&[
            event("a", 1, "credit", 1),
            event("a", 2, "credit", 7),
            event("a", 3, "credit", 3),
        ])
        .unwrap();
    let a = inbox_flow("a");
    let only_statuses = |consumer: &mut ConsumerDb| -> Vec<InboxStatus> {
        statuses(consumer).into_iter().map(|(_, s)| s).collect()
    };

    // In a batch (no savepoint per event).
    let error = consumer
        .apply_batch_with(&[(a.clone(), None)], 100, &mut careless)
        .unwrap_err();
    assert!(error.to_string().contains("transaction ended"), "{error}");
    assert_eq!(only_statuses(&mut consumer), vec![InboxStatus::Pending; 3]);
    assert_eq!(
        count(consumer.connection(), "SELECT count(*) FROM amounts"),
        1
    );

    // One event at a time: the first applies, the second fails and leaves
    // it as it was.
    consumer.apply_next_with(&a, &mut careless).unwrap();
    let error = consumer.apply_next_with(&a, &mut careless).unwrap_err();
    assert!(error.to_string().contains("transaction ended"), "{error}");
    assert_eq!(
        only_statuses(&mut consumer),
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
    let mut producer = ProducerDb::open(dir.path().join("producer.db"), &orders_schema()).unwrap();
    let mut consumer = ledger_consumer(dir.path());
    let in_write = |producer: &mut ProducerDb| {
        producer
            .write(|tx| -> Result<i64, AppendError> {
                tx.append(
                    &flow("o-1"),
                    "placed",
                    SchemaVersion::V1,
                    &json!({ "amount": 1 }),
                )?;
                Ok(synchronous(tx.sql()))
            })
            .unwrap()
    };
    assert_eq!(in_write(&mut producer), 2);
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
    assert_eq!(in_write(&mut producer), 2);
    assert_eq!(producer.synced_commits(), synced + 1);
    let accepted = producer.outbox().unwrap();
    assert_eq!(accepted.iter().filter(|r| r.accepted).count(), 1);
}

const OVER_LIMIT: BlockCode = BlockCode::from_static("over_limit");

/// Blocks amounts over 100 with its own code and a detail naming the amount.
fn limit_handler(
    _tx: &mut ApplyContext<Connection>,
    event: &Envelope,
) -> Result<Verdict, StoreError> {
    let amount = event.payload["amount"].as_i64().unwrap_or(0);
    if amount > 100 {
        let detail = if amount > 1_000 {
            "é".repeat(600)
        } else {
            format!("amount {amount} exceeds 100")
        };
        return Ok(Verdict::block_with(OVER_LIMIT, detail));
    }
    Ok(Verdict::Apply)
}

#[test]
fn a_custom_block_code_and_detail_are_stored_and_listed_with_the_body_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let mut consumer = ledger_consumer(dir.path());
    let over = event("a", 1, "credit", 500);
    let long = event("b", 1, "credit", 5_000);
    consumer
        .receive_batch(&[over.clone(), long.clone(), event("c", 1, "credit", 5)])
        .unwrap();
    let reason = BlockReason::with_detail(OVER_LIMIT, "amount 500 exceeds 100");
    assert_eq!(
        consumer
            .apply_next_with(&inbox_flow("a"), &mut limit_handler)
            .unwrap(),
        Step::Blocked {
            seq: seq(1),
            reason: reason.clone()
        }
    );
    process_all(&mut consumer, None, &mut limit_handler, 100).unwrap();

    // Detail past 1,000 bytes is cut at a character boundary.
    let cut = BlockReason::with_detail(OVER_LIMIT, "é".repeat(500));
    let blocked = consumer.inbox_entries(true, InboxScope::All, 10).unwrap();
    let listed: Vec<(Envelope, InboxStatus)> = blocked
        .into_iter()
        .map(|e| (e.envelope, e.status))
        .collect();
    assert_eq!(
        listed,
        vec![
            (over.clone(), InboxStatus::Blocked(reason.clone())),
            (long.clone(), InboxStatus::Blocked(cut.clone())),
        ]
    );
    let one = consumer
        .inbox_entries(false, InboxScope::Flow(&inbox_flow("a")), 10)
        .unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].envelope.stored_text(), over.stored_text());
    assert_eq!(one[0].settled_at_ms, None);
    assert_statuses(
        &mut consumer,
        &[
            ("a-1", InboxStatus::Blocked(reason)),
            ("b-1", InboxStatus::Blocked(cut)),
            ("c-1", InboxStatus::Applied),
        ],
    );
    let stored = strings(
        consumer.connection(),
        "SELECT reason || ':' || length(detail) FROM inbox WHERE status = 'blocked' ORDER BY flow_id",
    );
    assert_eq!(stored, ["over_limit:22", "over_limit:500"]);
}

const UNKNOWN_VERSION: BlockCode = BlockCode::from_static("unknown_version");

/// Knows schema 1, and schema 2 once it has `learned` it; then it asks for
/// the rows it blocked for an unknown version to be evaluated again. Records
/// every event it is offered.
struct Versioned {
    learned: bool,
    offered: Vec<String>,
}

const REEVALUATED: [BlockCode; 1] = [UNKNOWN_VERSION];

fn distinct(ids: &[String]) -> Vec<&str> {
    let set: std::collections::BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    set.into_iter().collect()
}

impl ApplyHandler<Connection> for Versioned {
    fn apply(
        &mut self,
        tx: &mut ApplyContext<'_, Connection>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        self.offered.push(event.event_id.as_str().to_owned());
        if event.schema_version != SchemaVersion::V1 && !self.learned {
            return Ok(Verdict::block_with(
                UNKNOWN_VERSION,
                format!("schema {}", event.schema_version),
            ));
        }
        Ledger.apply(tx, event)
    }

    fn reevaluate(&self) -> &[BlockCode] {
        if self.learned {
            &REEVALUATED
        } else {
            &[]
        }
    }
}

#[test]
fn rows_blocked_with_a_code_the_handler_reevaluates_are_offered_again_and_others_stay_blocked() {
    let dir = tempfile::tempdir().unwrap();
    let mut consumer = ledger_consumer(dir.path());
    let v2 = |flow_id: &str| Envelope {
        schema_version: SchemaVersion::V2,
        ..event(flow_id, 1, "credit", 3)
    };
    consumer
        .receive_batch(&[
            v2("a"),
            event("a", 2, "credit", 4),
            event("b", 1, "debit", -1),
            event("c", 1, "credit", 1),
            v2("d"),
        ])
        .unwrap();
    let mut old = Versioned {
        learned: false,
        offered: Vec::new(),
    };
    process_all(&mut consumer, None, &mut old, 100).unwrap();
    // A batch that blocks runs again, so an event may be offered twice.
    assert_eq!(distinct(&old.offered), ["a-1", "b-1", "c-1", "d-1"]);
    let calls = old.offered.len();
    // `a` has a pending event behind its block; `b` and `d` are listed only
    // for the codes asked for.
    assert_eq!(consumer.flows_with_work(&[]).unwrap(), [inbox_flow("a")]);
    assert_eq!(
        consumer.flows_with_work(&[UNKNOWN_VERSION]).unwrap(),
        [inbox_flow("a"), inbox_flow("d")]
    );
    assert_eq!(
        consumer.flows_with_work(&[NEGATIVE_AMOUNT]).unwrap(),
        [inbox_flow("a"), inbox_flow("b")]
    );
    // Without the code among the handler's, nothing is offered again.
    process_all(&mut consumer, None, &mut old, 100).unwrap();
    assert_eq!(old.offered.len(), calls);

    let mut new = Versioned {
        learned: true,
        offered: Vec::new(),
    };
    let drains = process_all(&mut consumer, None, &mut new, 100).unwrap();
    assert_eq!(
        distinct(&new.offered),
        ["a-1", "a-2", "d-1"],
        "b-1 is not offered again"
    );
    let drains: Vec<(String, u64, DrainStop)> = drains
        .into_iter()
        .map(|d| (d.flow.flow_id.as_str().to_owned(), d.applied, d.stop))
        .collect();
    assert_eq!(
        drains,
        [
            ("a".to_owned(), 2, DrainStop::Idle),
            ("d".to_owned(), 1, DrainStop::Idle)
        ]
    );
    assert_statuses(
        &mut consumer,
        &[
            ("a-1", InboxStatus::Applied),
            ("a-2", InboxStatus::Applied),
            ("b-1", negative()),
            ("c-1", InboxStatus::Applied),
            ("d-1", InboxStatus::Applied),
        ],
    );
    assert_eq!(
        consumer.flows_with_work(new.reevaluate()).unwrap(),
        Vec::<InboxFlow>::new()
    );
    assert_eq!(
        consumer.flows_with_work(&[NEGATIVE_AMOUNT]).unwrap(),
        [inbox_flow("b")]
    );
    assert_eq!(
        strings(
            consumer.connection(),
            "SELECT event_id FROM ledger ORDER BY event_id"
        ),
        ["a-1", "a-2", "c-1", "d-1"]
    );
}

/// A handler that writes to a table the application never created: its
/// SQLite error goes through `?` and fails the apply.
fn missing_table(
    tx: &mut ApplyContext<Connection>,
    _event: &Envelope,
) -> Result<Verdict, StoreError> {
    tx.execute(
        "INSERT INTO ledger (event_id, flow_id, seq, amount) VALUES ('x', 'x', 1, 1)",
        [],
    )?;
    tx.execute("INSERT INTO no_such_table VALUES (1)", [])?;
    Ok(Verdict::Apply)
}

#[test]
fn question_mark_works_on_sqlite_errors_and_a_locked_database_is_busy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("producer.db");
    let short = OpenOptions {
        busy_timeout: Duration::from_millis(50),
        ..OpenOptions::default()
    };
    let mut producer =
        ProducerDb::open_with(&path, &orders_schema(), Arc::new(SystemClock), &short).unwrap();

    // In the application's own code: the error ends the write, nothing of it
    // is kept.
    let error = producer
        .write(|tx| -> Result<(), StoreError> {
            tx.sql()
                .execute("INSERT INTO orders VALUES ('o-1', 1)", [])?;
            tx.sql()
                .execute("INSERT INTO orders VALUES ('o-1', 2)", [])?;
            Ok(())
        })
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Other, "{error}");
    assert!(error.to_string().contains("UNIQUE"), "{error}");
    assert_eq!(
        count(producer.connection(), "SELECT count(*) FROM orders"),
        0
    );

    // In a handler: the apply fails and nothing is marked or kept.
    let mut consumer = ledger_consumer(dir.path());
    consumer.receive(&event("a", 1, "credit", 1)).unwrap();
    let error = consumer
        .apply_next_with(&inbox_flow("a"), &mut missing_table)
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Other);
    assert!(error.to_string().contains("no_such_table"), "{error}");
    assert_eq!(
        count(consumer.connection(), "SELECT count(*) FROM ledger"),
        0
    );
    assert_eq!(consumer.inbox().unwrap()[0].status, InboxStatus::Pending);

    // A write lock held by another connection: the application's own
    // statement on a second connection, and ordo's write, both fail busy.
    let holder = Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let other = Connection::open(&path).unwrap();
    other.busy_timeout(Duration::ZERO).unwrap();
    let own = (|| -> Result<(), StoreError> {
        other.execute("INSERT INTO orders VALUES ('o-2', 2)", [])?;
        Ok(())
    })()
    .unwrap_err();
    assert_eq!(own.kind(), ErrorKind::Busy, "{own}");
    let error = producer
        .write(|tx| tx.append(&flow("o-3"), "placed", SchemaVersion::V1, &json!({})))
        .unwrap_err();
    assert_eq!(
        match &error {
            AppendError::Store(e) => Some(e.kind()),
            _ => None,
        },
        Some(ErrorKind::Busy),
        "{error}"
    );
    holder.execute_batch("ROLLBACK").unwrap();
    producer
        .write(|tx| tx.append(&flow("o-3"), "placed", SchemaVersion::V1, &json!({})))
        .unwrap();
    assert_eq!(producer.outbox().unwrap().len(), 1);
}

#[test]
fn append_allocates_the_next_seq_and_the_id_of_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let mut producer = ProducerDb::open(dir.path().join("producer.db"), &orders_schema()).unwrap();
    let short = flow("flow");
    let appended = producer
        .write(|tx| -> Result<Vec<Envelope>, AppendError> {
            (0..3)
                .map(|i| tx.append(&short, "placed", SchemaVersion::V1, &json!({ "i": i })))
                .collect()
        })
        .unwrap();
    let ids: Vec<&str> = appended.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids, ["flow-1", "flow-2", "flow-3"]);
    let seqs: Vec<i64> = appended.iter().map(|e| e.seq.get()).collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!(appended[2].payload["i"], json!(2));

    // 98 characters: `FLOW-SEQ` fits up to seq 9, from seq 10 the id is
    // `h` and a hash.
    let long = flow(&"x".repeat(98));
    for _ in 0..10 {
        producer
            .write(|tx| tx.append(&long, "placed", SchemaVersion::V2, &json!({})))
            .unwrap();
    }
    let outbox = producer.outbox().unwrap();
    let long_ids: Vec<String> = outbox
        .iter()
        .filter(|r| r.envelope.flow_id == long)
        .map(|r| r.envelope.event_id.as_str().to_owned())
        .collect();
    assert_eq!(long_ids.len(), 10);
    assert_eq!(long_ids[8], format!("{long}-9"));
    let tenth = &long_ids[9];
    assert!(tenth.starts_with('h') && tenth.len() == 65, "{tenth}");
    assert_eq!(tenth, EventId::for_seq(&long, seq(10)).as_str());
    for record in &outbox {
        let e = &record.envelope;
        assert_eq!(e.event_id, EventId::for_seq(&e.flow_id, e.seq));
    }
}

#[test]
fn a_payload_that_is_not_an_object_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut producer = ProducerDb::open(dir.path().join("producer.db"), &orders_schema()).unwrap();
    let o1 = flow("o-1");
    let payloads = [json!(42), json!("text"), json!([1, 2]), json!(null)];
    for payload in &payloads {
        // Passed on: the caller's own write goes too.
        let refused = producer.write(|tx| -> Result<Envelope, AppendError> {
            tx.sql()
                .execute("INSERT INTO orders VALUES ('o-1', 1)", [])?;
            tx.append(&o1, "placed", SchemaVersion::V1, payload)
        });
        assert!(
            matches!(refused, Err(AppendError::Invalid(_))),
            "{refused:?}"
        );
        // Ignored: the caller's own write commits, the event does not exist.
        producer
            .write(|tx| -> Result<(), StoreError> {
                let refused = tx.append(&o1, "placed", SchemaVersion::V1, payload);
                assert!(
                    matches!(refused, Err(AppendError::Invalid(_))),
                    "{refused:?}"
                );
                assert_eq!(tx.last_seq(&o1)?, 0);
                Ok(())
            })
            .unwrap();
    }
    let refused = producer.write(|tx| tx.append(&o1, "", SchemaVersion::V1, &json!({})));
    assert!(
        matches!(refused, Err(AppendError::Invalid(_))),
        "{refused:?}"
    );
    assert_eq!(
        count(producer.connection(), "SELECT count(*) FROM orders"),
        0
    );
    assert!(producer.outbox().unwrap().is_empty());
    let first = producer
        .write(|tx| tx.append(&o1, "placed", SchemaVersion::V1, &json!({ "total": 1 })))
        .unwrap();
    assert_eq!(first.event_id.as_str(), "o-1-1");
}

#[test]
fn append_envelope_refusals_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    let mut producer = ProducerDb::open(dir.path().join("producer.db"), &orders_schema()).unwrap();
    producer
        .write(|tx| tx.append_envelope(&event("a", 1, "placed", 1)))
        .unwrap();
    let refused = |producer: &mut ProducerDb, event: Envelope| {
        producer.write(|tx| tx.append_envelope(&event)).unwrap_err()
    };
    match refused(&mut producer, event("a", 1, "placed", 2)) {
        AppendError::NotNext {
            flow_id,
            seq: at,
            last_seq: 1,
        } => assert_eq!((flow_id, at), (flow("a"), seq(1))),
        other => panic!("{other:?}"),
    }
    match refused(&mut producer, event("a", 5, "placed", 2)) {
        AppendError::NotNext {
            seq: at,
            last_seq: 1,
            ..
        } => assert_eq!(at, seq(5)),
        other => panic!("{other:?}"),
    }
    // The right seq of another flow, under an id already used.
    let reused = Envelope {
        event_id: EventId::new("a-1").unwrap(),
        ..event("b", 1, "placed", 1)
    };
    match refused(&mut producer, reused) {
        AppendError::EventIdUsed(id) => assert_eq!(id.as_str(), "a-1"),
        other => panic!("{other:?}"),
    }
    match refused(&mut producer, event("b", 2, "placed", 1)) {
        AppendError::NotNext { last_seq: 0, .. } => {}
        other => panic!("{other:?}"),
    }
    let outbox = producer.outbox().unwrap();
    assert_eq!(outbox.len(), 1);
    producer
        .write(|tx| tx.append_envelope(&event("b", 1, "placed", 1)))
        .unwrap();
}

#[test]
fn a_refused_append_leaves_the_transaction_able_to_append_at_that_seq() {
    let dir = tempfile::tempdir().unwrap();
    let mut producer = ProducerDb::open(dir.path().join("producer.db"), &orders_schema()).unwrap();
    let used = |e: Envelope| Envelope {
        event_id: EventId::new("a-1").unwrap(),
        ..e
    };
    producer
        .write(|tx| {
            tx.append_envelope(&event("a", 1, "placed", 1))?;
            // A used id, at a new flow's seq 1 and at an existing flow's
            // next seq: each refused, its head left where it was, so the
            // same seqs are free for the next appends of this transaction.
            for e in [event("b", 1, "placed", 1), event("a", 2, "placed", 1)] {
                match tx.append_envelope(&used(e)) {
                    Err(AppendError::EventIdUsed(id)) => assert_eq!(id.as_str(), "a-1"),
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(tx.last_seq(&flow("a")).unwrap(), 1);
            assert_eq!(tx.last_seq(&flow("b")).unwrap(), 0);
            tx.append_envelope(&event("b", 1, "placed", 1))?;
            tx.append_envelope(&event("a", 2, "placed", 1))
        })
        .unwrap();
    let outbox: Vec<(String, i64)> = (producer.outbox().unwrap().into_iter())
        .map(|r| (r.envelope.flow_id.to_string(), r.envelope.seq.get()))
        .collect();
    assert_eq!(outbox, [("a".into(), 1), ("b".into(), 1), ("a".into(), 2)]);
}

#[test]
fn a_head_rolled_back_to_a_savepoint_is_never_moved_for_another_flow() {
    let dir = tempfile::tempdir().unwrap();
    let mut producer = ProducerDb::open(dir.path().join("producer.db"), &orders_schema()).unwrap();
    producer
        .write(|tx| {
            tx.sql().execute_batch("SAVEPOINT app").unwrap();
            tx.append_envelope(&event("x", 1, "placed", 1))?;
            assert_eq!(tx.last_seq(&flow("x")).unwrap(), 1);
            // The application undoes its own work, x's new head with it;
            // y's head then takes the key x's had.
            tx.sql()
                .execute_batch("ROLLBACK TO app; RELEASE app")
                .unwrap();
            tx.append_envelope(&event("y", 1, "placed", 1))?;
            match tx.append_envelope(&event("x", 2, "placed", 1)) {
                Err(AppendError::NotNext { last_seq: 0, .. }) => {}
                other => panic!("{other:?}"),
            }
            assert_eq!(tx.last_seq(&flow("y")).unwrap(), 1);
            Ok::<_, AppendError>(())
        })
        .unwrap();
    let heads: Vec<(String, i64, i64)> = producer
        .connection()
        .prepare("SELECT flow_id, flow, last_seq FROM outbox_head ORDER BY flow")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(heads, [("y".to_owned(), 1, 1)]);
}

#[test]
fn two_writers_racing_on_one_flow_get_contiguous_seqs_and_the_ids_of_the_rule() {
    const EACH: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("producer.db");
    drop(ProducerDb::open(&path, &orders_schema()).unwrap());
    let race = flow("race");
    let writers: Vec<_> = (0..2)
        .map(|writer| {
            let path = path.clone();
            let race = race.clone();
            std::thread::spawn(move || -> Vec<Envelope> {
                let mut producer = ProducerDb::open(&path, &orders_schema()).unwrap();
                (0..EACH)
                    .map(|i| {
                        producer
                            .write(|tx| {
                                tx.append(
                                    &race,
                                    "placed",
                                    SchemaVersion::V1,
                                    &json!({ "writer": writer, "i": i }),
                                )
                            })
                            .unwrap()
                    })
                    .collect()
            })
        })
        .collect();
    let mut returned: Vec<Envelope> = writers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    returned.sort_by_key(|e| e.seq);

    let producer = ProducerDb::open(&path, &orders_schema());
    let outbox = producer.unwrap().outbox().unwrap();
    let stored: Vec<Envelope> = outbox.into_iter().map(|r| r.envelope).collect();
    assert_eq!(stored.len(), 2 * EACH);
    let seqs: Vec<i64> = stored.iter().map(|e| e.seq.get()).collect();
    assert_eq!(seqs, (1..=(2 * EACH) as i64).collect::<Vec<_>>());
    for e in &stored {
        assert_eq!(e.event_id.as_str(), format!("race-{}", e.seq));
    }
    assert_eq!(returned, stored, "each writer got back what was committed");
    for writer in 0..2 {
        let is: Vec<i64> = stored
            .iter()
            .filter(|e| e.payload["writer"] == json!(writer))
            .map(|e| e.payload["i"].as_i64().unwrap())
            .collect();
        assert_eq!(is, (0..EACH as i64).collect::<Vec<_>>(), "writer {writer}");
    }
}

fn meta(conn: &Connection, key: &str) -> Option<String> {
    conn.query_row("SELECT value FROM ordo_meta WHERE key = ?1", [key], |row| {
        row.get(0)
    })
    .ok()
}

#[test]
fn migrations_run_once_each_in_order_and_later_only_the_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("consumer.db");
    // Without `IF NOT EXISTS`: a migration run twice fails the open.
    let v1 = Schema::new("ledger")
        .unwrap()
        .migration("CREATE TABLE runs (n INTEGER NOT NULL); INSERT INTO runs VALUES (1);");
    let v2 = v1.clone().migration("INSERT INTO runs VALUES (2)");
    for _ in 0..2 {
        let consumer = ConsumerDb::open(&path, &v1).unwrap();
        assert_eq!(consumer.domain(), "ledger");
        assert_eq!(
            strings(consumer.connection(), "SELECT CAST(n AS TEXT) FROM runs"),
            ["1"]
        );
        assert_eq!(
            meta(consumer.connection(), "domain_version").as_deref(),
            Some("1")
        );
    }
    for _ in 0..2 {
        let consumer = ConsumerDb::open(&path, &v2).unwrap();
        assert_eq!(
            strings(
                consumer.connection(),
                "SELECT CAST(n AS TEXT) FROM runs ORDER BY n"
            ),
            ["1", "2"]
        );
        assert_eq!(
            meta(consumer.connection(), "domain_version").as_deref(),
            Some("2")
        );
    }
    // The same on the producer side, where a failed migration creates
    // nothing.
    let producer_path = dir.path().join("producer.db");
    let broken = v1.clone().migration("INSERT INTO no_such_table VALUES (1)");
    drop(ProducerDb::open(&producer_path, &v1).unwrap());
    let error = ProducerDb::open(&producer_path, &broken).err().unwrap();
    assert!(error.to_string().contains("migration 2"), "{error}");
    let producer = ProducerDb::open(&producer_path, &v2).unwrap();
    assert_eq!(
        strings(
            producer.connection(),
            "SELECT CAST(n AS TEXT) FROM runs ORDER BY n"
        ),
        ["1", "2"]
    );
}

#[test]
fn a_store_of_another_domain_or_of_newer_tables_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let consumer_path = dir.path().join("consumer.db");
    let producer_path = dir.path().join("producer.db");
    let v2 = Schema::new("ledger")
        .unwrap()
        .migration("CREATE TABLE runs (n INTEGER NOT NULL)")
        .migration("INSERT INTO runs VALUES (2)");
    drop(ConsumerDb::open(&consumer_path, &v2).unwrap());
    drop(ProducerDb::open(&producer_path, &v2).unwrap());
    let tables = |path: &Path| {
        let conn = Connection::open(path).unwrap();
        (
            strings(&conn, "SELECT name FROM sqlite_master ORDER BY name"),
            strings(
                &conn,
                "SELECT key || '=' || value FROM ordo_meta ORDER BY key",
            ),
            strings(&conn, "SELECT CAST(n AS TEXT) FROM runs"),
        )
    };
    let before = (tables(&consumer_path), tables(&producer_path));

    let other = Schema::new("shipping")
        .unwrap()
        .migration("CREATE TABLE shipments (id TEXT)");
    let older = Schema::new("ledger")
        .unwrap()
        .migration("CREATE TABLE runs (n INTEGER NOT NULL)");
    for schema in [&other, &older] {
        let consumer = ConsumerDb::open(&consumer_path, schema).err().unwrap();
        let producer = ProducerDb::open(&producer_path, schema).err().unwrap();
        for error in [consumer, producer] {
            assert_eq!(error.kind(), ErrorKind::Incompatible, "{error}");
        }
    }
    assert_eq!((tables(&consumer_path), tables(&producer_path)), before);
    assert!(!before.0 .0.contains(&"shipments".to_owned()));
    // Its own domain still opens, and so does any operation without one.
    assert_eq!(
        ConsumerDb::open(&consumer_path, &v2).unwrap().domain(),
        "ledger"
    );
    let existing = ConsumerDb::open_existing(
        &consumer_path,
        Arc::new(SystemClock),
        &OpenOptions::default(),
    );
    assert_eq!(existing.unwrap().domain(), "ledger");
}

/// The first release's consumer tables, as it created them (after the
/// header [`first_release_file`] writes).
const FIRST_RELEASE_CONSUMER: &str = "
CREATE TABLE IF NOT EXISTS inbox (
    event_id       TEXT    PRIMARY KEY,
    flow_id        TEXT    NOT NULL,
    seq            INTEGER NOT NULL CHECK (seq >= 1),
    schema_version INTEGER NOT NULL,
    type           TEXT    NOT NULL,
    body           TEXT    NOT NULL,
    body_hash      TEXT    NOT NULL,
    status         TEXT    NOT NULL CHECK (status = 'pending' OR status = 'applied'
                                           OR status = 'blocked' OR status = 'skipped'),
    reason         TEXT,
    received_at_ms INTEGER NOT NULL,
    settled_at_ms  INTEGER,
    UNIQUE (flow_id, seq),
    CHECK ((status = 'blocked') = (reason IS NOT NULL))
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS inbox_pending ON inbox (flow_id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS inbox_blocked ON inbox (flow_id) WHERE status = 'blocked';
CREATE TABLE IF NOT EXISTS inbox_cursor (
    flow_id     TEXT    PRIMARY KEY,
    applied_seq INTEGER NOT NULL CHECK (applied_seq >= 1)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS projection (
    flow_id     TEXT    PRIMARY KEY,
    state       TEXT    NOT NULL,
    quantity    INTEGER NOT NULL,
    applied_seq INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inbox_fingerprint (
    flow_id   TEXT    NOT NULL,
    seq       INTEGER NOT NULL,
    event_id  TEXT    NOT NULL UNIQUE,
    body_hash BLOB    NOT NULL CHECK (length(body_hash) = 32),
    status    TEXT    NOT NULL CHECK (status IN ('applied', 'skipped')),
    PRIMARY KEY (flow_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inbox_watermark (
    flow_id    TEXT    PRIMARY KEY,
    pruned_seq INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS repair_log (
    id         INTEGER PRIMARY KEY,
    action     TEXT    NOT NULL,
    flow_id    TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    event_id   TEXT    NOT NULL,
    reason     TEXT    NOT NULL,
    decided_by TEXT    NOT NULL,
    at_ms      INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS repair_log_append_only_update BEFORE UPDATE ON repair_log
BEGIN SELECT RAISE(ABORT, 'repair_log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS repair_log_append_only_delete BEFORE DELETE ON repair_log
BEGIN SELECT RAISE(ABORT, 'repair_log is append-only'); END;
CREATE TABLE IF NOT EXISTS effect (
    flow_id  TEXT    NOT NULL,
    seq      INTEGER NOT NULL,
    event_id TEXT    NOT NULL,
    PRIMARY KEY (flow_id, seq)
) WITHOUT ROWID;
";

/// The first release's producer tables, as it created them (after the
/// header [`first_release_file`] writes).
const FIRST_RELEASE_PRODUCER: &str = "
CREATE TABLE IF NOT EXISTS outbox (
    position           INTEGER PRIMARY KEY,
    event_id           TEXT    NOT NULL UNIQUE,
    flow_id            TEXT    NOT NULL,
    seq                INTEGER NOT NULL CHECK (seq >= 1),
    schema_version     INTEGER NOT NULL,
    type               TEXT    NOT NULL,
    body               TEXT    NOT NULL,
    created_at_ms      INTEGER NOT NULL,
    accepted           INTEGER NOT NULL DEFAULT 0 CHECK (accepted IN (0, 1)),
    accepted_at_ms     INTEGER,
    quarantined        INTEGER NOT NULL DEFAULT 0 CHECK (quarantined IN (0, 1)),
    quarantine_reason  TEXT,
    attempts           INTEGER NOT NULL DEFAULT 0,
    last_outcome       TEXT,
    last_error         TEXT,
    next_attempt_at_ms INTEGER NOT NULL DEFAULT 0,
    UNIQUE (flow_id, seq),
    CHECK (NOT (accepted = 1 AND quarantined = 1))
);
CREATE INDEX IF NOT EXISTS outbox_unaccepted ON outbox (position) WHERE accepted = 0;
CREATE TABLE IF NOT EXISTS outbox_head (
    flow_id      TEXT    PRIMARY KEY,
    last_seq     INTEGER NOT NULL CHECK (last_seq >= 1),
    relay_seq    INTEGER,
    relay_due_ms INTEGER NOT NULL DEFAULT 0,
    relay_turn   INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS outbox_head_relay ON outbox_head (relay_turn, flow_id) WHERE relay_seq IS NOT NULL;
CREATE TABLE IF NOT EXISTS flow (
    flow_id  TEXT    PRIMARY KEY,
    state    TEXT    NOT NULL,
    quantity INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO ordo_meta (key, value) VALUES ('relay_turn', 0);
";

/// A reservation event as the first release wrote it (schema 1).
fn reservation(flow_id: &str, at: i64, state: &str, amount: i64) -> Envelope {
    event(flow_id, at, state, amount)
}

/// A file as the first release created it for `role`: its meta table, its
/// version, then its `tables`.
fn first_release_file(path: &Path, role: &str, tables: &str) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
        .unwrap();
    conn.execute_batch(&format!(
        "CREATE TABLE ordo_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
         INSERT INTO ordo_meta (key, value) VALUES ('role', '{role}');
         PRAGMA user_version = 1;"
    ))
    .unwrap();
    conn.execute_batch(tables).unwrap();
    conn
}

#[test]
fn a_first_release_consumer_store_opens_as_reservation_and_applying_continues() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("consumer.db");
    let rows = [
        (reservation("r1", 1, "reserved", 5), "applied", None),
        (reservation("r1", 2, "confirmed", 5), "pending", None),
        (
            reservation("r2", 1, "reserved", 0),
            "blocked",
            Some("invalid_payload"),
        ),
    ];
    {
        let conn = first_release_file(&path, "consumer", FIRST_RELEASE_CONSUMER);
        for (e, status, reason) in &rows {
            conn.execute(
                "INSERT INTO inbox (event_id, flow_id, seq, schema_version, type, body, body_hash,
                                    status, reason, received_at_ms, settled_at_ms)
                 VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6, ?7, ?8, 1000, ?9)",
                params![
                    e.event_id.as_str(),
                    e.flow_id.as_str(),
                    e.seq.get(),
                    e.event_type.as_str(),
                    e.stored_text(),
                    e.body_hash().as_str(),
                    status,
                    reason,
                    (*status == "applied").then_some(1_001),
                ],
            )
            .unwrap();
        }
        conn.execute_batch(
            "INSERT INTO inbox_cursor VALUES ('r1', 1);
             INSERT INTO projection VALUES ('r1', 'reserved', 5, 1);
             INSERT INTO effect VALUES ('r1', 1, 'r1-1');",
        )
        .unwrap();
    }
    let expected = |r1_2: InboxStatus| {
        vec![
            ("r1-1".to_owned(), InboxStatus::Applied),
            ("r1-2".to_owned(), r1_2),
            (
                "r2-1".to_owned(),
                InboxStatus::Blocked(BlockReason::code(
                    BlockCode::new("invalid_payload").unwrap(),
                )),
            ),
        ]
    };

    let mut existing =
        ConsumerDb::open_existing(&path, Arc::new(SystemClock), &OpenOptions::default()).unwrap();
    assert_eq!(existing.domain(), ordo_sqlite::FIRST_RELEASE_DOMAIN);
    assert_eq!(statuses(&mut existing), expected(InboxStatus::Pending));
    let bodies: Vec<Envelope> = existing
        .inbox()
        .unwrap()
        .into_iter()
        .map(|r| r.envelope)
        .collect();
    assert_eq!(bodies, rows.iter().map(|r| r.0.clone()).collect::<Vec<_>>());
    // A redelivery of a stored event is still a duplicate.
    assert_eq!(
        existing.receive(&rows[0].0).unwrap(),
        ordo_core::Receipt::Duplicate
    );
    drop(existing);

    let mut consumer = ConsumerDb::open(&path, &ordo_reservation::consumer_schema()).unwrap();
    assert_eq!(consumer.domain(), "reservation");
    assert_eq!(
        count(consumer.connection(), "PRAGMA user_version"),
        ordo_sqlite::SCHEMA_VERSION
    );
    consumer
        .receive(&reservation("r1", 3, "released", 5))
        .unwrap();
    let drains = consumer.process_all(None, Default::default(), 100).unwrap();
    let applied: u64 = drains.iter().map(|d| d.applied).sum();
    assert_eq!(applied, 2);
    let mut all = expected(InboxStatus::Applied);
    all.insert(2, ("r1-3".to_owned(), InboxStatus::Applied));
    assert_eq!(statuses(&mut consumer), all);
    let projections = consumer.projections().unwrap();
    assert_eq!(projections.len(), 1);
    assert_eq!(projections[0].state.as_str(), "released");
    assert_eq!(projections[0].applied_seq, 3);
    let effects: Vec<String> = consumer
        .effects()
        .unwrap()
        .into_iter()
        .map(|e| e.event_id.as_str().to_owned())
        .collect();
    assert_eq!(effects, ["r1-1", "r1-2", "r1-3"]);
}

#[test]
fn a_first_release_producer_store_opens_as_reservation_and_appending_continues() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("producer.db");
    let events = [
        reservation("r1", 1, "reserved", 5),
        reservation("r1", 2, "confirmed", 5),
    ];
    {
        let conn = first_release_file(&path, "producer", FIRST_RELEASE_PRODUCER);
        for (accepted, e) in [(1, &events[0]), (0, &events[1])] {
            conn.execute(
                "INSERT INTO outbox (event_id, flow_id, seq, schema_version, type, body,
                                     created_at_ms, accepted, accepted_at_ms, attempts)
                 VALUES (?1, ?2, ?3, 1, ?4, ?5, 1000, ?6, ?7, ?6)",
                params![
                    e.event_id.as_str(),
                    e.flow_id.as_str(),
                    e.seq.get(),
                    e.event_type.as_str(),
                    e.stored_text(),
                    accepted,
                    (accepted == 1).then_some(1_001),
                ],
            )
            .unwrap();
        }
        conn.execute_batch(
            "INSERT INTO outbox_head (flow_id, last_seq, relay_seq) VALUES ('r1', 2, 2);
             INSERT INTO flow VALUES ('r1', 'confirmed', 5);",
        )
        .unwrap();
    }

    let mut existing =
        ProducerDb::open_existing(&path, Arc::new(SystemClock), &OpenOptions::default()).unwrap();
    assert_eq!(existing.domain(), "reservation");
    let outbox = existing.outbox().unwrap();
    let stored: Vec<(Envelope, bool)> = outbox
        .into_iter()
        .map(|r| (r.envelope, r.accepted))
        .collect();
    assert_eq!(
        stored,
        vec![(events[0].clone(), true), (events[1].clone(), false)]
    );
    drop(existing);

    let mut producer = ProducerDb::open(&path, &ordo_reservation::producer_schema()).unwrap();
    assert_eq!(producer.domain(), "reservation");
    let flows = producer.flows().unwrap();
    assert_eq!(flows.len(), 1);
    assert_eq!(
        (flows[0].state.as_str(), flows[0].last_seq),
        ("confirmed", 2)
    );
    let request = ordo_reservation::AdvanceRequest::new(
        flow("r1"),
        2,
        ordo_reservation::FlowState::Released,
        None,
        SchemaVersion::V1,
    )
    .unwrap();
    match producer.advance(&request).unwrap() {
        ordo_reservation::Advance::Committed(e) => {
            assert_eq!(e, reservation("r1", 3, "released", 5))
        }
        other => panic!("{other:?}"),
    }
    let pending: Vec<String> = producer
        .pending(10)
        .unwrap()
        .into_iter()
        .map(|e| e.event_id.as_str().to_owned())
        .collect();
    assert_eq!(pending, ["r1-2", "r1-3"]);
}

/// Appends `per_flow` events to each of `flows` flows, one write each,
/// round-robin over the flows.
fn append_round_robin(producer: &mut ProducerDb, flows: usize, per_flow: i64) {
    for i in 0..per_flow {
        for f in 0..flows {
            producer
                .write(|tx| {
                    tx.append(
                        &flow(&format!("acct-{f}")),
                        "credit",
                        SchemaVersion::V1,
                        &json!({ "amount": 100 + i }),
                    )
                })
                .unwrap();
        }
    }
}

fn start_runner(dir: &Path) -> Runner {
    start_runner_with(dir, RunnerOptions::default())
}

fn start_runner_with(dir: &Path, options: RunnerOptions) -> Runner {
    let producer_path = dir.join("producer.db");
    let consumer_path = dir.join("consumer.db");
    let mut runner = Runner::new(options);
    runner
        .spawn_relay(
            ProducerDb::open(&producer_path, &orders_schema()).unwrap(),
            ConsumerDb::open(&consumer_path, &ledger_schema()).unwrap(),
        )
        .unwrap();
    runner
        .spawn_apply(
            ConsumerDb::open(&consumer_path, &ledger_schema()).unwrap(),
            Ledger,
        )
        .unwrap();
    runner
}

fn applied_count(consumer: &ConsumerDb) -> i64 {
    count(consumer.connection(), "SELECT count(*) FROM ledger")
}

/// Polls until the ledger holds `total` rows; panics after a generous
/// deadline so that a lost event fails the test instead of hanging it.
fn wait_for_ledger(consumer: &ConsumerDb, runner: Runner, total: i64) -> Runner {
    let deadline = Instant::now() + Duration::from_secs(120);
    while applied_count(consumer) < total {
        if runner.failed() {
            panic!("a loop failed: {:?}", runner.stop());
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {total} applied",
            applied_count(consumer)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    runner
}

/// Every flow's ledger rows in the order they were written: each flow's
/// seqs must be exactly 1..=n, once each.
fn ledger_by_flow(consumer: &ConsumerDb) -> BTreeMap<String, Vec<i64>> {
    let mut by_flow: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut stmt = consumer
        .connection()
        .prepare("SELECT flow_id, seq FROM ledger ORDER BY rowid")
        .unwrap();
    let rows = stmt
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
        })
        .unwrap();
    for row in rows {
        let (flow_id, at) = row.unwrap();
        by_flow.entry(flow_id).or_default().push(at);
    }
    by_flow
}

#[test]
fn the_runner_applies_every_append_exactly_once_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut producer = ProducerDb::open(dir.path().join("producer.db"), &orders_schema()).unwrap();
    let mut consumer = ledger_consumer(dir.path());
    let runner = start_runner(dir.path());
    append_round_robin(&mut producer, 5, 20);
    let runner = wait_for_ledger(&consumer, runner, 100);
    let report = runner.stop().unwrap();

    assert_eq!(report.relay.accepted, 100);
    assert_eq!(report.relay.conflict, 0);
    assert_eq!(
        report.relay.delivered,
        report.relay.accepted + report.relay.duplicate
    );
    assert_eq!(report.apply.applied, 100);
    assert_eq!(report.apply.blocked, 0);
    assert_eq!(applied_count(&consumer), 100, "nothing after the stop");
    let by_flow = ledger_by_flow(&consumer);
    assert_eq!(by_flow.len(), 5);
    for seqs in by_flow.values() {
        assert_eq!(*seqs, (1..=20).collect::<Vec<_>>());
    }
    assert!(consumer
        .inbox()
        .unwrap()
        .iter()
        .all(|r| r.status == InboxStatus::Applied));
    assert!(producer.outbox().unwrap().iter().all(|r| r.accepted));
}

/// With a poll interval far longer than the test's deadline, only the
/// in-process wake-ups can move the events: an append wakes the relay, the
/// receive wakes the apply loop, and a stop wakes both.
/// One runner relays one producer store to two destinations at once, each
/// loop with its own producer handle and its own consumer store: both get
/// every event, each flow in order, and the outbox is settled only once
/// both hold it. An unknown destination starts nothing.
#[test]
fn one_runner_serves_two_destinations_each_on_its_own_transport() {
    let dir = tempfile::tempdir().unwrap();
    let producer_path = dir.path().join("producer.db");
    let billing = ordo_core::DestinationName::new("billing").unwrap();
    let mut producer = ProducerDb::open(&producer_path, &orders_schema()).unwrap();
    let start = ordo_core::destination::DestinationStart::Start;
    producer.add_destination(&billing, start).unwrap().unwrap();
    let consumers = [
        dir.path().join("shipping.db"),
        dir.path().join("billing.db"),
    ];
    let open_consumer = |path: &Path| ConsumerDb::open(path, &ledger_schema()).unwrap();
    let mut runner = Runner::new(RunnerOptions::default());
    let unknown = ordo_core::DestinationName::new("nowhere").unwrap();
    let handle = ProducerDb::open(&producer_path, &orders_schema()).unwrap();
    let refused = runner
        .spawn_relay_for(&unknown, handle, None, open_consumer(&consumers[0]), |_| {})
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidInput, "{refused}");
    let names = [ordo_core::DestinationName::default_name(), billing.clone()];
    for (name, consumer) in names.iter().zip(&consumers) {
        let handle = ProducerDb::open(&producer_path, &orders_schema()).unwrap();
        (runner.spawn_relay_for(name, handle, None, open_consumer(consumer), |_| {})).unwrap();
        runner.spawn_apply(open_consumer(consumer), Ledger).unwrap();
    }
    append_round_robin(&mut producer, 5, 20);
    let shipping = open_consumer(&consumers[0]);
    let runner = wait_for_ledger(&shipping, runner, 100);
    let runner = wait_for_ledger(&open_consumer(&consumers[1]), runner, 100);
    let report = runner.stop().unwrap();
    assert_eq!(report.relay.accepted, 200, "100 events to each destination");
    assert_eq!(report.apply.applied, 200);
    for consumer in &consumers {
        let by_flow = ledger_by_flow(&open_consumer(consumer));
        assert_eq!(by_flow.len(), 5);
        for seqs in by_flow.values() {
            assert_eq!(*seqs, (1..=20).collect::<Vec<_>>());
        }
    }
    assert!(producer.outbox().unwrap().iter().all(|r| r.accepted));
}

#[test]
fn the_runner_wakes_on_an_append_of_the_same_process_without_polling() {
    let dir = tempfile::tempdir().unwrap();
    let mut producer = ProducerDb::open(dir.path().join("producer.db"), &orders_schema()).unwrap();
    let consumer = ledger_consumer(dir.path());
    let hour_ms = 3_600_000;
    let options = RunnerOptions {
        poll_ms_min: hour_ms,
        poll_ms_max: hour_ms,
        ..RunnerOptions::default()
    };
    let runner = start_runner_with(dir.path(), options);
    // Both loops find nothing, and wait for an hour or a wake-up.
    std::thread::sleep(Duration::from_millis(200));
    append_round_robin(&mut producer, 2, 5);
    let runner = wait_for_ledger(&consumer, runner, 10);
    let report = runner.stop().unwrap();
    assert_eq!(report.apply.applied, 10);
}

/// The loops hold at most one round at a time: a backlog of 400 events on
/// 200 flows, with rounds of 8 events and apply transactions of 8, is
/// handed over in at least 50 relay rounds, never at once.
#[test]
fn the_runner_works_a_backlog_in_bounded_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let mut producer = ProducerDb::open(dir.path().join("producer.db"), &orders_schema()).unwrap();
    let consumer = ledger_consumer(dir.path());
    append_round_robin(&mut producer, 200, 2);
    let options = RunnerOptions {
        relay: ordo_core::RelayOptions {
            batch_len_max: 8,
            ..ordo_core::RelayOptions::default()
        },
        apply_batch_len_max: 8,
        ..RunnerOptions::default()
    };
    let runner = start_runner_with(dir.path(), options);
    let runner = wait_for_ledger(&consumer, runner, 400);
    let report = runner.stop().unwrap();
    assert_eq!(report.relay.accepted, 400);
    assert!(report.relay.rounds >= 400 / 8, "{report:?}");
    assert_eq!(report.apply.applied, 400);
}

#[test]
fn a_runner_stopped_during_appends_and_started_again_loses_and_doubles_nothing() {
    const FLOWS: usize = 3;
    const PER_FLOW: i64 = 100;
    let total = FLOWS as i64 * PER_FLOW;
    let dir = tempfile::tempdir().unwrap();
    let producer_path = dir.path().join("producer.db");
    drop(ProducerDb::open(&producer_path, &orders_schema()).unwrap());
    let consumer = ledger_consumer(dir.path());

    let runner = start_runner(dir.path());
    let appender = std::thread::spawn(move || {
        let mut producer = ProducerDb::open(&producer_path, &orders_schema()).unwrap();
        append_round_robin(&mut producer, FLOWS, PER_FLOW);
    });
    let runner = wait_for_ledger(&consumer, runner, 30);
    let first = runner.stop().unwrap();
    let after_stop = applied_count(&consumer);
    appender.join().unwrap();
    assert_eq!(
        applied_count(&consumer),
        after_stop,
        "nothing applies once stopped"
    );
    assert_eq!(first.apply.applied, after_stop as u64);

    let runner = start_runner(dir.path());
    let runner = wait_for_ledger(&consumer, runner, total);
    let second = runner.stop().unwrap();
    assert_eq!(first.apply.applied + second.apply.applied, total as u64);
    assert_eq!(first.relay.conflict + second.relay.conflict, 0);
    assert_eq!(first.relay.accepted + second.relay.accepted, total as u64);
    let by_flow = ledger_by_flow(&consumer);
    assert_eq!(by_flow.len(), FLOWS);
    for seqs in by_flow.values() {
        assert_eq!(*seqs, (1..=PER_FLOW).collect::<Vec<_>>());
    }
}

#[test]
fn append_with_headers_writes_them_into_the_body_and_refuses_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema::new("app").unwrap();
    let mut producer = ProducerDb::open(dir.path().join("p.db"), &schema).unwrap();
    let mut headers = ordo_core::envelope::Headers::new();
    headers.insert("x-request-id".into(), "r-7".into());
    let event = producer
        .write(|tx| {
            tx.append_with_headers(&flow("f"), "noted", SchemaVersion::V1, &json!({}), &headers)
        })
        .unwrap();
    assert_eq!(event.headers, headers);
    let stored: String = producer
        .connection()
        .query_row("SELECT body FROM outbox", [], |row| row.get(0))
        .unwrap();
    assert!(
        stored.contains(r#""headers":{"x-request-id":"r-7"}"#),
        "{stored}"
    );
    headers.insert("x-long".into(), "v".repeat(1_025));
    let refused = producer
        .write(|tx| {
            tx.append_with_headers(&flow("f"), "noted", SchemaVersion::V1, &json!({}), &headers)
        })
        .unwrap_err();
    assert!(refused.to_string().contains("at most 1024"), "{refused}");
    assert_eq!(producer.outbox().unwrap().len(), 1, "nothing written");
}

#[test]
fn append_traced_writes_the_traceparent_into_the_body_and_its_hash() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema::new("app").unwrap();
    let mut producer = ProducerDb::open(dir.path().join("p.db"), &schema).unwrap();
    let text = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let traceparent = ordo_core::TraceParent::parse(text).unwrap();
    let (traced, plain) = producer
        .write(|tx| {
            let traced = tx.append_traced(
                &flow("f"),
                "noted",
                SchemaVersion::V1,
                &json!({}),
                Some(&traceparent),
            )?;
            let plain =
                tx.append_traced(&flow("g"), "noted", SchemaVersion::V1, &json!({}), None)?;
            Ok::<_, AppendError>((traced, plain))
        })
        .unwrap();
    assert_eq!(traced.traceparent(), Some(traceparent));
    assert!(plain.headers.is_empty(), "{plain:?}");
    let stored: String = producer
        .connection()
        .query_row("SELECT body FROM outbox WHERE flow_id = 'f'", [], |row| {
            row.get(0)
        })
        .unwrap();
    assert!(
        stored.contains(&format!(r#""headers":{{"traceparent":"{text}"}}"#)),
        "{stored}"
    );
    assert_eq!(producer.outbox().unwrap()[0].envelope, traced);
    let mut untraced = traced.clone();
    untraced.headers.clear();
    let mut consumer = ConsumerDb::open(dir.path().join("c.db"), &schema).unwrap();
    assert_eq!(
        consumer.receive(&untraced).unwrap(),
        ordo_core::Receipt::Accepted
    );
    assert_eq!(
        consumer.receive(&traced).unwrap(),
        ordo_core::Receipt::Conflict,
        "the traceparent is part of the body and its hash"
    );
}
