//! Custody per destination (PROTOCOL.md section 12): the destinations, each
//! one's marks on the outbox rows and relay heads, and the producer's audit
//! log of the operator's actions on them.

use ordo_core::destination::{
    AbandonRequest, Custody, Destination, DestinationRefused, DestinationStart, ProducerRepair,
};
use ordo_core::ops::ProducerStatus;
use ordo_core::{DestinationName, ErrorKind, Receipt, StoreError, StoreId};
use rusqlite::{params, Connection, OptionalExtension};

use crate::conn::{collect_rows, corrupt, exec_cached, row_cached, sql_error, Held};

/// The tables of custody per destination (`IF NOT EXISTS`): created with a
/// new store, and by the upgrade of an earlier one before it copies the
/// marks in.
macro_rules! custody_ddl {
    () => {
        "
CREATE TABLE IF NOT EXISTS destination (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    name              TEXT    NOT NULL UNIQUE,
    start             TEXT    NOT NULL CHECK (start IN ('start', 'now')),
    consumer_store_id TEXT,
    created_at_ms     INTEGER NOT NULL
);
-- One destination's marks on one outbox row; a row appended to a flow
-- abandoned for a destination has none there.
CREATE TABLE IF NOT EXISTS custody (
    position           INTEGER NOT NULL,
    destination        INTEGER NOT NULL,
    accepted           INTEGER NOT NULL DEFAULT 0 CHECK (accepted IN (0, 1)),
    accepted_at_ms     INTEGER,
    quarantined        INTEGER NOT NULL DEFAULT 0 CHECK (quarantined IN (0, 1)),
    quarantine_reason  TEXT,
    quarantine_detail  TEXT,
    attempts           INTEGER NOT NULL DEFAULT 0,
    last_outcome       TEXT,
    last_error         TEXT,
    next_attempt_at_ms INTEGER NOT NULL DEFAULT 0,
    abandoned          INTEGER NOT NULL DEFAULT 0 CHECK (abandoned IN (0, 1)),
    PRIMARY KEY (position, destination),
    CHECK (NOT (accepted = 1 AND quarantined = 1))
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS custody_unaccepted ON custody (destination, position)
    WHERE accepted = 0 AND abandoned = 0;
CREATE TABLE IF NOT EXISTS producer_repair (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    action      TEXT    NOT NULL,
    destination TEXT,
    flow_id     TEXT,
    seq         INTEGER,
    event_id    TEXT,
    reason      TEXT    NOT NULL,
    by          TEXT    NOT NULL,
    at_ms       INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS producer_repair_append_only_update BEFORE UPDATE ON producer_repair
BEGIN SELECT RAISE(ABORT, 'producer_repair is append-only'); END;
CREATE TRIGGER IF NOT EXISTS producer_repair_append_only_delete BEFORE DELETE ON producer_repair
BEGIN SELECT RAISE(ABORT, 'producer_repair is append-only'); END;
"
    };
}
pub(crate) use custody_ddl;

/// The relay heads: one per flow delivered to a destination, keyed by the
/// flow's integer key (`outbox_head.flow`) since version 9.
macro_rules! relay_head_ddl {
    () => {
        "
-- A flow delivered to a destination: that destination's relay head of it.
CREATE TABLE IF NOT EXISTS relay_head (
    flow           INTEGER NOT NULL,
    destination    INTEGER NOT NULL,
    relay_seq      INTEGER,
    relay_due_ms   INTEGER NOT NULL DEFAULT 0,
    relay_turn     INTEGER NOT NULL DEFAULT 0,
    -- Rewound at this seq (a receipt of cause producer_rewound): nothing
    -- of the flow from there on is relayed to the destination.
    relay_stop_seq INTEGER,
    -- Abandoned from this seq on for the destination.
    abandoned_seq  INTEGER,
    PRIMARY KEY (flow, destination)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS relay_head_turn ON relay_head (destination, relay_turn, flow)
    WHERE relay_seq IS NOT NULL;
"
    };
}
pub(crate) use relay_head_ddl;

/// Whether the outbox row `o` is held by every destination its flow is
/// delivered to (an abandoned destination does not hold it).
macro_rules! held_everywhere_sql {
    () => {
        "(NOT EXISTS (SELECT 1 FROM custody c WHERE c.position = o.position AND c.accepted = 0)
          AND NOT EXISTS (SELECT 1 FROM relay_head h
              WHERE h.flow = o.flow AND h.abandoned_seq <= o.seq))"
    };
}
pub(crate) use held_everywhere_sql;

/// Version 5 of an earlier producer file: one destination, `default`,
/// holding the marks and relay heads the outbox kept; the outbox's own
/// columns of them stay, unused, and `accepted` becomes the row's settled
/// mark (every destination of its flow holds it or abandoned it).
pub(crate) const UPGRADE_FROM_4: &str = concat!(
    custody_ddl!(),
    // The relay heads of versions 5 to 8, keyed by the flow's text id
    // (version 9 rebuilds them).
    "
CREATE TABLE IF NOT EXISTS relay_head (
    flow_id        TEXT    NOT NULL,
    destination    INTEGER NOT NULL,
    relay_seq      INTEGER,
    relay_due_ms   INTEGER NOT NULL DEFAULT 0,
    relay_turn     INTEGER NOT NULL DEFAULT 0,
    relay_stop_seq INTEGER,
    abandoned_seq  INTEGER,
    PRIMARY KEY (flow_id, destination)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS relay_head_turn ON relay_head (destination, relay_turn, flow_id)
    WHERE relay_seq IS NOT NULL;
",
    "
INSERT INTO destination (id, name, start, consumer_store_id, created_at_ms)
    VALUES (1, 'default', 'start', NULL, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER));
INSERT INTO custody (position, destination, accepted, accepted_at_ms, quarantined,
        quarantine_reason, quarantine_detail, attempts, last_outcome, last_error, next_attempt_at_ms)
    SELECT position, 1, accepted, accepted_at_ms, quarantined,
        -- The code: the last outcome, unless a delivery after the quarantine
        -- (the first-pending policy hands over quarantined rows) failed; then
        -- the text's, which begins with it.
        CASE WHEN quarantined = 1 THEN CASE
            WHEN last_outcome IN ('conflict', 'producer_rewound', 'too_large', 'rejected_by_consumer')
                THEN last_outcome
            WHEN substr(quarantine_reason, 1, instr(quarantine_reason, ':') - 1)
                IN ('producer_rewound', 'too_large', 'rejected_by_consumer')
                THEN substr(quarantine_reason, 1, instr(quarantine_reason, ':') - 1)
            ELSE 'conflict' END END,
        CASE WHEN quarantined = 1 THEN quarantine_reason END,
        attempts, last_outcome, last_error, next_attempt_at_ms
    FROM outbox;
INSERT INTO relay_head (flow_id, destination, relay_seq, relay_due_ms, relay_turn, relay_stop_seq)
    SELECT flow_id, 1, relay_seq, relay_due_ms, relay_turn, relay_stop_seq FROM outbox_head;
UPDATE outbox SET quarantined = 0 WHERE quarantined = 1;
DROP INDEX IF EXISTS outbox_head_relay;
DROP INDEX IF EXISTS outbox_unaccepted;
"
);

/// The id of the destination named `name`, if any.
pub(crate) fn id_of(conn: &Connection, name: &DestinationName) -> Result<Option<i64>, StoreError> {
    row_cached(
        conn,
        "SELECT id FROM destination WHERE name = ?1",
        [name.as_str()],
        |row| row.get(0),
    )
    .optional()
    .map_err(|e| sql_error("producer: cannot read the destinations", e))
}

/// The destination `name` chooses: that one, or with `None` the store's
/// only one.
pub(crate) fn choose(
    conn: &Connection,
    name: Option<&DestinationName>,
) -> Result<Result<i64, DestinationRefused>, StoreError> {
    if let Some(name) = name {
        return Ok(id_of(conn, name)?.ok_or_else(|| DestinationRefused::Unknown(name.clone())));
    }
    let ids: Vec<i64> = collect_rows(
        conn,
        "producer: cannot read the destinations",
        "SELECT id FROM destination ORDER BY id LIMIT 2",
        [],
        |row| row.get(0),
        Ok,
    )?;
    match ids.as_slice() {
        [id] => Ok(Ok(*id)),
        _ => {
            let count: i64 = row_cached(conn, "SELECT count(*) FROM destination", [], |row| {
                row.get(0)
            })
            .map_err(|e| sql_error("producer: cannot read the destinations", e))?;
            Ok(Err(DestinationRefused::Ambiguous(count.max(0) as usize)))
        }
    }
}

/// [`choose`] of the only destination, for the relay's calls made without
/// a choice: several destinations are the caller's error.
pub(crate) fn only(conn: &Connection) -> Result<i64, StoreError> {
    choose(conn, None)?.map_err(|refused| StoreError::new(ErrorKind::Other, refused.to_string()))
}

/// One destination's signals at `now_ms`.
pub(crate) fn status_of(
    conn: &Connection,
    destination: i64,
    now_ms: i64,
) -> Result<ProducerStatus, StoreError> {
    row_cached(
        conn,
        "SELECT count(*), min(o.created_at_ms), coalesce(sum(c.quarantined), 0),
                coalesce(sum(c.quarantined = 0 AND c.next_attempt_at_ms > ?2), 0),
                coalesce(sum(c.quarantined = 1 AND c.quarantine_reason = 'producer_rewound'), 0)
         FROM custody c JOIN outbox o ON o.position = c.position
         WHERE c.destination = ?1 AND c.accepted = 0 AND c.abandoned = 0",
        params![destination, now_ms],
        |row| {
            let count = |i| row.get::<_, i64>(i).map(|n| n.max(0) as u64);
            Ok(ProducerStatus {
                backlog: count(0)?,
                oldest_pending_created_at_ms: row.get(1)?,
                quarantined: count(2)?,
                rewound: count(4)?,
                backing_off: count(3)?,
            })
        },
    )
    .map_err(|e| sql_error("producer: cannot read the status", e))
}

/// Every destination by name, with its signals at `now_ms`.
pub(crate) fn destinations(conn: &Connection, now_ms: i64) -> Result<Vec<Destination>, StoreError> {
    let rows: Vec<(i64, String, String, Option<String>, i64)> = collect_rows(
        conn,
        "producer: cannot read the destinations",
        "SELECT id, name, start, consumer_store_id, created_at_ms FROM destination ORDER BY name",
        [],
        |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
            ))
        },
        Ok,
    )?;
    let bad = |e: &dyn std::fmt::Display| corrupt("producer: stored destination", e.to_string());
    rows.into_iter()
        .map(|(id, name, start, consumer, created_at_ms)| {
            Ok(Destination {
                name: DestinationName::new(name).map_err(|e| bad(&e))?,
                from: DestinationStart::parse(&start).ok_or_else(|| bad(&start))?,
                consumer_store_id: consumer
                    .map(|id| id.parse::<StoreId>().map_err(|e| bad(&e)))
                    .transpose()?,
                created_at_ms,
                status: status_of(conn, id, now_ms)?,
            })
        })
        .collect()
}

