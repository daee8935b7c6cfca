//! Opening files: whose a file is (ordo's, another application's, another
//! program's), when a file is created, and which names are the same file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ordo_core::{Envelope, ErrorKind, Receive, StoreError, SystemClock};
use ordo_sqlite::rusqlite::Connection;
use ordo_sqlite::{
    same_file, ConsumerDb, OpenOptions, ProducerDb, Schema, APPLICATION_ID, SCHEMA_VERSION,
};
use ordo_testkit::support::envelope;
use serde_json::json;

/// Event `seq` of `flow`, of type `reserved`.
fn event(flow: &str, seq: i64) -> Envelope {
    envelope(
        &format!("{flow}-{seq}"),
        flow,
        seq,
        1,
        "reserved",
        json!({ "amount": 1 }),
    )
}

fn consumer(path: &Path, options: &OpenOptions) -> Result<ConsumerDb, StoreError> {
    ConsumerDb::open_with(path, &app(), Arc::new(SystemClock), options)
}

fn producer(path: &Path, options: &OpenOptions) -> Result<ProducerDb, StoreError> {
    ProducerDb::open_with(path, &app(), Arc::new(SystemClock), options)
}

/// The domain of every store in these tests.
fn app() -> Schema {
    Schema::new("app").unwrap()
}

fn adopting() -> OpenOptions {
    OpenOptions {
        adopt: true,
        ..OpenOptions::default()
    }
}

fn pragma(path: &Path, name: &str) -> i64 {
    let conn = Connection::open(path).unwrap();
    conn.query_row(&format!("PRAGMA {name}"), [], |row| row.get(0))
        .unwrap()
}

fn count(path: &Path, sql: &str) -> i64 {
    let conn = Connection::open(path).unwrap();
    conn.query_row(sql, [], |row| row.get(0)).unwrap()
}

/// Writes a foreign SQLite file (rollback journal, all in one file).
fn foreign(path: &Path, sql: &str) -> Vec<u8> {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(sql).unwrap();
    drop(conn);
    std::fs::read(path).unwrap()
}

/// The files of `dir`, by name, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn files_ordo_creates_carry_its_application_id() {
    let dir = tempfile::tempdir().unwrap();
    let (p, c) = (dir.path().join("p.db"), dir.path().join("c.db"));
    drop(ProducerDb::open(&p, &app()).unwrap());
    drop(ConsumerDb::open(&c, &app()).unwrap());
    for path in [&p, &c] {
        assert_eq!(pragma(path, "application_id"), i64::from(APPLICATION_ID));
        assert_eq!(pragma(path, "user_version"), SCHEMA_VERSION);
    }
    assert_eq!(&APPLICATION_ID.to_be_bytes(), b"ordo");
}

#[test]
fn files_of_the_first_release_keep_opening_and_are_marked() {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("c.db");
    let mut db = ConsumerDb::open(&c, &app()).unwrap();
    db.receive_batch(&[event("A", 1)]).unwrap();
    // The first release wrote `ordo_meta`, user_version 1, no application_id.
    db.connection()
        .execute_batch("PRAGMA application_id = 0")
        .unwrap();
    drop(db);
    assert_eq!(pragma(&c, "application_id"), 0);
    ConsumerDb::check_existing(&c).unwrap();
    let db = ConsumerDb::open(&c, &app()).unwrap();
    drop(db);
    assert_eq!(pragma(&c, "application_id"), i64::from(APPLICATION_ID));
    assert_eq!(pragma(&c, "user_version"), SCHEMA_VERSION);
    assert_eq!(count(&c, "SELECT count(*) FROM inbox"), 1);
}

/// Foreign files, each with what makes it foreign.
const FOREIGN: [(&str, &str); 5] = [
    (
        "view",
        "CREATE VIEW v AS SELECT 1 AS one; PRAGMA user_version = 42;",
    ),
    ("application_id", "PRAGMA application_id = 1234;"),
    ("user_version", "PRAGMA user_version = 7;"),
    (
        "table",
        "CREATE TABLE items (id INTEGER PRIMARY KEY); INSERT INTO items VALUES (1);",
    ),
    (
        "index and trigger",
        "CREATE TABLE t (a); CREATE INDEX t_a ON t (a); \
         CREATE TRIGGER t_ins AFTER INSERT ON t BEGIN SELECT 1; END;",
    ),
];

#[test]
fn foreign_files_are_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    for (what, sql) in FOREIGN {
        let path = dir.path().join(format!("{}.db", what.replace(' ', "_")));
        let before = foreign(&path, sql);
        let files = names(dir.path());
        let refusals = [
            ProducerDb::check_existing(&path).err(),
            ConsumerDb::check_existing(&path).err(),
            producer(&path, &OpenOptions::default()).err(),
            consumer(&path, &OpenOptions::default()).err(),
        ];
        for refusal in refusals {
            let error = refusal.unwrap_or_else(|| panic!("{what}: the file was taken"));
            assert_eq!(error.kind(), ErrorKind::Incompatible, "{what}: {error}");
        }
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "{what}: file changed"
        );
        assert_eq!(names(dir.path()), files, "{what}: a file was created");
    }
}

