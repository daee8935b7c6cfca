//! `ordo effects run`: the built-in webhook executor (EFFECTS.md "The
//! built-in webhook executor"). Its flags are CLI.md's; the executor itself
//! is not part of this build yet.

use clap::Args;

use crate::stores::Location;
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
    let _ = json_mode;
    if args.lease_ms < args.timeout_ms + ordo_core::effect::LEASE_MARGIN_MS_MIN {
        return Err(Failure::Usage(format!(
            "--lease-ms must exceed --timeout-ms by at least {} (got {} and {})",
            ordo_core::effect::LEASE_MARGIN_MS_MIN,
            args.lease_ms,
            args.timeout_ms
        )));
    }
    Err(Failure::Internal(
        "ordo effects run is not available in this build".into(),
    ))
}
