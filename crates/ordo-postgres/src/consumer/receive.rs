//! Receive: stores envelopes durably, deciding `accepted`, `duplicate` or
//! `conflict` against the inbox and the fingerprints left by pruning.
//!
//! A batch is decided and stored in a few statements whatever its size
//! (arrays as parameters): every envelope's stored identities read at once,
//! the receipts decided in order (each envelope seeing those accepted
//! before it in the batch, as one after the other would), the accepted
//! ones inserted at once. When an insert loses a race with another
//! receiver of the same identities, the batch is rolled back and decided
//! again one envelope at a time, against what that one committed.

use ordo_core::store::{decide_batch, Delivery, StoredIdentities};
use ordo_core::{crash, Answer, BodyHash, Envelope, Receipt, StoreError, StoreId};
use postgres::Row;

use super::PgConsumer;
use crate::columns::EnvelopeColumns;
use crate::conn::PgTx;
use crate::error::{corrupt, is_unique_violation};

const CONTEXT: &str = "consumer: receive failed";
const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

pub(super) fn receive_answers(
    db: &mut PgConsumer,
    sender: Option<&StoreId>,
    envelopes: &[Envelope],
) -> Result<Vec<Answer>, StoreError> {
    let mut flows: Vec<(&str, &str)> = envelopes
        .iter()
        .map(|e| (e.flow_id.as_str(), e.producer.as_str()))
        .collect();
    flows.sort_unstable();
    flows.dedup();
    for one_by_one in [false, true] {
        let tx = &db.conn;
        let txid = tx.begin_with(CONTEXT, BEGIN)?;
        let now_ms = db.clock.now_ms();
        let delivery = Delivery::from(sender);
        let answers = match receive_in_tx(tx, &flows, envelopes, delivery, now_ms, one_by_one) {
            Ok(Some(answers)) => answers,
            Ok(None) => {
                tx.rollback();
                continue;
            }
            Err(e) => {
                tx.rollback();
                return Err(e);
            }
        };
        crash::point(crash::CONSUMER_RECEIVE_BEFORE_COMMIT);
        // One notification per batch that stored anything, sent with the
        // COMMIT (delivered only if it commits).
        let stored = answers.iter().any(|a| a.receipt == Receipt::Accepted);
        tx.commit_with(CONTEXT, txid, db.wake.commit_statement(stored))?;
        db.commits += 1;
        crash::point(crash::CONSUMER_RECEIVE_AFTER_COMMIT);
        if stored {
            db.wake.raise();
        }
        return Ok(answers);
    }
    unreachable!("a batch received one envelope at a time always ends")
}

/// The answers of `envelopes`, stored in the open transaction; `None` when
/// the batch lost a race (only when not `one_by_one`).
fn receive_in_tx<'a>(
    tx: &PgTx,
    flows: &[(&str, &str)],
    envelopes: &'a [Envelope],
    mut delivery: Delivery<'a>,
    now_ms: i64,
    one_by_one: bool,
) -> Result<Option<Vec<Answer>>, StoreError> {
    create_cursors(tx, flows)?;
    if one_by_one {
        let mut answers = Vec::with_capacity(envelopes.len());
        for envelope in envelopes {
            let hash = envelope.body_hash();
            let answer = receive_one(tx, &delivery, envelope, &hash, now_ms)?;
            delivery.record(envelope, &hash, &answer);
            answers.push(answer);
        }
        return Ok(Some(answers));
    }
    receive_all(tx, envelopes, delivery.sender(), now_ms)
}

/// Creates the apply cursor, at 0, of each of `flows` (`(flow_id,
/// producer)`, sorted, each once) that lacks one, so that appliers lock
/// it (and skip it when another holds it) and never wait to create it.
fn create_cursors(tx: &PgTx, flows: &[(&str, &str)]) -> Result<u64, StoreError> {
    let (flow_ids, producers): (Vec<&str>, Vec<&str>) = flows.iter().copied().unzip();
    tx.run(
        CONTEXT,
        "INSERT INTO {s}.inbox_cursor (flow_id, producer, applied_seq)
         SELECT flow_id, producer, 0 FROM unnest($1::text[], $2::text[]) AS f(flow_id, producer)
         ON CONFLICT (flow_id, producer) DO NOTHING",
        &[&flow_ids, &producers],
    )
}

