//! The inbox's own guards on a real server (see `ordo_testkit::guards`): a
//! handler that settles its own row, or moves its flow's cursor past it,
//! makes the apply fail as a corrupt store, and nothing is written.

mod support;

use std::sync::Arc;

use ordo_core::{ApplyContext, Envelope, StoreError, SystemClock, Verdict};
use ordo_postgres::{Params, PgConsumer, PgTx};
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

/// A handler's damage: runs `sql` (`{schema}` standing for the store's
/// ordo schema) under the apply, then applies.
fn under_apply(tx: &PgTx, sql: &str, params: Params<'_>) -> Result<Verdict, StoreError> {
    tx.execute(&sql.replace("{schema}", tx.ordo_schema()), params)?;
    Ok(Verdict::Apply)
}

#[test]
fn a_row_settled_under_its_apply_is_not_marked_applied_over() {
    run(|tx, e| {
        under_apply(
            tx,
            "UPDATE {schema}.inbox SET status = 'skipped', settled_at_ms = 0 WHERE flow_id = $1 AND seq = $2",
            &[&e.flow_id.as_str(), &e.seq.get()],
        )
    });
}

#[test]
fn a_cursor_moved_past_under_an_apply_is_not_moved_back() {
    run(|tx, _| {
        under_apply(
            tx,
            "UPDATE {schema}.inbox_cursor SET applied_seq = 5 WHERE flow_id = 'f'",
            &[],
        )
    });
}
