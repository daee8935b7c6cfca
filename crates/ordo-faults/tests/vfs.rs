//! Self-tests of the fault layer on raw SQLite files: what a power loss
//! keeps and drops, and how each injected fault surfaces.

use std::path::Path;

use ordo_faults::{Fault, FaultPlan, Tear};
use rusqlite::config::DbConfig;
use rusqlite::{ffi, Connection, ErrorCode};

/// Opens `t.db` in `dir` in WAL mode with `synchronous` set as given and
/// without the checkpoint SQLite runs when the last connection closes, so
/// that a commit stays in the WAL as it was left by the commit.
fn open(dir: &Path, synchronous: &str) -> Connection {
    let conn = Connection::open(dir.join("t.db")).expect("open");
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        .expect("no checkpoint on close");
    conn.execute_batch(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={synchronous};
         CREATE TABLE IF NOT EXISTS t (x INTEGER PRIMARY KEY, pad BLOB);"
    ))
    .expect("set up");
    conn
}

fn rows(dir: &Path) -> Vec<i64> {
    let conn = Connection::open(dir.join("t.db")).expect("reopen");
    let mut stmt = conn.prepare("SELECT x FROM t ORDER BY x").expect("prepare");
    stmt.query_map([], |row| row.get(0))
        .and_then(|rows| rows.collect())
        .expect("read rows")
}

fn integrity_ok(dir: &Path) {
    let conn = Connection::open(dir.join("t.db")).expect("reopen");
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .expect("integrity_check");
    assert_eq!(check, "ok");
}

/// A fresh directory armed with a fault plan, and `t.db` in it open with
/// `synchronous=FULL`.
fn armed() -> (tempfile::TempDir, FaultPlan, Connection) {
    let dir = tempfile::tempdir().expect("tempdir");
    let plan = FaultPlan::arm(dir.path());
    let conn = open(dir.path(), "FULL");
    (dir, plan, conn)
}

/// Asserts that `t.db` holds exactly the rows `expected` and is whole.
#[track_caller]
fn assert_intact(dir: &Path, expected: &[i64]) {
    assert_eq!(rows(dir), expected);
    integrity_ok(dir);
}

fn insert(conn: &Connection, x: i64) -> rusqlite::Result<usize> {
    conn.execute("INSERT INTO t (x, pad) VALUES (?1, zeroblob(3000))", [x])
}

#[test]
fn a_synced_commit_survives_a_power_loss() {
    let (dir, plan, conn) = armed();
    insert(&conn, 1).expect("insert");
    drop(conn);
    assert!(plan.counts().syncs > 0, "a FULL commit syncs");
    let loss = plan.simulate_power_loss(Tear::Drop).expect("power loss");
    assert_eq!(loss.undone, 0, "nothing was left unsynced: {loss:?}");
    assert_intact(dir.path(), &[1]);
}

#[test]
fn an_unsynced_commit_is_dropped_by_a_power_loss_and_kept_by_a_crash() {
    for (tear, expected) in [(Tear::Drop, vec![1]), (Tear::Keep(usize::MAX), vec![1, 2])] {
        let (dir, plan, conn) = armed();
        insert(&conn, 1).expect("insert");
        conn.execute_batch("PRAGMA synchronous=OFF").expect("OFF");
        insert(&conn, 2).expect("insert");
        assert!(
            plan.unsynced_writes() > 0,
            "the second commit is not synced"
        );
        drop(conn);
        let loss = plan.simulate_power_loss(tear).expect("power loss");
        assert!(loss.files > 0, "{loss:?}");
        assert_eq!(rows(dir.path()), expected, "{tear:?}");
        integrity_ok(dir.path());
    }
}

#[test]
fn a_torn_unsynced_commit_leaves_the_last_synced_one_whole() {
    for kept in 0..8 {
        for sectors in [0, 1, 3, 7] {
            let (dir, plan, conn) = armed();
            insert(&conn, 1).expect("insert");
            conn.execute_batch("PRAGMA synchronous=OFF").expect("OFF");
            conn.execute_batch("BEGIN; INSERT INTO t VALUES (2, zeroblob(9000)); INSERT INTO t VALUES (3, zeroblob(9000)); COMMIT;")
                .expect("a multi-page commit");
            drop(conn);
            plan.simulate_power_loss(Tear::Torn { kept, sectors })
                .expect("power loss");
            let got = rows(dir.path());
            assert!(
                got == vec![1] || got == vec![1, 2, 3],
                "kept {kept} sectors {sectors}: {got:?}"
            );
            integrity_ok(dir.path());
        }
    }
}

