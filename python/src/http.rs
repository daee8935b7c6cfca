//! `ordo.relay`: a producer's outbox handed over until nothing more can
//! be delivered, as `ordo relay` does, to a consumer store in this process
//! or to an inbox over HTTP (`ordo serve`), signed with a key of a key
//! file when one is given, for one destination of the producer store when
//! it has several.
//!
//! Invariant: every argument is checked (the URL, the key file, the key's
//! producer) before anything is sent; the relay runs with the GIL
//! released, under the producer store's lock.

use std::path::PathBuf;
use std::time::Duration;

use ordo::core::{
    DestinationName, ErrorKind, ProducerStore, RelayError, RelayOptions, StoreError, SystemClock,
    Transport,
};
use ordo_http::{ClientOptions, HttpTransport, KeyRing, Signer};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::consumer::Consumer;
use crate::convert::type_name;
use crate::errors::{error, invalid, rule, store_error};
use crate::producer::Producer;
use crate::values::Report;

/// How long one HTTP request may take by default, in seconds (the
/// command line's default).
pub const TIMEOUT_S_DEFAULT: f64 = 30.0;

/// Where a relay hands the outbox over, as the caller gave it.
pub struct Target {
    /// The inbox's base URL, or `None` for a consumer store in this
    /// process.
    pub url: Option<String>,
    /// The key id signing the requests and its key file.
    pub key: Option<(String, PathBuf)>,
    /// The destination of the producer store.
    pub destination: Option<DestinationName>,
    /// How long one request may take.
    pub timeout: Duration,
}

/// An argument given and not None.
fn some<'py>(value: Option<&Bound<'py, PyAny>>) -> Option<Bound<'py, PyAny>> {
    value.filter(|v| !v.is_none()).cloned()
}

/// Checks the keyword arguments of `relay` (of `ordo.relay` and of
/// `runner.relay`): a consumer or a URL, a key id with its key file and
/// a URL, a valid destination name.
pub fn target(
    consumer: Option<&Bound<'_, PyAny>>,
    url: Option<&Bound<'_, PyAny>>,
    key_id: Option<&Bound<'_, PyAny>>,
    key_file: Option<&Bound<'_, PyAny>>,
    destination: Option<&Bound<'_, PyAny>>,
    timeout_s: f64,
) -> PyResult<Target> {
    let (consumer, url) = (some(consumer), some(url));
    match (&consumer, &url) {
        (Some(_), Some(_)) => {
            return Err(PyTypeError::new_err(
                "relay to a consumer store or to a url, not both",
            ))
        }
        (None, None) => {
            return Err(PyTypeError::new_err(
                "relay needs a consumer store or url=\"http://host:port\"",
            ))
        }
        _ => {}
    }
    if let Some(consumer) = &consumer {
        if !consumer.is_instance_of::<Consumer>() {
            return Err(PyTypeError::new_err(format!(
                "consumer is an ordo.Consumer, not {}",
                type_name(consumer)
            )));
        }
    }
    let url = url.map(|u| crate::str_arg(&u, "url")).transpose()?;
    let key = match (some(key_id), some(key_file)) {
        (Some(id), Some(file)) => {
            let id = crate::str_arg(&id, "key_id")?;
            let os = file.py().import("os")?;
            let file: String = os
                .call_method1("fspath", (&file,))
                .and_then(|f| f.extract())
                .map_err(|_| {
                    PyTypeError::new_err(format!("key_file is a path, not {}", type_name(&file)))
                })?;
            Some((id, PathBuf::from(file)))
        }
        (None, None) => None,
        _ => {
            return Err(PyTypeError::new_err(
                "key_id and key_file go together: the key id and the file holding its secrets",
            ))
        }
    };
    if key.is_some() && url.is_none() {
        return Err(PyTypeError::new_err(
            "key_id and key_file sign HTTP requests: they go with url=",
        ));
    }
    let destination = some(destination)
        .map(|d| {
            let d = crate::str_arg(&d, "destination")?;
            DestinationName::new(d).map_err(|e| rule("destination", e))
        })
        .transpose()?;
    if !timeout_s.is_finite() || timeout_s <= 0.0 {
        return Err(invalid(format!(
            "timeout_s is a positive number of seconds, not {timeout_s}"
        )));
    }
    Ok(Target {
        url,
        key,
        destination,
        timeout: Duration::from_secs_f64(timeout_s),
    })
}

impl Target {
    /// The HTTP client of the target's URL, signing with its key; a bad
    /// URL, key file or key id is `ordo.InvalidInput`.
    pub fn http(&self) -> PyResult<HttpTransport> {
        let url = self.url.as_deref().expect("an HTTP target has a url");
        let signer = match &self.key {
            Some((id, file)) => {
                let ring = KeyRing::load(file).map_err(|e| invalid(e.to_string()))?;
                Some(Signer::new(id, ring).map_err(|e| invalid(e.to_string()))?)
            }
            None => None,
        };
        let options = ClientOptions {
            timeout: self.timeout,
            ..ClientOptions::default()
        };
        HttpTransport::new(url, signer, &options).map_err(|e| invalid(e.to_string()))
    }
}

