//! `ordo.Runner`: relay, apply and effects loops on threads of their own,
//! in this process, until stopped, each with its own handle of the store
//! (the location opened again), as `ordo-runtime`'s runner runs them.
//!
//! A loop's Python code (the apply handler, an effect function, a
//! reconcile hook) runs on the loop's thread with the GIL held; the loops
//! themselves, `wait()` and `stop()` release it.
//!
//! Invariant: a loop ends only between rounds (every round committed or
//! rolled back whole); a handler's exception ends the apply loop, rolled
//! back, and comes out of `stop()` (or `wait()`) as `ordo.HandlerError`
//! with the exception as `__cause__`; the first permanent failure of any
//! loop comes out of `stop()` and ends `wait()`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ordo::core::{
    ApplyContext, ApplyHandler, Envelope as CoreEnvelope, ErrorKind, ProducerName, StoreError,
    Verdict,
};
use ordo::runtime::{RunReport, Runner as CoreRunner, RunnerOptions};
use ordo::{Location, OpenSpec};
use parking_lot::Mutex;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyType;
use serde_json::{json, Value};

use crate::consumer::{handler_failure, Consumer, PyHandler};
use crate::convert::type_name;
use crate::errors::{error, invalid, store_error};
use crate::http::{check_key_producer, target, Target, TIMEOUT_S_DEFAULT};
use crate::producer::Producer;
use crate::sql::TxSql;
use crate::values::Report;

/// The first Python exception a loop's code raised that ends its loop.
type Failure = Arc<Mutex<Option<PyErr>>>;

/// The apply handler of a loop: the Python handler, whose exception is
/// kept for `stop()` when it ends the loop.
struct LoopHandler {
    inner: PyHandler,
    failure: Failure,
}

impl<T: TxSql> ApplyHandler<T> for LoopHandler {
    fn apply(
        &mut self,
        cx: &mut ApplyContext<'_, T>,
        event: &CoreEnvelope,
    ) -> Result<Verdict, StoreError> {
        let verdict = <PyHandler as ApplyHandler<T>>::apply(&mut self.inner, cx, event);
        if let Some(raised) = self.inner.failure.take() {
            self.failure.lock().get_or_insert(raised);
        }
        verdict
    }
}

/// What `stop()` found: the totals, or the first failure.
enum Stopped {
    Report(Value),
    Failed(StoreError),
}

/// The runner's totals with the command line's names.
fn report_value(r: &RunReport) -> Value {
    json!({
        "relay": {
            "rounds": r.relay.rounds,
            "delivered": r.relay.delivered,
            "accepted": r.relay.accepted,
            "duplicate": r.relay.duplicate,
            "conflict": r.relay.conflict,
            "rewound": r.relay.rewound,
            "refused": r.relay.refused,
            "transient_errors": r.relay.transient_errors,
        },
        "apply": {
            "rounds": r.apply.rounds,
            "applied": r.apply.applied,
            "blocked": r.apply.blocked,
            "transient_errors": r.apply.transient_errors,
        },
        "effects": {
            "attempted": r.effects.attempted,
            "succeeded": r.effects.succeeded,
            "failed": r.effects.failed,
            "retried": r.effects.retried,
            "unknown": r.effects.unknown,
            "transient_errors": r.effect_transient_errors,
        },
    })
}

fn io_error(what: &str) -> impl Fn(std::io::Error) -> StoreError + '_ {
    move |e| {
        StoreError::new(
            ErrorKind::Other,
            format!("cannot start the {what} loop: {e}"),
        )
    }
}

/// The relay, apply and effects loops of this process, each on its own
/// thread with its own handle of its store.
///
/// ``with ordo.Runner() as runner:`` starts nothing by itself:
/// ``runner.relay(producer, consumer)`` (or ``url=...``),
/// ``runner.apply(consumer, handler)`` and ``runner.effects(consumer,
/// {"name": fn}, reconcile={...}, policy={...})`` each start a loop;
/// ``runner.wait()`` waits until Ctrl-C or the first permanent failure;
/// leaving the block stops every loop after its round in progress.
#[pyclass(module = "ordo", name = "Runner", frozen)]
pub struct Runner {
    /// The loops, until `stop()`.
    core: Mutex<Option<CoreRunner>>,
    /// The handler's exception that ended the apply loop, if any.
    failure: Failure,
    /// What the first `stop()` found, for the ones after it.
    stopped: Mutex<Option<Value>>,
    /// Numbers the effects loops' lease owners.
    owners: Mutex<u32>,
}

