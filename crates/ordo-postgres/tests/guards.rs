//! The inbox's own guards on a real server (see `ordo_testkit::guards`): a
//! handler that settles its own row, or moves its flow's cursor past it,
//! makes the apply fail as a corrupt store, and nothing is written.

mod support;

use std::sync::Arc;

use ordo_core::{ApplyContext, Envelope, StoreError, SystemClock, Verdict};
use ordo_postgres::{PgConsumer, PgTx};
use ordo_testkit::guards::damage_under_apply_is_refused;
use support::{admin_client, fresh_database, test_options, test_schema};

fn run(damage: impl FnMut(&mut ApplyContext<PgTx>, &Envelope) -> Result<Verdict, StoreError>) {
    let (_dir, target) = fresh_database();
    let options = test_options();
    let mut inbox =
        PgConsumer::open_with(&target, &test_schema(), Arc::new(SystemClock), &options).unwrap();
    let schema = options.schema.unwrap();
    let cursor = || {
        let sql = format!("SELECT applied_seq FROM {schema}.inbox_cursor WHERE flow_id = 'f'");
        let row = admin_client(&target).query_opt(&sql, &[]).unwrap();
        row.map(|row| row.get(0))
    };
    damage_under_apply_is_refused(&mut inbox, damage, cursor);
}

#[test]
fn a_row_settled_under_its_apply_is_not_marked_applied_over() {
    run(|tx, e| {
        let sql = format!(
            "UPDATE {}.inbox SET status = 'skipped', settled_at_ms = 0 WHERE flow_id = $1 AND seq = $2",
            tx.ordo_schema()
        );
        tx.execute(&sql, &[&e.flow_id.as_str(), &e.seq.get()])?;
        Ok(Verdict::Apply)
    });
}

#[test]
fn a_cursor_moved_past_under_an_apply_is_not_moved_back() {
    run(|tx, _| {
        let sql = format!(
            "UPDATE {}.inbox_cursor SET applied_seq = 5 WHERE flow_id = 'f'",
            tx.ordo_schema()
        );
        tx.execute(&sql, &[])?;
        Ok(Verdict::Apply)
    });
}
