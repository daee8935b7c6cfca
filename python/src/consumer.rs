//! `ordo.Consumer` and its apply with a Python handler.
//!
//! The apply runs on the calling thread, the GIL released, and takes the
//! GIL back for each handler call: the handler runs with the GIL held, in
//! the caller's thread (its thread-locals, its signals), inside the apply
//! transaction, through a `tx` object valid for that call only.
//!
//! Invariant: a handler's exception rolls the batch in progress back and
//! marks nothing; an `Exception` comes out as `ordo.HandlerError` (its
//! `__cause__` the original), any other `BaseException` unchanged.

use std::sync::Arc;
use std::thread::ThreadId;

use ordo::core::{
    ApplyContext, ApplyHandler, Drain, Envelope as CoreEnvelope, ErrorKind, InboxFlow, StoreError,
    Verdict,
};
use parking_lot::Mutex;
use pyo3::exceptions::{PyException, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use serde_json::Value;

use crate::convert::{json_object, rows_to_py, sql_params, type_name};
use crate::errors::{error, store_error, HandlerError};
use crate::sql::TxSql;
use crate::store::Shared;
use crate::values::{ApplyVerdict, Block, Envelope, Report};

/// What a handler call reaches of the apply transaction, whatever the
/// backend.
trait HandlerCtx {
    fn sql(&self) -> &dyn TxSql;
    fn record_effect(&mut self, name: &str, request: &Value) -> Result<String, StoreError>;
}

impl<T: TxSql> HandlerCtx for ApplyContext<'_, T> {
    fn sql(&self) -> &dyn TxSql {
        self.tx()
    }

    fn record_effect(&mut self, name: &str, request: &Value) -> Result<String, StoreError> {
        self.effect(name, request)
            .map(|key| key.as_str().to_owned())
    }
}

