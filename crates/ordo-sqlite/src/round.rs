//! A fair round's events on an SQLite producer: for one destination, each
//! due flow's relay head, the flows served least recently first; with a
//! deeper round, also the events after each head that the destination
//! still waits for, in seq order.
//!
//! Invariant: a read only. The round's bookkeeping (the receipts' marks,
//! the heads moved on, the turn) is `record_receipts`', which moves a head
//! to its flow's lowest seq still waited for however many of the flow's
//! events a round carried.

use std::collections::BTreeSet;

use ordo_core::store::sql_limit;
use ordo_core::{Envelope, FlowId, StoreError};
use rusqlite::{Connection, ToSql};

use crate::conn::collect_rows;
use crate::producer::stored_envelope;

/// The most events of one flow a round may take: the relay's own bound on
/// `flow_events_max`.
pub(crate) const FLOW_EVENTS_MAX: usize = 1_024;

/// The heads alone. `?1` now, `?2` the round's limit, `?3` the destination.
const HEADS_SQL: &str = "SELECT o.body FROM relay_head h
     JOIN outbox o ON o.flow = h.flow AND o.seq = h.relay_seq
     WHERE h.destination = ?3 AND h.relay_seq IS NOT NULL AND h.relay_due_ms <= ?1
     ORDER BY h.relay_turn, h.flow
     LIMIT ?2";

/// The heads alone, none of the flows of the JSON list `?4`. Kept apart
/// from [`HEADS_SQL`]: SQLite builds the list into a temporary table even
/// when it is empty.
const HEADS_SKIPPING_SQL: &str = "SELECT o.body FROM relay_head h
     JOIN outbox o ON o.flow = h.flow AND o.seq = h.relay_seq
     WHERE h.destination = ?3 AND h.relay_seq IS NOT NULL AND h.relay_due_ms <= ?1
       AND o.flow_id NOT IN (SELECT value FROM json_each(?4))
     ORDER BY h.relay_turn, h.flow
     LIMIT ?2";

/// Each head and the events after it within `?4` seqs that the destination
/// holds no mark of (neither accepted, quarantined nor abandoned there),
/// before the flow's rewind stop, in seq order; `?2` events in all.
///
/// `CROSS JOIN` keeps SQLite's join order: the heads in turn order from
/// `relay_head_turn`, then each flow's few events from the outbox's
/// `(flow, seq)` index, then their custody, so the round stops at its
/// limit. Left to choose, SQLite started from every unaccepted custody row
/// of the destination and sorted them all, a walk as long as the backlog.
macro_rules! deep_sql {
    ($skipping:literal) => {
        concat!(
            "SELECT o.body FROM relay_head h
             CROSS JOIN outbox o ON o.flow = h.flow
                          AND o.seq >= h.relay_seq AND o.seq < h.relay_seq + ?4
             CROSS JOIN custody c ON c.position = o.position AND c.destination = h.destination
             WHERE h.destination = ?3 AND h.relay_seq IS NOT NULL AND h.relay_due_ms <= ?1
               AND o.seq < coalesce(h.relay_stop_seq, 9223372036854775807)
               AND c.accepted = 0 AND c.quarantined = 0 AND c.abandoned = 0",
            $skipping,
            "
             ORDER BY h.relay_turn, h.flow, o.seq
             LIMIT ?2"
        )
    };
}

const DEEP_SQL: &str = deep_sql!("");
/// As [`DEEP_SQL`], none of the flows of the JSON list `?5`.
const DEEP_SKIPPING_SQL: &str = deep_sql!(
    "
               AND o.flow_id NOT IN (SELECT value FROM json_each(?5))"
);

/// Up to `limit` events of one fair round for `destination`: each due
/// flow's head and, when `flow_events_max` is above 1, up to that many of
/// the flow's events from its head (fewer where the destination already
/// holds some of them), none of the `skip` flows.
pub(crate) fn fair_round(
    conn: &Connection,
    destination: i64,
    (limit, flow_events_max): (usize, usize),
    skip: &BTreeSet<FlowId>,
    now_ms: i64,
) -> Result<Vec<Envelope>, StoreError> {
    debug_assert!(flow_events_max <= FLOW_EVENTS_MAX, "{flow_events_max}");
    let limit = sql_limit(limit);
    let depth = i64::try_from(flow_events_max.clamp(1, FLOW_EVENTS_MAX)).expect("bounded");
    let skip_json = (!skip.is_empty()).then(|| {
        serde_json::to_string(&skip.iter().map(FlowId::as_str).collect::<Vec<_>>())
            .expect("a list of strings serializes")
    });
    // The parameters in the order each statement numbers them.
    let mut values: Vec<&dyn ToSql> = vec![&now_ms, &limit, &destination];
    let sql = match (depth > 1, &skip_json) {
        (false, None) => HEADS_SQL,
        (false, Some(skip)) => {
            values.push(skip);
            HEADS_SKIPPING_SQL
        }
        (true, None) => {
            values.push(&depth);
            DEEP_SQL
        }
        (true, Some(skip)) => {
            values.extend([&depth as &dyn ToSql, skip]);
            DEEP_SKIPPING_SQL
        }
    };
    collect_rows(
        conn,
        "producer: cannot pick a fair round",
        sql,
        values.as_slice(),
        // Each body parsed where SQLite holds it, without a String first.
        |row| {
            let text = row.get_ref(0)?.as_str()?;
            Ok(stored_envelope("producer: stored outbox body", text))
        },
        |parsed| parsed,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ProducerDb, Schema};

    /// The plan of `sql` on a new producer file, one step per line.
    fn plan(sql: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let schema = Schema::new("plans").unwrap();
        let db = ProducerDb::open(dir.path().join("producer.db"), &schema).unwrap();
        let mut statement = db
            .connection()
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap();
        // Unbound parameters are NULL: the plan does not depend on them.
        let mut rows = statement.raw_query();
        let mut steps = Vec::new();
        while let Some(row) = rows.next().unwrap() {
            steps.push(row.get::<_, String>(3).unwrap());
        }
        steps.join("\n")
    }

    /// Every round starts from the heads in turn order and reaches each
    /// flow's events by key: none walks the destination's backlog.
    #[test]
    fn rounds_start_from_the_heads_and_walk_no_backlog() {
        for sql in [HEADS_SQL, HEADS_SKIPPING_SQL, DEEP_SQL, DEEP_SKIPPING_SQL] {
            let plan = plan(sql);
            let first = plan.lines().next().unwrap();
            assert!(
                first.starts_with("SEARCH h USING INDEX relay_head_turn"),
                "{plan}"
            );
            assert!(!plan.contains("custody_unaccepted"), "{plan}");
            assert!(
                !plan.contains("SCAN o") && !plan.contains("SCAN c"),
                "{plan}"
            );
        }
    }
}
