//! S_pg: the server's rate for the rows the protocol keeps per event, and
//! nothing else. The ceiling that the bench's end-to-end rate is compared
//! with, beside F_pg (which measures the disk's flushes, not the work).
//!
//! Per event, in batches of flows: the producer's application row, the
//! outbox row (with its `accepted` mark and its entry among the events not
//! yet accepted), the flow's head (its last seq, and its place among the
//! due flows); the consumer's inbox row (with its status and its entry
//! among the pending events), its apply cursor and the handler's
//! projection. Four transactions per batch: append, receive, accept,
//! apply, each one statement over the batch's flows, each flow's rows by
//! key; every client owns its flows.
//!
//! Invariant: nothing here is ordo's code. There are no leases, fences,
//! dedup checks, conflict detection, blocked events, handler calls or
//! round trips per flow, and the flows' rows exist before the clock
//! starts: what ordo does beyond the protocol's rows is the gap between
//! S_pg and its end-to-end rate.

use std::sync::Barrier;
use std::time::Instant;

use ordo_core::{Clock, SystemClock};
use ordo_postgres::error::pg_error;
use ordo_postgres::postgres::{Client, Statement};

use crate::figures::{per, per_second};
use crate::pg::{connect, WalPosition};
use crate::{join_all, LabError as Failure, Progress};

/// The clients of a measurement, each a thread with its own connection
/// and flows: enough to keep the two cores of the machine the bench was
/// made on busy (a larger server needs more to reach its ceiling).
pub const SKELETON_CLIENTS: usize = 4;

/// Events per flow, as in the bench's runs.
const FLOW_EVENTS: u64 = 3;

/// The body of every event: the length of a reservation envelope.
const BODY_LEN: usize = 124;

const CONTEXT: &str = "bench: measuring S_pg";

