//! Receive: stores envelopes durably, deciding `accepted`, `duplicate` or
//! `conflict` against the inbox and the fingerprints left by pruning.

use ordo_core::crash;
use ordo_core::store::{decide_batch, StoredIdentities};
use ordo_core::{Answer, BodyHash, Envelope, StoreError, StoreId};
use rusqlite::{params, CachedStatement};

use super::schema::begin_write;
use super::ConsumerDb;
use crate::conn::sql_error;

/// Stores `envelopes` in one transaction, deciding each answer
/// ([`decide_batch`]) from what the inbox and its fingerprints held before
/// the batch; wakes this process's appliers when one was accepted.
pub(super) fn receive_answers(
    db: &mut ConsumerDb,
    sender: Option<&StoreId>,
    envelopes: &[Envelope],
) -> Result<Vec<Answer>, StoreError> {
    let tx = begin_write(&mut db.conn)?;
    // Read under the write lock: reception times follow commit order.
    let now_ms = db.clock.now_ms();
    // Each statement prepared once for the batch.
    let mut lookup = tx
        .prepare_cached(IDENTITIES)
        .map_err(|e| sql_error(CONTEXT, e))?;
    let stored = envelopes
        .iter()
        .map(|envelope| identities(&mut lookup, envelope))
        .collect::<Result<Vec<_>, _>>()?;
    drop(lookup);
    let (answers, accepted) = decide_batch(envelopes, stored, sender);
    let stored_any = !accepted.is_empty();
    let sender = sender.map(StoreId::as_str);
    if !accepted.is_empty() {
        let mut insert_row = tx
            .prepare_cached(INSERT)
            .map_err(|e| sql_error(CONTEXT, e))?;
        for (index, hash) in accepted {
            insert(&mut insert_row, &envelopes[index], &hash, sender, now_ms)?;
        }
    }
    crash::point(crash::CONSUMER_RECEIVE_BEFORE_COMMIT);
    tx.commit()
        .map_err(|e| sql_error("consumer: receive commit failed", e))?;
    db.commits += 1;
    crash::point(crash::CONSUMER_RECEIVE_AFTER_COMMIT);
    if stored_any {
        db.wake.raise();
    }
    Ok(answers)
}

/// Both identities of `envelope`, in the inbox or remembered after
/// pruning, with the stores that delivered them, and the prune watermark,
/// in one statement.
fn identities(
    lookup: &mut CachedStatement<'_>,
    envelope: &Envelope,
) -> Result<StoredIdentities, StoreError> {
    let (by_id, at_seq, below_watermark): ((_, _), (_, _), _) = lookup
        .query_row(
            params![
                envelope.event_id.as_str(),
                envelope.flow_id.as_str(),
                envelope.seq.get(),
                envelope.producer.as_str(),
            ],
            |row| {
                let by_id = (row.get(0)?, row.get(1)?);
                Ok((by_id, (row.get(2)?, row.get(3)?), row.get(4)?))
            },
        )
        .map_err(|e| sql_error(CONTEXT, e))?;
    StoredIdentities::from_columns(by_id.0, at_seq.0, below_watermark, (by_id.1, at_seq.1))
}

/// Stores an accepted envelope as pending.
fn insert(
    insert_row: &mut CachedStatement<'_>,
    envelope: &Envelope,
    hash: &BodyHash,
    sender: Option<&str>,
    now_ms: i64,
) -> Result<(), StoreError> {
    let inserted = insert_row
        .execute(params![
            envelope.event_id.as_str(),
            envelope.flow_id.as_str(),
            envelope.seq.get(),
            envelope.schema_version.get(),
            envelope.event_type.as_str(),
            envelope.stored_text(),
            hash.as_str(),
            now_ms,
            sender,
            envelope.producer.as_str(),
        ])
        .map_err(|e| sql_error(CONTEXT, e))?;
    assert_eq!(inserted, 1, "an accepted envelope is one new row");
    Ok(())
}

const CONTEXT: &str = "consumer: receive failed";

/// Both identities of an envelope in the inbox or its fingerprints, and
/// whether its seq is below the flow's prune watermark; each lookup once (a
/// CTE named twice is evaluated twice).
const IDENTITIES: &str = "SELECT b.hash, b.store_id, a.event_id, a.store_id,
        EXISTS (SELECT 1 FROM inbox_watermark
                WHERE flow_id = ?2 AND producer = ?4 AND pruned_seq >= ?3)
 FROM (SELECT 1)
 LEFT JOIN (SELECT body_hash AS hash, store_id FROM inbox WHERE producer = ?4 AND event_id = ?1
            UNION ALL
            SELECT lower(hex(body_hash)), store_id FROM inbox_fingerprint
            WHERE producer = ?4 AND event_id = ?1 LIMIT 1) b
 LEFT JOIN (SELECT event_id, store_id FROM inbox WHERE flow_id = ?2 AND producer = ?4 AND seq = ?3
            UNION ALL
            SELECT event_id, store_id FROM inbox_fingerprint
            WHERE flow_id = ?2 AND producer = ?4 AND seq = ?3 LIMIT 1) a";

/// An accepted envelope, stored as pending.
const INSERT: &str =
    "INSERT INTO inbox (event_id, flow_id, seq, schema_version, type, body, body_hash,
                                         status, received_at_ms, store_id, producer)
                      VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', ?8, ?9, ?10)";