/// The apply context of the call in progress, valid while the handler
/// runs (the pointer is taken back before the call returns to ordo).
struct CtxPtr(*mut (dyn HandlerCtx + 'static));

// SAFETY: the pointer is only dereferenced on the thread that runs the
// apply (checked), while that thread is inside the handler call, under
// the `ApplyTx` mutex; it is cleared before the context goes away.
unsafe impl Send for CtxPtr {}

/// The apply transaction as the handler sees it: ``tx.execute(sql,
/// params=())``, ``tx.query(sql, params=())``, ``tx.effect(name,
/// request)``. Valid during the handler call only, on its thread.
#[pyclass(module = "ordo", name = "ApplyTransaction", frozen)]
pub struct ApplyTx {
    ctx: Mutex<Option<CtxPtr>>,
    thread: ThreadId,
}

impl ApplyTx {
    /// Runs `f` on the context, if this is the handler's thread and its
    /// call is in progress.
    fn with<T>(&self, f: impl FnOnce(&mut dyn HandlerCtx) -> PyResult<T>) -> PyResult<T> {
        if std::thread::current().id() != self.thread {
            return Err(error(
                "an apply transaction is used only on the thread that runs the handler",
            ));
        }
        let mut ctx = self.ctx.lock();
        match ctx.as_mut() {
            // SAFETY: see `CtxPtr`: set by `PyHandler::call` from a live
            // `&mut ApplyContext` for the length of the handler call.
            Some(ptr) => f(unsafe { &mut *ptr.0 }),
            None => Err(error(
                "the apply transaction is finished: the handler call it was given to has returned",
            )),
        }
    }
}

#[pymethods]
impl ApplyTx {
    /// Runs one statement (``?`` placeholders) in the apply transaction
    /// and returns the number of rows it changed.
    #[pyo3(signature = (sql, params=None))]
    fn execute(&self, sql: &str, params: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
        let params = sql_params(params)?;
        self.with(|ctx| ctx.sql().exec(sql, &params).map_err(crate::sql_error))
    }

    /// Runs a query (``?`` placeholders) in the apply transaction: a list
    /// of tuples.
    #[pyo3(signature = (sql, params=None))]
    fn query(
        &self,
        py: Python<'_>,
        sql: &str,
        params: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyList>> {
        let params = sql_params(params)?;
        let rows = self.with(|ctx| ctx.sql().rows(sql, &params).map_err(crate::sql_error))?;
        rows_to_py(py, &rows)
    }

    /// Records the effect intent ``name`` (``[a-z][a-z0-9_]{0,63}``) with
    /// ``request`` (a dict of JSON values) for the event being applied; it
    /// commits with the apply, or not at all. Returns its key.
    fn effect(&self, name: &Bound<'_, PyAny>, request: &Bound<'_, PyAny>) -> PyResult<String> {
        let name = crate::str_arg(name, "name")?;
        let request = Value::Object(json_object(request, "request")?);
        self.with(|ctx| ctx.record_effect(&name, &request).map_err(store_error))
    }
}

/// The Python handler as ordo's, for either backend's transactions.
pub(crate) struct PyHandler {
    pub(crate) func: Py<PyAny>,
    /// What the handler raised (or a signal between pages): the apply
    /// stops, and this is raised from `apply()`.
    pub(crate) failure: Option<PyErr>,
}

/// The error the handler's failure is carried out of ordo's apply with.
fn stopped() -> StoreError {
    StoreError::new(ErrorKind::Other, "the apply handler raised")
}

impl PyHandler {
    fn call(
        &mut self,
        py: Python<'_>,
        cx: &mut dyn HandlerCtx,
        event: &CoreEnvelope,
    ) -> Result<Verdict, StoreError> {
        let verdict = (|| -> PyResult<Verdict> {
            let event = Py::new(py, Envelope::of(py, event)?)?;
            let ptr: *mut (dyn HandlerCtx + '_) = cx;
            // SAFETY: only the lifetime is erased; the pointer is cleared
            // below, before `cx` can go away.
            let ptr: *mut (dyn HandlerCtx + 'static) = unsafe { std::mem::transmute(ptr) };
            let tx = Py::new(
                py,
                ApplyTx {
                    ctx: Mutex::new(Some(CtxPtr(ptr))),
                    thread: std::thread::current().id(),
                },
            )?;
            let returned = self.func.call1(py, (tx.clone_ref(py), event));
            tx.get().ctx.lock().take();
            verdict_of(py, returned?)
        })();
        verdict.map_err(|e| {
            self.failure = Some(e);
            stopped()
        })
    }
}

/// The handler's return value as a verdict.
fn verdict_of(py: Python<'_>, returned: Py<PyAny>) -> PyResult<Verdict> {
    let returned = returned.bind(py);
    if returned.is_none() || returned.is_instance_of::<ApplyVerdict>() {
        return Ok(Verdict::Apply);
    }
    if let Ok(block) = returned.cast::<Block>() {
        let block = block.get();
        return Ok(match &block.detail {
            Some(detail) => Verdict::block_with(block.code, detail.clone()),
            None => Verdict::block(block.code),
        });
    }
    Err(PyTypeError::new_err(format!(
        "the handler returned {}: it returns None, ordo.APPLY or an ordo.Block",
        type_name(returned)
    )))
}

impl<T: TxSql> ApplyHandler<T> for PyHandler {
    fn apply(
        &mut self,
        cx: &mut ApplyContext<'_, T>,
        event: &CoreEnvelope,
    ) -> Result<Verdict, StoreError> {
        if self.failure.is_some() {
            return Err(stopped());
        }
        Python::attach(|py| self.call(py, cx, event))
    }
}

/// The number of events applied per transaction by default.
const BATCH_DEFAULT: u64 = ordo::core::store::APPLY_BATCH_LEN_DEFAULT;

/// Drains every flow with work, a page of flows at a time, checking for
/// signals between pages.
fn drain_all(
    consumer: &mut ordo::Consumer,
    handler: &mut PyHandler,
    batch: u64,
    drains: &mut Vec<Drain>,
) -> Result<(), StoreError> {
    let mut after: Option<InboxFlow> = None;
    loop {
        let each = |d: Drain| drains.push(d);
        let last = match consumer {
            ordo::Consumer::Sqlite(db) => {
                ordo::core::store::process_page(db, after.as_ref(), None, handler, batch, each)?
            }
            ordo::Consumer::Postgres(db) => {
                ordo::core::store::process_page(db, after.as_ref(), None, handler, batch, each)?
            }
        };
        let Some(last) = last else {
            return Ok(());
        };
        after = Some(last);
        if let Err(e) = Python::attach(|py| py.check_signals()) {
            handler.failure = Some(e);
            return Ok(());
        }
    }
}

/// The apply report: the command line's `apply --json` object.
fn drains_value(drains: &[Drain]) -> Value {
    ordo::core::report::drains(drains, drains.len() as u64, false)
}

/// A consumer store: the inbox beside the application's tables, in an
/// SQLite file or a PostgreSQL database.
///
/// ``Consumer.open(location, domain, migrations=())`` creates or opens
/// it; ``consumer.apply(handler)`` applies what was received;
/// ``consumer.query`` reads. A context manager: leaving the block closes
/// it.
#[pyclass(module = "ordo", name = "Consumer", frozen)]
pub struct Consumer {
    pub(crate) shared: Arc<Shared<ordo::Consumer>>,
}

#[pymethods]
impl Consumer {
    /// Creates or opens the consumer store at ``location`` (a path or a
    /// ``postgres://`` URL) for ``domain``, running the domain's
    /// ``migrations`` once each. Another domain's store is refused
    /// (``ordo.WrongDomain``).
    #[staticmethod]
    #[pyo3(signature = (location, domain, migrations=None))]
    fn open(
        py: Python<'_>,
        location: &Bound<'_, PyAny>,
        domain: &Bound<'_, PyAny>,
        migrations: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Consumer> {
        let at = crate::store::location(location)?;
        let domain = crate::str_arg(domain, "domain")?;
        let spec = crate::reservation::open_spec(false, &domain, migrations, None)?;
        let shared = Shared::open(py, spec, at, &domain)?;
        Ok(Consumer {
            shared: Arc::new(shared),
        })
    }

    /// Applies every flow's received events once, in seq order, through
    /// ``handler(tx, event)``, called inside the apply transaction with
    /// the GIL held. It returns ``None`` or ``ordo.APPLY`` to apply, or
    /// ``ordo.Block(code, detail)`` to block the event (its flow stops
    /// there). An exception rolls the batch in progress back and is
    /// raised as ``ordo.HandlerError`` (the original as ``__cause__``);
    /// ``KeyboardInterrupt`` and other ``BaseException``\ s come out
    /// unchanged. Returns a report with the keys of ``ordo apply --json``.
    #[pyo3(signature = (handler, batch=BATCH_DEFAULT))]
    fn apply(&self, py: Python<'_>, handler: &Bound<'_, PyAny>, batch: u64) -> PyResult<Report> {
        if !handler.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "handler is a callable handler(tx, event), not {}",
                type_name(handler)
            )));
        }
        let mut guard = self.shared.lock(py)?;
        let thread = self.shared.hold();
        let mut handler = PyHandler {
            func: handler.clone().unbind(),
            failure: None,
        };
        let mut drains = Vec::new();
        let ran = py.detach(|| match guard.as_mut() {
            Some(consumer) => drain_all(consumer, &mut handler, batch.max(1), &mut drains),
            None => Err(StoreError::new(ErrorKind::Other, "the store was closed")),
        });
        drop(guard);
        self.shared.release(thread);
        if let Some(failure) = handler.failure.take() {
            return Err(handler_failure(py, failure));
        }
        ran.map_err(store_error)?;
        Report::of(py, &drains_value(&drains))
    }

    /// Runs a read-only query on a connection of its own (never waiting
    /// for an apply): a list of tuples.
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

    /// The consumer's object of ``ordo status --json``, as a dict.
    fn status(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        crate::views::consumer_status(py, &self.shared)
    }

    /// The inbox rows as ``ordo inbox list --json`` lists them, by flow
    /// then seq: only those of ``status`` (``"pending"``, ``"applied"``,
    /// ``"blocked"``, ``"skipped"``) when given, at most ``limit``.
    #[pyo3(signature = (status=None, limit=crate::views::LIST_LIMIT_DEFAULT))]
    fn inbox(&self, py: Python<'_>, status: Option<&str>, limit: usize) -> PyResult<Py<PyAny>> {
        crate::views::inbox(py, &self.shared, status, limit)
    }

    /// The effect intents as ``ordo effects list --json`` lists them, by
    /// flow and seq: only those in ``state`` and of ``name`` when given,
    /// at most ``limit``.
    #[pyo3(signature = (state=None, name=None, limit=crate::views::LIST_LIMIT_DEFAULT))]
    fn effects(
        &self,
        py: Python<'_>,
        state: Option<&str>,
        name: Option<&str>,
        limit: usize,
    ) -> PyResult<Py<PyAny>> {
        crate::views::effects(py, &self.shared, state, name, limit)
    }

    /// Closes the store (waiting for an apply of another thread).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.shared.close(py)
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
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "ordo.Consumer({:?}, domain={:?})",
            self.shared.location.to_string(),
            self.shared.domain
        )
    }
}

/// A handler's exception as `apply()` raises it.
pub(crate) fn handler_failure(py: Python<'_>, failure: PyErr) -> PyErr {
    if !failure.is_instance_of::<PyException>(py) {
        return failure;
    }
    let wrapped = HandlerError::new_err(format!("the apply handler raised: {failure}"));
    wrapped.set_cause(py, Some(failure));
    wrapped
}
