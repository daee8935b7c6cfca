//! S_sqlite: the rate of the rows the protocol keeps per event on two
//! SQLite files, and nothing else. The yardstick that the SQLite bench's
//! rates are compared with, beside F (which measures the disk's flushes,
//! not the work); the counterpart of [`crate::skeleton_pg`].
//!
//! Per event, written by hand with plain SQL: on the producer's file the
//! application's row, the flow's head (its last seq, and its place among
//! the due flows), the outbox row and its pending entry for the one
//! destination, then the accepted mark (the outbox row marked, the pending
//! entry dropped, the head no longer due); on the consumer's file the
//! inbox row, then the apply: the cursor moved, the handler's row written
//! and the inbox row's status set. Text keys and the indexes S_pg uses.
//!
//! The shape is the bench's pipelined run: one thread per file, `batch`
//! flows per transaction in the bench's order (every flow's first event,
//! then every flow's second, ...), up to [`ROUNDS_IN_FLIGHT`] rounds handed
//! to the consumer's thread while the producer's goes on appending. Both
//! files are WAL with `synchronous=FULL`; the accepted mark commits without
//! waiting for the disk, as the protocol allows (a lost mark only means the
//! event is delivered again).
//!
//! Invariant: this is the yardstick, fixed before ordo's format changes;
//! it must not follow the implementation. Nothing here is ordo's code:
//! there are no leases, fences, dedup reads, hashing, conflict checks or
//! handler, and the flows' rows exist before the clock starts. What ordo
//! does beyond these rows is the gap between S_sqlite and its rates.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::mpsc;
use std::time::Instant;

use ordo_core::{Clock, SystemClock};
use ordo_sqlite::rusqlite::{params, Connection};

use crate::figures::{per, per_second};
use crate::{LabError as Failure, Progress};

/// Events per flow, as in the bench's runs.
const FLOW_EVENTS: u64 = 3;

/// The body of every event: the length of a reservation envelope.
const BODY_LEN: usize = 124;

/// Rounds handed to the consumer's thread and not yet answered, at most.
pub const ROUNDS_IN_FLIGHT: usize = 2;

const CONTEXT: &str = "bench: S_sqlite";

