//! `applier STORE`: the application's own applier process, for a domain of
//! its own (`ledger`: one row per applied event), deployed beside `ordo
//! serve`, which receives into the same store. STORE is an SQLite file or a
//! `postgres://` URL; the store is created (or migrated) for the domain.
//!
//! It prints `applying STORE` once the loop runs, then `applied N` for
//! every page that applied N events; on SIGTERM or SIGINT it stops after
//! the page in progress, prints `stopped after N applied` and exits 0. A
//! restart goes on from the store: an event is never applied twice. Exit 1
//! when the store fails, 2 on bad arguments.

mod ledger;

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ordo::runtime::{ApplyRound, Runner, RunnerOptions};
use ordo::{Location, OpenSpec, StoreError};

/// How often the main thread looks at the stop flag and the loop.
const WATCH: Duration = Duration::from_millis(50);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [store] = args.as_slice() else {
        eprintln!("usage: applier STORE (an SQLite file or a postgres:// URL)");
        return ExitCode::from(2);
    };
    match run(store) {
        Ok(applied) => {
            say(&format!("stopped after {applied} applied"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("applier: {e}");
            ExitCode::from(1)
        }
    }
}

/// Runs the apply loop on `store` until asked to stop; how many events it
/// applied.
fn run(store: &str) -> Result<u64, StoreError> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .map_err(|e| StoreError::new(ordo_core::ErrorKind::Other, e.to_string()))?;
    }
    let runner = start(store)?;
    say(&format!("applying {store}"));
    while !stop.load(Ordering::Acquire) && !runner.failed() {
        std::thread::sleep(WATCH);
    }
    Ok(runner.stop()?.apply.applied)
}

/// The runner with its apply loop on the store, whichever backend holds it.
fn start(store: &str) -> Result<Runner, StoreError> {
    let mut runner = Runner::new(RunnerOptions::default());
    let spec = OpenSpec::domain(ledger::schema());
    spec.run_apply(&mut runner, &Location::from(store), ledger::Ledger, report)?;
    Ok(runner)
}

fn report(round: &ApplyRound) {
    if round.totals.applied > 0 {
        say(&format!("applied {}", round.totals.applied));
    }
}

/// One line on stdout, flushed at once (a test reads it as it comes).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}
