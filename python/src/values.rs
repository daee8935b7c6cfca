//! The plain values a Python caller sees: `ordo.Envelope`, `ordo.Block`,
//! `ordo.APPLY`, and the reports of relay and apply.

use ordo::core::{BlockCode, Envelope as CoreEnvelope};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::convert::{json_to_py, map_to_py};
use crate::errors::rule;

/// One event: `event_id`, `flow_id`, `seq`, `schema_version`, `type`,
/// `payload` (a dict), `producer`, `headers` (a dict of str).
#[pyclass(module = "ordo", name = "Envelope", frozen, get_all)]
pub struct Envelope {
    /// The event's identity.
    pub event_id: String,
    /// Its flow.
    pub flow_id: String,
    /// Its position in the flow, from 1.
    pub seq: i64,
    /// How the payload is to be read.
    pub schema_version: i64,
    /// The event type.
    #[pyo3(name = "type")]
    pub event_type: String,
    /// The payload.
    pub payload: Py<PyDict>,
    /// The producer store that appended it.
    pub producer: String,
    /// The event's headers.
    pub headers: Py<PyDict>,
}

impl Envelope {
    /// The Python view of an envelope.
    pub fn of(py: Python<'_>, e: &CoreEnvelope) -> PyResult<Envelope> {
        let headers = PyDict::new(py);
        for (k, v) in &e.headers {
            headers.set_item(k, v)?;
        }
        Ok(Envelope {
            event_id: e.event_id.as_str().to_owned(),
            flow_id: e.flow_id.as_str().to_owned(),
            seq: e.seq.get(),
            schema_version: e.schema_version.get(),
            event_type: e.event_type.as_str().to_owned(),
            payload: map_to_py(py, &e.payload)?,
            producer: e.producer.as_str().to_owned(),
            headers: headers.unbind(),
        })
    }
}

#[pymethods]
impl Envelope {
    fn __repr__(&self) -> String {
        format!(
            "ordo.Envelope(event_id={:?}, flow_id={:?}, seq={}, type={:?}, producer={:?})",
            self.event_id, self.flow_id, self.seq, self.event_type, self.producer
        )
    }
}

/// A handler's verdict that blocks the event: `code` is `[a-z0-9_]{1,64}`
/// (else `ordo.InvalidInput`, when it is constructed), `detail` free text
/// for the operator.
#[pyclass(module = "ordo", name = "Block", frozen)]
pub struct Block {
    pub(crate) code: BlockCode,
    /// Text for the operator.
    #[pyo3(get)]
    pub detail: Option<String>,
}

#[pymethods]
impl Block {
    #[new]
    #[pyo3(signature = (code, detail=None))]
    fn new(code: &str, detail: Option<String>) -> PyResult<Block> {
        let code = BlockCode::new(code).map_err(|e| rule("block code", e))?;
        Ok(Block { code, detail })
    }

    /// The block code.
    #[getter]
    fn code(&self) -> &str {
        self.code.as_str()
    }

    fn __repr__(&self) -> String {
        match &self.detail {
            Some(detail) => format!("ordo.Block({:?}, {:?})", self.code.as_str(), detail),
            None => format!("ordo.Block({:?})", self.code.as_str()),
        }
    }
}

/// The verdict that applies the event (returning `None` does the same):
/// the one instance is `ordo.APPLY`.
#[pyclass(module = "ordo", name = "ApplyVerdict", frozen)]
pub struct ApplyVerdict;

#[pymethods]
impl ApplyVerdict {
    fn __repr__(&self) -> &'static str {
        "ordo.APPLY"
    }
}

/// What a run did, with the command line's JSON keys as attributes, and
/// `to_dict()`.
#[pyclass(module = "ordo", name = "Report", frozen)]
pub struct Report {
    fields: Py<PyDict>,
}

impl Report {
    /// A report of the JSON object `value`.
    pub fn of(py: Python<'_>, value: &serde_json::Value) -> PyResult<Report> {
        let fields = json_to_py(py, value)?
            .into_bound(py)
            .cast_into::<PyDict>()?;
        Ok(Report {
            fields: fields.unbind(),
        })
    }
}

#[pymethods]
impl Report {
    /// The report as a dict (a copy).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let copy = py.import("copy")?.getattr("deepcopy")?;
        Ok(copy.call1((self.fields.bind(py),))?.cast_into::<PyDict>()?)
    }

    fn __getattr__<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        match self.fields.bind(py).get_item(name)? {
            Some(value) => Ok(value),
            None => Err(pyo3::exceptions::PyAttributeError::new_err(format!(
                "the report has no {name:?}"
            ))),
        }
    }

    fn __dir__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let keys = self.fields.bind(py).keys();
        keys.append("to_dict")?;
        Ok(keys)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("ordo.Report({})", self.fields.bind(py).repr()?))
    }
}
