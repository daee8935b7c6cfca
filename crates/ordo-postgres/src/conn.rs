//! The connection a store owns, the handle a handler writes through, and
//! opening a store: connecting, the durability check, and creating or
//! migrating ordo's tables and the domain's under an advisory lock.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

use ordo_core::store::{check_producer_name, stored_producer_name};
use ordo_core::{ErrorKind, ProducerName, StoreError, StoreId};
use postgres::types::ToSql;
use postgres::{Client, Row, SimpleQueryMessage, Statement};

use crate::domain;
use crate::error::{commit_error, corrupt, kind_of, pg_error};
use crate::tls::PgUrl;

/// The version of ordo's own tables this build writes, per schema; a store
/// with a newer one is refused. Version 6 gave every store its identity.
pub const SCHEMA_VERSION: i64 = 11;

/// The migration to version 6, the same for both roles: the store's
/// identity, given once (a store of an earlier release gets it at its first
/// open by this one).
pub(crate) const STORE_ID_MIGRATION: &str =
    "INSERT INTO {s}.ordo_meta (key, value) VALUES ('store_id', replace(gen_random_uuid()::text, '-', ''))
     ON CONFLICT (key) DO NOTHING;";

/// The default schema of the producer's tables.
pub const PRODUCER_SCHEMA_DEFAULT: &str = "ordo_producer";
/// The default schema of the consumer's tables.
pub const CONSUMER_SCHEMA_DEFAULT: &str = "ordo_consumer";

/// The most prepared statements one connection keeps.
const STATEMENT_CACHE_CAPACITY: usize = 256;

/// The first key of every advisory lock ordo takes (the bytes `ordo`).
const ADVISORY_LOCK_KEY: i32 = 0x6F72_646F;

/// Parameters of a statement.
pub type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// Settings for opening a store.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// The PostgreSQL schema holding ordo's tables of this store (default:
    /// [`PRODUCER_SCHEMA_DEFAULT`] or [`CONSUMER_SCHEMA_DEFAULT`]):
    /// `[a-z_][a-z0-9_]{0,62}`.
    pub schema: Option<String>,
    /// Whether missing tables are created (default `true`). When `false`, a
    /// schema without ordo's tables is refused with [`ErrorKind::NotFound`]
    /// and nothing is created.
    pub create: bool,
    /// The worker's name: a producer's relay claims flows under it (see
    /// [`PgProducer`](crate::PgProducer)), and it ends the connection's
    /// `application_name`. Default: `<pid>-<random>`, unique per store
    /// handle. Two handles must never share one while both are open.
    pub owner: Option<String>,
    /// The connection's `application_name`, as `pg_stat_activity` shows it
    /// (default: `ordo-relay-<owner>` for a producer, `ordo-apply-<owner>`
    /// for a consumer; the URL's own `application_name` when it has one).
    pub application_name: Option<String>,
    /// How long a relay's claim on a flow lasts without being renewed
    /// (default [`LEASE_MS_DEFAULT`]). A round renews the claims it uses
    /// once less than half of them is left, and keeps a flow after its
    /// round, caught up or not; a relay that stops making rounds holds its
    /// flows at most this long.
    pub lease_ms: u64,
    /// The name a producer store is created with (`None`:
    /// [`ProducerName::DEFAULT`]). An existing producer store named
    /// otherwise is refused and nothing is changed: a producer's name is set
    /// when it is created and never changes. Not read for consumer stores.
    pub producer_name: Option<ProducerName>,
}

/// The default duration of a relay's lease on a flow.
pub const LEASE_MS_DEFAULT: u64 = 10_000;

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            schema: None,
            create: true,
            owner: None,
            application_name: None,
            lease_ms: LEASE_MS_DEFAULT,
            producer_name: None,
        }
    }
}

