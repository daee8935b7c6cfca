//! Unknown commit outcomes, resolved by transaction id: the resolution
//! asked of real committed, aborted and in-progress transactions, and a
//! store whose connection is cut (by a proxy between it and the server)
//! right after its COMMIT reached the server, or right before.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ordo_core::{
    ApplyContext, ApplyHandler, ConsumerStore, Envelope, ErrorKind, Receive, StoreError, Verdict,
};
use ordo_postgres::postgres::Client;
use ordo_postgres::{PgTx, TxOutcome};
use support::workers::{append, client, consumer, flow, producer, wait_until};
use support::{database_for, serial, server, url};

const BOUND: Duration = Duration::from_secs(60);

/// The test's own database (the tests of this file run one at a time).
struct TestDatabase {
    _serial: MutexGuard<'static, ()>,
    _dir: tempfile::TempDir,
    name: String,
}

impl TestDatabase {
    fn new() -> TestDatabase {
        let serial = serial();
        let dir = tempfile::tempdir().unwrap();
        let name = database_for(dir.path());
        TestDatabase {
            _serial: serial,
            _dir: dir,
            name,
        }
    }

    fn url(&self) -> String {
        url(&self.name)
    }
}

/// The id of the server process behind `connection`.
fn backend_pid(connection: &PgTx) -> i32 {
    connection
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0)
}

/// A consumer (`apply`) on `target` that has received flow 1's first
/// event, appended by a producer (`source`) there.
fn received_one(target: &str) -> ordo_postgres::PgConsumer {
    let mut source = producer(target, "source", 60_000);
    let event = append(&mut source, &flow(1)).unwrap();
    let mut inbox = consumer(target, "apply");
    inbox.receive(&event).unwrap();
    inbox
}

/// Begins a transaction on `c` that writes a row, and returns its id.
fn writing_transaction(c: &mut Client, seq: i64) -> i64 {
    c.batch_execute("BEGIN").unwrap();
    c.execute(
        "INSERT INTO handled (flow_id, seq) VALUES ('outcome', $1)",
        &[&seq],
    )
    .unwrap();
    c.query_one("SELECT txid_current()", &[]).unwrap().get(0)
}

#[test]
fn the_server_says_committed_aborted_or_unknown() {
    let db = TestDatabase::new();
    let target = db.url();
    let store = consumer(&target, "asker");
    let ask = |txid| store.connection().transaction_outcome(txid).unwrap();

    let mut c = client(&target);
    let committed = writing_transaction(&mut c, 1);
    c.batch_execute("COMMIT").unwrap();
    assert_eq!(ask(committed), TxOutcome::Committed);

    let rolled_back = writing_transaction(&mut c, 2);
    c.batch_execute("ROLLBACK").unwrap();
    assert_eq!(ask(rolled_back), TxOutcome::Aborted);

    // A connection lost before its COMMIT: the transaction never committed.
    let mut victim = client(&target);
    let victim_pid: i32 = victim
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let lost = writing_transaction(&mut victim, 3);
    c.execute("SELECT pg_terminate_backend($1)", &[&victim_pid])
        .unwrap();
    wait_until("the victim's backend is gone", BOUND, || {
        c.query_opt(
            "SELECT 1 FROM pg_stat_activity WHERE pid = $1",
            &[&victim_pid],
        )
        .unwrap()
        .is_none()
    });
    assert_eq!(ask(lost), TxOutcome::Aborted);

    // Still open after the bounded wait: unknown, never a guess.
    let open = writing_transaction(&mut c, 4);
    assert_eq!(ask(open), TxOutcome::Unknown);
    c.batch_execute("ROLLBACK").unwrap();

    let rows: i64 = c
        .query_one("SELECT count(*) FROM handled", &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, 1, "only the committed transaction's row");
}

/// Where the proxy cuts the next connection that sends COMMIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    Never,
    /// The COMMIT is not forwarded: the server sees the connection end
    /// inside the transaction.
    BeforeCommit,
    /// The COMMIT is forwarded and its answer dropped: the server
    /// committed, the client cannot tell.
    AfterCommit,
}

/// A TCP proxy to the test server that cuts one connection at a COMMIT,
/// and refuses new connections while `refusing`.
struct Proxy {
    port: u16,
    cut: Arc<Mutex<Cut>>,
    refusing: Arc<AtomicBool>,
}

