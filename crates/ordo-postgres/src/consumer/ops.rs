//! Operations on the consumer: listing, re-evaluating and skipping blocked
//! rows, the repair log, alerting signals, and pruning.

use ordo_core::effect::EffectKey;
use ordo_core::ops::{
    decide_skip, whole_read, whole_read_limit, ConsumerStatus, InboxEntry, InboxScope, Pruned,
    RepairRecord, SkipRefused, SkipRequest, WHOLE_READ_ROWS_MAX,
};
use ordo_core::store::{sql_limit, stored_producer};
use ordo_core::{EventId, FlowId, InboxFlow, Seq, StoreError, StoreId};
use postgres::Row;

use super::{inbox_status, PgConsumer};
use crate::conn::PgTx;
use crate::error::corrupt;
use crate::producer::{read_snapshot, stored_envelope};

pub(super) fn inbox_entries(
    db: &mut PgConsumer,
    blocked_only: bool,
    scope: InboxScope<'_>,
    limit: usize,
) -> Result<Vec<InboxEntry>, StoreError> {
    let (producer, flow_id) = scope.bounds();
    // One statement per shape, so that a plan reused on a long-lived
    // connection still reads one flow by its key.
    let sql = match flow_id {
        Some(_) => {
            "SELECT body, status, reason, received_at_ms, settled_at_ms, detail, store_id FROM {s}.inbox
             WHERE flow_id = $3::text AND producer = $2::text AND (NOT $1 OR status = 'blocked')
             ORDER BY seq LIMIT $4"
        }
        None => {
            "SELECT body, status, reason, received_at_ms, settled_at_ms, detail, store_id FROM {s}.inbox
             WHERE (NOT $1 OR status = 'blocked') AND ($2::text IS NULL OR producer = $2::text)
               AND $3::text IS NULL
             ORDER BY flow_id, producer, seq LIMIT $4"
        }
    };
    let rows = db.conn.rows(
        "consumer: cannot list the inbox",
        sql,
        &[&blocked_only, &producer, &flow_id, &sql_limit(limit)],
    )?;
    rows.iter().map(inbox_entry).collect()
}

/// An inbox row read as `body, status, reason, received_at_ms,
/// settled_at_ms, detail, store_id`.
pub(crate) fn inbox_entry(row: &Row) -> Result<InboxEntry, StoreError> {
    Ok(InboxEntry {
        envelope: stored_envelope("consumer: stored inbox body", row.get(0))?,
        status: inbox_status(row.get(1), row.get(2), row.get(5))?,
        received_at_ms: row.get(3),
        settled_at_ms: row.get(4),
        store_id: StoreId::stored_sender(row.get(6))?,
    })
}

pub(super) fn reopen_blocked(db: &mut PgConsumer, flow: &InboxFlow) -> Result<u64, StoreError> {
    db.write("consumer: cannot reopen blocked rows", |tx, _| {
        tx.run(
            "consumer: cannot reopen blocked rows",
            "UPDATE {s}.inbox SET status = 'pending', reason = NULL, detail = NULL
             WHERE flow_id = $1 AND producer = $2 AND status = 'blocked'",
            &[&flow.flow_id.as_str(), &flow.producer.as_str()],
        )
    })
}

const SKIP: &str = "consumer: skip failed";

pub(super) fn skip(
    db: &mut PgConsumer,
    request: &SkipRequest,
) -> Result<Result<RepairRecord, SkipRefused>, StoreError> {
    // A refusal rolls back: nothing is written.
    let outcome = db.conn.in_tx(SKIP, |tx| {
        let now_ms = db.clock.now_ms();
        match skip_in_tx(tx, request, now_ms)? {
            Ok(record) => Ok(Ok(record)),
            Err(refused) => Err(Refusal::Refused(refused)),
        }
    });
    match outcome {
        Ok(record) => {
            db.commits += 1;
            Ok(record)
        }
        Err(Refusal::Refused(refused)) => Ok(Err(refused)),
        Err(Refusal::Store(e)) => Err(e),
    }
}

/// A skip refused, or a store failure, either of which rolls back.
enum Refusal {
    Refused(SkipRefused),
    Store(StoreError),
}

impl From<StoreError> for Refusal {
    fn from(e: StoreError) -> Refusal {
        Refusal::Store(e)
    }
}

