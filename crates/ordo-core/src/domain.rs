//! The application's own tables: a domain name and an ordered list of
//! migrations that a backend runs in the store, in the transaction that
//! creates or upgrades ordo's own tables. One [`Schema`] opens a store on
//! any backend: each migration is one SQL text both dialects accept, or one
//! text per dialect.
//!
//! Invariant: a store belongs to one domain for its whole life; migrations
//! only ever run forward, each exactly once, and nothing is ever reset.
//! This module decides ([`check`]); the backends run the SQL.

use std::borrow::Cow;

use crate::error::{ErrorKind, StoreError};
use crate::ids::{DomainName, RuleViolation};

/// The most migrations a schema may declare.
pub const MIGRATIONS_MAX: usize = 1_000;

/// The SQL dialect of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite (`ordo-sqlite`).
    Sqlite,
    /// PostgreSQL (`ordo-postgres`).
    Postgres,
}

/// One migration: the same SQL for every dialect, or one text each.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Migration {
    Both(Cow<'static, str>),
    Each {
        sqlite: Cow<'static, str>,
        postgres: Cow<'static, str>,
    },
}

impl Migration {
    fn sql(&self, dialect: Dialect) -> &str {
        match (self, dialect) {
            (Migration::Both(sql), _) => sql,
            (Migration::Each { sqlite, .. }, Dialect::Sqlite) => sqlite,
            (Migration::Each { postgres, .. }, Dialect::Postgres) => postgres,
        }
    }
}

/// The domain that owns a store, and the SQL that creates and upgrades the
/// application's own tables beside ordo's (on PostgreSQL, in the schema the
/// SQL names, or the connection's `search_path`, `public` by default).
///
/// ```
/// use ordo_core::domain::{Dialect, Schema};
///
/// let schema = Schema::new("orders")?
///     .migration("CREATE TABLE orders (order_id TEXT PRIMARY KEY, total_cents BIGINT NOT NULL)")
///     .migration_each(
///         "ALTER TABLE orders ADD COLUMN placed_at INTEGER",
///         "ALTER TABLE orders ADD COLUMN placed_at timestamptz",
///     );
/// assert_eq!(schema.domain().as_str(), "orders");
/// assert_eq!(schema.version(), 2);
/// assert!(schema.migrations(Dialect::Postgres).nth(1).unwrap().ends_with("timestamptz"));
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
    migrations: Vec<Migration>,
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

    /// Adds the next migration: SQL that every dialect accepts, run as one
    /// batch inside the store's write transaction.
    ///
    /// # Panics
    /// Past [`MIGRATIONS_MAX`] migrations.
    pub fn migration(self, sql: impl Into<Cow<'static, str>>) -> Schema {
        self.push(Migration::Both(sql.into()))
    }

    /// Adds the next migration as one SQL text per dialect.
    ///
    /// # Panics
    /// Past [`MIGRATIONS_MAX`] migrations.
    pub fn migration_each(
        self,
        sqlite: impl Into<Cow<'static, str>>,
        postgres: impl Into<Cow<'static, str>>,
    ) -> Schema {
        self.push(Migration::Each {
            sqlite: sqlite.into(),
            postgres: postgres.into(),
        })
    }

    fn push(mut self, migration: Migration) -> Schema {
        assert!(
            self.migrations.len() < MIGRATIONS_MAX,
            "too many migrations"
        );
        self.migrations.push(migration);
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

    /// The migrations in `dialect`, in order.
    pub fn migrations(&self, dialect: Dialect) -> impl Iterator<Item = &str> {
        self.migrations.iter().map(move |m| m.sql(dialect))
    }
}

/// The domain a store records, and how many of its migrations have run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredDomain {
    /// The domain's name.
    pub name: String,
    /// How many of its migrations have run.
    pub version: i64,
}

/// Refuses a store (shown as `display`) of another domain, or one whose
/// domain tables are newer than `schema`. Returns whether migrations are
/// left to run (always for a store that records no domain yet).
pub fn check(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_of_another_domain_or_a_newer_version_is_refused() {
        let schema = Schema::new("orders").unwrap().migration("A").migration("B");
        let stored = |name: &str, version| StoredDomain {
            name: name.into(),
            version,
        };
        let cases = [
            (None, Ok(true)),
            (Some(stored("orders", 0)), Ok(true)),
            (Some(stored("orders", 1)), Ok(true)),
            (Some(stored("orders", 2)), Ok(false)),
            (
                Some(stored("orders", 3)),
                Err("at version 3; this application knows up to 2"),
            ),
            (
                Some(stored("billing", 1)),
                Err("belongs to domain \"billing\", not \"orders\""),
            ),
        ];
        for (stored, expected) in cases {
            let got = check("x.db", stored.as_ref(), &schema);
            match (got, expected) {
                (Ok(left), Ok(right)) => assert_eq!(left, right, "{stored:?}"),
                (Err(e), Err(part)) => {
                    assert_eq!(e.kind(), ErrorKind::Incompatible);
                    assert!(e.to_string().contains(part), "{e}");
                }
                (got, expected) => panic!("{stored:?}: {got:?} against {expected:?}"),
            }
        }
    }

    #[test]
    fn each_dialect_reads_its_own_text() {
        let schema = Schema::new("d")
            .unwrap()
            .migration("BOTH")
            .migration_each("LITE", "PG");
        let lite: Vec<_> = schema.migrations(Dialect::Sqlite).collect();
        let pg: Vec<_> = schema.migrations(Dialect::Postgres).collect();
        assert_eq!((lite, pg), (vec!["BOTH", "LITE"], vec!["BOTH", "PG"]));
    }
}