/// Decides the whole batch from one read, then inserts what it accepted in
/// one statement; `None` when one of those inserts did not happen.
fn receive_all(
    tx: &PgTx,
    envelopes: &[Envelope],
    sender: Option<&StoreId>,
    now_ms: i64,
) -> Result<Option<Vec<Answer>>, StoreError> {
    let ids: Vec<&str> = envelopes.iter().map(|e| e.event_id.as_str()).collect();
    let flows: Vec<&str> = envelopes.iter().map(|e| e.flow_id.as_str()).collect();
    let seqs: Vec<i64> = envelopes.iter().map(|e| e.seq.get()).collect();
    let producers: Vec<&str> = envelopes.iter().map(|e| e.producer.as_str()).collect();
    let rows = tx.rows(
        CONTEXT,
        "SELECT coalesce((SELECT body_hash FROM {s}.inbox
                          WHERE event_id = r.event_id AND producer = r.producer),
                         (SELECT encode(body_hash, 'hex') FROM {s}.inbox_fingerprint
                          WHERE event_id = r.event_id AND producer = r.producer)),
                coalesce((SELECT event_id FROM {s}.inbox
                          WHERE flow_id = r.flow_id AND producer = r.producer AND seq = r.seq),
                         (SELECT event_id FROM {s}.inbox_fingerprint
                          WHERE flow_id = r.flow_id AND producer = r.producer AND seq = r.seq)),
                EXISTS (SELECT 1 FROM {s}.inbox_watermark
                        WHERE flow_id = r.flow_id AND producer = r.producer AND pruned_seq >= r.seq),
                coalesce((SELECT store_id FROM {s}.inbox
                          WHERE event_id = r.event_id AND producer = r.producer),
                         (SELECT store_id FROM {s}.inbox_fingerprint
                          WHERE event_id = r.event_id AND producer = r.producer)),
                coalesce((SELECT store_id FROM {s}.inbox
                          WHERE flow_id = r.flow_id AND producer = r.producer AND seq = r.seq),
                         (SELECT store_id FROM {s}.inbox_fingerprint
                          WHERE flow_id = r.flow_id AND producer = r.producer AND seq = r.seq))
         FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[])
              WITH ORDINALITY AS r(event_id, flow_id, seq, producer, i)
         ORDER BY r.i",
        &[&ids, &flows, &seqs, &producers],
    )?;
    if rows.len() != envelopes.len() {
        return Err(corrupt(
            CONTEXT,
            format!(
                "{} identities read for {} envelopes",
                rows.len(),
                envelopes.len()
            ),
        ));
    }
    let stored = rows
        .iter()
        .map(stored_identities)
        .collect::<Result<Vec<_>, _>>()?;
    let (answers, accepted) = decide_batch(envelopes, stored, sender);
    if accepted.is_empty() {
        return Ok(Some(answers));
    }
    let accepted: Vec<(&Envelope, BodyHash)> = accepted
        .into_iter()
        .map(|(i, hash)| (&envelopes[i], hash))
        .collect();
    match insert_all(tx, &accepted, sender, now_ms)? {
        true => Ok(Some(answers)),
        false => Ok(None),
    }
}

