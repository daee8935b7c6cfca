//! `ordo bench --transport http`: the relay over loopback HTTP to an
//! `ordo serve` child against the relay in process, at the same batch size
//! in the same run; the latency of each POST as the client sees it; and the
//! server under many concurrent clients, with its peak memory.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ordo_core::relay::Handover;
use ordo_core::{
    relay_each, Clock, Envelope, ProducerOps, Receipt, RelayOptions, SystemClock, Transport,
};
use ordo_http::{ClientOptions, HttpTransport};
use ordo_sqlite::rusqlite::Connection;
use ordo_sqlite::ProducerDb;

use crate::bench::{fresh_dir, produce, EVENTS_PER_FLOW};
use crate::bench_wake::{WakeRun, WAKE_EVENTS};
use crate::figures::per_second;
use crate::serve::{loopback_any, ServeSpec, Served};
use crate::{first_reservation, internal, LabError as Failure, Progress, Silent};

/// The ratio of the HTTP relay's rate to the in-process relay's that the
/// transport aims at (reported, never asserted).
pub const RATIO_TARGET: f64 = 0.7;
/// The body limit the bench's servers are started with, in bytes.
const SERVE_BODY_BYTES_MAX: u64 = 1 << 30;

/// What the HTTP bench runs.
#[derive(Debug, Clone)]
pub struct HttpLoad {
    /// The `ordo` binary, whose `serve` the bench starts.
    pub exe: PathBuf,
    /// Concurrent clients of the load run.
    pub clients: u64,
    /// How long the clients post, in seconds.
    pub seconds: u64,
    /// The PostgreSQL server (`postgres://USER@HOST:PORT`) of the wake
    /// part's consumer, in a fresh database of its own; `None`: an SQLite
    /// file.
    pub wake_server: Option<String>,
}

/// Latency of requests as the client sees them, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RequestLatency {
    /// The median.
    pub p50_ms: f64,
    /// The 99th percentile.
    pub p99_ms: f64,
    /// The largest.
    pub max_ms: f64,
    /// Requests measured.
    pub samples: u64,
}

impl RequestLatency {
    pub(crate) fn of(mut samples: Vec<Duration>) -> RequestLatency {
        samples.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        // The sample at rank round((n - 1) * q), counting from 0.
        let at = |q: f64| {
            let rank = (samples.len().saturating_sub(1) as f64 * q).round() as usize;
            samples.get(rank).copied().map_or(0.0, ms)
        };
        RequestLatency {
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            max_ms: samples.last().copied().map_or(0.0, ms),
            samples: samples.len() as u64,
        }
    }
}

/// One relay run to completion.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayRun {
    /// Events delivered.
    pub events: u64,
    /// Wall time, in seconds.
    pub seconds: f64,
    /// The latency of each hand-over (a POST over HTTP, a receive
    /// transaction in process).
    pub latency: RequestLatency,
}

impl RelayRun {
    /// Events delivered per second.
    pub fn events_per_s(&self) -> f64 {
        per_second(self.events, self.seconds)
    }
}

/// Many clients posting to one server at once.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LoadRun {
    /// Concurrent clients.
    pub clients: u64,
    /// How long they posted (the slowest client's time), in seconds.
    pub seconds: f64,
    /// Events per request.
    pub batch: u64,
    /// Requests made.
    pub requests: u64,
    /// Requests answered otherwise than 200 (or not answered).
    pub failed_requests: u64,
    /// The first of those failures.
    pub first_failure: Option<String>,
    /// `accepted` receipts received.
    pub accepted: u64,
    /// Inbox rows in the server's store afterwards.
    pub stored: u64,
    /// The client-side latency of each request.
    pub latency: RequestLatency,
    /// The server's peak resident memory (`VmHWM`).
    pub server_peak_memory_bytes: Option<u64>,
}

impl LoadRun {
    /// Requests made per second.
    pub fn requests_per_s(&self) -> f64 {
        per_second(self.requests, self.seconds)
    }

    /// Events accepted per second.
    pub fn events_per_s(&self) -> f64 {
        per_second(self.accepted, self.seconds)
    }
}

/// What the HTTP bench measured.
#[derive(Debug, Clone)]
pub struct HttpBenchReport {
    /// Flows relayed by each relay run (each three events).
    pub flows: u64,
    /// Events per round and per request.
    pub batch: u64,
    /// The relay with the consumer file in process.
    pub in_process: RelayRun,
    /// The relay posting to `ordo serve` on the loopback interface.
    pub http: RelayRun,
    /// The server under concurrent clients.
    pub load: LoadRun,
    /// The receive-to-apply lag between `ordo serve` and an applier
    /// process on the same file.
    pub wake: WakeRun,
}

