//! Opening a database file with the durability ordo requires, and mapping
//! SQLite errors to backend-neutral kinds.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ordo_core::open::Want;
use ordo_core::{ErrorKind, ProducerName, StoreError, StoreId};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};

use crate::domain::{self, Schema};

/// How long a write waits for another writer's lock before failing with
/// [`ErrorKind::Busy`], unless set otherwise.
pub const BUSY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// The version of ordo's own tables this build writes; a file with a newer
/// one is refused. Version 1 files (the first release, which knew only the
/// reservation domain) are upgraded once, and recorded as domain
/// `reservation`; version 3 gave every store its identity; version 5 gave
/// producer stores their destinations; version 8 made the consumer's inbox
/// a table with a rowid (its rows, bodies included, out of the keys' b-trees);
/// version 9 gave the producer's flows integer keys (`outbox_head.flow`) in
/// the outbox's `(flow, seq)` index and the relay heads.
pub const SCHEMA_VERSION: i64 = 9;

/// The domain of the first release's stores, which recorded none.
pub const FIRST_RELEASE_DOMAIN: &str = "reservation";

/// What one open of a store is given, in this backend's terms.
pub(crate) type Opening<'a> = ordo_core::open::Opening<'a, Tables, OpenOptions>;

/// ordo's own tables of one role.
pub(crate) struct Tables {
    /// The role these tables are of.
    pub role: Role,
    /// Creates every missing table and index (`IF NOT EXISTS`).
    pub create: &'static str,
    /// Upgrades a version 1 file before `create` runs.
    pub upgrade_from_1: &'static str,
    /// Brings the tables of a version 1, 2 or 3 file to version 4 (run
    /// after `upgrade_from_1`).
    pub upgrade_from_3: &'static str,
    /// Brings the tables of a version 1 to 4 file to version 5 (run after
    /// `upgrade_from_3`).
    pub upgrade_from_4: &'static str,
    /// Brings the tables of a version 1 to 5 file to version 6 (run after
    /// `upgrade_from_4`).
    pub upgrade_from_5: &'static str,
    /// Brings the tables of a version 1 to 6 file to version 7 (run after
    /// `upgrade_from_5`).
    pub upgrade_from_6: &'static str,
    /// Brings the tables of a version 1 to 7 file to version 8 (run after
    /// `upgrade_from_6`).
    pub upgrade_from_7: &'static str,
    /// Brings the tables of a version 1 to 8 file to version 9 (run after
    /// `upgrade_from_7`).
    pub upgrade_from_8: &'static str,
}

/// The `application_id` ordo writes in the header of every file it creates
/// (the bytes `ordo`), so that other programs, and ordo itself, can tell an
/// ordo store from any other SQLite file.
pub const APPLICATION_ID: i32 = 0x6F72_646F;

/// Settings for opening a store.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// How long a write waits for another writer's lock, for this store's
    /// connection alone. Opening
    /// a file that other processes are creating at the same time waits for
    /// them within this time too.
    pub busy_timeout: Duration,
    /// Whether a missing file is created (default `true`). When `false`, a
    /// missing file is refused with [`ErrorKind::NotFound`] and nothing is
    /// created, so that a mistyped path cannot start an empty store.
    pub create: bool,
    /// Whether a foreign SQLite file is adopted (default `false`). A non-empty
    /// file that ordo did not create (it holds a table, view, index or trigger
    /// but no `ordo_meta`, or a non-zero `user_version`) is refused with
    /// [`ErrorKind::Incompatible`] and left untouched, unless this is `true`:
    /// then ordo's tables are installed beside the application's own, and
    /// the file's `user_version` and `application_id` stay the application's
    /// (ordo records its schema version in `ordo_meta` instead). Only the
    /// journal mode changes, to WAL, which ordo requires. A file whose
    /// `application_id` is non-zero and not [`APPLICATION_ID`] belongs to
    /// another program and is refused even with `adopt`. Adopting also
    /// refuses a file that already has a table of the name ordo would
    /// create.
    pub adopt: bool,
    /// The name a producer store is created with (`None`:
    /// [`ProducerName::DEFAULT`]). An existing producer store named
    /// otherwise is refused and nothing is changed: a producer's name is set
    /// when it is created and never changes. Not read for consumer stores.
    pub producer_name: Option<ProducerName>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            busy_timeout: BUSY_TIMEOUT_DEFAULT,
            create: true,
            adopt: false,
            producer_name: None,
        }
    }
}

