//! External effects from Python (EFFECTS.md): `ordo.Effect`, the intent
//! an effect function is called with; `ordo.EffectPolicy`; the outcome
//! exceptions' constructors (`ordo.Retry(reason, after_s=None)`,
//! `ordo.Failed(reason)`, `ordo.Unknown(reason)`); and the executor built
//! from a dict of effect functions, reconcile hooks and policies, which
//! the runner's effects loop runs.
//!
//! Invariant: an effect function or a reconcile hook runs with the GIL
//! held, on the effects loop's thread; what it answers is mapped onto
//! ordo's answers, and nothing it raises escapes: an exception that is
//! not an outcome counts as `Unknown` (a hook's as "cannot tell").

use std::sync::Arc;

use ordo::core::effect::{Answer, EffectPolicy as CorePolicy, Reconciled};
use ordo::core::SystemClock;
use ordo::runtime::{Effect as CoreEffect, Executor};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyModule};
use serde_json::Value;

use crate::convert::{json_to_py, py_to_json, type_name};
use crate::errors::{invalid, rule, Failed, Retry, Unknown};

/// One effect intent as an effect function sees it: ``key`` (its
/// idempotency key: send it to a provider that deduplicates), ``name``,
/// ``request`` (the frozen request, a dict), ``attempt`` (1 for the
/// first), and the event that recorded it: ``producer``, ``flow_id``,
/// ``seq``.
#[pyclass(module = "ordo", name = "Effect", frozen, get_all)]
pub struct Effect {
    /// The idempotency key.
    pub key: String,
    /// The effect's name.
    pub name: String,
    /// The frozen request.
    pub request: Py<PyAny>,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// The producer of the event that recorded it.
    pub producer: String,
    /// The event's flow.
    pub flow_id: String,
    /// The event's seq.
    pub seq: i64,
}

impl Effect {
    fn of(py: Python<'_>, e: &CoreEffect) -> PyResult<Effect> {
        Ok(Effect {
            key: e.key.as_str().to_owned(),
            name: e.name.as_str().to_owned(),
            request: json_to_py(py, &e.request)?,
            attempt: e.attempt,
            producer: e.producer.as_str().to_owned(),
            flow_id: e.flow_id.as_str().to_owned(),
            seq: e.seq.get(),
        })
    }
}

#[pymethods]
impl Effect {
    fn __repr__(&self) -> String {
        format!(
            "ordo.Effect(key={:?}, name={:?}, attempt={})",
            self.key, self.name, self.attempt
        )
    }
}

/// How an effect's intents are run: ``max_attempts`` (1 to 1000),
/// ``dedup_window_s`` (how long the provider deduplicates by the key, or
/// ``None``: within it an attempt whose outcome is unknown is sent again
/// under the same key), ``ordered`` (whether one flow's intents run in
/// order), ``timeout_s`` (the longest a call may take) and ``lease_s`` (how
/// long a claim holds an intent, at least 5 s more than the timeout).
/// Checked when it is built (``ordo.InvalidInput``).
#[pyclass(module = "ordo", name = "EffectPolicy", frozen)]
pub struct EffectPolicy {
    pub(crate) policy: CorePolicy,
}

/// Seconds as whole milliseconds, or `ordo.InvalidInput`.
fn seconds_ms(seconds: f64, what: &str) -> PyResult<u64> {
    if !seconds.is_finite() || seconds <= 0.0 || seconds * 1000.0 > u64::MAX as f64 {
        return Err(invalid(format!(
            "{what} is a positive number of seconds, not {seconds}"
        )));
    }
    Ok(((seconds * 1000.0).round() as u64).max(1))
}

#[pymethods]
impl EffectPolicy {
    #[new]
    #[pyo3(signature = (max_attempts=8, dedup_window_s=None, ordered=true, timeout_s=10.0, lease_s=30.0))]
    fn new(
        max_attempts: i64,
        dedup_window_s: Option<f64>,
        ordered: bool,
        timeout_s: f64,
        lease_s: f64,
    ) -> PyResult<EffectPolicy> {
        let max_attempts = u32::try_from(max_attempts)
            .map_err(|_| invalid(format!("max_attempts is 1..=1000, not {max_attempts}")))?;
        let policy = CorePolicy {
            max_attempts,
            dedup_window_ms: dedup_window_s
                .map(|s| seconds_ms(s, "dedup_window_s"))
                .transpose()?,
            ordered,
            timeout_ms: seconds_ms(timeout_s, "timeout_s")?,
            lease_ms: seconds_ms(lease_s, "lease_s")?,
        };
        let policy = policy.checked().map_err(|e| rule("effect policy", e))?;
        Ok(EffectPolicy { policy })
    }