#[test]
fn the_nth_write_fault_surfaces_with_its_code_and_changes_nothing() {
    for (code, expected) in [
        (ffi::SQLITE_IOERR_WRITE, ErrorCode::SystemIoFailure),
        (ffi::SQLITE_FULL, ErrorCode::DiskFull),
    ] {
        for nth in 1..=3 {
            let (dir, plan, conn) = armed();
            insert(&conn, 1).expect("insert");
            plan.set(Fault::FailWrite { nth, code });
            let error = insert(&conn, 2).expect_err("the write fails");
            assert_eq!(error.sqlite_error_code(), Some(expected), "{error}");
            assert_eq!(plan.counts().injected, 1);
            assert_eq!(plan.counts().writes, nth, "the commit stops at the fault");
            drop(conn);
            assert_intact(dir.path(), &[1]);
        }
    }
}

#[test]
fn a_read_only_disk_refuses_every_write_as_read_only() {
    let (dir, plan, conn) = armed();
    insert(&conn, 1).expect("insert");
    plan.set(Fault::ReadOnly);
    for x in 2..=3 {
        let error = insert(&conn, x).expect_err("refused");
        assert_eq!(
            error.sqlite_error_code(),
            Some(ErrorCode::ReadOnly),
            "{error}"
        );
    }
    assert_eq!(plan.counts().injected, 2);
    drop(conn);
    plan.set(Fault::None);
    assert_intact(dir.path(), &[1]);
}

#[test]
fn a_failed_sync_fails_the_commit() {
    let (dir, plan, conn) = armed();
    plan.set(Fault::FailSync {
        nth: 1,
        code: ffi::SQLITE_IOERR_FSYNC,
    });
    let error = insert(&conn, 1).expect_err("the commit's sync fails");
    assert_eq!(
        error.sqlite_error_code(),
        Some(ErrorCode::SystemIoFailure),
        "{error}"
    );
    assert!(
        plan.unsynced_writes() > 0,
        "a failed sync makes nothing durable"
    );
    insert(&conn, 2).expect("the next commit syncs");
    drop(conn);
    plan.simulate_power_loss(Tear::Drop).expect("power loss");
    assert_intact(dir.path(), &[2]);
}

#[test]
fn a_power_cut_fails_every_later_write_until_the_power_loss() {
    let (dir, plan, conn) = armed();
    insert(&conn, 1).expect("insert");
    plan.set(Fault::PowerCut { nth: 1 });
    insert(&conn, 2).expect_err("the cut sync fails");
    insert(&conn, 3).expect_err("no power");
    assert!(plan.counts().injected >= 2);
    drop(conn);
    plan.simulate_power_loss(Tear::Keep(usize::MAX))
        .expect("power loss");
    insert(&open(dir.path(), "FULL"), 4).expect("the power is back");
    let got = rows(dir.path());
    assert!(got == vec![1, 4] || got == vec![1, 2, 4], "{got:?}");
    integrity_ok(dir.path());
}

#[test]
fn counts_belong_to_the_armed_directory_only() {
    let (a, b, unarmed) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let plan_a = FaultPlan::arm(a.path());
    let plan_b = FaultPlan::arm(b.path());
    plan_b.set(Fault::ReadOnly);
    insert(&open(a.path(), "FULL"), 1).expect("a is writable");
    insert(&open(unarmed.path(), "FULL"), 1).expect("an unarmed directory is untouched");
    assert!(plan_a.counts().writes > 0 && plan_a.counts().syncs > 0);
    assert_eq!(plan_b.counts(), Default::default(), "b saw nothing");
    assert_eq!(rows(unarmed.path()), vec![1]);
}

#[test]
#[should_panic(expected = "close every connection")]
fn a_power_loss_with_a_connection_open_is_refused() {
    let (_dir, plan, conn) = armed();
    insert(&conn, 1).expect("insert");
    let _ = plan.simulate_power_loss(Tear::Drop);
}
