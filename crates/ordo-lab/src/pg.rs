//! The PostgreSQL server of the lab's runs on `--backend postgres`
//! (`experiment`, one database per scenario; `soak`, one per run; `bench`,
//! one per measurement): each
//! fresh database is created under a unique name and dropped after its use
//! (whether it passed, failed or panicked) unless it is kept; databases
//! left by runs on this machine whose process is gone are dropped when the
//! next run of the same kind connects (a run of another machine on the same
//! server is never touched: the machine's name is part of the database's;
//! nor is a kept database: its name ends in `_kept`).
//!
//! Invariant: a URL is only ever shown through [`redact`] (never its
//! password), and a database name is only ever one this module made (the
//! kind's prefix, then `HOST_PID_N`, then `_kept` for a kept one; safe to
//! interpolate into SQL).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ordo_postgres::error::pg_error;
use ordo_postgres::postgres::{Client, Config};
use ordo_postgres::PgUrl;

use crate::LabError as Failure;

/// The prefix of every scenario database of `experiment`, then the machine,
/// the process id and a number.
pub const EXPERIMENT_PREFIX: &str = "ordo_exp_";
/// The prefix of the database of a `soak` run, then as for
/// [`EXPERIMENT_PREFIX`].
pub const SOAK_PREFIX: &str = "ordo_soak_";
/// The prefix of the databases of a `bench` run, then as for
/// [`EXPERIMENT_PREFIX`].
pub const BENCH_PREFIX: &str = "ordo_bench_";
/// The suffix of a database kept after its run (never dropped as a
/// leftover).
const KEPT_SUFFIX: &str = "_kept";
/// The longest machine name kept in a database name.
const HOST_LEN_MAX: usize = 20;
/// The database the server's connection uses when the URL names none.
const ADMIN_DB_DEFAULT: &str = "postgres";

pub use ordo_postgres::redact_url as redact;

/// The parts of a server URL around its database name:
/// `(before, database, after)`, where `before` ends at the host and port and
/// `after` is the query (with its `?`) or empty.
fn split_url(url: &str) -> Option<(&str, &str, &str)> {
    let host_start = ordo_postgres::url_host_start(url)?;
    let host_end = url[host_start..]
        .find(['/', '?'])
        .map_or(url.len(), |i| host_start + i);
    let (path, after) = match url[host_end..].find('?') {
        Some(q) => (&url[host_end..host_end + q], &url[host_end + q..]),
        None => (&url[host_end..], ""),
    };
    Some((&url[..host_end], path.trim_start_matches('/'), after))
}

/// `url` naming the database `name` instead of its own.
fn with_database(url: &str, name: &str) -> String {
    match split_url(url) {
        Some((before, _, after)) => format!("{before}/{name}{after}"),
        None => url.to_owned(),
    }
}

/// The server, as messages name it: `postgres://USER@HOST:PORT`.
fn describe(config: &Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            ordo_postgres::postgres::config::Host::Tcp(name) => name.clone(),
            ordo_postgres::postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "postgres://{}@{host}:{port}",
        config.get_user().unwrap_or("")
    )
}

/// Checks a `--url` without connecting: a `postgres://` or `postgresql://`
/// URL that parses. An error is a usage error, naming the URL without its
/// password.
pub fn check_url(url: &str) -> Result<PgUrl, Failure> {
    let shown = redact(url);
    if split_url(url).is_none() {
        return Err(Failure::Usage(format!(
            "--url {shown}: not a postgres:// or postgresql:// URL"
        )));
    }
    PgUrl::parse(url).map_err(|e| Failure::Usage(format!("--url {shown}: {e}")))
}

/// A connection to the server that creates and drops the runs' databases,
/// whose names start with its prefix.
pub struct Server {
    url: String,
    shown: String,
    prefix: &'static str,
    admin: Mutex<Client>,
}

impl Server {
    /// Connects to the database of `url` (`postgres` if it names none) and
    /// drops the databases named with `prefix` ([`EXPERIMENT_PREFIX`],
    /// [`SOAK_PREFIX`], [`BENCH_PREFIX`]) of runs whose process is gone.
    pub fn connect(url: &str, prefix: &'static str) -> Result<Server, Failure> {
        let mut target = check_url(url)?;
        let shown = describe(target.config());
        let admin_db = split_url(url)
            .map(|(_, db, _)| db)
            .filter(|db| !db.is_empty())
            .unwrap_or(ADMIN_DB_DEFAULT)
            .to_owned();
        target.config_mut().dbname(&admin_db);
        let client = target.connect().map_err(|e| {
            let cause = std::error::Error::source(&e)
                .map(|c| format!(": {c}"))
                .unwrap_or_default();
            Failure::Internal(format!("cannot connect to {shown}: {e}{cause}"))
        })?;
        let server = Server {
            url: url.to_owned(),
            shown,
            prefix,
            admin: Mutex::new(client),
        };
        server.drop_leftovers()?;
        Ok(server)
    }

