//! One specification opens a store of either backend, and the stores it
//! opens, behind one type per role.
//!
//! Invariant: the specification only chooses among the backends' own open
//! calls; what they check (the role, the domain, the versions, a foreign
//! file) and refuse is theirs, and so is every error's kind.

use std::sync::Arc;
use std::time::Duration;

use ordo_core::domain::Schema;
use ordo_core::{
    ApplyHandler, Clock, ConsumerHandle, Envelope, ErrorKind, ProducerName, ProducerOps,
    ProducerStore, Receipt, StoreError, SystemClock, Transport,
};
use ordo_postgres::{PgConsumer, PgOptions, PgProducer, PgTx};
use ordo_runtime::{ApplyRound, RelayRound, Runner};
use ordo_sqlite::rusqlite::Connection;
use ordo_sqlite::{ConsumerDb, OpenOptions, ProducerDb};

use crate::location::{redact, Location};

/// Which stores a specification opens.
#[derive(Debug, Clone)]
enum Want {
    /// A store of this domain, migrated to its schema's version.
    Domain(Schema),
    /// An existing store of any domain, as it is.
    Any,
    /// An existing store of any domain as it is, or a new one of this one.
    AnyOrNew(Schema),
}

impl Want {
    /// The backends' view of it.
    fn borrowed(&self) -> ordo_core::open::Want<'_> {
        match self {
            Want::Domain(schema) => ordo_core::open::Want::Domain(schema),
            Want::Any => ordo_core::open::Want::Any,
            Want::AnyOrNew(schema) => ordo_core::open::Want::AnyOrNew(schema),
        }
    }
}

/// Opens a store of one role at a location with a specification: the
/// backend's own open call, the same for both roles (whose store types
/// differ).
macro_rules! open_role {
    ($spec:expr, $at:expr, $role:ident, $sqlite:ident, $pg:ident) => {{
        let spec: &OpenSpec = $spec;
        let (want, clock) = (spec.want.borrowed(), spec.clock.clone());
        Ok(match $at {
            Location::File(path) => {
                $role::Sqlite($sqlite::open_as(path, want, clock, &spec.sqlite_options())?)
            }
            Location::Postgres(url) => $role::Postgres(
                spec.on_server(url, |options| $pg::open_as(url, want, clock, options))?,
            ),
        })
    }};
}

/// How to open a store, whichever backend its [`Location`] names.
///
/// ```no_run
/// use ordo::{Location, OpenSpec, Schema};
///
/// let schema = Schema::new("ledger")?.migration("CREATE TABLE ledger (event_id TEXT PRIMARY KEY)");
/// let spec = OpenSpec::domain(schema);
/// // The same specification opens a file or a PostgreSQL database.
/// let consumer = spec.consumer(&Location::from("consumer.db"))?;
/// let also = spec.consumer(&Location::from("postgres://127.0.0.1/app"))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct OpenSpec {
    want: Want,
    create: bool,
    adopt: bool,
    clock: Arc<dyn Clock>,
    busy_timeout: Option<Duration>,
    producer_name: Option<ProducerName>,
    postgres: PgOptions,
}

impl OpenSpec {
    /// A store of `schema`'s domain: created if missing, its domain's
    /// migrations run; a store of another domain is refused.
    pub fn domain(schema: Schema) -> OpenSpec {
        OpenSpec::new(Want::Domain(schema), true)
    }

    /// An existing store of any domain, as it is (its domain's migrations
    /// are not run): for what never runs a handler (receive, status,
    /// listing, repairs). A missing store is refused; nothing is created.
    pub fn existing() -> OpenSpec {
        OpenSpec::new(Want::Any, false)
    }

    /// An existing store of any domain as it is, or, when there is none, a
    /// new one of `schema`'s domain: what a tool that serves every domain
    /// and creates stores of one needs.
    pub fn existing_or_new(schema: Schema) -> OpenSpec {
        OpenSpec::new(Want::AnyOrNew(schema), true)
    }

    fn new(want: Want, create: bool) -> OpenSpec {
        OpenSpec {
            want,
            create,
            adopt: false,
            clock: Arc::new(SystemClock),
            busy_timeout: None,
            producer_name: None,
            postgres: PgOptions::default(),
        }
    }

    /// Whether a missing store is created ([`OpenSpec::domain`]: `true`);
    /// when `false`, it is refused with [`ErrorKind::NotFound`] and nothing
    /// is created, so that a mistyped path cannot start an empty store.
    pub fn create(mut self, create: bool) -> OpenSpec {
        self.create = create;
        self
    }

    /// Installs ordo's tables beside an application's own in an SQLite file
    /// that ordo did not create (see `ordo_sqlite::OpenOptions::adopt`). A
    /// PostgreSQL store keeps ordo's tables in schemas of their own, beside
    /// the application's, and adopts nothing: opening a URL with `adopt`
    /// is invalid input.
    pub fn adopt(mut self, adopt: bool) -> OpenSpec {
        self.adopt = adopt;
        self
    }

