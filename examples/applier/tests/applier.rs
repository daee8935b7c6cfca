//! The applier example as a user deploys it: its own process on a store
//! that another process receives into, on an SQLite file and on a
//! PostgreSQL database; stopped by SIGTERM, killed, restarted; every event
//! applied exactly once.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ordo_core::{Envelope, Receive, SystemClock};
use ordo_postgres::postgres::{Client, NoTls};

const PATIENCE: Duration = Duration::from_secs(30);

/// A running applier process, its stdout read line by line.
struct Applier {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Applier {
    fn start(store: &str) -> Applier {
        let mut child = Command::new(env!("CARGO_BIN_EXE_applier"))
            .arg(store)
            .stdout(Stdio::piped())
            .spawn()
            .expect("the applier starts");
        let stdout = child.stdout.take().expect("piped");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let applier = Applier { child, lines };
        let first = applier
            .lines
            .recv_timeout(PATIENCE)
            .expect("its first line");
        assert!(first.starts_with("applying "), "{first}");
        applier
    }

    fn signal(&self, name: &str) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args([name, &pid]).status().unwrap();
        assert!(status.success());
    }

    /// SIGTERM: the loop stops after its page and the process exits 0.
    fn terminate(mut self) {
        self.signal("-TERM");
        let status = self.child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "a clean stop");
        // The reading thread ends with the process's stdout.
        let last: Vec<String> = self.lines.iter().collect();
        assert!(
            last.iter().any(|l| l.starts_with("stopped after ")),
            "{last:?}"
        );
    }

    /// SIGKILL: a crash at whatever instant.
    fn kill(mut self) {
        self.signal("-KILL");
        self.child.wait().unwrap();
    }
}

impl Drop for Applier {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn event(flow: &str, seq: i64) -> Envelope {
    Envelope::from_value(serde_json::json!({
        "event_id": format!("{flow}-{seq}"), "flow_id": flow, "seq": seq,
        "schema_version": 1, "type": "credited", "payload": {"amount": seq * 10},
    }))
    .unwrap()
}

/// Waits until `count` reads `want` ledger rows.
#[track_caller]
fn until_rows(mut count: impl FnMut() -> i64, want: i64) {
    let started = Instant::now();
    loop {
        let rows = count();
        if rows == want {
            return;
        }
        assert!(rows < want, "{rows} rows, more than the {want} events");
        assert!(started.elapsed() < PATIENCE, "{rows} of {want} rows");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The life of a deployment on `store`: events received by this process
/// while the applier runs, a clean stop, events received while it is
/// down, a restart, a kill, another restart. `receive` stores events as
/// `ordo serve` would; `count` reads the ledger; `applied` the inbox rows
/// applied.
fn deployment(
    store: &str,
    mut receive: impl FnMut(&[Envelope]),
    mut count: impl FnMut() -> i64,
    mut applied: impl FnMut() -> i64,
) {
    let applier = Applier::start(store);
    receive(&[event("a", 1), event("a", 2), event("b", 1)]);
    until_rows(&mut count, 3);
    applier.terminate();
    receive(&[event("a", 3), event("c", 1), event("b", 2)]);
    let applier = Applier::start(store);
    until_rows(&mut count, 6);
    applier.kill();
    receive(&[event("c", 2), event("a", 4)]);
    let applier = Applier::start(store);
    until_rows(&mut count, 8);
    // A redelivery of what is applied changes nothing.
    receive(&[event("a", 1), event("c", 2)]);
    applier.terminate();
    assert_eq!((count(), applied()), (8, 8), "each event applied once");
}

#[test]
fn the_applier_process_on_an_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let store = path.to_str().unwrap().to_owned();
    // The first start creates the store for the domain.
    Applier::start(&store).terminate();
    let options = ordo_sqlite::OpenOptions::default();
    let mut inbox = ordo_sqlite::ConsumerDb::open_existing(&path, Arc::new(SystemClock), &options)
        .expect("the store the applier created");
    let conn = ordo_sqlite::rusqlite::Connection::open(&path).unwrap();
    let query = |sql: &str| -> i64 { conn.query_row(sql, [], |row| row.get(0)).unwrap() };
    deployment(
        &store,
        |events| {
            inbox.receive_batch(events).unwrap();
        },
        || query("SELECT count(*) FROM ledger"),
        || query("SELECT count(*) FROM inbox WHERE status = 'applied'"),
    );
}

fn server() -> String {
    std::env::var("ORDO_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
        .trim_end_matches('/')
        .to_owned()
}

/// A database of this test's own, dropped when it ends.
struct Database {
    name: String,
}

impl Database {
    fn create() -> Database {
        let name = format!("ordo_applier_{}", std::process::id());
        let mut admin = Client::connect(&format!("{}/postgres", server()), NoTls).unwrap();
        for sql in [
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("CREATE DATABASE {name}"),
        ] {
            admin.batch_execute(&sql).unwrap();
        }
        Database { name }
    }

    fn url(&self) -> String {
        format!("{}/{}", server(), self.name)
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        if let Ok(mut admin) = Client::connect(&format!("{}/postgres", server()), NoTls) {
            let _ = admin.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

#[test]
fn the_applier_process_on_postgres() {
    let db = Database::create();
    let url = db.url();
    Applier::start(&url).terminate();
    let options = ordo_postgres::PgOptions::default();
    let mut inbox = ordo_postgres::PgConsumer::open_existing(&url, Arc::new(SystemClock), &options)
        .expect("the store the applier created");
    let mut reader = Client::connect(&url, NoTls).unwrap();
    let mut query = move |sql: &str| -> i64 { reader.query_one(sql, &[]).unwrap().get(0) };
    let query = std::cell::RefCell::new(move |sql: &str| query(sql));
    deployment(
        &url,
        |events| {
            inbox.receive_batch(events).unwrap();
        },
        || (query.borrow_mut())("SELECT count(*) FROM ledger"),
        || {
            (query.borrow_mut())(
                "SELECT count(*) FROM ordo_consumer.inbox WHERE status = 'applied'",
            )
        },
    );
}
