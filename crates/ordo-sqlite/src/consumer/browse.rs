//! The consumer's reads for browsing (the operator console): flows by id
//! prefix, one inbox row (by flow and seq, or by event id). Each is an
//! indexed range read, bounded by its limit, however large the inbox.

use ordo_core::ops::InboxEntry;
use ordo_core::store::FlowsPage;
use ordo_core::{EventId, InboxFlow, ProducerName, Seq, StoreError};
use rusqlite::{params, Connection, OptionalExtension, ToSql};

use super::schema::{self, entry_row};
use crate::conn::{collect_rows, sql_error};

/// Up to `limit` flows with stored rows or an apply cursor whose id starts
/// with `prefix` (?1), after `(after, after_producer)` (?2, ?4): two range
/// reads on the `(flow_id, producer, seq)` and cursor keys, merged. Rows
/// past the prefix end the list.
pub(super) const CONSUMER_FLOWS_SQL: &str =
    "SELECT f.flow_id, f.producer, coalesce(c.applied_seq, 0) FROM (
    SELECT flow_id, producer FROM (SELECT DISTINCT flow_id, producer FROM inbox
        WHERE flow_id >= ?1 AND (flow_id, producer) > (?2, ?4)
        ORDER BY flow_id, producer LIMIT ?3)
    UNION
    SELECT flow_id, producer FROM (SELECT flow_id, producer FROM inbox_cursor
        WHERE flow_id >= ?1 AND (flow_id, producer) > (?2, ?4)
        ORDER BY flow_id, producer LIMIT ?3)
    ) AS f LEFT JOIN inbox_cursor AS c ON c.flow_id = f.flow_id AND c.producer = f.producer
    ORDER BY f.flow_id, f.producer LIMIT ?3";

const ENTRY_AT_SQL: &str =
    "SELECT body, status, reason, received_at_ms, settled_at_ms, detail, store_id FROM inbox
        WHERE flow_id = ?1 AND producer = ?3 AND seq = ?2";

/// One inbox row on the unique `(producer, event_id)` key.
const ENTRY_OF_EVENT_SQL: &str =
    "SELECT body, status, reason, received_at_ms, settled_at_ms, detail, store_id FROM inbox
        WHERE producer = ?2 AND event_id = ?1";

/// The rows `(flow id, producer, applied seq)` of one page of flows.
pub(super) fn consumer_flows_page(
    conn: &Connection,
    page: FlowsPage<'_>,
) -> Result<Vec<(String, String, i64)>, StoreError> {
    let (start, after, limit) = page.bounds();
    collect_rows(
        conn,
        "consumer: cannot list flows",
        CONSUMER_FLOWS_SQL,
        params![start, after, limit, page.after_producer],
        |row| row.try_into(),
        Ok,
    )
}

/// The inbox row at the flow's `seq`, if stored.
pub(super) fn inbox_entry_at(
    conn: &Connection,
    flow: &InboxFlow,
    seq: Seq,
) -> Result<Option<InboxEntry>, StoreError> {
    let (flow_id, producer) = (flow.flow_id.as_str(), flow.producer.as_str());
    inbox_entry(conn, ENTRY_AT_SQL, params![flow_id, seq.get(), producer])
}

/// The inbox row stored under `producer`'s `event_id`, if any (a pruned
/// row is gone).
pub(super) fn inbox_entry_of_event(
    conn: &Connection,
    producer: &ProducerName,
    event_id: &EventId,
) -> Result<Option<InboxEntry>, StoreError> {
    let params = params![event_id.as_str(), producer.as_str()];
    inbox_entry(conn, ENTRY_OF_EVENT_SQL, params)
}

/// The one inbox row that `sql` reads with `params`, if any.
fn inbox_entry(
    conn: &Connection,
    sql: &str,
    params: &[&dyn ToSql],
) -> Result<Option<InboxEntry>, StoreError> {
    let row = conn
        .prepare_cached(sql)
        .and_then(|mut stmt| stmt.query_row(params, entry_row).optional())
        .map_err(|e| sql_error("consumer: cannot read an inbox row", e))?;
    row.map(schema::inbox_entry).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::browse::tests::{assert_deep_pages_are_short, assert_indexed, new_store};

    #[test]
    fn flow_reads_are_indexed() {
        let (_dir, path) = new_store(false);
        let conn = Connection::open(&path).unwrap();
        let tables = ["inbox", "inbox_cursor"];
        assert_indexed(&conn, CONSUMER_FLOWS_SQL, &tables);
        assert_indexed(&conn, ENTRY_AT_SQL, &tables);
        assert_indexed(&conn, ENTRY_OF_EVENT_SQL, &tables);
        assert_indexed(&conn, super::super::ops::FLOW_ENTRIES_SQL, &tables);
    }

    #[test]
    fn a_deep_page_reads_only_its_own_rows() {
        let read =
            |conn: &Connection, page: FlowsPage<'_>| consumer_flows_page(conn, page).unwrap().len();
        assert_deep_pages_are_short(ordo_core::Role::Consumer, CONSUMER_FLOWS_SQL, read);
    }
}
