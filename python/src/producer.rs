//! `ordo.Producer` and its transactions.
//!
//! A transaction is one backend write transaction, held open across the
//! Python calls of a `with` block. The backends' write API runs a closure
//! between BEGIN and COMMIT, so the closure runs on the store's own thread
//! and serves the transaction's calls, sent to it over a channel, until
//! the block ends: commit, or rollback (an exception, `rollback()`, the
//! object dropped).
//!
//! Invariant: the transaction owns the store's lock (an owned guard moved
//! to the store's thread), never a borrow; it ends exactly once; the GIL
//! is released while a call waits for the store's thread.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::ThreadId;

use ordo::core::envelope::Headers;
use ordo::core::{
    AppendError, Envelope as CoreEnvelope, FlowId, OutboxTx, SchemaVersion, StoreError,
};
use parking_lot::Mutex;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyType};
use serde_json::{Map, Value};

use crate::convert::{json_object, rows_to_py, sql_params, type_name, SqlValue};
use crate::errors::{append_error, error, rule, store_error};
use crate::sql::{SqlFail, TxSql};
use crate::store::{Guard, Shared};
use crate::values::Envelope;

/// A request to the thread that holds a transaction open.
enum Request {
    Execute(String, Vec<SqlValue>, Sender<Result<u64, SqlFail>>),
    Query(
        String,
        Vec<SqlValue>,
        Sender<Result<Vec<Vec<SqlValue>>, SqlFail>>,
    ),
    Append(Box<Append>, Sender<Result<CoreEnvelope, AppendError>>),
    /// Commit (`true`) or roll back.
    End(bool),
}

/// The arguments of one append, checked.
struct Append {
    flow_id: FlowId,
    event_type: String,
    schema_version: SchemaVersion,
    payload: Map<String, Value>,
    headers: Headers,
}

/// How a transaction's closure ends without committing.
enum TxEnd {
    Rollback,
    Store(StoreError),
}

impl From<StoreError> for TxEnd {
    fn from(e: StoreError) -> TxEnd {
        TxEnd::Store(e)
    }
}

/// A backend's producer transaction: its SQL, and the outbox.
trait ProducerTxSql: OutboxTx {
    fn run_sql(&self) -> &dyn TxSql;
}

impl ProducerTxSql for ordo::sqlite::ProducerTx<'_> {
    fn run_sql(&self) -> &dyn TxSql {
        let conn: &ordo::sqlite::rusqlite::Connection = self.sql();
        conn
    }
}

impl ProducerTxSql for ordo::postgres::PgProducerTx<'_> {
    fn run_sql(&self) -> &dyn TxSql {
        self.sql()
    }
}

/// Serves a transaction's requests until it ends: `Ok` commits.
fn serve<T: ProducerTxSql>(tx: &mut T, requests: &Receiver<Request>) -> Result<(), TxEnd> {
    loop {
        // A sender dropped without ending (the object collected): roll back.
        let Ok(request) = requests.recv() else {
            return Err(TxEnd::Rollback);
        };
        match request {
            Request::Execute(sql, params, reply) => {
                let _ = reply.send(tx.run_sql().exec(&sql, &params));
            }
            Request::Query(sql, params, reply) => {
                let _ = reply.send(tx.run_sql().rows(&sql, &params));
            }
            Request::Append(a, reply) => {
                let appended = tx.append_with_headers(
                    &a.flow_id,
                    &a.event_type,
                    a.schema_version,
                    &a.payload,
                    &a.headers,
                );
                let _ = reply.send(appended);
            }
            Request::End(true) => return Ok(()),
            Request::End(false) => return Err(TxEnd::Rollback),
        }
    }
}

/// Runs one transaction on the store held by `guard`, and reports how it
/// ended once the lock is released.
fn run_transaction(
    mut guard: Guard<ordo::Producer>,
    requests: Receiver<Request>,
    done: Sender<Result<(), StoreError>>,
) {
    let ended = match guard.as_mut() {
        Some(ordo::Producer::Sqlite(db)) => db.write(|tx| serve(tx, &requests)),
        Some(ordo::Producer::Postgres(db)) => db.write(|tx| serve(tx, &requests)),
        None => Err(TxEnd::Store(StoreError::new(
            ordo::core::ErrorKind::Other,
            "the store was closed",
        ))),
    };
    drop(guard);
    let _ = done.send(match ended {
        Ok(()) | Err(TxEnd::Rollback) => Ok(()),
        Err(TxEnd::Store(e)) => Err(e),
    });
}

type Job = Box<dyn FnOnce() + Send>;

/// A producer store: the outbox beside the application's tables, in an
/// SQLite file or a PostgreSQL database.
///
/// ``Producer.open(location, domain, migrations=(), name="default")``
/// creates or opens it. Write in ``with producer.transaction() as tx:``
/// (``tx.execute``, ``tx.query``, ``tx.append``); read with
/// ``producer.query``. A context manager: leaving the block closes it.
#[pyclass(module = "ordo", name = "Producer", frozen)]
pub struct Producer {
    pub(crate) shared: Arc<Shared<ordo::Producer>>,
    /// The thread that runs this store's transactions, started at the
    /// first.
    worker: Mutex<Option<Sender<Job>>>,
}