    /// The clock the stores stamp their writes with (the system's).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> OpenSpec {
        self.clock = clock;
        self
    }

    /// How long an SQLite write waits for another writer's lock (the
    /// backend's default otherwise).
    pub fn busy_timeout(mut self, timeout: Duration) -> OpenSpec {
        self.busy_timeout = Some(timeout);
        self
    }

    /// The name a producer store is created with (PROTOCOL.md section 12;
    /// [`ProducerName::DEFAULT`] otherwise). An existing producer store of
    /// another name is then refused, and nothing is changed: a producer's
    /// name never changes. Consumer stores have none.
    pub fn producer_name(mut self, name: ProducerName) -> OpenSpec {
        self.producer_name = Some(name);
        self
    }

    /// PostgreSQL's own options (schema names, lease, application name);
    /// `create` and the producer's name are the specification's.
    pub fn postgres_options(mut self, options: PgOptions) -> OpenSpec {
        self.postgres = options;
        self
    }

    /// Opens the producer store at `at`.
    pub fn producer(&self, at: &Location) -> Result<Producer, StoreError> {
        open_role!(self, at, Producer, ProducerDb, PgProducer)
    }

    /// Opens the consumer store at `at`.
    pub fn consumer(&self, at: &Location) -> Result<Consumer, StoreError> {
        open_role!(self, at, Consumer, ConsumerDb, PgConsumer)
    }

    fn sqlite_options(&self) -> OpenOptions {
        let defaults = OpenOptions::default();
        OpenOptions {
            busy_timeout: self.busy_timeout.unwrap_or(defaults.busy_timeout),
            create: self.create,
            adopt: self.adopt,
            producer_name: self.producer_name.clone(),
        }
    }

    /// Runs `open` with PostgreSQL's options; its error names the server
    /// (never its password) when the message does not already.
    fn on_server<T>(
        &self,
        url: &str,
        open: impl FnOnce(&PgOptions) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if self.adopt {
            return Err(StoreError::new(
                ErrorKind::InvalidInput,
                format!(
                    "adopting is for SQLite files ({} is a PostgreSQL database, whose ordo tables live in their own schemas beside the application's)",
                    redact(url)
                ),
            ));
        }
        let options = PgOptions {
            create: self.create,
            producer_name: self.producer_name.clone(),
            ..self.postgres.clone()
        };
        open(&options).map_err(|e| {
            let message = e.to_string();
            if message.contains("://") || e.kind() == ErrorKind::InvalidInput {
                return e;
            }
            StoreError::new(e.kind(), format!("{}: {message}", redact(url)))
        })
    }

    /// Starts the relay loop of `producer`, opened from `at` with this
    /// specification, through `transport` on `runner`; each round that did
    /// anything is shown to `observe`. A PostgreSQL store is opened again
    /// (with this specification) after its connection was lost.
    pub fn spawn_relay<T, O>(
        &self,
        runner: &mut Runner,
        at: &Location,
        producer: Producer,
        transport: T,
        observe: O,
    ) -> std::io::Result<()>
    where
        T: Transport + Send + 'static,
        O: FnMut(&RelayRound) + Send + 'static,
    {
        match producer {
            Producer::Sqlite(producer) => runner.spawn_relay_to(producer, transport, observe),
            Producer::Postgres(producer) => {
                let (spec, at) = (self.clone(), at.clone());
                let reopen = Box::new(move || match spec.producer(&at)? {
                    Producer::Postgres(producer) => Ok(producer),
                    Producer::Sqlite(_) => unreachable!("a URL opens a PostgreSQL store"),
                });
                runner.spawn_relay_reopening(producer, Some(reopen), transport, observe)
            }
        }
    }

    /// Starts the apply loop of `consumer`, opened from `at` with this
    /// specification, with the application's `handler` (written for both
    /// backends' transactions) on `runner`; each page that applied or
    /// blocked anything is shown to `observe`. A PostgreSQL store is opened
    /// again (with this specification) after its connection was lost.
    pub fn spawn_apply<H, O>(
        &self,
        runner: &mut Runner,
        at: &Location,
        consumer: Consumer,
        handler: H,
        observe: O,
    ) -> std::io::Result<()>
    where
        H: ApplyHandler<Connection> + ApplyHandler<PgTx> + Send + 'static,
        O: FnMut(&ApplyRound) + Send + 'static,
    {
        match consumer {
            Consumer::Sqlite(consumer) => runner.spawn_apply_observed(consumer, handler, observe),
            Consumer::Postgres(consumer) => {
                let (spec, at) = (self.clone(), at.clone());
                let reopen = Box::new(move || match spec.consumer(&at)? {
                    Consumer::Postgres(consumer) => Ok(consumer),
                    Consumer::Sqlite(_) => unreachable!("a URL opens a PostgreSQL store"),
                });
                runner.spawn_apply_reopening(consumer, reopen, handler, observe)
            }
        }
    }

    /// Opens the consumer store at `at` and starts its apply loop with
    /// `handler`, as [`OpenSpec::spawn_apply`] does: an application's
    /// applier process in one call.
    pub fn run_apply<H, O>(
        &self,
        runner: &mut Runner,
        at: &Location,
        handler: H,
        observe: O,
    ) -> Result<(), StoreError>
    where
        H: ApplyHandler<Connection> + ApplyHandler<PgTx> + Send + 'static,
        O: FnMut(&ApplyRound) + Send + 'static,
    {
        let consumer = self.consumer(at)?;
        self.spawn_apply(runner, at, consumer, handler, observe)
            .map_err(|e| {
                StoreError::new(
                    ErrorKind::Other,
                    format!("cannot start the apply loop: {e}"),
                )
            })
    }
}