impl Proxy {
    fn start() -> Proxy {
        let config: ordo_postgres::postgres::Config = server().parse().unwrap();
        let host = match &config.get_hosts()[0] {
            ordo_postgres::postgres::config::Host::Tcp(host) => host.clone(),
            #[cfg(unix)]
            other => panic!("the proxy needs a TCP server, not {other:?}"),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let upstream: SocketAddr = format!("{host}:{port}").parse().expect("an IP address");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = Proxy {
            port: listener.local_addr().unwrap().port(),
            cut: Arc::new(Mutex::new(Cut::Never)),
            refusing: Arc::new(AtomicBool::new(false)),
        };
        let (cut, refusing) = (proxy.cut.clone(), proxy.refusing.clone());
        std::thread::spawn(move || {
            for incoming in listener.incoming() {
                let Ok(near) = incoming else { return };
                if refusing.load(Ordering::SeqCst) {
                    let _ = near.shutdown(Shutdown::Both);
                    continue;
                }
                let far = TcpStream::connect(upstream).expect("reach the server");
                pump(near, far, cut.clone());
            }
        });
        proxy
    }

    /// The URL of `database` through the proxy.
    fn url(&self, database: &str) -> String {
        let config: ordo_postgres::postgres::Config = server().parse().unwrap();
        format!(
            "postgres://{}@127.0.0.1:{}/{database}",
            config.get_user().unwrap_or("postgres"),
            self.port
        )
    }

    fn arm(&self, cut: Cut) {
        *self.cut.lock().unwrap() = cut;
    }
}

/// Copies both ways between a client and the server, cutting at a COMMIT
/// when armed.
fn pump(near: TcpStream, far: TcpStream, cut: Arc<Mutex<Cut>>) {
    let drop_answer = Arc::new(AtomicBool::new(false));
    let (mut near_r, mut far_w) = (near.try_clone().unwrap(), far.try_clone().unwrap());
    let (near_s, far_s) = (near.try_clone().unwrap(), far.try_clone().unwrap());
    let dropping = drop_answer.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        loop {
            let n = match near_r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            let is_commit = chunk.windows(7).any(|w| w == b"COMMIT\0");
            let armed = {
                let mut cut = cut.lock().unwrap();
                let armed = if is_commit { *cut } else { Cut::Never };
                if armed != Cut::Never {
                    *cut = Cut::Never;
                }
                armed
            };
            match armed {
                Cut::BeforeCommit => break,
                Cut::AfterCommit => dropping.store(true, Ordering::SeqCst),
                Cut::Never => {}
            }
            if far_w.write_all(chunk).is_err() {
                break;
            }
        }
        let _ = near_s.shutdown(Shutdown::Both);
        let _ = far_s.shutdown(Shutdown::Both);
    });
    std::thread::spawn(move || {
        let (mut far_r, mut near_w) = (far, near);
        let mut buf = [0u8; 65536];
        loop {
            let n = match far_r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // The server answered the COMMIT: it is done; the answer is lost.
            if drop_answer.load(Ordering::SeqCst) || near_w.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = near_w.shutdown(Shutdown::Both);
        let _ = far_r.shutdown(Shutdown::Both);
    });
}

