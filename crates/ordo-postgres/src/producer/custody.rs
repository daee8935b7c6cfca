//! Custody per destination on PostgreSQL (PROTOCOL.md section 12): the
//! destinations, each one's marks on the outbox rows and relay heads, and
//! the producer's audit log of the operator's actions on them.
//!
//! Invariant: a flow's destinations are decided in the transaction of its
//! first event, and `destination add`/`remove` exclude every appender for
//! their own transaction ([`lock_for_membership`]): no flow begins
//! between a destination's creation and its relay heads.

use std::collections::HashMap;

use ordo_core::destination::{
    AbandonRequest, Custody, Destination, DestinationRefused, DestinationStart, ProducerRepair,
};
use ordo_core::ops::ProducerStatus;
use ordo_core::{DestinationName, ErrorKind, FlowId, StoreError, StoreId};
use postgres::Row;

use super::sql::settle_sql;
use crate::conn::PgTx;
use crate::error::corrupt;

const READ: &str = "producer: cannot read the destinations";

fn bad(e: &dyn std::fmt::Display) -> StoreError {
    corrupt("producer: stored destination", e.to_string())
}

/// The id of the destination named `name`, if any.
fn id_of(conn: &PgTx, name: &DestinationName) -> Result<Option<i64>, StoreError> {
    let row = conn.row(
        READ,
        "SELECT id FROM {s}.destination WHERE name = $1",
        &[&name.as_str()],
    )?;
    Ok(row.map(|row| row.get(0)))
}

/// The destination `name` chooses: that one, or with `None` the store's
/// only one.
pub(super) fn choose(
    conn: &PgTx,
    name: Option<&DestinationName>,
) -> Result<Result<i64, DestinationRefused>, StoreError> {
    if let Some(name) = name {
        return Ok(id_of(conn, name)?.ok_or_else(|| DestinationRefused::Unknown(name.clone())));
    }
    let rows = conn.rows(
        READ,
        "SELECT id, count(*) OVER () FROM {s}.destination ORDER BY id LIMIT 2",
        &[],
    )?;
    match rows.as_slice() {
        [row] => Ok(Ok(row.get(0))),
        [row, ..] => Ok(Err(DestinationRefused::Ambiguous(
            row.get::<_, i64>(1).max(0) as usize,
        ))),
        [] => Err(corrupt("producer: destination", "no destination stored")),
    }
}

/// [`choose`] of the only destination, for the relay's calls made without
/// a choice: several destinations are the caller's error.
pub(super) fn only(conn: &PgTx) -> Result<i64, StoreError> {
    choose(conn, None)?.map_err(|refused| StoreError::new(ErrorKind::Other, refused.to_string()))
}

/// One destination's signals at `now_ms`.
fn status_of(conn: &PgTx, destination: i64, now_ms: i64) -> Result<ProducerStatus, StoreError> {
    let row = conn.row(
        "producer: cannot read the status",
        "SELECT count(*), min(o.created_at_ms), count(*) FILTER (WHERE c.quarantined),
                count(*) FILTER (WHERE NOT c.quarantined AND c.next_attempt_at_ms > $2),
                count(*) FILTER (WHERE c.quarantined AND c.quarantine_reason = 'producer_rewound')
         FROM {s}.custody_pending p
         JOIN {s}.custody c ON c.position = p.position AND c.destination = p.destination
         JOIN {s}.outbox o ON o.position = p.position
         WHERE p.destination = $1",
        &[&destination, &now_ms],
    )?;
    let row = row.expect("an aggregate returns one row");
    let count = |i: usize| row.get::<_, i64>(i).max(0) as u64;
    Ok(ProducerStatus {
        backlog: count(0),
        oldest_pending_created_at_ms: row.get(1),
        quarantined: count(2),
        rewound: count(4),
        backing_off: count(3),
    })
}

