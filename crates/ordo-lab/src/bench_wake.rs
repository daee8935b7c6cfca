//! The receive-to-apply lag across processes: `ordo serve` receives into a
//! consumer store and a separate `ordo apply --follow` process applies
//! from it, as an application deployed as two processes does: an SQLite
//! file, or (with a server, `--backend postgres --url`) a PostgreSQL store
//! in a fresh database of its own on that server. Events are posted one
//! request at a time, spaced out so that the applier is idle when each
//! arrives; each event's lag is its inbox row's `settled_at_ms` less its
//! `received_at_ms`. The idle applier's CPU time is read from `/proc` over
//! a quiet second before the events are sent.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ordo_core::{Envelope, Transport};
use ordo_http::{ClientOptions, HttpTransport};
use ordo_postgres::postgres::Client;
use ordo_sqlite::rusqlite::Connection;

use crate::bench::fresh_dir;
use crate::bench_http::{HttpLoad, RequestLatency};
use crate::pg::{Server, BENCH_PREFIX};
use crate::serve::{loopback_any, ServeSpec};
use crate::{first_reservation, internal, LabError as Failure};

/// Events posted, one per request.
pub const WAKE_EVENTS: u64 = 200;
/// The pause between two posts: longer than an apply, so each finds the
/// applier idle.
const WAKE_SPACING: Duration = Duration::from_millis(20);
/// How long the applier is watched idle for its CPU time.
const IDLE_WINDOW: Duration = Duration::from_secs(1);
/// The longest wait for every event to be applied.
const APPLIED_WAIT_MAX: Duration = Duration::from_secs(60);
/// The lag of each applied event, in ms, as the inbox records it.
const LAGS_SQL: &str =
    "SELECT settled_at_ms - received_at_ms FROM {inbox} WHERE status = 'applied'";

/// What the wake measurement found.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WakeRun {
    /// The consumer store's backend: `sqlite` or `postgres`.
    pub backend: &'static str,
    /// Events posted and applied.
    pub events: u64,
    /// From each event's receipt (in `ordo serve`) to its apply (in the
    /// applier process).
    pub lag: RequestLatency,
    /// The idle applier's CPU time per second of wall time, in ms.
    pub idle_cpu_ms_per_s: f64,
}

/// Runs the measurement in `root/wake`, on the server of
/// [`HttpLoad::wake_server`] when there is one.
pub fn run(root: &Path, load: &HttpLoad) -> Result<WakeRun, Failure> {
    let dir = fresh_dir(root, "wake")?;
    let Some(url) = &load.wake_server else {
        let consumer = dir.join("consumer.db");
        ordo_reservation::open_consumer(&consumer)?;
        return run_on(load, &dir, &Inbox::File(consumer));
    };
    let server = Server::connect(url, BENCH_PREFIX)?;
    let database = server.create()?;
    let url = database.url();
    ordo_postgres::PgConsumer::open(&url, &ordo_reservation::consumer_schema())?;
    run_on(load, &dir, &Inbox::Postgres(url))
}

/// The measurement on a consumer store that exists, with the logs in `dir`.
fn run_on(load: &HttpLoad, dir: &Path, inbox: &Inbox) -> Result<WakeRun, Failure> {
    let log = dir.join("serve.log");
    let served = crate::serve::start(&ServeSpec {
        exe: &load.exe,
        consumer: inbox.arg(),
        listen: loopback_any(),
        crash_point: None,
        log: Some(&log),
        flags: &[],
    })
    .map_err(Failure::Internal)?;
    let mut applier = Applier::start(&load.exe, inbox.arg())?;
    let measured = measure(&served.url(), inbox, &mut applier);
    applier.stop();
    served.stop();
    measured
}

fn measure(url: &str, inbox: &Inbox, applier: &mut Applier) -> Result<WakeRun, Failure> {
    // Past its first empty rounds, the applier waits its longest.
    std::thread::sleep(Duration::from_millis(500));
    let idle_cpu_ms_per_s = applier.cpu_ms_per_s(IDLE_WINDOW)?;
    let mut client = HttpTransport::new(url, None, &ClientOptions::default()).map_err(internal)?;
    for n in 0..WAKE_EVENTS {
        client.deliver(None, &[event(n)?]).map_err(internal)?;
        std::thread::sleep(WAKE_SPACING);
    }
    let lags_ms = applied_lags(inbox, applier)?;
    Ok(WakeRun {
        backend: inbox.backend(),
        events: lags_ms.len() as u64,
        lag: RequestLatency::of(lags_ms.into_iter().map(Duration::from_millis).collect()),
        idle_cpu_ms_per_s,
    })
}