pub use ordo_core::store::Role;

/// Runs `f` inside one read transaction of `conn`, so that everything it
/// reads is one consistent snapshot; `context` names a failed begin.
pub(crate) fn read_snapshot<T>(
    conn: &mut Connection,
    role: Role,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let tx = conn.transaction().map_err(|e| {
        let context = format!("{}: cannot begin a read transaction", role.as_str());
        sql_error(&context, e)
    })?;
    f(&tx)
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

/// Begins a `BEGIN IMMEDIATE` transaction on a shared borrow of `conn`, so
/// that statements of it can be [`Held`] beside the transaction. The caller
/// holds `&mut` of the connection's owner for the transaction's life, which
/// keeps it the connection's only one.
pub(crate) fn begin_immediate<'c>(
    conn: &'c Connection,
    role: &str,
) -> Result<rusqlite::Transaction<'c>, StoreError> {
    rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)
        .map_err(|e| sql_error(&format!("{role}: cannot begin a write transaction"), e))
}

/// Statements prepared once and held for one transaction: a lookup in the
/// connection's statement cache hashes the whole SQL text, which costs a
/// batch's hot statements more than binding their values. Keyed by the
/// address of the `'static` SQL text, so each call site finds its own.
pub(crate) struct Held<'c> {
    conn: &'c Connection,
    statements: Vec<((usize, usize), rusqlite::CachedStatement<'c>)>,
}

impl<'c> Held<'c> {
    /// Holds statements of `conn`, none yet.
    pub(crate) fn new(conn: &'c Connection) -> Held<'c> {
        Held {
            conn,
            statements: Vec::new(),
        }
    }

    /// The connection the statements are of.
    pub(crate) fn conn(&self) -> &'c Connection {
        self.conn
    }

    /// The statement of `sql`, prepared (through the cache) at its first use.
    pub(crate) fn get(
        &mut self,
        sql: &'static str,
    ) -> rusqlite::Result<&mut rusqlite::CachedStatement<'c>> {
        let key = (sql.as_ptr() as usize, sql.len());
        let index = match self.statements.iter().position(|(k, _)| *k == key) {
            Some(index) => index,
            None => {
                let statement = self.conn.prepare_cached(sql)?;
                self.statements.push((key, statement));
                self.statements.len() - 1
            }
        };
        Ok(&mut self.statements[index].1)
    }
}

/// UTF-8 bytes bound as SQLite text (not a blob), without checking them
/// again: a stored body written into a reused buffer
/// ([`ordo_core::Envelope::write_stored_text`]).
pub(crate) struct Text<'a>(pub &'a [u8]);

impl rusqlite::ToSql for Text<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(rusqlite::types::ToSqlOutput::Borrowed(
            rusqlite::types::ValueRef::Text(self.0),
        ))
    }
}

/// Installs this connection's own busy handler: retries within `timeout`,
/// whatever other connections of the process were given.
fn set_busy_handler(conn: &Connection, timeout: Duration) -> Result<(), StoreError> {
    // The timeout travels in the handler's argument itself, as an integer:
    // no memory is shared or has to outlive the connection.
    let timeout_us = usize::try_from(timeout.as_micros()).unwrap_or(usize::MAX);
    // SAFETY: the handle is this open connection's, used on this thread
    // while `conn` is borrowed; the callback never dereferences its
    // argument, and SQLite keeps the handler until the connection closes.
    let code = unsafe {
        rusqlite::ffi::sqlite3_busy_handler(
            conn.handle(),
            Some(busy_callback),
            timeout_us as *mut std::ffi::c_void,
        )
    };
    if code == rusqlite::ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(StoreError::new(
            ErrorKind::Other,
            format!("cannot set the busy handler (SQLite code {code})"),
        ))
    }
}

