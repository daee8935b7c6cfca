//! The connection a store owns, the handle a handler writes through, and
//! opening a store: connecting, the durability check, and creating or
//! migrating ordo's tables and the domain's under an advisory lock.

use std::cell::RefCell;
use std::collections::HashMap;

use ordo_core::{ErrorKind, StoreError};
use postgres::types::ToSql;
use postgres::{Client, NoTls, Row, Statement};

use crate::domain::{self, Schema};
use crate::error::{commit_error, corrupt, pg_error};

/// The version of ordo's own tables this build writes, per schema; a store
/// with a newer one is refused.
pub const SCHEMA_VERSION: i64 = 1;

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
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            schema: None,
            create: true,
        }
    }
}

/// Which side a store belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Producer,
    Consumer,
}

impl Role {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Producer => "producer",
            Role::Consumer => "consumer",
        }
    }

    fn default_schema(self) -> &'static str {
        match self {
            Role::Producer => PRODUCER_SCHEMA_DEFAULT,
            Role::Consumer => CONSUMER_SCHEMA_DEFAULT,
        }
    }
}

/// Which domain a store is opened for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Want<'a> {
    /// This domain's store: created if missing, migrated; another domain's
    /// store is refused.
    Domain(&'a Schema),
    /// An existing store of any domain, without domain migrations.
    Any,
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
}

impl PgTx {
    /// Runs one statement and returns how many rows it changed.
    pub fn execute(&self, sql: &str, params: Params<'_>) -> Result<u64, StoreError> {
        self.client
            .borrow_mut()
            .execute(sql, params)
            .map_err(|e| pg_error("PostgreSQL", e))
    }

    /// Runs a query and returns its rows.
    pub fn query(&self, sql: &str, params: Params<'_>) -> Result<Vec<Row>, StoreError> {
        self.client
            .borrow_mut()
            .query(sql, params)
            .map_err(|e| pg_error("PostgreSQL", e))
    }

    /// Runs a query that returns at most one row.
    pub fn query_opt(&self, sql: &str, params: Params<'_>) -> Result<Option<Row>, StoreError> {
        self.client
            .borrow_mut()
            .query_opt(sql, params)
            .map_err(|e| pg_error("PostgreSQL", e))
    }

    /// Runs a query that returns exactly one row.
    pub fn query_one(&self, sql: &str, params: Params<'_>) -> Result<Row, StoreError> {
        self.client
            .borrow_mut()
            .query_one(sql, params)
            .map_err(|e| pg_error("PostgreSQL", e))
    }

    /// Runs statements separated by semicolons, without parameters.
    pub fn batch_execute(&self, sql: &str) -> Result<(), StoreError> {
        self.client
            .borrow_mut()
            .batch_execute(sql)
            .map_err(|e| pg_error("PostgreSQL", e))
    }

    /// The schema holding ordo's tables of this store, unquoted.
    pub fn ordo_schema(&self) -> &str {
        self.schema.trim_matches('"')
    }

    /// The prepared statement of `template`, whose `{s}` names ordo's
    /// schema, prepared once per connection.
    fn statement(&self, template: &'static str) -> Result<Statement, postgres::Error> {
        if let Some(statement) = self.cache.borrow().get(template) {
            return Ok(statement.clone());
        }
        let sql = template.replace("{s}", &self.schema);
        let statement = self.client.borrow_mut().prepare(&sql)?;
        let mut cache = self.cache.borrow_mut();
        if cache.len() >= STATEMENT_CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(template, statement.clone());
        Ok(statement)
    }

    /// Runs ordo's own statement `template` (see [`PgTx::statement`]).
    pub(crate) fn run(
        &self,
        context: &str,
        template: &'static str,
        params: Params<'_>,
    ) -> Result<u64, StoreError> {
        let err = |e| pg_error(context, e);
        let statement = self.statement(template).map_err(err)?;
        self.client
            .borrow_mut()
            .execute(&statement, params)
            .map_err(err)
    }

    /// The rows of ordo's own query `template`.
    pub(crate) fn rows(
        &self,
        context: &str,
        template: &'static str,
        params: Params<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        let err = |e| pg_error(context, e);
        let statement = self.statement(template).map_err(err)?;
        self.client
            .borrow_mut()
            .query(&statement, params)
            .map_err(err)
    }

    /// The row, if any, of ordo's own query `template`.
    pub(crate) fn row(
        &self,
        context: &str,
        template: &'static str,
        params: Params<'_>,
    ) -> Result<Option<Row>, StoreError> {
        let err = |e| pg_error(context, e);
        let statement = self.statement(template).map_err(err)?;
        self.client
            .borrow_mut()
            .query_opt(&statement, params)
            .map_err(err)
    }

