//! Opening a database file with the durability ordo requires, and mapping
//! SQLite errors to backend-neutral kinds.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ordo_core::{ErrorKind, StoreError};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use crate::domain::{self, Schema};

/// How long a write waits for another writer's lock before failing with
/// [`ErrorKind::Busy`], unless set otherwise.
pub const BUSY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// The version of ordo's own tables this build writes; a file with a newer
/// one is refused. Version 1 files (the first release, which knew only the
/// reservation domain) are upgraded once, and recorded as domain
/// `reservation`.
pub const SCHEMA_VERSION: i64 = 2;

/// The domain of the first release's stores, which recorded none.
pub const FIRST_RELEASE_DOMAIN: &str = "reservation";

/// ordo's own tables of one role.
pub(crate) struct Tables {
    /// Creates every missing table and index (`IF NOT EXISTS`).
    pub create: &'static str,
    /// Upgrades a version 1 file before `create` runs.
    pub upgrade_from_1: &'static str,
}

/// Settings for opening a store.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// How long a write waits for another writer's lock. The wait is one
    /// process-wide setting: the longest of the stores opened so far.
    pub busy_timeout: Duration,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            busy_timeout: BUSY_TIMEOUT_DEFAULT,
        }
    }
}

/// Which side a database file belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `producer.db`: flows and outbox.
    Producer,
    /// `consumer.db`: inbox, projection, effects.
    Consumer,
}

impl Role {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Producer => "producer",
            Role::Consumer => "consumer",
        }
    }
}

/// How many prepared statements each connection keeps.
const STATEMENT_CACHE_CAPACITY: usize = 128;

/// Executes `sql` through the connection's statement cache.
pub(crate) fn exec_cached<P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

/// Reads one row of `sql` through the connection's statement cache.
pub(crate) fn row_cached<T, P, F>(
    conn: &Connection,
    sql: &str,
    params: P,
    f: F,
) -> rusqlite::Result<T>
where
    P: rusqlite::Params,
    F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
{
    conn.prepare_cached(sql)?.query_row(params, f)
}

/// The longest busy wait of this process, in microseconds (the largest busy
/// timeout any store was opened with).
static BUSY_WAIT_MAX_US: AtomicU64 = AtomicU64::new(0);

fn set_busy_wait(timeout: Duration) {
    let us = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX);
    BUSY_WAIT_MAX_US.fetch_max(us, Ordering::Relaxed);
}

/// The pause before the `n`-th retry of a locked database: 20 µs more at each
/// retry, at most 1 ms. SQLite's own handler starts at 1 ms, which is longer
/// than a whole batched commit here, so writers on the same file would spend
/// most of their time asleep.
fn busy_pause_us(n: u64) -> u64 {
    (20 * (n + 1)).min(1_000)
}

/// The total pause of the first `n` retries.
fn busy_waited_us(n: u64) -> u64 {
    let ramp = n.min(50);
    20 * ramp * (ramp + 1) / 2 + n.saturating_sub(50) * 1_000
}

/// Retries a locked database with short pauses until the busy timeout has
/// been spent, then gives up (the statement fails as `Busy`).
fn busy_wait(retries: i32) -> bool {
    let n = u64::try_from(retries).unwrap_or(0);
    if busy_waited_us(n) >= BUSY_WAIT_MAX_US.load(Ordering::Relaxed) {
        return false;
    }
    std::thread::sleep(Duration::from_micros(busy_pause_us(n)));
    true
}