fn skip_in_tx(
    tx: &PgTx,
    request: &SkipRequest,
    now_ms: i64,
) -> Result<Result<RepairRecord, SkipRefused>, StoreError> {
    let (flow, producer) = (
        request.flow.flow_id.as_str(),
        request.flow.producer.as_str(),
    );
    let seq = request.seq.get();
    let applied_seq = super::apply::lock_cursor(tx, &request.flow)?;
    let stored: Option<(String, Option<String>)> = tx
        .row(
            SKIP,
            "SELECT event_id, store_id FROM {s}.inbox WHERE flow_id = $1 AND producer = $3 AND seq = $2",
            &[&flow, &seq, &producer],
        )?
        .map(|row| (row.get(0), row.get(1)));
    if let Err(refused) = decide_skip(request, applied_seq, stored.is_some()) {
        return Ok(Err(refused));
    }
    let (event_id, store_id) = stored.expect("decide_skip checked that the row is stored");
    let marked = tx.run(
        SKIP,
        "UPDATE {s}.inbox SET status = 'skipped', reason = NULL, detail = NULL, settled_at_ms = $3
         WHERE flow_id = $1 AND producer = $4 AND seq = $2 AND status IN ('pending', 'blocked')",
        &[&flow, &seq, &now_ms, &producer],
    )?;
    if marked != 1 {
        return Err(corrupt(
            "consumer: inbox",
            format!(
                "flow {} seq {seq} is past its cursor but settled",
                request.flow
            ),
        ));
    }
    super::apply::write_cursor(tx, &request.flow, seq)?;
    let id: i64 = tx
        .row(
            SKIP,
            "INSERT INTO {s}.repair_log (action, flow_id, seq, event_id, reason, decided_by, at_ms,
                                         producer, store_id)
             VALUES ('skip', $1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
            &[
                &flow,
                &seq,
                &event_id,
                &request.reason,
                &request.by,
                &now_ms,
                &producer,
                &store_id,
            ],
        )?
        .expect("RETURNING returns the row")
        .get(0);
    skip_record(request, id, (event_id, store_id), now_ms).map(Ok)
}

/// The repair log's row of a skip, as written.
fn skip_record(
    request: &SkipRequest,
    id: i64,
    (event_id, store_id): (String, Option<String>),
    now_ms: i64,
) -> Result<RepairRecord, StoreError> {
    Ok(RepairRecord {
        id,
        action: "skip".into(),
        producer: request.flow.producer.clone(),
        flow_id: request.flow.flow_id.clone(),
        store_id: StoreId::stored_sender(store_id)?,
        seq: request.seq,
        event_id: EventId::new(event_id).map_err(|e| corrupt("consumer: stored event id", e))?,
        reason: request.reason.clone(),
        by: request.by.clone(),
        at_ms: now_ms,
        key: None,
    })
}

pub(super) fn repairs(db: &mut PgConsumer) -> Result<Vec<RepairRecord>, StoreError> {
    repairs_at_most(&db.conn, WHOLE_READ_ROWS_MAX)
}

/// The repair log, oldest first, at most `rows_max` entries.
pub(super) fn repairs_at_most(
    conn: &PgTx,
    rows_max: usize,
) -> Result<Vec<RepairRecord>, StoreError> {
    let rows = conn.rows(
        "consumer: cannot read the repair log",
        "SELECT id, action, flow_id, seq, event_id, reason, decided_by, at_ms, producer, store_id,
                key
         FROM {s}.repair_log ORDER BY id LIMIT $1",
        &[&whole_read_limit(rows_max)],
    )?;
    let records = rows
        .iter()
        .map(repair_record)
        .collect::<Result<Vec<_>, _>>()?;
    whole_read("the repair log", rows_max, records)
}

fn repair_record(row: &Row) -> Result<RepairRecord, StoreError> {
    let context = "consumer: repair log";
    Ok(RepairRecord {
        id: row.get(0),
        action: row.get(1),
        producer: stored_producer(row.get(8))?,
        store_id: StoreId::stored_sender(row.get(9))?,
        flow_id: FlowId::new(row.get::<_, String>(2)).map_err(|e| corrupt(context, e))?,
        seq: Seq::new(row.get(3)).map_err(|e| corrupt(context, e))?,
        event_id: EventId::new(row.get::<_, String>(4)).map_err(|e| corrupt(context, e))?,
        reason: row.get(5),
        by: row.get(6),
        at_ms: row.get(7),
        key: (row.get::<_, Option<String>>(10))
            .map(EffectKey::new)
            .transpose()
            .map_err(|e| corrupt(context, e))?,
    })
}

