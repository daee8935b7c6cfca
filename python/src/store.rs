//! What both store classes share: the store behind an owned lock, the
//! thread that holds it, opening, closing, and the read-only connection of
//! `store.query`.
//!
//! Invariant: the store is only ever used under its lock; the lock is
//! only ever waited for with the GIL released; a thread that holds it (an
//! open transaction, an apply in progress) and asks for it again is
//! refused with `ordo.Error` instead of waiting for itself.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use std::time::Duration;

use ordo::core::domain::Schema;
use ordo::core::{ErrorKind, ProducerName, StoreError};
use ordo::postgres::PgTx;
use ordo::sqlite::rusqlite::{Connection, OpenFlags};
use ordo::{Location, OpenSpec};
use parking_lot::{ArcMutexGuard, Mutex, RawMutex};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::convert::{type_name, SqlValue};
use crate::errors::{error, rule, store_error, WrongDomain};
use crate::sql::{SqlFail, TxSql};

/// The store held under its lock.
pub type Guard<S> = ArcMutexGuard<RawMutex, Option<S>>;

/// A role's store type: `ordo::Producer` or `ordo::Consumer`.
pub trait StoreKind: Send + Sized + 'static {
    /// `producer` or `consumer`.
    const ROLE: &'static str;
    /// Opens the store at `at`.
    fn open(spec: &OpenSpec, at: &Location) -> Result<Self, StoreError>;
    /// The domain of the SQLite store at `path`, creating nothing.
    fn file_domain(path: &Path) -> Result<Option<String>, StoreError>;
    /// The domain that owns the store.
    fn domain(&self) -> &str;
    /// The connection of a PostgreSQL store.
    fn pg(&self) -> Option<&PgTx>;
}

impl StoreKind for ordo::Producer {
    const ROLE: &'static str = "producer";
    fn open(spec: &OpenSpec, at: &Location) -> Result<Self, StoreError> {
        spec.producer(at)
    }
    fn file_domain(path: &Path) -> Result<Option<String>, StoreError> {
        ordo::sqlite::ProducerDb::existing_domain(path)
    }
    fn domain(&self) -> &str {
        ordo::Producer::domain(self)
    }
    fn pg(&self) -> Option<&PgTx> {
        match self {
            ordo::Producer::Postgres(p) => Some(p.connection()),
            ordo::Producer::Sqlite(_) => None,
        }
    }
}

impl StoreKind for ordo::Consumer {
    const ROLE: &'static str = "consumer";
    fn open(spec: &OpenSpec, at: &Location) -> Result<Self, StoreError> {
        spec.consumer(at)
    }
    fn file_domain(path: &Path) -> Result<Option<String>, StoreError> {
        ordo::sqlite::ConsumerDb::existing_domain(path)
    }
    fn domain(&self) -> &str {
        ordo::Consumer::domain(self)
    }
    fn pg(&self) -> Option<&PgTx> {
        match self {
            ordo::Consumer::Postgres(c) => Some(c.connection()),
            ordo::Consumer::Sqlite(_) => None,
        }
    }
}

/// The connection `store.query` reads on: never the store's own, so a
/// read never waits for an open transaction.
enum Reader<S> {
    /// A read-only SQLite connection to the file.
    Sqlite(Connection),
    /// The same PostgreSQL store opened a second time.
    Store(S),
}

/// A store, shared by the Python objects that use it.
pub struct Shared<S> {
    slot: Arc<Mutex<Option<S>>>,
    /// The thread holding the lock for a transaction or an apply.
    holder: Mutex<Option<ThreadId>>,
    closed: AtomicBool,
    reader: Mutex<Option<Reader<S>>>,
    spec: OpenSpec,
    /// Where the store lives.
    pub location: Location,
    /// The domain that owns it.
    pub domain: String,
}