impl PgOptions {
    /// The owner name, or a new unique one.
    pub(crate) fn owner_or_unique(&self) -> String {
        self.owner
            .clone()
            .unwrap_or_else(|| format!("{}-{:08x}", std::process::id(), fastrand::u32(..)))
    }
}

pub(crate) use ordo_core::store::Role;

/// The worker a role's connections serve, in `application_name`.
fn worker(role: Role) -> &'static str {
    match role {
        Role::Producer => "relay",
        Role::Consumer => "apply",
    }
}

fn default_schema(role: Role) -> &'static str {
    match role {
        Role::Producer => PRODUCER_SCHEMA_DEFAULT,
        Role::Consumer => CONSUMER_SCHEMA_DEFAULT,
    }
}

/// The transaction a handler (or an application's write in the producer)
/// runs its SQL in, through `&self`: the store has begun it and commits or
/// rolls it back; the SQL must not end it.
///
/// ```no_run
/// # fn f(tx: &ordo_postgres::PgTx) -> Result<(), ordo_core::StoreError> {
/// tx.execute("INSERT INTO handled (flow_id, seq) VALUES ($1, $2)", &[&"f-1", &1_i64])?;
/// let n: i64 = tx.query_one("SELECT count(*) FROM handled", &[])?.get(0);
/// # Ok(()) }
/// ```
pub struct PgTx {
    client: RefCell<Client>,
    /// ordo's schema, quoted, for the store's own statements.
    schema: String,
    cache: RefCell<HashMap<&'static str, Statement>>,
    /// The application's statements run through the query methods,
    /// prepared on this connection, by their text.
    prepared: RefCell<HashMap<String, Statement>>,
    /// Where to connect again, with the same settings.
    target: Target,
    /// A transaction is open on the connection.
    in_tx: Cell<bool>,
    /// The connection failed, or its transaction errored: it is discarded
    /// and a new one opened before the next transaction.
    broken: Cell<bool>,
}

/// What a store connects to, kept to connect again: the URL parsed once
/// (its CAs read once), its `application_name` set.
#[derive(Clone)]
pub(crate) struct Target {
    url: PgUrl,
}

impl Target {
    fn application_name(&self) -> &str {
        self.url.config().get_application_name().unwrap_or_default()
    }
}

/// What the server says became of a transaction whose COMMIT got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxOutcome {
    /// It committed: everything it wrote stands.
    Committed,
    /// It aborted (or never committed before its connection died): nothing
    /// it wrote stands.
    Aborted,
    /// Still in progress after the bounded wait, or too old for the server
    /// to remember: the caller must not guess.
    Unknown,
}

/// How long a transaction reported in progress is waited for (its
/// backend may still be finishing a COMMIT whose answer was lost).
const IN_PROGRESS_WAITS: u32 = 100;
const IN_PROGRESS_WAIT: Duration = Duration::from_millis(50);

