//! What every command shares: printing a result, the clock, and opening the
//! stores with this process's options. A leaf: it imports no command.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use ordo_core::{Clock, FixedClock, SystemClock};
use ordo_reservation::{consumer_schema, producer_schema};
use ordo_sqlite::{ConsumerDb, OpenOptions, ProducerDb};
use serde_json::Value;

use crate::args::{Files, Sides};
use crate::Failure;

/// Prints a result: the JSON document with `--json`, else the text. A
/// reader that closed the pipe early (`ordo snapshot | head`) ends the
/// output quietly; the command's work is done either way.
pub fn emit(json_mode: bool, value: &Value, text: impl FnOnce() -> String) {
    use std::io::Write;
    let text = if json_mode { value.to_string() } else { text() };
    if text.is_empty() {
        return;
    }
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        // Anything else is as `println!` would make it.
        Err(e) => panic!("failed printing to stdout: {e}"),
        Ok(()) => {}
    }
}

/// The time `ORDO_NOW_MS` fixes, if set: milliseconds since the Unix epoch
/// as an integer. Anything else, including bytes that are not UTF-8, is
/// invalid input.
pub fn fixed_now_ms() -> Result<Option<i64>, Failure> {
    let Some(raw) = std::env::var_os("ORDO_NOW_MS") else {
        return Ok(None);
    };
    let refuse = || {
        Failure::Usage(format!(
            "ORDO_NOW_MS must be milliseconds since the Unix epoch as an integer (got {:?})",
            raw.to_string_lossy()
        ))
    };
    let text = raw.to_str().ok_or_else(refuse)?;
    text.parse::<i64>().map(Some).map_err(|_| refuse())
}

/// The clock every command uses: the system's, unless `ORDO_NOW_MS` fixes
/// the time (milliseconds since the Unix epoch) for tests and replays.
pub fn clock() -> Arc<dyn Clock> {
    match fixed_now_ms() {
        Ok(Some(now_ms)) => Arc::new(FixedClock(now_ms)),
        // Checked by `run` before any command starts.
        Ok(None) | Err(_) => Arc::new(SystemClock),
    }
}

/// The options of every store this process opens (`--busy-timeout-ms`).
static OPEN_OPTIONS: OnceLock<OpenOptions> = OnceLock::new();

/// Sets the options of every store this process opens; once per process.
pub fn set_open_options(options: OpenOptions) {
    OPEN_OPTIONS
        .set(options)
        .expect("the open options are set once per process");
}

pub fn open_options() -> OpenOptions {
    OPEN_OPTIONS.get().cloned().unwrap_or_default()
}

/// Opens the producer file with [`clock`]: an existing store of any domain,
/// or a new one of the reservation domain.
pub fn open_producer(path: &Path) -> Result<ProducerDb, Failure> {
    Ok(ProducerDb::open_or_create(
        path,
        &producer_schema(),
        clock(),
        &open_options(),
    )?)
}

/// Opens the consumer file with [`clock`]: an existing store of any domain,
/// or a new one of the reservation domain.
pub fn open_consumer(path: &Path) -> Result<ConsumerDb, Failure> {
    Ok(ConsumerDb::open_or_create(
        path,
        &consumer_schema(),
        clock(),
        &open_options(),
    )?)
}

/// The options of [`open_options`] that refuse a missing store: for the
/// commands that serve or follow a store, so that a mistyped path cannot
/// start an empty one.
fn existing_only() -> OpenOptions {
    OpenOptions {
        create: false,
        ..open_options()
    }
}

/// Opens an existing producer store of any domain; a missing one is
/// invalid input, and nothing is created.
pub fn open_existing_producer(path: &Path) -> Result<ProducerDb, Failure> {
    Ok(ProducerDb::open_existing(path, clock(), &existing_only())?)
}

/// Opens an existing consumer store of any domain; a missing one is
/// invalid input, and nothing is created.
pub fn open_existing_consumer(path: &Path) -> Result<ConsumerDb, Failure> {
    Ok(ConsumerDb::open_existing(path, clock(), &existing_only())?)
}

/// Opens an existing consumer store of the reservation domain; a missing
/// one or one of another domain is invalid input, and nothing is written.
pub fn open_existing_reservation_consumer(path: &Path) -> Result<ConsumerDb, Failure> {
    let consumer = open_existing_consumer(path)?;
    refuse_other_domain(path, consumer.domain())?;
    Ok(consumer)
}

/// Opens (creating if missing) a producer store of the reservation domain,
/// for the commands that run its rules; a store of another domain is
/// invalid input, and nothing is written to it.
pub fn open_reservation_producer(path: &Path) -> Result<ProducerDb, Failure> {
    if let Some(domain) = ProducerDb::existing_domain(path)? {
        refuse_other_domain(path, &domain)?;
    }
    Ok(ProducerDb::open_with(
        path,
        &producer_schema(),
        clock(),
        &open_options(),
    )?)
}

/// Opens (creating if missing) a consumer store of the reservation domain,
/// for the commands that run its handler; a store of another domain is
/// invalid input, and nothing is written to it.
pub fn open_reservation_consumer(path: &Path) -> Result<ConsumerDb, Failure> {
    if let Some(domain) = ConsumerDb::existing_domain(path)? {
        refuse_other_domain(path, &domain)?;
    }
    Ok(ConsumerDb::open_with(
        path,
        &consumer_schema(),
        clock(),
        &open_options(),
    )?)
}

/// Refuses a store whose domain is not the reservation domain.
fn refuse_other_domain(path: &Path, domain: &str) -> Result<(), Failure> {
    if domain == ordo_reservation::DOMAIN {
        return Ok(());
    }
    Err(Failure::Usage(format!(
        "{} belongs to domain \"{domain}\"; its handler runs in the application",
        path.display()
    )))
}

/// Refuses one file for both roles, by any name (symbolic links, `..`, hard
/// links), before anything is opened or created.
pub fn check_distinct(files: &Files) -> Result<(), Failure> {
    if ordo_sqlite::same_file(&files.producer, &files.consumer)? {
        return Err(Failure::Usage(format!(
            "--producer and --consumer must be different files ({} and {} are the same file)",
            files.producer.display(),
            files.consumer.display()
        )));
    }
    Ok(())
}

/// Refuses one file for both sides, and checks every given file before
/// any is opened (and so created).
pub fn check_sides(sides: &Sides) -> Result<(), Failure> {
    if let Some(files) = sides.both() {
        check_distinct(&files)?;
    }
    if let Some(path) = &sides.producer {
        ProducerDb::check_existing(path)?;
    }
    if let Some(path) = &sides.consumer {
        ConsumerDb::check_existing(path)?;
    }
    Ok(())
}

pub fn open_both(files: &Files) -> Result<(ProducerDb, ConsumerDb), Failure> {
    check_distinct(files)?;
    // Both files are checked before either is created or changed.
    ProducerDb::check_existing(&files.producer)?;
    ConsumerDb::check_existing(&files.consumer)?;
    let producer = open_producer(&files.producer)?;
    let consumer = open_consumer(&files.consumer)?;
    Ok((producer, consumer))
}