/// Every destination by name, with its signals at `now_ms`.
pub(super) fn destinations(conn: &PgTx, now_ms: i64) -> Result<Vec<Destination>, StoreError> {
    let rows = conn.rows(
        READ,
        "SELECT id, name, start, consumer_store_id, created_at_ms FROM {s}.destination
         ORDER BY name",
        &[],
    )?;
    rows.iter()
        .map(|row| {
            let start: String = row.get(2);
            Ok(Destination {
                name: DestinationName::new(row.get::<_, String>(1)).map_err(|e| bad(&e))?,
                from: DestinationStart::parse(&start).ok_or_else(|| bad(&start))?,
                consumer_store_id: stored_store_id(row.get(3))?,
                created_at_ms: row.get(4),
                status: status_of(conn, row.get(0), now_ms)?,
            })
        })
        .collect()
}

fn stored_store_id(id: Option<String>) -> Result<Option<StoreId>, StoreError> {
    id.map(|id| id.parse::<StoreId>().map_err(|e| bad(&e)))
        .transpose()
}

/// Records `consumer` as the consumer store of `destination` at its first
/// delivery from a known one, in the bookkeeping transaction `tx`; refuses
/// another consumer afterwards ([`ordo_core::destination::check_consumer`]).
/// The destination's row is written once, at the first delivery: a later
/// check only reads it.
pub(super) fn check_consumer(
    tx: &PgTx,
    destination: i64,
    consumer: Option<&StoreId>,
) -> Result<(), StoreError> {
    let Some(consumer) = consumer else {
        return Ok(());
    };
    if let Some(first) = checked_consumer(tx, destination, consumer)? {
        let recorded = tx.run(
            "producer: cannot record the destination's consumer",
            "UPDATE {s}.destination SET consumer_store_id = $2
             WHERE id = $1 AND consumer_store_id IS NULL",
            &[&destination, &first.as_str()],
        )?;
        if recorded == 0 {
            // Another relay recorded one meanwhile: check against it.
            return check_consumer(tx, destination, Some(consumer));
        }
    }
    Ok(())
}

/// Checks `consumer` against the consumer store `destination` recorded
/// ([`ordo_core::destination::check_consumer`]) without writing: the
/// identity to record when none is yet.
pub(super) fn checked_consumer(
    conn: &PgTx,
    destination: i64,
    consumer: &StoreId,
) -> Result<Option<StoreId>, StoreError> {
    let (name, recorded) = destination_consumer(conn, destination)?;
    ordo_core::destination::check_consumer(&name, recorded.as_ref(), Some(consumer))
}

/// The name of `destination` and the consumer store it recorded.
pub(super) fn destination_consumer(
    conn: &PgTx,
    destination: i64,
) -> Result<(DestinationName, Option<StoreId>), StoreError> {
    let context = "producer: cannot read the destination's consumer";
    let sql = "SELECT name, consumer_store_id FROM {s}.destination WHERE id = $1";
    let row = (conn.row(context, sql, &[&destination])?)
        .ok_or_else(|| corrupt("producer: destination", "the chosen destination is gone"))?;
    let name = DestinationName::new(row.get::<_, String>(0)).map_err(|e| bad(&e))?;
    Ok((name, stored_store_id(row.get(1))?))
}

/// Each destination's custody of the outbox rows at `positions`: one
/// entry per destination its flow is delivered to, by position.
pub(super) fn custody_of(
    conn: &PgTx,
    positions: &[i64],
) -> Result<HashMap<i64, Vec<Custody>>, StoreError> {
    let rows = conn.rows(
        "producer: cannot read the custody of outbox rows",
        "SELECT o.position, d.name, coalesce(c.accepted, false), c.accepted_at_ms,
                coalesce(c.attempts, 0), c.last_outcome, c.last_error,
                coalesce(c.next_attempt_at_ms, 0), coalesce(c.quarantined, false),
                c.quarantine_reason, c.quarantine_detail,
                coalesce(c.abandoned, false) OR (c.position IS NULL AND h.abandoned_seq <= o.seq)
         FROM {s}.outbox o
         JOIN {s}.relay_head h ON h.flow_id = o.flow_id
         JOIN {s}.destination d ON d.id = h.destination
         LEFT JOIN {s}.custody c ON c.position = o.position AND c.destination = h.destination
         WHERE o.position = ANY (ARRAY(SELECT unnest($1::bigint[])))
           AND (c.position IS NOT NULL OR h.abandoned_seq <= o.seq)",
        &[&positions],
    )?;
    let mut custody: HashMap<i64, Vec<Custody>> = HashMap::new();
    for row in &rows {
        custody
            .entry(row.get(0))
            .or_default()
            .push(custody_row(row)?);
    }
    Ok(custody)
}