impl Producer {
    /// Hands `job` to the store's thread, starting it if needed.
    fn submit(&self, job: Job) -> PyResult<()> {
        let mut worker = self.worker.lock();
        let job = match worker.as_ref() {
            Some(jobs) => match jobs.send(job) {
                Ok(()) => return Ok(()),
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("ordo-producer-tx".into())
            .spawn(move || queue.into_iter().for_each(|job| job()))
            .map_err(|e| error(format!("cannot start the store's thread: {e}")))?;
        jobs.send(job)
            .map_err(|_| error("the store's thread stopped at once"))?;
        *worker = Some(jobs);
        Ok(())
    }
}

#[pymethods]
impl Producer {
    /// Creates or opens the producer store at ``location`` (a path or a
    /// ``postgres://`` URL) for ``domain``, running the domain's
    /// ``migrations`` once each; ``name`` is the producer's name, set when
    /// the store is created. Another domain's store is refused
    /// (``ordo.WrongDomain``).
    #[staticmethod]
    #[pyo3(signature = (location, domain, migrations=None, name=None))]
    fn open(
        py: Python<'_>,
        location: &Bound<'_, PyAny>,
        domain: &Bound<'_, PyAny>,
        migrations: Option<&Bound<'_, PyAny>>,
        name: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Producer> {
        let at = crate::store::location(location)?;
        let domain = crate::str_arg(domain, "domain")?;
        let name = match name {
            Some(name) => crate::str_arg(name, "name")?,
            None => ordo::core::ProducerName::DEFAULT.to_owned(),
        };
        let spec = crate::reservation::open_spec(true, &domain, migrations, Some(&name))?;
        let shared = Shared::open(py, spec, at, &domain)?;
        Ok(Producer {
            shared: Arc::new(shared),
            worker: Mutex::new(None),
        })
    }

    /// A write transaction, as a context manager: ``BEGIN`` (``IMMEDIATE``
    /// on SQLite) when it is created, ``COMMIT`` when its ``with`` block
    /// ends, ``ROLLBACK`` when it ends with an exception. Transactions of
    /// other threads wait for it (the GIL released); a second one on the
    /// same thread raises ``ordo.Error``.
    fn transaction(&self, py: Python<'_>) -> PyResult<Transaction> {
        let guard = self.shared.lock(py)?;
        let thread = self.shared.hold();
        let (requests, queue) = mpsc::channel();
        let (done, ended) = mpsc::channel();
        if let Err(e) = self.submit(Box::new(move || run_transaction(guard, queue, done))) {
            self.shared.release(thread);
            return Err(e);
        }
        Ok(Transaction {
            shared: Arc::clone(&self.shared),
            opener: thread,
            open: Mutex::new(Some(Open { requests, ended })),
        })
    }

    /// Runs a read-only query on a connection of its own (never waiting
    /// for a transaction): a list of tuples.
    #[pyo3(signature = (sql, params=None))]
    fn query(
        &self,
        py: Python<'_>,
        sql: &str,
        params: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyList>> {
        let params = sql_params(params)?;
        let rows = self.shared.read(py, sql, &params)?;
        rows_to_py(py, &rows)
    }

    /// The producer's object of ``ordo status --json``, as a dict.
    fn status(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        crate::views::producer_status(py, &self.shared)
    }

    /// Closes the store (waiting for a transaction of another thread).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.shared.close(py)?;
        self.worker.lock().take();
        Ok(())
    }

    /// The domain that owns the store.
    #[getter]
    fn domain(&self) -> &str {
        &self.shared.domain
    }

    /// Where the store lives (a URL's password shown as ``***``).
    #[getter]
    fn location(&self) -> String {
        self.shared.location.to_string()
    }

    /// Whether ``close()`` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.shared.is_closed()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "ordo.Producer({:?}, domain={:?})",
            self.shared.location.to_string(),
            self.shared.domain
        )
    }
}

/// An open transaction's channel to the store's thread.
struct Open {
    requests: Sender<Request>,
    ended: Receiver<Result<(), StoreError>>,
}

/// A producer's write transaction. ``tx.execute(sql, params=())``
/// returns the row count, ``tx.query(sql, params=())`` a list of tuples,
/// ``tx.append(flow_id, type, payload, schema_version=1, headers=None)``
/// the appended ``ordo.Envelope`` (its seq the flow's next, its event id
/// allocated). Everything commits together when the ``with`` block ends,
/// or nothing does.
#[pyclass(module = "ordo", name = "Transaction", frozen)]
pub struct Transaction {
    shared: Arc<Shared<ordo::Producer>>,
    opener: ThreadId,
    open: Mutex<Option<Open>>,
}

impl Transaction {
    /// Sends a request and waits for its answer, the GIL released.
    fn call<T: Send>(
        &self,
        py: Python<'_>,
        request: impl FnOnce(Sender<T>) -> Request,
    ) -> PyResult<T> {
        let requests = match self.open.lock().as_ref() {
            Some(open) => open.requests.clone(),
            None => {
                return Err(error(
                    "the transaction is finished (committed or rolled back)",
                ))
            }
        };
        let (reply, answer) = mpsc::channel();
        requests
            .send(request(reply))
            .map_err(|_| error("the transaction's store thread stopped"))?;
        py.detach(move || answer.recv())
            .map_err(|_| error("the transaction's store thread stopped"))
    }

