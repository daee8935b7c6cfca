//! `ordo effects run`: the built-in webhook executor (EFFECTS.md "The
//! built-in webhook executor"): the runtime's [`Executor`] running the
//! intents named `webhook` with `ordo_http`'s [`Webhook`], under the policy
//! the flags give, once (what is due) or with `--follow` until a signal.
//!
//! Invariant: the store is never created, and every flag is checked before
//! it is opened; a signal stops the executor between rounds, so an attempt
//! in progress is recorded before the process exits.

use std::sync::Arc;

use clap::Args;
use ordo_core::effect::{Answer, EffectCounts, EffectOps, EffectPolicy, EffectStore};
use ordo_core::StoreError;
use ordo_http::webhook::WEBHOOK_EFFECT;
use ordo_http::{AllowedUrls, Metrics, Webhook};
use ordo_runtime::{Effect, EffectRound, Executor, Reopen, Runner, RunnerOptions};
use serde_json::json;

use crate::context::{clock, existing_consumer, open_existing_consumer};
use crate::follow::{print_line, watch, Exposition, Stop};
use crate::stores::{AnyConsumer, Location};
use crate::Failure;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The consumer store: an SQLite file or a postgres:// URL (never created).
    #[arg(long, value_name = "C")]
    pub consumer: Location,
    /// Call only URLs under these prefixes (scheme, host and port equal, path at a `/` boundary); at least one.
    #[arg(long, value_name = "PREFIX", required = true, num_args = 1..)]
    pub allow_url_prefix: Vec<String>,
    /// Keep running, waking as soon as there is work, until SIGTERM or SIGINT.
    #[arg(long)]
    pub follow: bool,
    /// With --follow, serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR", requires = "follow")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The endpoint deduplicates by Idempotency-Key for this long (default: it does not).
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub dedup_window: Option<std::time::Duration>,
    /// Attempts per intent before it fails, 1..=1000.
    #[arg(long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=ordo_core::effect::MAX_ATTEMPTS_MAX as i64))]
    pub max_attempts: u32,
    /// Give up on a call after MS milliseconds (its outcome is then unknown).
    #[arg(long, value_name = "MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: u64,
    /// Hold a claimed intent for MS milliseconds; at least --timeout-ms + 5000.
    #[arg(long, value_name = "MS", default_value_t = 30_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub lease_ms: u64,
}

fn duration(value: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(value)
        .map_err(|e| format!("must be a duration such as 24h or 30m ({e})"))
}

/// Runs the executor: what is due once, or until told to stop with
/// `--follow`.
pub fn run(json_mode: bool, args: &RunArgs) -> Result<(), Failure> {
    let policy = policy(args)?;
    let allowed =
        AllowedUrls::new(&args.allow_url_prefix).map_err(|e| Failure::Usage(e.to_string()))?;
    let consumer = open_existing_consumer(&args.consumer)?;
    if args.follow {
        return follow(json_mode, args, consumer, allowed, policy);
    }
    let mut executor = executor(allowed, policy, None)?;
    let total = match consumer {
        AnyConsumer::Sqlite(mut db) => until_idle(&mut executor, &mut db)?,
        AnyConsumer::Postgres(mut pg) => until_idle(&mut executor, &mut pg)?,
    };
    let value = counts(&total);
    crate::context::emit(json_mode, &value, || {
        format!(
            "attempted {}: succeeded {}, failed {}, retried {}, unknown {}",
            total.attempted, total.succeeded, total.failed, total.retried, total.unknown
        )
    });
    Ok(())
}

/// The webhook's policy from the flags; a lease not at least
/// [`LEASE_MARGIN_MS_MIN`](ordo_core::effect::LEASE_MARGIN_MS_MIN) longer
/// than the timeout is invalid input.
fn policy(args: &RunArgs) -> Result<EffectPolicy, Failure> {
    let margin = ordo_core::effect::LEASE_MARGIN_MS_MIN;
    if args.lease_ms < args.timeout_ms.saturating_add(margin) {
        return Err(Failure::Usage(format!(
            "--lease-ms must exceed --timeout-ms by at least {margin} (got {} and {})",
            args.lease_ms, args.timeout_ms
        )));
    }
    let dedup_window_ms = args
        .dedup_window
        .map(|window| u64::try_from(window.as_millis()).unwrap_or(u64::MAX));
    EffectPolicy {
        max_attempts: args.max_attempts,
        dedup_window_ms,
        ordered: true,
        timeout_ms: args.timeout_ms,
        lease_ms: args.lease_ms,
    }
    .checked()
    .map_err(|e| Failure::Usage(e.rule))
}

