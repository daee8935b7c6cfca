//! The group-committing producer on real files: many threads racing on the
//! same flows, units failing inside one batch without touching the others,
//! the bounded queue, the caller's timeout, and async callers.

use ordo_core::OutboxTx;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use ordo_core::{AppendError, FlowId, SchemaVersion, StoreError};
use ordo_reservation::{advance_in, Advance, AdvanceRequest, FlowState, Quantity};
use ordo_sqlite::rusqlite::params;
use ordo_sqlite::{GroupOptions, GroupWriter, ProducerDb, ProducerTx, SubmitError, WhenFull};
use serde_json::json;

const STEPS: [FlowState; 3] = [
    FlowState::Reserved,
    FlowState::Confirmed,
    FlowState::Released,
];

fn flow(id: &str) -> FlowId {
    FlowId::new(id).unwrap()
}

fn writer(dir: &Path, options: GroupOptions) -> GroupWriter {
    let db = ordo_reservation::open_producer(dir.join("producer.db")).unwrap();
    GroupWriter::start(db, options).unwrap()
}

/// The outbox's `(flow, seq)` rows, in position order.
fn outbox(db: &ProducerDb) -> Vec<(String, i64)> {
    let mut stmt = db
        .connection()
        .prepare("SELECT flow_id, seq FROM outbox ORDER BY position")
        .unwrap();
    let rows = stmt
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap();
    rows.map(Result::unwrap).collect()
}

fn request(flow_id: &FlowId, step: usize) -> AdvanceRequest {
    AdvanceRequest::new(
        flow_id.clone(),
        step as i64,
        STEPS[step],
        Some(Quantity::new(5).unwrap()),
        SchemaVersion::V1,
    )
    .unwrap()
}

/// A unit that holds the writer until released, so that the units queued
/// meanwhile all wait (and then share one transaction).
struct Gate {
    release: mpsc::Sender<()>,
    pending: ordo_sqlite::Pending<(), StoreError>,
}

impl Gate {
    /// Lets the gate's unit finish.
    fn release(&self) {
        self.release.send(()).unwrap();
    }

    /// Waits for the gate's unit to commit.
    fn wait(self) {
        self.pending.wait().unwrap();
    }

    /// Lets the gate's unit finish and waits for it to commit.
    fn open(self) {
        self.release();
        self.wait();
    }
}

/// Holds `writer` with a gate, once the gate's unit is running.
fn gate(writer: &GroupWriter) -> Gate {
    let (started_tx, started) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let pending = writer
        .enqueue(move |_ptx: &mut ProducerTx<'_>| -> Result<(), StoreError> {
            started_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            Ok(())
        })
        .unwrap();
    started.recv().unwrap();
    Gate { release, pending }
}

/// A writer with `options` on a fresh store (kept as long as the
/// directory), held by a gate.
fn gated_writer(options: GroupOptions) -> (tempfile::TempDir, GroupWriter, Gate) {
    let dir = tempfile::tempdir().unwrap();
    let writer = writer(dir.path(), options);
    let gate = gate(&writer);
    (dir, writer, gate)
}

fn note(ptx: &mut ProducerTx<'_>, name: &str) -> Result<(), StoreError> {
    ptx.sql()
        .execute(
            "INSERT INTO flow (flow_id, state, quantity) VALUES (?1, 'reserved', 1)",
            params![name],
        )
        .map(|_| ())
        .map_err(|e| StoreError::sqlite("note", e))
}

/// Options whose batches are never cut short by their time limit: a batch
/// takes every unit queued behind its first.
fn untimed_batches() -> GroupOptions {
    GroupOptions {
        batch_time_max: Duration::from_secs(600),
        ..GroupOptions::default()
    }
}

fn noted(db: &ProducerDb) -> Vec<String> {
    let mut stmt = db
        .connection()
        .prepare("SELECT flow_id FROM flow ORDER BY flow_id")
        .unwrap();
    let rows = stmt.query_map([], |row| row.get(0)).unwrap();
    rows.map(Result::unwrap).collect()
}

