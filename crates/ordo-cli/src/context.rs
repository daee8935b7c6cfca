//! What every command shares: printing a result, the clock, and opening the
//! stores (SQLite files or PostgreSQL databases) with this process's
//! options. A leaf: it imports no command.

use std::sync::{Arc, OnceLock};

use ordo::{OpenSpec, Schema};
use ordo_core::{Clock, ErrorKind, FixedClock, ProducerName, StoreError, SystemClock};
use ordo_reservation::{consumer_schema, producer_schema};
use ordo_sqlite::{ConsumerDb, OpenOptions, ProducerDb};
use serde_json::Value;

use crate::args::{Files, Sides};
use crate::stores::{AnyConsumer, AnyProducer, Location};
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

/// `spec` with this process's clock and busy timeout.
fn with_process(spec: OpenSpec) -> OpenSpec {
    spec.clock(clock())
        .busy_timeout(open_options().busy_timeout)
}

/// `Ok(None)` for a store that does not exist.
fn unless_missing<T>(opened: Result<T, StoreError>) -> Result<Option<T>, StoreError> {
    match opened {
        Ok(store) => Ok(Some(store)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The specification of a store of `domain` (the reservation domain's
/// tables, or none for another domain: its application creates them).
fn schema(domain: &str, producer: bool) -> Result<Schema, Failure> {
    if domain == ordo_reservation::DOMAIN {
        return Ok(match producer {
            true => producer_schema(),
            false => consumer_schema(),
        });
    }
    Schema::new(domain).map_err(|e| Failure::Usage(format!("--domain {e}")))
}

/// Opens the producer store with [`clock`]: an existing store of any
/// domain, or a new one of the reservation domain.
pub fn open_producer(location: &Location) -> Result<AnyProducer, Failure> {
    open_producer_of(location, ordo_reservation::DOMAIN, None)
}

/// Opens the producer store with [`clock`]: an existing store of any
/// domain (left as it is), or a new one of `domain`; with `name`, created
/// with that name, and an existing one of another name refused.
pub fn open_producer_of(
    location: &Location,
    domain: &str,
    name: Option<&ProducerName>,
) -> Result<AnyProducer, Failure> {
    let spec = named(
        with_process(OpenSpec::existing_or_new(schema(domain, true)?)),
        name,
    );
    Ok(spec.producer(location)?)
}

/// Opens the consumer store with [`clock`]: an existing store of any
/// domain, or a new one of the reservation domain.
pub fn open_consumer(location: &Location) -> Result<AnyConsumer, Failure> {
    open_consumer_of(location, ordo_reservation::DOMAIN)
}

/// Opens the consumer store with [`clock`]: an existing store of any
/// domain (left as it is), or a new one of `domain`.
pub fn open_consumer_of(location: &Location, domain: &str) -> Result<AnyConsumer, Failure> {
    let spec = with_process(OpenSpec::existing_or_new(schema(domain, false)?));
    Ok(spec.consumer(location)?)
}

/// Opens the producer store if it exists (of any domain), creating
/// nothing: for the commands whose subject cannot be in a missing store.
pub fn producer_if_exists(location: &Location) -> Result<Option<AnyProducer>, Failure> {
    Ok(unless_missing(existing_spec().producer(location))?)
}

/// [`producer_if_exists`] for the consumer.
pub fn consumer_if_exists(location: &Location) -> Result<Option<AnyConsumer>, Failure> {
    Ok(unless_missing(existing_spec().consumer(location))?)
}

/// The specification of `init --adopt` (beside an application's own
/// tables in an SQLite file) for `domain`; a URL is refused.
fn adopting(location: &Location, domain: &str, producer: bool) -> Result<OpenSpec, Failure> {
    adoptable(location)?;
    Ok(with_process(OpenSpec::domain(schema(domain, producer)?)).adopt(true))
}

/// Opens the SQLite files of `init --adopt` (beside an application's own
/// tables) for `domain`; a URL is refused: a PostgreSQL store has its own
/// schemas, beside the application's, without adopting anything.
pub fn adopt_producer(
    location: &Location,
    domain: &str,
    name: Option<&ProducerName>,
) -> Result<AnyProducer, Failure> {
    Ok(named(adopting(location, domain, true)?, name).producer(location)?)
}

/// `spec` naming the producer store it opens, when a name is given.
fn named(spec: OpenSpec, name: Option<&ProducerName>) -> OpenSpec {
    match name {
        Some(name) => spec.producer_name(name.clone()),
        None => spec,
    }
}

/// [`adopt_producer`] for the consumer.
pub fn adopt_consumer(location: &Location, domain: &str) -> Result<AnyConsumer, Failure> {
    Ok(adopting(location, domain, false)?.consumer(location)?)
}

/// The file of `--adopt`; a URL is invalid input.
pub fn adoptable(location: &Location) -> Result<&std::path::Path, Failure> {
    location.file().ok_or_else(|| {
        Failure::Usage(format!(
            "--adopt is for SQLite files ({location} is a PostgreSQL database, whose ordo tables live in their own schemas beside the application's: run init without --adopt)"
        ))
    })
}

/// An existing store of any domain, as it is; nothing is created.
pub fn existing_spec() -> OpenSpec {
    with_process(OpenSpec::existing())
}

/// Opens an existing producer store of any domain; a missing one is
/// invalid input, and nothing is created.
pub fn open_existing_producer(location: &Location) -> Result<AnyProducer, Failure> {
    Ok(existing_producer(location)?)
}

/// [`open_existing_producer`] with the store's own error (for a store
/// opened again by a loop).
pub fn existing_producer(location: &Location) -> Result<AnyProducer, StoreError> {
    existing_spec().producer(location)
}

/// Opens an existing consumer store of any domain; a missing one is
/// invalid input, and nothing is created.
pub fn open_existing_consumer(location: &Location) -> Result<AnyConsumer, Failure> {
    Ok(existing_consumer(location)?)
}

/// [`open_existing_consumer`] with the store's own error (for a handle
/// opened while serving).
pub fn existing_consumer(location: &Location) -> Result<AnyConsumer, StoreError> {
    existing_spec().consumer(location)
}

/// Opens an existing consumer store of the reservation domain; a missing
/// one or one of another domain is invalid input, and nothing is written.
pub fn open_existing_reservation_consumer(location: &Location) -> Result<AnyConsumer, Failure> {
    let consumer = open_existing_consumer(location)?;
    refuse_other_domain(location, consumer.domain())?;
    // Opened again for its domain, whose migrations then run.
    drop(consumer);
    let spec = with_process(OpenSpec::domain(consumer_schema())).create(false);
    Ok(spec.consumer(location)?)
}

/// The domain of the producer store, if it exists.
pub fn existing_producer_domain(location: &Location) -> Result<Option<String>, Failure> {
    Ok(match location {
        Location::File(path) => ProducerDb::existing_domain(path)?,
        Location::Postgres(_) => producer_if_exists(location)?.map(|s| s.domain().to_owned()),
    })
}

/// The domain of the consumer store, if it exists.
pub fn existing_consumer_domain(location: &Location) -> Result<Option<String>, Failure> {
    Ok(match location {
        Location::File(path) => ConsumerDb::existing_domain(path)?,
        Location::Postgres(_) => consumer_if_exists(location)?.map(|s| s.domain().to_owned()),
    })
}

/// Opens (creating if missing) a producer store of the reservation domain,
/// for the commands that run its rules; a store of another domain is
/// invalid input, and nothing is written to it.
pub fn open_reservation_producer(location: &Location) -> Result<AnyProducer, Failure> {
    if let Some(domain) = existing_producer_domain(location)? {
        refuse_other_domain(location, &domain)?;
    }
    Ok(with_process(OpenSpec::domain(producer_schema())).producer(location)?)
}

/// Opens (creating if missing) a consumer store of the reservation domain,
/// for the commands that run its handler; a store of another domain is
/// invalid input, and nothing is written to it.
pub fn open_reservation_consumer(location: &Location) -> Result<AnyConsumer, Failure> {
    if let Some(domain) = existing_consumer_domain(location)? {
        refuse_other_domain(location, &domain)?;
    }
    Ok(with_process(OpenSpec::domain(consumer_schema())).consumer(location)?)
}

/// Refuses a store whose domain is not the reservation domain.
fn refuse_other_domain(location: &Location, domain: &str) -> Result<(), Failure> {
    if domain == ordo_reservation::DOMAIN {
        return Ok(());
    }
    Err(Failure::Usage(format!(
        "{location} belongs to domain \"{domain}\"; its handler runs in the application"
    )))
}

/// Refuses one file for both roles, by any name (symbolic links, `..`, hard
/// links), before anything is opened or created. One PostgreSQL database
/// holds both roles in their own schemas.
pub fn check_distinct(files: &Files) -> Result<(), Failure> {
    let (Some(producer), Some(consumer)) = (files.producer.file(), files.consumer.file()) else {
        return Ok(());
    };
    if ordo_sqlite::same_file(producer, consumer)? {
        return Err(Failure::Usage(format!(
            "--producer and --consumer must be different files ({} and {} are the same file)",
            producer.display(),
            consumer.display()
        )));
    }
    Ok(())
}

/// Checks, before anything is created, that an existing producer store is
/// one: a foreign file, the other role or a newer version is refused; a
/// URL must parse and its server answer.
pub fn check_producer(location: &Location) -> Result<(), Failure> {
    match location {
        Location::File(path) => ProducerDb::check_existing(path)?,
        Location::Postgres(_) => {
            producer_if_exists(location)?;
        }
    }
    Ok(())
}

/// [`check_producer`] for the consumer.
pub fn check_consumer(location: &Location) -> Result<(), Failure> {
    match location {
        Location::File(path) => ConsumerDb::check_existing(path)?,
        Location::Postgres(_) => {
            consumer_if_exists(location)?;
        }
    }
    Ok(())
}

/// Refuses one file for both sides, and checks every given store before
/// any is opened (and so created).
pub fn check_sides(sides: &Sides) -> Result<(), Failure> {
    if let Some(files) = sides.both() {
        check_distinct(&files)?;
    }
    if let Some(location) = &sides.producer {
        check_producer(location)?;
    }
    if let Some(location) = &sides.consumer {
        check_consumer(location)?;
    }
    Ok(())
}

pub fn open_both(files: &Files) -> Result<(AnyProducer, AnyConsumer), Failure> {
    check_distinct(files)?;
    // Both stores are checked before either is created or changed.
    check_producer(&files.producer)?;
    check_consumer(&files.consumer)?;
    let producer = open_producer(&files.producer)?;
    let consumer = open_consumer(&files.consumer)?;
    Ok((producer, consumer))
}