impl Runner {
    /// Runs `start` on the loops, with the GIL released (it may open
    /// stores and connect); refused once stopped.
    fn start(
        &self,
        py: Python<'_>,
        start: impl FnOnce(&mut CoreRunner) -> Result<(), StoreError> + Send,
    ) -> PyResult<()> {
        let mut core = self.core.lock();
        let Some(runner) = core.as_mut() else {
            return Err(error("the runner is stopped: start another one"));
        };
        py.detach(|| start(runner)).map_err(store_error)
    }

    /// Stops the loops (the GIL released while they finish their rounds)
    /// and returns the totals, or the first failure.
    fn halt(&self, py: Python<'_>) -> PyResult<Option<Stopped>> {
        let Some(runner) = self.core.lock().take() else {
            return Ok(None);
        };
        let stopped = py.detach(move || match runner.stop() {
            Ok(report) => Stopped::Report(report_value(&report)),
            Err(e) => Stopped::Failed(e),
        });
        Ok(Some(stopped))
    }

    /// The exception `stop()` raises for a loop's failure: the handler's
    /// (as `ordo.HandlerError`) when it was one.
    fn failure_error(&self, py: Python<'_>, e: StoreError) -> PyErr {
        match self.failure.lock().take() {
            Some(raised) => handler_failure(py, raised),
            None => store_error(e),
        }
    }

    /// The location and producer name of a producer, and the
    /// specification that opens it again.
    fn producer_spec(
        py: Python<'_>,
        producer: &Producer,
    ) -> PyResult<(Location, OpenSpec, ProducerName)> {
        let mut guard = producer.shared.lock(py)?;
        let name = match guard.as_mut() {
            Some(p) => p.producer_name().clone(),
            None => return Err(error("the producer store is closed")),
        };
        drop(guard);
        let spec = OpenSpec::existing().producer_name(name.clone());
        Ok((producer.shared.location.clone(), spec, name))
    }
}

impl Drop for Runner {
    /// A runner dropped without `stop()` stops its loops before the drop
    /// returns, with the GIL released while it waits: they may need it to
    /// end their round. Dropped on one of its own loops' threads (a handler
    /// holding the last reference), it stops them on a thread of its own
    /// instead, which that loop would otherwise wait for.
    fn drop(&mut self) {
        let Some(runner) = self.core.get_mut().take() else {
            return;
        };
        let on_a_loop = std::thread::current()
            .name()
            .is_some_and(|name| name.starts_with("ordo-"));
        if on_a_loop {
            let _ = std::thread::Builder::new()
                .name("ordo-runner-stop".into())
                .spawn(move || drop(runner));
            return;
        }
        Python::attach(|py| py.detach(move || drop(runner)));
    }
}

#[pymethods]
impl Runner {
    #[new]
    fn new() -> Runner {
        Runner {
            core: Mutex::new(Some(CoreRunner::new(RunnerOptions::default()))),
            failure: Arc::default(),
            stopped: Mutex::new(None),
            owners: Mutex::new(0),
        }
    }

