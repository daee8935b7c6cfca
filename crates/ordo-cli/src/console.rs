//! `ordo console`: the operator web console (ordo-console) over the given
//! stores.
//!
//! The token file and the stores are checked before anything is served;
//! no store is ever created here. Beyond loopback the console needs an
//! operator token. The first stdout line names the bound address; the
//! process then runs until SIGTERM or SIGINT and exits 0.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ordo_console::{
    Console, ConsumerOpener, ConsumerView, Csrf, ProducerOpener, ProducerView, Reevaluator, Token,
};
use ordo_sqlite::{ConsumerDb, OpenOptions, ProducerDb};
use serde_json::json;
use tokio::signal::unix::{signal, SignalKind};

use crate::args::ConsoleArgs;
use crate::context::{check_sides, clock, emit, open_existing_reservation_consumer, open_options};
use crate::stores::Location;
use crate::Failure;

pub fn console(json_mode: bool, args: ConsoleArgs) -> Result<(), Failure> {
    let token = load_token(&args)?;
    for side in [&args.sides.producer, &args.sides.consumer]
        .into_iter()
        .flatten()
    {
        file_of(side)?;
    }
    check_sides(&args.sides)?;
    let producer = match &args.sides.producer {
        Some(side) => Some(producer_opener(file_of(side)?)?),
        None => None,
    };
    let consumer = match &args.sides.consumer {
        Some(side) => Some(consumer_opener(file_of(side)?)?),
        None => None,
    };
    let console = Console {
        producer,
        consumer,
        clock: clock(),
        token,
        read_only: args.read_only,
        csrf: Csrf::generate()
            .map_err(|e| Failure::Internal(format!("cannot draw a form token: {e}")))?,
        confirmations: Default::default(),
        reevaluate: match &args.sides.consumer {
            Some(side) => reservation_reevaluator(file_of(side)?)?,
            None => None,
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ordo-console")
        .build()
        .map_err(|e| Failure::Internal(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(run(json_mode, args.listen, console))
}

/// Beyond loopback only with a token; the token file must be readable by
/// its owner only and hold a token.
fn load_token(args: &ConsoleArgs) -> Result<Option<Token>, Failure> {
    let Some(path) = &args.token_file else {
        if !args.listen.ip().is_loopback() {
            return Err(Failure::Usage(format!(
                "--listen {} is not a loopback address: give --token-file F (the operator token)",
                args.listen
            )));
        }
        return Ok(None);
    };
    ordo_http::auth::check_private(path).map_err(|e| Failure::Usage(e.to_string()))?;
    Token::load(path)
        .map(Some)
        .map_err(|e| Failure::Usage(e.to_string()))
}

/// The SQLite file a side names; the console cannot browse PostgreSQL
/// stores yet.
fn file_of(location: &Location) -> Result<&Path, Failure> {
    match location {
        Location::File(path) => Ok(path),
        Location::Postgres(_) => Err(Failure::Usage(format!(
            "{location}: the console reads SQLite stores only; PostgreSQL stores are not supported yet"
        ))),
    }
}

fn existing_only() -> OpenOptions {
    OpenOptions {
        create: false,
        ..open_options()
    }
}

fn missing(path: &Path) -> Failure {
    Failure::Usage(format!(
        "{} does not exist (console never creates a store)",
        path.display()
    ))
}

/// Opens producer handles that never create the file; one is opened now,
/// so that a store that cannot be opened stops the start.
fn producer_opener(path: &Path) -> Result<ProducerOpener, Failure> {
    if ProducerDb::existing_domain(path)?.is_none() {
        return Err(missing(path));
    }
    let path: PathBuf = path.to_owned();
    let options = existing_only();
    let open: ProducerOpener = Arc::new(move || {
        let store = ProducerDb::open_existing(&path, clock(), &options)?;
        Ok(Box::new(store) as Box<dyn ProducerView>)
    });
    open()?;
    Ok(open)
}

/// Opens consumer handles that never create the file; one is opened now.
fn consumer_opener(path: &Path) -> Result<ConsumerOpener, Failure> {
    if ConsumerDb::existing_domain(path)?.is_none() {
        return Err(missing(path));
    }
    let path: PathBuf = path.to_owned();
    let options = existing_only();
    let open: ConsumerOpener = Arc::new(move || {
        let store = ConsumerDb::open_existing(&path, clock(), &options)?;
        Ok(Box::new(store) as Box<dyn ConsumerView>)
    });
    open()?;
    Ok(open)
}

async fn run(json_mode: bool, listen: SocketAddr, console: Console) -> Result<(), Failure> {
    let listener = ordo_http::bind(listen)
        .map_err(|e| Failure::Internal(format!("cannot listen on {listen}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Failure::Internal(format!("cannot read the bound address: {e}")))?;
    let install =
        |kind| signal(kind).map_err(|e| Failure::Internal(format!("cannot handle signals: {e}")));
    let mut terminate = install(SignalKind::terminate())?;
    let mut interrupt = install(SignalKind::interrupt())?;
    tracing::info!("console at http://{bound}/");
    emit(
        json_mode,
        &json!({ "listening": bound.to_string() }),
        || format!("listening on {bound}"),
    );
    let shutdown = async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = interrupt.recv() => tracing::info!("SIGINT: shutting down"),
        }
    };
    axum::serve(listener, ordo_console::router(console))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| Failure::Internal(format!("the console failed: {e}")))?;
    tracing::info!("stopped serving");
    Ok(())
}

/// For a consumer of the reservation domain, whose handler this process
/// runs: `inbox retry`'s re-evaluation of a flow's blocked rows.
fn reservation_reevaluator(path: &Path) -> Result<Option<Reevaluator>, Failure> {
    if ConsumerDb::existing_domain(path)?.as_deref() != Some(ordo_reservation::DOMAIN) {
        return Ok(None);
    }
    let location = Location::File(path.to_owned());
    let run: Reevaluator = Arc::new(move |flow, support_v2| {
        let text = |failure: Failure| match failure {
            Failure::Usage(m) | Failure::Internal(m) | Failure::Check(m) => m,
        };
        let mut consumer = open_existing_reservation_consumer(&location).map_err(text)?;
        let (reopened, drained) =
            crate::ops::reevaluate_blocked(&mut consumer, flow, support_v2).map_err(text)?;
        let reason = crate::render::reason_suffix(drained.stop.reason());
        Ok(format!(
            "{flow}: reopened {reopened} blocked rows, applied {}, stop {}{reason}",
            drained.applied,
            drained.stop.as_str()
        ))
    });
    Ok(Some(run))
}
