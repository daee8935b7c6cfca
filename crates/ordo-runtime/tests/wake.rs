//! The apply loop finds another process's receive at once: a child process
//! (this test binary, run again) receives into the consumer file while the
//! parent's loop idles with a poll interval far longer than the test waits,
//! so only the file's `data_version` can wake it.

use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use ordo_core::{ApplyContext, Envelope, Receive, Verdict};
use ordo_runtime::{Runner, RunnerOptions};
use ordo_sqlite::rusqlite::Connection;
use ordo_sqlite::{ConsumerDb, Schema};

const CHILD_ENV: &str = "ORDO_RUNTIME_WAKE_CHILD";
/// Longer than the test waits: a loop that only polls cannot pass.
const POLL_MS: u64 = 120_000;
const WAIT: Duration = Duration::from_secs(30);

fn schema() -> Schema {
    Schema::new("wake").unwrap()
}

/// The one event the child receives.
fn child_event() -> Envelope {
    Envelope::parse_str(
        r#"{"event_id": "from-child-1", "flow_id": "from-child", "seq": 1,
            "schema_version": 1, "type": "noted", "payload": {}}"#,
    )
    .unwrap()
}

/// The child's part: receive one event into the file named by the
/// environment, then exit. Does nothing in an ordinary run.
#[test]
fn child_receives_one_event() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut inbox = ConsumerDb::open(&path, &schema()).unwrap();
    inbox.receive(&child_event()).unwrap();
}

fn receive_in_child(path: &Path) {
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_receives_one_event", "--quiet"])
        .env(CHILD_ENV, path)
        .status()
        .unwrap();
    assert!(status.success(), "the child received");
}

#[test]
fn an_idle_apply_loop_wakes_on_another_process_receive() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("consumer.db");
    let consumer = ConsumerDb::open(&path, &schema()).unwrap();
    let (applied, seen) = mpsc::channel();
    let handler = move |_: &mut ApplyContext<Connection>, e: &Envelope| {
        applied.send(e.flow_id.to_string()).unwrap();
        Ok(Verdict::Apply)
    };
    let mut runner = Runner::new(RunnerOptions {
        poll_ms_min: POLL_MS,
        poll_ms_max: POLL_MS,
        ..RunnerOptions::default()
    });
    runner.spawn_apply(consumer, handler).unwrap();
    // Let the loop find nothing and start its long wait.
    std::thread::sleep(Duration::from_millis(200));
    receive_in_child(&path);
    let flow = seen
        .recv_timeout(WAIT)
        .expect("applied long before the poll");
    assert_eq!(flow, "from-child");
    let report = runner.stop().unwrap();
    assert_eq!(report.apply.applied, 1);
}