impl HttpBenchReport {
    /// Events relayed by each relay run.
    pub fn events(&self) -> u64 {
        self.flows * EVENTS_PER_FLOW
    }

    /// The HTTP relay's rate over the in-process relay's.
    pub fn ratio(&self) -> f64 {
        self.http.events_per_s() / self.in_process.events_per_s().max(1e-9)
    }

    /// Counts that do not add up; empty when every request got a 200 and
    /// every event sent was accepted and stored once.
    pub fn problems(&self) -> Vec<String> {
        let load = &self.load;
        let mut problems = Vec::new();
        if load.failed_requests > 0 {
            problems.push(format!(
                "{} of {} requests were not answered 200; first: {}",
                load.failed_requests,
                load.requests,
                load.first_failure.as_deref().unwrap_or("?")
            ));
        }
        let sent = (load.requests - load.failed_requests) * load.batch;
        if load.accepted != sent || load.stored != sent {
            problems.push(format!(
                "{sent} events sent in answered requests, {} accepted, {} stored",
                load.accepted, load.stored
            ));
        }
        problems
    }
}

/// A transport that times each hand-over.
struct Timed<T> {
    inner: T,
    samples: Vec<Duration>,
}

impl<T: Transport> Transport for Timed<T> {
    fn deliver(
        &mut self,
        sender: Option<&ordo_core::StoreId>,
        events: &[Envelope],
    ) -> Result<Vec<Receipt>, ordo_core::TransportError> {
        let started = Instant::now();
        let answer = self.inner.deliver(sender, events);
        self.samples.push(started.elapsed());
        answer
    }

    fn consumer_identity(&self) -> Option<ordo_core::StoreId> {
        self.inner.consumer_identity()
    }

    fn identify(&mut self) -> Result<Option<ordo_core::StoreId>, ordo_core::TransportError> {
        self.inner.identify()
    }
}

/// The flags of the bench's servers: room for a round of `batch` events
/// and for `clients` requests at once.
fn serve_flags(batch: u64, clients: u64) -> Vec<String> {
    let in_flight = clients.max(ordo_http::server::MAX_IN_FLIGHT_DEFAULT as u64);
    vec![
        "--max-batch".into(),
        batch.to_string(),
        "--max-body-bytes".into(),
        SERVE_BODY_BYTES_MAX.to_string(),
        "--max-in-flight".into(),
        in_flight.to_string(),
    ]
}

/// Starts a server on `consumer` (created first), logging into its directory.
fn serve(load: &HttpLoad, consumer: &Path, batch: u64) -> Result<Served, Failure> {
    ordo_reservation::open_consumer(consumer)?;
    let log = consumer.with_file_name("serve.log");
    crate::serve::start(&ServeSpec {
        exe: &load.exe,
        consumer,
        listen: loopback_any(),
        crash_point: None,
        log: Some(&log),
        flags: &serve_flags(batch, load.clients),
    })
    .map_err(Failure::Internal)
}

/// A producer file in `dir` holding every step of `flows` flows.
fn produced(dir: &Path, flows: u64, batch: u64) -> Result<ProducerDb, Failure> {
    let mut producer = ordo_reservation::open_producer(dir.join("producer.db"))?;
    produce(&mut producer, 0..flows, batch, &Silent)?;
    Ok(producer)
}

/// Relays everything through `transport`, `batch` events a round; every
/// event must be delivered in the one run.
fn relay_all<T: Transport>(
    producer: &mut ProducerDb,
    transport: T,
    batch: u64,
    label: &str,
    progress: &dyn Progress,
) -> Result<RelayRun, Failure> {
    let events = producer.producer_status(SystemClock.now_ms())?.backlog;
    let mut timed = Timed {
        inner: transport,
        samples: Vec::new(),
    };
    let options = RelayOptions {
        batch_len_max: batch as usize,
        ..RelayOptions::default()
    };
    progress.start(label, events);
    let (mut delivered, mut failed) = (0u64, 0u64);
    let started = Instant::now();
    relay_each(
        producer,
        &mut timed,
        &options,
        &SystemClock,
        |handover| match handover {
            Handover::Delivered(_) => {
                delivered += 1;
                progress.inc(1);
            }
            Handover::Refused(_) | Handover::Failed(_) => failed += 1,
        },
    )
    .map_err(internal)?;
    let seconds = started.elapsed().as_secs_f64();
    progress.finish();
    if delivered != events {
        return Err(Failure::Check(format!(
            "the {label} run delivered {delivered} of {events} events ({failed} refused or failed)"
        )));
    }
    Ok(RelayRun {
        events,
        seconds,
        latency: RequestLatency::of(timed.samples),
    })
}