/// SQLite's busy callback: `timeout_us` is the argument given at
/// installation, read as an integer.
unsafe extern "C" fn busy_callback(
    timeout_us: *mut std::ffi::c_void,
    retries: std::ffi::c_int,
) -> std::ffi::c_int {
    std::ffi::c_int::from(busy_wait(timeout_us as usize as u64, retries))
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

/// Retries a locked database with short pauses until `timeout_us` has been
/// spent, then gives up (the statement fails as `Busy`).
fn busy_wait(timeout_us: u64, retries: i32) -> bool {
    let n = u64::try_from(retries).unwrap_or(0);
    if busy_waited_us(n) >= timeout_us {
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
    StoreError::corrupt(context, detail)
}

/// The most symbolic links followed while resolving one path.
const SYMLINK_HOPS_MAX: u32 = 40;

fn path_error(path: &Path, what: &str, error: std::io::Error) -> StoreError {
    StoreError::with_source(
        ErrorKind::ConnectionLost,
        format!("{}: {what}", path.display()),
        error,
    )
}

/// The absolute path of the file `path` names, as opening it would reach it:
/// the parent directory canonical, and symbolic links followed, a dangling
/// one (or a chain of them) up to the file it would create. Creates nothing.
pub(crate) fn resolve(path: &Path) -> Result<PathBuf, StoreError> {
    let mut current =
        std::path::absolute(path).map_err(|e| path_error(path, "cannot resolve", e))?;
    for _ in 0..SYMLINK_HOPS_MAX {
        let (Some(parent), Some(name)) = (current.parent(), current.file_name()) else {
            return current
                .canonicalize()
                .map_err(|e| path_error(path, "cannot resolve", e));
        };
        let parent = parent
            .canonicalize()
            .map_err(|e| path_error(path, "cannot resolve its directory", e))?;
        let joined = parent.join(name);
        match std::fs::symlink_metadata(&joined) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = std::fs::read_link(&joined)
                    .map_err(|e| path_error(path, "cannot resolve", e))?;
                current = parent.join(target);
            }
            Ok(_) => return Ok(joined),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(joined),
            Err(e) => return Err(path_error(path, "cannot resolve", e)),
        }
    }
    Err(StoreError::new(
        ErrorKind::ConnectionLost,
        format!(
            "{}: more than {SYMLINK_HOPS_MAX} symbolic links to follow",
            path.display()
        ),
    ))
}

/// Whether `a` and `b` name the same database file, by any name: symbolic
/// links (dangling ones included, up to the file they would create), `..`,
/// hard links (same device and inode). Reads only; creates nothing. Fails
/// when a path cannot be resolved (a missing directory, a loop of links).
pub fn same_file(a: impl AsRef<Path>, b: impl AsRef<Path>) -> Result<bool, StoreError> {
    let (a, b) = (resolve(a.as_ref())?, resolve(b.as_ref())?);
    if a == b {
        return Ok(true);
    }
    match (std::fs::metadata(&a), std::fs::metadata(&b)) {
        (Ok(ma), Ok(mb)) => Ok(same_inode(&ma, &mb)),
        _ => Ok(false),
    }
}

