//! Cross-process wake-ups: a receive or an append that stores new rows
//! sends one notification on its store's channel when it commits, and a
//! handle's `changed_elsewhere` hears those of other processes.
//!
//! A handle opened on the same database through a URL spelled differently
//! shares no in-process signal with the others, so it stands for another
//! process here: its notifications are the only way the others learn of
//! its commits. Two tests run the real second process (this test binary
//! again) under an apply loop and a relay loop whose poll would fire long
//! after the test gives up.

mod support;

use ordo_core::OutboxTx;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use ordo_core::{ApplyContext, Envelope, Receipt, Receive, RunStore, SchemaVersion, Verdict};
use ordo_postgres::postgres::fallible_iterator::FallibleIterator;
use ordo_postgres::postgres::Client;
use ordo_postgres::{PgConsumer, PgTx};
use ordo_runtime::{Runner, RunnerOptions};
use ordo_testkit::support::event_at;
use support::fresh_database;
use support::workers::{append, client, consumer, flow, producer, wait_until};

const BOUND: Duration = Duration::from_secs(10);
/// How long a notification that should not come is waited for.
const QUIET: Duration = Duration::from_millis(300);
const LEASE_MS: u64 = 10_000;

/// The same database as `target`, by a URL that names it differently (as
/// another process's configuration would): no signal in common.
fn elsewhere(target: &str) -> String {
    let separator = if target.contains('?') { '&' } else { '?' };
    format!("{target}{separator}connect_timeout=30")
}

fn event(flow: &str, seq: i64, body: i64) -> Envelope {
    event_at(flow, seq, "noted", serde_json::json!({ "n": body }))
}

/// A plain connection listening on `channel`.
fn listening(target: &str, channel: &str) -> Client {
    let mut c = client(target);
    c.batch_execute(&format!("LISTEN \"{channel}\"")).unwrap();
    c
}

/// The payloads of the next `n` notifications `c` receives, then of any
/// that arrive within [`QUIET`] after them.
fn notifications(c: &mut Client, n: usize) -> Vec<String> {
    let mut seen = Vec::new();
    let mut notifications = c.notifications();
    {
        let mut waiting = notifications.timeout_iter(BOUND);
        while seen.len() < n {
            match waiting.next().unwrap() {
                Some(notification) => seen.push(notification.payload().to_owned()),
                None => panic!("{} of {n} notifications in {BOUND:?}", seen.len()),
            }
        }
    }
    let mut quiet = notifications.timeout_iter(QUIET);
    while let Some(notification) = quiet.next().unwrap() {
        seen.push(notification.payload().to_owned());
    }
    seen
}

/// Waits until `store` says another process committed.
fn heard(store: &mut impl RunStore, what: &str) {
    wait_until(what, BOUND, || store.changed_elsewhere().unwrap());
}

#[test]
fn a_receive_through_one_handle_is_heard_by_another_once_per_batch() {
    let (_dir, target) = fresh_database();
    let mut watcher = consumer(&target, "watcher");
    let mut receiver = consumer(&elsewhere(&target), "receiver");
    assert_eq!(watcher.notify_channel(), "ordo_inbox_ordo_testkit");
    let mut raw = listening(&target, watcher.notify_channel());
    assert!(watcher.changed_elsewhere().unwrap(), "the first look");
    assert!(!watcher.changed_elsewhere().unwrap(), "nothing since");

    let batch = [event("w-1", 1, 1), event("w-1", 2, 1), event("w-2", 1, 1)];
    let receipts = receiver.receive_batch(&batch).unwrap();
    assert_eq!(receipts, vec![Receipt::Accepted; 3]);
    heard(&mut watcher, "the receive heard");
    assert!(!watcher.changed_elsewhere().unwrap(), "drained");
    assert_eq!(notifications(&mut raw, 1).len(), 1, "one per batch");

    std::thread::sleep(QUIET);
    assert!(!watcher.changed_elsewhere().unwrap(), "nothing new");
    receiver.receive_batch(&[event("w-3", 1, 1)]).unwrap();
    heard(&mut watcher, "the next receive heard");
}

