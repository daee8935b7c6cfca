//! # ordo for Python
//!
//! The native module `ordo._ordo`, re-exported by the package `ordo`:
//! producer and consumer stores on SQLite files and PostgreSQL URLs,
//! transactions as context managers, apply with a Python handler, relay in
//! process, and the exceptions of PYTHON.md.
//!
//! Invariant: every `#[pyclass]` is `Send + Sync` (stores behind owned
//! locks, never borrowed guards), and the GIL is released wherever ordo
//! waits: for a lock, a commit, a thread, the network.

mod consumer;
mod convert;
mod errors;
mod producer;
mod sql;
mod store;
mod values;

use ordo::core::{RelayError, RelayOptions, SystemClock};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use serde_json::{json, Value};

use crate::convert::type_name;
use crate::errors::{error, store_error};
use crate::sql::SqlFail;

/// A str argument, or `TypeError` naming it.
pub(crate) fn str_arg(value: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    value
        .extract::<String>()
        .map_err(|_| PyTypeError::new_err(format!("{what} is a str, not {}", type_name(value))))
}

/// An int argument (not a bool), or `TypeError` naming it; out of range
/// is `ordo.InvalidInput`.
pub(crate) fn int_arg(value: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
    if !value.is_instance_of::<pyo3::types::PyInt>()
        || value.is_instance_of::<pyo3::types::PyBool>()
    {
        return Err(PyTypeError::new_err(format!(
            "{what} is an int, not {}",
            type_name(value)
        )));
    }
    value
        .extract::<i64>()
        .map_err(|_| errors::invalid(format!("{what}: {value} is outside -2^63..2^63-1")))
}

/// A failed statement as Python: the store's failure by its kind, a
/// refused statement as `ordo.Error`.
pub(crate) fn sql_error(e: SqlFail) -> PyErr {
    match e {
        SqlFail::Store(e) => store_error(e),
        SqlFail::Statement(message) => error(message),
    }
}

/// The relay report: the command line's `relay --json` object.
fn relay_value(report: &ordo::core::RelayReport) -> Value {
    let deliveries: Vec<Value> = report
        .deliveries
        .iter()
        .map(|d| {
            let mut delivery = json!({
                "event_id": d.event_id.as_str(),
                "flow_id": d.flow_id.as_str(),
                "seq": d.seq.get(),
                "receipt": d.receipt.as_str(),
            });
            if let Some(cause) = d.receipt.cause() {
                delivery["cause"] = json!(cause);
            }
            delivery
        })
        .collect();
    let refused: Vec<Value> = report
        .refusals
        .iter()
        .map(|r| {
            json!({
                "event_id": r.event_id.as_str(),
                "flow_id": r.flow_id.as_str(),
                "seq": r.seq.get(),
                "reason": r.reason.as_str(),
                "detail": r.message,
            })
        })
        .collect();
    json!({
        "deliveries": deliveries,
        "stop": report.stop.as_str(),
        "deliveries_total": report.deliveries.len(),
        "truncated": false,
        "refused": refused,
        "refused_total": report.refusals.len(),
        "transient_errors": report.transient_errors,
    })
}

/// Relays ``producer``'s outbox to ``consumer`` in this process until
/// nothing more can be delivered, as ``ordo relay`` does; returns a report
/// with the keys of ``ordo relay --json``. The GIL is released throughout.
#[pyfunction]
fn relay(
    py: Python<'_>,
    producer: &Bound<'_, producer::Producer>,
    consumer: &Bound<'_, consumer::Consumer>,
) -> PyResult<values::Report> {
    let (producer, consumer) = (producer.get(), consumer.get());
    let mut from = producer.shared.lock(py)?;
    let mut to = consumer.shared.lock(py)?;
    let report = py.detach(|| -> Result<_, RelayError> {
        match (from.as_mut(), to.as_mut()) {
            (Some(p), Some(c)) => {
                ordo::core::relay(p.handle(), c, &RelayOptions::default(), &SystemClock)
            }
            _ => Err(RelayError::Store(ordo::core::StoreError::new(
                ordo::core::ErrorKind::Other,
                "a store was closed",
            ))),
        }
    });
    drop((from, to));
    let report = report.map_err(|e| match e {
        RelayError::Store(e) => store_error(e),
        other => error(other.to_string()),
    })?;
    values::Report::of(py, &relay_value(&report))
}

/// The native part of the `ordo` package.
#[pymodule]
fn _ordo(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<producer::Producer>()?;
    m.add_class::<producer::Transaction>()?;
    m.add_class::<consumer::Consumer>()?;
    m.add_class::<consumer::ApplyTx>()?;
    m.add_class::<values::Envelope>()?;
    m.add_class::<values::Block>()?;
    m.add_class::<values::ApplyVerdict>()?;
    m.add_class::<values::Report>()?;
    m.add("APPLY", Py::new(py, values::ApplyVerdict)?)?;
    m.add_function(wrap_pyfunction!(relay, m)?)?;
    m.add("Error", py.get_type::<errors::Error>())?;
    m.add("InvalidInput", errors::invalid_input_type(py)?)?;
    m.add("WrongDomain", py.get_type::<errors::WrongDomain>())?;
    m.add("StorageError", py.get_type::<errors::StorageError>())?;
    m.add("Busy", py.get_type::<errors::Busy>())?;
    m.add(
        "CommitOutcomeUnknown",
        py.get_type::<errors::CommitOutcomeUnknown>(),
    )?;
    m.add("HandlerError", py.get_type::<errors::HandlerError>())?;
    m.add("Retry", py.get_type::<errors::Retry>())?;
    m.add("Failed", py.get_type::<errors::Failed>())?;
    m.add("Unknown", py.get_type::<errors::Unknown>())?;
    Ok(())
}