fn custody_row(row: &Row) -> Result<Custody, StoreError> {
    Ok(Custody {
        destination: DestinationName::new(row.get::<_, String>(1)).map_err(|e| bad(&e))?,
        accepted: row.get(2),
        accepted_at_ms: row.get(3),
        attempts: row.get::<_, i64>(4).max(0) as u64,
        last_outcome: row.get(5),
        last_error: row.get(6),
        next_attempt_at_ms: row.get(7),
        quarantined: row.get(8),
        quarantine_reason: row.get(9),
        quarantine_detail: row.get(10),
        abandoned: row.get(11),
    })
}

/// Waits for every appender in progress and keeps new ones out until the
/// transaction `tx` ends: an appender writes its flows' heads before it
/// hands its rows to the destinations, so it either committed before this
/// lock or reads the destinations after this transaction.
///
/// It also waits for the relays' bookkeeping that settles rows and keeps
/// it out: this transaction then settles or unsettles rows of many flows
/// at once, in an order of its own, and two such writers each holding a
/// row the other wants would deadlock.
fn lock_for_membership(tx: &PgTx) -> Result<(), StoreError> {
    let context = "producer: cannot lock out the appenders";
    tx.run(context, "LOCK TABLE {s}.outbox_head IN SHARE MODE", &[])?;
    tx.run(
        context,
        "LOCK TABLE {s}.outbox IN SHARE ROW EXCLUSIVE MODE",
        &[],
    )?;
    Ok(())
}

/// Adds the destination `name` in the write transaction `tx` at `now_ms`:
/// with `from start` every flow is delivered to it from its first event
/// (refused, naming a flow, when one's early events were pruned), with
/// `from now` only the flows begun after it.
pub(super) fn add(
    tx: &PgTx,
    name: &DestinationName,
    from: DestinationStart,
    now_ms: i64,
) -> Result<Result<(), DestinationRefused>, StoreError> {
    let context = "producer: cannot add a destination";
    lock_for_membership(tx)?;
    if id_of(tx, name)?.is_some() {
        return Ok(Err(DestinationRefused::Exists(name.clone())));
    }
    if from == DestinationStart::Start {
        let pruned = tx.row(
            context,
            "SELECT h.flow_id FROM {s}.outbox_head h WHERE h.last_seq >= 1 AND NOT EXISTS (
                 SELECT 1 FROM {s}.outbox o WHERE o.flow_id = h.flow_id AND o.seq = 1)
             ORDER BY h.flow_id LIMIT 1",
            &[],
        )?;
        if let Some(row) = pruned {
            let flow = FlowId::new(row.get::<_, String>(0))
                .map_err(|e| corrupt("producer: stored flow id", e))?;
            return Ok(Err(DestinationRefused::Pruned(flow)));
        }
    }
    let id: i64 = tx
        .row(
            context,
            "INSERT INTO {s}.destination (name, start, created_at_ms) VALUES ($1, $2, $3)
             RETURNING id",
            &[&name.as_str(), &from.as_str(), &now_ms],
        )?
        .expect("an insert returning its row")
        .get(0);
    if from == DestinationStart::Start {
        tx.run(
            context,
            "WITH heads AS (
                 INSERT INTO {s}.relay_head (flow_id, destination, last_seq, relay_seq)
                 SELECT flow_id, $1, last_seq, 1 FROM {s}.outbox_head WHERE last_seq >= 1),
             marks AS (
                 INSERT INTO {s}.custody (position, destination) SELECT position, $1 FROM {s}.outbox),
             listed AS (
                 INSERT INTO {s}.custody_pending (destination, position)
                 SELECT $1, position FROM {s}.outbox)
             UPDATE {s}.outbox SET destinations_waiting = destinations_waiting + 1,
                 accepted = false, accepted_at_ms = NULL",
            &[&id],
        )?;
    }
    Ok(Ok(()))
}

