//! `relay --follow` and `apply --follow`: the runtime's loops on either
//! backend in the foreground until SIGTERM or SIGINT, one line per round,
//! and metrics.
//!
//! Invariant: a signal only asks the loops to stop; the round in progress
//! commits (or rolls back) whole before the process exits 0.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ordo_core::{DestinationName, Transport};
use ordo_http::{Metrics, MetricsServer};
use ordo_reservation::ApplyOptions;
use ordo_runtime::{ApplyRound, RelayRound, Runner, RunnerOptions};
use serde_json::json;

use crate::args::{ApplyArgs, Files, RelayArgs};
use crate::commands::relay_options;
use crate::context::{
    check_distinct, clock, open_existing_consumer, open_existing_producer,
    open_existing_reservation_consumer,
};
use crate::metered::{count_apply, count_relay, expect_reservation_blocks};
use crate::running::{start_apply, start_relay};
use crate::stores::AnyProducer;
use crate::{remote, Failure};

/// How often the stop flag and the loops are looked at.
const WATCH_INTERVAL: Duration = Duration::from_millis(50);
/// How often the metrics' gauges are read from the store.
const GAUGE_INTERVAL: Duration = Duration::from_secs(1);

/// `relay --follow`, to a consumer store or to `--to URL`. Neither store is
/// created: a missing one is invalid input.
pub fn relay(json_mode: bool, args: &RelayArgs) -> Result<(), Failure> {
    match &args.consumer {
        Some(consumer) => {
            let files = Files {
                producer: args.producer.clone(),
                consumer: consumer.clone(),
            };
            check_distinct(&files)?;
            let mut producer = open_existing_producer(&files.producer)?;
            crate::destinations::choose(producer.handle(), args.destination.as_ref())?;
            let consumer = open_existing_consumer(&files.consumer)?;
            relay_with(json_mode, args, producer, consumer)
        }
        None => {
            let transport = remote::transport(args)?;
            let mut producer = open_existing_producer(&args.producer)?;
            crate::destinations::choose(producer.handle(), args.destination.as_ref())?;
            remote::check_key_producer(&transport, &mut producer, args)?;
            relay_with(json_mode, args, producer, transport)
        }
    }
}

fn relay_with<T: Transport + Send + 'static>(
    json_mode: bool,
    args: &RelayArgs,
    producer: AnyProducer,
    transport: T,
) -> Result<(), Failure> {
    let stop = Stop::install()?;
    let mut gauges = open_existing_producer(&args.producer)?;
    let destination = relayed_destination(&mut gauges, args.destination.as_ref())?;
    let exposition = Exposition::start(args.metrics_listen)?;
    let metrics = exposition.metrics.clone();
    if let Some(metrics) = &metrics {
        metrics.expect_destination(destination.as_str());
    }
    let options = RunnerOptions {
        relay: ordo_core::RelayOptions {
            max: None,
            ..relay_options(args)
        },
        ..RunnerOptions::default()
    };
    let mut printer = Printer::new(json_mode);
    let (observer_metrics, counted) = (metrics.clone(), destination.clone());
    let observe = move |round: &RelayRound| {
        count_relay(&observer_metrics, counted.as_str(), round);
        printer.relay(round);
    };
    let started = start_relay(producer, &args.producer, transport, options, observe);
    let running =
        started.map_err(|e| Failure::Internal(format!("cannot start the relay loop: {e}")))?;
    watch(&stop, &running, || match &metrics {
        Some(metrics) => set_outbox(metrics, &mut gauges, &destination),
        None => Ok(()),
    });
    crate::running::stop(running)?;
    exposition.stop();
    Ok(())
}

/// The destination a relay delivers to: the one named, else the store's
/// only one (a store of several refuses a relay that names none).
fn relayed_destination(
    producer: &mut AnyProducer,
    named: Option<&DestinationName>,
) -> Result<DestinationName, Failure> {
    if let Some(name) = named {
        return Ok(name.clone());
    }
    let destinations = producer.handle().destinations(clock().now_ms())?;
    match destinations.as_slice() {
        [only] => Ok(only.name.clone()),
        several => Err(Failure::Usage(format!(
            "the producer store has {} destinations: name one with --destination",
            several.len()
        ))),
    }
}

/// Sets the outbox gauges from `destination`'s own signals (its backlog,
/// quarantine and age, not the other destinations').
fn set_outbox(
    metrics: &Metrics,
    producer: &mut AnyProducer,
    destination: &DestinationName,
) -> Result<(), ordo_core::StoreError> {
    let now_ms = clock().now_ms();
    let destinations = producer.handle().destinations(now_ms)?;
    match destinations.iter().find(|d| &d.name == destination) {
        Some(own) => metrics.set_outbox(destination.as_str(), &own.status, now_ms),
        None => tracing::warn!(%destination, "the destination is no longer in the producer store"),
    }
    Ok(())
}

