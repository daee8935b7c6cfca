//! What both roles insert by batch: a batch of envelopes as the column
//! arrays of one `unnest` insert (the outbox's rows and the inbox's), and
//! the producer's flow rows created at 0 before their first event (the
//! outbox heads; the consumer creates its apply cursors, keyed by
//! producer, in its receive).
//!
//! Invariant: this module writes no protocol state of its own; it only
//! shapes parameters and the two creations.

use postgres::types::ToSql;

use ordo_core::{Envelope, StoreError};

use crate::conn::PgTx;

/// Creates the `outbox_head` (last seq 0) of each of `flows` (sorted, each
/// once) that lacks it, so that writers lock it (and skip it when another
/// holds it) and never wait to create it.
pub(crate) fn create_flow_rows(
    tx: &PgTx,
    context: &str,
    flows: &[&str],
) -> Result<u64, StoreError> {
    let sql = "INSERT INTO {s}.outbox_head (flow_id, last_seq)
        SELECT flow_id, 0 FROM unnest($1::text[]) AS flow_id ON CONFLICT (flow_id) DO NOTHING";
    tx.run(context, sql, &[&flows])
}

/// The stored columns of a batch of envelopes, each as one array in batch
/// order: the parameters `$1..$6` of an insert from
/// `unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::text[])`
/// (event id, flow id, seq, schema version, type, stored body).
pub(crate) struct EnvelopeColumns<'e> {
    event_ids: Vec<&'e str>,
    flow_ids: Vec<&'e str>,
    seqs: Vec<i64>,
    versions: Vec<i64>,
    types: Vec<&'e str>,
    bodies: Vec<String>,
}

impl<'e> EnvelopeColumns<'e> {
    /// The columns of `events`, in their order.
    pub(crate) fn of(events: impl ExactSizeIterator<Item = &'e Envelope> + Clone) -> Self {
        let len = events.len();
        let columns = EnvelopeColumns {
            event_ids: events.clone().map(|e| e.event_id.as_str()).collect(),
            flow_ids: events.clone().map(|e| e.flow_id.as_str()).collect(),
            seqs: events.clone().map(|e| e.seq.get()).collect(),
            versions: events.clone().map(|e| e.schema_version.get()).collect(),
            types: events.clone().map(|e| e.event_type.as_str()).collect(),
            bodies: events.map(Envelope::stored_text).collect(),
        };
        assert!(columns.bodies.len() == len && columns.event_ids.len() == len);
        columns
    }

    /// The six columns as `$1..$6`, followed by `more` as `$7..`.
    pub(crate) fn params<'p>(
        &'p self,
        more: &[&'p (dyn ToSql + Sync)],
    ) -> Vec<&'p (dyn ToSql + Sync)> {
        let mut params: Vec<&'p (dyn ToSql + Sync)> = vec![
            &self.event_ids,
            &self.flow_ids,
            &self.seqs,
            &self.versions,
            &self.types,
            &self.bodies,
        ];
        params.extend_from_slice(more);
        params
    }
}