/// The store's open specification from the arguments of `open`.
pub fn open_spec(
    domain: &str,
    migrations: Option<&Bound<'_, PyAny>>,
    name: Option<&str>,
) -> PyResult<OpenSpec> {
    let mut schema = Schema::new(domain).map_err(|e| rule("domain", e))?;
    for (sqlite, postgres) in migration_list(migrations)? {
        schema = match postgres {
            None => schema.migration(sqlite),
            Some(postgres) => schema.migration_each(sqlite, postgres),
        };
    }
    let mut spec = OpenSpec::domain(schema);
    if let Some(name) = name {
        let name = ProducerName::new(name).map_err(|e| rule("producer name", e))?;
        spec = spec.producer_name(name);
    }
    Ok(spec)
}

/// A list of str, checked.
fn str_list(value: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<String>> {
    if value.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(format!(
            "{what} is a list of SQL statements, not one str"
        )));
    }
    let items: Vec<Bound<'_, PyAny>> = if let Ok(list) = value.cast::<PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = value.cast::<PyTuple>() {
        tuple.iter().collect()
    } else {
        return Err(PyTypeError::new_err(format!(
            "{what} is a list of str, not {}",
            type_name(value)
        )));
    };
    items
        .iter()
        .map(|item| {
            item.extract::<String>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "{what}: a migration is a str, not {}",
                    type_name(item)
                ))
            })
        })
        .collect()
}

/// The migrations: a list of SQL for both backends, or
/// `{"sqlite": [...], "postgres": [...]}` (as many of each).
fn migration_list(value: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<(String, Option<String>)>> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let Ok(dict) = value.cast::<PyDict>() else {
        return Ok(str_list(value, "migrations")?
            .into_iter()
            .map(|sql| (sql, None))
            .collect());
    };
    let mut sqlite = Vec::new();
    let mut postgres = Vec::new();
    for (key, list) in dict.iter() {
        match key.extract::<String>().ok().as_deref() {
            Some("sqlite") => sqlite = str_list(&list, "migrations[\"sqlite\"]")?,
            Some("postgres") => postgres = str_list(&list, "migrations[\"postgres\"]")?,
            _ => {
                return Err(crate::errors::invalid(format!(
                    "migrations: the keys are \"sqlite\" and \"postgres\", not {}",
                    key.repr()?
                )))
            }
        }
    }
    if sqlite.len() != postgres.len() {
        return Err(crate::errors::invalid(format!(
            "migrations: {} for SQLite but {} for PostgreSQL: each migration has one text per backend",
            sqlite.len(),
            postgres.len()
        )));
    }
    Ok(sqlite
        .into_iter()
        .zip(postgres.into_iter().map(Some))
        .collect())
}

/// A location: a path (str or os.PathLike) or a `postgres://` URL.
pub fn location(value: &Bound<'_, PyAny>) -> PyResult<Location> {
    let os = value.py().import("os")?;
    let text = os.call_method1("fspath", (value,)).map_err(|_| {
        PyTypeError::new_err(format!(
            "location is a path or a postgres:// URL, not {}",
            type_name(value)
        ))
    })?;
    let text: String = text.extract().map_err(|_| {
        PyTypeError::new_err("location is a str path (not bytes) or a postgres:// URL")
    })?;
    if text.is_empty() {
        return Err(crate::errors::invalid("location is empty"));
    }
    Ok(Location::from(text.as_str()))
}

impl<S: StoreKind> Shared<S> {
    /// Opens the store at `at` with `spec` (the GIL released): another
    /// domain's store is `ordo.WrongDomain`, nothing changed.
    pub fn open(py: Python<'_>, spec: OpenSpec, at: Location, domain: &str) -> PyResult<Shared<S>> {
        let store = py
            .detach(|| -> Result<Result<S, String>, StoreError> {
                if let Some(path) = at.file() {
                    if let Some(found) = S::file_domain(path)? {
                        if found != domain {
                            return Ok(Err(format!(
                                "{} belongs to domain \"{found}\", not \"{domain}\"; nothing was changed",
                                at
                            )));
                        }
                    }
                }
                S::open(&spec, &at).map(Ok)
            })
            .map_err(store_error)?
            .map_err(WrongDomain::new_err)?;
        Ok(Shared {
            domain: store.domain().to_owned(),
            slot: Arc::new(Mutex::new(Some(store))),
            holder: Mutex::new(None),
            closed: AtomicBool::new(false),
            reader: Mutex::new(None),
            spec,
            location: at,
        })
    }

