//! The `ordo` command line. Parses flags, calls the library, prints text or
//! JSON. Exit status: 0 for any protocol outcome, 2 for invalid input or
//! usage (nothing written), 1 for a storage or internal error.

mod args;
mod commands;
mod console;
mod context;
mod destinations;
mod effects;
mod effects_run;
mod follow;
mod lab;
mod logging;
mod metered;
mod ops;
mod remote;
mod render;
mod render_destinations;
mod render_lab;
mod render_producers;
mod render_topology;
mod running;
mod serve;
mod stores;

use std::process::ExitCode;

use clap::Parser;

use crate::args::Cli;

/// A command's failure, by exit status.
#[derive(Debug)]
pub enum Failure {
    /// Invalid input or usage: exit 2, nothing written.
    Usage(String),
    /// A storage or internal error: exit 1.
    Internal(String),
    /// A self-check found a mismatch (`experiment --check`, `demo`): exit 1.
    Check(String),
}

impl Failure {
    fn exit(self) -> ExitCode {
        let (message, status) = match self {
            Failure::Usage(message) => (message, 2),
            Failure::Internal(message) | Failure::Check(message) => (message, 1),
        };
        eprintln!("error: {}", message.replace('\n', " "));
        ExitCode::from(status)
    }
}

impl From<ordo_core::StoreError> for Failure {
    fn from(error: ordo_core::StoreError) -> Self {
        match error.kind() {
            ordo_core::ErrorKind::Incompatible
            | ordo_core::ErrorKind::NotFound
            | ordo_core::ErrorKind::InvalidInput => Failure::Usage(error.to_string()),
            _ => Failure::Internal(error.to_string()),
        }
    }
}

/// One line for a clap error, naming the flag or command concerned (the
/// contract's "one line `error: ...`"): clap's own first line, completed with
/// the missing arguments or the available commands where clap lists them on
/// later lines.
fn usage_message(error: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    match error.kind() {
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => {
            let commands: Vec<String> = <Cli as clap::CommandFactory>::command()
                .get_subcommands()
                .filter(|c| !c.is_hide_set())
                .map(|c| c.get_name().to_owned())
                .collect();
            return format!("a command is required, one of: {}", commands.join(", "));
        }
        ErrorKind::MissingRequiredArgument => {
            if let Some(ContextValue::Strings(args)) = error.get(ContextKind::InvalidArg) {
                return format!(
                    "the following required arguments were not provided: {}",
                    args.join(", ")
                );
            }
        }
        _ => {}
    }
    let rendered = error.render().to_string();
    let first = rendered
        .lines()
        .find(|line| !line.trim().is_empty())
        .unwrap_or("invalid usage");
    let first = first.strip_prefix("error: ").unwrap_or(first).to_owned();
    match suggestion(error) {
        Some(suggested) => format!("{first}; did you mean {suggested}?"),
        None => first,
    }
}

/// clap's suggestion for a mistyped command or flag (`'relay'`,
/// `'--producer'`), if it has one.
fn suggestion(error: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    [ContextKind::SuggestedSubcommand, ContextKind::SuggestedArg]
        .into_iter()
        .find_map(|kind| match error.get(kind)? {
            ContextValue::String(s) => Some(format!("'{s}'")),
            ContextValue::Strings(list) => list.first().map(|s| format!("'{s}'")),
            _ => None,
        })
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            use clap::error::ErrorKind;
            if matches!(
                error.kind(),
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
            ) {
                let _ = error.print();
                return ExitCode::SUCCESS;
            }
            return Failure::Usage(usage_message(&error)).exit();
        }
    };
    logging::init(cli.log_format, logging::long_running(&cli.command));
    match commands::run(cli) {
        Ok(status) => ExitCode::from(status),
        Err(failure) => failure.exit(),
    }
}
