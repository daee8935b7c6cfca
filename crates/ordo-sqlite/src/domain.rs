//! The application's own tables: a domain name and an ordered list of
//! migrations that ordo runs in the store's file, in the same transaction
//! that creates or upgrades ordo's own tables.
//!
//! Invariant: a store belongs to one domain for its whole life; migrations
//! only ever run forward, each exactly once, and nothing is ever reset.

use ordo_core::domain::{Dialect, StoredDomain};
use ordo_core::StoreError;
use rusqlite::{Connection, OptionalExtension};

use crate::conn::sql_error;

pub use ordo_core::domain::{check, Schema, MIGRATIONS_MAX};

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

/// Records the domain and runs the migrations not yet run, inside the
/// caller's write transaction (after [`check`] under the same lock).
pub(crate) fn install(tx: &Connection, display: &str, schema: &Schema) -> Result<(), StoreError> {
    let err = |e| sql_error(&format!("{display}: cannot install domain tables"), e);
    let stored = stored_domain(tx).map_err(err)?;
    check(display, stored.as_ref(), schema)?;
    let from = stored.map_or(0, |s| s.version);
    for (index, sql) in schema
        .migrations(Dialect::Sqlite)
        .enumerate()
        .skip(from as usize)
    {
        tx.execute_batch(sql).map_err(|e| {
            sql_error(
                &format!(
                    "{display}: migration {} of domain \"{}\" failed",
                    index + 1,
                    schema.domain()
                ),
                e,
            )
        })?;
    }
    tx.execute(
        "INSERT INTO ordo_meta (key, value) VALUES ('domain', ?1), ('domain_version', ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        [schema.domain().as_str(), &schema.version().to_string()],
    )
    .map_err(err)?;
    Ok(())
}
