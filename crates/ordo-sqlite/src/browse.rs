//! The producer's reads for browsing (the operator console): flows by id
//! prefix, one flow's outbox rows. Each is an indexed range read, bounded
//! by its limit, however large the outbox. And the whole outbox with its
//! custody, for a snapshot, bounded as every whole read.

use ordo_core::ops::{whole_read, whole_read_limit, OutboxEntry, WHOLE_READ_ROWS_MAX};
use ordo_core::store::sql_limit;
use ordo_core::store::FlowsPage;
use ordo_core::{FlowId, Role, StoreError};
use rusqlite::{params, Connection};

use crate::conn::collect_rows;
use crate::producer::stored_envelope;

/// One page of `outbox_head`: the rows `(flow id, last seq)`.
pub(crate) const PRODUCER_FLOWS_SQL: &str = "SELECT flow_id, last_seq FROM outbox_head
    WHERE flow_id >= ?1 AND flow_id > ?2 ORDER BY flow_id LIMIT ?3";

const FLOW_OUTBOX_SQL: &str = "SELECT position, flow_id, seq, body, created_at_ms, accepted
    FROM outbox WHERE flow = (SELECT flow FROM outbox_head WHERE flow_id = ?1)
    ORDER BY seq LIMIT ?2";

const WHOLE_OUTBOX_SQL: &str = "SELECT position, flow_id, seq, body, created_at_ms, accepted
    FROM outbox ORDER BY position LIMIT ?1";

/// Every outbox row in commit order with each destination's custody of
/// it, read through `conn` (inside [`crate::ProducerDb::read`], as
/// [`crate::read_outbox`]); at most [`WHOLE_READ_ROWS_MAX`] rows.
pub fn read_outbox_entries(conn: &Connection) -> Result<Vec<OutboxEntry>, StoreError> {
    let limit = whole_read_limit(WHOLE_READ_ROWS_MAX);
    let rows = outbox_entries(conn, WHOLE_OUTBOX_SQL, [limit])?;
    whole_read("the outbox", WHOLE_READ_ROWS_MAX, rows)
}

/// The rows `(flow id, number)` of one page that `sql` reads with the
/// page's bounds `(start, after, limit)` (see [`FlowsPage::bounds`]).
pub(crate) fn flows_page(
    conn: &Connection,
    role: Role,
    sql: &str,
    page: FlowsPage<'_>,
) -> Result<Vec<(String, i64)>, StoreError> {
    let (start, after, limit) = page.bounds();
    collect_rows(
        conn,
        &format!("{}: cannot list flows", role.as_str()),
        sql,
        params![start, after, limit],
        |row| row.try_into(),
        Ok,
    )
}

/// The flow's outbox rows in seq order, at most `limit`.
pub(crate) fn flow_outbox_entries(
    conn: &Connection,
    flow_id: &FlowId,
    limit: usize,
) -> Result<Vec<OutboxEntry>, StoreError> {
    outbox_entries(
        conn,
        FLOW_OUTBOX_SQL,
        params![flow_id.as_str(), sql_limit(limit)],
    )
}

