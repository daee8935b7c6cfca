//! Operations on the consumer: listing, re-evaluating and skipping blocked
//! rows, the repair log, alerting signals, and pruning.

use ordo_core::effect::EffectKey;
use ordo_core::ops::{
    decide_skip, whole_read, whole_read_limit, ConsumerStatus, InboxEntry, InboxScope, Pruned,
    RepairRecord, SkipRefused, SkipRequest, WHOLE_READ_ROWS_MAX,
};
use ordo_core::store::{sql_limit, stored_producer};
use ordo_core::{EventId, FlowId, InboxFlow, Seq, StoreError, StoreId};
use rusqlite::{params, Connection, OptionalExtension};

use super::schema::{begin_write, entry_row, inbox_entry, read_cursor, write_cursor};
use super::ConsumerDb;
use crate::conn::{collect_rows, corrupt, exec_cached, row_cached, sql_error};

/// The inbox listing, `(blocked_only, producer or NULL, NULL, limit)`.
pub(super) const ENTRIES_SQL: &str =
    "SELECT body, status, reason, received_at_ms, settled_at_ms, detail, store_id FROM inbox
     WHERE (NOT ?1 OR status = 'blocked') AND (?2 IS NULL OR producer = ?2) AND ?3 IS NULL
     ORDER BY flow_id, producer, seq LIMIT ?4";

/// One flow's inbox listing, `(blocked_only, producer, flow, limit)`: a
/// range of the `(flow_id, producer, seq)` key, however large the inbox.
pub(super) const FLOW_ENTRIES_SQL: &str =
    "SELECT body, status, reason, received_at_ms, settled_at_ms, detail, store_id FROM inbox
     WHERE flow_id = ?3 AND producer = ?2 AND (NOT ?1 OR status = 'blocked')
     ORDER BY seq LIMIT ?4";

pub(super) fn inbox_entries(
    db: &mut ConsumerDb,
    blocked_only: bool,
    scope: InboxScope<'_>,
    limit: usize,
) -> Result<Vec<InboxEntry>, StoreError> {
    let (producer, flow_id) = scope.bounds();
    let sql = match flow_id {
        Some(_) => FLOW_ENTRIES_SQL,
        None => ENTRIES_SQL,
    };
    collect_rows(
        &db.conn,
        "consumer: cannot list the inbox",
        sql,
        params![blocked_only, producer, flow_id, sql_limit(limit)],
        entry_row,
        inbox_entry,
    )
}

pub(super) fn reopen_blocked(db: &mut ConsumerDb, flow: &InboxFlow) -> Result<u64, StoreError> {
    let tx = begin_write(&mut db.conn)?;
    let n = exec_cached(
        &tx,
        "UPDATE inbox SET status = 'pending', reason = NULL, detail = NULL
                 WHERE flow_id = ?1 AND producer = ?2 AND status = 'blocked'",
        [flow.flow_id.as_str(), flow.producer.as_str()],
    )
    .map_err(|e| sql_error("consumer: cannot reopen blocked rows", e))?;
    tx.commit()
        .map_err(|e| sql_error("consumer: reopen commit failed", e))?;
    db.commits += 1;
    Ok(n as u64)
}