/// The same flows relayed in process, then over HTTP.
fn relay_runs(
    root: &Path,
    flows: u64,
    batch: u64,
    load: &HttpLoad,
    progress: &dyn Progress,
) -> Result<(RelayRun, RelayRun), Failure> {
    let dir = fresh_dir(root, "in-process")?;
    let mut producer = produced(&dir, flows, batch)?;
    let consumer = ordo_reservation::open_consumer(dir.join("consumer.db"))?;
    let label = format!("relay in process B={batch}");
    let in_process = relay_all(&mut producer, consumer, batch, &label, progress)?;

    let dir = fresh_dir(root, "http")?;
    let mut producer = produced(&dir, flows, batch)?;
    let served = serve(load, &dir.join("consumer.db"), batch)?;
    let http = HttpTransport::new(&served.url(), None, &ClientOptions::default())
        .map_err(internal)
        .and_then(|client| {
            let label = format!("relay over HTTP B={batch}");
            relay_all(&mut producer, client, batch, &label, progress)
        });
    served.stop();
    Ok((in_process, http?))
}

/// What one client did.
#[derive(Default)]
struct ClientTally {
    requests: u64,
    failed: u64,
    first_failure: Option<String>,
    accepted: u64,
    samples: Vec<Duration>,
    seconds: f64,
}

impl ClientTally {
    fn merge(&mut self, other: ClientTally) {
        self.requests += other.requests;
        self.failed += other.failed;
        self.accepted += other.accepted;
        if self.first_failure.is_none() {
            self.first_failure = other.first_failure;
        }
        self.samples.extend(other.samples);
        self.seconds = self.seconds.max(other.seconds);
    }
}

/// `batch` events of new flows (one event each), numbered from `first`,
/// of client `client`: no two clients share a flow.
fn load_batch(client: u64, first: u64, batch: u64) -> Result<Vec<Envelope>, Failure> {
    (first..first + batch)
        .map(|n| first_reservation(format!("c{client:04}-{n:09}"), 1))
        .collect()
}

/// One client: posts batches of new events until `window` has passed since
/// every client was ready.
fn client_loop(
    url: &str,
    client: u64,
    batch: u64,
    window: Duration,
    ready: &Barrier,
) -> Result<ClientTally, Failure> {
    let transport = HttpTransport::new(url, None, &ClientOptions::default()).map_err(internal);
    ready.wait();
    let mut transport = transport?;
    let started = Instant::now();
    let mut tally = ClientTally::default();
    while started.elapsed() < window {
        let events = load_batch(client, tally.requests * batch, batch)?;
        let sent = Instant::now();
        let answer = transport.deliver(None, &events);
        tally.samples.push(sent.elapsed());
        tally.requests += 1;
        match answer {
            Ok(receipts) => {
                tally.accepted +=
                    receipts.iter().filter(|r| **r == Receipt::Accepted).count() as u64;
            }
            Err(e) => {
                tally.failed += 1;
                tally.first_failure.get_or_insert_with(|| e.to_string());
            }
        }
    }
    tally.seconds = started.elapsed().as_secs_f64();
    Ok(tally)
}

/// `clients` threads posting to `url` at once for `window`.
fn hammer(url: &str, clients: u64, batch: u64, window: Duration) -> Result<ClientTally, Failure> {
    let ready = Arc::new(Barrier::new(clients as usize));
    let handles = (0..clients)
        .map(|client| {
            let (url, ready) = (url.to_owned(), Arc::clone(&ready));
            std::thread::Builder::new()
                .name(format!("client-{client}"))
                .spawn(move || client_loop(&url, client, batch, window, &ready))
                .map_err(internal)
        })
        .collect::<Result<Vec<_>, Failure>>()?;
    let mut total = ClientTally::default();
    for handle in handles {
        let tally = handle
            .join()
            .map_err(|_| internal("a client thread panicked"))??;
        total.merge(tally);
    }
    Ok(total)
}

fn inbox_rows(consumer: &Path) -> Result<u64, Failure> {
    let conn = Connection::open(consumer).map_err(internal)?;
    conn.query_row("SELECT count(*) FROM inbox", [], |row| row.get(0))
        .map_err(internal)
}

