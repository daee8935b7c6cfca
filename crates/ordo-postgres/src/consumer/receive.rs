//! Receive: stores envelopes durably, deciding `accepted`, `duplicate` or
//! `conflict` against the inbox and the fingerprints left by pruning.

use ordo_core::store::{decide_receive, StoredIdentities};
use ordo_core::{crash, BodyHash, Envelope, EventId, Receipt, StoreError};

use super::PgConsumer;
use crate::conn::PgTx;
use crate::error::corrupt;

const CONTEXT: &str = "consumer: receive failed";

pub(super) fn receive_batch(
    db: &mut PgConsumer,
    envelopes: &[Envelope],
) -> Result<Vec<Receipt>, StoreError> {
    let mut flows: Vec<&str> = envelopes.iter().map(|e| e.flow_id.as_str()).collect();
    flows.sort_unstable();
    flows.dedup();
    db.write(CONTEXT, |tx, now_ms| {
        // Each flow's apply cursor row exists before its first event is
        // stored, so that appliers lock it (and skip it when another holds
        // it) and never wait to create it.
        tx.run(
            CONTEXT,
            "INSERT INTO {s}.inbox_cursor (flow_id, applied_seq)
             SELECT flow_id, 0 FROM unnest($1::text[]) AS flow_id
             ON CONFLICT (flow_id) DO NOTHING",
            &[&flows],
        )?;
        let receipts = envelopes
            .iter()
            .map(|envelope| receive_one(tx, envelope, now_ms))
            .collect::<Result<Vec<_>, _>>()?;
        crash::point(crash::CONSUMER_RECEIVE_BEFORE_COMMIT);
        Ok(receipts)
    })
    .inspect(|_| crash::point(crash::CONSUMER_RECEIVE_AFTER_COMMIT))
}

/// Decides and, when accepted, stores one envelope. An insert that loses a
/// race with another receiver of the same identities inserts nothing and
/// decides again against what that one committed.
fn receive_one(tx: &PgTx, envelope: &Envelope, now_ms: i64) -> Result<Receipt, StoreError> {
    let hash = envelope.body_hash();
    for _ in 0..2 {
        let stored = identities(tx, envelope)?;
        let receipt = decide_receive(&envelope.event_id, &hash, &stored);
        if receipt != Receipt::Accepted {
            return Ok(receipt);
        }
        let inserted = tx.run(
            CONTEXT,
            "INSERT INTO {s}.inbox (event_id, flow_id, seq, schema_version, type, body, body_hash, status, received_at_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8) ON CONFLICT DO NOTHING",
            &[
                &envelope.event_id.as_str(),
                &envelope.flow_id.as_str(),
                &envelope.seq.get(),
                &envelope.schema_version.get(),
                &envelope.event_type.as_str(),
                &envelope.stored_text(),
                &hash.as_str(),
                &now_ms,
            ],
        )?;
        if inserted == 1 {
            return Ok(Receipt::Accepted);
        }
    }
    Err(corrupt(
        CONTEXT,
        format!("event {} neither inserts nor is found", envelope.event_id),
    ))
}

/// Both identities, in the inbox or remembered after pruning, and the
/// prune watermark, in one statement.
fn identities(tx: &PgTx, envelope: &Envelope) -> Result<StoredIdentities, StoreError> {
    let row = tx
        .row(
            CONTEXT,
            "SELECT coalesce((SELECT body_hash FROM {s}.inbox WHERE event_id = $1),
                             (SELECT encode(body_hash, 'hex') FROM {s}.inbox_fingerprint WHERE event_id = $1)),
                    coalesce((SELECT event_id FROM {s}.inbox WHERE flow_id = $2 AND seq = $3),
                             (SELECT event_id FROM {s}.inbox_fingerprint WHERE flow_id = $2 AND seq = $3)),
                    EXISTS (SELECT 1 FROM {s}.inbox_watermark WHERE flow_id = $2 AND pruned_seq >= $3)",
            &[
                &envelope.event_id.as_str(),
                &envelope.flow_id.as_str(),
                &envelope.seq.get(),
            ],
        )?
        .expect("a SELECT without FROM returns one row");
    let hash: Option<String> = row.get(0);
    let id: Option<String> = row.get(1);
    Ok(StoredIdentities {
        by_event_id: hash
            .map(|hex| {
                BodyHash::from_hex(&hex).map_err(|e| corrupt("consumer: stored body hash", e))
            })
            .transpose()?,
        by_flow_seq: id
            .map(|id| EventId::new(id).map_err(|e| corrupt("consumer: stored event id", e)))
            .transpose()?,
        below_watermark: row.get(2),
    })
}
