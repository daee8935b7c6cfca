//! Python values to and from SQL parameters, rows and JSON.
//!
//! Invariant: every conversion is checked before anything is sent to a
//! store: a wrong type is a `TypeError`, an integer outside
//! -2^63..2^64-1 (SQL: -2^63..2^63-1) or a NaN or infinite float is
//! `ordo.InvalidInput`, so bad input writes nothing.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple,
};
use serde_json::{Map, Number, Value};

use crate::errors::invalid;

/// How deep a payload may nest (a guard against recursion, far above any
/// real payload).
const JSON_DEPTH_MAX: usize = 128;

/// One SQL value, of either backend.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    /// NULL.
    Null,
    /// A boolean (SQLite stores it as 0 or 1).
    Bool(bool),
    /// A 64-bit integer.
    Integer(i64),
    /// A finite float.
    Real(f64),
    /// Text.
    Text(String),
    /// Bytes.
    Blob(Vec<u8>),
    /// A JSON value (PostgreSQL's `json`/`jsonb` columns).
    Json(Value),
}

/// A Python integer as an `i64`, or `ordo.InvalidInput`.
fn int_i64(value: &Bound<'_, PyAny>) -> PyResult<i64> {
    value
        .extract::<i64>()
        .map_err(|_| invalid(format!("integer {value} is outside -2^63..2^63-1")))
}

/// A Python float, finite, or `ordo.InvalidInput`.
fn finite(value: &Bound<'_, PyAny>) -> PyResult<f64> {
    let x: f64 = value.extract()?;
    if !x.is_finite() {
        return Err(invalid(format!("{x} is not a finite number")));
    }
    Ok(x)
}

/// One SQL parameter from Python: `None`, `bool`, `int`, `float`, `str`,
/// `bytes`.
pub fn sql_param(value: &Bound<'_, PyAny>) -> PyResult<SqlValue> {
    if value.is_none() {
        Ok(SqlValue::Null)
    } else if value.is_instance_of::<PyBool>() {
        Ok(SqlValue::Bool(value.extract()?))
    } else if value.is_instance_of::<PyInt>() {
        Ok(SqlValue::Integer(int_i64(value)?))
    } else if value.is_instance_of::<PyFloat>() {
        Ok(SqlValue::Real(finite(value)?))
    } else if value.is_instance_of::<PyString>() {
        Ok(SqlValue::Text(value.extract()?))
    } else if value.is_instance_of::<PyBytes>() || value.is_instance_of::<PyByteArray>() {
        Ok(SqlValue::Blob(value.extract()?))
    } else {
        Err(PyTypeError::new_err(format!(
            "an SQL parameter is None, bool, int, float, str or bytes, not {}",
            type_name(value)
        )))
    }
}