    /// The server as messages and reports name it (no password).
    pub fn shown(&self) -> &str {
        &self.shown
    }

    fn admin(&self) -> std::sync::MutexGuard<'_, Client> {
        self.admin.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fail(&self, what: &str, error: ordo_postgres::postgres::Error) -> Failure {
        let code = error
            .code()
            .map(|c| format!(" (SQLSTATE {})", c.code()))
            .unwrap_or_default();
        Failure::Internal(format!("{}: {what}: {error}{code}", self.shown))
    }

    /// The names of the databases of this kind of run on the server.
    pub fn databases(&self) -> Result<Vec<String>, Failure> {
        let pattern = format!("{}%", self.prefix.replace('_', "\\_"));
        let rows = self
            .admin()
            .query(
                "SELECT datname::text FROM pg_database WHERE datname LIKE $1 ORDER BY 1",
                &[&pattern],
            )
            .map_err(|e| self.fail("cannot list databases", e))?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    /// Drops the scenario databases of this machine whose creating process
    /// no longer runs.
    fn drop_leftovers(&self) -> Result<(), Failure> {
        let host = machine();
        for name in self.databases()? {
            let Some((their_host, pid)) = parse_name(self.prefix, &name) else {
                continue;
            };
            let alive =
                pid == std::process::id() || Path::new("/proc").join(pid.to_string()).exists();
            if their_host == host && !alive {
                self.drop_database(&name)?;
            }
        }
        Ok(())
    }

    fn drop_database(&self, name: &str) -> Result<(), Failure> {
        self.admin()
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .map_err(|e| self.fail(&format!("cannot drop database {name}"), e))
    }

    /// A fresh, empty database for one run, dropped with the value.
    pub fn create(&self) -> Result<Database<'_>, Failure> {
        self.create_as(false)
    }

    /// A fresh, empty database for one run, kept when `keep` (its name then
    /// ends in `_kept`, and no later run drops it), else dropped with the
    /// value.
    pub fn create_as(&self, keep: bool) -> Result<Database<'_>, Failure> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{}{}_{}_{}{}",
            self.prefix,
            machine(),
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            if keep { KEPT_SUFFIX } else { "" }
        );
        self.admin()
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .map_err(|e| self.fail(&format!("cannot create database {name}"), e))?;
        Ok(Database {
            server: self,
            name,
            keep,
        })
    }
}

/// This machine's name as database names hold it: its host name in lower
/// case, letters and digits only, at most `HOST_LEN_MAX` (20) of them
/// (`host` if none is left).
pub fn machine() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let kept: String = name
        .trim()
        .to_ascii_lowercase()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(HOST_LEN_MAX)
        .collect();
    if kept.is_empty() {
        "host".into()
    } else {
        kept
    }
}

/// The machine and process id of a name [`Server::create`] makes with
/// `prefix`; `None` for any other name (a kept database's among them).
fn parse_name<'n>(prefix: &str, name: &'n str) -> Option<(&'n str, u32)> {
    let mut parts = name.strip_prefix(prefix)?.split('_');
    let (host, pid, number) = (parts.next()?, parts.next()?, parts.next()?);
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    let host_ok = !host.is_empty()
        && host.len() <= HOST_LEN_MAX
        && host
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let pid = Some(pid).filter(|p| digits(p))?.parse::<u32>().ok()?;
    (host_ok && digits(number) && parts.next().is_none()).then_some((host, pid))
}

/// One run's database; dropped (connections and all) with the value,
/// unless it was created to be kept.
pub struct Database<'a> {
    server: &'a Server,
    name: String,
    keep: bool,
}

impl Database<'_> {
    /// The URL the run's processes take for `--producer` and `--consumer`:
    /// the server's URL naming this database.
    pub fn url(&self) -> String {
        with_database(&self.server.url, &self.name)
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database as messages and reports name it:
    /// `postgres://USER@HOST:PORT/NAME` (no password).
    pub fn shown(&self) -> String {
        format!("{}/{}", self.server.shown, self.name)
    }

    /// The server sessions connected to this database whose
    /// `application_name` starts with `ordo-` (ordo's stores' own), as
    /// `(pid, application_name)`, ordered by pid.
    pub fn ordo_sessions(&self) -> Result<Vec<(i32, String)>, Failure> {
        let rows = self
            .server
            .admin()
            .query(
                "SELECT pid, application_name::text FROM pg_stat_activity
                 WHERE datname = $1 AND application_name LIKE 'ordo-%' ORDER BY pid",
                &[&self.name],
            )
            .map_err(|e| self.server.fail("cannot list sessions", e))?;
        Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
    }

    /// Ends the server session `pid` with `pg_terminate_backend`, if it is
    /// still one of [`Database::ordo_sessions`]; returns whether it ended
    /// one.
    pub fn terminate(&self, pid: i32) -> Result<bool, Failure> {
        let row = self
            .server
            .admin()
            .query_one(
                "SELECT coalesce(bool_or(pg_terminate_backend(pid)), false) FROM pg_stat_activity
                 WHERE pid = $1 AND datname = $2 AND application_name LIKE 'ordo-%'",
                &[&pid, &self.name],
            )
            .map_err(|e| self.server.fail("cannot terminate a session", e))?;
        Ok(row.get(0))
    }
}

