//! `ordo serve`: the HTTP inbox of HTTP.md on a consumer store, with the
//! reservation applier beside it when `--apply` is given.
//!
//! Every flag, the key file and the TLS files are checked before the store
//! is opened; the store is never created here. The first stdout line names
//! the bound address; the process then runs until SIGTERM or SIGINT, lets
//! requests in flight finish, stops the applier after its round, exits 0.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ordo_core::StoreId;
use ordo_http::server::ServerConfig;
use ordo_http::tls::TlsAcceptor;
use ordo_http::{KeyRing, Metrics, Opener, Server};
use ordo_reservation::ApplyOptions;
use serde_json::json;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::args::ServeArgs;
use crate::commands::reservation_handler;
use crate::context::{
    check_consumer, clock, emit, existing_consumer, existing_consumer_domain,
    open_existing_reservation_consumer,
};
use crate::metered::{count_apply, expect_reservation_blocks};
use crate::running::start_apply;
use crate::stores::{AnyConsumer, Location};
use crate::Failure;
use ordo_runtime::Runner;

/// How often the applier's committed totals reach the metrics, and its
/// health is checked.
const APPLY_WATCH_INTERVAL: Duration = Duration::from_millis(500);
/// Blocking threads beyond the requests in flight (status reads, spare).
const BLOCKING_THREADS_SPARE: usize = 8;