/// The producer's file.
const PRODUCER_DDL: &str = "
CREATE TABLE app_state (flow_id TEXT PRIMARY KEY, state TEXT NOT NULL);
CREATE TABLE head (
    flow_id    TEXT    PRIMARY KEY,
    last_seq   INTEGER NOT NULL,
    relay_seq  INTEGER,
    relay_turn INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX head_due ON head (relay_turn, flow_id) WHERE relay_seq IS NOT NULL;
CREATE TABLE outbox (
    position       INTEGER PRIMARY KEY,
    event_id       TEXT    NOT NULL UNIQUE,
    flow_id        TEXT    NOT NULL,
    seq            INTEGER NOT NULL,
    body           TEXT    NOT NULL,
    accepted       INTEGER NOT NULL DEFAULT 0,
    accepted_at_ms INTEGER,
    attempts       INTEGER NOT NULL DEFAULT 0,
    UNIQUE (flow_id, seq)
);
CREATE TABLE outbox_pending (position INTEGER PRIMARY KEY);
";

/// The consumer's file.
const CONSUMER_DDL: &str = "
CREATE TABLE inbox (
    event_id       TEXT    PRIMARY KEY,
    flow_id        TEXT    NOT NULL,
    seq            INTEGER NOT NULL,
    body           TEXT    NOT NULL,
    status         TEXT    NOT NULL DEFAULT 'pending',
    received_at_ms INTEGER NOT NULL,
    settled_at_ms  INTEGER,
    UNIQUE (flow_id, seq)
);
CREATE INDEX inbox_pending ON inbox (flow_id) WHERE status = 'pending';
CREATE TABLE apply_cursor (flow_id TEXT PRIMARY KEY, applied_seq INTEGER NOT NULL);
CREATE TABLE projection (flow_id TEXT PRIMARY KEY, state TEXT NOT NULL);
";

/// The head's next seq; the flow becomes due (with a new turn) if it was not.
const APPEND_HEAD: &str = "UPDATE head SET last_seq = last_seq + 1,
    relay_seq = coalesce(relay_seq, last_seq + 1),
    relay_turn = CASE WHEN relay_seq IS NULL THEN ?2 ELSE relay_turn END
    WHERE flow_id = ?1 RETURNING last_seq";
const APPEND_APP: &str = "UPDATE app_state SET state = ?2 WHERE flow_id = ?1";
const APPEND_OUTBOX: &str =
    "INSERT INTO outbox (event_id, flow_id, seq, body) VALUES (?1, ?2, ?3, ?4)";
const APPEND_PENDING: &str = "INSERT INTO outbox_pending (position) VALUES (?1)";
/// The relay reads the event it hands over.
const PICK: &str = "SELECT event_id, body FROM outbox WHERE flow_id = ?1 AND seq = ?2";
const ACCEPT_OUTBOX: &str = "UPDATE outbox SET accepted = 1, accepted_at_ms = ?3,
    attempts = attempts + 1 WHERE flow_id = ?1 AND seq = ?2 AND NOT accepted RETURNING position";
const ACCEPT_PENDING: &str = "DELETE FROM outbox_pending WHERE position = ?1";
/// The flow stays due from its next event if it has one.
const ACCEPT_HEAD: &str =
    "UPDATE head SET relay_seq = CASE WHEN last_seq > ?2 THEN ?2 + 1 END WHERE flow_id = ?1";
const RECEIVE: &str = "INSERT INTO inbox (event_id, flow_id, seq, body, received_at_ms)
    VALUES (?1, ?2, ?3, ?4, ?5)";
const APPLY_CURSOR: &str =
    "UPDATE apply_cursor SET applied_seq = ?2 WHERE flow_id = ?1 AND applied_seq = ?2 - 1";
const APPLY_PROJECTION: &str = "UPDATE projection SET state = ?2 WHERE flow_id = ?1";
const APPLY_INBOX: &str = "UPDATE inbox SET status = 'applied', settled_at_ms = ?2
    WHERE event_id = ?1 AND status = 'pending'";

/// Rows written (inserted, updated or deleted) per table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    /// The producer's application rows.
    pub app_state: u64,
    /// The heads: each append and each accepted mark.
    pub head: u64,
    /// The outbox: each insert and each accepted mark.
    pub outbox: u64,
    /// The pending entries: each insert and each delete.
    pub outbox_pending: u64,
    /// The inbox: each insert and each status set.
    pub inbox: u64,
    /// The apply cursors.
    pub apply_cursor: u64,
    /// The handler's rows.
    pub projection: u64,
}

impl Written {
    /// What `events` events write: one application row, two head writes,
    /// two outbox writes, a pending entry inserted and deleted, two inbox
    /// writes, one cursor and one handler's row each.
    pub fn expected(events: u64) -> Written {
        Written {
            app_state: events,
            head: 2 * events,
            outbox: 2 * events,
            outbox_pending: 2 * events,
            inbox: 2 * events,
            apply_cursor: events,
            projection: events,
        }
    }

    /// The rows written, by table name.
    pub fn by_table(&self) -> [(&'static str, u64); 7] {
        [
            ("app_state", self.app_state),
            ("head", self.head),
            ("outbox", self.outbox),
            ("outbox_pending", self.outbox_pending),
            ("inbox", self.inbox),
            ("apply_cursor", self.apply_cursor),
            ("projection", self.projection),
        ]
    }

    fn add(self, o: Written) -> Written {
        Written {
            app_state: self.app_state + o.app_state,
            head: self.head + o.head,
            outbox: self.outbox + o.outbox,
            outbox_pending: self.outbox_pending + o.outbox_pending,
            inbox: self.inbox + o.inbox,
            apply_cursor: self.apply_cursor + o.apply_cursor,
            projection: self.projection + o.projection,
        }
    }
}

/// What one measurement of S_sqlite found.
#[derive(Debug, Clone, PartialEq)]
pub struct SkeletonRun {
    /// Flows per transaction.
    pub batch: u64,
    /// Events appended, received, accepted and applied.
    pub events: u64,
    /// From the first append until the last event was accepted and applied.
    pub seconds: f64,
    /// Commits on both files.
    pub commits: u64,
    /// The commits that waited for the disk (all but the accepted marks).
    pub synced_commits: u64,
    /// The rows written, per table.
    pub written: Written,
}

impl SkeletonRun {
    /// S_sqlite: events per second.
    pub fn events_per_s(&self) -> f64 {
        per_second(self.events, self.seconds)
    }