/// A producer store of either backend: match on it for the backend's own
/// store, or use [`Producer::handle`] for what any backend offers.
// One per role and handle, never in a collection: the size is no matter.
#[allow(clippy::large_enum_variant)]
pub enum Producer {
    /// An SQLite file.
    Sqlite(ProducerDb),
    /// A PostgreSQL database.
    Postgres(PgProducer),
}

/// A consumer store of either backend. The apply side runs on the
/// backend's own store (the handler's transaction type differs by
/// backend): match on it, or start its loop with [`OpenSpec::spawn_apply`];
/// receive and the operator's view are [`Consumer::handle`].
// One per role and handle, never in a collection: the size is no matter.
#[allow(clippy::large_enum_variant)]
pub enum Consumer {
    /// An SQLite file.
    Sqlite(ConsumerDb),
    /// A PostgreSQL database.
    Postgres(PgConsumer),
}

/// Calls the same method on whichever store `self` holds.
macro_rules! each {
    ($self:expr, $store:ident => $call:expr) => {
        match $self {
            Self::Sqlite($store) => $call,
            Self::Postgres($store) => $call,
        }
    };
}

impl Producer {
    /// The domain that owns the store.
    pub fn domain(&self) -> &str {
        each!(self, s => s.domain())
    }

    /// The producer's name, set when the store was created.
    pub fn producer_name(&self) -> &ProducerName {
        each!(self, s => ProducerOps::producer_name(s))
    }

    /// The producer's writes, the relay's reads and the operator's view, on
    /// whichever backend.
    pub fn handle(&mut self) -> &mut (dyn ProducerStore + Send) {
        each!(self, s => s)
    }

    /// The store behind the object-safe operator view of any backend.
    pub fn into_handle(self) -> Box<dyn ProducerOps + Send> {
        each!(self, s => Box::new(s))
    }
}

impl Consumer {
    /// The domain that owns the store.
    pub fn domain(&self) -> &str {
        each!(self, s => s.domain())
    }

    /// Receive and the operator's view, on whichever backend.
    pub fn handle(&mut self) -> &mut dyn ConsumerHandle {
        each!(self, s => s)
    }

    /// The store behind the object-safe view of any backend.
    pub fn into_handle(self) -> Box<dyn ConsumerHandle> {
        each!(self, s => Box::new(s))
    }
}

/// A consumer store in this process is a transport, of either backend.
impl Transport for Consumer {
    fn deliver(
        &mut self,
        sender: Option<&ordo_core::StoreId>,
        events: &[Envelope],
    ) -> Result<Vec<Receipt>, ordo_core::TransportError> {
        each!(self, s => s.deliver(sender, events))
    }

    fn consumer_identity(&self) -> Option<ordo_core::StoreId> {
        each!(self, s => s.consumer_identity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One specification opens either backend's file the same way: a store
    /// of the domain, created, then refused for another domain; `existing`
    /// refuses a missing one and creates nothing.
    #[test]
    fn one_specification_opens_creates_and_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let at = Location::from(dir.path().join("c.db").as_os_str().to_owned());
        let missing = OpenSpec::existing().consumer(&at).err().expect("missing");
        assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");
        assert!(!dir.path().join("c.db").exists(), "nothing was created");
        let spec = OpenSpec::domain(Schema::new("ledger").unwrap());
        let mut consumer = spec.consumer(&at).unwrap();
        assert_eq!(consumer.domain(), "ledger");
        assert_eq!(consumer.handle().consumer_status().unwrap().pending, 0);
        drop(consumer);
        let other = OpenSpec::domain(Schema::new("billing").unwrap());
        assert!(other.consumer(&at).is_err(), "another domain is refused");
        let any = OpenSpec::existing().consumer(&at).unwrap();
        assert_eq!(any.domain(), "ledger");
    }

    /// Adopting is for SQLite files: a URL with `adopt` is invalid input,
    /// refused before any connection is made.
    #[test]
    fn a_url_is_never_adopted() {
        let spec = OpenSpec::domain(Schema::new("ledger").unwrap()).adopt(true);
        let at = Location::from("postgres://nobody:secret@127.0.0.1:1/none");
        let error = spec.producer(&at).err().expect("refused");
        assert_eq!(error.kind(), ErrorKind::InvalidInput);
        assert!(!error.to_string().contains("secret"), "{error}");
    }
}
