//! Operations on the consumer: listing, re-evaluating and skipping blocked
//! rows, the repair log, alerting signals, and pruning.

use ordo_core::ops::{
    decide_skip, ConsumerStatus, GapWait, InboxEntry, Pruned, RepairRecord, SkipRefused,
    SkipRequest, GAPS_LISTED_MAX,
};
use ordo_core::{EventId, FlowId, Seq, StoreError};
use rusqlite::{params, OptionalExtension};

use super::schema::{begin_write, inbox_status, write_cursor};
use super::ConsumerDb;
use crate::conn::{collect_rows, corrupt, exec_cached, row_cached, sql_error};
use crate::producer::stored_envelope;

/// The inbox listing, `(blocked_only, NULL, limit)`.
pub(super) const ENTRIES_SQL: &str =
    "SELECT body, status, reason, received_at_ms, settled_at_ms, detail FROM inbox
     WHERE (NOT ?1 OR status = 'blocked') AND ?2 IS NULL
     ORDER BY flow_id, seq LIMIT ?3";

/// One flow's inbox listing, `(blocked_only, flow, limit)`: a range of the
/// `(flow_id, seq)` key, however large the inbox.
pub(super) const FLOW_ENTRIES_SQL: &str =
    "SELECT body, status, reason, received_at_ms, settled_at_ms, detail FROM inbox
     WHERE flow_id = ?2 AND (NOT ?1 OR status = 'blocked')
     ORDER BY seq LIMIT ?3";

pub(super) fn inbox_entries(
    db: &mut ConsumerDb,
    blocked_only: bool,
    flow_id: Option<&FlowId>,
    limit: usize,
) -> Result<Vec<InboxEntry>, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let sql = match flow_id {
        Some(_) => FLOW_ENTRIES_SQL,
        None => ENTRIES_SQL,
    };
    collect_rows(
        &db.conn,
        "consumer: cannot list the inbox",
        sql,
        params![blocked_only, flow_id.map(FlowId::as_str), limit],
        |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, Option<String>>(2)?,
                row.get::<_, i64>(3)?,
                row.get::<_, Option<i64>>(4)?,
                row.get::<_, Option<String>>(5)?,
            ))
        },
        |(body, status, reason, received_at_ms, settled_at_ms, detail)| {
            Ok(InboxEntry {
                envelope: stored_envelope("consumer: stored inbox body", &body)?,
                status: inbox_status(&status, reason.as_deref(), detail)?,
                received_at_ms,
                settled_at_ms,
            })
        },
    )
}