/// Closes `writer` and reads what its units noted.
fn noted_at_close(writer: GroupWriter) -> Vec<String> {
    noted(&writer.close())
}

#[test]
fn threads_racing_on_the_same_flows_commit_each_seq_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let writer = writer(dir.path(), GroupOptions::default());
    let flows: Vec<FlowId> = (0..20).map(|i| flow(&format!("f{i:02}"))).collect();
    let threads = 32;
    let outcomes: Vec<(u64, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let (mut committed, mut stale) = (0u64, 0u64);
                    for step in 0..STEPS.len() {
                        for flow_id in &flows {
                            let request = request(flow_id, step);
                            match writer.submit(move |ptx| advance_in(ptx, &request)).unwrap() {
                                Advance::Committed(event) => {
                                    assert_eq!(event.seq.get(), step as i64 + 1);
                                    committed += 1;
                                }
                                Advance::Stale { last_seq } => {
                                    assert!(last_seq > step as i64);
                                    stale += 1;
                                }
                                other => panic!("unexpected {other:?}"),
                            }
                        }
                    }
                    (committed, stale)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let committed: u64 = outcomes.iter().map(|o| o.0).sum();
    let stale: u64 = outcomes.iter().map(|o| o.1).sum();
    let expected = (flows.len() * STEPS.len()) as u64;
    assert_eq!(
        committed, expected,
        "one committed per (flow, expected seq)"
    );
    assert_eq!(stale, expected * (threads - 1), "every other attempt stale");
    let db = writer.close();
    let rows = outbox(&db);
    assert_eq!(rows.len() as u64, expected);
    for flow_id in &flows {
        let seqs: Vec<i64> = rows
            .iter()
            .filter(|(f, _)| f == flow_id.as_str())
            .map(|r| r.1)
            .collect();
        assert_eq!(seqs, vec![1, 2, 3], "{flow_id}: contiguous, in order");
    }
    // Many callers per transaction: fewer commits than units.
    let units = expected * threads;
    assert!(
        db.commits() < units,
        "{} commits for {units} units",
        db.commits()
    );
}

/// Appends the next event of `flow_id` (a unit's append).
fn append(ptx: &mut ProducerTx<'_>, flow_id: &str) -> Result<i64, AppendError> {
    let event = ptx.append(&flow(flow_id), "noted", SchemaVersion::V1, &json!({}))?;
    Ok(event.seq.get())
}

/// A write of the unit's own that fails: its table does not exist.
fn failing_write(ptx: &mut ProducerTx<'_>) -> Result<i64, AppendError> {
    ptx.sql()
        .execute("INSERT INTO no_such_table VALUES (1)", [])
        .map_err(|e| AppendError::Store(StoreError::sqlite("own write", e)))?;
    Ok(0)
}

/// Asserts that a unit's outcome is its panic, a "boom".
#[track_caller]
fn assert_panicked<T: std::fmt::Debug>(outcome: Result<T, SubmitError<AppendError>>) {
    match outcome {
        Err(SubmitError::Panicked(message)) => assert!(message.contains("boom"), "{message}"),
        other => panic!("unexpected {other:?}"),
    }
}

/// The outbox rows of flow `x`, seqs 1 to `last`.
fn x_rows(last: i64) -> Vec<(String, i64)> {
    (1..=last).map(|s| ("x".to_string(), s)).collect()
}

