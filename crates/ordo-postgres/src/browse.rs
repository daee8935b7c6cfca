//! The reads for browsing (the operator console): flows by id prefix on
//! either side, one flow's outbox rows, one inbox row (by flow and seq, or
//! by event id). Each is a range read
//! on a primary or unique key (flow ids are `COLLATE "C"`, so the order is
//! the bytes', as on SQLite), bounded by its limit however many flows and
//! rows there are: keyset paging, never an offset. And the whole outbox
//! with its custody, for a snapshot, bounded as every whole read.

use ordo_core::ops::{whole_read, whole_read_limit, InboxEntry, OutboxEntry, WHOLE_READ_ROWS_MAX};
use ordo_core::store::sql_limit;
use ordo_core::store::FlowsPage;
use ordo_core::{EventId, FlowId, InboxFlow, ProducerName, Role, Seq, StoreError};

use crate::conn::PgTx;
use crate::consumer::inbox_entry;
use crate::producer::outbox_entries_of;

/// Each flow's last seq, on the key of `outbox_head`. A head at 0 (locked
/// by a writer that appended nothing) is no flow.
pub(crate) const PRODUCER_FLOWS_SQL: &str = "SELECT flow_id, last_seq FROM {s}.outbox_head
     WHERE flow_id >= $1 AND flow_id > $2 AND last_seq >= 1 ORDER BY flow_id LIMIT $3";

/// Each flow's apply cursor, on its key: receive creates it with the
/// flow's first event, so it lists every flow the inbox knows. A cursor at
/// 0 without a stored row (an apply that found nothing) is no flow. The
/// stored row is looked up per cursor row on the `(flow_id, seq)` key (a
/// lateral read, which the planner cannot turn into a hash of the whole
/// inbox). Flows are `(flow_id, producer)` pairs, after `($2, $4)`.
pub(crate) const CONSUMER_FLOWS_SQL: &str = "SELECT c.flow_id, c.producer, c.applied_seq
     FROM {s}.inbox_cursor AS c
     LEFT JOIN LATERAL (SELECT true AS stored FROM {s}.inbox AS i
                        WHERE i.flow_id = c.flow_id AND i.producer = c.producer LIMIT 1) AS r ON true
     WHERE c.flow_id >= $1 AND (c.flow_id, c.producer) > ($2, $4) AND (c.applied_seq >= 1 OR r.stored)
     ORDER BY c.flow_id, c.producer LIMIT $3";

/// One flow's outbox rows, on the `(flow_id, seq)` key.
pub(crate) const FLOW_OUTBOX_SQL: &str = "SELECT position, body, created_at_ms, accepted
     FROM {s}.outbox WHERE flow_id = $1 ORDER BY seq LIMIT $2";

/// The whole outbox in commit order, as [`FLOW_OUTBOX_SQL`] reads a flow's.
const WHOLE_OUTBOX_SQL: &str = "SELECT position, body, created_at_ms, accepted
     FROM {s}.outbox ORDER BY position LIMIT $1";

/// One inbox row, on the `(flow_id, producer, seq)` key.
pub(crate) const INBOX_AT_SQL: &str =
    "SELECT body, status, reason, received_at_ms, settled_at_ms, detail, store_id FROM {s}.inbox
     WHERE flow_id = $1 AND seq = $2 AND producer = $3";

/// One inbox row, on the `(event_id, producer)` key.
pub(crate) const INBOX_OF_EVENT_SQL: &str =
    "SELECT body, status, reason, received_at_ms, settled_at_ms, detail, store_id FROM {s}.inbox
     WHERE event_id = $1 AND producer = $2";