/// The skeleton's tables (the database's default schema), one row per flow
/// created before the measurement.
const DDL: &str = "
CREATE SEQUENCE relay_turn;
CREATE TABLE app_state (flow_id text COLLATE \"C\" PRIMARY KEY, state text NOT NULL)
    WITH (fillfactor = 50);
CREATE TABLE outbox (
    position       bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id       text    COLLATE \"C\" NOT NULL UNIQUE,
    flow_id        text    COLLATE \"C\" NOT NULL,
    seq            bigint  NOT NULL,
    body           text    NOT NULL,
    accepted       boolean NOT NULL DEFAULT false,
    accepted_at_ms bigint,
    attempts       bigint  NOT NULL DEFAULT 0,
    UNIQUE (flow_id, seq)
) WITH (fillfactor = 50);
CREATE TABLE outbox_pending (position bigint PRIMARY KEY);
CREATE TABLE head (
    flow_id    text   COLLATE \"C\" PRIMARY KEY,
    last_seq   bigint NOT NULL,
    relay_seq  bigint,
    relay_turn bigint NOT NULL DEFAULT 0
) WITH (fillfactor = 50);
CREATE INDEX head_due ON head (relay_turn, flow_id) WHERE relay_seq IS NOT NULL;
CREATE TABLE inbox (
    event_id       text   COLLATE \"C\" PRIMARY KEY,
    flow_id        text   COLLATE \"C\" NOT NULL,
    seq            bigint NOT NULL,
    body           text   NOT NULL,
    status         text   NOT NULL DEFAULT 'pending',
    received_at_ms bigint NOT NULL,
    settled_at_ms  bigint,
    UNIQUE (flow_id, seq)
);
CREATE INDEX inbox_pending ON inbox (flow_id) WHERE status = 'pending';
CREATE TABLE apply_cursor (flow_id text COLLATE \"C\" PRIMARY KEY, applied_seq bigint NOT NULL)
    WITH (fillfactor = 50);
CREATE TABLE projection (flow_id text COLLATE \"C\" PRIMARY KEY, state text NOT NULL)
    WITH (fillfactor = 50);
";

/// The flows `0..$1`, each with its rows on both sides.
const SEED_SQL: &str = "
WITH f AS (SELECT 'flow-' || n AS flow_id FROM generate_series(0, $1::bigint - 1) AS n),
     a AS (INSERT INTO app_state SELECT flow_id, '' FROM f),
     h AS (INSERT INTO head (flow_id, last_seq) SELECT flow_id, 0 FROM f),
     c AS (INSERT INTO apply_cursor SELECT flow_id, 0 FROM f)
INSERT INTO projection SELECT flow_id, '' FROM f";

/// The flows of a batch, by key whatever the planner guesses (the bench's
/// statements name their rows the same way).
macro_rules! batch_flows {
    () => {
        "ARRAY(SELECT unnest($1::text[]))"
    };
}

/// Appends one event to each flow `$1` with the body `$2`: the head's next
/// seq (the flow becomes due if it was not), the application's row, the
/// outbox row and its pending entry. Returns nothing; counts the events.
const APPEND_SQL: &str = concat!(
    "WITH h AS (
         UPDATE head SET last_seq = last_seq + 1,
             relay_seq = coalesce(relay_seq, last_seq + 1),
             relay_turn = CASE WHEN relay_seq IS NULL THEN nextval('relay_turn') ELSE relay_turn END
         WHERE flow_id = ANY (",
    batch_flows!(),
    ") RETURNING flow_id, last_seq),
     a AS (UPDATE app_state SET state = md5(h.flow_id || h.last_seq) FROM h
           WHERE app_state.flow_id = h.flow_id),
     o AS (INSERT INTO outbox (event_id, flow_id, seq, body)
           SELECT flow_id || '/' || last_seq, flow_id, last_seq, $2 FROM h RETURNING position)
     INSERT INTO outbox_pending SELECT position FROM o"
);

/// The consumer stores the due events of the flows `$1`, received at `$2`.
const RECEIVE_SQL: &str = concat!(
    "INSERT INTO inbox (event_id, flow_id, seq, body, received_at_ms)
     SELECT o.event_id, o.flow_id, o.seq, o.body, $2 FROM head h
     JOIN outbox o ON o.flow_id = h.flow_id AND o.seq >= h.relay_seq AND NOT o.accepted
     WHERE h.flow_id = ANY (",
    batch_flows!(),
    ") AND h.relay_seq IS NOT NULL
     ON CONFLICT DO NOTHING"
);

/// The producer marks the due events of the flows `$1` accepted at `$2`,
/// drops their pending entries, and takes the flows out of the due ones.
const ACCEPT_SQL: &str = concat!(
    "WITH m AS (
         UPDATE outbox o SET accepted = true, accepted_at_ms = $2, attempts = o.attempts + 1
         FROM head h
         WHERE h.flow_id = ANY (",
    batch_flows!(),
    ") AND h.relay_seq IS NOT NULL
           AND o.flow_id = h.flow_id AND o.seq >= h.relay_seq AND NOT o.accepted
         RETURNING o.position),
     d AS (DELETE FROM outbox_pending WHERE position = ANY (ARRAY(SELECT position FROM m)))
     UPDATE head SET relay_seq = NULL WHERE flow_id = ANY (",
    batch_flows!(),
    ")"
);

/// The consumer applies the pending events of the flows `$1` at `$2`: the
/// cursors locked, the projections and cursors moved, the events marked.
/// Counts the events applied.
const APPLY_SQL: &str = concat!(
    "WITH c AS (
         SELECT flow_id, applied_seq FROM apply_cursor
         WHERE flow_id = ANY (",
    batch_flows!(),
    ") ORDER BY flow_id FOR UPDATE),
     e AS (SELECT i.flow_id, max(i.seq) AS seq, max(i.body) AS body FROM c
           JOIN inbox i ON i.flow_id = c.flow_id AND i.seq > c.applied_seq
           WHERE i.status = 'pending' GROUP BY i.flow_id),
     u AS (UPDATE apply_cursor SET applied_seq = e.seq FROM e
           WHERE apply_cursor.flow_id = e.flow_id),
     p AS (UPDATE projection SET state = md5(e.body) FROM e
           WHERE projection.flow_id = e.flow_id)
     UPDATE inbox i SET status = 'applied', settled_at_ms = $2 FROM c
     WHERE i.flow_id = c.flow_id AND i.seq > c.applied_seq AND i.status = 'pending'"
);

/// What one measurement of S_pg found.
#[derive(Debug, Clone, PartialEq)]
pub struct SkeletonRun {
    /// Clients at once.
    pub clients: usize,
    /// Events appended, received, accepted and applied.
    pub events: u64,
    /// From the start until every client had applied its last batch.
    pub seconds: f64,
    /// Bytes of WAL the server wrote meanwhile.
    pub wal_bytes: u64,
}

impl SkeletonRun {
    /// S_pg: events per second through the four transactions.
    pub fn events_per_s(&self) -> f64 {
        per_second(self.events, self.seconds)
    }

    /// Bytes of WAL per event.
    pub fn wal_bytes_per_event(&self) -> f64 {
        per(self.wal_bytes, self.events)
    }
}

/// Measures S_pg on the empty database of `url`: `flows` flows of three
/// events each, `batch` flows per transaction, [`SKELETON_CLIENTS`] clients;
/// then checks that every event went through every step once.
pub fn measure(
    url: &str,
    flows: u64,
    batch: u64,
    progress: &dyn Progress,
) -> Result<SkeletonRun, Failure> {
    if flows == 0 || batch == 0 {
        return Err(Failure::Usage(format!(
            "S_pg: {flows} flows in batches of {batch}: at least 1 each"
        )));
    }
    let events = flows * FLOW_EVENTS;
    progress.start(
        "measuring S_pg (the protocol's rows per event only)",
        events,
    );
    seed(url, flows)?;
    let mut wal = WalPosition::connect(url)?;
    let clients = shares(flows, SKELETON_CLIENTS as u64);
    let start = Barrier::new(clients.len() + 1);
    let (began, wal_start, results) = std::thread::scope(|scope| {
        let start = &start;
        let handles: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(i, range)| {
                let range = range.clone();
                scope.spawn(move || client(url, i, range, batch, start, progress))
            })
            .collect();
        let wal_start = wal.read();
        start.wait();
        let began = Instant::now();
        let results = join_all(handles, "a skeleton client");
        (began, wal_start, results)
    });
    let seconds = began.elapsed().as_secs_f64();
    progress.finish();
    let counted = results.into_iter().sum::<Result<u64, Failure>>()?;
    let wal_bytes = wal.bytes_since(&wal_start?)?;
    if counted != events {
        return Err(Failure::Check(format!(
            "bench: S_pg: the clients applied {counted} of {events} events"
        )));
    }
    verify(url, events)?;
    Ok(SkeletonRun {
        clients: clients.len(),
        events,
        seconds,
        wal_bytes,
    })
}

/// The skeleton's tables on the database of `url`, with the rows of
/// `flows` flows, vacuumed and analyzed.
fn seed(url: &str, flows: u64) -> Result<(), Failure> {
    let mut setup = connect(url, "ordo-bench-skeleton")?;
    let flows = i64::try_from(flows).unwrap_or(i64::MAX);
    setup
        .batch_execute(DDL)
        .and_then(|()| setup.execute(SEED_SQL, &[&flows]).map(drop))
        .and_then(|()| setup.batch_execute("VACUUM ANALYZE"))
        .map_err(|e| pg_error(CONTEXT, e).into())
}

/// `0..total` in up to `parts` consecutive ranges, none empty.
fn shares(total: u64, parts: u64) -> Vec<std::ops::Range<u64>> {
    let share = total.div_ceil(parts.max(1));
    (0..parts)
        .map(|i| (i * share).min(total)..((i + 1) * share).min(total))
        .filter(|range| !range.is_empty())
        .collect()
}

/// The four statements of a client, prepared on its connection.
struct Steps {
    append: Statement,
    receive: Statement,
    accept: Statement,
    apply: Statement,
}

/// One client: every event of its `flows`, `batch` flows per transaction;
/// returns the events it applied. A connection that cannot be opened
/// still meets the others at the start (they would wait for it forever).
fn client(
    url: &str,
    i: usize,
    flows: std::ops::Range<u64>,
    batch: u64,
    start: &Barrier,
    progress: &dyn Progress,
) -> Result<u64, Failure> {
    let opened = connect(url, &format!("ordo-bench-skeleton-{i}")).and_then(|mut client| {
        let steps = prepare(&mut client)?;
        Ok((client, steps))
    });
    start.wait();
    let (mut client, steps) = opened?;
    let names: Vec<String> = flows.map(|n| format!("flow-{n}")).collect();
    let body = "x".repeat(BODY_LEN);
    let mut applied = 0u64;
    for _ in 0..FLOW_EVENTS {
        for chunk in names.chunks(usize::try_from(batch).unwrap_or(usize::MAX)) {
            let chunk = chunk.to_vec();
            let now_ms = SystemClock.now_ms();
            let done = [
                step(&mut client, &steps.append, &[&chunk, &body])?,
                step(&mut client, &steps.receive, &[&chunk, &now_ms])?,
                step(&mut client, &steps.accept, &[&chunk, &now_ms])?,
                step(&mut client, &steps.apply, &[&chunk, &now_ms])?,
            ];
            let expected = chunk.len() as u64;
            if done != [expected; 4] {
                return Err(Failure::Check(format!(
                    "bench: S_pg: a batch of {expected} flows appended, received, took out of \
                     the due flows and applied {done:?} rows"
                )));
            }
            applied += expected;
            progress.inc(expected);
        }
    }
    Ok(applied)
}

/// The client's statements, each commit waiting for the WAL flush.
fn prepare(client: &mut Client) -> Result<Steps, Failure> {
    client
        .batch_execute("SET synchronous_commit = on")
        .map_err(|e| pg_error(CONTEXT, e))?;
    let mut prepare = |sql: &str| client.prepare(sql).map_err(|e| pg_error(CONTEXT, e));
    Ok(Steps {
        append: prepare(APPEND_SQL)?,
        receive: prepare(RECEIVE_SQL)?,
        accept: prepare(ACCEPT_SQL)?,
        apply: prepare(APPLY_SQL)?,
    })
}

/// One statement in a transaction of its own, waiting for the WAL flush;
/// the rows it wrote (its main statement's).
fn step(
    client: &mut Client,
    statement: &Statement,
    params: &[&(dyn ordo_postgres::postgres::types::ToSql + Sync)],
) -> Result<u64, Failure> {
    client
        .execute(statement, params)
        .map_err(|e| pg_error(CONTEXT, e).into())
}

/// Checks the skeleton's tables on the database of `url` after a
/// measurement of `events` events: every one accepted, none left pending,
/// every one applied, the cursors past all of them and no flow still due.
pub fn verify(url: &str, events: u64) -> Result<(), Failure> {
    let mut client = connect(url, "ordo-bench-skeleton-check")?;
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM outbox WHERE accepted),
                    (SELECT count(*) FROM outbox_pending),
                    (SELECT count(*) FROM inbox WHERE status = 'applied'),
                    (SELECT coalesce(sum(applied_seq), 0)::bigint FROM apply_cursor),
                    (SELECT count(*) FROM head WHERE relay_seq IS NOT NULL)",
            &[],
        )
        .map_err(|e| pg_error(CONTEXT, e))?;
    let found: Vec<i64> = (0..5).map(|i| row.get(i)).collect();
    let n = i64::try_from(events).unwrap_or(i64::MAX);
    if found != [n, 0, n, n, 0] {
        return Err(Failure::Check(format!(
            "bench: S_pg: of {events} events, {} accepted, {} pending, {} applied, \
             cursors at {} in all, {} flows still due",
            found[0], found[1], found[2], found[3], found[4]
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::shares;

    #[test]
    fn the_flows_are_shared_in_ranges_none_empty() {
        assert_eq!(shares(10, 4), vec![0..3, 3..6, 6..9, 9..10]);
        assert_eq!(shares(2, 4), vec![0..1, 1..2]);
        assert_eq!(shares(8, 4), vec![0..2, 2..4, 4..6, 6..8]);
    }
}