/// Records `consumer` as the consumer store of `destination` at its first
/// delivery from a known one, in the write transaction `tx`; refuses
/// another consumer afterwards ([`ordo_core::destination::check_consumer`]).
pub(crate) fn check_consumer(
    tx: &Connection,
    destination: i64,
    consumer: Option<&StoreId>,
) -> Result<(), StoreError> {
    let Some(consumer) = consumer else {
        return Ok(());
    };
    if let Some(first) = checked_consumer(tx, destination, consumer)? {
        exec_cached(
            tx,
            "UPDATE destination SET consumer_store_id = ?2 WHERE id = ?1",
            params![destination, first.as_str()],
        )
        .map_err(|e| sql_error("producer: cannot record the destination's consumer", e))?;
    }
    Ok(())
}

/// Checks `consumer` against the consumer store `destination` recorded
/// ([`ordo_core::destination::check_consumer`]) without writing: the
/// identity to record when none is yet.
pub(crate) fn checked_consumer(
    conn: &Connection,
    destination: i64,
    consumer: &StoreId,
) -> Result<Option<StoreId>, StoreError> {
    let (name, recorded) = destination_consumer(conn, destination)?;
    ordo_core::destination::check_consumer(&name, recorded.as_ref(), Some(consumer))
}

/// The consumer store `destination` recorded at its first delivery.
pub(crate) fn recorded_consumer(
    conn: &Connection,
    destination: i64,
) -> Result<Option<StoreId>, StoreError> {
    Ok(destination_consumer(conn, destination)?.1)
}

