//! The exception classes of PYTHON.md "Errors", and the mapping of ordo's
//! error kinds onto them.
//!
//! `ordo.Error` > `InvalidInput` (also a `ValueError`), `WrongDomain`,
//! `StorageError` > `Busy`, `CommitOutcomeUnknown`; `HandlerError`. The
//! effect outcomes `Retry`, `Failed` and `Unknown` are exceptions of their
//! own, not `ordo.Error`s.

use ordo::core::{AppendError, ErrorKind, RuleViolation, StoreError};
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

pyo3::create_exception!(
    ordo,
    Error,
    PyException,
    "The base of every error ordo raises (but not the effect outcomes)."
);
pyo3::create_exception!(
    ordo,
    WrongDomain,
    Error,
    "The store belongs to another domain; nothing was changed."
);
pyo3::create_exception!(
    ordo,
    StorageError,
    Error,
    "The store failed (the disk, the file, the connection, the server)."
);
pyo3::create_exception!(
    ordo,
    Busy,
    StorageError,
    "Another writer held the store's lock past the busy timeout; retrying may succeed."
);
pyo3::create_exception!(
    ordo,
    CommitOutcomeUnknown,
    StorageError,
    "A commit was sent, but whether it took effect is unknown."
);
pyo3::create_exception!(
    ordo,
    HandlerError,
    Error,
    "The apply handler raised: the apply was rolled back and nothing was marked; the handler's exception is the __cause__."
);
pyo3::create_exception!(
    ordo,
    Retry,
    PyException,
    "An effect outcome: not done, try again later."
);
pyo3::create_exception!(
    ordo,
    Failed,
    PyException,
    "An effect outcome: failed for good."
);
pyo3::create_exception!(
    ordo,
    Unknown,
    PyException,
    "An effect outcome: whether it took effect cannot be told."
);

/// `ordo.InvalidInput`, built at import: a subclass of both `ordo.Error`
/// and `ValueError`, which `create_exception!` cannot declare.
static INVALID_INPUT: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// Creates `ordo.InvalidInput` (once) and returns it.
pub fn invalid_input_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    INVALID_INPUT
        .get_or_try_init(py, || {
            let bases = PyTuple::new(
                py,
                [py.get_type::<Error>().into_any(), py.get_type::<PyValueError>().into_any()],
            )?;
            let namespace = PyDict::new(py);
            namespace.set_item(
                "__doc__",
                "What was given is not valid (a name, a code, a number out of range, a payload that is not JSON); nothing was done.",
            )?;
            namespace.set_item("__module__", "ordo")?;
            let class = py
                .get_type::<PyType>()
                .call1(("InvalidInput", bases, namespace))?;
            Ok(class.cast_into::<PyType>()?.unbind())
        })
        .map(|class| class.bind(py))
}

/// An `ordo.InvalidInput` with `message`.
pub fn invalid(message: impl Into<String>) -> PyErr {
    let message: String = message.into();
    Python::attach(|py| match invalid_input_type(py) {
        Ok(class) => PyErr::from_type(class.clone(), message),
        Err(e) => e,
    })
}

/// An `ordo.Error` with `message`.
pub fn error(message: impl Into<String>) -> PyErr {
    Error::new_err(message.into())
}

/// The exception for a store error, by its kind.
pub fn store_error(e: StoreError) -> PyErr {
    let message = e.to_string();
    match e.kind() {
        ErrorKind::Busy => Busy::new_err(message),
        ErrorKind::CommitOutcomeUnknown => CommitOutcomeUnknown::new_err(message),
        ErrorKind::InvalidInput => invalid(message),
        // The backends refuse another domain's store as incompatible; the
        // message is the only thing that tells it from a foreign file.
        ErrorKind::Incompatible if message.contains("belongs to domain") => {
            WrongDomain::new_err(message)
        }
        _ => StorageError::new_err(message),
    }
}

/// The exception for a refused or failed append.
pub fn append_error(e: AppendError) -> PyErr {
    match e {
        AppendError::Invalid(message) => invalid(message),
        AppendError::Store(e) => store_error(e),
        other => error(other.to_string()),
    }
}

/// A value breaking one of ordo's rules, as `ordo.InvalidInput` naming
/// what it was.
pub fn rule(what: &str, e: RuleViolation) -> PyErr {
    invalid(format!("{what}: {e}"))
}