/// An executor running `webhook` intents with the webhook client, each
/// call counted in `metrics` when given.
fn executor(
    allowed: AllowedUrls,
    policy: EffectPolicy,
    metrics: Option<Arc<Metrics>>,
) -> Result<Executor, Failure> {
    let webhook = Webhook::new(allowed, &policy).map_err(|e| Failure::Internal(e.to_string()))?;
    if let Some(metrics) = &metrics {
        metrics.expect_effect(WEBHOOK_EFFECT);
    }
    let owner = format!("ordo-effects-run-{}", std::process::id());
    let mut executor = Executor::new(owner, clock());
    let call = move |effect: &Effect| {
        let answer = webhook.call(effect.key.as_str(), effect.attempt, &effect.request);
        if let Some(metrics) = &metrics {
            metrics.count_effect_attempt(WEBHOOK_EFFECT, outcome(&answer));
        }
        answer
    };
    executor
        .register(WEBHOOK_EFFECT, policy, call)
        .map_err(|e| Failure::Usage(e.rule))?;
    Ok(executor)
}

/// The `outcome` label of an answer.
fn outcome(answer: &Answer) -> &'static str {
    match answer {
        Answer::Succeeded(_) => "succeeded",
        Answer::Retry { .. } => "retry",
        Answer::Failed(_) => "failed",
        Answer::Unknown(_) => "unknown",
    }
}

/// Rounds until one does nothing: every intent due is attempted (those a
/// retry made due again too, up to their attempts), and the totals.
fn until_idle<S: EffectStore>(
    executor: &mut Executor,
    store: &mut S,
) -> Result<EffectRound, StoreError> {
    let mut total = EffectRound::default();
    loop {
        let round = executor.run_once(store)?;
        if round == EffectRound::default() {
            return Ok(total);
        }
        total.add(&round);
    }
}

/// The counts of `round` as `--json` prints them.
fn counts(round: &EffectRound) -> serde_json::Value {
    json!({
        "attempted": round.attempted,
        "succeeded": round.succeeded,
        "failed": round.failed,
        "retried": round.retried,
        "unknown": round.unknown,
    })
}

/// `--follow`: the runtime's effects loop until SIGTERM or SIGINT, one line
/// per round that did anything, and the metrics.
fn follow(
    json_mode: bool,
    args: &RunArgs,
    consumer: AnyConsumer,
    allowed: AllowedUrls,
    policy: EffectPolicy,
) -> Result<(), Failure> {
    let mut gauges = open_existing_consumer(&args.consumer)?;
    let stop = Stop::install()?;
    let exposition = Exposition::start(args.metrics_listen)?;
    let metrics = exposition.metrics.clone();
    let executor = executor(allowed, policy, metrics.clone())?;
    let mut round_no = 0u64;
    let observe = move |round: &EffectRound| {
        round_no += 1;
        print_line(&round_line(json_mode, round_no, round));
    };
    let running = start(consumer, &args.consumer, executor, observe)
        .map_err(|e| Failure::Internal(format!("cannot start the effects loop: {e}")))?;
    watch(&stop, &running, || {
        if let Some(metrics) = &metrics {
            metrics.set_effects(&effect_counts(&mut gauges)?);
        }
        Ok(())
    });
    crate::running::stop(running)?;
    exposition.stop();
    Ok(())
}

/// Starts the effects loop of `consumer`, opened from `location` (again,
/// after a lost connection to a PostgreSQL store).
fn start(
    consumer: AnyConsumer,
    location: &Location,
    executor: Executor,
    observe: impl FnMut(&EffectRound) + Send + 'static,
) -> std::io::Result<Runner> {
    let mut runner = Runner::new(RunnerOptions::default());
    match consumer {
        AnyConsumer::Sqlite(db) => runner.spawn_effects(db, None, executor, observe)?,
        AnyConsumer::Postgres(pg) => {
            let at = location.clone();
            let reopen: Reopen<_> = Box::new(move || match existing_consumer(&at)? {
                AnyConsumer::Postgres(pg) => Ok(pg),
                AnyConsumer::Sqlite(_) => unreachable!("a URL opens a PostgreSQL store"),
            });
            runner.spawn_effects(pg, Some(reopen), executor, observe)?
        }
    }
    Ok(runner)
}

/// The intents of `consumer` by state, now.
fn effect_counts(consumer: &mut AnyConsumer) -> Result<EffectCounts, StoreError> {
    let now_ms = clock().now_ms();
    match consumer {
        AnyConsumer::Sqlite(db) => db.effect_counts(now_ms),
        AnyConsumer::Postgres(pg) => pg.effect_counts(now_ms),
    }
}

/// The line of one `--follow` round.
fn round_line(json_mode: bool, round_no: u64, round: &EffectRound) -> String {
    if json_mode {
        let mut value = counts(round);
        value["round"] = json!(round_no);
        value.to_string()
    } else {
        format!(
            "round {round_no}: attempted {}, succeeded {}, failed {}, retried {}, unknown {}",
            round.attempted, round.succeeded, round.failed, round.retried, round.unknown
        )
    }
}