/// The calls of ordo's own statements: each prepares `template` through
/// the statement cache and makes one client call with `params`.
macro_rules! statement_calls {
    ($($(#[$doc:meta])* $name:ident -> $answer:ty = $call:ident;)*) => {
        $(
            $(#[$doc])*
            pub(crate) fn $name(
                &self,
                context: &str,
                template: &'static str,
                params: Params<'_>,
            ) -> Result<$answer, StoreError> {
                let statement = self.statement(context, template)?;
                self.call(context, |c| c.$call(&statement, params))
            }
        )*
    };
}

impl PgTx {
    /// Runs one statement and returns how many rows it changed. Each
    /// distinct `sql` is prepared once per connection (as are those of the
    /// query methods), so that running it again is one round trip.
    pub fn execute(&self, sql: &str, params: Params<'_>) -> Result<u64, StoreError> {
        let statement = self.prepared(sql)?;
        self.call("PostgreSQL", |c| c.execute(&statement, params))
    }

    /// Runs a query and returns its rows.
    pub fn query(&self, sql: &str, params: Params<'_>) -> Result<Vec<Row>, StoreError> {
        let statement = self.prepared(sql)?;
        self.call("PostgreSQL", |c| c.query(&statement, params))
    }

    /// Runs a query that returns at most one row.
    pub fn query_opt(&self, sql: &str, params: Params<'_>) -> Result<Option<Row>, StoreError> {
        let statement = self.prepared(sql)?;
        self.call("PostgreSQL", |c| c.query_opt(&statement, params))
    }

    /// Runs a query that returns exactly one row.
    pub fn query_one(&self, sql: &str, params: Params<'_>) -> Result<Row, StoreError> {
        let statement = self.prepared(sql)?;
        self.call("PostgreSQL", |c| c.query_one(&statement, params))
    }

    /// Runs statements separated by semicolons, without parameters.
    pub fn batch_execute(&self, sql: &str) -> Result<(), StoreError> {
        self.call("PostgreSQL", |c| c.batch_execute(sql))
    }

    /// The schema holding ordo's tables of this store, unquoted.
    pub fn ordo_schema(&self) -> &str {
        self.schema.trim_matches('"')
    }

    /// The connection's `application_name`.
    pub fn application_name(&self) -> &str {
        self.target.application_name()
    }

    /// What this connection connects to, with its settings.
    pub(crate) fn target_url(&self) -> &PgUrl {
        &self.target.url
    }

    /// What became of transaction `txid` (a `txid_current()` value), asked
    /// on this connection (`pg_xact_status`): a transaction still in
    /// progress is waited for a bounded time, then [`TxOutcome::Unknown`].
    pub fn transaction_outcome(&self, txid: i64) -> Result<TxOutcome, StoreError> {
        let context = "cannot ask the server what became of a transaction";
        for _ in 0..IN_PROGRESS_WAITS {
            let status: Option<String> = self
                .call(context, |c| {
                    c.query_one(
                        "SELECT pg_xact_status($1::text::xid8)",
                        &[&txid.to_string()],
                    )
                })?
                .get(0);
            match status.as_deref() {
                Some("committed") => return Ok(TxOutcome::Committed),
                Some("aborted") => return Ok(TxOutcome::Aborted),
                Some("in progress") => std::thread::sleep(IN_PROGRESS_WAIT),
                _ => return Ok(TxOutcome::Unknown),
            }
        }
        Ok(TxOutcome::Unknown)
    }

    /// Runs `f` on the client: a connection discarded earlier is replaced
    /// first (outside a transaction only: a transaction never continues on
    /// another connection). A failure inside a transaction, or of the
    /// connection, marks the connection to be discarded.
    fn call<T>(
        &self,
        context: &str,
        f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, StoreError> {
        self.ensure_connected(context)?;
        let result = f(&mut self.client.borrow_mut());
        result.map_err(|e| {
            if self.in_tx.get() || e.is_closed() || kind_of(&e) == ErrorKind::ConnectionLost {
                self.broken.set(true);
            }
            pg_error(context, e)
        })
    }

    /// Opens a new connection in place of a discarded one, between
    /// transactions only. Inside a transaction the connection is kept
    /// while it is open (the server reports an errored transaction as it
    /// is), and a closed one fails the transaction.
    fn ensure_connected(&self, context: &str) -> Result<(), StoreError> {
        let closed = self.client.borrow().is_closed();
        if self.in_tx.get() && closed {
            return Err(StoreError::new(
                ErrorKind::ConnectionLost,
                format!("{context}: the connection failed inside a transaction"),
            ));
        }
        if self.in_tx.get() {
            return Ok(());
        }
        if self.broken.get() || closed {
            return self.reconnect();
        }
        Ok(())
    }

    /// Replaces the connection by a new one with the same settings.
    pub(crate) fn reconnect(&self) -> Result<(), StoreError> {
        self.broken.set(true);
        let client = connect(&self.target.url)?;
        *self.client.borrow_mut() = client;
        self.cache.borrow_mut().clear();
        self.prepared.borrow_mut().clear();
        self.broken.set(false);
        tracing::debug!(
            application_name = %self.target.application_name(),
            "a new connection replaces one that failed"
        );
        Ok(())
    }

    /// The prepared statement of `template`, whose `{s}` names ordo's
    /// schema, prepared once per connection.
    fn statement(&self, context: &str, template: &'static str) -> Result<Statement, StoreError> {
        self.ensure_connected(context)?;
        if let Some(statement) = self.cache.borrow().get(template) {
            return Ok(statement.clone());
        }
        let sql = template.replace("{s}", &self.schema);
        let statement = self.call(context, |c| c.prepare(&sql))?;
        let mut cache = self.cache.borrow_mut();
        if cache.len() >= STATEMENT_CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(template, statement.clone());
        Ok(statement)
    }

    /// The application's statement `sql`, prepared once per connection.
    fn prepared(&self, sql: &str) -> Result<Statement, StoreError> {
        let context = "PostgreSQL";
        self.ensure_connected(context)?;
        if let Some(statement) = self.prepared.borrow().get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.call(context, |c| c.prepare(sql))?;
        let mut prepared = self.prepared.borrow_mut();
        if prepared.len() >= STATEMENT_CACHE_CAPACITY {
            prepared.clear();
        }
        prepared.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    statement_calls! {
        /// Runs ordo's own statement `template` (see [`PgTx::statement`]).
        run -> u64 = execute;
        /// The rows of ordo's own query `template`.
        rows -> Vec<Row> = query;
        /// The row, if any, of ordo's own query `template`.
        row -> Option<Row> = query_opt;
    }

    /// Runs transaction control or DDL (`{s}` names ordo's schema).
    pub(crate) fn control(&self, context: &str, sql: &str) -> Result<(), StoreError> {
        let sql = sql.replace("{s}", &self.schema);
        self.call(context, |c| c.batch_execute(&sql))
    }

    /// Begins a transaction with `begin` (a `BEGIN ...` statement, maybe
    /// followed by `SET LOCAL`s) and returns its transaction id, assigned
    /// now, in the same round trip: what a lost COMMIT is resolved by.
    pub(crate) fn begin_with(&self, context: &str, begin: &str) -> Result<i64, StoreError> {
        debug_assert!(!self.in_tx.get(), "no transaction is open");
        let sql = format!("{begin}; SELECT txid_current()");
        let messages = self.call(context, |c| c.simple_query(&sql))?;
        self.in_tx.set(true);
        let txid = messages.iter().find_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).and_then(|v| v.parse::<i64>().ok()),
            _ => None,
        });
        txid.ok_or_else(|| {
            self.rollback();
            corrupt(context, "txid_current() returned no number")
        })
    }

    /// Begins a read-only snapshot (REPEATABLE READ), ended by
    /// [`PgTx::rollback`].
    pub(crate) fn begin_read(&self, context: &str) -> Result<(), StoreError> {
        self.control(context, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")?;
        self.in_tx.set(true);
        Ok(())
    }

    /// Commits transaction `txid`. A connection lost during COMMIT is
    /// resolved on a new connection: committed is success, aborted is
    /// [`ErrorKind::ConnectionLost`] (nothing was written; retrying is
    /// safe), anything else [`ErrorKind::CommitOutcomeUnknown`].
    pub(crate) fn commit(&self, context: &str, txid: i64) -> Result<(), StoreError> {
        self.commit_with(context, txid, "COMMIT")
    }

    /// [`PgTx::commit`] by `sql`: `COMMIT`, or statements that end with it
    /// (a `NOTIFY` before it, in the same round trip). A statement refused
    /// before the COMMIT is a refusal: nothing was committed.
    pub(crate) fn commit_with(
        &self,
        context: &str,
        txid: i64,
        sql: &str,
    ) -> Result<(), StoreError> {
        debug_assert!(sql.ends_with("COMMIT"));
        let result = self.client.borrow_mut().batch_execute(sql);
        self.in_tx.set(false);
        let Err(error) = result else {
            return Ok(());
        };
        self.broken.set(true);
        let error = commit_error(context, error);
        if error.kind() != ErrorKind::CommitOutcomeUnknown {
            return Err(error);
        }
        self.resolve_commit(context, txid, error)
    }

    /// After a COMMIT without an answer: asks a new connection.
    fn resolve_commit(&self, context: &str, txid: i64, lost: StoreError) -> Result<(), StoreError> {
        let outcome = self
            .reconnect()
            .and_then(|()| self.transaction_outcome(txid));
        match outcome {
            Ok(TxOutcome::Committed) => {
                tracing::info!(txid, "a COMMIT whose answer was lost took effect");
                Ok(())
            }
            Ok(TxOutcome::Aborted) => Err(StoreError::new(
                ErrorKind::ConnectionLost,
                format!(
                    "{context}: the connection failed during COMMIT and the server reports \
                     transaction {txid} aborted: nothing was written"
                ),
            )),
            Ok(TxOutcome::Unknown) => Err(StoreError::new(
                ErrorKind::CommitOutcomeUnknown,
                format!("{lost}; the server cannot tell yet what became of transaction {txid}"),
            )),
            Err(asking) => Err(StoreError::new(
                ErrorKind::CommitOutcomeUnknown,
                format!("{lost}; asking what became of transaction {txid} failed: {asking}"),
            )),
        }
    }

    /// Rolls back whatever is open; a failure here marks the connection to
    /// be discarded.
    pub(crate) fn rollback(&self) {
        if self.client.borrow_mut().batch_execute("ROLLBACK").is_err() {
            self.broken.set(true);
        }
        self.in_tx.set(false);
    }

    /// Runs `f` in one transaction, committed when it returns `Ok` and
    /// rolled back otherwise (see [`PgTx::commit`] for a lost COMMIT).
    pub(crate) fn in_tx<T, E: From<StoreError>>(
        &self,
        context: &str,
        f: impl FnOnce(&PgTx) -> Result<T, E>,
    ) -> Result<T, E> {
        self.in_tx_begun(context, "BEGIN ISOLATION LEVEL READ COMMITTED", f)
    }

    /// [`PgTx::in_tx`] beginning with `begin` (see [`PgTx::begin_with`]).
    pub(crate) fn in_tx_begun<T, E: From<StoreError>>(
        &self,
        context: &str,
        begin: &str,
        f: impl FnOnce(&PgTx) -> Result<T, E>,
    ) -> Result<T, E> {
        let txid = self.begin_with(context, begin)?;
        match f(self) {
            Ok(value) => {
                self.commit(context, txid)?;
                Ok(value)
            }
            Err(e) => {
                self.rollback();
                Err(e)
            }
        }
    }
}

/// `postgres://user@host:port/db` of a configuration, never its password.
pub(crate) fn describe(config: &postgres::Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            postgres::config::Host::Tcp(name) => name.clone(),
            #[cfg(unix)]
            postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "postgres://{}@{host}:{port}/{}",
        config.get_user().unwrap_or(""),
        config.get_dbname().unwrap_or("")
    )
}

/// The settings of every connection of ordo's:
/// - READ COMMITTED;
/// - a plan for each run of a prepared statement, with its parameters.
///   ordo's statements take arrays of a batch's keys (`= ANY`, `unnest`),
///   and a connection lives for days: the generic plan that
///   PostgreSQL would reuse after five runs is made for a ten-element array
///   and the table's size at that time, so a statement first run on an
///   empty table would go on scanning the whole table once it holds
///   millions of rows (until an `ANALYZE` happens to replan it). Planning
///   costs tens of microseconds per statement, a few statements per batch.
const SESSION: &str = "SET default_transaction_isolation = 'read committed';
                       SET plan_cache_mode = force_custom_plan";

/// Connects to `target` and checks the session: `synchronous_commit` read
/// back (`off` is refused: a returned commit must be durable), then sets it
/// up ([`SESSION`]).
fn connect(target: &PgUrl) -> Result<Client, StoreError> {
    let server = describe(target.config());
    let mut client = target
        .connect()
        .map_err(|e| pg_error(&format!("cannot connect to {server}"), e))?;
    let setting: String = client
        .query_one("SHOW synchronous_commit", &[])
        .map_err(|e| pg_error(&format!("{server}: cannot read synchronous_commit"), e))?
        .get(0);
    if setting == "off" {
        return Err(StoreError::new(
            ErrorKind::Incompatible,
            format!(
                "{server} has synchronous_commit = off: a commit could be lost after it returned; \
                 ordo requires on, remote_write, remote_apply or local"
            ),
        ));
    }
    client
        .batch_execute(SESSION)
        .map_err(|e| pg_error(&format!("{server}: cannot set the session"), e))?;
    Ok(client)
}

/// Checks a schema name ordo interpolates into its SQL.
pub(crate) fn check_schema_name(name: &str) -> Result<(), StoreError> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if first_ok && rest_ok && name.len() <= 63 && !name.starts_with("pg_") {
        Ok(())
    } else {
        Err(StoreError::new(
            ErrorKind::InvalidInput,
            format!(
                "schema name {name:?}: expected [a-z_][a-z0-9_]{{0,62}}, not starting with pg_"
            ),
        ))
    }
}

/// An open store's connection, the domain it records, and the worker's
/// name.
pub(crate) struct Opened {
    pub conn: PgTx,
    pub domain: String,
    pub store_id: StoreId,
    /// The producer's name (a consumer store records none: the default).
    pub producer_name: ProducerName,
    pub owner: String,
    /// The store's wake-ups (its `LISTEN` channel).
    pub wake: crate::wake::Wake,
}

/// What one open of a store is given, in this backend's terms.
pub(crate) type Opening<'a> = ordo_core::open::Opening<'a, Tables, PgOptions>;

/// ordo's own tables of one role: the first version's DDL and the
/// migrations after it (`{s}` stands for the schema). Migration `i` moves
/// version `i + 1` to `i + 2`; a new store runs the DDL then every
/// migration, so the migrations run on every fresh store.
pub(crate) struct Tables {
    /// The role these tables are of.
    pub role: Role,
    pub ddl: &'static str,
    pub migrations: &'static [&'static str],
}

