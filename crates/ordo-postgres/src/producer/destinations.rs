//! The producer's destinations on PostgreSQL. This backend keeps custody in
//! the outbox itself, for one destination: `default`, the one every store
//! has; adding another is refused as not supported here yet.

use ordo_core::destination::{Destination, DestinationRefused, DestinationStart, ProducerRepair};
use ordo_core::{DestinationName, ErrorKind, ProducerOps, StoreError, StoreId};

use super::PgProducer;

/// Every destination (the one), with its signals at `now_ms`.
pub(super) fn destinations(
    store: &mut PgProducer,
    now_ms: i64,
) -> Result<Vec<Destination>, StoreError> {
    let rows = store.conn.rows(
        "producer: cannot read the destinations",
        "SELECT name, start, consumer_store_id, created_at_ms FROM {s}.destination ORDER BY name",
        &[],
    )?;
    let status = store.producer_status(now_ms)?;
    let bad = |e: &dyn std::fmt::Display| {
        crate::error::corrupt("producer: stored destination", e.to_string())
    };
    rows.iter()
        .map(|row| {
            let start: String = row.get(1);
            Ok(Destination {
                name: DestinationName::new(row.get::<_, String>(0)).map_err(|e| bad(&e))?,
                from: DestinationStart::parse(&start).ok_or_else(|| bad(&start))?,
                consumer_store_id: row
                    .get::<_, Option<String>>(2)
                    .map(|id| id.parse::<StoreId>().map_err(|e| bad(&e)))
                    .transpose()?,
                created_at_ms: row.get(3),
                status: status.clone(),
            })
        })
        .collect()
}

/// Whether `name` is the store's destination.
fn exists(store: &mut PgProducer, name: &DestinationName) -> Result<bool, StoreError> {
    Ok(store
        .conn
        .row(
            "producer: cannot read the destinations",
            "SELECT 1 FROM {s}.destination WHERE name = $1",
            &[&name.as_str()],
        )?
        .is_some())
}

/// Refuses a destination besides the one.
pub(super) fn add(
    store: &mut PgProducer,
    name: &DestinationName,
) -> Result<Result<(), DestinationRefused>, StoreError> {
    if exists(store, name)? {
        return Ok(Err(DestinationRefused::Exists(name.clone())));
    }
    Err(StoreError::new(
        ErrorKind::Incompatible,
        "a PostgreSQL producer store has one destination, default, in this release",
    ))
}

/// The one destination is the last: never removed.
pub(super) fn remove(
    store: &mut PgProducer,
    name: &DestinationName,
) -> Result<Result<(), DestinationRefused>, StoreError> {
    if exists(store, name)? {
        return Ok(Err(DestinationRefused::Last(name.clone())));
    }
    Ok(Err(DestinationRefused::Unknown(name.clone())))
}

/// `outbox abandon` needs custody per destination, which this backend
/// does not keep yet: refused, writing nothing.
pub(super) fn abandon_unsupported() -> StoreError {
    StoreError::new(
        ErrorKind::Incompatible,
        "outbox abandon needs custody per destination, not yet kept by a PostgreSQL producer store in this release",
    )
}

/// Any choice but the one destination is refused.
pub(super) fn choose(
    store: &mut PgProducer,
    name: Option<&DestinationName>,
) -> Result<Result<(), DestinationRefused>, StoreError> {
    match name {
        Some(name) if !exists(store, name)? => Ok(Err(DestinationRefused::Unknown(name.clone()))),
        _ => Ok(Ok(())),
    }
}

/// The producer's audit log, oldest first.
pub(super) fn repairs(store: &mut PgProducer) -> Result<Vec<ProducerRepair>, StoreError> {
    let rows = store.conn.rows(
        "producer: cannot read the audit log",
        "SELECT id, action, destination, flow_id, seq, event_id, reason, by, at_ms
         FROM {s}.producer_repair ORDER BY id LIMIT 100000",
        &[],
    )?;
    Ok(rows
        .iter()
        .map(|row| ProducerRepair {
            id: row.get(0),
            action: row.get(1),
            destination: row.get(2),
            flow_id: row.get(3),
            seq: row.get(4),
            event_id: row.get(5),
            reason: row.get(6),
            by: row.get(7),
            at_ms: row.get(8),
        })
        .collect())
}