    /// Starts a relay loop of ``producer``'s outbox: to ``consumer``, a
    /// store in this process, or to the inbox at ``url`` (``ordo serve``),
    /// signed with ``key_id`` of ``key_file`` when given; ``destination``
    /// names one of the producer store's destinations (needed when it has
    /// several: one loop per destination). The loop opens the store again
    /// (and the consumer's): its handles are its own.
    #[pyo3(signature = (producer, consumer=None, *, url=None, key_id=None, key_file=None, destination=None, timeout_s=TIMEOUT_S_DEFAULT))]
    #[allow(clippy::too_many_arguments)]
    fn relay(
        &self,
        py: Python<'_>,
        producer: &Bound<'_, Producer>,
        consumer: Option<&Bound<'_, PyAny>>,
        url: Option<&Bound<'_, PyAny>>,
        key_id: Option<&Bound<'_, PyAny>>,
        key_file: Option<&Bound<'_, PyAny>>,
        destination: Option<&Bound<'_, PyAny>>,
        timeout_s: f64,
    ) -> PyResult<()> {
        let target: Target = target(consumer, url, key_id, key_file, destination, timeout_s)?;
        let (at, spec, name) = Runner::producer_spec(py, producer.get())?;
        let to = match consumer.filter(|c| !c.is_none()) {
            Some(c) => Some(c.cast::<Consumer>()?.get().shared.location.clone()),
            None => None,
        };
        let http = match &target.url {
            Some(_) => {
                let transport = target.http()?;
                check_key_producer(&transport, &name).map_err(invalid)?;
                Some(transport)
            }
            None => None,
        };
        let destination = target.destination.clone();
        self.start(py, move |runner| {
            let producer = spec.producer(&at)?;
            match (http, to) {
                (Some(transport), _) => {
                    spawn_relay(runner, &spec, &at, producer, destination, transport)
                }
                (None, Some(to)) => {
                    let transport = OpenSpec::existing().consumer(&to)?;
                    spawn_relay(runner, &spec, &at, producer, destination, transport)
                }
                (None, None) => unreachable!("a target is a consumer or a url"),
            }
        })
    }

