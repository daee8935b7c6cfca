//! Scenarios of the HTTP transport (HTTP.md), reported apart: an `ordo
//! serve` child receives what `ordo relay --to` posts, and a crash on
//! either side of the wire between the receive commit and the relay's mark
//! is recovered by the relay's retry, answered `duplicate`. Relays run at a
//! fixed clock (`ORDO_NOW_MS`), so the backoff after a failure is exact.

use ordo_core::crash;
use serde_json::{json, Value};

use std::time::Duration;

use super::child::{deliver_stdin, finish, wait, Ctx, Run, NOW_ENV};
use super::expect::{event, Expect};
use super::scenarios::{relayed, Outcome, ScenarioFn};
use crate::serve::{loopback_any, ServeSpec, Served};

/// Every scenario of the transport.
pub const TRANSPORT: [(&str, ScenarioFn); 2] = [
    ("crash_serve_after_commit", crash_serve_after_commit),
    (
        "crash_relay_after_receive_over_http",
        crash_relay_after_receive_over_http,
    ),
];

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
    for args in [
        &["init", "--consumer", "{C}"][..],
        &[
            "advance",
            "--producer",
            "{P}",
            "--flow",
            "a",
            "--expected-seq",
            "0",
            "--to",
            "reserved",
            "--quantity",
            "5",
        ][..],
    ] {
        let run = run_with(ctx, args, None, &now)?;
        if run.code != 0 {
            return Err(format!(
                "`ordo {}` exited {}: {}",
                args.join(" "),
                run.code,
                run.stderr.trim()
            ));
        }
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

/// `ordo relay --to` the server at `now_ms`, with `crash_point` armed.
fn relay_to(
    ctx: &Ctx,
    served: &Served,
    now_ms: i64,
    crash_point: Option<&str>,
) -> Result<Run, String> {
    let url = served.url();
    let args = ["relay", "--producer", "{P}", "--to", url.as_str()];
    run_with(ctx, &args, crash_point, &[(NOW_ENV, now_ms.to_string())])
}

fn serve(ctx: &Ctx, crash_point: Option<&str>) -> Result<Served, String> {
    let consumer = ctx.consumer();
    let log = ctx.dir.join("serve.log");
    crate::serve::start(&ServeSpec {
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

/// The server exits at `serve.after_commit`: `a-1` is stored but the relay
/// gets no response, a transient failure (exit 0, nothing marked). A server
/// started again answers the retry `duplicate`, and `a-1` is accepted.
fn crash_serve_after_commit(ctx: &Ctx) -> Result<Outcome, String> {
    let e1 = prepare(ctx)?;
    let mut crashing = serve(ctx, Some(crash::SERVE_AFTER_COMMIT))?;
    let first = relay_to(ctx, &crashing, T0, None);
    let serve_status = wait(&mut crashing.child, "serve", CRASH_EXIT_WAIT);
    crashing.stop();
    let (first, serve_status) = (first?, serve_status?);
    let after_crash = ctx.snapshot()?;
    let after_crash_bookkeeping = bookkeeping(ctx)?;
    let served = serve(ctx, None)?;
    let retry = relay_to(ctx, &served, T0 + LATER_MS, None);
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

/// The relay exits at `relay.after_receive` with the server's 200 in hand,
/// before marking: `a-1` is stored and not accepted. The retry over HTTP is
/// answered `duplicate`, and `a-1` is accepted.
fn crash_relay_after_receive_over_http(ctx: &Ctx) -> Result<Outcome, String> {
    let e1 = prepare(ctx)?;
    let served = serve(ctx, None)?;
    let crashed = relay_to(ctx, &served, T0, Some(crash::RELAY_AFTER_RECEIVE));
    let after_crash = ctx.snapshot();
    let retry = relay_to(ctx, &served, T0 + LATER_MS, None);
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
