//! The application's own tables: a domain name and an ordered list of
//! migrations that ordo runs in the store's database, in the transaction
//! that creates or upgrades ordo's own tables.
//!
//! Invariant: a store belongs to one domain for its whole life; migrations
//! only ever run forward, each exactly once, and nothing is ever reset.

use ordo_core::domain::{check, Dialect, StoredDomain};
use ordo_core::StoreError;

use crate::conn::PgTx;

pub use ordo_core::domain::{Schema, MIGRATIONS_MAX};

/// The domain the store records, if any.
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
    check(&format!("schema {display}"), stored.as_ref(), schema)?;
    let from = stored.as_ref().map_or(0, |s| s.version);
    if stored.is_some() && from == schema.version() {
        return Ok(());
    }
    for (index, sql) in schema
        .migrations(Dialect::Postgres)
        .enumerate()
        .skip(from as usize)
    {
        tx.batch_execute(sql).map_err(|e| {
            StoreError::new(
                e.kind(),
                format!(
                    "schema {display}: migration {} of domain \"{}\" failed: {e}",
                    index + 1,
                    schema.domain()
                ),
            )
        })?;
    }
    tx.run(
        "cannot record the domain",
        "INSERT INTO {s}.ordo_meta (key, value) VALUES ('domain', $1), ('domain_version', $2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[&schema.domain().as_str(), &schema.version().to_string()],
    )?;
    Ok(())
}