    /// Starts the apply loop of ``consumer`` with ``handler(tx, event)``,
    /// called on the loop's thread with the GIL held, as
    /// ``consumer.apply`` calls it. An exception rolls the batch in
    /// progress back and ends the loop: ``stop()`` (or ``wait()``) raises
    /// it as ``ordo.HandlerError``.
    fn apply(
        &self,
        py: Python<'_>,
        consumer: &Bound<'_, Consumer>,
        handler: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        if !handler.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "handler is a callable handler(tx, event), not {}",
                type_name(handler)
            )));
        }
        let at = consumer.get().shared.location.clone();
        let handler = LoopHandler {
            inner: PyHandler {
                func: handler.clone().unbind(),
                failure: None,
            },
            failure: Arc::clone(&self.failure),
        };
        self.start(py, move |runner| {
            let spec = OpenSpec::existing();
            let consumer = spec.consumer(&at)?;
            spec.spawn_apply(runner, &at, consumer, handler, |_: &_| {})
                .map_err(io_error("apply"))
        })
    }

    /// Starts the effects loop of ``consumer``: ``functions`` maps each
    /// effect name to its function, called with an ``ordo.Effect`` on the
    /// loop's thread (the GIL held). It returns the result (a dict), or
    /// raises ``ordo.Retry(reason, after_s=None)``, ``ordo.Failed(reason)``
    /// or ``ordo.Unknown(reason)``; any other exception counts as
    /// ``ordo.Unknown``. ``reconcile`` maps a name to its hook, asked about
    /// an attempt whose outcome is unknown: it returns the result (a dict:
    /// it happened), raises ``ordo.Retry`` (it did not: back to pending),
    /// or returns ``None`` / raises ``ordo.Unknown`` (it cannot tell).
    /// ``policy`` maps a name to its ``ordo.EffectPolicy``.
    #[pyo3(signature = (consumer, functions, reconcile=None, policy=None))]
    fn effects(
        &self,
        py: Python<'_>,
        consumer: &Bound<'_, Consumer>,
        functions: &Bound<'_, PyAny>,
        reconcile: Option<&Bound<'_, PyAny>>,
        policy: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let owner = {
            let mut n = self.owners.lock();
            *n += 1;
            format!("python-{}-{}", std::process::id(), *n)
        };
        let executor = crate::effects::executor(owner, functions, reconcile, policy)?;
        let at = consumer.get().shared.location.clone();
        self.start(py, move |runner| {
            let spec = OpenSpec::existing();
            match spec.consumer(&at)? {
                ordo::Consumer::Sqlite(db) => runner
                    .spawn_effects(db, None, executor, |_: &_| {})
                    .map_err(io_error("effects")),
                ordo::Consumer::Postgres(db) => {
                    let reopen: ordo::runtime::Reopen<_> =
                        Box::new(move || match spec.consumer(&at)? {
                            ordo::Consumer::Postgres(db) => Ok(db),
                            ordo::Consumer::Sqlite(_) => {
                                unreachable!("a URL opens a PostgreSQL store")
                            }
                        });
                    runner
                        .spawn_effects(db, Some(reopen), executor, |_: &_| {})
                        .map_err(io_error("effects"))
                }
            }
        })
    }

    /// Waits until Ctrl-C (``KeyboardInterrupt`` is raised; leaving the
    /// ``with`` block then stops the loops) or until a loop ends by a
    /// permanent failure: then stops the others and raises it, as
    /// ``stop()`` does. With ``timeout`` (seconds), returns ``None`` after
    /// that long if neither happened.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let deadline = match timeout {
            Some(t) if !t.is_finite() || t < 0.0 => {
                return Err(invalid(format!(
                    "timeout is a number of seconds >= 0, not {t}"
                )))
            }
            Some(t) => Some(Instant::now() + Duration::from_secs_f64(t)),
            None => None,
        };
        loop {
            let failed = match self.core.lock().as_ref() {
                Some(runner) => runner.failed(),
                None => return Err(error("the runner is stopped")),
            };
            if failed {
                self.stop(py)?;
                return Ok(());
            }
            let mut step = Duration::from_millis(50);
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(());
                }
                step = step.min(left);
            }
            py.detach(|| std::thread::sleep(step));
            py.check_signals()?;
        }
    }

    /// Stops every loop after its round in progress, waits for them (the
    /// GIL released) and returns the totals (``relay``, ``apply``,
    /// ``effects``) as a report, or raises the first permanent failure: a
    /// handler's exception as ``ordo.HandlerError`` (the exception as
    /// ``__cause__``). Stopping again returns the same totals.
    fn stop(&self, py: Python<'_>) -> PyResult<Report> {
        match self.halt(py)? {
            Some(Stopped::Report(value)) => {
                *self.stopped.lock() = Some(value.clone());
                Report::of(py, &value)
            }
            Some(Stopped::Failed(e)) => {
                *self.stopped.lock() = Some(report_value(&RunReport::default()));
                Err(self.failure_error(py, e))
            }
            None => {
                let value = self.stopped.lock().clone().unwrap_or_else(|| json!({}));
                Report::of(py, &value)
            }
        }
    }

    /// The totals so far (``relay``, ``apply``, ``effects``), as a report.
    fn report(&self, py: Python<'_>) -> PyResult<Report> {
        let value = match self.core.lock().as_ref() {
            Some(runner) => report_value(&runner.report()),
            None => self.stopped.lock().clone().unwrap_or_else(|| json!({})),
        };
        Report::of(py, &value)
    }

    /// Whether ``stop()`` was called (or a failure stopped it).
    #[getter]
    fn stopped(&self) -> bool {
        self.core.lock().is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Stops the loops; a loop's failure is raised (chained to the
    /// block's own exception, if any).
    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyType>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.stop(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        match self.core.lock().is_some() {
            true => "ordo.Runner(running)".into(),
            false => "ordo.Runner(stopped)".into(),
        }
    }
}

/// Starts a relay loop of `producer` through `transport`, on
/// `destination` when given; a PostgreSQL store is opened again after a
/// lost connection.
fn spawn_relay<T: ordo::core::Transport + Send + 'static>(
    runner: &mut CoreRunner,
    spec: &OpenSpec,
    at: &Location,
    producer: ordo::Producer,
    destination: Option<ordo::core::DestinationName>,
    transport: T,
) -> Result<(), StoreError> {
    let Some(destination) = destination else {
        return spec
            .spawn_relay(runner, at, producer, transport, |_: &_| {})
            .map_err(io_error("relay"));
    };
    match producer {
        ordo::Producer::Sqlite(p) => {
            runner.spawn_relay_for(&destination, p, None, transport, |_: &_| {})
        }
        ordo::Producer::Postgres(p) => {
            let (spec, at) = (spec.clone(), at.clone());
            let reopen: ordo::runtime::Reopen<_> = Box::new(move || match spec.producer(&at)? {
                ordo::Producer::Postgres(p) => Ok(p),
                ordo::Producer::Sqlite(_) => unreachable!("a URL opens a PostgreSQL store"),
            });
            runner.spawn_relay_for(&destination, p, Some(reopen), transport, |_: &_| {})
        }
    }
}
