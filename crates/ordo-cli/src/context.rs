//! What every command shares: printing a result, the clock, and opening the
//! stores (SQLite files or PostgreSQL databases) with this process's
//! options. A leaf: it imports no command.

use std::sync::{Arc, OnceLock};

use ordo_core::{Clock, ErrorKind, FixedClock, StoreError, SystemClock};
use ordo_postgres::{PgConsumer, PgOptions, PgProducer};
use ordo_reservation::postgres::{pg_consumer_schema, pg_producer_schema};
use ordo_reservation::{consumer_schema, producer_schema};
use ordo_sqlite::{ConsumerDb, OpenOptions, ProducerDb};
use serde_json::Value;

use crate::args::{Files, Sides};
use crate::stores::{redact, AnyConsumer, AnyProducer, Location};
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

/// The options of every PostgreSQL store this process opens: the default
/// schemas (`ordo_producer`, `ordo_consumer`), creating what is missing.
fn pg_options() -> PgOptions {
    PgOptions::default()
}

/// [`pg_options`] that never create anything.
fn pg_existing_only() -> PgOptions {
    PgOptions {
        create: false,
        ..pg_options()
    }
}

/// A PostgreSQL store's error, naming the server (never its password)
/// when the message does not already.
fn on_server<T>(url: &str, opened: Result<T, StoreError>) -> Result<T, StoreError> {
    opened.map_err(|e| {
        let message = e.to_string();
        if message.contains("://") || e.kind() == ErrorKind::InvalidInput {
            return e;
        }
        StoreError::new(e.kind(), format!("{}: {message}", redact(url)))
    })
}