/// The rows `(flow id, number)` of one page that `sql` reads with the
/// page's bounds `(start, after, limit)` (see [`FlowsPage::bounds`]).
pub(crate) fn flows_page(
    conn: &PgTx,
    role: Role,
    sql: &'static str,
    page: FlowsPage<'_>,
) -> Result<Vec<(String, i64)>, StoreError> {
    let (start, after, limit) = page.bounds();
    let rows = conn.rows(
        &format!("{}: cannot list flows", role.as_str()),
        sql,
        &[&start, &after, &limit],
    )?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

/// The rows `(flow id, producer, applied seq)` of one page of the
/// consumer's flows.
pub(crate) fn consumer_flows_page(
    conn: &PgTx,
    page: FlowsPage<'_>,
) -> Result<Vec<(String, String, i64)>, StoreError> {
    let (start, after, limit) = page.bounds();
    let rows = conn.rows(
        "consumer: cannot list flows",
        CONSUMER_FLOWS_SQL,
        &[&start, &after, &limit, &page.after_producer],
    )?;
    Ok(rows
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect())
}

/// The flow's outbox rows in seq order, at most `limit`.
pub(crate) fn flow_outbox_entries(
    conn: &PgTx,
    flow_id: &FlowId,
    limit: usize,
) -> Result<Vec<OutboxEntry>, StoreError> {
    let rows = conn.rows(
        "producer: cannot list a flow's outbox rows",
        FLOW_OUTBOX_SQL,
        &[&flow_id.as_str(), &sql_limit(limit)],
    )?;
    outbox_entries_of(conn, &rows)
}

/// Every outbox row in commit order with each destination's custody of
/// it, read through `conn` (inside
/// [`crate::PgProducer::read`], as [`crate::read_outbox`]); at most
/// [`WHOLE_READ_ROWS_MAX`] rows.
pub fn read_outbox_entries(conn: &PgTx) -> Result<Vec<OutboxEntry>, StoreError> {
    let rows = conn.rows(
        "producer: cannot read the outbox",
        WHOLE_OUTBOX_SQL,
        &[&whole_read_limit(WHOLE_READ_ROWS_MAX)],
    )?;
    let rows = outbox_entries_of(conn, &rows)?;
    whole_read("the outbox", WHOLE_READ_ROWS_MAX, rows)
}

/// The inbox row at the flow's `seq`, if stored.
pub(crate) fn inbox_entry_at(
    conn: &PgTx,
    flow: &InboxFlow,
    seq: Seq,
) -> Result<Option<InboxEntry>, StoreError> {
    let row = conn.row(
        "consumer: cannot read an inbox row",
        INBOX_AT_SQL,
        &[&flow.flow_id.as_str(), &seq.get(), &flow.producer.as_str()],
    )?;
    row.as_ref().map(inbox_entry).transpose()
}

/// The inbox row stored under `producer`'s `event_id`, if any (a pruned
/// row is gone).
pub(crate) fn inbox_entry_of_event(
    conn: &PgTx,
    producer: &ProducerName,
    event_id: &EventId,
) -> Result<Option<InboxEntry>, StoreError> {
    let row = conn.row(
        "consumer: cannot read an inbox row",
        INBOX_OF_EVENT_SQL,
        &[&event_id.as_str(), &producer.as_str()],
    )?;
    row.as_ref().map(inbox_entry).transpose()
}

#[cfg(test)]
mod tests {
    //! The plans of the browsing reads on tables of many flows: each is an
    //! index scan, never a sequential scan, whatever the page.

    use super::*;
    use crate::plans::{assert_indexed, Filled};

    /// The parameter types of `sql`.
    fn types(sql: &str) -> &'static str {
        match sql {
            CONSUMER_FLOWS_SQL => "text, text, bigint, text",
            INBOX_AT_SQL => "text, bigint, text",
            INBOX_OF_EVENT_SQL => "text, text",
            _ if sql.contains("$3") => "text, text, bigint",
            _ => "text, bigint",
        }
    }

    #[test]
    fn browsing_reads_are_index_scans_on_many_flows() {
        let mut filled = Filled::new("browse");
        let (p, c) = (filled.p.clone(), filled.c.clone());
        let mut plan =
            |schema: &str, sql: &str, params: &str| filled.plan(schema, sql, types(sql), params);
        // The first page, a prefix, a deep keyset page, a prefix past its
        // end, on either side.
        for (sql, schema, more) in [
            (PRODUCER_FLOWS_SQL, &p, ""),
            (CONSUMER_FLOWS_SQL, &c, ", ''"),
        ] {
            for params in [
                "'', '', 51",
                "'f-0123', '', 51",
                "'f-019950', 'f-019950', 51",
                "'f-019990', 'f-019990', 51",
            ] {
                assert_indexed(&plan(schema, sql, &format!("{params}{more}")));
            }
        }
        assert_indexed(&plan(&p, FLOW_OUTBOX_SQL, "'f-012345', 1000"));
        assert_indexed(&plan(&c, INBOX_AT_SQL, "'f-012345', 1, 'default'"));
        assert_indexed(&plan(&c, INBOX_OF_EVENT_SQL, "'f-012345-1', 'default'"));
    }
}