    /// Runs transaction control or DDL (`{s}` names ordo's schema).
    pub(crate) fn control(&self, context: &str, sql: &str) -> Result<(), StoreError> {
        self.client
            .borrow_mut()
            .batch_execute(&sql.replace("{s}", &self.schema))
            .map_err(|e| pg_error(context, e))
    }

    /// Begins a READ COMMITTED transaction.
    pub(crate) fn begin(&self, context: &str) -> Result<(), StoreError> {
        self.control(context, "BEGIN ISOLATION LEVEL READ COMMITTED")
    }

    /// Commits; see [`commit_error`] for what a failure means.
    pub(crate) fn commit(&self, context: &str) -> Result<(), StoreError> {
        self.client
            .borrow_mut()
            .batch_execute("COMMIT")
            .map_err(|e| commit_error(context, e))
    }

    /// Rolls back whatever is open; a failure here leaves the connection
    /// unusable, which the next statement reports.
    pub(crate) fn rollback(&self) {
        let _ = self.client.borrow_mut().batch_execute("ROLLBACK");
    }

    /// Runs `f` in one transaction, committed when it returns `Ok` and
    /// rolled back otherwise.
    pub(crate) fn in_tx<T, E: From<StoreError>>(
        &self,
        context: &str,
        f: impl FnOnce(&PgTx) -> Result<T, E>,
    ) -> Result<T, E> {
        self.begin(context)?;
        match f(self) {
            Ok(value) => {
                self.commit(context)?;
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

/// Parses a `postgres://` URL (or key-value connection string).
pub(crate) fn parse_url(url: &str) -> Result<postgres::Config, StoreError> {
    url.parse::<postgres::Config>().map_err(|e| {
        StoreError::new(
            ErrorKind::InvalidInput,
            format!("not a PostgreSQL connection URL: {e}"),
        )
    })
}

/// Connects and checks the session: `synchronous_commit` read back (`off`
/// is refused: a returned commit must be durable) and READ COMMITTED.
pub(crate) fn connect(url: &str) -> Result<Client, StoreError> {
    let config = parse_url(url)?;
    let server = describe(&config);
    let mut client = config
        .connect(NoTls)
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
        .batch_execute("SET default_transaction_isolation = 'read committed'")
        .map_err(|e| pg_error(&format!("{server}: cannot set the isolation level"), e))?;
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

/// An open store's connection and the domain it records.
pub(crate) struct Opened {
    pub conn: PgTx,
    pub domain: String,
}

/// Connects, then creates or migrates the role's tables (`ddl`, with `{s}`
/// for the schema) and the domain's in one transaction under an advisory
/// lock on the schema, so racing first opens create them once.
pub(crate) fn open(
    url: &str,
    role: Role,
    ddl: &str,
    want: Want<'_>,
    options: &PgOptions,
) -> Result<Opened, StoreError> {
    let schema = options
        .schema
        .clone()
        .unwrap_or_else(|| role.default_schema().to_string());
    check_schema_name(&schema)?;
    let client = connect(url)?;
    let conn = PgTx {
        client: RefCell::new(client),
        schema: format!("\"{schema}\""),
        cache: RefCell::new(HashMap::new()),
    };
    let context = format!("{schema}: cannot initialise");
    let domain = conn.in_tx(&context, |tx| init(tx, &schema, role, ddl, want, options))?;
    Ok(Opened { conn, domain })
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
fn init(
    tx: &PgTx,
    schema: &str,
    role: Role,
    ddl: &str,
    want: Want<'_>,
    options: &PgOptions,
) -> Result<String, StoreError> {
    tx.query_one(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&ADVISORY_LOCK_KEY, &schema],
    )?;
    let found = inspect(tx, schema)?;
    if !found.has_meta {
        let schema_of = match want {
            Want::Domain(s) if options.create => s,
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
        tx.control(&format!("{schema}: cannot create"), &create_sql(ddl))?;
        tx.run(
            "cannot record the role",
            "INSERT INTO {s}.ordo_meta (key, value) VALUES ('role', $1), ('schema_version', $2)",
            &[&role.as_str(), &SCHEMA_VERSION.to_string()],
        )?;
        domain::install(tx, schema, schema_of)?;
        return Ok(schema_of.domain().as_str().to_string());
    }
    check_meta(tx, schema, role)?;
    if let Want::Domain(s) = want {
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

/// Refuses a store of the other role or of a newer schema version.
fn check_meta(tx: &PgTx, schema: &str, role: Role) -> Result<(), StoreError> {
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
    if stored_role.as_deref() != Some(role.as_str()) {
        return Err(StoreError::new(
            ErrorKind::Incompatible,
            format!(
                "schema {schema} holds an ordo {} store, not a {} store",
                stored_role.as_deref().unwrap_or("unknown"),
                role.as_str()
            ),
        ));
    }
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
    // Versions below SCHEMA_VERSION would be migrated forward here, in this
    // transaction; version 1 is the first.
    Ok(())
}
