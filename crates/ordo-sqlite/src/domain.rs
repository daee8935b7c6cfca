//! The application's own tables: a domain name and an ordered list of
//! migrations that ordo runs in the store's file, in the same transaction
//! that creates or upgrades ordo's own tables.
//!
//! Invariant: a store belongs to one domain for its whole life; migrations
//! only ever run forward, each exactly once, and nothing is ever reset.

use std::borrow::Cow;

use ordo_core::{DomainName, ErrorKind, RuleViolation, StoreError};
use rusqlite::{Connection, OptionalExtension};

use crate::conn::sql_error;

/// The most migrations a schema may declare.
pub const MIGRATIONS_MAX: usize = 1_000;

/// The domain that owns a store, and the SQL that creates and upgrades the
/// application's own tables beside ordo's.
///
/// ```
/// use ordo_sqlite::Schema;
///
/// let schema = Schema::new("orders")?
///     .migration("CREATE TABLE orders (order_id TEXT PRIMARY KEY, total_cents INTEGER NOT NULL)")
///     .migration("ALTER TABLE orders ADD COLUMN note TEXT");
/// assert_eq!(schema.domain().as_str(), "orders");
/// assert_eq!(schema.version(), 2);
/// # Ok::<(), ordo_core::RuleViolation>(())
/// ```
///
/// Migration `n` (from 1) runs once, when a store of this domain is at
/// version `n - 1`; a store at a version above [`Schema::version`] was
/// written by a newer application and is refused. Never edit or remove a
/// migration that has shipped: add a new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    domain: DomainName,
    migrations: Vec<Cow<'static, str>>,
}

impl Schema {
    /// A schema of the domain `domain` (`[a-z][a-z0-9_-]{0,63}`) with no
    /// tables of its own yet.
    pub fn new(domain: &str) -> Result<Schema, RuleViolation> {
        Ok(Schema {
            domain: DomainName::new(domain)?,
            migrations: Vec::new(),
        })
    }

    /// Adds the next migration: SQL run as one batch inside the store's
    /// write transaction.
    ///
    /// # Panics
    /// Past [`MIGRATIONS_MAX`] migrations.
    pub fn migration(mut self, sql: impl Into<Cow<'static, str>>) -> Schema {
        assert!(
            self.migrations.len() < MIGRATIONS_MAX,
            "too many migrations"
        );
        self.migrations.push(sql.into());
        self
    }

    /// The domain that owns stores of this schema.
    pub fn domain(&self) -> &DomainName {
        &self.domain
    }

    /// How many migrations this schema declares: the version a store has
    /// once they have all run.
    pub fn version(&self) -> i64 {
        self.migrations.len() as i64
    }
}

/// The domain a store records, and how many of its migrations have run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredDomain {
    pub name: String,
    pub version: i64,
}

/// Reads the store's domain from `ordo_meta`, if it records one.
pub(crate) fn stored_domain(conn: &Connection) -> rusqlite::Result<Option<StoredDomain>> {
    let name: Option<String> = conn
        .query_row(
            "SELECT value FROM ordo_meta WHERE key = 'domain'",
            [],
            |row| row.get(0),
        )
        .optional()?;
    let Some(name) = name else { return Ok(None) };
    let version: Option<String> = conn
        .query_row(
            "SELECT value FROM ordo_meta WHERE key = 'domain_version'",
            [],
            |row| row.get(0),
        )
        .optional()?;
    let version = version.and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok(Some(StoredDomain { name, version }))
}

/// Refuses a store of another domain, or one whose domain tables are newer
/// than `schema`. Returns whether migrations are left to run.
pub(crate) fn check(
    display: &str,
    stored: Option<&StoredDomain>,
    schema: &Schema,
) -> Result<bool, StoreError> {
    let Some(stored) = stored else {
        return Ok(true);
    };
    if stored.name != schema.domain.as_str() {
        return Err(StoreError::new(
            ErrorKind::Incompatible,
            format!(
                "{display} belongs to domain \"{}\", not \"{}\"",
                stored.name, schema.domain
            ),
        ));
    }
    if stored.version > schema.version() {
        return Err(StoreError::new(
            ErrorKind::Incompatible,
            format!(
                "{display}: the tables of domain \"{}\" are at version {}; this application knows up to {}",
                stored.name,
                stored.version,
                schema.version()
            ),
        ));
    }
    Ok(stored.version < schema.version())
}

/// Records the domain and runs the migrations not yet run, inside the
/// caller's write transaction (after [`check`] under the same lock).
pub(crate) fn install(tx: &Connection, display: &str, schema: &Schema) -> Result<(), StoreError> {
    let err = |e| sql_error(&format!("{display}: cannot install domain tables"), e);
    let stored = stored_domain(tx).map_err(err)?;
    check(display, stored.as_ref(), schema)?;
    let from = stored.map_or(0, |s| s.version);
    for (index, sql) in schema.migrations.iter().enumerate().skip(from as usize) {
        tx.execute_batch(sql).map_err(|e| {
            sql_error(
                &format!(
                    "{display}: migration {} of domain \"{}\" failed",
                    index + 1,
                    schema.domain
                ),
                e,
            )
        })?;
    }
    tx.execute(
        "INSERT INTO ordo_meta (key, value) VALUES ('domain', ?1), ('domain_version', ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        [schema.domain.as_str(), &schema.version().to_string()],
    )
    .map_err(err)?;
    Ok(())
}