pub fn serve(json_mode: bool, args: ServeArgs) -> Result<(), Failure> {
    let keys = load_keys(&args)?;
    let tls = load_tls(&args)?;
    let config = server_config(&args, keys);
    check_store(&args.consumer, args.apply)?;
    // A first handle now, outside the runtime: a store that cannot be
    // opened stops the start, and its identity names every answer.
    let store_id = existing_consumer(&args.consumer)?
        .handle()
        .store_id()
        .clone();
    // The applier's store too (a PostgreSQL client cannot connect from
    // the runtime's threads).
    let applier_store = match args.apply {
        true => Some(open_existing_reservation_consumer(&args.consumer)?),
        false => None,
    };
    raise_open_files_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(config.max_in_flight + BLOCKING_THREADS_SPARE)
        .thread_name("ordo-serve")
        .build()
        .map_err(|e| Failure::Internal(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(run(json_mode, args, config, tls, store_id, applier_store))
}

/// Refuses unsigned requests off loopback unless told, and reads the keys
/// (with `--require-producer-keys`, each bound to a producer).
fn load_keys(args: &ServeArgs) -> Result<Option<KeyRing>, Failure> {
    let Some(path) = &args.keys else {
        if args.require_producer_keys {
            return Err(Failure::Usage(
                "--require-producer-keys needs --keys FILE (lines `KEY_ID SECRET_HEX producer=NAME`)"
                    .to_owned(),
            ));
        }
        if !args.listen.ip().is_loopback() && !args.insecure_no_auth {
            return Err(Failure::Usage(format!(
                "--listen {} is not a loopback address: give --keys FILE, or --insecure-no-auth to accept unsigned requests",
                args.listen
            )));
        }
        return Ok(None);
    };
    let keys = KeyRing::load(path).map_err(|e| Failure::Usage(e.to_string()))?;
    if let Some(key_id) = keys.unbound().next().filter(|_| args.require_producer_keys) {
        return Err(Failure::Usage(format!(
            "--require-producer-keys: key id {key_id} of {} is bound to no producer (end each of its lines with producer=NAME)",
            path.display()
        )));
    }
    Ok(Some(keys))
}

fn load_tls(args: &ServeArgs) -> Result<Option<TlsAcceptor>, Failure> {
    match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => ordo_http::tls::acceptor(cert, key)
            .map(Some)
            .map_err(Failure::Usage),
        _ => Ok(None),
    }
}

fn server_config(args: &ServeArgs, keys: Option<KeyRing>) -> ServerConfig {
    ServerConfig {
        keys,
        max_batch: args.max_batch as usize,
        max_body_bytes: args.max_body_bytes,
        max_in_flight: args.max_in_flight as usize,
        max_connections: args.max_connections as usize,
        read_timeout: Duration::from_millis(args.read_timeout_ms),
        ..ServerConfig::default()
    }
}

/// The store must exist (nothing is created); with `--apply`, it must
/// belong to the reservation domain.
fn check_store(location: &Location, apply: bool) -> Result<(), Failure> {
    check_consumer(location)?;
    match existing_consumer_domain(location)? {
        None => Err(Failure::Usage(format!(
            "{location} does not exist (serve never creates a store; run `ordo init --consumer {location}` first)"
        ))),
        Some(domain) if apply && domain != ordo_reservation::DOMAIN => {
            Err(Failure::Usage(format!(
                "{location} belongs to domain \"{domain}\"; its handler runs in the application (serve without --apply)"
            )))
        }
        Some(_) => Ok(()),
    }
}

/// Raises this process's soft limit on open files to its hard limit, so
/// that `--max-connections` is not cut short by it.
fn raise_open_files_limit() {
    if let Err(e) = rlimit::increase_nofile_limit(u64::MAX) {
        tracing::warn!("cannot raise the limit on open files: {e}");
    }
}

/// Opens store handles that never create the store.
fn opener(location: Location) -> Opener {
    Arc::new(move || Ok(existing_consumer(&location)?.into_handle()))
}

async fn run(
    json_mode: bool,
    args: ServeArgs,
    config: ServerConfig,
    tls: Option<TlsAcceptor>,
    store_id: StoreId,
    applier_store: Option<AnyConsumer>,
) -> Result<(), Failure> {
    let metrics = Arc::new(Metrics::new());
    let applier = match applier_store {
        Some(store) => Some(start_applier(store, &args, &metrics)?),
        None => None,
    };
    let (listener, bound) = bind(args.listen)?;
    let opener = opener(args.consumer.clone());
    let server = Server::new(config, opener, &store_id, Arc::clone(&metrics), clock());
    let signals = Signals::install()?;
    announce(json_mode, bound, tls.is_some());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let watch = applier.map(|runner| tokio::spawn(watch_applier(runner, stop.clone())));
    server.serve(listener, tls, signals.shutdown(stopped)).await;
    let _ = stop.send(true);
    tracing::info!("stopped serving");
    let Some(watch) = watch else {
        return Ok(());
    };
    watch
        .await
        .map_err(|e| Failure::Internal(format!("the applier's watch failed: {e}")))?
}

fn bind(addr: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), Failure> {
    let listener = ordo_http::bind(addr)
        .map_err(|e| Failure::Internal(format!("cannot listen on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Failure::Internal(format!("cannot read the bound address: {e}")))?;
    Ok((listener, bound))
}

fn announce(json_mode: bool, bound: SocketAddr, https: bool) {
    let scheme = if https { "https" } else { "http" };
    tracing::info!("serving {scheme}://{bound}");
    emit(
        json_mode,
        &json!({ "listening": bound.to_string() }),
        || format!("listening on {bound}"),
    );
}

/// The signals that stop the server, installed before the listening line
/// is printed, so that a signal sent as soon as it is read is not lost.
struct Signals {
    terminate: Signal,
    interrupt: Signal,
}

impl Signals {
    fn install() -> Result<Signals, Failure> {
        let install = |kind| {
            signal(kind).map_err(|e| Failure::Internal(format!("cannot handle signals: {e}")))
        };
        Ok(Signals {
            terminate: install(SignalKind::terminate())?,
            interrupt: install(SignalKind::interrupt())?,
        })
    }

    /// Completes at SIGTERM, SIGINT, or when `stopped` turns true (the
    /// applier failed).
    async fn shutdown(mut self, mut stopped: tokio::sync::watch::Receiver<bool>) {
        tokio::select! {
            _ = self.terminate.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = self.interrupt.recv() => tracing::info!("SIGINT: shutting down"),
            _ = stopped.wait_for(|stop| *stop) => {}
        }
    }
}

fn start_applier(
    consumer: AnyConsumer,
    args: &ServeArgs,
    metrics: &Arc<Metrics>,
) -> Result<Runner, Failure> {
    expect_reservation_blocks(metrics);
    let handler = reservation_handler(ApplyOptions::default(), args.webhook.as_deref());
    let counted = Some(Arc::clone(metrics));
    let running = start_apply(
        consumer,
        &args.consumer,
        handler,
        ordo_core::APPLY_BATCH_LEN_DEFAULT,
        move |round| count_apply(&counted, round),
    )
    .map_err(|e| Failure::Internal(format!("cannot start the applier: {e}")))?;
    tracing::info!("applier started");
    Ok(running)
}

/// Watches the applier until the server stops or the applier fails (which
/// stops the server); then stops it.
async fn watch_applier(
    runner: Runner,
    stop: tokio::sync::watch::Sender<bool>,
) -> Result<(), Failure> {
    let mut stopped = stop.subscribe();
    let mut interval = tokio::time::interval(APPLY_WATCH_INTERVAL);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stopped.wait_for(|stop| *stop) => break,
        }
        if runner.failed() {
            tracing::error!("the applier stopped on a failure; shutting down");
            let _ = stop.send(true);
            break;
        }
    }
    tokio::task::spawn_blocking(move || crate::running::stop(runner))
        .await
        .map_err(|e| Failure::Internal(format!("the applier's stop failed: {e}")))??;
    tracing::info!("applier stopped");
    Ok(())
}