    /// Ends the transaction: commit or roll back, once.
    fn end(&self, py: Python<'_>, commit: bool) -> PyResult<()> {
        let Some(open) = self.open.lock().take() else {
            return Err(error(
                "the transaction is finished (committed or rolled back)",
            ));
        };
        self.shared.release(self.opener);
        let _ = open.requests.send(Request::End(commit));
        let ended = open.ended;
        match py.detach(move || ended.recv()) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(store_error(e)),
            Err(_) => Err(error(
                "the transaction's store thread stopped; nothing was committed",
            )),
        }
    }
}

impl Drop for Transaction {
    /// A transaction never ended rolls back.
    fn drop(&mut self) {
        if let Some(open) = self.open.get_mut().take() {
            self.shared.release(self.opener);
            let _ = open.requests.send(Request::End(false));
        }
    }
}

#[pymethods]
impl Transaction {
    /// Runs one statement (``?`` placeholders) and returns the number of
    /// rows it changed.
    #[pyo3(signature = (sql, params=None))]
    fn execute(
        &self,
        py: Python<'_>,
        sql: &str,
        params: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        let params = sql_params(params)?;
        let sql = sql.to_owned();
        self.call(py, |reply| Request::Execute(sql, params, reply))?
            .map_err(crate::sql_error)
    }

    /// Runs a query (``?`` placeholders) and returns its rows as a list
    /// of tuples.
    #[pyo3(signature = (sql, params=None))]
    fn query(
        &self,
        py: Python<'_>,
        sql: &str,
        params: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyList>> {
        let params = sql_params(params)?;
        let sql = sql.to_owned();
        let rows = self
            .call(py, |reply| Request::Query(sql, params, reply))?
            .map_err(crate::sql_error)?;
        rows_to_py(py, &rows)
    }

    /// Appends the flow's next event: ``payload`` a dict of JSON values,
    /// ``headers`` a dict of str. Returns the ``ordo.Envelope``; a refusal
    /// (a bad flow id or type, a payload that is no JSON object) writes
    /// nothing and the transaction goes on.
    #[pyo3(signature = (flow_id, r#type, payload, schema_version=None, headers=None))]
    fn append(
        &self,
        py: Python<'_>,
        flow_id: &Bound<'_, PyAny>,
        r#type: &Bound<'_, PyAny>,
        payload: &Bound<'_, PyAny>,
        schema_version: Option<&Bound<'_, PyAny>>,
        headers: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Envelope> {
        let flow_id = crate::str_arg(flow_id, "flow_id")?;
        let flow_id = FlowId::new(flow_id).map_err(|e| rule("flow_id", e))?;
        let event_type = crate::str_arg(r#type, "type")?;
        let payload = json_object(payload, "payload")?;
        let schema_version = match schema_version {
            Some(v) => crate::int_arg(v, "schema_version")?,
            None => 1,
        };
        let schema_version =
            SchemaVersion::new(schema_version).map_err(|e| rule("schema_version", e))?;
        let headers = header_map(headers)?;
        let append = Box::new(Append {
            flow_id,
            event_type,
            schema_version,
            payload,
            headers,
        });
        let event = self
            .call(py, |reply| Request::Append(append, reply))?
            .map_err(append_error)?;
        Envelope::of(py, &event)
    }

    /// Commits now (the ``with`` block then has nothing left to do).
    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        self.end(py, true)
    }

    /// Rolls back now: nothing of the transaction is kept.
    fn rollback(&self, py: Python<'_>) -> PyResult<()> {
        self.end(py, false)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Commits, or rolls back when the block raised; the exception goes
    /// on.
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyType>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if self.open.lock().is_none() {
            return Ok(false);
        }
        self.end(py, exc_type.is_none())?;
        Ok(false)
    }
}

/// Headers: a dict of str to str, or None.
fn header_map(headers: Option<&Bound<'_, PyAny>>) -> PyResult<Headers> {
    let mut map = Headers::new();
    let Some(headers) = headers.filter(|h| !h.is_none()) else {
        return Ok(map);
    };
    let Ok(dict) = headers.cast::<PyDict>() else {
        return Err(PyTypeError::new_err(format!(
            "headers is a dict of str, not {}",
            type_name(headers)
        )));
    };
    for (key, value) in dict.iter() {
        let (Ok(key), Ok(value)) = (key.extract::<String>(), value.extract::<String>()) else {
            return Err(PyTypeError::new_err("headers is a dict of str to str"));
        };
        map.insert(key, value);
    }
    Ok(map)
}
