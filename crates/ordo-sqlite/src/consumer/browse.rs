//! The consumer's reads for browsing (the operator console): flows by id
//! prefix, one inbox row (by flow and seq, or by event id). Each is an
//! indexed range read, bounded by its limit, however large the inbox.

use ordo_core::ops::InboxEntry;
use ordo_core::{EventId, FlowId, Seq, StoreError};
use rusqlite::{params, Connection, OptionalExtension, ToSql};

use super::schema::{self, entry_row};
pub(super) use crate::browse::flows_page;
use crate::conn::sql_error;

/// Up to `limit` flows with stored rows or an apply cursor whose id starts
/// with `prefix`, after `after`: two range reads on the `(flow_id, seq)`
/// and cursor keys, merged. Rows past the prefix end the list.
pub(super) const CONSUMER_FLOWS_SQL: &str = "SELECT f.flow_id, coalesce(c.applied_seq, 0) FROM (
    SELECT flow_id FROM (SELECT DISTINCT flow_id FROM inbox
        WHERE flow_id >= ?1 AND flow_id > ?2 ORDER BY flow_id LIMIT ?3)
    UNION
    SELECT flow_id FROM (SELECT flow_id FROM inbox_cursor
        WHERE flow_id >= ?1 AND flow_id > ?2 ORDER BY flow_id LIMIT ?3)
    ) AS f LEFT JOIN inbox_cursor AS c ON c.flow_id = f.flow_id
    ORDER BY f.flow_id LIMIT ?3";

const ENTRY_AT_SQL: &str =
    "SELECT body, status, reason, received_at_ms, settled_at_ms, detail, store_id FROM inbox
        WHERE flow_id = ?1 AND seq = ?2";

/// One inbox row on the unique `event_id` key.
const ENTRY_OF_EVENT_SQL: &str =
    "SELECT body, status, reason, received_at_ms, settled_at_ms, detail, store_id FROM inbox
        WHERE event_id = ?1";

/// The inbox row at `(flow_id, seq)`, if stored.
pub(super) fn inbox_entry_at(
    conn: &Connection,
    flow_id: &FlowId,
    seq: Seq,
) -> Result<Option<InboxEntry>, StoreError> {
    inbox_entry(conn, ENTRY_AT_SQL, params![flow_id.as_str(), seq.get()])
}

/// The inbox row stored under `event_id`, if any (a pruned row is gone).
pub(super) fn inbox_entry_of_event(
    conn: &Connection,
    event_id: &EventId,
) -> Result<Option<InboxEntry>, StoreError> {
    inbox_entry(conn, ENTRY_OF_EVENT_SQL, params![event_id.as_str()])
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
        assert_deep_pages_are_short(ordo_core::Role::Consumer, CONSUMER_FLOWS_SQL);
    }
}