#[test]
fn units_failing_inside_a_batch_fail_alone_and_the_others_commit_in_order() {
    let (_dir, writer, gate) = gated_writer(untimed_batches());
    let ok1 = writer.enqueue(|ptx| append(ptx, "x")).unwrap();
    let sql = writer
        .enqueue(|ptx| {
            append(ptx, "x")?;
            failing_write(ptx)
        })
        .unwrap();
    let refused = writer
        .enqueue(|ptx| {
            note(ptx, "refused-note")?;
            let mut event = ptx.append(&flow("x"), "noted", SchemaVersion::V1, &json!({}))?;
            // The same seq again: the append is refused.
            ptx.append_envelope(&event)?;
            event.seq = ordo_core::Seq::new(1).unwrap();
            Ok(0)
        })
        .unwrap();
    let panicked = writer
        .enqueue(|ptx| -> Result<i64, AppendError> {
            append(ptx, "x")?;
            panic!("boom in a unit");
        })
        .unwrap();
    let ok2 = writer.enqueue(|ptx| append(ptx, "x")).unwrap();
    let stale = writer
        .enqueue(|ptx| advance_in(ptx, &request(&flow("y"), 1)))
        .unwrap();
    let ok3 = writer
        .enqueue(|ptx| {
            note(ptx, "ok3-note")?;
            append(ptx, "x")
        })
        .unwrap();
    gate.open();
    assert_eq!(ok1.wait().unwrap(), 1);
    assert!(matches!(
        sql.wait(),
        Err(SubmitError::Unit(AppendError::Store(_)))
    ));
    assert!(matches!(
        refused.wait(),
        Err(SubmitError::Unit(AppendError::NotNext { .. }))
    ));
    assert_panicked(panicked.wait());
    assert_eq!(ok2.wait().unwrap(), 2, "no gap left by the failed units");
    assert!(matches!(stale.wait(), Ok(Advance::Stale { last_seq: 0 })));
    assert_eq!(ok3.wait().unwrap(), 3);
    // The writer goes on after a panic.
    assert_eq!(writer.submit(|ptx| append(ptx, "x")).unwrap(), 4);
    let db = writer.close();
    assert_eq!(outbox(&db), x_rows(4));
    assert_eq!(noted(&db), vec!["ok3-note"]);
    assert_eq!(db.commits(), 2, "the gate's batch, then the last unit");
}

#[test]
fn a_full_queue_refuses_and_a_refused_unit_never_runs() {
    let (_dir, writer, gate) = gated_writer(GroupOptions {
        queue_len_max: 2,
        when_full: WhenFull::Refuse,
        ..GroupOptions::default()
    });
    let queued: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|name| writer.enqueue(move |ptx| note(ptx, name)).unwrap())
        .collect();
    assert_eq!(writer.queued(), 2);
    let refused = writer.enqueue(|ptx| note(ptx, "refused"));
    assert!(matches!(refused, Err(SubmitError::QueueFull)));
    gate.open();
    for pending in queued {
        pending.wait().unwrap();
    }
    assert_eq!(noted_at_close(writer), vec!["a", "b"]);
}

#[test]
fn a_full_queue_blocks_the_submit_until_its_timeout_and_the_unit_never_runs() {
    let (_dir, writer, gate) = gated_writer(GroupOptions {
        queue_len_max: 1,
        when_full: WhenFull::Block,
        wait_max: Duration::from_millis(50),
        // The queued unit joins the gate's transaction, so it is taken
        // before the gate's caller hears back, though past its own
        // deadline.
        ..untimed_batches()
    });
    let queued = writer.enqueue(|ptx| note(ptx, "a")).unwrap();
    let blocked = writer.submit(|ptx| note(ptx, "blocked"));
    assert!(matches!(blocked, Err(SubmitError::TimedOut)), "{blocked:?}");
    gate.open();
    queued.wait().unwrap();
    assert_eq!(noted_at_close(writer), vec!["a"]);
}

