//! Receive: stores envelopes durably, deciding `accepted`, `duplicate` or
//! `conflict` against the inbox and the fingerprints left by pruning.

use ordo_core::crash;
use ordo_core::store::{decide_batch, StoredIdentities};
use ordo_core::{Answer, BodyHash, Envelope, InboxFlow, StoreError, StoreId};
use rusqlite::{params, CachedStatement, Connection};

use super::schema::begin_write;
use super::ConsumerDb;
use crate::conn::{exec_cached, sql_error, Text};

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
    // Each statement prepared once for the batch; the lookups of what
    // pruning left only when it left anything (the transaction holds the
    // file: nothing else writes meanwhile).
    let pruned: bool = tx
        .prepare_cached(PRUNED_ANY)
        .and_then(|mut statement| statement.query_row([], |row| row.get(0)))
        .map_err(|e| sql_error(CONTEXT, e))?;
    let mut lookup = tx
        .prepare_cached(if pruned { IDENTITIES } else { INBOX_IDENTITIES })
        .map_err(|e| sql_error(CONTEXT, e))?;
    let mut keys = Vec::with_capacity(envelopes.len());
    let stored = envelopes
        .iter()
        .map(|envelope| {
            let (identities, key) = identities(&mut lookup, envelope)?;
            keys.push(key);
            Ok(identities)
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    drop(lookup);
    let (answers, accepted) = decide_batch(envelopes, stored, sender);
    let stored_any = !accepted.is_empty();
    let sender = sender.map(StoreId::as_str);
    if !accepted.is_empty() {
        let mut insert_row = tx
            .prepare_cached(INSERT)
            .map_err(|e| sql_error(CONTEXT, e))?;
        let mut new_flows = NewFlows::default();
        // Each body written into one buffer, reused.
        let mut text = Vec::new();
        for (index, hash) in accepted {
            let envelope = &envelopes[index];
            let key = match keys[index] {
                Some(key) => key,
                None => new_flows.key(&tx, envelope)?,
            };
            text.clear();
            envelope.write_stored_text(&mut text);
            insert(
                &mut insert_row,
                (key, envelope, &text),
                &hash,
                sender,
                now_ms,
            )?;
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

/// The keys given in one receive to flows received for the first time.
#[derive(Default)]
struct NewFlows {
    keys: Vec<(InboxFlow, i64)>,
}

impl NewFlows {
    /// The key of the flow of `envelope`, which had none when the batch
    /// began: given by the first of its events, found by the others.
    fn key(&mut self, tx: &Connection, envelope: &Envelope) -> Result<i64, StoreError> {
        let given = self.keys.iter().find(|(flow, _)| {
            flow.flow_id == envelope.flow_id && flow.producer == envelope.producer
        });
        if let Some(&(_, key)) = given {
            return Ok(key);
        }
        let inserted = exec_cached(
            tx,
            "INSERT INTO inbox_flow (flow_id, producer) VALUES (?1, ?2)",
            params![envelope.flow_id.as_str(), envelope.producer.as_str()],
        )
        .map_err(|e| sql_error(CONTEXT, e))?;
        assert_eq!(inserted, 1, "a new flow is one new row");
        let key = tx.last_insert_rowid();
        let flow = InboxFlow::new(envelope.producer.clone(), envelope.flow_id.clone());
        self.keys.push((flow, key));
        Ok(key)
    }
}

/// Both identities of `envelope`, in the inbox or remembered after
/// pruning, with the stores that delivered them, and the prune watermark,
/// in one statement; and the key of its flow (`None`: never received).
fn identities(
    lookup: &mut CachedStatement<'_>,
    envelope: &Envelope,
) -> Result<(StoredIdentities, Option<i64>), StoreError> {
    // A row of the inbox, or else its fingerprint: the hash (or event id)
    // and the store that delivered it.
    type Found = (Option<String>, Option<String>);
    let either = |row: &rusqlite::Row<'_>, at: usize| -> rusqlite::Result<Found> {
        let inbox: Found = (row.get(at)?, row.get(at + 1)?);
        if inbox.0.is_some() {
            return Ok(inbox);
        }
        Ok((row.get(at + 2)?, row.get(at + 3)?))
    };
    let (by_id, at_seq, below_watermark, key) = lookup
        .query_row(
            params![
                envelope.event_id.as_str(),
                envelope.flow_id.as_str(),
                envelope.seq.get(),
                envelope.producer.as_str(),
            ],
            |row| Ok((either(row, 0)?, either(row, 4)?, row.get(8)?, row.get(9)?)),
        )
        .map_err(|e| sql_error(CONTEXT, e))?;
    let stored =
        StoredIdentities::from_columns(by_id.0, at_seq.0, below_watermark, (by_id.1, at_seq.1))?;
    Ok((stored, key))
}

/// Stores an accepted envelope, whose stored body is `text`, as pending.
fn insert(
    insert_row: &mut CachedStatement<'_>,
    (key, envelope, text): (i64, &Envelope, &[u8]),
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
            Text(text),
            hash.as_str(),
            now_ms,
            sender,
            envelope.producer.as_str(),
            key,
        ])
        .map_err(|e| sql_error(CONTEXT, e))?;
    assert_eq!(inserted, 1, "an accepted envelope is one new row");
    Ok(())
}

const CONTEXT: &str = "consumer: receive failed";

/// Both identities of an envelope in the inbox and in its fingerprints,
/// whether its seq is below the flow's prune watermark, and its flow's key:
/// each a lookup by a unique key, joined to one row (subqueries in `FROM`
/// would each be built into a temporary table at every run).
const IDENTITIES: &str = "SELECT i.body_hash, i.store_id,
        CASE WHEN f.body_hash IS NOT NULL THEN lower(hex(f.body_hash)) END, f.store_id,
        s.event_id, s.store_id, g.event_id, g.store_id,
        coalesce(k.pruned_seq >= ?3, 0), k.flow
 FROM (SELECT 1)
 LEFT JOIN inbox i ON i.producer = ?4 AND i.event_id = ?1
 LEFT JOIN inbox_fingerprint f ON f.producer = ?4 AND f.event_id = ?1
 LEFT JOIN inbox_flow k ON k.flow_id = ?2 AND k.producer = ?4
 LEFT JOIN inbox s ON s.flow = k.flow AND s.seq = ?3
 LEFT JOIN inbox_fingerprint g ON g.flow_id = ?2 AND g.producer = ?4 AND g.seq = ?3";

/// Whether pruning left any fingerprint or watermark.
const PRUNED_ANY: &str = "SELECT EXISTS (SELECT 1 FROM inbox_fingerprint)
        OR EXISTS (SELECT 1 FROM inbox_flow WHERE pruned_seq > 0)";

/// [`IDENTITIES`] of a file pruning left nothing in: the same columns,
/// those of the fingerprints and watermark empty.
const INBOX_IDENTITIES: &str = "SELECT i.body_hash, i.store_id, NULL, NULL,
        s.event_id, s.store_id, NULL, NULL, 0, k.flow
 FROM (SELECT 1)
 LEFT JOIN inbox i ON i.producer = ?4 AND i.event_id = ?1
 LEFT JOIN inbox_flow k ON k.flow_id = ?2 AND k.producer = ?4
 LEFT JOIN inbox s ON s.flow = k.flow AND s.seq = ?3";

/// An accepted envelope, stored as pending.
const INSERT: &str =
    "INSERT INTO inbox (event_id, flow_id, seq, schema_version, type, body, body_hash,
                                         status, received_at_ms, store_id, producer, flow)
                      VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', ?8, ?9, ?10, ?11)";