impl Drop for Database<'_> {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        // A database that cannot be dropped now is a leftover the next run
        // drops.
        let _ = self.server.drop_database(&self.name);
    }
}

/// A connection of the bench's own to `url`, named `application_name`.
pub(crate) fn connect(url: &str, application_name: &str) -> Result<Client, Failure> {
    let mut target = PgUrl::parse(url)?;
    target.config_mut().application_name(application_name);
    target
        .connect()
        .map_err(|e| pg_error("bench: cannot connect", e).into())
}

/// The server's WAL write position, read on a connection of the bench's
/// own.
pub(crate) struct WalPosition(Client);

impl WalPosition {
    const CONTEXT: &'static str = "bench: cannot read the WAL position";

    pub(crate) fn connect(url: &str) -> Result<WalPosition, Failure> {
        connect(url, "ordo-bench-wal").map(WalPosition)
    }

    /// The position now, as the server writes it (`pg_lsn` as text).
    pub(crate) fn read(&mut self) -> Result<String, Failure> {
        let row = self
            .0
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .map_err(|e| pg_error(Self::CONTEXT, e))?;
        Ok(row.get(0))
    }

    /// Bytes written since the position `start`.
    pub(crate) fn bytes_since(&mut self, start: &str) -> Result<u64, Failure> {
        let row = self
            .0
            .query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::bigint",
                &[&start],
            )
            .map_err(|e| pg_error(Self::CONTEXT, e))?;
        let bytes: i64 = row.get(0);
        u64::try_from(bytes).map_err(|_| {
            Failure::Check(format!(
                "bench: the WAL position went back by {bytes} bytes"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_names_another_database() {
        let cases = [
            ("postgres://u@h:5432", "postgres://u@h:5432/d"),
            ("postgres://u@h:5432/", "postgres://u@h:5432/d"),
            ("postgres://u@h/x", "postgres://u@h/d"),
            (
                "postgresql://u:p/w@h/x?sslmode=disable",
                "postgresql://u:p/w@h/d?sslmode=disable",
            ),
            ("postgres://h?user=u", "postgres://h/d?user=u"),
            (
                "postgres://u@h/x?application_name=a@b",
                "postgres://u@h/d?application_name=a@b",
            ),
        ];
        for (url, expected) in cases {
            assert_eq!(with_database(url, "d"), expected, "{url}");
        }
        assert!(split_url("host=localhost").is_none());
    }

    #[test]
    fn passwords_are_never_shown() {
        assert_eq!(redact("postgres://u:secret@h/d"), "postgres://u:***@h/d");
        assert_eq!(
            redact("postgres://u@h/d?password=secret&x=1"),
            "postgres://u@h/d?password=***&x=1"
        );
        let error = check_url("postgres://u:secret@h:notaport/d")
            .err()
            .map(|e| e.to_string());
        assert!(
            error.as_deref().is_some_and(|e| !e.contains("secret")),
            "{error:?}"
        );
    }

    #[test]
    fn only_our_names_are_dropped() {
        let parse = |name| parse_name(EXPERIMENT_PREFIX, name);
        assert_eq!(parse("ordo_exp_vm_123_0"), Some(("vm", 123)));
        assert_eq!(parse("ordo_exp_vm_123"), None);
        assert_eq!(parse("ordo_exp_vm_123_0_x"), None);
        assert_eq!(parse("ordo_exp_vm_123_0_kept"), None);
        assert_eq!(parse("ordo_exp_vm_x_0"), None);
        assert_eq!(parse("ordo_exp_vm_+1_0"), None);
        assert_eq!(parse("ordo_exp_Vm_1_0"), None);
        assert_eq!(parse("ordo_cli_vm_123_0"), None);
        assert_eq!(parse("ordo_soak_vm_123_0"), None);
        assert_eq!(
            parse_name(SOAK_PREFIX, "ordo_soak_vm_123_0"),
            Some(("vm", 123))
        );
        assert_eq!(parse_name(SOAK_PREFIX, "ordo_exp_vm_123_0"), None);
        assert_eq!(parse_name(BENCH_PREFIX, "ordo_soak_vm_123_0"), None);
        assert_eq!(
            parse_name(BENCH_PREFIX, "ordo_bench_vm_123_0"),
            Some(("vm", 123))
        );
        let host = machine();
        assert!(!host.is_empty() && host.len() <= HOST_LEN_MAX, "{host}");
        assert_eq!(
            parse(&format!("ordo_exp_{host}_1_2")),
            Some((host.as_str(), 1))
        );
    }
}