    /// The most attempts.
    #[getter]
    fn max_attempts(&self) -> u32 {
        self.policy.max_attempts
    }

    /// The provider's deduplication window in seconds, or None.
    #[getter]
    fn dedup_window_s(&self) -> Option<f64> {
        self.policy.dedup_window_ms.map(|ms| ms as f64 / 1000.0)
    }

    /// Whether one flow's intents run in order.
    #[getter]
    fn ordered(&self) -> bool {
        self.policy.ordered
    }

    /// The longest a call may take, in seconds.
    #[getter]
    fn timeout_s(&self) -> f64 {
        self.policy.timeout_ms as f64 / 1000.0
    }

    /// How long a claim holds an intent, in seconds.
    #[getter]
    fn lease_s(&self) -> f64 {
        self.policy.lease_ms as f64 / 1000.0
    }

    fn __repr__(&self) -> String {
        let window = match self.policy.dedup_window_ms {
            Some(ms) => format!("{}", ms as f64 / 1000.0),
            None => "None".into(),
        };
        format!(
            "ordo.EffectPolicy(max_attempts={}, dedup_window_s={window}, ordered={}, timeout_s={}, lease_s={})",
            self.policy.max_attempts,
            if self.policy.ordered { "True" } else { "False" },
            self.policy.timeout_ms as f64 / 1000.0,
            self.policy.lease_ms as f64 / 1000.0
        )
    }
}

/// Gives the outcome exceptions their constructors: `Retry(reason,
/// after_s=None)`, `Failed(reason)`, `Unknown(reason)`, each keeping its
/// arguments as attributes.
pub fn install_outcomes(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let scope = PyDict::new(py);
    scope.set_item("Retry", py.get_type::<Retry>())?;
    scope.set_item("Failed", py.get_type::<Failed>())?;
    scope.set_item("Unknown", py.get_type::<Unknown>())?;
    py.run(
        cr#"
def _retry_init(self, reason, after_s=None):
    """Not done: try again later, not sooner than after_s seconds when given."""
    Exception.__init__(self, reason)
    self.reason = reason
    self.after_s = after_s

def _outcome_init(self, reason):
    Exception.__init__(self, reason)
    self.reason = reason

Retry.__init__ = _retry_init
Failed.__init__ = _outcome_init
Unknown.__init__ = _outcome_init
"#,
        Some(&scope),
        None,
    )
}

/// The text of an exception, for the intent's `last_error`.
fn reason_of(py: Python<'_>, e: &PyErr) -> String {
    let value = e.value(py);
    if let Ok(reason) = value.getattr("reason") {
        if let Ok(text) = reason.str() {
            return text.to_string();
        }
    }
    let text = value.str().map(|s| s.to_string()).unwrap_or_default();
    let name = value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    if text.is_empty() {
        name
    } else {
        format!("{name}: {text}")
    }
}

/// A returned result as JSON: a dict (or None, stored as null).
fn result_of(returned: &Bound<'_, PyAny>) -> PyResult<Value> {
    if returned.is_none() {
        return Ok(Value::Null);
    }
    if !returned.is_instance_of::<PyDict>() {
        return Err(PyTypeError::new_err(format!(
            "an effect function returns its result as a dict, not {}",
            type_name(returned)
        )));
    }
    py_to_json(returned, "the effect's result", 0)
}

/// `after_s` of a `Retry` as milliseconds.
fn after_ms(py: Python<'_>, e: &PyErr) -> Option<u64> {
    let after = e.value(py).getattr("after_s").ok()?;
    let seconds: f64 = after.extract().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| (seconds * 1000.0).round() as u64)
}

/// Calls an effect function and maps what it did onto ordo's answer.
fn answer(py: Python<'_>, func: &Py<PyAny>, effect: &CoreEffect) -> Answer {
    let called = Effect::of(py, effect)
        .and_then(|e| Py::new(py, e))
        .and_then(|e| func.call1(py, (e,)));
    let error = match called.and_then(|r| result_of(r.bind(py))) {
        Ok(result) => return Answer::Succeeded(result),
        Err(e) => e,
    };
    let reason = reason_of(py, &error);
    if error.is_instance_of::<Retry>(py) {
        Answer::Retry {
            reason,
            after_ms: after_ms(py, &error),
        }
    } else if error.is_instance_of::<Failed>(py) {
        Answer::Failed(reason)
    } else {
        if !error.is_instance_of::<Unknown>(py) {
            error.print(py);
        }
        Answer::Unknown(reason)
    }
}

