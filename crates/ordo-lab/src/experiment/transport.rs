//! Scenarios of the transports with a network hop (HTTP.md for `http`),
//! reported apart: a server role (`ordo serve`) receives what `ordo relay`
//! posts to it, and a crash on either side of the wire between the receive
//! commit and the relay's mark is recovered by the relay's retry, answered
//! `duplicate`. Each scenario runs once for every networked transport of
//! [`TRANSPORTS`](crate::transports::TRANSPORTS), named after it. Relays
//! run at a fixed clock (`ORDO_NOW_MS`), so the backoff after a failure is
//! exact.

use ordo_core::crash;
use serde_json::{json, Value};

use std::time::Duration;

use super::child::{deliver_stdin, finish, wait, Ctx, Run, ADVANCE_RESERVED, NOW_ENV};
use super::expect::{event, Expect};
use super::scenarios::{relayed, Outcome};
use super::Scenario;
use crate::serve::{loopback_any, ServeSpec, Served};
use crate::transports::{self, Hop, LabTransport};

/// A scenario run over one transport's hop.
type HopScenarioFn = fn(&Ctx, &Hop) -> Result<Outcome, String>;
/// A scenario's name over one transport.
type NameFn = fn(&LabTransport, &Hop) -> String;

/// What every networked transport runs: each scenario's name, derived from
/// the transport, and the scenario.
const OVER_HOP: [(NameFn, HopScenarioFn); 2] = [
    (
        |_, hop| crash_name(hop.after_commit),
        crash_server_after_commit,
    ),
    (
        |transport, _| {
            let point = crash_name(crash::RELAY_AFTER_RECEIVE);
            format!("{point}_over_{}", transport.name)
        },
        crash_relay_after_receive_over,
    ),
];

/// The name of the scenario crashing at `point`, as the seed names its
/// crash scenarios: `crash_` and the point, its dots as underscores
/// (`serve.after_commit`: `crash_serve_after_commit`).
fn crash_name(point: &str) -> String {
    format!("crash_{}", point.replace('.', "_"))
}

/// Every scenario of the group: those of [`OVER_HOP`] for each networked
/// transport, in the list's order.
pub fn scenarios() -> Vec<Scenario> {
    transports::networked()
        .flat_map(|(transport, hop)| {
            OVER_HOP.iter().map(move |&(name, run)| Scenario {
                name: name(transport, hop),
                run: Box::new(move |ctx| run(ctx, hop)),
            })
        })
        .collect()
}

/// The fixed time of the relays.
const T0: i64 = 1_700_000_000_000;
/// Past the first backoff after a failed attempt (at most 100 ms).
const LATER_MS: i64 = 1_000;
const QUANTITY: i64 = 5;
/// How long a server armed to crash may take to exit once the relay ran.
const CRASH_EXIT_WAIT: Duration = Duration::from_secs(10);

/// Produces `a-1` at T0 and creates the consumer store (serve creates none).
fn prepare(ctx: &Ctx) -> Result<Value, String> {
    let now = [(NOW_ENV, T0.to_string())];
    for args in [&["init", "--consumer", "{C}"][..], &ADVANCE_RESERVED] {
        run_with(ctx, args, None, &now)?.json_if_ok(&args.join(" "))?;
    }
    Ok(event("a", 1, "reserved", QUANTITY))
}

fn run_with(
    ctx: &Ctx,
    args: &[&str],
    crash_point: Option<&str>,
    env: &[(&str, String)],
) -> Result<Run, String> {
    let mut child = ctx.spawn_env(args, crash_point, env)?;
    deliver_stdin(&mut child, b"", args[0])?;
    finish(child, args[0])
}

/// `ordo relay` to the server role at `now_ms`, with `crash_point` armed.
fn relay_to(
    ctx: &Ctx,
    hop: &Hop,
    served: &Served,
    now_ms: i64,
    crash_point: Option<&str>,
) -> Result<Run, String> {
    let flags = hop.relay_flags(served.addr);
    let mut args = vec!["relay", "--producer", "{P}"];
    args.extend(flags.iter().map(String::as_str));
    run_with(ctx, &args, crash_point, &[(NOW_ENV, now_ms.to_string())])
}

/// Starts the hop's server role on the scenario's consumer store.
fn serve(ctx: &Ctx, hop: &Hop, crash_point: Option<&str>) -> Result<Served, String> {
    let consumer = ctx.consumer();
    let log = ctx.dir.join(format!("{}.log", hop.command));
    hop.start(&ServeSpec {
        exe: &ctx.exe,
        consumer: &consumer,
        listen: loopback_any(),
        crash_point,
        log: Some(&log),
        flags: &[],
    })
}