/// The consumer store the server receives into and the applier applies
/// from.
enum Inbox {
    File(PathBuf),
    /// The store's URL (its default schema).
    Postgres(String),
}

impl Inbox {
    /// What `--consumer` takes.
    fn arg(&self) -> &Path {
        match self {
            Inbox::File(path) => path,
            Inbox::Postgres(url) => Path::new(url),
        }
    }

    fn backend(&self) -> &'static str {
        match self {
            Inbox::File(_) => "sqlite",
            Inbox::Postgres(_) => "postgres",
        }
    }

    /// A reader of the applied events' lags.
    fn reader(&self) -> Result<Lags, Failure> {
        Ok(match self {
            Inbox::File(path) => Lags::File(Connection::open(path).map_err(internal)?),
            Inbox::Postgres(url) => Lags::Postgres(crate::pg::connect(url, "ordo-bench-wake")?),
        })
    }
}

/// A connection that reads the lags of the applied events.
enum Lags {
    File(Connection),
    Postgres(Client),
}

impl Lags {
    fn read(&mut self) -> Result<Vec<u64>, Failure> {
        let lags: Vec<i64> = match self {
            Lags::File(conn) => {
                let sql = LAGS_SQL.replace("{inbox}", "inbox");
                let mut stmt = conn.prepare(&sql).map_err(internal)?;
                let lags = stmt
                    .query_map([], |row| row.get::<_, i64>(0))
                    .map_err(internal)?
                    .collect::<Result<_, _>>()
                    .map_err(internal)?;
                lags
            }
            Lags::Postgres(client) => {
                let schema = ordo_postgres::CONSUMER_SCHEMA_DEFAULT;
                let sql = LAGS_SQL.replace("{inbox}", &format!("{schema}.inbox"));
                let rows = client.query(&sql, &[]).map_err(internal)?;
                rows.iter().map(|row| row.get(0)).collect()
            }
        };
        Ok(lags.into_iter().map(|ms| ms.max(0) as u64).collect())
    }
}

/// The first event of a new flow, numbered `n`.
fn event(n: u64) -> Result<Envelope, Failure> {
    first_reservation(format!("wake-{n:06}"), 1)
}

/// Every event's lag once all are applied; an applier that ends or does
/// not apply them all within [`APPLIED_WAIT_MAX`] is an error.
fn applied_lags(inbox: &Inbox, applier: &mut Applier) -> Result<Vec<u64>, Failure> {
    let mut reader = inbox.reader()?;
    let started = Instant::now();
    loop {
        let lags = reader.read()?;
        if lags.len() as u64 >= WAKE_EVENTS {
            return Ok(lags);
        }
        if applier.exited() || started.elapsed() > APPLIED_WAIT_MAX {
            return Err(Failure::Internal(format!(
                "the applier applied {} of {WAKE_EVENTS} events",
                lags.len()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `ordo apply --follow` on the consumer store, as its own process.
struct Applier(Child);

impl Applier {
    fn start(exe: &Path, consumer: &Path) -> Result<Applier, Failure> {
        let child = Command::new(exe)
            .args(["apply", "--follow", "--consumer"])
            .arg(consumer)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Failure::Internal(format!("cannot start the applier: {e}")))?;
        Ok(Applier(child))
    }

    fn exited(&mut self) -> bool {
        !matches!(self.0.try_wait(), Ok(None))
    }

    /// The CPU time the process used over `window`, per second.
    fn cpu_ms_per_s(&self, window: Duration) -> Result<f64, Failure> {
        let before = cpu_ticks(self.0.id())?;
        std::thread::sleep(window);
        let after = cpu_ticks(self.0.id())?;
        // Clock ticks are 10 ms on Linux (USER_HZ = 100).
        let ms = after.saturating_sub(before) as f64 * 10.0;
        Ok(ms / window.as_secs_f64())
    }

    fn stop(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// User plus system CPU time of process `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64, Failure> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(internal)?;
    parse_cpu_ticks(&stat).ok_or_else(|| Failure::Internal(format!("unreadable /proc/{pid}/stat")))
}

/// Fields 14 and 15 (utime, stime) of a `/proc/PID/stat` line, counted
/// after the command name's closing parenthesis.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_utime_plus_stime() {
        let line = "42 (ordo (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 3 0";
        assert_eq!(parse_cpu_ticks(line), Some(12));
        assert_eq!(parse_cpu_ticks("42 (ordo) S 1"), None);
        assert_eq!(parse_cpu_ticks("no parenthesis"), None);
        assert!(cpu_ticks(std::process::id()).is_ok());
    }
}
