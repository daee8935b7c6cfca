//! How fast `ordo console` answers on a store of many flows: builds a
//! producer and a consumer store of `--flows N` flows (default 100,000),
//! one event each, in batched transactions through the library, starts the
//! real `ordo console` on them, and times its pages over HTTP: the first
//! page of the flow list, a prefix search, a deep keyset page, one flow in
//! detail, and the overview. On SQLite files, and on PostgreSQL with
//! `--pg postgres://USER@HOST:PORT` (a database of its own is created
//! there, and dropped at the end).
//!
//! ```text
//! cargo build --release -p ordo-cli --bin ordo --example console_bench
//! target/release/examples/console_bench [--flows N] [--rounds R] [--pg URL]
//! ```
//!
//! The `ordo` binary is the one beside `examples/` (or `ORDO_BIN`). Each
//! page is fetched `R` times (default 50) after one warm-up; the median,
//! 95th percentile and slowest times are printed, in milliseconds.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ordo_core::{ConsumerStore, Envelope, ProducerStore, SystemClock};
use ordo_postgres::postgres::{Client, NoTls};
use ordo_postgres::{PgConsumer, PgOptions, PgProducer};

#[path = "../tests/common/process.rs"]
mod process;

use process::{start_listening, Process};

/// Events per write transaction while the stores are built.
const BATCH_LEN: usize = 5_000;

struct Args {
    flows: usize,
    rounds: usize,
    pg: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        flows: 100_000,
        rounds: 50,
        pg: None,
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let mut value = || given.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--flows" => args.flows = value()?.parse().map_err(|e| format!("--flows: {e}"))?,
            "--rounds" => args.rounds = value()?.parse().map_err(|e| format!("--rounds: {e}"))?,
            "--pg" => args.pg = Some(value()?.trim_end_matches('/').to_owned()),
            other => {
                return Err(format!(
                    "unknown argument {other} (usage: console_bench [--flows N] [--rounds R] [--pg postgres://USER@HOST:PORT])"
                ))
            }
        }
    }
    if args.flows < 1_000 || args.rounds == 0 {
        return Err("--flows must be at least 1000 and --rounds at least 1".into());
    }
    Ok(args)
}

fn main() {
    let args = args().unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2);
    });
    let ordo = ordo_binary();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (p, c) = (
        dir.path().join("producer.db"),
        dir.path().join("consumer.db"),
    );
    let options = ordo_sqlite::OpenOptions::default();
    let clock = Arc::new(SystemClock);
    let mut producer = ordo_sqlite::ProducerDb::open_with(
        &p,
        &ordo_reservation::producer_schema(),
        clock.clone(),
        &options,
    )
    .expect("create the producer file");
    let mut consumer = ordo_sqlite::ConsumerDb::open_with(
        &c,
        &ordo_reservation::consumer_schema(),
        clock,
        &options,
    )
    .expect("create the consumer file");
    fill("SQLite", &mut producer, &mut consumer, args.flows);
    drop((producer, consumer));
    let (p, c) = (path_text(&p), path_text(&c));
    measure("SQLite", &ordo, &p, &c, &args);
    if let Some(server) = &args.pg {
        let database = Database::create(server);
        let url = database.url();
        let clock = Arc::new(SystemClock);
        let options = PgOptions::default();
        let mut producer = PgProducer::open_with(
            &url,
            &ordo_reservation::producer_schema(),
            clock.clone(),
            &options,
        )
        .expect("create the producer schema");
        let mut consumer =
            PgConsumer::open_with(&url, &ordo_reservation::consumer_schema(), clock, &options)
                .expect("create the consumer schema");
        fill("PostgreSQL", &mut producer, &mut consumer, args.flows);
        drop((producer, consumer));
        database.analyze();
        measure("PostgreSQL", &ordo, &url, &url, &args);
    }
}

/// The `ordo` binary: `ORDO_BIN`, or the one beside `examples/`.
fn ordo_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("ORDO_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the example's own path");
    let beside = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("ordo"))
        .filter(|path| path.exists());
    beside.unwrap_or_else(|| {
        eprintln!("error: no ordo binary beside {}: build it with the example (cargo build --release -p ordo-cli --bin ordo --example console_bench) or set ORDO_BIN", exe.display());
        std::process::exit(2);
    })
}

fn path_text(path: &Path) -> String {
    path.to_str().expect("a UTF-8 temporary path").to_owned()
}