#[test]
fn a_submit_blocked_on_a_full_queue_is_woken_when_the_writer_makes_room() {
    let (_dir, writer, gate) = gated_writer(GroupOptions {
        queue_len_max: 1,
        when_full: WhenFull::Block,
        // Far longer than the test needs: a submit never woken for the
        // room made fails with `TimedOut` instead of committing.
        wait_max: Duration::from_secs(20),
        ..GroupOptions::default()
    });
    let queued = writer.enqueue(|ptx| note(ptx, "a")).unwrap();
    std::thread::scope(|scope| {
        let blocked = scope.spawn(|| {
            let submitted = std::time::Instant::now();
            let outcome = writer.submit(|ptx| note(ptx, "b"));
            (outcome, submitted.elapsed())
        });
        // Let the submit find the queue full and wait for room.
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            writer.queued(),
            1,
            "the second unit waits outside the queue"
        );
        gate.release();
        let (blocked, waited) = blocked.join().unwrap();
        assert!(blocked.is_ok(), "{blocked:?}");
        // Woken by the room made, not by its own deadline: a lost wake-up
        // would leave it waiting the whole 20 s before it looked again.
        assert!(waited < Duration::from_secs(10), "waited {waited:?}");
    });
    gate.wait();
    queued.wait().unwrap();
    assert_eq!(noted_at_close(writer), vec!["a", "b"]);
}

#[test]
fn a_caller_timing_out_in_the_queue_withdraws_its_unit_which_never_runs() {
    let (_dir, writer, gate) = gated_writer(GroupOptions {
        wait_max: Duration::from_millis(50),
        ..GroupOptions::default()
    });
    let timed_out = writer.submit(|ptx| note(ptx, "late"));
    assert!(
        matches!(timed_out, Err(SubmitError::TimedOut)),
        "{timed_out:?}"
    );
    assert_eq!(writer.queued(), 0, "withdrawn from the queue");
    gate.open();
    writer.submit(|ptx| note(ptx, "after")).unwrap();
    assert_eq!(noted_at_close(writer), vec!["after"]);
}

#[test]
fn a_caller_whose_unit_was_taken_waits_past_its_timeout_for_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let wait_max = Duration::from_millis(50);
    let writer = Arc::new(writer(
        dir.path(),
        GroupOptions {
            wait_max,
            ..GroupOptions::default()
        },
    ));
    let (started_tx, started) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let caller = {
        let writer = writer.clone();
        std::thread::spawn(move || {
            writer.submit(move |ptx| {
                note(ptx, "slow")?;
                started_tx.send(()).unwrap();
                release_rx.recv().unwrap();
                Ok::<_, StoreError>(())
            })
        })
    };
    started.recv().unwrap();
    // The unit is running; its caller's deadline passes meanwhile.
    std::thread::sleep(wait_max * 3);
    release.send(()).unwrap();
    caller.join().unwrap().expect("committed, not timed out");
    let db = Arc::into_inner(writer).unwrap().close();
    assert_eq!(noted(&db), vec!["slow"]);
}

#[test]
fn close_runs_the_units_already_queued_and_refuses_later_ones() {
    let (_dir, writer, gate) = gated_writer(GroupOptions::default());
    let queued: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|name| writer.enqueue(move |ptx| note(ptx, name)).unwrap())
        .collect();
    gate.release();
    let db = writer.close();
    gate.wait();
    for pending in queued {
        pending.wait().unwrap();
    }
    assert_eq!(noted(&db).len(), 3);
}

/// Runs a future to completion on this thread.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(value) = future.as_mut().poll(&mut cx) {
            return value;
        }
        std::thread::park();
    }
}

#[test]
fn async_callers_await_their_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let writer = writer(
        dir.path(),
        GroupOptions {
            when_full: WhenFull::Refuse,
            ..GroupOptions::default()
        },
    );
    let seqs: Vec<i64> = (0..10)
        .map(|_| block_on(writer.enqueue(|ptx| append(ptx, "z")).unwrap()).unwrap())
        .collect();
    assert_eq!(seqs, (1..=10).collect::<Vec<_>>());
    // A pending outcome dropped while still queued withdraws its unit.
    let gate = gate(&writer);
    drop(writer.enqueue(|ptx| note(ptx, "dropped")).unwrap());
    assert_eq!(writer.queued(), 0);
    gate.open();
    assert!(noted_at_close(writer).is_empty());
}

