//! Logs on stderr through `tracing`: `--log-format text|json`, the level
//! from `RUST_LOG` (default `info` for long-running modes, `warn`
//! otherwise).
//!
//! Invariant: logs never go to stdout, which carries the command's result;
//! the final `error: ...` line is printed after them, in plain text.

use tracing_subscriber::EnvFilter;

use crate::args::{Command, LogFormat};

/// Whether `command` keeps running until told to stop.
pub fn long_running(command: &Command) -> bool {
    match command {
        Command::Serve(_) | Command::Console(_) => true,
        Command::Relay(args) => args.follow,
        Command::Apply(args) => args.follow,
        Command::Effects {
            command: crate::effects::EffectsCommand::Run(args),
        } => args.follow,
        _ => false,
    }
}

/// Installs the process's log subscriber; once, before any command runs.
pub fn init(format: LogFormat, long_running: bool) {
    let default = if long_running { "info" } else { "warn" };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    // Only a second init fails; the first subscriber stays.
    drop(installed);
}