/// Reads every row of `sql` through the statement cache: `read` takes the
/// columns out of a row, `convert` checks them (a stored value breaking a rule
/// is a `Corrupt` error). SQLite errors carry `context`.
pub(crate) fn collect_rows<P, R, T>(
    conn: &Connection,
    context: &str,
    sql: &str,
    params: P,
    read: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<R>,
    mut convert: impl FnMut(R) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError>
where
    P: rusqlite::Params,
{
    let err = |e| sql_error(context, e);
    let mut stmt = conn.prepare_cached(sql).map_err(err)?;
    let rows = stmt.query_map(params, read).map_err(err)?;
    let mut out = Vec::new();
    for row in rows {
        out.push(convert(row.map_err(err)?)?);
    }
    Ok(out)
}

/// Maps a SQLite error to a store error with a kind callers can act on.
pub(crate) fn sql_error(context: &str, error: rusqlite::Error) -> StoreError {
    StoreError::sqlite(context, error)
}

/// A stored value that does not satisfy the protocol's rules: the file was
/// changed outside ordo.
pub(crate) fn corrupt(context: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::new(ErrorKind::Corrupt, format!("{context}: {detail}"))
}

/// Opens a database file, sets and reads back WAL and `synchronous=FULL`,
/// and creates the role's tables and the domain's if they are missing.
/// With `domain`, a missing file is created for it and a store of another
/// domain is refused; without, the file must be an existing ordo store of
/// `role`, of any domain, and no domain migration runs. Existing state is
/// never reset.
pub(crate) fn open(
    path: &Path,
    role: Role,
    tables: &Tables,
    domain: Option<&Schema>,
    options: &OpenOptions,
) -> Result<Connection, StoreError> {
    let display = path.display();
    if domain.is_none() && !path.exists() {
        return Err(StoreError::new(
            ErrorKind::Incompatible,
            format!("{display} does not exist; a store is created only for a given domain"),
        ));
    }
    let conn =
        Connection::open(path).map_err(|e| sql_error(&format!("cannot open {display}"), e))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    // Without the query planner stability guarantee SQLite plans some
    // statements for the values bound to them (a `LIMIT ?` among them) and
    // prepares such a statement again at every new binding, which undoes the
    // statement cache: the relay's fair round spent most of its time in the
    // SQL parser.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(|e| sql_error("cannot set the query planner stability guarantee", e))?;
    // The wait for a locked file is this handler's (see `busy_wait`).
    set_busy_wait(options.busy_timeout);
    conn.busy_handler(Some(busy_wait))
        .map_err(|e| sql_error("cannot set busy handler", e))?;
    // Refuse a foreign or wrong-role file before any pragma changes it.
    let state = read_state(&conn, path, role)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |row| row.get(0))
        .map_err(|e| sql_error(&format!("{display}: cannot set journal_mode=WAL"), e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::new(
            ErrorKind::Incompatible,
            format!("{display}: journal_mode is {mode}, WAL is required"),
        ));
    }
    conn.execute_batch("PRAGMA synchronous=FULL")
        .map_err(|e| sql_error(&format!("{display}: cannot set synchronous=FULL"), e))?;
    let synchronous: i64 = conn
        .query_row("PRAGMA synchronous", [], |row| row.get(0))
        .map_err(|e| sql_error(&format!("{display}: cannot read synchronous"), e))?;
    if synchronous != 2 {
        return Err(StoreError::new(
            ErrorKind::Incompatible,
            format!("{display}: synchronous is {synchronous}, FULL (2) is required"),
        ));
    }
    let stale = match domain {
        Some(_) if state != FileState::Current => true,
        Some(schema) => {
            let stored = domain::stored_domain(&conn)
                .map_err(|e| sql_error(&format!("{display}: cannot read"), e))?;
            domain::check(&display.to_string(), stored.as_ref(), schema)?
        }
        None if state == FileState::Empty => {
            return Err(StoreError::new(
                ErrorKind::Incompatible,
                format!("{display} is not an ordo {} store", role.as_str()),
            ))
        }
        None => state != FileState::Current,
    };
    if stale {
        // Nothing to create otherwise: opening then takes no write lock, so a
        // busy peer does not stop a process from starting.
        init_schema(&conn, path, role, tables, domain)?;
    }
    Ok(conn)
}

/// Refuses an existing file that is not an ordo file of `role`, reading only
/// and creating nothing (a missing file is fine: opening will create it).
pub(crate) fn check_existing(path: &Path, role: Role) -> Result<(), StoreError> {
    if !path.exists() {
        return Ok(());
    }
    let display = path.display();
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| sql_error(&format!("cannot open {display}"), e))?;
    read_state(&conn, path, role).map(|_| ())
}

/// The domain a store records (every store opened by this build has one).
pub(crate) fn read_domain(conn: &Connection, path: &Path) -> Result<String, StoreError> {
    crate::domain::stored_domain(conn)
        .map_err(|e| sql_error(&format!("{}: cannot read", path.display()), e))?
        .map(|domain| domain.name)
        .ok_or_else(|| corrupt(&path.display().to_string(), "the store records no domain"))
}