#[test]
fn a_blocking_submit_to_an_idle_writer_runs_on_the_calling_thread() {
    let dir = tempfile::tempdir().unwrap();
    let writer = writer(dir.path(), GroupOptions::default());
    let caller = std::thread::current().id();
    let ran_on = writer
        .submit(|ptx| -> Result<_, AppendError> {
            append(ptx, "x")?;
            Ok(std::thread::current().id())
        })
        .unwrap();
    assert_eq!(
        ran_on, caller,
        "an idle writer leaves the batch to its caller"
    );
    // An async caller's unit always goes to the writer thread.
    let pending = writer
        .enqueue(|ptx| -> Result<_, AppendError> {
            append(ptx, "x")?;
            Ok(std::thread::current().id())
        })
        .unwrap();
    assert_ne!(pending.wait().unwrap(), caller);
    let db = writer.close();
    assert_eq!(outbox(&db), x_rows(2));
    assert_eq!(db.commits(), 2);
}

#[test]
fn a_blocking_submit_while_a_batch_runs_waits_for_it_and_keeps_arrival_order() {
    let (_dir, writer, gate) = gated_writer(untimed_batches());
    let writer = Arc::new(writer);
    let caller = std::thread::current().id();
    let submitters: Vec<_> = (1..=3)
        .map(|n| {
            let mine = writer.clone();
            let handle = std::thread::spawn(move || {
                let outcome = mine.submit(move |ptx| -> Result<_, AppendError> {
                    note(ptx, &format!("n{n}"))?;
                    Ok((append(ptx, "x")?, std::thread::current().id()))
                });
                (outcome, std::thread::current().id())
            });
            // Each one queued before the next starts: arrival order is n.
            while writer.queued() < n {
                std::thread::yield_now();
            }
            handle
        })
        .collect();
    gate.open();
    for (n, handle) in submitters.into_iter().enumerate() {
        let (outcome, submitter) = handle.join().unwrap();
        let (seq, ran_on) = outcome.unwrap();
        assert_eq!(seq, n as i64 + 1, "committed in arrival order");
        assert_ne!(
            ran_on, submitter,
            "a busy writer runs the unit on its thread"
        );
        assert_ne!(ran_on, caller);
    }
    let db = Arc::into_inner(writer).unwrap().close();
    assert_eq!(noted(&db), vec!["n1", "n2", "n3"]);
    assert_eq!(
        db.commits(),
        1,
        "the gate and the three units share one commit"
    );
}

#[test]
fn a_failing_first_unit_rolls_back_alone_and_the_units_behind_it_commit_next() {
    let (_dir, writer, gate) = gated_writer(GroupOptions {
        batch_len_max: 2,
        ..untimed_batches()
    });
    let ok1 = writer.enqueue(|ptx| append(ptx, "x")).unwrap();
    // The first unit of the next batch: its own write is taken back by the
    // transaction's rollback, with its append.
    let sql = writer
        .enqueue(|ptx| {
            note(ptx, "sql-note")?;
            append(ptx, "x")?;
            failing_write(ptx)
        })
        .unwrap();
    let panicked = writer
        .enqueue(|ptx| -> Result<i64, AppendError> {
            note(ptx, "panic-note")?;
            append(ptx, "x")?;
            panic!("boom first");
        })
        .unwrap();
    let ok2 = writer.enqueue(|ptx| append(ptx, "x")).unwrap();
    gate.open();
    assert_eq!(ok1.wait().unwrap(), 1);
    assert!(matches!(
        sql.wait(),
        Err(SubmitError::Unit(AppendError::Store(_)))
    ));
    assert_panicked(panicked.wait());
    assert_eq!(ok2.wait().unwrap(), 2, "no gap left by the failed units");
    // A lone failing unit submitted by a blocking caller fails alone too.
    let lone = writer.submit(|ptx| -> Result<i64, AppendError> {
        note(ptx, "lone-note")?;
        Err(AppendError::Store(StoreError::new(
            ordo_core::ErrorKind::Other,
            "refused by the unit",
        )))
    });
    assert!(matches!(lone, Err(SubmitError::Unit(_))));
    assert_eq!(writer.submit(|ptx| append(ptx, "x")).unwrap(), 3);
    let db = writer.close();
    assert_eq!(outbox(&db), x_rows(3));
    assert!(noted(&db).is_empty(), "{:?}", noted(&db));
    assert_eq!(
        db.commits(),
        3,
        "the gate's batch, ok2's, and the last unit"
    );
}

