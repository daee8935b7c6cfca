//! The application's own tables: a domain name and an ordered list of
//! migrations that ordo runs in the store's database, in the transaction
//! that creates or upgrades ordo's own tables.
//!
//! Invariant: a store belongs to one domain for its whole life; migrations
//! only ever run forward, each exactly once, and nothing is ever reset.

use std::borrow::Cow;

use ordo_core::{DomainName, ErrorKind, RuleViolation, StoreError};

use crate::conn::PgTx;

/// The most migrations a schema may declare.
pub const MIGRATIONS_MAX: usize = 1_000;

/// The domain that owns a store, and the SQL that creates and upgrades the
/// application's own tables beside ordo's (in the schema the SQL names, or
/// the connection's `search_path`, `public` by default).
///
/// ```
/// let schema = ordo_postgres::Schema::new("orders")?
///     .migration("CREATE TABLE orders (order_id text PRIMARY KEY, total_cents bigint NOT NULL)");
/// assert_eq!(schema.version(), 1);
/// # Ok::<(), ordo_core::RuleViolation>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    domain: DomainName,
    migrations: Vec<Cow<'static, str>>,
}

impl Schema {
    /// A schema of the domain `domain` with no tables of its own yet.
    pub fn new(domain: &str) -> Result<Schema, RuleViolation> {
        Ok(Schema {
            domain: DomainName::new(domain)?,
            migrations: Vec::new(),
        })
    }

    /// Adds the next migration: SQL run as one batch inside the store's
    /// creating transaction.
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

    /// How many migrations this schema declares.
    pub fn version(&self) -> i64 {
        self.migrations.len() as i64
    }

    /// The migrations, in order.
    pub fn migrations(&self) -> impl Iterator<Item = &str> {
        self.migrations.iter().map(|m| m.as_ref())
    }
}

/// The domain a store records, and how many of its migrations have run.
pub(crate) struct StoredDomain {
    pub name: String,
    pub version: i64,
}

pub(crate) fn stored(tx: &PgTx) -> Result<Option<StoredDomain>, StoreError> {
    let read = |key: &'static str| -> Result<Option<String>, StoreError> {
        Ok(tx
            .row(
                "cannot read the domain",
                "SELECT value FROM {s}.ordo_meta WHERE key = $1",
                &[&key],
            )?
            .map(|row| row.get(0)))
    };
    let Some(name) = read("domain")? else {
        return Ok(None);
    };
    let version = read("domain_version")?
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ok(Some(StoredDomain { name, version }))
}

/// Refuses another domain's store, or one whose domain tables are newer
/// than `schema`; runs the migrations not yet run and records the version.
pub(crate) fn install(tx: &PgTx, display: &str, schema: &Schema) -> Result<(), StoreError> {
    let stored = stored(tx)?;
    if let Some(stored) = &stored {
        if stored.name != schema.domain.as_str() {
            return Err(StoreError::new(
                ErrorKind::Incompatible,
                format!(
                    "schema {display} belongs to domain \"{}\", not \"{}\"",
                    stored.name, schema.domain
                ),
            ));
        }
        if stored.version > schema.version() {
            return Err(StoreError::new(
                ErrorKind::Incompatible,
                format!(
                    "schema {display}: the tables of domain \"{}\" are at version {}; this application knows up to {}",
                    stored.name,
                    stored.version,
                    schema.version()
                ),
            ));
        }
    }
    let from = stored.as_ref().map_or(0, |s| s.version);
    if stored.is_some() && from == schema.version() {
        return Ok(());
    }
    for (index, sql) in schema.migrations.iter().enumerate().skip(from as usize) {
        tx.batch_execute(sql).map_err(|e| {
            StoreError::new(
                e.kind(),
                format!(
                    "schema {display}: migration {} of domain \"{}\" failed: {e}",
                    index + 1,
                    schema.domain
                ),
            )
        })?;
    }
    tx.run(
        "cannot record the domain",
        "INSERT INTO {s}.ordo_meta (key, value) VALUES ('domain', $1), ('domain_version', $2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[&schema.domain.as_str(), &schema.version().to_string()],
    )?;
    Ok(())
}