/// `load.clients` clients posting batches of new events to one server for
/// `load.seconds`; the server's peak memory is read before it stops.
fn load_run(
    root: &Path,
    batch: u64,
    load: &HttpLoad,
    progress: &dyn Progress,
) -> Result<LoadRun, Failure> {
    let consumer = fresh_dir(root, "load")?.join("consumer.db");
    let served = serve(load, &consumer, batch)?;
    progress.start(&format!("{} clients posting", load.clients), 0);
    let window = Duration::from_secs(load.seconds);
    let tally = hammer(&served.url(), load.clients, batch, window);
    progress.finish();
    let peak = crate::serve::peak_memory_bytes(served.child.id());
    served.stop();
    let tally = tally?;
    Ok(LoadRun {
        clients: load.clients,
        seconds: tally.seconds,
        batch,
        requests: tally.requests,
        failed_requests: tally.failed,
        first_failure: tally.first_failure,
        accepted: tally.accepted,
        stored: inbox_rows(&consumer)?,
        latency: RequestLatency::of(tally.samples),
        server_peak_memory_bytes: peak,
    })
}

/// Runs the HTTP bench in `root`.
pub fn run(
    root: &Path,
    flows: u64,
    batch: u64,
    load: &HttpLoad,
    progress: &dyn Progress,
) -> Result<HttpBenchReport, Failure> {
    let (in_process, http) = relay_runs(root, flows, batch, load, progress)?;
    let load_report = load_run(root, batch, load, progress)?;
    progress.start(
        &format!(
            "wake: {WAKE_EVENTS} events, serve and an applier process on {}",
            if load.wake_server.is_some() {
                "postgres"
            } else {
                "sqlite"
            }
        ),
        0,
    );
    let wake = crate::bench_wake::run(root, load)?;
    progress.finish();
    Ok(HttpBenchReport {
        flows,
        batch,
        in_process,
        http,
        load: load_report,
        wake,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_ranks_of_the_sorted_samples() {
        let samples = (1..=100).rev().map(Duration::from_millis).collect();
        let latency = RequestLatency::of(samples);
        assert_eq!(latency.samples, 100);
        assert_eq!(latency.p50_ms, 51.0);
        assert_eq!(latency.p99_ms, 99.0);
        assert_eq!(latency.max_ms, 100.0);
        assert_eq!(RequestLatency::of(Vec::new()), RequestLatency::default());
    }

    #[test]
    fn a_load_run_reports_requests_and_accepted_events_per_second() {
        // (seconds, requests, accepted) -> (requests/s, events/s)
        let cases = [
            ((2.0, 1000, 8000), (500.0, 4000.0)),
            ((0.5, 3, 0), (6.0, 0.0)),
            ((4.0, 0, 0), (0.0, 0.0)),
            // No measurable time: still finite.
            ((0.0, 3, 5), (3e9, 5e9)),
        ];
        for ((seconds, requests, accepted), rates) in cases {
            let load = LoadRun {
                seconds,
                requests,
                accepted,
                ..LoadRun::default()
            };
            assert_eq!(
                (load.requests_per_s(), load.events_per_s()),
                rates,
                "{load:?}"
            );
        }
    }

    #[test]
    fn load_batches_never_share_a_flow() {
        let a = load_batch(1, 0, 3).unwrap();
        let b = load_batch(1, 3, 3).unwrap();
        let c = load_batch(2, 0, 3).unwrap();
        let mut flows: Vec<_> = [a, b, c]
            .iter()
            .flatten()
            .map(|e| e.flow_id.clone())
            .collect();
        flows.sort();
        flows.dedup();
        assert_eq!(flows.len(), 9);
    }

    #[test]
    fn problems_name_failed_requests_and_lost_events() {
        let run = RelayRun {
            events: 3,
            seconds: 1.0,
            latency: RequestLatency::default(),
        };
        let mut report = HttpBenchReport {
            flows: 1,
            batch: 2,
            in_process: run.clone(),
            http: run,
            load: LoadRun {
                batch: 2,
                requests: 3,
                accepted: 6,
                stored: 6,
                ..LoadRun::default()
            },
            wake: WakeRun::default(),
        };
        assert!(report.problems().is_empty());
        assert_eq!(report.ratio(), 1.0);
        assert_eq!(report.events(), 3);
        report.load.stored = 5;
        assert_eq!(report.problems().len(), 1);
        report.load.failed_requests = 1;
        report.load.first_failure = Some("503".into());
        assert_eq!(report.problems().len(), 2, "{:?}", report.problems());
    }
}