pub(super) fn skip(
    db: &mut ConsumerDb,
    request: &SkipRequest,
) -> Result<Result<RepairRecord, SkipRefused>, StoreError> {
    let tx = begin_write(&mut db.conn)?;
    // Read under the write lock: the log's times follow commit order.
    let now_ms = db.clock.now_ms();
    let flow = &request.flow;
    let applied_seq = read_cursor(&tx, flow)?;
    let stored: Option<(String, Option<String>)> = row_cached(
        &tx,
        "SELECT event_id, store_id FROM inbox WHERE flow_id = ?1 AND producer = ?3 AND seq = ?2",
        params![
            flow.flow_id.as_str(),
            request.seq.get(),
            flow.producer.as_str()
        ],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .optional()
    .map_err(|e| sql_error(SKIP, e))?;
    if let Err(refused) = decide_skip(request, applied_seq, stored.is_some()) {
        return Ok(Err(refused));
    }
    let (event_id, store_id) = stored.expect("decide_skip checked that the row is stored");
    let event_id = EventId::new(event_id).map_err(|e| corrupt("consumer: stored event id", e))?;
    let store_id = StoreId::stored_sender(store_id)?;
    mark_skipped(&tx, request, now_ms)?;
    write_cursor(&tx, flow, request.seq.get())?;
    let id = log_skip(&tx, request, (&event_id, store_id.as_ref()), now_ms)?;
    tx.commit()
        .map_err(|e| sql_error("consumer: skip commit failed", e))?;
    db.commits += 1;
    Ok(Ok(RepairRecord {
        id,
        action: "skip".into(),
        producer: flow.producer.clone(),
        flow_id: flow.flow_id.clone(),
        store_id,
        seq: request.seq,
        event_id,
        reason: request.reason.clone(),
        by: request.by.clone(),
        at_ms: now_ms,
        key: None,
    }))
}

const SKIP: &str = "consumer: skip failed";

/// Marks the row of the skip skipped; only a row still pending or blocked.
fn mark_skipped(tx: &Connection, request: &SkipRequest, now_ms: i64) -> Result<(), StoreError> {
    let marked = exec_cached(
        tx,
        "UPDATE inbox SET status = 'skipped', reason = NULL, detail = NULL, settled_at_ms = ?3
         WHERE flow_id = ?1 AND producer = ?4 AND seq = ?2
           AND (status = 'pending' OR status = 'blocked')",
        params![
            request.flow.flow_id.as_str(),
            request.seq.get(),
            now_ms,
            request.flow.producer.as_str()
        ],
    )
    .map_err(|e| sql_error(SKIP, e))?;
    if marked != 1 {
        return Err(corrupt(
            "consumer: inbox",
            format!(
                "flow {} seq {} is past its cursor but settled",
                request.flow, request.seq
            ),
        ));
    }
    Ok(())
}

/// Writes the skip into the repair log; its id.
fn log_skip(
    tx: &Connection,
    request: &SkipRequest,
    (event_id, store_id): (&EventId, Option<&StoreId>),
    now_ms: i64,
) -> Result<i64, StoreError> {
    row_cached(
        tx,
        "INSERT INTO repair_log (action, flow_id, seq, event_id, reason, decided_by, at_ms,
                                 producer, store_id)
         VALUES ('skip', ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) RETURNING id",
        params![
            request.flow.flow_id.as_str(),
            request.seq.get(),
            event_id.as_str(),
            request.reason,
            request.by,
            now_ms,
            request.flow.producer.as_str(),
            store_id.map(StoreId::as_str),
        ],
        |row| row.get(0),
    )
    .map_err(|e| sql_error(SKIP, e))
}

pub(super) fn repairs(db: &mut ConsumerDb) -> Result<Vec<RepairRecord>, StoreError> {
    repairs_at_most(&db.conn, WHOLE_READ_ROWS_MAX)
}

/// The repair log, oldest first, at most `rows_max` entries.
pub(crate) fn repairs_at_most(
    conn: &Connection,
    rows_max: usize,
) -> Result<Vec<RepairRecord>, StoreError> {
    let context = "consumer: repair log";
    let rows = collect_rows(
        conn,
        "consumer: cannot read the repair log",
        "SELECT id, action, flow_id, seq, event_id, reason, decided_by, at_ms, producer, store_id,
                key
         FROM repair_log ORDER BY id LIMIT ?1",
        [whole_read_limit(rows_max)],
        |row| {
            Ok((
                (row.get::<_, i64>(0)?, row.get::<_, String>(1)?),
                (
                    row.get::<_, String>(2)?,
                    row.get::<_, i64>(3)?,
                    row.get::<_, String>(4)?,
                ),
                (
                    row.get::<_, String>(5)?,
                    row.get::<_, String>(6)?,
                    row.get::<_, i64>(7)?,
                ),
                (row.get::<_, String>(8)?, row.get::<_, Option<String>>(9)?),
                row.get::<_, Option<String>>(10)?,
            ))
        },
        |(
            (id, action),
            (flow_id, seq, event_id),
            (reason, by, at_ms),
            (producer, store_id),
            key,
        )| {
            Ok(RepairRecord {
                id,
                action,
                producer: stored_producer(&producer)?,
                store_id: StoreId::stored_sender(store_id)?,
                flow_id: FlowId::new(flow_id).map_err(|e| corrupt(context, e))?,
                seq: Seq::new(seq).map_err(|e| corrupt(context, e))?,
                event_id: EventId::new(event_id).map_err(|e| corrupt(context, e))?,
                reason,
                by,
                at_ms,
                key: key
                    .map(EffectKey::new)
                    .transpose()
                    .map_err(|e| corrupt(context, e))?,
            })
        },
    )?;
    whole_read("the repair log", rows_max, rows)
}