#[cfg(unix)]
fn same_inode(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

#[cfg(not(unix))]
fn same_inode(_: &std::fs::Metadata, _: &std::fs::Metadata) -> bool {
    false
}

/// Opens `resolved`, creating it only if `create`, never as an SQLite URI:
/// the flags leave URIs out, and since the bundled SQLite is built to read
/// URIs whatever the flags, the path is absolute (it cannot start with
/// `file:`).
fn open_file(resolved: &Path, shown: &Path, create: bool) -> Result<Connection, StoreError> {
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    debug_assert!(resolved.is_absolute());
    Connection::open_with_flags(resolved, flags)
        .map_err(|e| sql_error(&format!("cannot open {}", shown.display()), e))
}

/// The most attempts at opening a file that other processes are creating.
const OPEN_ATTEMPTS_MAX: u32 = 100_000;

/// The pause before the next attempt at opening a busy file, in
/// microseconds: longer at each attempt, at most 5 ms.
fn open_pause_us(attempt: u32) -> u64 {
    (100 * u64::from(attempt) + 100).min(5_000)
}

/// Opens a database file, sets and reads back WAL and `synchronous=FULL`,
/// and creates the role's tables and the domain's if they are missing.
/// With `domain`, a missing file is created for it (when `options.create`)
/// and a store of another domain is refused; without, the file must be an
/// existing ordo store of `role`, of any domain, and no domain migration
/// runs. Existing state is never reset. Racing processes
/// opening a new file each create it or wait and open it: an attempt that
/// finds the file busy is started again, within the busy timeout.
pub(crate) fn open(path: impl AsRef<Path>, opening: Opening<'_>) -> Result<Opened, StoreError> {
    let path = path.as_ref();
    let conn = open_conn(path, opening)?;
    Ok(Opened {
        domain: read_domain(&conn, path)?,
        store_id: read_store_id(&conn, path)?,
        producer_name: read_producer_name(&conn, path)?,
        wake: crate::watch::signal_for(path),
        conn,
    })
}

/// An opened store's connection and what it records about itself.
pub(crate) struct Opened {
    pub conn: Connection,
    pub domain: String,
    pub store_id: StoreId,
    /// The producer's name (a consumer store records none: the default).
    pub producer_name: ProducerName,
    pub wake: ordo_core::Signal,
}

fn open_conn(path: &Path, opening: Opening<'_>) -> Result<Connection, StoreError> {
    let Opening { want, options, .. } = opening;
    let resolved = resolve(path)?;
    if (!options.create || want.creates_with().is_none()) && !resolved.exists() {
        return Err(StoreError::new(
            ErrorKind::NotFound,
            format!("{} does not exist (it is not created here)", path.display()),
        ));
    }
    // A busy timeout too long to add to the clock never runs out.
    let deadline = Instant::now().checked_add(options.busy_timeout);
    let mut attempt = 0;
    loop {
        match open_attempt(&resolved, path, opening) {
            Err(e)
                if e.kind() == ErrorKind::Busy
                    && attempt < OPEN_ATTEMPTS_MAX
                    && deadline.is_none_or(|d| Instant::now() < d) =>
            {
                std::thread::sleep(Duration::from_micros(open_pause_us(attempt)));
                attempt += 1;
            }
            result => return result,
        }
    }
}

fn open_attempt(
    resolved: &Path,
    path: &Path,
    opening: Opening<'_>,
) -> Result<Connection, StoreError> {
    let Opening {
        tables,
        want,
        options,
    } = opening;
    let role = tables.role;
    let conn = open_file(
        resolved,
        path,
        options.create && want.creates_with().is_some(),
    )?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    // Without the query planner stability guarantee SQLite plans some
    // statements for the values bound to them (a `LIMIT ?` among them) and
    // prepares such a statement again at every new binding, which undoes the
    // statement cache: the relay's fair round spent most of its time in the
    // SQL parser.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(|e| sql_error("cannot set the query planner stability guarantee", e))?;
    // The wait for a locked file is this handler's (see `busy_wait`).
    set_busy_handler(&conn, options.busy_timeout)?;
    // Refuse a foreign or wrong-role file before any pragma changes it.
    let adopt = options.adopt && matches!(want, Want::Domain(_));
    let state = read_state(&conn, path, role, adopt)?;
    let domain = want.schema_for(state == FileState::Empty);
    let existing = matches!(state, FileState::Older | FileState::Current);
    if let (Role::Producer, true, Some(wanted)) = (role, existing, &options.producer_name) {
        let stored = read_producer_name(&conn, path)?;
        ordo_core::store::check_producer_name(&path.display().to_string(), &stored, wanted)?;
    }
    if state == FileState::Foreign {
        check_names_free(&conn, path, tables.create)?;
    }
    if domain.is_none() && state == FileState::Empty {
        return Err(StoreError::new(
            ErrorKind::Incompatible,
            format!("{} is not an ordo {} store", path.display(), role.as_str()),
        ));
    }
    set_durability(&conn, path)?;
    let stale = match domain {
        Some(_) if state != FileState::Current => true,
        Some(schema) => {
            let stored = domain::stored_domain(&conn)
                .map_err(|e| sql_error(&format!("{}: cannot read", path.display()), e))?;
            domain::check(&path.display().to_string(), stored.as_ref(), schema)?
        }
        None => state != FileState::Current,
    };
    if stale {
        // Nothing to create otherwise: opening then takes no write lock, so a
        // busy peer does not stop a process from starting.
        init_schema(&conn, path, opening, domain, adopt)?;
    }
    Ok(conn)
}

/// Sets WAL and `synchronous=FULL` and reads both back.
fn set_durability(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let display = path.display();
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
    Ok(())
}

/// Refuses an existing file that is not an ordo file of `role` (a foreign
/// file is refused: adopting is only done by opening), reading only and
/// creating nothing (a missing file is fine: opening will create it).
pub(crate) fn check_existing(path: &Path, role: Role) -> Result<(), StoreError> {
    let resolved = resolve(path)?;
    if !resolved.exists() {
        return Ok(());
    }
    let conn = open_file(&resolved, path, false)?;
    read_state(&conn, path, role, false).map(|_| ())
}

/// The domain of the ordo store of `role` at `path`, reading only: `None`
/// for a missing or empty file (a store not created yet), the first
/// release's domain for a store of the first release; an error for a
/// foreign file or a store of the other role.
pub(crate) fn existing_domain(path: &Path, role: Role) -> Result<Option<String>, StoreError> {
    let resolved = resolve(path)?;
    if !resolved.exists() {
        return Ok(None);
    }
    let conn = open_file(&resolved, path, false)?;
    let err = |e| sql_error(&format!("{}: cannot read", path.display()), e);
    let tx =
        rusqlite::Transaction::new_unchecked(&conn, TransactionBehavior::Deferred).map_err(err)?;
    if inspect(&tx, path, role, false)? == FileState::Empty {
        return Ok(None);
    }
    let stored = domain::stored_domain(&tx).map_err(err)?;
    Ok(Some(stored.map_or_else(
        || FIRST_RELEASE_DOMAIN.to_owned(),
        |domain| domain.name,
    )))
}

/// The identity a store records (every store opened by this build has one).
/// The producer name a store records: [`ProducerName::DEFAULT`] for a
/// store of an earlier release, which recorded none.
fn read_producer_name(conn: &Connection, path: &Path) -> Result<ProducerName, StoreError> {
    let stored: Option<String> = conn
        .query_row(
            "SELECT value FROM ordo_meta WHERE key = 'producer_name'",
            [],
            |row| row.get(0),
        )
        .optional()
        .map_err(|e| sql_error(&format!("{}: cannot read", path.display()), e))?;
    ordo_core::store::stored_producer_name(&path.display().to_string(), stored)
}

fn read_store_id(conn: &Connection, path: &Path) -> Result<StoreId, StoreError> {
    let display = path.display().to_string();
    let stored = conn
        .query_row(
            "SELECT value FROM ordo_meta WHERE key = 'store_id'",
            [],
            |row| row.get(0),
        )
        .optional()
        .map_err(|e| sql_error(&format!("{display}: cannot read"), e))?;
    StoreId::stored(&display, stored)
}

/// The domain a store records (every store opened by this build has one).
fn read_domain(conn: &Connection, path: &Path) -> Result<String, StoreError> {
    crate::domain::stored_domain(conn)
        .map_err(|e| sql_error(&format!("{}: cannot read", path.display()), e))?
        .map(|domain| domain.name)
        .ok_or_else(|| corrupt(&path.display().to_string(), "the store records no domain"))
}

/// What a file holds, as far as ordo is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileState {
    /// No schema object, `user_version` and `application_id` zero: a new file.
    Empty,
    /// Another application's file, to be adopted (only with `adopt`).
    Foreign,
    /// This role's tables at an older schema version, or a file of ordo's
    /// first release, whose header does not carry [`APPLICATION_ID`] yet.
    Older,
    /// This role's tables at the current schema version.
    Current,
}