/// Inserts the accepted envelopes in one statement; false when another
/// receiver stored one of their identities since the batch read them.
fn insert_all(
    tx: &PgTx,
    accepted: &[(&Envelope, BodyHash)],
    sender: Option<&StoreId>,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let sender = sender.map(StoreId::as_str);
    let columns = EnvelopeColumns::of(accepted.iter().map(|(e, _)| *e));
    let hashes: Vec<&str> = accepted.iter().map(|(_, h)| h.as_str()).collect();
    let producers: Vec<&str> = accepted.iter().map(|(e, _)| e.producer.as_str()).collect();
    // A plain insert: a row another receiver stored since the read above
    // fails it (SQLSTATE 23505) instead of being passed over, which spares
    // every row the extra probe of each unique index that `ON CONFLICT`
    // makes before inserting.
    let inserted = tx.run(
        CONTEXT,
        "INSERT INTO {s}.inbox (event_id, flow_id, seq, schema_version, type, body, body_hash,
                                status, received_at_ms, store_id, producer)
         SELECT e.event_id, e.flow_id, e.seq, e.schema_version, e.type, e.body, e.body_hash,
                'pending', $8, $9, e.producer
         FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::text[],
                     $7::text[], $10::text[])
              WITH ORDINALITY AS e(event_id, flow_id, seq, schema_version, type, body, body_hash,
                                   producer, i)
         ORDER BY e.i",
        &columns.params(&[&hashes, &now_ms, &sender, &producers]),
    );
    match inserted {
        Ok(rows) if rows == accepted.len() as u64 => Ok(true),
        Ok(rows) => Err(corrupt(
            CONTEXT,
            format!("{rows} rows inserted for {} accepted", accepted.len()),
        )),
        Err(e) if is_unique_violation(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Decides and, when accepted, stores one envelope. An insert that loses a
/// race with another receiver of the same identities inserts nothing and
/// decides again against what that one committed.
fn receive_one<'a>(
    tx: &PgTx,
    delivery: &Delivery<'a>,
    envelope: &'a Envelope,
    hash: &BodyHash,
    now_ms: i64,
) -> Result<Answer, StoreError> {
    if let Some(answer) = delivery.after_conflict(envelope) {
        return Ok(answer);
    }
    for _ in 0..2 {
        let stored = identities(tx, envelope)?;
        let answer = delivery.decide(envelope, hash, stored);
        if answer.receipt != Receipt::Accepted {
            return Ok(answer);
        }
        let inserted = tx.run(
            CONTEXT,
            "INSERT INTO {s}.inbox (event_id, flow_id, seq, schema_version, type, body, body_hash,
                                    status, received_at_ms, store_id, producer)
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8, $9, $10) ON CONFLICT DO NOTHING",
            &[
                &envelope.event_id.as_str(),
                &envelope.flow_id.as_str(),
                &envelope.seq.get(),
                &envelope.schema_version.get(),
                &envelope.event_type.as_str(),
                &envelope.stored_text(),
                &hash.as_str(),
                &now_ms,
                &delivery.sender().map(StoreId::as_str),
                &envelope.producer.as_str(),
            ],
        )?;
        if inserted == 1 {
            return Ok(answer);
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
            "SELECT coalesce((SELECT body_hash FROM {s}.inbox WHERE event_id = $1 AND producer = $4),
                             (SELECT encode(body_hash, 'hex') FROM {s}.inbox_fingerprint
                              WHERE event_id = $1 AND producer = $4)),
                    coalesce((SELECT event_id FROM {s}.inbox
                              WHERE flow_id = $2 AND producer = $4 AND seq = $3),
                             (SELECT event_id FROM {s}.inbox_fingerprint
                              WHERE flow_id = $2 AND producer = $4 AND seq = $3)),
                    EXISTS (SELECT 1 FROM {s}.inbox_watermark
                            WHERE flow_id = $2 AND producer = $4 AND pruned_seq >= $3),
                    coalesce((SELECT store_id FROM {s}.inbox WHERE event_id = $1 AND producer = $4),
                             (SELECT store_id FROM {s}.inbox_fingerprint
                              WHERE event_id = $1 AND producer = $4)),
                    coalesce((SELECT store_id FROM {s}.inbox
                              WHERE flow_id = $2 AND producer = $4 AND seq = $3),
                             (SELECT store_id FROM {s}.inbox_fingerprint
                              WHERE flow_id = $2 AND producer = $4 AND seq = $3))",
            &[
                &envelope.event_id.as_str(),
                &envelope.flow_id.as_str(),
                &envelope.seq.get(),
                &envelope.producer.as_str(),
            ],
        )?
        .expect("a SELECT without FROM returns one row");
    stored_identities(&row)
}

/// The identities of a row of (hash by event id, event id by position,
/// below the watermark, the delivering store by event id, by position).
fn stored_identities(row: &Row) -> Result<StoredIdentities, StoreError> {
    StoredIdentities::from_columns(row.get(0), row.get(1), row.get(2), (row.get(3), row.get(4)))
}