/// The name of `destination` and the consumer store it recorded.
fn destination_consumer(
    conn: &Connection,
    destination: i64,
) -> Result<(DestinationName, Option<StoreId>), StoreError> {
    let err = |e| sql_error("producer: cannot read the destination's consumer", e);
    let (name, recorded): (String, Option<String>) = row_cached(
        conn,
        "SELECT name, consumer_store_id FROM destination WHERE id = ?1",
        [destination],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .map_err(err)?;
    let bad = |e: &dyn std::fmt::Display| corrupt("producer: stored destination", e.to_string());
    let name = DestinationName::new(name).map_err(|e| bad(&e))?;
    let recorded = (recorded.map(|id| id.parse::<StoreId>().map_err(|e| bad(&e)))).transpose()?;
    Ok((name, recorded))
}

/// Marks the row at `position` settled when every destination of its flow
/// holds it or abandoned it (pruning may then remove it).
pub(crate) fn settle(held: &mut Held<'_>, position: i64, now_ms: i64) -> Result<(), StoreError> {
    held.get(
        "UPDATE outbox SET accepted = 1, accepted_at_ms = coalesce(accepted_at_ms, ?2)
         WHERE position = ?1 AND accepted = 0 AND NOT EXISTS (
             SELECT 1 FROM custody c WHERE c.position = ?1 AND c.accepted = 0 AND c.abandoned = 0)",
    )
    .and_then(|statement| statement.execute(params![position, now_ms]))
    .map_err(|e| sql_error("producer: cannot settle an outbox row", e))?;
    Ok(())
}

/// Records one receipt on the row at `position` (of `flow`, `seq`) for
/// `destination`: custody for `accepted` and `duplicate`, a quarantine for
/// a conflict, and for `producer_rewound` a stop of the flow there. A row
/// the destination holds no mark of is left alone, and a row abandoned
/// there meanwhile is never quarantined again.
pub(crate) fn mark_receipt(
    held: &mut Held<'_>,
    destination: i64,
    (position, flow, seq): (i64, i64, i64),
    receipt: Receipt,
    now_ms: i64,
) -> Result<(), StoreError> {
    let err = |e| sql_error("producer: cannot record receipts", e);
    if receipt == Receipt::ProducerRewound {
        held.get(
            "UPDATE relay_head SET relay_stop_seq = min(coalesce(relay_stop_seq, ?3), ?3)
             WHERE flow = ?1 AND destination = ?2",
        )
        .and_then(|statement| statement.execute(params![flow, destination, seq]))
        .map_err(err)?;
    }
    let marked = match receipt.quarantine() {
        Some((code, detail)) => held
            .get(
                "UPDATE custody SET quarantined = 1 - accepted,
                 quarantine_reason = CASE WHEN accepted = 1 THEN NULL ELSE ?3 END,
                 quarantine_detail = CASE WHEN accepted = 1 THEN NULL ELSE ?4 END,
                 attempts = attempts + 1, last_outcome = ?3
             WHERE position = ?1 AND destination = ?2 AND abandoned = 0",
            )
            .and_then(|statement| statement.execute(params![position, destination, code, detail])),
        None => held
            .get(
                "UPDATE custody SET accepted = 1, quarantined = 0, quarantine_reason = NULL,
                 quarantine_detail = NULL, accepted_at_ms = coalesce(accepted_at_ms, ?3),
                 attempts = attempts + 1, last_outcome = ?4, last_error = NULL
             WHERE position = ?1 AND destination = ?2",
            )
            .and_then(|statement| {
                statement.execute(params![position, destination, now_ms, receipt.as_str()])
            }),
    }
    .map_err(err)?;
    if marked == 1 && receipt.quarantine().is_none() {
        settle(held, position, now_ms)?;
    }
    Ok(())
}

/// Moves each flow's relay head for `destination` to its lowest seq
/// neither accepted, quarantined nor abandoned there, with that event's
/// next attempt time, in one statement per flow; records the round in which
/// the flows were served when `turn` is given. Accepting, quarantining or
/// failing events never makes an earlier seq eligible, so the search walks
/// the `(flow, seq)` index from the current head, or from `reopened` (a
/// seq whose quarantine was cleared) when that is earlier. A flow with
/// nothing eligible keeps a NULL head. `flows` are the flows' keys.
pub(crate) fn refresh_heads(
    conn: &Connection,
    destination: i64,
    flows: &[i64],
    turn: Option<i64>,
    reopened: Option<i64>,
) -> Result<(), StoreError> {
    let err = |e| sql_error("producer: cannot move the relay heads", e);
    let mut statement = conn
        .prepare_cached(
            "UPDATE relay_head SET
                 (relay_seq, relay_due_ms) = (SELECT max(seq), coalesce(max(due), 0) FROM (
                     SELECT o.seq AS seq, c.next_attempt_at_ms AS due FROM outbox o
                     JOIN custody c ON c.position = o.position AND c.destination = ?4
                     WHERE o.flow = ?1 AND c.accepted = 0 AND c.quarantined = 0 AND c.abandoned = 0
                       AND o.seq >= coalesce(min(relay_head.relay_seq, ?3), relay_head.relay_seq, ?3)
                       AND o.seq < coalesce(relay_head.relay_stop_seq, 9223372036854775807)
                     ORDER BY o.seq LIMIT 1)),
                 relay_turn = coalesce(?2, relay_turn)
             WHERE flow = ?1 AND destination = ?4",
        )
        .map_err(err)?;
    for flow in flows {
        statement
            .execute(params![flow, turn, reopened, destination])
            .map_err(err)?;
    }
    Ok(())
}

/// Each destination's custody of the row at `position` (of `flow_id`,
/// `seq`): one entry per destination its flow is delivered to.
pub(crate) fn custody_of(
    conn: &Connection,
    position: i64,
    flow_id: &str,
    seq: i64,
) -> Result<Vec<Custody>, StoreError> {
    collect_rows(
        conn,
        "producer: cannot read the custody of an outbox row",
        "SELECT d.name, coalesce(c.accepted, 0), c.accepted_at_ms, coalesce(c.attempts, 0),
                c.last_outcome, c.last_error, coalesce(c.next_attempt_at_ms, 0),
                coalesce(c.quarantined, 0), c.quarantine_reason, c.quarantine_detail,
                coalesce(c.abandoned, 0) = 1 OR (c.position IS NULL AND h.abandoned_seq <= ?3)
         FROM relay_head h JOIN destination d ON d.id = h.destination
         LEFT JOIN custody c ON c.position = ?1 AND c.destination = h.destination
         WHERE h.flow = (SELECT flow FROM outbox_head WHERE flow_id = ?2)
           AND (c.position IS NOT NULL OR h.abandoned_seq <= ?3)
         ORDER BY d.name",
        params![position, flow_id, seq],
        |row| {
            Ok((
                row.get::<_, String>(0)?,
                Custody {
                    destination: DestinationName::default_name(),
                    accepted: row.get(1)?,
                    accepted_at_ms: row.get(2)?,
                    attempts: row.get::<_, i64>(3)?.max(0) as u64,
                    last_outcome: row.get(4)?,
                    last_error: row.get(5)?,
                    next_attempt_at_ms: row.get(6)?,
                    quarantined: row.get(7)?,
                    quarantine_reason: row.get(8)?,
                    quarantine_detail: row.get(9)?,
                    abandoned: row.get(10)?,
                },
            ))
        },
        |(name, custody)| {
            let destination = DestinationName::new(name)
                .map_err(|e| corrupt("producer: stored destination", e))?;
            Ok(Custody {
                destination,
                ..custody
            })
        },
    )
}

/// Adds the destination `name` in the write transaction `tx` at `now_ms`.
pub(crate) fn add(
    tx: &Connection,
    name: &DestinationName,
    from: DestinationStart,
    now_ms: i64,
) -> Result<Result<(), DestinationRefused>, StoreError> {
    let err = |e| sql_error("producer: cannot add a destination", e);
    if id_of(tx, name)?.is_some() {
        return Ok(Err(DestinationRefused::Exists(name.clone())));
    }
    if from == DestinationStart::Start {
        let pruned: Option<String> = row_cached(
            tx,
            "SELECT h.flow_id FROM outbox_head h WHERE NOT EXISTS (
                 SELECT 1 FROM outbox o WHERE o.flow = h.flow AND o.seq = 1)
             ORDER BY h.flow_id LIMIT 1",
            [],
            |row| row.get(0),
        )
        .optional()
        .map_err(err)?;
        if let Some(flow) = pruned {
            let flow =
                ordo_core::FlowId::new(flow).map_err(|e| corrupt("producer: stored flow id", e))?;
            return Ok(Err(DestinationRefused::Pruned(flow)));
        }
    }
    exec_cached(
        tx,
        "INSERT INTO destination (name, start, created_at_ms) VALUES (?1, ?2, ?3)",
        params![name.as_str(), from.as_str(), now_ms],
    )
    .map_err(err)?;
    if from == DestinationStart::Start {
        let id = tx.last_insert_rowid();
        tx.execute_batch(&format!(
            "INSERT INTO relay_head (flow, destination, relay_seq, relay_due_ms)
                 SELECT flow, {id}, 1, 0 FROM outbox_head;
             INSERT INTO custody (position, destination) SELECT position, {id} FROM outbox;
             UPDATE outbox SET accepted = 0, accepted_at_ms = NULL WHERE accepted = 1;"
        ))
        .map_err(err)?;
    }
    Ok(Ok(()))
}