/// Reads the file's state in a read transaction.
fn read_state(
    conn: &Connection,
    path: &Path,
    role: Role,
    adopt: bool,
) -> Result<FileState, StoreError> {
    let err = |e| sql_error(&format!("{}: cannot read", path.display()), e);
    let tx =
        rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Deferred).map_err(err)?;
    inspect(&tx, path, role, adopt)
}

/// The header and schema facts that tell whose a file is.
struct Facts {
    objects: i64,
    has_meta: bool,
    application_id: i32,
    user_version: i64,
}

fn read_facts(conn: &Connection, path: &Path) -> Result<Facts, StoreError> {
    let err = |e| sql_error(&format!("{}: cannot read", path.display()), e);
    let (objects, has_meta) = conn
        .query_row(
            "SELECT count(*), count(*) FILTER (WHERE type='table' AND name='ordo_meta') \
             FROM sqlite_master",
            [],
            |row| Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)? > 0)),
        )
        .map_err(err)?;
    let application_id = conn
        .query_row("PRAGMA application_id", [], |row| row.get(0))
        .map_err(err)?;
    let user_version = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(err)?;
    Ok(Facts {
        objects,
        has_meta,
        application_id,
        user_version,
    })
}

/// The file's state, refusing another program's file, a foreign SQLite file
/// (unless `adopt`), an ordo file of the other role, and a newer schema.
fn inspect(
    conn: &Connection,
    path: &Path,
    role: Role,
    adopt: bool,
) -> Result<FileState, StoreError> {
    let display = path.display();
    let facts = read_facts(conn, path)?;
    if facts.application_id != 0 && facts.application_id != APPLICATION_ID {
        return Err(StoreError::new(
            ErrorKind::Incompatible,
            format!(
                "{display} belongs to another program (application_id {}); refusing to use it",
                facts.application_id
            ),
        ));
    }
    if !facts.has_meta {
        return match (facts.objects, facts.user_version, adopt) {
            (0, 0, _) => Ok(FileState::Empty),
            (_, _, true) => Ok(FileState::Foreign),
            _ => Err(StoreError::new(
                ErrorKind::Incompatible,
                format!(
                    "{display} is a SQLite database that ordo did not create; refusing to use it \
                     (to install ordo's tables beside its own, adopt it: `ordo init --adopt`, or `OpenOptions::adopt`)"
                ),
            )),
        };
    }
    check_role(conn, path, role)?;
    let adopted = adopted_version(conn, path)?;
    let version = adopted.unwrap_or(facts.user_version);
    match version {
        v if v > SCHEMA_VERSION => Err(StoreError::new(
            ErrorKind::Incompatible,
            format!("{display} has schema version {v}; this ordo knows up to {SCHEMA_VERSION}"),
        )),
        v if v == SCHEMA_VERSION && (adopted.is_some() || facts.application_id != 0) => {
            Ok(FileState::Current)
        }
        _ => Ok(FileState::Older),
    }
}