    /// Commits per event.
    pub fn commits_per_event(&self) -> f64 {
        per(self.commits, self.events)
    }

    /// Commits that waited for the disk, per event.
    pub fn fsyncs_per_event(&self) -> f64 {
        per(self.synced_commits, self.events)
    }
}

fn sql(e: impl std::fmt::Display) -> Failure {
    Failure::Internal(format!("{CONTEXT}: {e}"))
}

/// One event on its way: its flow, seq, id and body.
struct Event {
    flow: String,
    seq: i64,
    event_id: String,
    body: String,
}

/// The flow's key, as the bench names its flows.
fn flow_key(n: u64) -> String {
    format!("b{n:08}")
}

/// Measures S_sqlite on two new files in `dir` (which must not hold
/// them): `flows` flows of three events, `batch` flows per transaction;
/// then checks that every row it claims was written once and that the
/// tables hold what the events left.
pub fn measure(
    dir: &Path,
    flows: u64,
    batch: u64,
    progress: &dyn Progress,
) -> Result<SkeletonRun, Failure> {
    if flows == 0 || batch == 0 {
        return Err(Failure::Usage(format!(
            "S_sqlite: {flows} flows in batches of {batch}: at least 1 each"
        )));
    }
    let events = flows * FLOW_EVENTS;
    let (producer, consumer) = seed(dir, flows)?;
    progress.start(
        "measuring S_sqlite (the protocol's rows per event only)",
        events,
    );
    let (round_tx, round_rx) = mpsc::channel::<Vec<Event>>();
    let (answer_tx, answer_rx) = mpsc::channel::<()>();
    let started = Instant::now();
    let (consumer_side, producer_side) = std::thread::scope(|scope| {
        let consumer_thread =
            scope.spawn(move || consumer_loop(consumer, round_rx, answer_tx, progress));
        let producer_side = producer_loop(&producer, flows, batch, round_tx, answer_rx);
        let consumer_side = consumer_thread
            .join()
            .unwrap_or_else(|_| Err(sql("the consumer's thread panicked")));
        (consumer_side, producer_side)
    });
    let seconds = started.elapsed().as_secs_f64();
    progress.finish();
    // The consumer's own error first: the producer's side only sees it stop.
    let (consumer_written, consumer_commits) = consumer_side?;
    let (producer_written, appends, accepts) = producer_side?;
    let run = SkeletonRun {
        batch,
        events,
        seconds,
        commits: appends + accepts + consumer_commits,
        synced_commits: appends + consumer_commits,
        written: producer_written.add(consumer_written),
    };
    if run.written != Written::expected(events) {
        return Err(Failure::Check(format!(
            "{CONTEXT}: {events} events wrote {:?}, not {:?}",
            run.written,
            Written::expected(events)
        )));
    }
    verify(dir, flows)?;
    Ok(run)
}

/// Opens a file with ordo's settings: WAL, `synchronous=FULL`.
fn open(path: &Path) -> Result<Connection, Failure> {
    let conn = Connection::open(path).map_err(sql)?;
    conn.query_row("PRAGMA journal_mode=WAL", [], |row| row.get::<_, String>(0))
        .map_err(sql)?;
    conn.execute_batch("PRAGMA synchronous=FULL").map_err(sql)?;
    Ok(conn)
}

/// Both files with their tables and the rows of `flows` flows.
fn seed(dir: &Path, flows: u64) -> Result<(Connection, Connection), Failure> {
    let producer = open(&dir.join("skeleton-producer.db"))?;
    let consumer = open(&dir.join("skeleton-consumer.db"))?;
    producer.execute_batch(PRODUCER_DDL).map_err(sql)?;
    consumer.execute_batch(CONSUMER_DDL).map_err(sql)?;
    producer.execute_batch("BEGIN").map_err(sql)?;
    consumer.execute_batch("BEGIN").map_err(sql)?;
    for n in 0..flows {
        let flow = flow_key(n);
        producer
            .execute("INSERT INTO app_state VALUES (?1, '')", [&flow])
            .and_then(|_| {
                producer.execute(
                    "INSERT INTO head (flow_id, last_seq) VALUES (?1, 0)",
                    [&flow],
                )
            })
            .and_then(|_| consumer.execute("INSERT INTO apply_cursor VALUES (?1, 0)", [&flow]))
            .and_then(|_| consumer.execute("INSERT INTO projection VALUES (?1, '')", [&flow]))
            .map_err(sql)?;
    }
    producer.execute_batch("COMMIT; ANALYZE").map_err(sql)?;
    consumer.execute_batch("COMMIT; ANALYZE").map_err(sql)?;
    Ok((producer, consumer))
}

/// The producer's thread: appends every event, `batch` flows per
/// transaction, hands each round over, and marks the rounds answered
/// accepted. Returns its writes, its appends and its accepted marks.
/// Never inlined: a profile finds the skeleton's work under this function
/// and [`consumer_loop`], and the seeding outside them.
#[inline(never)]
fn producer_loop(
    conn: &Connection,
    flows: u64,
    batch: u64,
    rounds: mpsc::Sender<Vec<Event>>,
    answers: mpsc::Receiver<()>,
) -> Result<(Written, u64, u64), Failure> {
    let stopped = || sql("the consumer's thread stopped");
    let body = "x".repeat(BODY_LEN);
    let (mut written, mut appends, mut accepts) = (Written::default(), 0u64, 0u64);
    let mut in_flight: VecDeque<Vec<(String, i64)>> = VecDeque::new();
    let mut accept_oldest = |in_flight: &mut VecDeque<Vec<(String, i64)>>| {
        let round = in_flight.pop_front().expect("an answer is to a round");
        accepts += 1;
        accept(conn, &round)
    };
    for _ in 0..FLOW_EVENTS {
        for start in (0..flows).step_by(usize::try_from(batch).unwrap_or(usize::MAX)) {
            let keys: Vec<String> = (start..(start + batch).min(flows)).map(flow_key).collect();
            let (round, w) = append(conn, &keys, &body, appends)?;
            appends += 1;
            written = written.add(w);
            in_flight.push_back(round.iter().map(|e| (e.flow.clone(), e.seq)).collect());
            rounds.send(round).map_err(|_| stopped())?;
            while let Ok(()) = answers.try_recv() {
                written = written.add(accept_oldest(&mut in_flight)?);
            }
            while in_flight.len() >= ROUNDS_IN_FLIGHT {
                answers.recv().map_err(|_| stopped())?;
                written = written.add(accept_oldest(&mut in_flight)?);
            }
        }
    }
    drop(rounds);
    while !in_flight.is_empty() {
        answers.recv().map_err(|_| stopped())?;
        written = written.add(accept_oldest(&mut in_flight)?);
    }
    Ok((written, appends, accepts))
}

/// One transaction of `synced` commit around `f`.
fn transaction<T>(
    conn: &Connection,
    synced: bool,
    f: impl FnOnce() -> Result<T, Failure>,
) -> Result<T, Failure> {
    let mode = if synced { "FULL" } else { "NORMAL" };
    conn.execute_batch(&format!("PRAGMA synchronous={mode}; BEGIN IMMEDIATE"))
        .map_err(sql)?;
    match f() {
        Ok(value) => conn.execute_batch("COMMIT").map(|()| value).map_err(sql),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Appends the next event of each flow of `keys` in one synced
/// transaction, then reads the events back as the relay hands them over.
fn append(
    conn: &Connection,
    keys: &[String],
    body: &str,
    turn: u64,
) -> Result<(Vec<Event>, Written), Failure> {
    let mut written = Written::default();
    let appended = transaction(conn, true, || {
        let mut head = conn.prepare_cached(APPEND_HEAD).map_err(sql)?;
        let mut app = conn.prepare_cached(APPEND_APP).map_err(sql)?;
        let mut outbox = conn.prepare_cached(APPEND_OUTBOX).map_err(sql)?;
        let mut pending = conn.prepare_cached(APPEND_PENDING).map_err(sql)?;
        let turn = i64::try_from(turn).unwrap_or(i64::MAX);
        let mut appended = Vec::with_capacity(keys.len());
        for flow in keys {
            let seq: i64 = head
                .query_row(params![flow, turn], |row| row.get(0))
                .map_err(sql)?;
            let event_id = format!("{flow}/{seq}");
            app.execute(params![flow, event_id]).map_err(sql)?;
            outbox
                .execute(params![event_id, flow, seq, body])
                .map_err(sql)?;
            pending.execute([conn.last_insert_rowid()]).map_err(sql)?;
            written.head += 1;
            written.app_state += 1;
            written.outbox += 1;
            written.outbox_pending += 1;
            appended.push((flow.clone(), seq));
        }
        Ok(appended)
    })?;
    let mut pick = conn.prepare_cached(PICK).map_err(sql)?;
    let round = appended
        .into_iter()
        .map(|(flow, seq)| {
            let (event_id, body) = pick
                .query_row(params![flow, seq], |row| Ok((row.get(0)?, row.get(1)?)))
                .map_err(sql)?;
            Ok(Event {
                flow,
                seq,
                event_id,
                body,
            })
        })
        .collect::<Result<Vec<_>, Failure>>()?;
    Ok((round, written))
}

/// Marks the events of an answered round accepted, in one transaction
/// that does not wait for the disk.
fn accept(conn: &Connection, round: &[(String, i64)]) -> Result<Written, Failure> {
    let now_ms = SystemClock.now_ms();
    transaction(conn, false, || {
        let mut outbox = conn.prepare_cached(ACCEPT_OUTBOX).map_err(sql)?;
        let mut pending = conn.prepare_cached(ACCEPT_PENDING).map_err(sql)?;
        let mut head = conn.prepare_cached(ACCEPT_HEAD).map_err(sql)?;
        let mut written = Written::default();
        for (flow, seq) in round {
            let position: i64 = outbox
                .query_row(params![flow, seq, now_ms], |row| row.get(0))
                .map_err(sql)?;
            written.outbox += 1;
            written.outbox_pending += pending.execute([position]).map_err(sql)? as u64;
            written.head += head.execute(params![flow, seq]).map_err(sql)? as u64;
        }
        Ok(written)
    })
}

/// The consumer's thread: stores each round in one synced transaction,
/// answers, then applies it in another. Returns its writes and commits.
#[inline(never)]
fn consumer_loop(
    conn: Connection,
    rounds: mpsc::Receiver<Vec<Event>>,
    answers: mpsc::Sender<()>,
    progress: &dyn Progress,
) -> Result<(Written, u64), Failure> {
    let (mut written, mut commits) = (Written::default(), 0u64);
    for round in rounds {
        let now_ms = SystemClock.now_ms();
        written.inbox += transaction(&conn, true, || {
            let mut receive = conn.prepare_cached(RECEIVE).map_err(sql)?;
            let mut n = 0;
            for e in &round {
                n += receive
                    .execute(params![e.event_id, e.flow, e.seq, e.body, now_ms])
                    .map_err(sql)? as u64;
            }
            Ok(n)
        })?;
        // The producer's side stops first only with an error of its own.
        let _ = answers.send(());
        written = written.add(apply(&conn, &round)?);
        commits += 2;
        progress.inc(round.len() as u64);
    }
    Ok((written, commits))
}

/// Applies the events of a round in one synced transaction: each flow's
/// cursor moved past its event, the handler's row, the inbox status.
fn apply(conn: &Connection, round: &[Event]) -> Result<Written, Failure> {
    let now_ms = SystemClock.now_ms();
    transaction(conn, true, || {
        let mut cursor = conn.prepare_cached(APPLY_CURSOR).map_err(sql)?;
        let mut projection = conn.prepare_cached(APPLY_PROJECTION).map_err(sql)?;
        let mut inbox = conn.prepare_cached(APPLY_INBOX).map_err(sql)?;
        let mut written = Written::default();
        for e in round {
            written.apply_cursor += cursor.execute(params![e.flow, e.seq]).map_err(sql)? as u64;
            written.projection += projection.execute(params![e.flow, e.body]).map_err(sql)? as u64;
            written.inbox += inbox.execute(params![e.event_id, now_ms]).map_err(sql)? as u64;
        }
        Ok(written)
    })
}

/// Each table's rows in `dir`'s files after a measurement, by name.
pub fn table_rows(dir: &Path) -> Result<Vec<(&'static str, u64)>, Failure> {
    let producer = Connection::open(dir.join("skeleton-producer.db")).map_err(sql)?;
    let consumer = Connection::open(dir.join("skeleton-consumer.db")).map_err(sql)?;
    let tables = [
        (&producer, "app_state"),
        (&producer, "head"),
        (&producer, "outbox"),
        (&producer, "outbox_pending"),
        (&consumer, "inbox"),
        (&consumer, "apply_cursor"),
        (&consumer, "projection"),
    ];
    tables
        .into_iter()
        .map(|(conn, table)| {
            let n: i64 = conn
                .query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
                    row.get(0)
                })
                .map_err(sql)?;
            Ok((table, n as u64))
        })
        .collect()
}

/// Checks the files of `dir` after a measurement of `flows` flows: every
/// event accepted and applied, none pending, no flow due, every head and
/// cursor at the flow's last event.
fn verify(dir: &Path, flows: u64) -> Result<(), Failure> {
    let producer = Connection::open(dir.join("skeleton-producer.db")).map_err(sql)?;
    let consumer = Connection::open(dir.join("skeleton-consumer.db")).map_err(sql)?;
    let one = |conn: &Connection, query: &str| -> Result<u64, Failure> {
        let n: i64 = conn.query_row(query, [], |row| row.get(0)).map_err(sql)?;
        Ok(n as u64)
    };
    let found = [
        one(&producer, "SELECT count(*) FROM outbox WHERE accepted")?,
        one(&producer, "SELECT count(*) FROM outbox_pending")?,
        one(
            &producer,
            "SELECT count(*) FROM head WHERE relay_seq IS NOT NULL",
        )?,
        one(&producer, "SELECT count(*) FROM head WHERE last_seq = 3")?,
        one(
            &consumer,
            "SELECT count(*) FROM inbox WHERE status = 'applied'",
        )?,
        one(
            &consumer,
            "SELECT count(*) FROM apply_cursor WHERE applied_seq = 3",
        )?,
    ];
    let events = flows * FLOW_EVENTS;
    if found != [events, 0, 0, flows, events, flows] {
        return Err(Failure::Check(format!(
            "{CONTEXT}: of {events} events, {} accepted, {} pending, {} flows still due, \
             {} heads and {} cursors of {flows} flows at the last event; {} applied",
            found[0], found[1], found[2], found[3], found[5], found[4]
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Silent;

    #[test]
    fn the_skeleton_writes_exactly_the_rows_it_claims() {
        // (flows, batch): batches that divide the flows, that do not, and
        // one larger than all of them (every round of one flow in flight).
        for (flows, batch) in [(12, 4), (10, 3), (2, 8), (1, 1)] {
            let dir = tempfile::tempdir().unwrap();
            let run = measure(dir.path(), flows, batch, &Silent).unwrap();
            let events = flows * FLOW_EVENTS;
            assert_eq!(run.events, events);
            assert_eq!(run.written, Written::expected(events), "{flows}/{batch}");
            // Per table and event: one application row, two head writes, an
            // outbox row and its mark, a pending entry in and out, an inbox
            // row and its status, a cursor and a handler's row.
            let by_table = run.written.by_table().map(|(_, n)| n);
            assert_eq!(by_table, [1, 2, 2, 2, 2, 1, 1].map(|n| n * events));
            // Four commits per round of `batch` flows, the mark unsynced.
            let rounds = FLOW_EVENTS * flows.div_ceil(batch);
            assert_eq!((run.commits, run.synced_commits), (4 * rounds, 3 * rounds));
            let rows = table_rows(dir.path()).unwrap();
            let expected = [
                ("app_state", flows),
                ("head", flows),
                ("outbox", events),
                ("outbox_pending", 0),
                ("inbox", events),
                ("apply_cursor", flows),
                ("projection", flows),
            ];
            assert_eq!(rows, expected, "{flows}/{batch}");
        }
    }

    #[test]
    fn nothing_to_measure_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            measure(dir.path(), 0, 4, &Silent),
            Err(Failure::Usage(_))
        ));
        assert!(matches!(
            measure(dir.path(), 4, 0, &Silent),
            Err(Failure::Usage(_))
        ));
    }
}