fn checkpoint_pages(conn: &ordo_sqlite::rusqlite::Connection) -> i64 {
    conn.query_row("PRAGMA wal_autocheckpoint", [], |row| row.get(0))
        .unwrap()
}

#[test]
fn the_writer_checkpoints_at_its_own_wal_size_and_gives_the_store_back_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let db = ordo_reservation::open_producer(dir.path().join("producer.db")).unwrap();
    let before = checkpoint_pages(db.connection());
    let writer = GroupWriter::start(
        db,
        GroupOptions {
            wal_checkpoint_pages: 12_345,
            ..GroupOptions::default()
        },
    )
    .unwrap();
    let during = writer
        .submit(|ptx| -> Result<i64, AppendError> {
            append(ptx, "x")?;
            Ok(checkpoint_pages(ptx.sql()))
        })
        .unwrap();
    assert_eq!(during, 12_345);
    let db = writer.close();
    assert_eq!(checkpoint_pages(db.connection()), before);
    assert_ne!(before, 12_345);
}

#[test]
fn a_lone_callers_append_commits_in_its_own_transaction_and_is_visible() {
    let dir = tempfile::tempdir().unwrap();
    let writer = writer(dir.path(), GroupOptions::default());
    let seq = writer.submit(|ptx| append(ptx, "x")).unwrap();
    assert_eq!(seq, 1);
    assert_eq!(writer.queued(), 0);
    // Committed once `submit` returned: another connection reads it while
    // the writer still runs.
    let reader = ordo_sqlite::rusqlite::Connection::open(dir.path().join("producer.db")).unwrap();
    let seen: Vec<(String, i64)> = reader
        .prepare("SELECT flow_id, seq FROM outbox ORDER BY position")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(seen, x_rows(1));
    // A failing lone unit fails alone and leaves nothing.
    assert!(matches!(
        writer.submit(failing_write),
        Err(SubmitError::Unit(_))
    ));
    assert_panicked(writer.submit(|_ptx| -> Result<(), AppendError> { panic!("boom") }));
    let db = writer.close();
    assert_eq!(outbox(&db), x_rows(1));
    assert_eq!(db.commits(), 1, "one transaction for the lone append");
}

#[test]
fn concurrent_callers_still_share_commits() {
    let dir = tempfile::tempdir().unwrap();
    let writer = writer(dir.path(), GroupOptions::default());
    let (threads, each) = (8, 25);
    let barrier = std::sync::Barrier::new(threads);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (writer, barrier) = (&writer, &barrier);
            scope.spawn(move || {
                barrier.wait();
                let flow_id = format!("t{t}");
                for n in 1..=each {
                    let flow_id = flow_id.clone();
                    let seq = writer.submit(move |ptx| append(ptx, &flow_id)).unwrap();
                    assert_eq!(seq, n as i64);
                }
            });
        }
    });
    let db = writer.close();
    let units = (threads * each) as u64;
    assert_eq!(outbox(&db).len() as u64, units);
    assert!(
        db.commits() < units,
        "{} commits for {units} callers' units",
        db.commits()
    );
}