impl Tables {
    /// Everything a store at [`SCHEMA_VERSION`] was created with.
    pub(crate) fn all(&self) -> String {
        std::iter::once(self.ddl)
            .chain(self.migrations.iter().copied())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Connects, then creates or migrates the role's tables and the domain's
/// in one transaction under an advisory lock on the schema, so racing
/// first opens create them once.
pub(crate) fn open(url: &str, opening: Opening<'_>) -> Result<Opened, StoreError> {
    let Opening {
        tables, options, ..
    } = opening;
    let role = tables.role;
    debug_assert_eq!(tables.migrations.len() as i64 + 1, SCHEMA_VERSION);
    let schema = options
        .schema
        .clone()
        .unwrap_or_else(|| default_schema(role).to_string());
    check_schema_name(&schema)?;
    let owner = options.owner_or_unique();
    let mut parsed = PgUrl::parse(url)?;
    let application_name = match (&options.application_name, parsed.config()) {
        (Some(name), _) => name.clone(),
        (None, config) if config.get_application_name().is_some() => config
            .get_application_name()
            .unwrap_or_default()
            .to_string(),
        (None, _) => format!("ordo-{}-{owner}", worker(role)),
    };
    parsed.config_mut().application_name(&application_name);
    let target = Target { url: parsed };
    let client = connect(&target.url)?;
    let conn = PgTx {
        client: RefCell::new(client),
        schema: format!("\"{schema}\""),
        cache: RefCell::new(HashMap::new()),
        prepared: RefCell::new(HashMap::new()),
        target,
        in_tx: Cell::new(false),
        broken: Cell::new(false),
    };
    let context = format!("{schema}: cannot initialise");
    let (domain, store_id, producer_name) = conn.in_tx(&context, |tx| {
        let domain = init(tx, &schema, opening)?;
        let place = format!("{schema}.ordo_meta");
        let store_id = StoreId::stored(&place, read_meta(tx, "store_id")?)?;
        let producer_name = stored_producer_name(&place, read_meta(tx, "producer_name")?)?;
        Ok::<_, StoreError>((domain, store_id, producer_name))
    })?;
    let wake = crate::wake::Wake::new(url, role, &conn);
    Ok(Opened {
        conn,
        domain,
        store_id,
        producer_name,
        owner,
        wake,
    })
}

/// The value `ordo_meta` records under `key`, if any.
fn read_meta(tx: &PgTx, key: &str) -> Result<Option<String>, StoreError> {
    let row = tx.row(
        "cannot read ordo_meta",
        "SELECT value FROM {s}.ordo_meta WHERE key = $1",
        &[&key],
    )?;
    Ok(row.map(|row| row.get(0)))
}

/// What a schema holds.
struct Found {
    has_meta: bool,
    relations: i64,
}

fn inspect(tx: &PgTx, schema: &str) -> Result<Found, StoreError> {
    let row = tx
        .query_one(
            "SELECT to_regclass(quote_ident($1) || '.ordo_meta') IS NOT NULL,
                    (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = $1)",
            &[&schema],
        )
        .map_err(|e| with_context(e, &format!("{schema}: cannot inspect")))?;
    Ok(Found {
        has_meta: row.get(0),
        relations: row.get(1),
    })
}

fn with_context(error: StoreError, context: &str) -> StoreError {
    StoreError::new(error.kind(), format!("{context}: {error}"))
}

/// Inside the creating transaction: checks and creates; returns the domain.
fn init(tx: &PgTx, schema: &str, opening: Opening<'_>) -> Result<String, StoreError> {
    let (tables, want, role) = (opening.tables, opening.want, opening.tables.role);
    tx.query_one(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&ADVISORY_LOCK_KEY, &schema],
    )?;
    let found = inspect(tx, schema)?;
    if !found.has_meta {
        let schema_of = match want.creates_with() {
            Some(s) if opening.options.create => s,
            _ => {
                return Err(StoreError::new(
                    ErrorKind::NotFound,
                    format!(
                        "schema {schema} holds no ordo {} store (it is not created here)",
                        role.as_str()
                    ),
                ))
            }
        };
        if found.relations > 0 {
            return Err(StoreError::new(
                ErrorKind::Incompatible,
                format!(
                    "schema {schema} holds tables that ordo did not create; refusing to use it"
                ),
            ));
        }
        tx.control(&format!("{schema}: cannot create"), &create_sql(tables.ddl))?;
        migrate(tx, schema, tables, 1)?;
        tx.run(
            "cannot record the role",
            "INSERT INTO {s}.ordo_meta (key, value) VALUES ('role', $1), ('schema_version', $2)",
            &[&role.as_str(), &SCHEMA_VERSION.to_string()],
        )?;
        if role == Role::Producer {
            let name = opening.options.producer_name.clone().unwrap_or_default();
            tx.run(
                "cannot record the producer's name",
                "INSERT INTO {s}.ordo_meta (key, value) VALUES ('producer_name', $1)",
                &[&name.as_str()],
            )?;
        }
        domain::install(tx, schema, schema_of)?;
        return Ok(schema_of.domain().as_str().to_string());
    }
    let version = check_meta(tx, schema, role)?;
    if let (Role::Producer, Some(wanted)) = (role, &opening.options.producer_name) {
        let place = format!("schema {schema}");
        let stored = stored_producer_name(&place, read_meta(tx, "producer_name")?)?;
        check_producer_name(&place, &stored, wanted)?;
    }
    if version < SCHEMA_VERSION {
        migrate(tx, schema, tables, version)?;
        tx.run(
            "cannot record the schema version",
            "UPDATE {s}.ordo_meta SET value = $1 WHERE key = 'schema_version'",
            &[&SCHEMA_VERSION.to_string()],
        )?;
    }
    if let Some(s) = want.migrates_with() {
        domain::install(tx, schema, s)?;
    }
    domain::stored(tx)?
        .map(|d| d.name)
        .ok_or_else(|| corrupt(&format!("{schema}.ordo_meta"), "no domain recorded"))
}

fn create_sql(ddl: &str) -> String {
    format!(
        "CREATE SCHEMA IF NOT EXISTS {{s}};
         CREATE TABLE {{s}}.ordo_meta (key text PRIMARY KEY, value text NOT NULL);
         {ddl}"
    )
}

/// Runs the migrations from version `from` up to [`SCHEMA_VERSION`].
fn migrate(tx: &PgTx, schema: &str, tables: &Tables, from: i64) -> Result<(), StoreError> {
    let from = usize::try_from(from.max(1) - 1).unwrap_or(0);
    for (index, sql) in tables.migrations.iter().enumerate().skip(from) {
        tx.control(
            &format!(
                "{schema}: cannot migrate to ordo schema version {}",
                index + 2
            ),
            sql,
        )?;
    }
    Ok(())
}

/// Refuses a store of the other role or of a newer schema version; returns
/// the stored version.
fn check_meta(tx: &PgTx, schema: &str, role: Role) -> Result<i64, StoreError> {
    let meta = |key: &'static str| -> Result<Option<String>, StoreError> {
        Ok(tx
            .row(
                "cannot read ordo_meta",
                "SELECT value FROM {s}.ordo_meta WHERE key = $1",
                &[&key],
            )?
            .map(|row| row.get(0)))
    };
    let stored_role = meta("role")?;
    role.check_stored(stored_role.as_deref(), |found| {
        format!(
            "schema {schema} holds an ordo {found} store, not a {} store",
            role.as_str()
        )
    })?;
    let version = meta("schema_version")?.unwrap_or_default();
    let version: i64 = version.parse().map_err(|_| {
        corrupt(
            &format!("{schema}.ordo_meta"),
            format!("schema_version {version:?}"),
        )
    })?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::new(
            ErrorKind::Incompatible,
            format!("schema {schema} has ordo schema version {version}; this ordo knows up to {SCHEMA_VERSION}"),
        ));
    }
    Ok(version)
}

/// The accessors both roles' stores share: `connection`, `notify_channel`
/// and `read`.
macro_rules! store_accessors {
    ($role:expr) => {
        /// The connection, for the caller's own reads outside a
        /// transaction.
        pub fn connection(&self) -> &PgTx {
            &self.conn
        }

        /// The channel on which every write transaction that stores a new
        /// event notifies, once per transaction: `ordo_outbox_<schema>` or
        /// `ordo_inbox_<schema>` (see
        /// [`RunStore::changed_elsewhere`](ordo_core::RunStore::changed_elsewhere)).
        pub fn notify_channel(&self) -> &str {
            self.wake.channel()
        }

        /// Runs `f` inside one read-only REPEATABLE READ transaction, so
        /// that everything it reads is one consistent snapshot.
        pub fn read<T>(
            &mut self,
            f: impl FnOnce(&PgTx) -> Result<T, StoreError>,
        ) -> Result<T, StoreError> {
            let context = format!("{}: read transaction", $role.as_str());
            crate::producer::read_snapshot(&self.conn, &context, f)
        }
    };
}
pub(crate) use store_accessors;
