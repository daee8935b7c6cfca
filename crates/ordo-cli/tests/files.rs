//! Which files the `ordo` binary opens and creates: one file never serves
//! both roles by any name, foreign SQLite files stay untouched, a path is
//! never an SQLite URI, and racing processes create a new file safely.

mod common;

use std::io::Write;
use std::process::{Child, Command, Stdio};

use common::{bytes, first_advance, reservation, run, run_bytes, Files, Lab, Out};
use ordo_sqlite::rusqlite::Connection;

/// The files in the lab's directory, by name, sorted.
fn names(lab: &Lab) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(lab.dir.path())
        .expect("the lab directory is readable")
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `ordo init --json --producer P --consumer C`.
fn init(producer: &str, consumer: &str) -> Out {
    run(&[
        "init",
        "--json",
        "--producer",
        producer,
        "--consumer",
        consumer,
    ])
}

#[test]
fn exit_2_after_writing_a_symlinked_or_dotted_same_file() {
    let lab = Lab::new();
    std::fs::create_dir(lab.path("sub")).unwrap();
    let link = |target: &str, name: &str| std::os::unix::fs::symlink(target, lab.path(name));
    // A dangling link, a chain of dangling links, a link into a directory.
    link("x.db", "y.db").unwrap();
    link("chain2.db", "chain1.db").unwrap();
    link("sub/../chain3.db", "chain2.db").unwrap();
    link("sub", "dir").unwrap();
    let cases = [
        ("x.db", "y.db"),
        ("y.db", "x.db"),
        ("chain3.db", "chain1.db"),
        ("n.db", "sub/../n.db"),
        ("dir/m.db", "sub/m.db"),
    ];
    let before = names(&lab);
    for (producer, consumer) in cases {
        let out = init(&lab.path(producer), &lab.path(consumer));
        out.usage("same file");
        assert_eq!(
            names(&lab),
            before,
            "{producer} / {consumer}: a file was created"
        );
        let receive = run_bytes(
            &[
                "relay",
                "--producer",
                &lab.path(producer),
                "--consumer",
                &lab.path(consumer),
            ],
            b"",
        );
        receive.usage("same file");
        assert_eq!(
            names(&lab),
            before,
            "{producer} / {consumer}: a file was created"
        );
    }
}

#[test]
fn a_loop_of_symlinks_is_an_error_before_anything_is_created() {
    let lab = Lab::new();
    std::os::unix::fs::symlink("b.db", lab.path("a.db")).unwrap();
    std::os::unix::fs::symlink("a.db", lab.path("b.db")).unwrap();
    let before = names(&lab);
    init(&lab.path("a.db"), &lab.c).storage_error();
    init(&lab.p, &lab.path("a.db")).storage_error();
    assert_eq!(names(&lab), before, "a file was created");
}

#[test]
fn hard_links_to_one_file_are_refused_before_writing() {
    let lab = Lab::new();
    let (h1, h2) = (lab.path("h1.db"), lab.path("h2.db"));
    std::fs::write(&h1, b"").unwrap();
    std::fs::hard_link(&h1, &h2).unwrap();
    init(&h1, &h2).usage("same file");
    assert_eq!(bytes(&h1), Some(Vec::new()), "h1.db was written");
    assert_eq!(names(&lab), ["h1.db", "h2.db"]);
    // Also once the file is an initialised producer file.
    init(&h1, &lab.c).json();
    let before = Files::of(&[&h1, &lab.c]);
    init(&h1, &h2).usage("same file");
    Files::of(&[&h1, &lab.c]).assert_unchanged(&before, "a hard link was refused");
    assert!(ordo_sqlite::same_file(&h1, &h2).unwrap());
}

/// Writes a foreign SQLite file at `path` with `sql`, in the default
/// rollback journal mode (so that its bytes are all in the one file).
fn foreign(path: &str, sql: &str) {
    let conn = Connection::open(path).expect("create the foreign file");
    conn.execute_batch(sql).expect("write the foreign file");
}

/// Runs every command that opens a file on `path` (as producer, then as
/// consumer), each expected to refuse it with exit 2 and leave it and the
/// other file untouched.
fn assert_refused_untouched(lab: &Lab, path: &str, needle: &str) {
    let before = Files::of(&[path, &lab.p, &lab.c]);
    let envelope = reservation("A", 1, "reserved", 1);
    let outs = [
        run_bytes(&["receive", "--json", "--consumer", path], b""),
        run_bytes(&["receive", "--consumer", path], envelope.as_bytes()),
        run(&["apply", "--consumer", path]),
        init(&lab.p, path),
        init(path, &lab.c),
        run(&first_advance(path, "A")),
        run(&["snapshot", "--producer", path, "--consumer", &lab.c]),
    ];
    for out in outs {
        out.usage(needle);
        Files::of(&[path, &lab.p, &lab.c]).assert_unchanged(&before, "a foreign file was refused");
    }
}