    fn closed_error(&self) -> PyErr {
        error(format!("the {} store {} is closed", S::ROLE, self.location))
    }

    /// Takes the store's lock for this thread, waiting with the GIL
    /// released; refused when this thread holds it already, or the store
    /// is closed. The caller marks itself the holder if it keeps it across
    /// calls into Python.
    pub fn lock(&self, py: Python<'_>) -> PyResult<Guard<S>> {
        let me = std::thread::current().id();
        if *self.holder.lock() == Some(me) {
            return Err(error(format!(
                "this thread already holds the {} store {} (an open transaction or an apply in progress): transactions do not nest",
                S::ROLE,
                self.location
            )));
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(self.closed_error());
        }
        let slot = Arc::clone(&self.slot);
        let guard = py.detach(move || slot.lock_arc());
        if guard.is_none() {
            return Err(self.closed_error());
        }
        Ok(guard)
    }

    /// Marks this thread as the lock's holder until [`Shared::release`].
    pub fn hold(&self) -> ThreadId {
        let me = std::thread::current().id();
        *self.holder.lock() = Some(me);
        me
    }

    /// Clears the holder if it still is `thread`.
    pub fn release(&self, thread: ThreadId) {
        let mut holder = self.holder.lock();
        if *holder == Some(thread) {
            *holder = None;
        }
    }

    /// Closes the store: waits for what holds it (the GIL released), then
    /// drops it. Closing twice is nothing.
    pub fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut guard = self.lock(py)?;
        self.closed.store(true, Ordering::Release);
        let store = guard.take();
        let reader = self.reader.lock().take();
        py.detach(move || {
            drop(store);
            drop(reader);
        });
        Ok(())
    }

    /// Whether the store was closed.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Runs a read-only query on the reader's connection (opened at the
    /// first), the GIL released: never waits for a transaction.
    pub fn read(
        &self,
        py: Python<'_>,
        sql: &str,
        params: &[SqlValue],
    ) -> PyResult<Vec<Vec<SqlValue>>> {
        if self.is_closed() {
            return Err(self.closed_error());
        }
        py.detach(|| -> Result<_, SqlFail> {
            let mut reader = self.reader.lock();
            if reader.is_none() {
                *reader = Some(self.open_reader()?);
            }
            match reader.as_ref() {
                Some(Reader::Sqlite(conn)) => conn.rows(sql, params),
                Some(Reader::Store(store)) => match store.pg() {
                    Some(pg) => pg.rows(sql, params),
                    None => unreachable!("a second store is opened for PostgreSQL only"),
                },
                None => unreachable!("opened above"),
            }
        })
        .map_err(crate::sql_error)
    }

    fn open_reader(&self) -> Result<Reader<S>, StoreError> {
        match self.location.file() {
            Some(path) => {
                let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
                let conn = Connection::open_with_flags(path, flags).map_err(|e| {
                    StoreError::with_source(
                        ErrorKind::ConnectionLost,
                        format!("{}: cannot open for reading", path.display()),
                        e,
                    )
                })?;
                conn.busy_timeout(Duration::from_secs(5)).map_err(|e| {
                    StoreError::with_source(ErrorKind::Other, "cannot set the busy timeout", e)
                })?;
                Ok(Reader::Sqlite(conn))
            }
            None => Ok(Reader::Store(S::open(&self.spec, &self.location)?)),
        }
    }
}
