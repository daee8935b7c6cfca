//! Receive: stores envelopes durably, deciding `accepted`, `duplicate` or
//! `conflict` against the inbox and the fingerprints left by pruning.

use ordo_core::crash;
use ordo_core::store::{decide_and_store, ReceiveRows, StoredIdentities};
use ordo_core::{Answer, BodyHash, Envelope, StoreError, StoreId};
use rusqlite::{params, CachedStatement};

use super::schema::begin_write;
use super::ConsumerDb;
use crate::conn::{sql_error, Text};

/// Stores `envelopes` in one transaction, as core decides each answer
/// ([`decide_and_store`]) from what the inbox and its fingerprints hold,
/// the envelopes stored before it included; wakes this process's appliers
/// when one was accepted.
pub(super) fn receive_answers(
    db: &mut ConsumerDb,
    sender: Option<&StoreId>,
    envelopes: &[Envelope],
) -> Result<Vec<Answer>, StoreError> {
    let tx = begin_write(&mut db.conn)?;
    // Read under the write lock: reception times follow commit order.
    let now_ms = db.clock.now_ms();
    // Each statement prepared once for the batch. While pruning has left
    // nothing (the transaction holds the file: nothing else writes
    // meanwhile), an envelope is stored without a read first: the insert
    // itself finds whether either identity is held.
    let prepare = |sql| tx.prepare_cached(sql).map_err(|e| sql_error(CONTEXT, e));
    let pruned: bool = prepare(PRUNED_ANY)?
        .query_row([], |row| row.get(0))
        .map_err(|e| sql_error(CONTEXT, e))?;
    let mut rows = Rows {
        envelopes,
        pruned,
        lookup: prepare(if pruned { IDENTITIES } else { INBOX_IDENTITIES })?,
        insert_if_free: prepare(INSERT_IF_FREE)?,
        insert: prepare(INSERT)?,
        text: Vec::new(),
        sender: sender.map(StoreId::as_str),
        now_ms,
        stored_any: false,
    };
    let answers = decide_and_store(envelopes, sender, &mut rows)?;
    let stored_any = rows.stored_any;
    drop(rows);
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

/// The statements of one receive, and what it stored.
struct Rows<'a, 'tx> {
    envelopes: &'a [Envelope],
    /// Whether pruning left fingerprints or watermarks, which an insert
    /// alone does not see.
    pruned: bool,
    lookup: CachedStatement<'tx>,
    insert_if_free: CachedStatement<'tx>,
    insert: CachedStatement<'tx>,
    /// Each body written into one buffer, reused.
    text: Vec<u8>,
    sender: Option<&'a str>,
    now_ms: i64,
    stored_any: bool,
}

impl Rows<'_, '_> {
    /// Stores the envelope at `index` as pending, through [`INSERT_IF_FREE`]
    /// (`if_free`) or [`INSERT`]; whether it stored it.
    fn insert(&mut self, index: usize, hash: &BodyHash, if_free: bool) -> Result<bool, StoreError> {
        let envelope = &self.envelopes[index];
        self.text.clear();
        envelope.write_stored_text(&mut self.text);
        let statement = match if_free {
            true => &mut self.insert_if_free,
            false => &mut self.insert,
        };
        let row = (envelope, self.text.as_slice());
        let stored = insert(statement, row, hash, self.sender, self.now_ms)?;
        self.stored_any |= stored;
        Ok(stored)
    }
}

impl ReceiveRows for Rows<'_, '_> {
    fn store_if_free(&mut self, index: usize, hash: &BodyHash) -> Result<bool, StoreError> {
        if self.pruned {
            return Ok(false);
        }
        self.insert(index, hash, true)
    }

    fn identities(&mut self, index: usize) -> Result<StoredIdentities, StoreError> {
        identities(&mut self.lookup, &self.envelopes[index])
    }

    fn store(&mut self, index: usize, hash: &BodyHash) -> Result<(), StoreError> {
        let stored = self.insert(index, hash, false)?;
        assert!(stored, "an accepted envelope is one new row");
        Ok(())
    }
}

/// Both identities of `envelope`, in the inbox or remembered after
/// pruning, with the stores that delivered them, and the prune watermark,
/// in one statement.
fn identities(
    lookup: &mut CachedStatement<'_>,
    envelope: &Envelope,
) -> Result<StoredIdentities, StoreError> {
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
    let (by_id, at_seq, below_watermark) = lookup
        .query_row(
            params![
                envelope.event_id.as_str(),
                envelope.flow_id.as_str(),
                envelope.seq.get(),
                envelope.producer.as_str(),
            ],
            |row| Ok((either(row, 0)?, either(row, 4)?, row.get(8)?)),
        )
        .map_err(|e| sql_error(CONTEXT, e))?;
    StoredIdentities::from_columns(by_id.0, at_seq.0, below_watermark, (by_id.1, at_seq.1))
}

/// Stores an envelope, whose stored body is `text`, as pending, through
/// `insert_row` ([`INSERT`] or [`INSERT_IF_FREE`]); whether it stored it.
fn insert(
    insert_row: &mut CachedStatement<'_>,
    (envelope, text): (&Envelope, &[u8]),
    hash: &BodyHash,
    sender: Option<&str>,
    now_ms: i64,
) -> Result<bool, StoreError> {
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
        ])
        .map_err(|e| sql_error(CONTEXT, e))?;
    assert!(inserted <= 1, "one envelope is one row at most");
    Ok(inserted == 1)
}

