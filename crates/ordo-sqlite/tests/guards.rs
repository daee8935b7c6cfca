//! The inbox's own guards on a real file (see `ordo_testkit::guards`): a
//! handler that settles its own row, or moves its flow's cursor past it,
//! makes the apply fail as a corrupt store, and nothing is written.

use ordo_core::{ApplyContext, Envelope, StoreError, Verdict};
use ordo_sqlite::rusqlite::{params, Connection};
use ordo_sqlite::{ConsumerDb, Schema};
use ordo_testkit::guards::damage_under_apply_is_refused;

fn run(
    damage: impl FnMut(&mut ApplyContext<Connection>, &Envelope) -> Result<Verdict, StoreError>,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("consumer.db");
    let mut inbox = ConsumerDb::open(&path, &Schema::new("guards").unwrap()).unwrap();
    let cursor = || {
        let conn = Connection::open(&path).unwrap();
        let sql = "SELECT applied_seq FROM inbox_cursor WHERE flow_id = 'f'";
        conn.query_row(sql, [], |row| row.get(0)).ok()
    };
    damage_under_apply_is_refused(&mut inbox, damage, cursor);
}

#[test]
fn a_row_settled_under_its_apply_is_not_marked_applied_over() {
    run(|tx, e| {
        tx.execute(
            "UPDATE inbox SET status = 'skipped', settled_at_ms = 0 WHERE flow_id = ?1 AND seq = ?2",
            params![e.flow_id.as_str(), e.seq.get()],
        )?;
        Ok(Verdict::Apply)
    });
}

#[test]
fn a_cursor_moved_past_under_an_apply_is_not_moved_back() {
    run(|tx, _| {
        tx.execute(
            "INSERT INTO inbox_cursor (flow_id, producer, applied_seq) VALUES ('f', 'default', 5)
             ON CONFLICT (flow_id, producer) DO UPDATE SET applied_seq = 5",
            [],
        )?;
        Ok(Verdict::Apply)
    });
}