/// What a file holds, as far as ordo is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileState {
    /// No table at all: a new file.
    Empty,
    /// This role's tables at an older schema version.
    Older,
    /// This role's tables at the current schema version.
    Current,
}

/// Reads the file's state in a read transaction.
fn read_state(conn: &Connection, path: &Path, role: Role) -> Result<FileState, StoreError> {
    let err = |e| sql_error(&format!("{}: cannot read", path.display()), e);
    let tx =
        rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Deferred).map_err(err)?;
    inspect(&tx, path, role)
}

/// The file's state, refusing a foreign SQLite file, an ordo file of the
/// other role, and a newer schema version.
fn inspect(conn: &Connection, path: &Path, role: Role) -> Result<FileState, StoreError> {
    let display = path.display();
    let err = |e| sql_error(&format!("{display}: cannot read"), e);
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type='table'",
            [],
            |row| row.get(0),
        )
        .map_err(err)?;
    if tables == 0 {
        return Ok(FileState::Empty);
    }
    let has_meta: bool = conn
        .query_row(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type='table' AND name='ordo_meta'",
            [],
            |row| row.get(0),
        )
        .map_err(err)?;
    if !has_meta {
        return Err(StoreError::new(
            ErrorKind::Incompatible,
            format!("{display} is a SQLite database that ordo did not create; refusing to use it"),
        ));
    }
    let stored_role: Option<String> = conn
        .query_row("SELECT value FROM ordo_meta WHERE key='role'", [], |row| {
            row.get(0)
        })
        .optional()
        .map_err(err)?;
    if stored_role.as_deref() != Some(role.as_str()) {
        return Err(StoreError::new(
            ErrorKind::Incompatible,
            format!(
                "{display} is an ordo {} database, not a {} database",
                stored_role.as_deref().unwrap_or("unknown"),
                role.as_str()
            ),
        ));
    }
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(err)?;
    match version {
        v if v > SCHEMA_VERSION => Err(StoreError::new(
            ErrorKind::Incompatible,
            format!("{display} has schema version {v}; this ordo knows up to {SCHEMA_VERSION}"),
        )),
        v if v == SCHEMA_VERSION => Ok(FileState::Current),
        _ => Ok(FileState::Older),
    }
}

/// Creates what is missing, in one write transaction; checks the file again
/// inside it, since another process may have created it meanwhile.
fn init_schema(
    conn: &Connection,
    path: &Path,
    role: Role,
    tables: &Tables,
    domain: Option<&Schema>,
) -> Result<(), StoreError> {
    let display = path.display().to_string();
    let err = |e| sql_error(&format!("{display}: cannot initialise"), e);
    let tx =
        rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate).map_err(err)?;
    let state = inspect(&tx, path, role)?;
    if state == FileState::Older {
        tx.execute_batch(tables.upgrade_from_1).map_err(err)?;
        tx.execute(
            "INSERT OR IGNORE INTO ordo_meta (key, value) VALUES ('domain', ?1), ('domain_version', '0')",
            [FIRST_RELEASE_DOMAIN],
        )
        .map_err(err)?;
        tx.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))
            .map_err(err)?;
    }
    if state == FileState::Empty {
        tx.execute_batch(
            "CREATE TABLE ordo_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;",
        )
        .map_err(err)?;
        tx.execute(
            "INSERT INTO ordo_meta (key, value) VALUES ('role', ?1)",
            [role.as_str()],
        )
        .map_err(err)?;
        tx.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))
            .map_err(err)?;
    }
    tx.execute_batch(tables.create).map_err(err)?;
    if let Some(schema) = domain {
        domain::install(&tx, &display, schema)?;
    }
    tx.commit().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_pauses_ramp_up_and_add_up() {
        assert_eq!(busy_pause_us(0), 20);
        assert_eq!(busy_pause_us(9), 200);
        assert_eq!(busy_pause_us(49), 1_000);
        assert_eq!(busy_pause_us(5_000), 1_000);
        for n in [0u64, 1, 2, 10, 49, 50, 51, 200] {
            let summed: u64 = (0..n).map(busy_pause_us).sum();
            assert_eq!(busy_waited_us(n), summed, "after {n} retries");
        }
    }
}