#[test]
fn a_batch_of_duplicates_and_conflicts_does_not_notify() {
    let (_dir, target) = fresh_database();
    let mut watcher = consumer(&target, "watcher");
    let mut receiver = consumer(&elsewhere(&target), "receiver");
    let mut raw = listening(&target, receiver.notify_channel());
    assert!(watcher.changed_elsewhere().unwrap(), "the first look");

    receiver.receive_batch(&[event("d-1", 1, 1)]).unwrap();
    assert_eq!(notifications(&mut raw, 1).len(), 1);
    heard(&mut watcher, "the first receive heard");

    let commits = receiver.commits();
    let receipts = receiver
        .receive_batch(&[event("d-1", 1, 1), event("d-1", 1, 2)])
        .unwrap();
    assert_eq!(receipts, vec![Receipt::Duplicate, Receipt::Conflict]);
    assert_eq!(receiver.commits(), commits + 1, "the batch committed");
    // Notifications arrive in commit order: a notification of the batch
    // above would come before this one's.
    receiver.receive_batch(&[event("d-2", 1, 1)]).unwrap();
    assert_eq!(notifications(&mut raw, 1).len(), 1, "only the new event's");
}

#[test]
fn an_append_through_one_handle_is_heard_by_another_once_per_transaction() {
    let (_dir, target) = fresh_database();
    let mut watcher = producer(&target, "watcher", LEASE_MS);
    let mut appender = producer(&elsewhere(&target), "appender", LEASE_MS);
    assert_eq!(watcher.notify_channel(), "ordo_outbox_ordo_producer");
    let mut raw = listening(&target, watcher.notify_channel());
    assert!(watcher.changed_elsewhere().unwrap(), "the first look");
    assert!(!watcher.changed_elsewhere().unwrap(), "nothing since");

    append(&mut appender, &flow(1)).unwrap();
    heard(&mut watcher, "the append heard");
    assert!(!watcher.changed_elsewhere().unwrap(), "drained");
    assert_eq!(notifications(&mut raw, 1).len(), 1);

    // A write that appends nothing, then one that appends three events.
    appender
        .write(|_| Ok::<_, ordo_core::StoreError>(()))
        .unwrap();
    appender
        .write(|ptx| {
            for i in 2..5 {
                ptx.append(
                    &flow(i),
                    "record",
                    SchemaVersion::V1,
                    &serde_json::json!({}),
                )?;
            }
            Ok::<_, ordo_core::AppendError>(())
        })
        .unwrap();
    assert_eq!(notifications(&mut raw, 1).len(), 1, "one per transaction");
    heard(&mut watcher, "the batch heard");
    std::thread::sleep(QUIET);
    assert!(!watcher.changed_elsewhere().unwrap(), "nothing new");
}

#[test]
fn a_handle_passes_by_what_its_signal_already_raised() {
    let (_dir, target) = fresh_database();
    let mut watcher = consumer(&target, "watcher");
    let mut sibling = consumer(&target, "sibling");
    let mut raw = listening(&target, watcher.notify_channel());
    assert!(watcher.changed_elsewhere().unwrap(), "the first look");
    let signal = watcher.signal();
    let seen = signal.generation();

    sibling.receive_batch(&[event("s-1", 1, 1)]).unwrap();
    assert_eq!(
        signal.generation(),
        seen + 1,
        "the signal woke this process"
    );
    assert_eq!(notifications(&mut raw, 1).len(), 1, "and it notified");
    std::thread::sleep(QUIET);
    assert!(!watcher.changed_elsewhere().unwrap(), "passed by");
}

/// The newest listening session of `store` (its `application_name` and
/// `-listen`) on the test's database, if any.
fn listener_pid(c: &mut Client, store: &PgConsumer) -> Option<i32> {
    let name = format!("{}-listen", store.connection().application_name());
    c.query_opt(
        "SELECT pid FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = $1
         ORDER BY backend_start DESC LIMIT 1",
        &[&name],
    )
    .unwrap()
    .map(|row| row.get(0))
}