pub(super) fn consumer_status(db: &mut ConsumerDb) -> Result<ConsumerStatus, StoreError> {
    let tx = db
        .conn
        .transaction()
        .map_err(|e| sql_error("consumer: cannot begin a read transaction", e))?;
    let mut status = ConsumerStatus::default();
    for (producer, state, reason, n) in status_rows::<(String, String, String, i64)>(
        &tx,
        "SELECT producer, status, coalesce(reason, ''), count(*) FROM inbox
         GROUP BY producer, status, reason",
    )? {
        status.count_rows(producer, &state, reason, n)?;
    }
    for (state, n) in status_rows::<(String, i64)>(
        &tx,
        "SELECT status, count(*) FROM inbox_fingerprint GROUP BY status",
    )? {
        status.count_fingerprints(&state, n);
    }
    for (flow_id, producer, missing, since_ms) in status_rows::<(String, String, i64, i64)>(
        &tx,
        "SELECT i.flow_id, i.producer, coalesce(c.applied_seq, 0) + 1, min(i.received_at_ms)
         FROM inbox i LEFT JOIN inbox_cursor c ON c.flow_id = i.flow_id AND c.producer = i.producer
         WHERE i.status = 'pending' AND i.seq > coalesce(c.applied_seq, 0) + 1
           AND NOT EXISTS (SELECT 1 FROM inbox j
                           WHERE j.flow_id = i.flow_id AND j.producer = i.producer
                             AND j.seq = coalesce(c.applied_seq, 0) + 1)
         GROUP BY i.flow_id, i.producer ORDER BY i.flow_id, i.producer",
    )? {
        status.count_gap((producer, flow_id), missing, since_ms)?;
    }
    Ok(status)
}

/// Every row of a status query, as a tuple of its columns.
fn status_rows<T>(conn: &rusqlite::Connection, sql: &str) -> Result<Vec<T>, StoreError>
where
    T: for<'a> TryFrom<&'a rusqlite::Row<'a>, Error = rusqlite::Error>,
{
    let err = |e| sql_error("consumer: cannot read the status", e);
    let mut stmt = conn.prepare_cached(sql).map_err(err)?;
    let rows = stmt.query_map([], |row| T::try_from(row)).map_err(err)?;
    rows.collect::<Result<_, _>>().map_err(err)
}

pub(super) fn prune_inbox(db: &mut ConsumerDb, cutoff_ms: i64) -> Result<Pruned, StoreError> {
    let tx = begin_write(&mut db.conn)?;
    let err = |e| sql_error("consumer: cannot prune the inbox", e);
    let fingerprints = exec_cached(
        &tx,
        "INSERT INTO inbox_fingerprint (flow_id, producer, seq, event_id, body_hash, status, store_id)
                 SELECT flow_id, producer, seq, event_id, unhex(body_hash), status, store_id FROM inbox
                 WHERE status IN ('applied', 'skipped') AND settled_at_ms < ?1",
        [cutoff_ms],
    )
    .map_err(err)?;
    exec_cached(
        &tx,
        "INSERT INTO inbox_watermark (flow_id, producer, pruned_seq, store_id)
             SELECT flow_id, producer, max(seq), store_id FROM inbox
             WHERE status IN ('applied', 'skipped') AND settled_at_ms < ?1
             GROUP BY flow_id, producer
             ON CONFLICT (flow_id, producer) DO UPDATE
             SET pruned_seq = max(pruned_seq, excluded.pruned_seq),
                 store_id = CASE WHEN excluded.pruned_seq > pruned_seq
                                 THEN excluded.store_id ELSE store_id END",
        [cutoff_ms],
    )
    .map_err(err)?;
    let rows = exec_cached(
        &tx,
        "DELETE FROM inbox WHERE status IN ('applied', 'skipped') AND settled_at_ms < ?1",
        [cutoff_ms],
    )
    .map_err(err)?;
    debug_assert_eq!(rows, fingerprints, "one fingerprint per pruned row");
    super::effects::prune_settled(&tx, cutoff_ms)?;
    tx.commit()
        .map_err(|e| sql_error("consumer: prune commit failed", e))?;
    db.commits += 1;
    Ok(Pruned {
        rows: rows as u64,
        fingerprints: fingerprints as u64,
    })
}