const STATUS: &str = "consumer: cannot read the status";

/// The inbox's rows counted by producer, status and reason.
const COUNT_INBOX_SQL: &str =
    "SELECT producer, status, coalesce(reason, ''), count(*) FROM {s}.inbox
     GROUP BY producer, status, reason";

/// The pruned rows' fingerprints counted by status.
const COUNT_FINGERPRINTS_SQL: &str =
    "SELECT status, count(*) FROM {s}.inbox_fingerprint GROUP BY status";

/// The flows whose next event is missing while a later one is pending.
const GAPS_SQL: &str =
    "SELECT i.flow_id, i.producer, coalesce(c.applied_seq, 0) + 1, min(i.received_at_ms)
     FROM {s}.inbox i
     LEFT JOIN {s}.inbox_cursor c ON c.flow_id = i.flow_id AND c.producer = i.producer
     WHERE i.status = 'pending' AND i.seq > coalesce(c.applied_seq, 0) + 1
       AND NOT EXISTS (SELECT 1 FROM {s}.inbox j
                       WHERE j.flow_id = i.flow_id AND j.producer = i.producer
                         AND j.seq = coalesce(c.applied_seq, 0) + 1)
     GROUP BY i.flow_id, i.producer, c.applied_seq ORDER BY i.flow_id, i.producer";

pub(super) fn consumer_status(db: &mut PgConsumer) -> Result<ConsumerStatus, StoreError> {
    read_snapshot(&db.conn, STATUS, |tx| {
        let mut status = ConsumerStatus::default();
        for row in tx.rows(STATUS, COUNT_INBOX_SQL, &[])? {
            status.count_rows(row.get(0), row.get(1), row.get(2), row.get(3))?;
        }
        for row in tx.rows(STATUS, COUNT_FINGERPRINTS_SQL, &[])? {
            status.count_fingerprints(row.get(0), row.get(1));
        }
        for row in tx.rows(STATUS, GAPS_SQL, &[])? {
            status.count_gap((row.get(1), row.get(0)), row.get(2), row.get(3))?;
        }
        Ok(status)
    })
}

const PRUNE: &str = "consumer: cannot prune the inbox";

pub(super) fn prune_inbox(db: &mut PgConsumer, cutoff_ms: i64) -> Result<Pruned, StoreError> {
    db.write(PRUNE, |tx, _| {
        let fingerprints = tx.run(
            PRUNE,
            "INSERT INTO {s}.inbox_fingerprint (flow_id, producer, seq, event_id, body_hash, status, store_id)
             SELECT flow_id, producer, seq, event_id, decode(body_hash, 'hex'), status, store_id FROM {s}.inbox
             WHERE status IN ('applied', 'skipped') AND settled_at_ms < $1",
            &[&cutoff_ms],
        )?;
        tx.run(
            PRUNE,
            "INSERT INTO {s}.inbox_watermark (flow_id, producer, pruned_seq, store_id)
             SELECT DISTINCT ON (flow_id, producer) flow_id, producer, seq, store_id FROM {s}.inbox
             WHERE status IN ('applied', 'skipped') AND settled_at_ms < $1
             ORDER BY flow_id, producer, seq DESC
             ON CONFLICT (flow_id, producer) DO UPDATE
                 SET pruned_seq = greatest({s}.inbox_watermark.pruned_seq, excluded.pruned_seq),
                     store_id = CASE WHEN excluded.pruned_seq > {s}.inbox_watermark.pruned_seq
                                     THEN excluded.store_id ELSE {s}.inbox_watermark.store_id END",
            &[&cutoff_ms],
        )?;
        let rows = tx.run(
            PRUNE,
            "DELETE FROM {s}.inbox WHERE status IN ('applied', 'skipped') AND settled_at_ms < $1",
            &[&cutoff_ms],
        )?;
        debug_assert_eq!(rows, fingerprints, "one fingerprint per pruned row");
        tx.run(
            "consumer: cannot prune effect intents",
            "DELETE FROM {s}.effect_intent WHERE settled_at_ms < $1
               AND state IN ('succeeded', 'failed', 'skipped')",
            &[&cutoff_ms],
        )?;
        Ok(Pruned { rows, fingerprints })
    })
}