#[test]
fn a_lost_listener_is_reported_once_then_opened_again_and_a_dropped_one_ends() {
    let (_dir, target) = fresh_database();
    let mut watcher = consumer(&target, "watcher");
    let mut receiver = consumer(&elsewhere(&target), "receiver");
    let mut admin = client(&target);
    assert_eq!(listener_pid(&mut admin, &watcher), None, "opened lazily");
    assert!(watcher.changed_elsewhere().unwrap(), "the first look");
    let pid = listener_pid(&mut admin, &watcher).expect("a listening session");
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap();
    let mut failure = None;
    wait_until("the lost listener reported", BOUND, || {
        match watcher.changed_elsewhere() {
            Ok(_) => false,
            Err(e) => {
                failure = Some(e);
                true
            }
        }
    });
    let failure = failure.unwrap();
    assert_eq!(
        failure.kind(),
        ordo_core::ErrorKind::ConnectionLost,
        "{failure}"
    );
    assert!(watcher.changed_elsewhere().unwrap(), "opened again");
    assert_ne!(listener_pid(&mut admin, &watcher), Some(pid));
    receiver.receive_batch(&[event("l-1", 1, 1)]).unwrap();
    heard(&mut watcher, "heard on the new listener");

    let pid = listener_pid(&mut admin, &watcher).expect("a listening session");
    drop(watcher);
    wait_until("the dropped handle's listener gone", BOUND, || {
        admin
            .query_opt("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .unwrap()
            .is_none()
    });
}

const CHILD_ENV: &str = "ORDO_PG_WAKE_CHILD";

/// The child's part: receive one event into the consumer of the database
/// named by the environment, then exit. Does nothing in an ordinary run.
#[test]
fn child_receives_one_event() {
    let Ok(target) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut inbox = consumer(&target, "child");
    let receipts = inbox.receive_batch(&[event("from-child", 1, 1)]).unwrap();
    assert_eq!(receipts, vec![Receipt::Accepted]);
}

/// The child's part on the producer side: append one event to the
/// producer of the database named by the environment, then exit.
#[test]
fn child_appends_one_event() {
    let Ok(target) = std::env::var(CHILD_APPEND_ENV) else {
        return;
    };
    append(&mut producer(&target, "child", LEASE_MS), &flow(7)).unwrap();
}

const CHILD_APPEND_ENV: &str = "ORDO_PG_WAKE_CHILD_APPEND";

/// Runs this test binary again as `test`, with `env` naming `target`.
fn child(test: &str, env: &str, target: &str) {
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--quiet"])
        .env(env, target)
        .status()
        .unwrap();
    assert!(status.success(), "the child ran {test}");
}

/// Starts a loop on a runner whose polls are long (`start` hands it the
/// sender for what the loop handles), lets it find nothing and settle into
/// its long wait, runs `test` in a child, and returns the first thing the
/// loop sends, which must come long before its poll, with the runner's
/// report once stopped.
fn woken_by_child<T>(
    start: impl FnOnce(&mut Runner, mpsc::Sender<T>),
    test: &str,
    env: &str,
    target: &str,
) -> (T, ordo_runtime::RunReport) {
    let mut runner = Runner::new(RunnerOptions {
        poll_ms_min: 30_000,
        poll_ms_max: 30_000,
        ..RunnerOptions::default()
    });
    let (sender, seen) = mpsc::channel();
    start(&mut runner, sender);
    std::thread::sleep(Duration::from_millis(300));
    child(test, env, target);
    let first = seen
        .recv_timeout(BOUND)
        .expect("woken long before the poll");
    (first, runner.stop().unwrap())
}

#[test]
fn an_idle_relay_loop_wakes_on_another_process_append_long_before_its_poll() {
    let (_dir, target) = fresh_database();
    let start = |runner: &mut Runner, relayed: mpsc::Sender<u64>| {
        let observe = move |round: &ordo_runtime::RelayRound| {
            relayed.send(round.totals.accepted).unwrap();
        };
        let relay = producer(&target, "relay", LEASE_MS);
        runner
            .spawn_relay_to(relay, consumer(&target, "inbox"), observe)
            .unwrap();
    };
    let (accepted, report) =
        woken_by_child(start, "child_appends_one_event", CHILD_APPEND_ENV, &target);
    assert_eq!(accepted, 1);
    assert_eq!(report.relay.accepted, 1);
}

#[test]
fn an_idle_apply_loop_wakes_on_another_process_receive_long_before_its_poll() {
    let (_dir, target) = fresh_database();
    let start = |runner: &mut Runner, applied: mpsc::Sender<String>| {
        let handler = move |_: &mut ApplyContext<PgTx>, e: &Envelope| {
            applied.send(e.flow_id.to_string()).unwrap();
            Ok(Verdict::Apply)
        };
        runner
            .spawn_apply(consumer(&target, "applier"), handler)
            .unwrap();
    };
    let (flow, report) = woken_by_child(start, "child_receives_one_event", CHILD_ENV, &target);
    assert_eq!(flow, "from-child");
    assert_eq!(report.apply.applied, 1);
}