/// Refuses an ordo file of the other role.
fn check_role(conn: &Connection, path: &Path, role: Role) -> Result<(), StoreError> {
    let display = path.display();
    let stored_role: Option<String> = conn
        .query_row("SELECT value FROM ordo_meta WHERE key='role'", [], |row| {
            row.get(0)
        })
        .optional()
        .map_err(|e| sql_error(&format!("{display}: cannot read"), e))?;
    role.check_stored(stored_role.as_deref(), |found| {
        format!(
            "{display} is an ordo {found} database, not a {} database",
            role.as_str()
        )
    })
}

/// The schema version of a file ordo adopted (kept in `ordo_meta`, since the
/// header's `user_version` is the application's); `None` for ordo's own files.
fn adopted_version(conn: &Connection, path: &Path) -> Result<Option<i64>, StoreError> {
    let display = path.display();
    let value: Option<String> = conn
        .query_row(
            "SELECT value FROM ordo_meta WHERE key='schema_version'",
            [],
            |row| row.get(0),
        )
        .optional()
        .map_err(|e| sql_error(&format!("{display}: cannot read"), e))?;
    value
        .map(|v| {
            v.parse::<i64>().map_err(|_| {
                corrupt(
                    &format!("{display}: ordo_meta"),
                    format!("schema_version {v:?}"),
                )
            })
        })
        .transpose()
}