#[test]
fn a_foreign_file_with_only_a_view_is_refused_untouched() {
    let lab = Lab::new();
    let path = lab.path("v.db");
    foreign(
        &path,
        "CREATE VIEW v AS SELECT 1 AS one; PRAGMA user_version = 42;",
    );
    assert_refused_untouched(&lab, &path, "ordo did not create");
}

#[test]
fn a_foreign_file_with_an_application_id_is_refused_untouched() {
    let lab = Lab::new();
    let path = lab.path("a.db");
    foreign(&path, "PRAGMA application_id = 1234;");
    assert_refused_untouched(&lab, &path, "another program");
    // With only a user_version, or only an index's table, it is foreign too.
    let versioned = lab.path("u.db");
    foreign(&versioned, "PRAGMA user_version = 7;");
    assert_refused_untouched(&lab, &versioned, "ordo did not create");
    let indexed = lab.path("i.db");
    foreign(
        &indexed,
        "CREATE TABLE t (a); CREATE INDEX t_a ON t (a); \
         CREATE TRIGGER t_ins AFTER INSERT ON t BEGIN SELECT 1; END;",
    );
    assert_refused_untouched(&lab, &indexed, "ordo did not create");
}

#[test]
fn paths_are_not_read_as_sqlite_uris() {
    let lab = Lab::new();
    let envelope = reservation("A", 1, "reserved", 1);
    for name in ["file:lit.db", "file:c.db?cache=shared", "file:d.db?psow=0"] {
        let out = Command::new(env!("CARGO_BIN_EXE_ordo"))
            .current_dir(lab.dir.path())
            .args(["receive", "--json", "--consumer", name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                child.stdin.take().unwrap().write_all(envelope.as_bytes())?;
                child.wait_with_output()
            })
            .expect("ordo runs");
        assert!(out.status.success(), "{name}: {out:?}");
        let file = lab.path(name);
        let conn = Connection::open_with_flags(
            &file,
            ordo_sqlite::rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap_or_else(|e| panic!("{name} was not created: {e}"));
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM inbox", [], |row| row.get(0))
            .unwrap();
        assert_eq!(rows, 1, "{name}: the envelope is in the file of that name");
    }
    let created = names(&lab);
    for wrong in ["lit.db", "c.db", "d.db"] {
        assert!(
            !created.iter().any(|n| n == wrong),
            "{wrong} was created: {created:?}"
        );
    }
}

/// Runs `ordo` with `ORDO_NOW_MS` set to raw bytes.
fn run_with_now(now: &std::ffi::OsStr, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(args)
        .env("ORDO_NOW_MS", now)
        .stdin(Stdio::null())
        .output()
        .expect("ordo runs")
}

#[test]
fn ordo_now_ms_that_is_not_utf8_is_refused() {
    use std::os::unix::ffi::OsStrExt;
    let lab = Lab::new();
    let args = ["receive", "--json", "--consumer", lab.c.as_str()];
    for now in [&b"12\xff34"[..], b"\xff", b"garbage", b""] {
        let out = run_with_now(std::ffi::OsStr::from_bytes(now), &args);
        assert_eq!(out.status.code(), Some(2), "{now:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{now:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.starts_with("error: ORDO_NOW_MS"),
            "{now:?}: {stderr}"
        );
        assert_eq!(
            bytes(&lab.c),
            None,
            "{now:?}: the consumer file was created"
        );
    }
    let out = run_with_now(std::ffi::OsStr::new("1234"), &args);
    assert!(out.status.success(), "{out:?}");
}

/// Runs `ordo ARGS` while this process holds a lock on `path` (taken by
/// `begin`) for `held_ms`, then releases it.
fn run_while_locked(path: &str, begin: &str, args: &[&str], held_ms: u64) -> Out {
    let lock = Connection::open(path).expect("open the file");
    lock.execute_batch(begin).expect("take the lock");
    let child = Command::new(env!("CARGO_BIN_EXE_ordo"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ordo starts");
    std::thread::sleep(std::time::Duration::from_millis(held_ms));
    lock.execute_batch("COMMIT").expect("release the lock");
    let out = child.wait_with_output().expect("ordo runs");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

#[test]
fn concurrent_first_open_waits_for_the_lock_within_the_busy_timeout() {
    let lab = Lab::new();
    std::fs::write(&lab.c, b"").unwrap();
    let receive = |timeout_ms, path| {
        [
            "--busy-timeout-ms",
            timeout_ms,
            "receive",
            "--json",
            "--consumer",
            path,
        ]
    };
    let out = run_while_locked(&lab.c, "BEGIN IMMEDIATE", &receive("10000", &lab.c), 300);
    assert_eq!(out.json(), serde_json::json!({"receipts": []}));
    // A busy timeout shorter than the lock is still a `Busy` failure.
    let other = lab.path("other.db");
    std::fs::write(&other, b"").unwrap();
    let out = run_while_locked(&other, "BEGIN IMMEDIATE", &receive("50", &other), 600);
    out.storage_error();
    assert!(out.stderr.contains("locked"), "{out:#?}");
    // The check of both files before either is created waits too.
    let (p, c) = (lab.path("p2.db"), lab.path("c2.db"));
    std::fs::write(&c, b"").unwrap();
    let init = ["init", "--json", "--producer", &p, "--consumer", &c];
    let out = run_while_locked(&c, "BEGIN EXCLUSIVE", &init, 300);
    assert_eq!(
        out.json(),
        serde_json::json!({"producer": p, "consumer": c})
    );
}

/// The most rounds of racing processes in one test.
const RACE_ROUNDS: usize = 8;
/// Racing processes per side and round.
const RACERS_PER_SIDE: usize = 6;

/// A starting line: a FIFO that processes wait on (each reads one line from
/// it) before they become `ordo`, so that they all start at once.
struct StartingLine {
    path: std::path::PathBuf,
    writer: std::fs::File,
}

impl StartingLine {
    fn new(lab: &Lab) -> StartingLine {
        let path = lab.dir.path().join("start.fifo");
        let made = Command::new("mkfifo")
            .arg(&path)
            .status()
            .expect("mkfifo runs");
        assert!(made.success(), "mkfifo {path:?}");
        // Read and write, so that opening does not wait for a reader and the
        // racers' opens do not wait for a writer.
        let writer = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open the FIFO");
        StartingLine { path, writer }
    }

    /// `ordo ARGS`, started once [`StartingLine::go`] is called.
    fn racer(&self, args: &[&str]) -> Command {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(r#"read _ < "$START_FIFO" && exec "$0" "$@""#)
            .arg(env!("CARGO_BIN_EXE_ordo"))
            .args(args)
            .env("START_FIFO", &self.path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command
    }

    /// Lets `racers` processes go (one line each).
    fn go(&mut self, racers: usize) {
        self.writer.write_all(&b"\n".repeat(racers)).unwrap();
    }
}

fn spawn_advance(line: &StartingLine, producer: &str, flow: &str) -> Child {
    line.racer(&["advance", "--producer", producer, "--flow", flow])
        .args(["--expected-seq", "0", "--to", "reserved", "--quantity", "1"])
        .stdin(Stdio::null())
        .spawn()
        .expect("sh starts")
}

fn spawn_receive(line: &StartingLine, consumer: &str, envelope: &str) -> Child {
    let mut child = line
        .racer(&["receive", "--consumer", consumer])
        .stdin(Stdio::piped())
        .spawn()
        .expect("sh starts");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(envelope.as_bytes()).unwrap();
    child
}

/// One round: every racer on files that do not exist yet.
fn race(round: usize) {
    let lab = Lab::new();
    let mut line = StartingLine::new(&lab);
    let mut children = Vec::new();
    for i in 0..RACERS_PER_SIDE {
        let flow = format!("F{i}");
        children.push(spawn_advance(&line, &lab.p, &flow));
        let envelope = reservation(&flow, 1, "reserved", 1);
        children.push(spawn_receive(&line, &lab.c, &envelope));
    }
    // Most racers are waiting at the line by then; a late one still starts.
    std::thread::sleep(std::time::Duration::from_millis(200));
    line.go(children.len());
    for child in children {
        let out = child.wait_with_output().expect("ordo runs");
        assert!(
            out.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let snapshot = lab.run_both("snapshot", &[]).json();
    for (side, table) in [
        ("producer", "flows"),
        ("producer", "outbox"),
        ("consumer", "inbox"),
    ] {
        let rows = snapshot[side][table].as_array().unwrap().len();
        assert_eq!(rows, RACERS_PER_SIDE, "round {round}: {side} {table}");
    }
}

#[test]
fn concurrent_first_open_of_missing_files_all_succeed() {
    for round in 0..RACE_ROUNDS {
        race(round);
    }
}