/// Calls a reconcile hook and maps what it found onto ordo's.
fn reconciled(py: Python<'_>, hook: &Py<PyAny>, effect: &CoreEffect) -> Reconciled {
    let called = Effect::of(py, effect)
        .and_then(|e| Py::new(py, e))
        .and_then(|e| hook.call1(py, (e,)));
    match called {
        Ok(found) if found.is_none(py) => Reconciled::CannotTell,
        Ok(found) => match result_of(found.bind(py)) {
            Ok(result) => Reconciled::Succeeded(result),
            Err(e) => {
                e.print(py);
                Reconciled::CannotTell
            }
        },
        Err(e) if e.is_instance_of::<Retry>(py) => Reconciled::NotDone,
        Err(e) => {
            if !e.is_instance_of::<Unknown>(py) {
                e.print(py);
            }
            Reconciled::CannotTell
        }
    }
}

/// A dict argument of str keys, or `TypeError`.
fn named<'py>(
    value: Option<&Bound<'py, PyAny>>,
    what: &str,
) -> PyResult<Vec<(String, Bound<'py, PyAny>)>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(Vec::new());
    };
    let Ok(dict) = value.cast::<PyDict>() else {
        return Err(PyTypeError::new_err(format!(
            "{what} is a dict of effect names, not {}",
            type_name(value)
        )));
    };
    dict.iter()
        .map(|(k, v)| {
            let k = k.extract::<String>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "{what}: an effect name is a str, not {}",
                    type_name(&k)
                ))
            })?;
            Ok((k, v))
        })
        .collect()
}

/// The executor of `functions` (effect name to function), with the
/// reconcile hooks and policies given by name; every name is checked
/// before anything runs.
pub fn executor(
    owner: String,
    functions: &Bound<'_, PyAny>,
    reconcile: Option<&Bound<'_, PyAny>>,
    policy: Option<&Bound<'_, PyAny>>,
) -> PyResult<Executor> {
    if functions.cast::<PyDict>().is_err() {
        return Err(PyTypeError::new_err(format!(
            "the effect functions are a dict of name to function, not {}",
            type_name(functions)
        )));
    }
    let functions = named(Some(functions), "functions")?;
    if functions.is_empty() {
        return Err(invalid("no effect function given"));
    }
    let policies = named(policy, "policy")?;
    let hooks = named(reconcile, "reconcile")?;
    let known = |name: &str, what: &str| -> PyResult<()> {
        if functions.iter().any(|(n, _)| n == name) {
            Ok(())
        } else {
            Err(invalid(format!(
                "{what}[{name:?}]: no effect function of that name"
            )))
        }
    };
    let mut executor = Executor::new(owner, Arc::new(SystemClock));
    for (name, func) in &functions {
        if !func.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "the effect function of {name:?} is a callable, not {}",
                type_name(func)
            )));
        }
        let mut chosen = CorePolicy::default();
        for (n, p) in &policies {
            if n == name {
                let p = p.cast::<EffectPolicy>().map_err(|_| {
                    PyTypeError::new_err(format!(
                        "policy[{name:?}] is an ordo.EffectPolicy, not {}",
                        type_name(p)
                    ))
                })?;
                chosen = p.get().policy;
            }
        }
        let func = func.clone().unbind();
        executor
            .register(name, chosen, move |effect| {
                Python::attach(|py| answer(py, &func, effect))
            })
            .map_err(|e| rule("effect name", e))?;
    }
    for (name, _) in &policies {
        known(name, "policy")?;
    }
    for (name, hook) in &hooks {
        known(name, "reconcile")?;
        if !hook.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "the reconcile hook of {name:?} is a callable, not {}",
                type_name(hook)
            )));
        }
        let hook = hook.clone().unbind();
        executor
            .reconcile(name, move |effect| {
                Python::attach(|py| reconciled(py, &hook, effect))
            })
            .map_err(|e| rule("reconcile", e))?;
    }
    Ok(executor)
}