/// The parameters of a statement: a tuple or a list.
pub fn sql_params(params: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<SqlValue>> {
    let Some(params) = params else {
        return Ok(Vec::new());
    };
    if let Ok(tuple) = params.cast::<PyTuple>() {
        return tuple.iter().map(|v| sql_param(&v)).collect();
    }
    if let Ok(list) = params.cast::<PyList>() {
        return list.iter().map(|v| sql_param(&v)).collect();
    }
    Err(PyTypeError::new_err(format!(
        "params is a tuple or a list, not {}",
        type_name(params)
    )))
}

/// A value read from a row, as Python.
pub fn sql_to_py(py: Python<'_>, value: &SqlValue) -> PyResult<Py<PyAny>> {
    Ok(match value {
        SqlValue::Null => py.None(),
        SqlValue::Bool(b) => PyBool::new(py, *b).to_owned().into_any().unbind(),
        SqlValue::Integer(i) => i.into_pyobject(py)?.into_any().unbind(),
        SqlValue::Real(x) => x.into_pyobject(py)?.into_any().unbind(),
        SqlValue::Text(s) => PyString::new(py, s).into_any().unbind(),
        SqlValue::Blob(b) => PyBytes::new(py, b).into_any().unbind(),
        SqlValue::Json(v) => json_to_py(py, v)?,
    })
}

/// Rows as a list of tuples.
pub fn rows_to_py(py: Python<'_>, rows: &[Vec<SqlValue>]) -> PyResult<Py<PyList>> {
    let list = PyList::empty(py);
    for row in rows {
        let values = row
            .iter()
            .map(|v| sql_to_py(py, v))
            .collect::<PyResult<Vec<_>>>()?;
        list.append(PyTuple::new(py, values)?)?;
    }
    Ok(list.unbind())
}

/// The name of a value's type, for messages.
pub fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A payload or request: a dict with str keys, of JSON values.
pub fn json_object(value: &Bound<'_, PyAny>, what: &str) -> PyResult<Map<String, Value>> {
    let Ok(dict) = value.cast::<PyDict>() else {
        return Err(PyTypeError::new_err(format!(
            "{what} is a dict, not {}",
            type_name(value)
        )));
    };
    dict_to_json(dict, what, 0)
}

fn dict_to_json(
    dict: &Bound<'_, PyDict>,
    what: &str,
    depth: usize,
) -> PyResult<Map<String, Value>> {
    let mut map = Map::new();
    for (key, value) in dict.iter() {
        let Ok(key) = key.extract::<String>() else {
            return Err(PyTypeError::new_err(format!(
                "{what}: a JSON object's keys are str, not {}",
                type_name(&key)
            )));
        };
        let value = py_to_json(&value, what, depth + 1)?;
        map.insert(key, value);
    }
    Ok(map)
}

/// Any JSON value from Python: dict, list, tuple, str, int, float, bool,
/// None.
pub fn py_to_json(value: &Bound<'_, PyAny>, what: &str, depth: usize) -> PyResult<Value> {
    if depth > JSON_DEPTH_MAX {
        return Err(invalid(format!(
            "{what} nests deeper than {JSON_DEPTH_MAX} levels"
        )));
    }
    if value.is_none() {
        Ok(Value::Null)
    } else if value.is_instance_of::<PyBool>() {
        Ok(Value::Bool(value.extract()?))
    } else if value.is_instance_of::<PyInt>() {
        if let Ok(i) = value.extract::<i64>() {
            Ok(Value::from(i))
        } else if let Ok(u) = value.extract::<u64>() {
            Ok(Value::from(u))
        } else {
            Err(invalid(format!(
                "{what}: integer {value} is outside -2^63..2^64-1"
            )))
        }
    } else if value.is_instance_of::<PyFloat>() {
        let x: f64 = value.extract()?;
        Number::from_f64(x).map(Value::Number).ok_or_else(|| {
            invalid(format!(
                "{what}: {x} is not a finite number (JSON has none)"
            ))
        })
    } else if value.is_instance_of::<PyString>() {
        Ok(Value::String(value.extract()?))
    } else if let Ok(dict) = value.cast::<PyDict>() {
        Ok(Value::Object(dict_to_json(dict, what, depth)?))
    } else if let Ok(list) = value.cast::<PyList>() {
        list.iter()
            .map(|v| py_to_json(&v, what, depth + 1))
            .collect::<PyResult<Vec<_>>>()
            .map(Value::Array)
    } else if let Ok(tuple) = value.cast::<PyTuple>() {
        tuple
            .iter()
            .map(|v| py_to_json(&v, what, depth + 1))
            .collect::<PyResult<Vec<_>>>()
            .map(Value::Array)
    } else {
        Err(PyTypeError::new_err(format!(
            "{what}: {} is not JSON-serialisable",
            type_name(value)
        )))
    }
}

/// A JSON value as Python (objects as dicts, arrays as lists).
pub fn json_to_py(py: Python<'_>, value: &Value) -> PyResult<Py<PyAny>> {
    Ok(match value {
        Value::Null => py.None(),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any().unbind(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any().unbind()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any().unbind()
            } else {
                n.as_f64()
                    .unwrap_or(f64::NAN)
                    .into_pyobject(py)?
                    .into_any()
                    .unbind()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any().unbind(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(json_to_py(py, item)?)?;
            }
            list.into_any().unbind()
        }
        Value::Object(map) => map_to_py(py, map)?.into_any(),
    })
}

/// A JSON object as a dict.
pub fn map_to_py(py: Python<'_>, map: &Map<String, Value>) -> PyResult<Py<PyDict>> {
    let dict = PyDict::new(py);
    for (key, value) in map {
        dict.set_item(key, json_to_py(py, value)?)?;
    }
    Ok(dict.unbind())
}