fn outbox_seqs(c: &mut Client) -> Vec<i64> {
    c.query("SELECT seq FROM ordo_producer.outbox ORDER BY seq", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[test]
fn an_append_whose_commit_answer_is_lost_is_resolved() {
    let db = TestDatabase::new();
    let proxy = Proxy::start();
    let mut store = producer(&proxy.url(&db.name), "cut", 60_000);
    let mut c = client(&db.url());
    let f = flow(1);
    let first_pid = backend_pid(store.connection());

    // Committed on the server, the answer lost: resolved as committed.
    proxy.arm(Cut::AfterCommit);
    let event = append(&mut store, &f).expect("resolved as committed");
    assert_eq!(event.seq.get(), 1);
    assert_eq!(outbox_seqs(&mut c), [1]);
    assert_ne!(
        backend_pid(store.connection()),
        first_pid,
        "the lost connection was replaced"
    );

    // Cut before the COMMIT reached the server: nothing written, and the
    // error says so (retrying is safe).
    proxy.arm(Cut::BeforeCommit);
    let error = append(&mut store, &f).expect_err("the connection was cut");
    assert_eq!(error.kind(), ErrorKind::ConnectionLost, "{error}");
    assert_eq!(outbox_seqs(&mut c), [1], "nothing written");
    let event = append(&mut store, &f).expect("a new connection");
    assert_eq!(event.seq.get(), 2);

    // Committed, the answer lost, and no new connection to ask on: the
    // outcome is unknown, never a guess.
    proxy.arm(Cut::AfterCommit);
    proxy.refusing.store(true, Ordering::SeqCst);
    let error = append(&mut store, &f).expect_err("no way to ask");
    assert_eq!(error.kind(), ErrorKind::CommitOutcomeUnknown, "{error}");
    assert_eq!(outbox_seqs(&mut c), [1, 2, 3], "it had committed");
    proxy.refusing.store(false, Ordering::SeqCst);
    let event = append(&mut store, &f).expect("connected again");
    assert_eq!(event.seq.get(), 4);
}

#[test]
fn a_receive_whose_commit_answer_is_lost_is_resolved() {
    let db = TestDatabase::new();
    let proxy = Proxy::start();
    let mut source = producer(&db.url(), "source", 60_000);
    let events: Vec<Envelope> = (0..3)
        .map(|_| append(&mut source, &flow(1)).unwrap())
        .collect();
    let mut inbox = consumer(&proxy.url(&db.name), "cut");
    proxy.arm(Cut::AfterCommit);
    let receipts = inbox.receive_batch(&events).expect("resolved as committed");
    assert!(receipts.iter().all(|r| *r == ordo_core::Receipt::Accepted));
    proxy.arm(Cut::BeforeCommit);
    let error = inbox.receive_batch(&events).expect_err("cut");
    assert_eq!(error.kind(), ErrorKind::ConnectionLost, "{error}");
    let receipts = inbox.receive_batch(&events).expect("retried");
    assert!(receipts.iter().all(|r| *r == ordo_core::Receipt::Duplicate));
}

/// Fails every apply with an SQL error of the handler's own.
struct Failing;

impl ApplyHandler<PgTx> for Failing {
    fn apply(
        &mut self,
        tx: &mut ApplyContext<'_, PgTx>,
        _: &Envelope,
    ) -> Result<Verdict, StoreError> {
        tx.execute("SELECT * FROM no_such_table", &[])?;
        Ok(Verdict::Apply)
    }
}

#[test]
fn a_connection_whose_transaction_errored_is_replaced() {
    let db = TestDatabase::new();
    let mut inbox = received_one(&db.url());
    let before = backend_pid(inbox.connection());
    let error = inbox
        .apply_next_with(&ordo_core::InboxFlow::of_default(flow(1)), &mut Failing)
        .expect_err("the handler's SQL fails");
    assert!(error.to_string().contains("42P01"), "{error}");
    assert_ne!(backend_pid(inbox.connection()), before, "a new connection");
    let step = inbox
        .apply_next_with(
            &ordo_core::InboxFlow::of_default(flow(1)),
            &mut support::workers::Ordered {
                violations: Arc::default(),
            },
        )
        .unwrap();
    assert_eq!(
        step,
        ordo_core::Step::Applied {
            seq: ordo_core::Seq::FIRST
        }
    );
}

/// Runs failing SQL and swallows the error (which a handler must not do).
struct Swallowing;

impl ApplyHandler<PgTx> for Swallowing {
    fn apply(
        &mut self,
        tx: &mut ApplyContext<'_, PgTx>,
        _: &Envelope,
    ) -> Result<Verdict, StoreError> {
        let _ = tx.execute("SELECT * FROM no_such_table", &[]);
        Ok(Verdict::Apply)
    }
}

#[test]
fn a_swallowed_error_fails_the_apply_as_the_server_reports_it() {
    let db = TestDatabase::new();
    let target = db.url();
    let mut inbox = received_one(&target);
    let error = inbox
        .apply_next_with(&ordo_core::InboxFlow::of_default(flow(1)), &mut Swallowing)
        .expect_err("the transaction is aborted");
    assert!(error.to_string().contains("25P02"), "{error}");
    let applied: i64 = client(&target)
        .query_one(
            "SELECT count(*) FROM ordo_testkit.inbox WHERE status = 'applied'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(applied, 0, "nothing marked");
}
