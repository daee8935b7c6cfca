//! The group-committing producer in a real process: 64 producer threads
//! stopped at the group commit's crash points, before and after the
//! commit. Nothing is acknowledged that is not committed, and a restart
//! finishes every flow with each seq committed once.

mod common;

use std::path::Path;
use std::process::Command;

use ordo_core::crash;
use serde_json::Value;

const FLOWS: &str = "300";

/// `ordo worker produce` with 64 threads over the flows, recording acks;
/// with `crash_point` armed if given. Returns the exit status.
fn produce(dir: &Path, crash_point: Option<&str>) -> (i32, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ordo"));
    command
        .args(["--json", "worker", "produce", "--producer"])
        .arg(dir.join("p.db"))
        .args([
            "--count",
            FLOWS,
            "--quantity",
            "7",
            "--threads",
            "64",
            "--acks",
        ])
        .arg(dir.join("acks.log"));
    match crash_point {
        Some(point) => command.env(crash::CRASH_POINT_ENV, point),
        None => command.env_remove(crash::CRASH_POINT_ENV),
    };
    let out = command.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn acks(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("acks.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn outbox(dir: &Path) -> Vec<String> {
    let conn = ordo_sqlite::rusqlite::Connection::open(dir.join("p.db")).unwrap();
    let mut stmt = conn
        .prepare("SELECT event_id FROM outbox ORDER BY position")
        .unwrap();
    let ids = stmt.query_map([], |row| row.get(0)).unwrap();
    ids.map(Result::unwrap).collect()
}

/// After the crash, a run to the end: every flow's three events once, every
/// ack in the outbox, and the events committed before the crash never
/// acknowledged by the second run either (they were found done: stale).
fn finish_and_check(dir: &Path, committed_by_crashed_run: usize) {
    let (code, stdout) = produce(dir, None);
    assert_eq!(code, 0, "{stdout}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let flows: usize = FLOWS.parse().unwrap();
    assert_eq!(
        report["committed"].as_u64().unwrap() as usize,
        flows * 3 - committed_by_crashed_run
    );
    let stored = outbox(dir);
    assert_eq!(stored.len(), flows * 3, "each seq committed once");
    let acked = acks(dir);
    assert_eq!(acked.len(), flows * 3 - committed_by_crashed_run);
    for id in &acked {
        assert!(stored.contains(id), "{id} acknowledged, not committed");
    }
}

#[test]
fn a_crash_before_the_group_commit_keeps_nothing_and_acknowledges_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _) = produce(dir.path(), Some(crash::PRODUCER_GROUP_BEFORE_COMMIT));
    assert_eq!(code, crash::CRASH_EXIT_STATUS);
    assert!(acks(dir.path()).is_empty());
    assert!(outbox(dir.path()).is_empty());
    finish_and_check(dir.path(), 0);
}

#[test]
fn a_crash_between_the_group_commit_and_the_callers_keeps_the_batch_unacknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _) = produce(dir.path(), Some(crash::PRODUCER_GROUP_AFTER_COMMIT));
    assert_eq!(code, crash::CRASH_EXIT_STATUS);
    assert!(acks(dir.path()).is_empty(), "no caller was told");
    let committed = outbox(dir.path()).len();
    assert!(committed >= 1, "the batch committed");
    finish_and_check(dir.path(), committed);
}