const CONTEXT: &str = "consumer: receive failed";

/// Both identities of an envelope in the inbox and in its fingerprints,
/// and whether its seq is below the flow's prune watermark: each a lookup
/// by a unique key, joined to one row (subqueries in `FROM` would each be
/// built into a temporary table at every run).
const IDENTITIES: &str = "SELECT i.body_hash, i.store_id,
        CASE WHEN f.body_hash IS NOT NULL THEN lower(hex(f.body_hash)) END, f.store_id,
        s.event_id, s.store_id, g.event_id, g.store_id,
        EXISTS (SELECT 1 FROM inbox_watermark
                WHERE flow_id = ?2 AND producer = ?4 AND pruned_seq >= ?3)
 FROM (SELECT 1)
 LEFT JOIN inbox i ON i.producer = ?4 AND i.event_id = ?1
 LEFT JOIN inbox_fingerprint f ON f.producer = ?4 AND f.event_id = ?1
 LEFT JOIN inbox s ON s.flow_id = ?2 AND s.producer = ?4 AND s.seq = ?3
 LEFT JOIN inbox_fingerprint g ON g.flow_id = ?2 AND g.producer = ?4 AND g.seq = ?3";

/// Whether pruning left any fingerprint or watermark.
const PRUNED_ANY: &str = "SELECT EXISTS (SELECT 1 FROM inbox_fingerprint)
        OR EXISTS (SELECT 1 FROM inbox_watermark)";

/// [`IDENTITIES`] of a file pruning left nothing in: the same columns,
/// those of the fingerprints and watermark empty.
const INBOX_IDENTITIES: &str = "SELECT i.body_hash, i.store_id, NULL, NULL,
        s.event_id, s.store_id, NULL, NULL, 0
 FROM (SELECT 1)
 LEFT JOIN inbox i ON i.producer = ?4 AND i.event_id = ?1
 LEFT JOIN inbox s ON s.flow_id = ?2 AND s.producer = ?4 AND s.seq = ?3";

/// The insert of an envelope as pending.
macro_rules! insert_sql {
    () => {
        "INSERT INTO inbox (event_id, flow_id, seq, schema_version, type, body, body_hash,
                            status, received_at_ms, store_id, producer)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', ?8, ?9, ?10)"
    };
}

/// An accepted envelope, stored as pending.
const INSERT: &str = insert_sql!();

/// [`INSERT`], which stores nothing where either identity is held.
const INSERT_IF_FREE: &str = concat!(insert_sql!(), " ON CONFLICT DO NOTHING");