/// The outbox rows `sql` reads as `(position, flow_id, seq, body,
/// created_at_ms, accepted)`, each with its destinations' custody.
pub(crate) fn outbox_entries<P: rusqlite::Params>(
    conn: &Connection,
    sql: &str,
    params: P,
) -> Result<Vec<OutboxEntry>, StoreError> {
    type Row = (i64, String, i64, String, i64, bool);
    let rows: Vec<Row> = collect_rows(
        conn,
        "producer: cannot list the outbox",
        sql,
        params,
        |row| row.try_into(),
        Ok,
    )?;
    rows.into_iter()
        .map(|(position, flow, seq, body, created_at_ms, settled)| {
            let custody = crate::custody::custody_of(conn, position, &flow, seq)?;
            let envelope = stored_envelope("producer: stored outbox body", &body)?;
            Ok(OutboxEntry::of_custody(
                envelope,
                created_at_ms,
                settled,
                custody,
            ))
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The plan of `sql` on `conn`, one line per step.
    pub(crate) fn plan(conn: &Connection, sql: &str) -> Vec<String> {
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("the query plans");
        let params = vec!["p"; stmt.parameter_count()];
        let rows = stmt
            .query_map(rusqlite::params_from_iter(params), |row| {
                row.get::<_, String>(3)
            })
            .expect("the plan reads");
        rows.map(|r| r.expect("a plan step")).collect()
    }

    /// Asserts that no step of `sql` scans one of `tables` whole.
    #[track_caller]
    pub(crate) fn assert_indexed(conn: &Connection, sql: &str, tables: &[&str]) {
        let plan = plan(conn, sql);
        for step in &plan {
            for table in tables {
                let scan = format!("SCAN {table}");
                assert!(
                    !(step == &scan || step.starts_with(&format!("{scan} "))),
                    "{sql} scans {table}: {plan:?}"
                );
            }
        }
    }

    /// A new, empty producer store (`producer`) or consumer store in a
    /// directory of its own, kept as long as the directory.
    pub(crate) fn new_store(producer: bool) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let (schema, clock, options) = (
            crate::Schema::new("browse").unwrap(),
            std::sync::Arc::new(ordo_core::SystemClock),
            crate::OpenOptions::default(),
        );
        if producer {
            crate::ProducerDb::open_or_create(&path, &schema, clock, &options).map(drop)
        } else {
            crate::ConsumerDb::open_or_create(&path, &schema, clock, &options).map(drop)
        }
        .unwrap();
        (dir, path)
    }

    #[test]
    fn flow_reads_are_indexed() {
        let (_dir, path) = new_store(true);
        let conn = Connection::open(&path).unwrap();
        assert_indexed(&conn, PRODUCER_FLOWS_SQL, &["outbox_head", "outbox"]);
        assert_indexed(&conn, FLOW_OUTBOX_SQL, &["outbox_head", "outbox"]);
    }

    /// A new producer store (`producer`) or consumer store holding flows
    /// `f-000001` to `f-020000` (as outbox heads or apply cursors at 1).
    fn store_of_many_flows(producer: bool) -> (tempfile::TempDir, std::path::PathBuf) {
        let (dir, path) = new_store(producer);
        let (table, column, value) = if producer {
            ("outbox_head", "last_seq", "1")
        } else {
            ("inbox_cursor", "producer, applied_seq", "'default', 1")
        };
        Connection::open(&path)
            .unwrap()
            .execute_batch(&format!(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)
                 INSERT INTO {table} (flow_id, {column}) SELECT printf('f-%06d', i), {value} FROM n"
            ))
            .unwrap();
        (dir, path)
    }

    /// Asserts that a page deep in 20,000 flows of a producer store
    /// (`producer`) or a consumer store, with or without a prefix, runs
    /// about as many steps of `sql` as the first page: its range starts at
    /// `after`, not at the prefix. `read` reads a page of 10 (`prefix`,
    /// `after`) through `sql` on a new connection.
    #[track_caller]
    pub(crate) fn assert_deep_pages_are_short(
        role: Role,
        sql: &str,
        read: impl Fn(&Connection, FlowsPage<'_>) -> usize,
    ) {
        let (_dir, path) = store_of_many_flows(role == Role::Producer);
        let steps = |prefix: &str, after: &str| {
            let conn = Connection::open(&path).unwrap();
            let after = FlowId::new(after).unwrap();
            let page = FlowsPage {
                prefix,
                after: Some(&after),
                after_producer: "",
                limit: 10,
            };
            let listed = read(&conn, page);
            assert!(listed > 0, "{prefix:?} after {after}");
            let stmt = conn.prepare_cached(sql).expect("the statement is cached");
            stmt.get_status(rusqlite::StatementStatus::VmStep)
        };
        let first = steps("", "f-000001");
        for (prefix, after) in [
            ("", "f-019900"),
            ("f-01", "f-019900"),
            ("f-0199", "f-019900"),
        ] {
            let deep = steps(prefix, after);
            assert!(
                deep < first * 2,
                "{prefix:?} after {after}: {deep} steps, the first page {first}"
            );
        }
    }

    #[test]
    fn a_deep_page_reads_only_its_own_rows() {
        let read = |conn: &Connection, page: FlowsPage<'_>| {
            let rows = flows_page(conn, Role::Producer, PRODUCER_FLOWS_SQL, page);
            rows.unwrap().len()
        };
        assert_deep_pages_are_short(Role::Producer, PRODUCER_FLOWS_SQL, read);
    }
}
