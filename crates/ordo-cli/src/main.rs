//! The `ordo` command line. Parses flags, calls the library, prints text or
//! JSON. Exit status: 0 for any protocol outcome, 2 for invalid input or
//! usage (nothing written), 1 for a storage or internal error.

mod args;
mod commands;
mod demo;
mod experiment;
mod render;

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
            ordo_core::ErrorKind::Incompatible => Failure::Usage(error.to_string()),
            _ => Failure::Internal(error.to_string()),
        }
    }
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
            if error.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = error.print();
                return ExitCode::from(2);
            }
            let rendered = error.render().to_string();
            let first = rendered
                .lines()
                .find(|line| !line.trim().is_empty())
                .unwrap_or("invalid usage");
            let message = first.strip_prefix("error: ").unwrap_or(first);
            return Failure::Usage(message.to_owned()).exit();
        }
    };
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.exit(),
    }
}
