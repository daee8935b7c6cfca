//! `ordo console`: the operator web console (ordo-console) over the given
//! stores, SQLite files or PostgreSQL databases (one database may hold
//! both sides).
//!
//! The token file and the stores are checked before anything is served;
//! no store is ever created here. Beyond loopback the console needs an
//! operator token. The first stdout line names the bound address; the
//! process then runs until SIGTERM or SIGINT and exits 0.

use std::net::SocketAddr;
use std::sync::Arc;

use ordo_console::{
    keep_idle, Console, ConsumerOpener, Csrf, IdlePool, ProducerOpener, Reevaluator, Summarizer,
    Token,
};
use serde_json::json;
use tokio::signal::unix::{signal, SignalKind};

use crate::args::ConsoleArgs;
use crate::context::{
    check_sides, clock, emit, existing_consumer, existing_consumer_domain, existing_producer,
    existing_producer_domain, open_existing_reservation_consumer,
};
use crate::stores::Location;
use crate::stores::ReservationInbox;
use crate::Failure;

/// Store handles (for PostgreSQL, connections) each side keeps open
/// between requests.
const IDLE_MAX: usize = 4;

pub fn console(json_mode: bool, args: ConsoleArgs) -> Result<(), Failure> {
    let token = load_token(&args)?;
    check_sides(&args.sides)?;
    let producer = match &args.sides.producer {
        Some(side) => Some(keep_idle(producer_opener(side)?, IDLE_MAX)),
        None => None,
    };
    let (consumer, reservation) = match &args.sides.consumer {
        Some(side) => {
            let (open, domain) = consumer_opener(side)?;
            let open = keep_idle(open, IDLE_MAX);
            let reservation = domain == ordo_reservation::DOMAIN;
            (Some(open), reservation.then_some(side))
        }
        None => (None, None),
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
        effect_confirmations: Default::default(),
        reevaluate: reservation.map(reservation_reevaluator),
        summary: reservation.map(reservation_summary),
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

fn missing(location: &Location) -> Failure {
    Failure::Usage(format!(
        "{location} does not exist (console never creates a store)"
    ))
}

/// Opens producer handles (an SQLite file or a PostgreSQL database) that
/// never create the store; one is opened now, so that a store that cannot
/// be opened stops the start.
fn producer_opener(location: &Location) -> Result<ProducerOpener, Failure> {
    if existing_producer_domain(location)?.is_none() {
        return Err(missing(location));
    }
    let location = location.clone();
    let open: ProducerOpener = Arc::new(move || Ok(existing_producer(&location)?.into_handle()));
    open()?;
    Ok(open)
}

/// Opens consumer handles that never create the store; one is opened now.
/// Also the store's domain.
fn consumer_opener(location: &Location) -> Result<(ConsumerOpener, String), Failure> {
    let Some(domain) = existing_consumer_domain(location)? else {
        return Err(missing(location));
    };
    let location = location.clone();
    let open: ConsumerOpener = Arc::new(move || Ok(existing_consumer(&location)?.into_handle()));
    open()?;
    Ok((open, domain))
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
fn reservation_reevaluator(location: &Location) -> Reevaluator {
    let location = location.clone();
    Arc::new(move |flow, support_v2| {
        let mut consumer = open_existing_reservation_consumer(&location).map_err(text)?;
        let (reopened, drained) =
            crate::ops::reevaluate_blocked(&mut consumer, flow, support_v2).map_err(text)?;
        let reason = crate::render::reason_suffix(drained.stop.reason());
        Ok(format!(
            "{flow}: reopened {reopened} blocked rows, applied {}, stop {}{reason}",
            drained.applied,
            drained.stop.as_str()
        ))
    })
}

fn text(failure: Failure) -> String {
    match failure {
        Failure::Usage(m) | Failure::Internal(m) | Failure::Check(m) => m,
    }
}

/// For a consumer of the reservation domain: the flow's projection (its
/// state, quantity and applied seq), one keyed read on a store opened as
/// it is.
fn reservation_summary(location: &Location) -> Summarizer {
    let location = location.clone();
    let idle = IdlePool::default();
    Arc::new(move |flow| {
        let mut consumer = match idle.take() {
            Some(consumer) => consumer,
            None => existing_consumer(&location)?,
        };
        let projection = consumer.projection(flow)?;
        idle.put(consumer, IDLE_MAX);
        Ok(vec![
            ("state".to_owned(), projection.state.as_str().to_owned()),
            (
                "quantity".to_owned(),
                projection
                    .quantity
                    .map_or_else(String::new, |q| q.get().to_string()),
            ),
            ("applied_seq".to_owned(), projection.applied_seq.to_string()),
        ])
    })
}