fn delivery(receipt: &str) -> Value {
    json!({"event_id": "a-1", "flow_id": "a", "seq": 1, "receipt": receipt})
}

/// What a relay run printed that a scenario compares: its exit status and
/// its counts (an error's text names a port, which changes).
fn relay_seen(run: &Run) -> Value {
    json!({
        "exit_code": run.code,
        "deliveries": run.json["deliveries"],
        "transient_errors": run.json["transient_errors"],
        "refused_total": run.json["refused_total"],
    })
}

/// The delivery bookkeeping of `a-1`, without times.
fn bookkeeping(ctx: &Ctx) -> Result<Value, String> {
    let list = ctx.ok(&["outbox", "list", "--producer", "{P}"])?;
    let row = &list["outbox"][0];
    Ok(json!({
        "accepted": row["accepted"],
        "attempts": row["attempts"],
        "last_outcome": row["last_outcome"],
    }))
}

/// The server role exits at its after-commit point (`serve.after_commit`):
/// `a-1` is stored but the relay gets no response, a transient failure
/// (exit 0, nothing marked). A server started again answers the retry
/// `duplicate`, and `a-1` is accepted.
fn crash_server_after_commit(ctx: &Ctx, hop: &Hop) -> Result<Outcome, String> {
    let e1 = prepare(ctx)?;
    let mut crashing = serve(ctx, hop, Some(hop.after_commit))?;
    let first = relay_to(ctx, hop, &crashing, T0, None);
    let serve_status = wait(&mut crashing.child, hop.command, CRASH_EXIT_WAIT);
    crashing.stop();
    let (first, serve_status) = (first?, serve_status?);
    let after_crash = ctx.snapshot()?;
    let after_crash_bookkeeping = bookkeeping(ctx)?;
    let served = serve(ctx, hop, None)?;
    let retry = relay_to(ctx, hop, &served, T0 + LATER_MS, None);
    served.stop();
    let retry = retry?;
    let stored = Expect::new().flow("a", "reserved", QUANTITY, 1);
    Ok(Outcome {
        observed: json!({
            "serve_exit_code": serve_status.code(),
            "relay": relay_seen(&first),
            "after_crash": after_crash,
            "after_crash_outbox": after_crash_bookkeeping,
            "retry": retry.json,
            "retry_exit_code": retry.code,
            "outbox": bookkeeping(ctx)?,
            "state": ctx.snapshot()?,
        }),
        expected: json!({
            "serve_exit_code": crash::CRASH_EXIT_STATUS,
            "relay": {"exit_code": 0, "deliveries": [], "transient_errors": 1, "refused_total": 0},
            "after_crash": stored.clone().outbox(&e1, false).inbox(&e1, "pending", None).build(),
            "after_crash_outbox": {"accepted": false, "attempts": 1, "last_outcome": "error"},
            "retry": relayed(vec![delivery("duplicate")], "drained"),
            "retry_exit_code": 0,
            "outbox": {"accepted": true, "attempts": 2, "last_outcome": "duplicate"},
            "state": stored.outbox(&e1, true).inbox(&e1, "pending", None).build(),
        }),
    })
}

/// The relay exits at `relay.after_receive` with the server's answer in hand,
/// before marking: `a-1` is stored and not accepted. The retry over the
/// same hop is answered `duplicate`, and `a-1` is accepted.
fn crash_relay_after_receive_over(ctx: &Ctx, hop: &Hop) -> Result<Outcome, String> {
    let e1 = prepare(ctx)?;
    let served = serve(ctx, hop, None)?;
    let crashed = relay_to(ctx, hop, &served, T0, Some(crash::RELAY_AFTER_RECEIVE));
    let after_crash = ctx.snapshot();
    let retry = relay_to(ctx, hop, &served, T0 + LATER_MS, None);
    served.stop();
    let (crashed, after_crash, retry) = (crashed?, after_crash?, retry?);
    let stored = Expect::new().flow("a", "reserved", QUANTITY, 1);
    Ok(Outcome {
        observed: json!({
            "relay_exit_code": crashed.code,
            "after_crash": after_crash,
            "retry": retry.json,
            "retry_exit_code": retry.code,
            "outbox": bookkeeping(ctx)?,
            "state": ctx.snapshot()?,
        }),
        expected: json!({
            "relay_exit_code": crash::CRASH_EXIT_STATUS,
            "after_crash": stored.clone().outbox(&e1, false).inbox(&e1, "pending", None).build(),
            "retry": relayed(vec![delivery("duplicate")], "drained"),
            "retry_exit_code": 0,
            "outbox": {"accepted": true, "attempts": 1, "last_outcome": "duplicate"},
            "state": stored.outbox(&e1, true).inbox(&e1, "pending", None).build(),
        }),
    })
}