pub(super) fn reopen_blocked(db: &mut ConsumerDb, flow_id: &FlowId) -> Result<u64, StoreError> {
    let tx = begin_write(&mut db.conn)?;
    let n = exec_cached(&tx,
                "UPDATE inbox SET status = 'pending', reason = NULL, detail = NULL WHERE flow_id = ?1 AND status = 'blocked'",
                [flow_id.as_str()],
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
    let err = |e| sql_error("consumer: skip failed", e);
    let flow = request.flow_id.as_str();
    let applied_seq: i64 = row_cached(
        &tx,
        "SELECT applied_seq FROM inbox_cursor WHERE flow_id = ?1",
        [flow],
        |row| row.get(0),
    )
    .optional()
    .map_err(err)?
    .unwrap_or(0);
    let event_id: Option<String> = row_cached(
        &tx,
        "SELECT event_id FROM inbox WHERE flow_id = ?1 AND seq = ?2",
        params![flow, request.seq.get()],
        |row| row.get(0),
    )
    .optional()
    .map_err(err)?;
    if let Err(refused) = decide_skip(request, applied_seq, event_id.is_some()) {
        return Ok(Err(refused));
    }
    let event_id = event_id.expect("decide_skip checked that the row is stored");
    let marked = exec_cached(
        &tx,
        "UPDATE inbox SET status = 'skipped', reason = NULL, detail = NULL, settled_at_ms = ?3
         WHERE flow_id = ?1 AND seq = ?2 AND (status = 'pending' OR status = 'blocked')",
        params![flow, request.seq.get(), now_ms],
    )
    .map_err(err)?;
    if marked != 1 {
        return Err(corrupt(
            "consumer: inbox",
            format!(
                "flow {flow} seq {} is past its cursor but settled",
                request.seq
            ),
        ));
    }
    write_cursor(&tx, &request.flow_id, request.seq.get())?;
    let id = row_cached(
        &tx,
        "INSERT INTO repair_log (action, flow_id, seq, event_id, reason, decided_by, at_ms)
                 VALUES ('skip', ?1, ?2, ?3, ?4, ?5, ?6) RETURNING id",
        params![
            flow,
            request.seq.get(),
            event_id,
            request.reason,
            request.by,
            now_ms
        ],
        |row| row.get(0),
    )
    .map_err(err)?;
    tx.commit()
        .map_err(|e| sql_error("consumer: skip commit failed", e))?;
    db.commits += 1;
    Ok(Ok(RepairRecord {
        id,
        action: "skip".into(),
        flow_id: request.flow_id.clone(),
        seq: request.seq,
        event_id: EventId::new(event_id).map_err(|e| corrupt("consumer: stored event id", e))?,
        reason: request.reason.clone(),
        by: request.by.clone(),
        at_ms: now_ms,
    }))
}

pub(super) fn repairs(db: &mut ConsumerDb) -> Result<Vec<RepairRecord>, StoreError> {
    let context = "consumer: repair log";
    collect_rows(
            &db.conn,
            "consumer: cannot read the repair log",
            "SELECT id, action, flow_id, seq, event_id, reason, decided_by, at_ms FROM repair_log ORDER BY id",
            [],
            |row| {
                Ok((
                    (row.get::<_, i64>(0)?, row.get::<_, String>(1)?),
                    (row.get::<_, String>(2)?, row.get::<_, i64>(3)?, row.get::<_, String>(4)?),
                    (row.get::<_, String>(5)?, row.get::<_, String>(6)?, row.get::<_, i64>(7)?),
                ))
            },
            |((id, action), (flow_id, seq, event_id), (reason, by, at_ms))| {
                Ok(RepairRecord {
                    id,
                    action,
                    flow_id: FlowId::new(flow_id).map_err(|e| corrupt(context, e))?,
                    seq: Seq::new(seq).map_err(|e| corrupt(context, e))?,
                    event_id: EventId::new(event_id).map_err(|e| corrupt(context, e))?,
                    reason,
                    by,
                    at_ms,
                })
            },
        )
}

pub(super) fn consumer_status(db: &mut ConsumerDb) -> Result<ConsumerStatus, StoreError> {
    let tx = db
        .conn
        .transaction()
        .map_err(|e| sql_error("consumer: cannot begin a read transaction", e))?;
    let err = |e| sql_error("consumer: cannot read the status", e);
    let mut status = ConsumerStatus::default();
    {
        let mut stmt = tx
            .prepare(
                "SELECT status, coalesce(reason, ''), count(*) FROM inbox GROUP BY status, reason",
            )
            .map_err(err)?;
        let rows = stmt
            .query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, i64>(2)?,
                ))
            })
            .map_err(err)?;
        for row in rows {
            let (state, reason, n) = row.map_err(err)?;
            let n = n.max(0) as u64;
            match state.as_str() {
                "pending" => status.pending += n,
                "applied" => status.applied += n,
                "skipped" => status.skipped += n,
                "blocked" => *status.blocked.entry(reason).or_default() += n,
                other => {
                    return Err(corrupt(
                        "consumer: stored inbox status",
                        format!("unknown status {other:?}"),
                    ))
                }
            }
        }
        let mut stmt = tx
            .prepare("SELECT status, count(*) FROM inbox_fingerprint GROUP BY status")
            .map_err(err)?;
        let rows = stmt
            .query_map([], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
            })
            .map_err(err)?;
        for row in rows {
            let (state, n) = row.map_err(err)?;
            if state == "applied" {
                status.applied += n.max(0) as u64;
            } else {
                status.skipped += n.max(0) as u64;
            }
        }
        let mut stmt = tx
                .prepare(
                    "SELECT i.flow_id, coalesce(c.applied_seq, 0) + 1, min(i.received_at_ms)
                     FROM inbox i LEFT JOIN inbox_cursor c ON c.flow_id = i.flow_id
                     WHERE i.status = 'pending' AND i.seq > coalesce(c.applied_seq, 0) + 1
                       AND NOT EXISTS (SELECT 1 FROM inbox j
                                       WHERE j.flow_id = i.flow_id AND j.seq = coalesce(c.applied_seq, 0) + 1)
                     GROUP BY i.flow_id ORDER BY i.flow_id",
                )
                .map_err(err)?;
        let rows = stmt
            .query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, i64>(2)?,
                ))
            })
            .map_err(err)?;
        for row in rows {
            let (flow_id, missing, since_ms) = row.map_err(err)?;
            status.gaps_total += 1;
            if status.gaps.len() >= GAPS_LISTED_MAX {
                continue;
            }
            status.gaps.push(GapWait {
                flow_id: FlowId::new(flow_id)
                    .map_err(|e| corrupt("consumer: stored flow id", e))?,
                missing: Seq::new(missing).map_err(|e| corrupt("consumer: cursor", e))?,
                since_ms,
            });
        }
    }
    Ok(status)
}

pub(super) fn prune_inbox(db: &mut ConsumerDb, cutoff_ms: i64) -> Result<Pruned, StoreError> {
    let tx = begin_write(&mut db.conn)?;
    let err = |e| sql_error("consumer: cannot prune the inbox", e);
    let fingerprints = exec_cached(
        &tx,
        "INSERT INTO inbox_fingerprint (flow_id, seq, event_id, body_hash, status)
                 SELECT flow_id, seq, event_id, unhex(body_hash), status FROM inbox
                 WHERE status IN ('applied', 'skipped') AND settled_at_ms < ?1",
        [cutoff_ms],
    )
    .map_err(err)?;
    exec_cached(
        &tx,
        "INSERT INTO inbox_watermark (flow_id, pruned_seq)
             SELECT flow_id, max(seq) FROM inbox
             WHERE status IN ('applied', 'skipped') AND settled_at_ms < ?1 GROUP BY flow_id
             ON CONFLICT (flow_id) DO UPDATE SET pruned_seq = max(pruned_seq, excluded.pruned_seq)",
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
    tx.commit()
        .map_err(|e| sql_error("consumer: prune commit failed", e))?;
    db.commits += 1;
    Ok(Pruned {
        rows: rows as u64,
        fingerprints: fingerprints as u64,
    })
}