/// Refuses a key bound to another producer than `producer` (nothing is
/// sent then), as `ordo relay` does.
pub fn check_key_producer(
    transport: &HttpTransport,
    producer: &ordo::core::ProducerName,
) -> Result<(), String> {
    let Some(signer) = transport.signer() else {
        return Ok(());
    };
    match signer.producer() {
        Some(bound) if bound != producer => Err(format!(
            "key id {} is bound to producer {bound}, but the producer store is named {producer}; nothing was sent",
            signer.key_id()
        )),
        _ => Ok(()),
    }
}

/// Why a one-shot relay did not run.
enum Refused {
    Store(StoreError),
    Relay(RelayError),
    Input(String),
}

/// Chooses `destination` on `producer` (an unknown one refused).
fn choose(
    producer: &mut (dyn ProducerStore + Send),
    destination: Option<&DestinationName>,
) -> Result<(), Refused> {
    match destination {
        None => Ok(()),
        Some(name) => producer
            .use_destination(Some(name))
            .map_err(Refused::Store)?
            .map_err(|refused| Refused::Input(refused.to_string())),
    }
}

/// Relays until drained through `transport`, on `destination` when
/// given; the handle acts on the store's only destination again after.
fn drain<T: Transport + ?Sized>(
    producer: &mut (dyn ProducerStore + Send),
    transport: &mut T,
    destination: Option<&DestinationName>,
    options: &RelayOptions,
) -> Result<ordo::core::RelayReport, Refused> {
    choose(producer, destination)?;
    let report = ordo::core::relay(producer, transport, options, &SystemClock);
    if destination.is_some() {
        // Back to the store's only destination; a store with several has
        // none to go back to, and every relay chooses its own.
        let _ = producer.use_destination(None);
    }
    report.map_err(Refused::Relay)
}

fn closed() -> Refused {
    Refused::Store(StoreError::new(ErrorKind::Other, "a store was closed"))
}

/// Relays ``producer``'s outbox until nothing more can be delivered, as
/// ``ordo relay`` does: to ``consumer``, a store in this process, or to
/// the inbox at ``url`` (``ordo serve``), signing each request with
/// ``key_id`` of ``key_file`` when given; ``destination`` names one of the
/// producer store's destinations (needed when it has several). Returns a
/// report with the keys of ``ordo relay --json``. ``policy`` is
/// ``"fair"`` (the default) or ``"first-pending"`` (the original
/// experiment's, as ``ordo relay --policy``). The GIL is released
/// throughout.
#[pyfunction]
#[pyo3(signature = (producer, consumer=None, *, url=None, key_id=None, key_file=None, destination=None, timeout_s=TIMEOUT_S_DEFAULT, policy=None))]
#[allow(clippy::too_many_arguments)]
pub fn relay(
    py: Python<'_>,
    producer: &Bound<'_, Producer>,
    consumer: Option<&Bound<'_, PyAny>>,
    url: Option<&Bound<'_, PyAny>>,
    key_id: Option<&Bound<'_, PyAny>>,
    key_file: Option<&Bound<'_, PyAny>>,
    destination: Option<&Bound<'_, PyAny>>,
    timeout_s: f64,
    policy: Option<&Bound<'_, PyAny>>,
) -> PyResult<Report> {
    let options = crate::reservation::relay_options(policy)?;
    let target = target(consumer, url, key_id, key_file, destination, timeout_s)?;
    let destination = target.destination.clone();
    let producer = producer.get();
    let ran = match consumer.filter(|c| !c.is_none()) {
        Some(consumer) => {
            let consumer = consumer.cast::<Consumer>()?.get();
            let mut from = producer.shared.lock(py)?;
            let mut to = consumer.shared.lock(py)?;
            py.detach(|| match (from.as_mut(), to.as_mut()) {
                (Some(p), Some(c)) => drain(p.handle(), c, destination.as_ref(), &options),
                _ => Err(closed()),
            })
        }
        None => {
            let mut transport = target.http()?;
            let mut from = producer.shared.lock(py)?;
            py.detach(|| match from.as_mut() {
                Some(p) => {
                    let name = p.producer_name().clone();
                    check_key_producer(&transport, &name).map_err(Refused::Input)?;
                    drain(p.handle(), &mut transport, destination.as_ref(), &options)
                }
                None => Err(closed()),
            })
        }
    };
    let report = ran.map_err(|e| match e {
        Refused::Store(e) | Refused::Relay(RelayError::Store(e)) => store_error(e),
        Refused::Relay(other) => error(other.to_string()),
        Refused::Input(message) => invalid(message),
    })?;
    Report::of(py, &crate::relay_value(&report))
}