/// The table that marks a file as ordo's: its role, and in an adopted file
/// its schema version.
const META_TABLE: &str =
    "CREATE TABLE ordo_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;";

/// Refuses to adopt a file that already has an object named like one of
/// ordo's tables (it would be taken for ordo's own).
fn check_names_free(conn: &Connection, path: &Path, schema: &str) -> Result<(), StoreError> {
    let err = |e| sql_error("cannot list ordo's tables", e);
    let scratch = Connection::open_in_memory().map_err(err)?;
    scratch.execute_batch(META_TABLE).map_err(err)?;
    scratch.execute_batch(schema).map_err(err)?;
    let mut stmt = scratch
        .prepare("SELECT name FROM sqlite_master")
        .map_err(err)?;
    let names = stmt
        .query_map([], |row| row.get::<_, String>(0))
        .map_err(err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    for name in names {
        let taken: bool = conn
            .query_row(
                "SELECT count(*) > 0 FROM sqlite_master WHERE name = ?1 COLLATE NOCASE",
                [&name],
                |row| row.get(0),
            )
            .map_err(|e| sql_error(&format!("{}: cannot read", path.display()), e))?;
        if taken {
            return Err(StoreError::new(
                ErrorKind::Incompatible,
                format!(
                    "{} already has an object named {name}; refusing to adopt it",
                    path.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Creates what is missing, in one write transaction; checks the file again
/// inside it, since another process may have created it meanwhile. Marks an
/// ordo-owned file with [`APPLICATION_ID`] and [`SCHEMA_VERSION`]; records
/// the version of an adopted file in `ordo_meta`.
fn init_schema(
    conn: &Connection,
    path: &Path,
    opening: Opening<'_>,
    domain: Option<&Schema>,
    adopt: bool,
) -> Result<(), StoreError> {
    let (tables, role) = (opening.tables, opening.tables.role);
    let display = path.display().to_string();
    let err = |e| sql_error(&format!("{display}: cannot initialise"), e);
    let tx =
        rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate).map_err(err)?;
    let state = inspect(&tx, path, role, adopt)?;
    if state == FileState::Foreign {
        check_names_free(&tx, path, tables.create)?;
    }
    if state == FileState::Older && stored_version(&tx, path)? < 2 {
        // A file of the first release: its tables lack what came later, and
        // it knew only the reservation domain.
        tx.execute_batch(tables.upgrade_from_1).map_err(err)?;
        tx.execute(
            "INSERT OR IGNORE INTO ordo_meta (key, value) VALUES ('domain', ?1), ('domain_version', '0')",
            [FIRST_RELEASE_DOMAIN],
        )
        .map_err(err)?;
    }
    if state == FileState::Older {
        upgrade_from_3(&tx, path, tables)?;
    }
    if matches!(state, FileState::Empty | FileState::Foreign) {
        tx.execute_batch(META_TABLE).map_err(err)?;
        tx.execute(
            "INSERT INTO ordo_meta (key, value) VALUES ('role', ?1)",
            [role.as_str()],
        )
        .map_err(err)?;
        if role == Role::Producer {
            let name = opening.options.producer_name.clone().unwrap_or_default();
            tx.execute(
                "INSERT INTO ordo_meta (key, value) VALUES ('producer_name', ?1)",
                [name.as_str()],
            )
            .map_err(err)?;
        }
    }
    // Version 3: the store's identity, given once (a store of an earlier
    // release gets it here, at its first open by this one).
    tx.execute(
        "INSERT OR IGNORE INTO ordo_meta (key, value) VALUES ('store_id', lower(hex(randomblob(16))))",
        [],
    )
    .map_err(err)?;
    if state == FileState::Foreign || adopted_version(&tx, path)?.is_some() {
        tx.execute(
            "INSERT OR REPLACE INTO ordo_meta (key, value) VALUES ('schema_version', ?1)",
            [SCHEMA_VERSION.to_string()],
        )
        .map_err(err)?;
    } else {
        tx.execute_batch(&format!(
            "PRAGMA user_version = {SCHEMA_VERSION}; PRAGMA application_id = {APPLICATION_ID};"
        ))
        .map_err(err)?;
    }
    tx.execute_batch(tables.create).map_err(err)?;
    if let Some(schema) = domain {
        domain::install(&tx, &display, schema)?;
    }
    tx.commit().map_err(err)
}

/// Brings the tables of an earlier file, at version 3 at least (after
/// `upgrade_from_1`), to [`SCHEMA_VERSION`], one version at a time.
fn upgrade_from_3(tx: &Connection, path: &Path, tables: &Tables) -> Result<(), StoreError> {
    let err = |e| sql_error(&format!("{}: cannot initialise", path.display()), e);
    let steps = [
        // Version 4: the consumer's rows keep the store that delivered them.
        (4, tables.upgrade_from_3),
        // Version 5: custody per destination, the existing marks `default`'s.
        (5, tables.upgrade_from_4),
        // Version 6: the consumer's identities in producer namespaces.
        (6, tables.upgrade_from_5),
        // Version 7: the consumer's effect intents.
        (7, tables.upgrade_from_6),
        // Version 8: the consumer's inbox rows in a table with a rowid.
        (8, tables.upgrade_from_7),
        // Version 9: the producer's flows keyed by integers.
        (9, tables.upgrade_from_8),
    ];
    for (version, sql) in steps {
        if stored_version(tx, path)? < version {
            tx.execute_batch(sql).map_err(err)?;
        }
    }
    Ok(())
}

/// The version of ordo's tables a file records: in `ordo_meta` for an
/// adopted file, else in the header's `user_version`.
fn stored_version(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    match adopted_version(conn, path)? {
        Some(version) => Ok(version),
        None => conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(|e| sql_error(&format!("{}: cannot read", path.display()), e)),
    }
}

/// The constructors of a store of one role: `ordo_core`'s (`open_as`,
/// `open`, `open_with`, `open_existing`, `open_or_create`) and the two reads of a
/// file before any open (`check_existing`, `existing_domain`), and the
/// accessors both roles share (`connection`, `read`).
macro_rules! open_constructors {
    ($store:ident, $role:expr, $tables:expr) => {
        ordo_core::open_constructors!(
            $store,
            path: impl AsRef<Path>,
            OpenOptions,
            $tables,
            crate::conn::open
        );

        /// Refuses an existing file that is not an ordo store of this role
        /// (a foreign SQLite file, the other role, a newer schema), reading
        /// only; a missing file passes. Lets a caller check every file
        /// before creating any.
        pub fn check_existing(path: impl AsRef<Path>) -> Result<(), StoreError> {
            crate::conn::check_existing(path.as_ref(), $role)
        }

        /// The domain of the store at `path`, reading only and creating
        /// nothing: `None` when the file is missing or empty (no store
        /// yet); an error for a file that is not an ordo store of this role.
        pub fn existing_domain(path: impl AsRef<Path>) -> Result<Option<String>, StoreError> {
            crate::conn::existing_domain(path.as_ref(), $role)
        }

        /// The underlying connection, for reading pragmas and for the
        /// caller's own reads.
        pub fn connection(&self) -> &Connection {
            &self.conn
        }

        /// Runs `f` inside one read transaction, so that everything it
        /// reads (ordo's tables, the application's) is one consistent
        /// snapshot.
        pub fn read<T>(
            &mut self,
            f: impl FnOnce(&Connection) -> Result<T, StoreError>,
        ) -> Result<T, StoreError> {
            crate::conn::read_snapshot(&mut self.conn, $role, f)
        }
    };
}
pub(crate) use open_constructors;

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