/// Removes the destination `name` and its custody in the write transaction
/// `tx`, audited; the rows it alone held back are settled.
pub(super) fn remove(
    tx: &PgTx,
    name: &DestinationName,
    (by, reason): (&str, &str),
    now_ms: i64,
) -> Result<Result<i64, DestinationRefused>, StoreError> {
    let context = "producer: cannot remove a destination";
    lock_for_membership(tx)?;
    let Some(id) = id_of(tx, name)? else {
        return Ok(Err(DestinationRefused::Unknown(name.clone())));
    };
    let count: i64 = (tx.row(context, "SELECT count(*) FROM {s}.destination", &[])?)
        .expect("an aggregate returns one row")
        .get(0);
    if count <= 1 {
        return Ok(Err(DestinationRefused::Last(name.clone())));
    }
    tx.run(
        context,
        concat!(
            "WITH held AS (
                 DELETE FROM {s}.custody_pending WHERE destination = $1 RETURNING position),
             settled AS (",
            settle_sql!("held", "$2::bigint"),
            "),
             marks AS (DELETE FROM {s}.custody WHERE destination = $1),
             heads AS (DELETE FROM {s}.relay_head WHERE destination = $1)
             DELETE FROM {s}.destination WHERE id = $1"
        ),
        &[&id, &now_ms],
    )?;
    audit(
        tx,
        ("destination_remove", Some(name)),
        None,
        (by, reason),
        now_ms,
    )?;
    Ok(Ok(id))
}

/// Abandons `request.flow` for `request.destination` in the write
/// transaction `tx`, audited (PROTOCOL.md section 12): the flow's relay
/// head there stops for good at its lowest seq the destination does not
/// hold (its last seq plus one when it holds them all, so that only later
/// events are abandoned), that destination's unaccepted marks of the flow
/// become abandoned and leave its quarantine, and the rows no destination
/// waits for any more are settled. Appends later give the flow no mark
/// there. Every refusal comes before the first write.
pub(super) fn abandon(
    tx: &PgTx,
    request: &AbandonRequest,
    now_ms: i64,
) -> Result<Result<ProducerRepair, DestinationRefused>, StoreError> {
    let context = "producer: cannot abandon a flow";
    let (name, flow) = (&request.destination, request.flow.as_str());
    lock_for_membership(tx)?;
    let (id, last_seq) = match abandonable(tx, request)? {
        Ok(found) => found,
        Err(refused) => return Ok(Err(refused)),
    };
    let first: i64 = (tx.row(
        context,
        "SELECT coalesce(min(o.seq), $3::bigint + 1) FROM {s}.outbox o
         JOIN {s}.custody c ON c.position = o.position AND c.destination = $2
         WHERE o.flow_id = $1 AND NOT c.accepted",
        &[&flow, &id, &last_seq],
    )?)
    .expect("an aggregate returns one row")
    .get(0);
    let event_id: Option<String> = tx
        .row(
            context,
            "SELECT event_id FROM {s}.outbox WHERE flow_id = $1 AND seq = $2",
            &[&flow, &first],
        )?
        .map(|row| row.get(0));
    tx.run(
        context,
        concat!(
            "WITH head AS (
                 UPDATE {s}.relay_head SET abandoned_seq = $3, relay_seq = NULL, relay_due_ms = 0
                 WHERE flow_id = $1 AND destination = $2),
             marks AS (
                 UPDATE {s}.custody c SET abandoned = true, quarantined = false,
                     quarantine_reason = NULL, quarantine_detail = NULL
                 FROM {s}.outbox o
                 WHERE o.flow_id = $1 AND o.seq >= $3 AND c.position = o.position
                   AND c.destination = $2 AND NOT c.accepted),
             held AS (
                 DELETE FROM {s}.custody_pending p USING {s}.outbox o
                 WHERE o.flow_id = $1 AND o.seq >= $3 AND p.position = o.position
                   AND p.destination = $2
                 RETURNING p.position)
             ",
            settle_sql!("held", "$4::bigint")
        ),
        &[&flow, &id, &first, &now_ms],
    )?;
    let (by, reason) = (request.by.as_str(), request.reason.as_str());
    let audited = Some((flow, Some(first), event_id.as_deref()));
    let repair = audit(tx, ("abandon", Some(name)), audited, (by, reason), now_ms)?;
    Ok(Ok(repair))
}