/// `Ok(None)` for a store that does not exist.
fn unless_missing<T>(opened: Result<T, StoreError>) -> Result<Option<T>, StoreError> {
    match opened {
        Ok(store) => Ok(Some(store)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn pg_existing_producer(url: &str) -> Result<Option<PgProducer>, StoreError> {
    unless_missing(on_server(
        url,
        PgProducer::open_existing(url, clock(), &pg_existing_only()),
    ))
}

fn pg_existing_consumer(url: &str) -> Result<Option<PgConsumer>, StoreError> {
    unless_missing(on_server(
        url,
        PgConsumer::open_existing(url, clock(), &pg_existing_only()),
    ))
}

/// The tables of a new store of `domain` on each backend, for the
/// producer (`producer`) or the consumer: the reservation domain's own, or
/// none for another domain (its application creates them).
fn schemas(
    domain: &str,
    producer: bool,
) -> Result<(ordo_sqlite::Schema, ordo_postgres::Schema), Failure> {
    if domain == ordo_reservation::DOMAIN {
        return Ok(match producer {
            true => (producer_schema(), pg_producer_schema()),
            false => (consumer_schema(), pg_consumer_schema()),
        });
    }
    let invalid = |e: ordo_core::RuleViolation| Failure::Usage(format!("--domain {e}"));
    Ok((
        ordo_sqlite::Schema::new(domain).map_err(invalid)?,
        ordo_postgres::Schema::new(domain).map_err(invalid)?,
    ))
}

/// Opens the producer store with [`clock`]: an existing store of any
/// domain, or a new one of the reservation domain.
pub fn open_producer(location: &Location) -> Result<AnyProducer, Failure> {
    open_producer_of(location, ordo_reservation::DOMAIN)
}

/// Opens the producer store with [`clock`]: an existing store of any
/// domain (left as it is), or a new one of `domain`.
pub fn open_producer_of(location: &Location, domain: &str) -> Result<AnyProducer, Failure> {
    let (sqlite, pg) = schemas(domain, true)?;
    Ok(match location {
        Location::File(path) => AnyProducer::Sqlite(ProducerDb::open_or_create(
            path,
            &sqlite,
            clock(),
            &open_options(),
        )?),
        Location::Postgres(url) => AnyProducer::Postgres(match pg_existing_producer(url)? {
            Some(store) => store,
            None => on_server(url, PgProducer::open_with(url, &pg, clock(), &pg_options()))?,
        }),
    })
}

/// Opens the consumer store with [`clock`]: an existing store of any
/// domain, or a new one of the reservation domain.
pub fn open_consumer(location: &Location) -> Result<AnyConsumer, Failure> {
    open_consumer_of(location, ordo_reservation::DOMAIN)
}

/// Opens the consumer store with [`clock`]: an existing store of any
/// domain (left as it is), or a new one of `domain`.
pub fn open_consumer_of(location: &Location, domain: &str) -> Result<AnyConsumer, Failure> {
    let (sqlite, pg) = schemas(domain, false)?;
    Ok(match location {
        Location::File(path) => AnyConsumer::Sqlite(ConsumerDb::open_or_create(
            path,
            &sqlite,
            clock(),
            &open_options(),
        )?),
        Location::Postgres(url) => AnyConsumer::Postgres(match pg_existing_consumer(url)? {
            Some(store) => store,
            None => on_server(url, PgConsumer::open_with(url, &pg, clock(), &pg_options()))?,
        }),
    })
}

/// Opens the producer store if it exists (of any domain), creating
/// nothing: for the commands whose subject cannot be in a missing store.
pub fn producer_if_exists(location: &Location) -> Result<Option<AnyProducer>, Failure> {
    match location {
        Location::File(path) if !path.exists() => Ok(None),
        Location::File(_) => open_producer(location).map(Some),
        Location::Postgres(url) => Ok(pg_existing_producer(url)?.map(AnyProducer::Postgres)),
    }
}

/// [`producer_if_exists`] for the consumer.
pub fn consumer_if_exists(location: &Location) -> Result<Option<AnyConsumer>, Failure> {
    match location {
        Location::File(path) if !path.exists() => Ok(None),
        Location::File(_) => open_consumer(location).map(Some),
        Location::Postgres(url) => Ok(pg_existing_consumer(url)?.map(AnyConsumer::Postgres)),
    }
}

/// Opens the SQLite files of `init --adopt` (beside an application's own
/// tables) for `domain`; a URL is refused: a PostgreSQL store has its own
/// schemas, beside the application's, without adopting anything.
pub fn adopt_producer(location: &Location, domain: &str) -> Result<AnyProducer, Failure> {
    let path = adoptable(location)?;
    let options = OpenOptions {
        adopt: true,
        ..open_options()
    };
    let (schema, _) = schemas(domain, true)?;
    Ok(AnyProducer::Sqlite(ProducerDb::open_with(
        path,
        &schema,
        clock(),
        &options,
    )?))
}

/// [`adopt_producer`] for the consumer.
pub fn adopt_consumer(location: &Location, domain: &str) -> Result<AnyConsumer, Failure> {
    let path = adoptable(location)?;
    let options = OpenOptions {
        adopt: true,
        ..open_options()
    };
    let (schema, _) = schemas(domain, false)?;
    Ok(AnyConsumer::Sqlite(ConsumerDb::open_with(
        path,
        &schema,
        clock(),
        &options,
    )?))
}

/// The file of `--adopt`; a URL is invalid input.
pub fn adoptable(location: &Location) -> Result<&std::path::Path, Failure> {
    location.file().ok_or_else(|| {
        Failure::Usage(format!(
            "--adopt is for SQLite files ({location} is a PostgreSQL database, whose ordo tables live in their own schemas beside the application's: run init without --adopt)"
        ))
    })
}

/// The options of [`open_options`] that refuse a missing store: for the
/// commands that serve or follow a store, so that a mistyped path cannot
/// start an empty one.
pub fn existing_only() -> OpenOptions {
    OpenOptions {
        create: false,
        ..open_options()
    }
}

/// Opens an existing producer store of any domain; a missing one is
/// invalid input, and nothing is created.
pub fn open_existing_producer(location: &Location) -> Result<AnyProducer, Failure> {
    Ok(match location {
        Location::File(path) => {
            AnyProducer::Sqlite(ProducerDb::open_existing(path, clock(), &existing_only())?)
        }
        Location::Postgres(url) => AnyProducer::Postgres(on_server(
            url,
            PgProducer::open_existing(url, clock(), &pg_existing_only()),
        )?),
    })
}

/// [`open_existing_producer`] with the store's own error (for a store
/// opened again by a loop).
pub fn existing_producer(location: &Location) -> Result<AnyProducer, StoreError> {
    Ok(match location {
        Location::File(path) => {
            AnyProducer::Sqlite(ProducerDb::open_existing(path, clock(), &existing_only())?)
        }
        Location::Postgres(url) => AnyProducer::Postgres(on_server(
            url,
            PgProducer::open_existing(url, clock(), &pg_existing_only()),
        )?),
    })
}

/// Opens an existing consumer store of any domain; a missing one is
/// invalid input, and nothing is created.
pub fn open_existing_consumer(location: &Location) -> Result<AnyConsumer, Failure> {
    Ok(existing_consumer(location)?)
}

/// [`open_existing_consumer`] with the store's own error (for a handle
/// opened while serving).
pub fn existing_consumer(location: &Location) -> Result<AnyConsumer, StoreError> {
    Ok(match location {
        Location::File(path) => {
            AnyConsumer::Sqlite(ConsumerDb::open_existing(path, clock(), &existing_only())?)
        }
        Location::Postgres(url) => AnyConsumer::Postgres(on_server(
            url,
            PgConsumer::open_existing(url, clock(), &pg_existing_only()),
        )?),
    })
}

/// Opens an existing consumer store of the reservation domain; a missing
/// one or one of another domain is invalid input, and nothing is written.
pub fn open_existing_reservation_consumer(location: &Location) -> Result<AnyConsumer, Failure> {
    let consumer = open_existing_consumer(location)?;
    refuse_other_domain(location, consumer.domain())?;
    // Opened again for its domain, whose migrations then run.
    drop(consumer);
    Ok(match location {
        Location::File(path) => AnyConsumer::Sqlite(ConsumerDb::open_with(
            path,
            &consumer_schema(),
            clock(),
            &existing_only(),
        )?),
        Location::Postgres(url) => AnyConsumer::Postgres(on_server(
            url,
            PgConsumer::open_with(url, &pg_consumer_schema(), clock(), &pg_existing_only()),
        )?),
    })
}

/// The domain of the producer store, if it exists.
pub fn existing_producer_domain(location: &Location) -> Result<Option<String>, Failure> {
    Ok(match location {
        Location::File(path) => ProducerDb::existing_domain(path)?,
        Location::Postgres(url) => pg_existing_producer(url)?.map(|s| s.domain().to_owned()),
    })
}

/// The domain of the consumer store, if it exists.
pub fn existing_consumer_domain(location: &Location) -> Result<Option<String>, Failure> {
    Ok(match location {
        Location::File(path) => ConsumerDb::existing_domain(path)?,
        Location::Postgres(url) => pg_existing_consumer(url)?.map(|s| s.domain().to_owned()),
    })
}

/// Opens (creating if missing) a producer store of the reservation domain,
/// for the commands that run its rules; a store of another domain is
/// invalid input, and nothing is written to it.
pub fn open_reservation_producer(location: &Location) -> Result<AnyProducer, Failure> {
    if let Some(domain) = existing_producer_domain(location)? {
        refuse_other_domain(location, &domain)?;
    }
    Ok(match location {
        Location::File(path) => AnyProducer::Sqlite(ProducerDb::open_with(
            path,
            &producer_schema(),
            clock(),
            &open_options(),
        )?),
        Location::Postgres(url) => AnyProducer::Postgres(on_server(
            url,
            PgProducer::open_with(url, &pg_producer_schema(), clock(), &pg_options()),
        )?),
    })
}

/// Opens (creating if missing) a consumer store of the reservation domain,
/// for the commands that run its handler; a store of another domain is
/// invalid input, and nothing is written to it.
pub fn open_reservation_consumer(location: &Location) -> Result<AnyConsumer, Failure> {
    if let Some(domain) = existing_consumer_domain(location)? {
        refuse_other_domain(location, &domain)?;
    }
    Ok(match location {
        Location::File(path) => AnyConsumer::Sqlite(ConsumerDb::open_with(
            path,
            &consumer_schema(),
            clock(),
            &open_options(),
        )?),
        Location::Postgres(url) => AnyConsumer::Postgres(on_server(
            url,
            PgConsumer::open_with(url, &pg_consumer_schema(), clock(), &pg_options()),
        )?),
    })
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
        Location::Postgres(url) => {
            pg_existing_producer(url)?;
        }
    }
    Ok(())
}

/// [`check_producer`] for the consumer.
pub fn check_consumer(location: &Location) -> Result<(), Failure> {
    match location {
        Location::File(path) => ConsumerDb::check_existing(path)?,
        Location::Postgres(url) => {
            pg_existing_consumer(url)?;
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