#[test]
fn adopt_installs_ordo_tables_beside_the_applications_own() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    foreign(
        &path,
        "CREATE TABLE items (id INTEGER PRIMARY KEY); INSERT INTO items VALUES (7); \
         CREATE VIEW v AS SELECT id FROM items; PRAGMA user_version = 42;",
    );
    let mut db = consumer(&path, &adopting()).unwrap();
    db.receive_batch(&[event("A", 1)]).unwrap();
    drop(db);
    assert_eq!(
        pragma(&path, "user_version"),
        42,
        "the application's version"
    );
    assert_eq!(pragma(&path, "application_id"), 0);
    assert_eq!(count(&path, "SELECT count(*) FROM v WHERE id = 7"), 1);
    // Once adopted, it is ordo's consumer file, also without `adopt`.
    ConsumerDb::check_existing(&path).unwrap();
    let mut db = consumer(&path, &OpenOptions::default()).unwrap();
    db.receive_batch(&[event("A", 2)]).unwrap();
    drop(db);
    assert_eq!(count(&path, "SELECT count(*) FROM inbox"), 2);
    assert_eq!(pragma(&path, "user_version"), 42);
    let error = producer(&path, &adopting()).err().expect("the other role");
    assert_eq!(error.kind(), ErrorKind::Incompatible, "{error}");
}

#[test]
fn adopt_refuses_another_programs_file_and_a_taken_table_name() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "other.db",
            "CREATE TABLE t (a); PRAGMA application_id = 1234;",
        ),
        (
            "taken.db",
            "CREATE TABLE Inbox (a); PRAGMA user_version = 3;",
        ),
        (
            "meta.db",
            "CREATE TABLE t (a); CREATE INDEX outbox ON t (a);",
        ),
        (
            "view.db",
            "CREATE TABLE t (a); CREATE VIEW ordo_meta AS SELECT 1;",
        ),
    ];
    for (name, sql) in cases {
        let path = dir.path().join(name);
        let before = foreign(&path, sql);
        let opened = if name == "meta.db" {
            producer(&path, &adopting()).err()
        } else {
            consumer(&path, &adopting()).err()
        };
        let error = opened.unwrap_or_else(|| panic!("{name} was adopted"));
        assert_eq!(error.kind(), ErrorKind::Incompatible, "{name}: {error}");
        assert_eq!(std::fs::read(&path).unwrap(), before, "{name} changed");
    }
}

#[test]
fn create_false_refuses_a_missing_file_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let options = OpenOptions {
        create: false,
        ..OpenOptions::default()
    };
    let missing = dir.path().join("missing.db");
    std::os::unix::fs::symlink("target.db", dir.path().join("dangling.db")).unwrap();
    for path in [missing.clone(), dir.path().join("dangling.db")] {
        let error = consumer(&path, &options).err().expect("a missing file");
        assert_eq!(error.kind(), ErrorKind::NotFound, "{error}");
        assert!(error.to_string().contains("does not exist"), "{error}");
        let error = producer(&path, &options).err().expect("a missing file");
        assert_eq!(error.kind(), ErrorKind::NotFound, "{error}");
    }
    assert_eq!(names(dir.path()), ["dangling.db"]);
    drop(ConsumerDb::open(&missing, &app()).unwrap());
    let mut db = consumer(&missing, &options).unwrap();
    db.receive_batch(&[event("A", 1)]).unwrap();
}

/// A path in `dir`.
fn at(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

#[test]
fn same_file_sees_through_links_and_dots() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(at(d, "sub")).unwrap();
    std::fs::write(at(d, "h1.db"), b"").unwrap();
    std::fs::hard_link(at(d, "h1.db"), at(d, "h2.db")).unwrap();
    std::fs::write(at(d, "other.db"), b"").unwrap();
    std::os::unix::fs::symlink("x.db", at(d, "y.db")).unwrap();
    std::os::unix::fs::symlink("y.db", at(d, "z.db")).unwrap();
    std::os::unix::fs::symlink(at(d, "sub"), at(d, "dir")).unwrap();
    let same = [
        ("h1.db", "h2.db"),
        ("x.db", "z.db"),
        ("sub/../n.db", "n.db"),
        ("dir/m.db", "sub/m.db"),
        ("./h1.db", "h1.db"),
    ];
    for (a, b) in same {
        assert!(same_file(at(d, a), at(d, b)).unwrap(), "{a} and {b}");
    }
    for (a, b) in [
        ("h1.db", "other.db"),
        ("x.db", "n.db"),
        ("sub/m.db", "m.db"),
    ] {
        assert!(!same_file(at(d, a), at(d, b)).unwrap(), "{a} and {b}");
    }
    std::os::unix::fs::symlink("loop2.db", at(d, "loop1.db")).unwrap();
    std::os::unix::fs::symlink("loop1.db", at(d, "loop2.db")).unwrap();
    assert!(same_file(at(d, "loop1.db"), at(d, "n.db")).is_err());
    assert!(same_file(at(d, "nodir/a.db"), at(d, "n.db")).is_err());
}

/// Each store waits for a locked file as long as its own busy timeout says,
/// however long another store of the same process may wait: a store opened
/// with 50 ms gives up while a lock is held for 3 s, even after a store
/// with the default 10 s timeout was opened in this process.
#[test]
fn one_stores_busy_timeout_does_not_raise_anothers() {
    let dir = tempfile::tempdir().unwrap();
    let patient_path = dir.path().join("patient.db");
    let hasty_path = dir.path().join("hasty.db");
    let _patient = consumer(&patient_path, &OpenOptions::default()).unwrap();
    let short = OpenOptions {
        busy_timeout: std::time::Duration::from_millis(50),
        ..OpenOptions::default()
    };
    let mut hasty = consumer(&hasty_path, &short).unwrap();
    let locker = Connection::open(&hasty_path).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(3));
        locker.execute_batch("ROLLBACK").unwrap();
    });
    let error = hasty
        .receive_batch(&[event("A", 1)])
        .expect_err("the lock is held longer than this store waits");
    assert_eq!(error.kind(), ErrorKind::Busy, "{error}");
    release.join().unwrap();
    assert_eq!(
        hasty.receive_batch(&[event("A", 1)]).unwrap(),
        [ordo_core::Receipt::Accepted]
    );
}