/// The id of flow `i`: `flow-000042`.
fn flow_id(i: usize) -> String {
    format!("flow-{i:06}")
}

/// The reservation event of flow `i` (seq 1, reserved).
fn event(i: usize) -> Envelope {
    ordo_lab::first_reservation(flow_id(i), (i % 97 + 1) as u64).expect("a well-formed event")
}

/// Commits `flows` events to the outbox and receives them at the
/// consumer, [`BATCH_LEN`] per transaction.
fn fill(
    backend: &str,
    producer: &mut impl ProducerStore,
    consumer: &mut impl ConsumerStore,
    flows: usize,
) {
    let started = Instant::now();
    let events: Vec<Envelope> = (0..flows).map(event).collect();
    for batch in events.chunks(BATCH_LEN) {
        producer.append_events(batch).expect("append a batch");
        consumer.receive_batch(batch).expect("receive a batch");
    }
    eprintln!(
        "{backend}: {flows} flows built in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// A running `ordo console`; stopped when dropped.
struct Console {
    _child: Process,
    addr: String,
}

impl Console {
    fn start(ordo: &Path, p: &str, c: &str) -> Console {
        let (child, addr) = start_listening(
            Command::new(ordo)
                .args(["console", "--producer", p, "--consumer", c])
                .args(["--listen", "127.0.0.1:0"])
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stderr(Stdio::inherit()),
            "ordo console",
        );
        Console {
            _child: child,
            addr,
        }
    }
}

/// Times each page `args.rounds` times and prints the times.
fn measure(backend: &str, ordo: &Path, p: &str, c: &str, args: &Args) {
    let console = Console::start(ordo, p, c);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let n = args.flows;
    let deep = flow_id(n - 30);
    let one = flow_id(n / 2 + 21);
    let prefix = &flow_id(n / 2)[..9];
    let pages = [
        ("flow list, first page", "/flows".to_owned(), flow_id(0)),
        (
            "flow list, prefix search",
            format!("/flows?q={prefix}"),
            format!("{prefix}0"),
        ),
        (
            "flow list, deep keyset page",
            format!("/flows?after={deep}"),
            flow_id(n - 1),
        ),
        ("flow detail", format!("/flow?id={one}"), format!("{one}-1")),
        ("overview", "/".to_owned(), "data-metric".to_owned()),
    ];
    println!("{backend}, {n} flows, {} rounds (ms):", args.rounds);
    println!("  {:<30} {:>8} {:>8} {:>8}", "page", "median", "p95", "max");
    for (name, path, expected) in &pages {
        let url = format!("http://{}{path}", console.addr);
        let get = || {
            let started = Instant::now();
            let text = agent
                .get(&url)
                .call()
                .and_then(|mut r| r.body_mut().read_to_string())
                .unwrap_or_else(|e| panic!("GET {path}: {e}"));
            let elapsed = started.elapsed();
            assert!(
                text.contains(expected.as_str()),
                "GET {path} lacks {expected}"
            );
            elapsed
        };
        get();
        let mut times: Vec<Duration> = (0..args.rounds).map(|_| get()).collect();
        times.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
        println!(
            "  {name:<30} {:>8.2} {:>8.2} {:>8.2}",
            ms(at(0.5)),
            ms(at(0.95)),
            ms(times[times.len() - 1])
        );
    }
}

/// A database of the benchmark's own; dropped with the value.
struct Database {
    server: String,
    name: String,
}

impl Database {
    fn admin(server: &str) -> Client {
        Client::connect(&format!("{server}/postgres"), NoTls).unwrap_or_else(|e| {
            eprintln!(
                "error: cannot reach {}: {e}",
                ordo_postgres::redact_url(server)
            );
            std::process::exit(1);
        })
    }

    fn create(server: &str) -> Database {
        let name = format!("ordo_console_bench_{}", std::process::id());
        Database::admin(server)
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create the benchmark's database");
        Database {
            server: server.to_owned(),
            name,
        }
    }

    fn url(&self) -> String {
        format!("{}/{}", self.server, self.name)
    }

    /// Fresh planner statistics, as autovacuum would gather them.
    fn analyze(&self) {
        Client::connect(&self.url(), NoTls)
            .and_then(|mut client| client.batch_execute("ANALYZE"))
            .expect("analyze");
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let _ = Database::admin(&self.server).batch_execute(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ));
    }
}
