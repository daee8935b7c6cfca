//! Receive: stores envelopes durably, deciding `accepted`, `duplicate` or
//! `conflict` against the inbox and the fingerprints left by pruning.

use ordo_core::crash;
use ordo_core::store::{decide_receive, StoredIdentities};
use ordo_core::{BodyHash, Envelope, EventId, Receipt, StoreError};
use rusqlite::params;

use super::schema::begin_write;
use super::ConsumerDb;
use crate::conn::{corrupt, sql_error};

pub(super) fn receive_batch(
    db: &mut ConsumerDb,
    envelopes: &[Envelope],
) -> Result<Vec<Receipt>, StoreError> {
    let tx = begin_write(&mut db.conn)?;
    // Read under the write lock: reception times follow commit order.
    let now_ms = db.clock.now_ms();
    let err = |e| sql_error("consumer: receive failed", e);
    let mut receipts = Vec::with_capacity(envelopes.len());
    {
        // Both identities, in the inbox or remembered after pruning, and
        // the prune watermark, in one statement.
        let mut identities = tx
                .prepare_cached(
                    "SELECT coalesce((SELECT body_hash FROM inbox WHERE event_id = ?1),
                                     (SELECT lower(hex(body_hash)) FROM inbox_fingerprint WHERE event_id = ?1)),
                            coalesce((SELECT event_id FROM inbox WHERE flow_id = ?2 AND seq = ?3),
                                     (SELECT event_id FROM inbox_fingerprint WHERE flow_id = ?2 AND seq = ?3)),
                            EXISTS (SELECT 1 FROM inbox_watermark WHERE flow_id = ?2 AND pruned_seq >= ?3)",
                )
                .map_err(err)?;
        let mut insert = tx
                .prepare_cached(
                    "INSERT INTO inbox (event_id, flow_id, seq, schema_version, type, body, body_hash, status, received_at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', ?8)",
                )
                .map_err(err)?;
        for envelope in envelopes {
            let body = envelope.stored_text();
            let hash = envelope.body_hash();
            let (hash_hex, id_at_seq, below_watermark) = identities
                .query_row(
                    params![
                        envelope.event_id.as_str(),
                        envelope.flow_id.as_str(),
                        envelope.seq.get()
                    ],
                    |row| {
                        Ok((
                            row.get::<_, Option<String>>(0)?,
                            row.get::<_, Option<String>>(1)?,
                            row.get::<_, bool>(2)?,
                        ))
                    },
                )
                .map_err(err)?;
            let stored = StoredIdentities {
                by_event_id: hash_hex
                    .map(|hex| {
                        BodyHash::from_hex(&hex)
                            .map_err(|e| corrupt("consumer: stored body hash", e))
                    })
                    .transpose()?,
                by_flow_seq: id_at_seq
                    .map(|id| EventId::new(id).map_err(|e| corrupt("consumer: stored event id", e)))
                    .transpose()?,
                below_watermark,
            };
            let receipt = decide_receive(&envelope.event_id, &hash, &stored);
            if receipt == Receipt::Accepted {
                insert
                    .execute(params![
                        envelope.event_id.as_str(),
                        envelope.flow_id.as_str(),
                        envelope.seq.get(),
                        envelope.schema_version.get(),
                        envelope.event_type.as_str(),
                        body,
                        hash.as_str(),
                        now_ms,
                    ])
                    .map_err(err)?;
            }
            receipts.push(receipt);
        }
    }
    crash::point(crash::CONSUMER_RECEIVE_BEFORE_COMMIT);
    tx.commit()
        .map_err(|e| sql_error("consumer: receive commit failed", e))?;
    db.commits += 1;
    crash::point(crash::CONSUMER_RECEIVE_AFTER_COMMIT);
    if receipts.contains(&Receipt::Accepted) {
        db.wake.raise();
    }
    Ok(receipts)
}
