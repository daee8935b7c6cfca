//! For tests: the plans PostgreSQL makes for ordo's statements on tables
//! of many flows, in schemas of a test's own.

use std::sync::Arc;

use postgres::{Client, NoTls};

use crate::{PgConsumer, PgOptions, PgProducer, Schema};

/// Flows in each table: enough that a sequential scan would be the
/// planner's choice for anything but a keyed read.
pub const FLOWS: i64 = 20_000;

/// A producer and a consumer schema of a test's own in the server's
/// `postgres` database, each table holding [`FLOWS`] flows of one pending
/// event (due to the relay, in flow order); dropped with the value. Every table is analyzed but the apply
/// cursors, left as a table that grew since autovacuum last looked at it
/// (the planner then guesses its rows from its size).
pub struct Filled {
    pub client: Client,
    /// The server's `postgres` database, where both schemas are.
    pub url: String,
    /// The producer's schema.
    pub p: String,
    /// The consumer's schema.
    pub c: String,
}

impl Drop for Filled {
    fn drop(&mut self) {
        for name in [&self.p, &self.c] {
            let _ = self
                .client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"));
        }
    }
}

fn server() -> String {
    std::env::var("ORDO_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
        .trim_end_matches('/')
        .to_string()
}

/// The flow id of number `i` as SQL (`f-000042`), for `generate_series`.
const FLOW: &str = "'f-' || lpad(i::text, 6, '0')";

impl Filled {
    pub fn new(tag: &str) -> Filled {
        let url = format!("{}/postgres", server());
        let tag = format!("ordo_{tag}_{}_{}", std::process::id(), fastrand::u32(..));
        let client = Client::connect(&url, NoTls)
            .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at {url} ({e}); set ORDO_TEST_PG"));
        let mut filled = Filled {
            client,
            url: url.clone(),
            p: format!("{tag}_p"),
            c: format!("{tag}_c"),
        };
        let domain = Schema::new("plans").unwrap();
        let clock = Arc::new(ordo_core::SystemClock);
        let options = |schema: &str| PgOptions {
            schema: Some(schema.to_owned()),
            ..PgOptions::default()
        };
        drop(PgProducer::open_with(&url, &domain, clock.clone(), &options(&filled.p)).unwrap());
        drop(PgConsumer::open_with(&url, &domain, clock, &options(&filled.c)).unwrap());
        let (p, c) = (&filled.p, &filled.c);
        let body = format!(
            "'{{\"event_id\":\"' || {FLOW} || '-1\",\"flow_id\":\"' || {FLOW} || '\",\"seq\":1,\"schema_version\":1,\"type\":\"t\",\"payload\":{{}}}}'"
        );
        filled
            .client
            .batch_execute(&format!(
                "INSERT INTO {p}.outbox_head (flow_id, last_seq)
                     SELECT {FLOW}, 1 FROM generate_series(1, {FLOWS}) i;
                 INSERT INTO {p}.relay_head (flow_id, destination, last_seq, relay_seq, relay_turn)
                     SELECT {FLOW}, 1, 1, 1, i FROM generate_series(1, {FLOWS}) i;
                 INSERT INTO {p}.outbox (event_id, flow_id, seq, schema_version, type, body, created_at_ms)
                     SELECT {FLOW} || '-1', {FLOW}, 1, 1, 't', {body}, 0
                     FROM generate_series(1, {FLOWS}) i;
                 INSERT INTO {c}.inbox_cursor (flow_id, producer, applied_seq)
                     SELECT {FLOW}, 'default', i % 2 FROM generate_series(1, {FLOWS}) i;
                 INSERT INTO {c}.inbox (event_id, producer, flow_id, seq, schema_version, type, body, body_hash, status, received_at_ms)
                     SELECT {FLOW} || '-1', 'default', {FLOW}, 1, 1, 't', {body}, '', 'pending', 0
                     FROM generate_series(1, {FLOWS}) i;
                 UPDATE {p}.outbox SET destinations_waiting = 1;
                 INSERT INTO {p}.custody (position, destination) SELECT position, 1 FROM {p}.outbox;
                 INSERT INTO {p}.custody_pending (destination, position)
                     SELECT 1, position FROM {p}.outbox;
                 ANALYZE {p}.outbox_head; ANALYZE {p}.outbox; ANALYZE {p}.relay_head;
                 ANALYZE {p}.custody; ANALYZE {p}.custody_pending;
                 ANALYZE {c}.inbox;"
            ))
            .expect("fill the tables");
        filled
    }

    /// The plan of `sql` (`{s}` being `schema`), prepared with the
    /// parameter `types` and run with `params` (SQL literals), as text.
    pub fn plan(&mut self, schema: &str, sql: &str, types: &str, params: &str) -> String {
        let sql = sql.replace("{s}", schema);
        let name = format!("q{}", fastrand::u32(..));
        self.client
            .batch_execute(&format!("PREPARE {name} ({types}) AS {sql}"))
            .expect("prepare");
        let rows = self
            .client
            .query(&format!("EXPLAIN EXECUTE {name}({params})"), &[])
            .expect("explain");
        self.client
            .batch_execute(&format!("DEALLOCATE {name}"))
            .expect("deallocate");
        rows.iter()
            .map(|row| row.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// An SQL array of the ids of `n` flows spread over the table, each
/// followed by `suffix` (`-1` makes them the ids of their first events).
fn flow_array(n: i64, suffix: &str) -> String {
    let ids: Vec<String> = (0..n)
        .map(|k| format!("'f-{:06}{suffix}'", 1 + k * (FLOWS / n)))
        .collect();
    format!("ARRAY[{}]", ids.join(","))
}

#[track_caller]
pub fn assert_indexed(plan: &str) {
    assert!(
        plan.contains("Index Scan") || plan.contains("Index Only Scan"),
        "no index scan:\n{plan}"
    );
    assert!(!plan.contains("Seq Scan"), "a sequential scan:\n{plan}");
}

/// Which of a [`Filled`] pair's schemas a statement runs in.
#[derive(Clone, Copy)]
pub enum Side {
    Producer,
    Consumer,
}

/// Asserts that `sql`, on `side` of fresh [`Filled`] schemas, is planned
/// as index scans for arrays of 1, 16 and 256 flows: `params` makes the
/// statement's parameters (of `types`) from the array of ids, each with
/// `suffix`.
#[track_caller]
pub fn assert_indexed_by_batch(
    side: Side,
    sql: &str,
    types: &str,
    suffix: &str,
    params: impl Fn(String) -> String,
) {
    for plan in plans_by_batch(side, sql, types, suffix, params) {
        assert_indexed(&plan);
    }
}

/// The plans of `sql` for arrays of 1, 16 and 256 flows (see
/// [`assert_indexed_by_batch`]).
pub fn plans_by_batch(
    side: Side,
    sql: &str,
    types: &str,
    suffix: &str,
    params: impl Fn(String) -> String,
) -> Vec<String> {
    let mut filled = Filled::new("batch");
    let schema = match side {
        Side::Producer => filled.p.clone(),
        Side::Consumer => filled.c.clone(),
    };
    [1, 16, 256]
        .into_iter()
        .map(|n| filled.plan(&schema, sql, types, &params(flow_array(n, suffix))))
        .collect()
}