/// Removes the destination `name` and its custody in the write transaction
/// `tx`, audited; the rows it alone held back are settled.
pub(crate) fn remove(
    tx: &Connection,
    name: &DestinationName,
    (by, reason): (&str, &str),
    now_ms: i64,
) -> Result<Result<i64, DestinationRefused>, StoreError> {
    let err = |e| sql_error("producer: cannot remove a destination", e);
    let Some(id) = id_of(tx, name)? else {
        return Ok(Err(DestinationRefused::Unknown(name.clone())));
    };
    let count: i64 =
        row_cached(tx, "SELECT count(*) FROM destination", [], |row| row.get(0)).map_err(err)?;
    if count <= 1 {
        return Ok(Err(DestinationRefused::Last(name.clone())));
    }
    tx.execute_batch(&format!(
        "DELETE FROM custody WHERE destination = {id};
         DELETE FROM relay_head WHERE destination = {id};
         DELETE FROM destination WHERE id = {id};"
    ))
    .map_err(err)?;
    exec_cached(
        tx,
        "UPDATE outbox SET accepted = 1, accepted_at_ms = ?1 WHERE accepted = 0 AND NOT EXISTS (
             SELECT 1 FROM custody c WHERE c.position = outbox.position
                 AND c.accepted = 0 AND c.abandoned = 0)",
        [now_ms],
    )
    .map_err(err)?;
    audit(
        tx,
        "destination_remove",
        Some(name),
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
/// there (see the producer's append). Every refusal comes before the
/// first write.
pub(crate) fn abandon(
    tx: &Connection,
    request: &AbandonRequest,
    now_ms: i64,
) -> Result<Result<ProducerRepair, DestinationRefused>, StoreError> {
    let err = |e| sql_error("producer: cannot abandon a flow", e);
    let (name, flow) = (&request.destination, request.flow.as_str());
    let (id, key, last_seq) = match abandonable(tx, request)? {
        Ok(found) => found,
        Err(refused) => return Ok(Err(refused)),
    };
    let first: i64 = row_cached(
        tx,
        "SELECT coalesce(min(o.seq), ?3 + 1) FROM outbox o
         JOIN custody c ON c.position = o.position AND c.destination = ?2
         WHERE o.flow = ?1 AND c.accepted = 0",
        params![key, id, last_seq],
        |row| row.get(0),
    )
    .map_err(err)?;
    let event_id: Option<String> = row_cached(
        tx,
        "SELECT event_id FROM outbox WHERE flow = ?1 AND seq = ?2",
        params![key, first],
        |row| row.get(0),
    )
    .optional()
    .map_err(err)?;
    exec_cached(
        tx,
        "UPDATE relay_head SET abandoned_seq = ?3, relay_seq = NULL, relay_due_ms = 0
         WHERE flow = ?1 AND destination = ?2",
        params![key, id, first],
    )
    .map_err(err)?;
    exec_cached(
        tx,
        "UPDATE custody SET abandoned = 1, quarantined = 0, quarantine_reason = NULL,
             quarantine_detail = NULL
         WHERE destination = ?2 AND accepted = 0 AND position IN (
             SELECT position FROM outbox WHERE flow = ?1 AND seq >= ?3)",
        params![key, id, first],
    )
    .map_err(err)?;
    exec_cached(
        tx,
        "UPDATE outbox SET accepted = 1, accepted_at_ms = ?2
         WHERE flow = ?1 AND accepted = 0 AND NOT EXISTS (
             SELECT 1 FROM custody c WHERE c.position = outbox.position
                 AND c.accepted = 0 AND c.abandoned = 0)",
        params![key, now_ms],
    )
    .map_err(err)?;
    let (by, reason) = (request.by.as_str(), request.reason.as_str());
    let audited = Some((flow, Some(first), event_id.as_deref()));
    let id = audit(tx, "abandon", Some(name), audited, (by, reason), now_ms)?;
    Ok(Ok(ProducerRepair {
        id,
        action: "abandon".to_string(),
        destination: Some(name.as_str().to_string()),
        flow_id: Some(flow.to_string()),
        seq: Some(first),
        event_id,
        reason: reason.to_string(),
        by: by.to_string(),
        at_ms: now_ms,
    }))
}

/// The destination's id, the flow's key and its last seq when `request`
/// may be carried out; else why not.
fn abandonable(
    tx: &Connection,
    request: &AbandonRequest,
) -> Result<Result<(i64, i64, i64), DestinationRefused>, StoreError> {
    let err = |e| sql_error("producer: cannot read a flow's relay head", e);
    let (name, flow) = (&request.destination, request.flow.as_str());
    let Some(id) = id_of(tx, name)? else {
        return Ok(Err(DestinationRefused::Unknown(name.clone())));
    };
    let head: Option<(i64, i64)> = row_cached(
        tx,
        "SELECT flow, last_seq FROM outbox_head WHERE flow_id = ?1",
        [flow],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .optional()
    .map_err(err)?;
    let Some((key, last_seq)) = head else {
        return Ok(Err(DestinationRefused::UnknownFlow(request.flow.clone())));
    };
    let head: Option<Option<i64>> = row_cached(
        tx,
        "SELECT abandoned_seq FROM relay_head WHERE flow = ?1 AND destination = ?2",
        params![key, id],
        |row| row.get(0),
    )
    .optional()
    .map_err(err)?;
    match head {
        None => {
            return Ok(Err(DestinationRefused::NotDelivered {
                flow: request.flow.clone(),
                destination: name.clone(),
            }))
        }
        Some(Some(_)) => {
            return Ok(Err(DestinationRefused::AlreadyAbandoned {
                flow: request.flow.clone(),
                destination: name.clone(),
            }))
        }
        Some(None) => {}
    }
    Ok(Ok((id, key, last_seq)))
}

/// One row of the producer's audit log: `flow` with its seq and event id
/// when the action names one event.
pub(crate) fn audit(
    tx: &Connection,
    action: &str,
    destination: Option<&DestinationName>,
    flow: Option<(&str, Option<i64>, Option<&str>)>,
    (by, reason): (&str, &str),
    now_ms: i64,
) -> Result<i64, StoreError> {
    let (flow_id, seq, event_id) = match flow {
        Some((flow, seq, event)) => (Some(flow), seq, event),
        None => (None, None, None),
    };
    exec_cached(
        tx,
        "INSERT INTO producer_repair (action, destination, flow_id, seq, event_id, reason, by, at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            action,
            destination.map(DestinationName::as_str),
            flow_id,
            seq,
            event_id,
            reason,
            by,
            now_ms
        ],
    )
    .map_err(|e| sql_error("producer: cannot write the audit log", e))?;
    Ok(tx.last_insert_rowid())
}

/// The producer's audit log, oldest first.
pub(crate) fn repairs(conn: &Connection) -> Result<Vec<ProducerRepair>, StoreError> {
    collect_rows(
        conn,
        "producer: cannot read the audit log",
        "SELECT id, action, destination, flow_id, seq, event_id, reason, by, at_ms
         FROM producer_repair ORDER BY id LIMIT 100000",
        [],
        |row| {
            Ok(ProducerRepair {
                id: row.get(0)?,
                action: row.get(1)?,
                destination: row.get(2)?,
                flow_id: row.get(3)?,
                seq: row.get(4)?,
                event_id: row.get(5)?,
                reason: row.get(6)?,
                by: row.get(7)?,
                at_ms: row.get(8)?,
            })
        },
        Ok,
    )
}