/// `apply --follow` of the reservation domain. The store is not created.
pub fn apply(json_mode: bool, args: &ApplyArgs) -> Result<(), Failure> {
    let consumer = open_existing_reservation_consumer(&args.consumer)?;
    let mut gauges = open_existing_consumer(&args.consumer)?;
    let stop = Stop::install()?;
    let exposition = Exposition::start(args.metrics_listen)?;
    let metrics = exposition.metrics.clone();
    if let Some(metrics) = &metrics {
        expect_reservation_blocks(metrics);
    }
    let options = ApplyOptions {
        support_v2: args.support_v2,
    };
    let handler = crate::commands::reservation_handler(options, args.webhook.as_deref());
    let mut printer = Printer::new(json_mode);
    let observer_metrics = metrics.clone();
    let observe = move |round: &ApplyRound| {
        count_apply(&observer_metrics, round);
        printer.apply(round);
    };
    let running = start_apply(consumer, &args.consumer, handler, args.batch, observe)
        .map_err(|e| Failure::Internal(format!("cannot start the apply loop: {e}")))?;
    watch(&stop, &running, || {
        if let Some(metrics) = &metrics {
            metrics.set_inbox(&gauges.handle().consumer_status()?);
        }
        Ok(())
    });
    crate::running::stop(running)?;
    exposition.stop();
    Ok(())
}

/// Waits until a signal asks to stop or a loop ends on its own, calling
/// `refresh` (the gauges) every [`GAUGE_INTERVAL`].
pub(crate) fn watch(
    stop: &Stop,
    running: &Runner,
    mut refresh: impl FnMut() -> Result<(), ordo_core::StoreError>,
) {
    let mut refreshed: Option<Instant> = None;
    while !stop.requested() && !running.failed() {
        if refreshed.is_none_or(|at| at.elapsed() >= GAUGE_INTERVAL) {
            if let Err(e) = refresh() {
                tracing::warn!(error = %e, "cannot read the store's status for the gauges");
            }
            refreshed = Some(Instant::now());
        }
        std::thread::sleep(WATCH_INTERVAL);
    }
}

/// SIGTERM and SIGINT ask to stop; a second one ends the process at once.
pub(crate) struct Stop(Arc<AtomicBool>);

impl Stop {
    pub(crate) fn install() -> Result<Stop, Failure> {
        let flag = Arc::new(AtomicBool::new(false));
        for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            let installed =
                signal_hook::flag::register_conditional_shutdown(signal, 130, Arc::clone(&flag))
                    .and_then(|_| signal_hook::flag::register(signal, Arc::clone(&flag)));
            installed.map_err(|e| Failure::Internal(format!("cannot handle signals: {e}")))?;
        }
        Ok(Stop(flag))
    }

    pub(crate) fn requested(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The metrics of a follow mode, served when `--metrics-listen` is given.
pub(crate) struct Exposition {
    pub(crate) metrics: Option<Arc<Metrics>>,
    server: Option<MetricsServer>,
}

impl Exposition {
    pub(crate) fn start(listen: Option<std::net::SocketAddr>) -> Result<Exposition, Failure> {
        let Some(addr) = listen else {
            return Ok(Exposition {
                metrics: None,
                server: None,
            });
        };
        let metrics = Arc::new(Metrics::new());
        let server = MetricsServer::start(addr, Arc::clone(&metrics))
            .map_err(|e| Failure::Usage(format!("--metrics-listen {addr}: {e}")))?;
        tracing::info!(addr = %server.local_addr(), "serving metrics");
        Ok(Exposition {
            metrics: Some(metrics),
            server: Some(server),
        })
    }

    pub(crate) fn stop(self) {
        if let Some(server) = self.server {
            server.stop();
        }
    }
}

/// One stdout line per round: the contract's JSON object, or text.
struct Printer {
    json_mode: bool,
    round: u64,
}

impl Printer {
    fn new(json_mode: bool) -> Printer {
        Printer {
            json_mode,
            round: 0,
        }
    }

    fn relay(&mut self, round: &RelayRound) {
        self.round += 1;
        let t = &round.totals;
        let line = if self.json_mode {
            json!({
                "round": self.round, "delivered": t.delivered, "accepted": t.accepted,
                "duplicate": t.duplicate, "conflict": t.conflict, "rewound": t.rewound,
                "refused": t.refused, "transient_errors": t.transient_errors,
            })
            .to_string()
        } else {
            format!(
                "round {}: delivered {} (accepted {}, duplicate {}, conflict {}, rewound {}), refused {}, transient errors {}",
                self.round, t.delivered, t.accepted, t.duplicate, t.conflict, t.rewound, t.refused, t.transient_errors
            )
        };
        print_line(&line);
    }

    fn apply(&mut self, round: &ApplyRound) {
        self.round += 1;
        let t = &round.totals;
        let line = if self.json_mode {
            json!({"round": self.round, "applied": t.applied, "blocked": t.blocked}).to_string()
        } else {
            format!(
                "round {}: applied {}, blocked {}",
                self.round, t.applied, t.blocked
            )
        };
        print_line(&line);
    }
}

/// Prints one line and flushes it; a closed stdout is ignored (the loops go
/// on, and the logs still say what happens).
pub(crate) fn print_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}