/// The destination's id and the flow's last seq when `request` may be
/// carried out; else why not. The flow's head is locked until the
/// transaction ends: no append of the flow comes in between.
fn abandonable(
    tx: &PgTx,
    request: &AbandonRequest,
) -> Result<Result<(i64, i64), DestinationRefused>, StoreError> {
    let context = "producer: cannot read a flow's relay head";
    let (name, flow) = (&request.destination, request.flow.as_str());
    let Some(id) = id_of(tx, name)? else {
        return Ok(Err(DestinationRefused::Unknown(name.clone())));
    };
    let head = tx.row(
        context,
        "SELECT last_seq FROM {s}.outbox_head WHERE flow_id = $1 AND last_seq >= 1 FOR UPDATE",
        &[&flow],
    )?;
    let Some(last_seq) = head.map(|row| row.get::<_, i64>(0)) else {
        return Ok(Err(DestinationRefused::UnknownFlow(request.flow.clone())));
    };
    let relay = tx.row(
        context,
        "SELECT abandoned_seq FROM {s}.relay_head WHERE flow_id = $1 AND destination = $2",
        &[&flow, &id],
    )?;
    let (flow, destination) = (request.flow.clone(), name.clone());
    match relay.map(|row| row.get::<_, Option<i64>>(0)) {
        None => Ok(Err(DestinationRefused::NotDelivered { flow, destination })),
        Some(Some(_)) => Ok(Err(DestinationRefused::AlreadyAbandoned {
            flow,
            destination,
        })),
        Some(None) => Ok(Ok((id, last_seq))),
    }
}

/// One row of the producer's audit log: `flow` with its seq and event id
/// when the action names one event.
fn audit(
    tx: &PgTx,
    (action, destination): (&str, Option<&DestinationName>),
    flow: Option<(&str, Option<i64>, Option<&str>)>,
    (by, reason): (&str, &str),
    now_ms: i64,
) -> Result<ProducerRepair, StoreError> {
    let (flow_id, seq, event_id) = match flow {
        Some((flow, seq, event)) => (Some(flow), seq, event),
        None => (None, None, None),
    };
    let destination = destination.map(DestinationName::as_str);
    let row = tx.row(
        "producer: cannot write the audit log",
        "INSERT INTO {s}.producer_repair (action, destination, flow_id, seq, event_id, reason, by, at_ms)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
        &[&action, &destination, &flow_id, &seq, &event_id, &reason, &by, &now_ms],
    )?;
    Ok(ProducerRepair {
        id: row.expect("an insert returning its row").get(0),
        action: action.to_string(),
        destination: destination.map(str::to_string),
        flow_id: flow_id.map(str::to_string),
        seq,
        event_id: event_id.map(str::to_string),
        reason: reason.to_string(),
        by: by.to_string(),
        at_ms: now_ms,
    })
}

/// The producer's audit log, oldest first.
pub(super) fn repairs(conn: &PgTx) -> Result<Vec<ProducerRepair>, StoreError> {
    let rows = conn.rows(
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
