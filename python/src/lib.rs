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
mod effects;
mod errors;
mod http;
mod producer;
mod reservation;
mod runner;
mod sql;
mod store;
mod values;
mod views;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use serde_json::Value;

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
pub(crate) fn relay_value(report: &ordo::core::RelayReport) -> Value {
    let totals = ordo::core::report::RelayTotals {
        deliveries: report.deliveries.len() as u64,
        refused: report.refusals.len() as u64,
        truncated: false,
        transient_errors: report.transient_errors,
    };
    ordo::core::report::relay(&report.deliveries, &report.refusals, report.stop, totals)
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
    m.add_function(wrap_pyfunction!(http::relay, m)?)?;
    m.add_class::<runner::Runner>()?;
    m.add_class::<effects::Effect>()?;
    m.add_class::<effects::EffectPolicy>()?;
    m.add_submodule(&reservation::module(py)?)?;
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
    effects::install_outcomes(m)?;
    Ok(())
}
