//! The producer store: the outbox and the per-flow head of its sequence in
//! ordo's producer schema, beside the application's own tables.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use ordo_core::envelope::EventType;
use ordo_core::ops::{OutboxEntry, ProducerFlow, ProducerStatus, Pruned, RetryRefused};
use ordo_core::{
    crash, AppendError, Backoff, Clock, Envelope, ErrorKind, EventId, FlowId, OutboxRecord,
    ProducerStore, Receipt, SchemaVersion, Seq, StoreError, SystemClock,
};
use postgres::Row;

use crate::conn::{open, PgOptions, PgTx, Role, Tables, Want};
use crate::domain::Schema;
use crate::error::corrupt;

/// ordo's producer tables, version by version.
pub(crate) const TABLES: Tables = Tables {
    ddl: DDL,
    migrations: &[
        // 2: relay leases. One row per flow, created with its head: the
        // relay holding the flow, until when, and the fence that grows with
        // every new claim (never reset: the row is never deleted).
        "CREATE TABLE {s}.relay_lease (
             flow_id       text   COLLATE \"C\" PRIMARY KEY,
             owner         text,
             fence         bigint NOT NULL DEFAULT 0,
             expires_at_ms bigint NOT NULL DEFAULT 0
         );
         CREATE INDEX relay_lease_owner ON {s}.relay_lease (owner) WHERE owner IS NOT NULL;
         INSERT INTO {s}.relay_lease (flow_id) SELECT flow_id FROM {s}.outbox_head;",
        // 3: the server session (`pg_backend_pid()`) of the relay that
        // claimed the lease: a lease whose session is gone (the relay
        // exited, was killed, or lost its connection) is free at once,
        // without waiting for its expiry.
        "ALTER TABLE {s}.relay_lease ADD COLUMN backend_pid integer;",
        // 4: room on each page of the leases, heads and outbox rows for a
        // renewal, an append to a flow whose relay head is set, or an
        // accepted mark to stay on its page (a HOT update: no new index
        // entries). The events not yet accepted are listed in a table of
        // their own instead of a partial index naming `accepted` (which
        // made every mark write each index of the outbox again).
        "ALTER TABLE {s}.relay_lease SET (fillfactor = 50);
         ALTER TABLE {s}.outbox_head SET (fillfactor = 50);
         ALTER TABLE {s}.outbox SET (fillfactor = 50);
         DROP INDEX {s}.outbox_unaccepted;
         CREATE TABLE {s}.outbox_pending (position bigint PRIMARY KEY);
         INSERT INTO {s}.outbox_pending (position)
             SELECT position FROM {s}.outbox WHERE NOT accepted;",
        // 5: the lease in the flow's head row. A claim walks the due heads
        // in the relay's order and reads each one's lease on the same row
        // (a join to `relay_lease` looked up a second row per due flow,
        // most of them held by other relays), and writes it on its page
        // (no index names a lease column, so a claim is a HOT update).
        "ALTER TABLE {s}.outbox_head
             ADD COLUMN lease_owner text,
             ADD COLUMN lease_fence bigint NOT NULL DEFAULT 0,
             ADD COLUMN lease_expires_at_ms bigint NOT NULL DEFAULT 0,
             ADD COLUMN lease_backend_pid integer;
         UPDATE {s}.outbox_head h SET lease_owner = l.owner, lease_fence = l.fence,
                lease_expires_at_ms = l.expires_at_ms, lease_backend_pid = l.backend_pid
             FROM {s}.relay_lease l WHERE l.flow_id = h.flow_id;
         DROP TABLE {s}.relay_lease;",
    ],
};

/// The leases of the flows of some events (`check_fences`): by their
/// primary key whatever the planner guesses of the tables (`ARRAY(...)`;
/// a join was planned as a scan of every lease).
macro_rules! fences_sql {
    ($lock:literal) => {
        concat!(
            "SELECT h.flow_id, h.lease_owner, h.lease_fence,
                 h.lease_expires_at_ms > (extract(epoch FROM clock_timestamp()) * 1000)::bigint
             FROM {s}.outbox_head h
             WHERE h.flow_id = ANY (ARRAY(
                 SELECT o.flow_id FROM {s}.outbox o WHERE o.event_id = ANY ($1)))
             ORDER BY h.flow_id",
            $lock
        )
    };
}

/// [`fences_sql`], the heads locked until the transaction ends: no claim
/// comes between the check and the commit. In key order, as appenders
/// lock them; exclusive, so that two checks never both hold a head they
/// then both wait to update.
const FENCES_SQL: &str = fences_sql!(" FOR NO KEY UPDATE OF h");

/// [`fences_sql`] without a lock (a lock is a WAL record per lease).
const FENCES_SEEN_SQL: &str = fences_sql!("");

/// ordo's producer tables as version 1 created them (`{s}` is the
/// schema). `outbox_head` holds each flow's last seq, the row a writer
/// locks to allocate the next one, and the relay's bookkeeping (its head,
/// when it is due, when it was served; from version 5 the flow's lease).
const DDL: &str = "
CREATE TABLE {s}.outbox (
    position           bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id           text    COLLATE \"C\" NOT NULL UNIQUE,
    flow_id            text    COLLATE \"C\" NOT NULL,
    seq                bigint  NOT NULL CHECK (seq >= 1),
    schema_version     bigint  NOT NULL,
    type               text    NOT NULL,
    body               text    NOT NULL,
    created_at_ms      bigint  NOT NULL,
    accepted           boolean NOT NULL DEFAULT false,
    accepted_at_ms     bigint,
    quarantined        boolean NOT NULL DEFAULT false,
    quarantine_reason  text,
    attempts           bigint  NOT NULL DEFAULT 0,
    last_outcome       text,
    last_error         text,
    next_attempt_at_ms bigint  NOT NULL DEFAULT 0,
    UNIQUE (flow_id, seq),
    CHECK (NOT (accepted AND quarantined))
);
CREATE INDEX outbox_unaccepted ON {s}.outbox (position) WHERE NOT accepted;
CREATE TABLE {s}.outbox_head (
    flow_id      text   COLLATE \"C\" PRIMARY KEY,
    last_seq     bigint NOT NULL CHECK (last_seq >= 0),
    relay_seq    bigint,
    relay_due_ms bigint NOT NULL DEFAULT 0,
    relay_turn   bigint NOT NULL DEFAULT 0
);
CREATE INDEX outbox_head_relay ON {s}.outbox_head (relay_turn, flow_id) WHERE relay_seq IS NOT NULL;
CREATE SEQUENCE {s}.relay_turn;
";

/// The reason recorded on an event quarantined by a conflict receipt.
pub const CONFLICT_REASON: &str =
    "conflict: the consumer holds a different body under this event id, or another event id at this (flow_id, seq)";

// The batch statements below name their rows by key through
// `= ANY (ARRAY(SELECT unnest($1)))`: the planner cannot count that array,
// so it reads the rows by index whatever the tables' sizes and statistics.
// Handed the array itself, it counts it and, on a table of a few thousand
// rows, scans the whole table once per batch instead (its cost model
// prices each index read as a disk read); as the table grows, every batch
// then costs more.

/// Locks the heads of the flows `$1`, in key order.
const LOCK_HEADS_SQL: &str = "SELECT flow_id, last_seq FROM {s}.outbox_head
     WHERE flow_id = ANY (ARRAY(SELECT unnest($1::text[])))
     ORDER BY flow_id FOR UPDATE";

/// Moves the heads of the flows `$1` past the events appended, each only
/// from the seq before its first (`$2`) to its last (`$3`).
const MOVE_HEADS_SQL: &str = "UPDATE {s}.outbox_head h SET last_seq = m.last_seq,
         relay_seq = coalesce(h.relay_seq, m.first_seq),
         relay_due_ms = CASE WHEN h.relay_seq IS NULL THEN 0 ELSE h.relay_due_ms END
     FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS m(flow_id, first_seq, last_seq)
     WHERE h.flow_id = ANY (ARRAY(SELECT unnest($1::text[])))
       AND h.flow_id = m.flow_id AND h.last_seq = m.first_seq - 1";

/// Sets the relay heads of the flows `$1` to their first event to relay,
/// and moves them to the back of the relay's order when `$2`.
///
/// `locked` takes the heads first, in key order, the order writers lock
/// them in: an update alone takes each row in the order the server reads
/// them (storage order under a sequential scan), and a writer holding one
/// head while it asks for the next would wait for this statement while it
/// waits for the writer (a deadlock).
///
/// A writer appending to one of the flows holds its head locked until it
/// commits; `locked` then waits for it and takes the head the writer left
/// (`h`), while the subqueries still read the statement's snapshot,
/// without the writer's events. `seen` is the head in that snapshot, read
/// only when the snapshot has nothing left to relay: when `h.last_seq` is
/// past its `last_seq`, the first event to relay is the writer's first,
/// `seen.last_seq + 1`.
const REFRESH_HEADS_SQL: &str = "WITH locked AS (
         SELECT flow_id FROM {s}.outbox_head
         WHERE flow_id = ANY (ARRAY(SELECT unnest($1::text[])))
         ORDER BY flow_id FOR NO KEY UPDATE)
     UPDATE {s}.outbox_head h SET
         (relay_seq, relay_due_ms) = (SELECT
                 coalesce(max(seq), (SELECT seen.last_seq + 1 FROM {s}.outbox_head seen
                                     WHERE seen.flow_id = h.flow_id
                                       AND seen.last_seq < h.last_seq)),
                 coalesce(max(due), 0)
             FROM (SELECT o.seq AS seq, o.next_attempt_at_ms AS due FROM {s}.outbox o
                   WHERE o.flow_id = h.flow_id AND NOT o.accepted AND NOT o.quarantined
                     AND o.seq >= least(h.relay_seq, $3::bigint)
                   ORDER BY o.seq LIMIT 1) AS next),
         relay_turn = CASE WHEN $2 THEN (SELECT nextval('{s}.relay_turn')) ELSE h.relay_turn END
     WHERE h.flow_id = ANY (ARRAY(SELECT flow_id FROM locked))";

/// Up to `$4` events of each of the flows `$3` whose relay head is due at
/// `$1`: the head and the events after it neither accepted nor
/// quarantined, in seq order; flows in the relay's order, at most `$2`
/// events in all.
const ROUND_SQL: &str = "SELECT e.body FROM {s}.outbox_head h
     CROSS JOIN LATERAL (
         SELECT o.body, o.seq FROM {s}.outbox o
         WHERE o.flow_id = h.flow_id AND o.seq >= h.relay_seq
           AND NOT o.accepted AND NOT o.quarantined
         ORDER BY o.seq LIMIT $4) AS e
     WHERE h.flow_id = ANY (ARRAY(SELECT unnest($3::text[])))
       AND h.relay_seq IS NOT NULL AND h.relay_due_ms <= $1
     ORDER BY h.relay_turn, h.flow_id, e.seq
     LIMIT $2";

/// Marks the events `$1` accepted with their receipts `$2` at `$3`;
/// returns their flows.
const MARK_ACCEPTED_SQL: &str = "WITH marked AS (
         UPDATE {s}.outbox o SET accepted = true, quarantined = false,
             quarantine_reason = NULL, accepted_at_ms = coalesce(o.accepted_at_ms, $3),
             attempts = o.attempts + 1, last_outcome = r.outcome, last_error = NULL
         FROM unnest($1::text[], $2::text[]) AS r(event_id, outcome)
         WHERE o.event_id = ANY (ARRAY(SELECT unnest($1::text[])))
           AND o.event_id = r.event_id
         RETURNING o.position, o.flow_id),
     settled AS (
         DELETE FROM {s}.outbox_pending p
         WHERE p.position = ANY (ARRAY(SELECT position FROM marked)))
     SELECT flow_id FROM marked";

/// Whether the lease on a head `h` is free for the claimer `$4`: unheld,
/// its own, expired, or held by a server session that is gone.
macro_rules! claimable {
    () => {
        "(h.lease_owner IS NULL OR h.lease_owner = $4
              OR h.lease_expires_at_ms <= (SELECT ms FROM now)
              OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = h.lease_backend_pid))"
    };
}

/// The claim of a round ([`PgProducer::claim`]): up to `$2` flows due at
/// `$1`, none of `$3`, in the relay's order, for the owner `$4` with leases
/// of `$5` ms. `pick` walks the due heads without locking them, each
/// with its lease on the same row; a flow the claimer's session holds with
/// more than half its lease left is `kept` as it is; the others are
/// locked, skipping those another transaction holds (a relay's claim or
/// bookkeeping, or a writer appending to the flow), and claimed if still
/// free under the lock. The heads to claim go by primary key through
/// `= ANY (ARRAY(...))`, never a scan of every head.
const CLAIM_SQL: &str = concat!(
    "WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms),
     pick AS (
         SELECT h.flow_id, h.lease_fence AS fence,
                coalesce(h.lease_owner = $4 AND h.lease_backend_pid = pg_backend_pid()
                         AND h.lease_expires_at_ms > (SELECT ms FROM now) + $5::bigint / 2,
                         false) AS kept
         FROM {s}.outbox_head h
         WHERE h.relay_seq IS NOT NULL AND h.relay_due_ms <= $1
           AND NOT (h.flow_id = ANY ($3))
           AND ",
    claimable!(),
    "
         ORDER BY h.relay_turn, h.flow_id
         LIMIT $2),
     locked AS (
         SELECT h.flow_id FROM {s}.outbox_head h
         WHERE h.flow_id = ANY (ARRAY(SELECT flow_id FROM pick WHERE NOT kept))
           AND ",
    claimable!(),
    "
         FOR NO KEY UPDATE OF h SKIP LOCKED),
     claimed AS (
         UPDATE {s}.outbox_head h SET
             lease_fence = CASE WHEN h.lease_owner = $4 AND h.lease_expires_at_ms > now.ms
                                THEN h.lease_fence ELSE h.lease_fence + 1 END,
             lease_owner = $4,
             lease_backend_pid = pg_backend_pid(),
             lease_expires_at_ms = now.ms + $5
         FROM now WHERE h.flow_id = ANY (ARRAY(SELECT flow_id FROM locked))
         RETURNING h.flow_id, h.lease_fence)
     SELECT flow_id, fence FROM pick WHERE kept
     UNION ALL
     SELECT flow_id, lease_fence FROM claimed"
);

/// Releases the leases of the flows `$2` that the owner `$1` holds,
/// passing by the heads another transaction has locked.
const RELEASE_SQL: &str = "UPDATE {s}.outbox_head SET lease_owner = NULL, lease_expires_at_ms = 0
     WHERE flow_id = ANY (ARRAY(SELECT flow_id FROM {s}.outbox_head
                                WHERE flow_id = ANY (ARRAY(SELECT unnest($2::text[])))
                                  AND lease_owner = $1
                                FOR NO KEY UPDATE SKIP LOCKED))";

/// [`RELEASE_SQL`] for every flow the owner `$1` holds, found by reading
/// every head (no index names the lease's owner, so that a claim is a
/// HOT update).
const RELEASE_ALL_SQL: &str =
    "UPDATE {s}.outbox_head SET lease_owner = NULL, lease_expires_at_ms = 0
     WHERE flow_id = ANY (ARRAY(SELECT flow_id FROM {s}.outbox_head WHERE lease_owner = $1
                                FOR NO KEY UPDATE SKIP LOCKED))";

/// The most flows a handle remembers having claimed, to release them by
/// key; past that, a release reads every head.
const CLAIMED_TRACKED_MAX: usize = 65_536;

/// The first `$1` events not yet accepted, oldest first, and when each is
/// due, on the keys of `outbox_pending` and of the outbox.
const PENDING_SQL: &str = "SELECT o.body, o.next_attempt_at_ms
     FROM {s}.outbox_pending p JOIN {s}.outbox o ON o.position = p.position
     ORDER BY p.position LIMIT $1";

const BODY: &str = "producer: stored outbox body";
const LEASE: &str = "producer: relay lease";
const BEGIN_SYNCED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";
const BEGIN_UNSYNCED: &str =
    "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = off";

/// The producer's store on PostgreSQL: ordo's tables in their own schema
/// (`ordo_producer` by default) and the application's beside them, over one
/// connection.
///
/// # Several relays
///
/// Any number of relays (threads or processes, each with its own
/// `PgProducer`) may relay from one store at once. A relay claims whole
/// flows, never single events: [`fair_round`](ProducerStore::fair_round)
/// claims (or renews) a lease on each flow it returns, for
/// [`PgOptions::lease_ms`], under the handle's owner name
/// ([`PgOptions::owner`]), in one short transaction (`SKIP LOCKED` on the
/// flows' head rows, which hold their leases: relays never wait for each
/// other, nor for a writer appending to a flow). A flow the handle holds
/// with more than half its lease left is used as it is, its head neither
/// locked nor written. A flow stays held after
/// its round, caught up or not, until its lease expires, the handle's
/// server session ends or the handle releases it: the handle's next rounds
/// serve it when it has events again without a new claim, and other relays
/// pass it by. No transaction is held across a delivery. Each new claim of
/// a flow increases its fence;
/// the round's bookkeeping ([`record_receipts`](ProducerStore::record_receipts),
/// [`record_failure`](ProducerStore::record_failure),
/// [`quarantine`](ProducerStore::quarantine)) carries the fence it claimed
/// and is refused whole, nothing written, with
/// [`ErrorKind::LeaseLost`] when another relay has claimed the flow since
/// (the lease expired under a slow relay). Bookkeeping for a flow this
/// handle did not claim (an explicit delivery of one event) is refused the
/// same way while another relay holds the flow. A failure, a quarantine or
/// a conflict locks the flows' heads for its check, so that no claim
/// comes between the check and the commit; receipts of custody
/// (`accepted`, `duplicate`) only read them, because custody needs no
/// fence: a claim that comes in between finds the events accepted, or
/// delivers them again and is answered `duplicate`.
///
/// The consumer's receive needs no fence: the inbox decides every receipt
/// from what it stores (`duplicate` for an event it holds, `conflict` for a
/// different one), and applies strictly in seq order from its own cursor,
/// so two relays delivering the same flow for a while can only cause
/// `duplicate` receipts and a transient `gap`, never a wrong apply. A
/// custody mark refused with its round is found again by the flow's new
/// holder, whose delivery the consumer answers `duplicate`.
///
/// Dropping the handle releases its leases; the flows of a relay that dies
/// come free when its server session ends, at the latest when their
/// leases expire.
pub struct PgProducer {
    conn: PgTx,
    domain: String,
    clock: Arc<dyn Clock>,
    commits: u64,
    owner: String,
    lease_ms: i64,
    /// The fence of each flow claimed by the last round.
    held: HashMap<String, i64>,
    /// The flows this handle claimed since it last released its leases,
    /// up to [`CLAIMED_TRACKED_MAX`]; `None` past that (a release then
    /// looks for the handle's name in every head).
    claimed: Option<HashSet<String>>,
    /// The events per flow of this handle's last round (how many flows
    /// the next claims for its events).
    events_per_flow: usize,
}

/// A write transaction on the producer, in which the caller changes its own
/// state (through [`PgProducerTx::sql`]) and appends events: both commit
/// together or not at all.
pub struct PgProducerTx<'c> {
    conn: &'c PgTx,
    now_ms: i64,
    appended: u64,
    /// The heads this transaction has locked, at the last seq it read or
    /// appended: no other transaction moves them until it ends.
    locked: RefCell<HashMap<String, i64>>,
}

impl PgProducer {
    /// Opens or creates the producer store of `schema`'s domain at `url`
    /// with the system clock and default options.
    pub fn open(url: &str, schema: &Schema) -> Result<PgProducer, StoreError> {
        PgProducer::open_with(url, schema, Arc::new(SystemClock), &PgOptions::default())
    }

    /// [`PgProducer::open`] with the given clock and options.
    pub fn open_with(
        url: &str,
        schema: &Schema,
        clock: Arc<dyn Clock>,
        options: &PgOptions,
    ) -> Result<PgProducer, StoreError> {
        PgProducer::open_inner(url, Want::Domain(schema), clock, options)
    }

    /// Opens an existing producer store of any domain, without running its
    /// domain's migrations; nothing is created.
    pub fn open_existing(
        url: &str,
        clock: Arc<dyn Clock>,
        options: &PgOptions,
    ) -> Result<PgProducer, StoreError> {
        PgProducer::open_inner(url, Want::Any, clock, options)
    }

    fn open_inner(
        url: &str,
        want: Want<'_>,
        clock: Arc<dyn Clock>,
        options: &PgOptions,
    ) -> Result<PgProducer, StoreError> {
        let opened = open(url, Role::Producer, &TABLES, want, options)?;
        Ok(PgProducer {
            conn: opened.conn,
            domain: opened.domain,
            clock,
            commits: 0,
            owner: opened.owner,
            lease_ms: i64::try_from(options.lease_ms).unwrap_or(i64::MAX),
            held: HashMap::new(),
            claimed: Some(HashSet::new()),
            events_per_flow: 1,
        })
    }

    /// The name this handle claims flows under.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The flows this handle's last round claimed, with their fences.
    pub fn held_flows(&self) -> BTreeMap<FlowId, i64> {
        self.held
            .iter()
            .filter_map(|(flow, fence)| Some((FlowId::new(flow.clone()).ok()?, *fence)))
            .collect()
    }

    /// Releases every flow this handle holds, so that other relays take
    /// them at once; returns how many. Dropping the handle does it too. A
    /// flow whose head another transaction has locked at that instant (a
    /// writer appending to it) is passed by: it stays held until the
    /// handle's server session ends or its lease expires.
    pub fn release_leases(&mut self) -> Result<u64, StoreError> {
        let owner = self.owner.clone();
        let tracked: Option<Vec<&str>> =
            (self.claimed.as_ref()).map(|flows| flows.iter().map(String::as_str).collect());
        let released = self
            .conn
            .in_tx_begun(LEASE, BEGIN_UNSYNCED, |tx| match &tracked {
                Some(flows) if flows.is_empty() => Ok(0),
                Some(flows) => tx.run(LEASE, RELEASE_SQL, &[&owner, flows]),
                None => tx.run(LEASE, RELEASE_ALL_SQL, &[&owner]),
            })?;
        self.held.clear();
        self.claimed = Some(HashSet::new());
        Ok(released)
    }

    /// Whether this handle may hold leases (it claimed some since it last
    /// released all).
    fn may_hold(&self) -> bool {
        self.claimed.as_ref().is_none_or(|flows| !flows.is_empty())
    }

    /// Claims up to `limit` due flows for this handle; returns them with
    /// their fences. A flow this handle's session holds with more than half
    /// its lease left is kept as it is, neither locked nor written; the
    /// others are locked (`SKIP LOCKED`: relays never wait for each other),
    /// checked again under the lock, and claimed or renewed.
    fn claim(
        &mut self,
        limit: i64,
        skip: &[&str],
        now_ms: i64,
    ) -> Result<HashMap<String, i64>, StoreError> {
        let params: [&(dyn postgres::types::ToSql + Sync); 5] =
            [&now_ms, &limit, &skip, &self.owner, &self.lease_ms];
        // Committed without waiting for the WAL flush: a claim lost with
        // the server leaves the lease as it was, and this handle's
        // bookkeeping under the fence it was given is then refused (its
        // owner or fence differ).
        let claimed: HashMap<String, i64> = self.conn.in_tx_begun(LEASE, BEGIN_UNSYNCED, |tx| {
            let rows = tx.rows(LEASE, CLAIM_SQL, &params)?;
            Ok::<_, StoreError>(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
        })?;
        if let Some(tracked) = &mut self.claimed {
            tracked.extend(claimed.keys().cloned());
            if tracked.len() > CLAIMED_TRACKED_MAX {
                self.claimed = None;
            }
        }
        Ok(claimed)
    }

    /// Inside a bookkeeping transaction: refuses the write when another
    /// relay claimed one of the flows of `event_ids` since this handle's
    /// round, or holds one this handle did not claim. `Fences::Locked`
    /// also locks their heads (a claim skips them until this transaction
    /// ends).
    fn check_fences(
        &self,
        tx: &PgTx,
        event_ids: &[&str],
        fences: Fences,
    ) -> Result<(), StoreError> {
        let sql = match fences {
            Fences::Locked => FENCES_SQL,
            Fences::Seen => FENCES_SEEN_SQL,
        };
        let rows = tx.rows(LEASE, sql, &[&event_ids])?;
        for row in &rows {
            let flow: &str = row.get(0);
            let owner: Option<&str> = row.get(1);
            let fence: i64 = row.get(2);
            let live: bool = row.get(3);
            let current = match self.held.get(flow) {
                Some(claimed) => owner == Some(self.owner.as_str()) && fence == *claimed,
                None => owner.is_none() || owner == Some(self.owner.as_str()) || !live,
            };
            if !current {
                return Err(StoreError::new(
                    ErrorKind::LeaseLost,
                    format!(
                        "producer: flow {flow} is now held by relay {} (fence {fence}{}); \
                         this relay's bookkeeping was refused, nothing written",
                        owner.unwrap_or("none"),
                        match self.held.get(flow) {
                            Some(claimed) => format!(", this relay claimed fence {claimed}"),
                            None => String::new(),
                        }
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The domain that owns this store.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The clock this store stamps its writes with.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    /// How many write transactions this handle has committed.
    pub fn commits(&self) -> u64 {
        self.commits
    }

    /// The connection, for the caller's own reads outside a transaction.
    pub fn connection(&self) -> &PgTx {
        &self.conn
    }

    /// Runs `f` in one READ COMMITTED transaction and commits if it returns
    /// `Ok`; on `Err` nothing it wrote is kept.
    pub fn write<T, E>(
        &mut self,
        f: impl FnOnce(&mut PgProducerTx<'_>) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        self.write_synced(true, f)
    }

    /// Runs `f` in one write transaction whose commit waits for the WAL
    /// flush (`synced`) or not (`synchronous_commit = off` for this
    /// transaction alone: a lost commit is lost whole, and every later
    /// synced commit flushes it too).
    fn write_synced<T, E>(
        &mut self,
        synced: bool,
        f: impl FnOnce(&mut PgProducerTx<'_>) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        let context = "producer: write transaction";
        let conn = &self.conn;
        let clock = &self.clock;
        let begin = if synced { BEGIN_SYNCED } else { BEGIN_UNSYNCED };
        let appended = conn.in_tx_begun(context, begin, |conn| {
            let mut ptx = PgProducerTx {
                conn,
                now_ms: clock.now_ms(),
                appended: 0,
                locked: RefCell::default(),
            };
            let value = f(&mut ptx)?;
            Ok::<_, E>((value, ptx.appended))
        })?;
        self.commits += 1;
        Ok(appended.0)
    }

    /// Delivery bookkeeping on the events `event_ids`, in one transaction
    /// committed without waiting for the WAL flush, refused whole when the
    /// fence of one of their flows is stale (see [`PgProducer`]).
    fn bookkeeping<T>(
        &mut self,
        event_ids: &[&str],
        fences: Fences,
        f: impl FnOnce(&PgTx, i64) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let this = &*self;
        let value = this.conn.in_tx_begun(LEASE, BEGIN_UNSYNCED, |tx| {
            this.check_fences(tx, event_ids, fences)?;
            f(tx, this.clock.now_ms())
        })?;
        self.commits += 1;
        Ok(value)
    }

    /// Moves the heads of flows that a claim found due and a round that
    /// was not cut short found nothing to relay in. A head is left at an
    /// event when another relay (whose lease had expired) accepts the events
    /// appended while this handle's bookkeeping waited for their writer
    /// (see [`REFRESH_HEADS_SQL`]); without this, the flow would stay due
    /// with nothing to relay until its next append.
    fn refresh_idle_heads(&mut self, idle: &BTreeSet<String>) -> Result<(), StoreError> {
        if idle.is_empty() {
            return Ok(());
        }
        (self.conn).in_tx_begun(LEASE, BEGIN_UNSYNCED, |tx| {
            refresh_heads(tx, idle, Turn::Next, None)
        })?;
        self.commits += 1;
        Ok(())
    }

    /// Runs `f` inside one read-only REPEATABLE READ transaction, so that
    /// everything it reads is one consistent snapshot.
    pub fn read<T>(
        &mut self,
        f: impl FnOnce(&PgTx) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        read_snapshot(&self.conn, "producer: read transaction", f)
    }
}

impl Drop for PgProducer {
    /// Releases the handle's leases, so that other relays take its flows at
    /// once (a failure leaves them to expire).
    fn drop(&mut self) {
        if self.may_hold() {
            if let Err(e) = self.release_leases() {
                tracing::debug!("the relay leases are left to expire: {e}");
            }
        }
    }
}

/// Runs `f` in a read-only REPEATABLE READ transaction.
pub(crate) fn read_snapshot<T>(
    conn: &PgTx,
    context: &str,
    f: impl FnOnce(&PgTx) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    conn.begin_read(context)?;
    let value = f(conn);
    conn.rollback();
    value
}

impl PgProducerTx<'_> {
    /// The transaction, for the caller's own reads and writes of its state.
    pub fn sql(&self) -> &PgTx {
        self.conn
    }

    /// The seq of the flow's last committed event, 0 if it has none, with
    /// the flow's head row locked until the transaction ends: a concurrent
    /// writer of the same flow waits here, then reads the seq this one
    /// committed (READ COMMITTED), so that it finds itself stale.
    pub fn last_seq(&self, flow_id: &FlowId) -> Result<i64, StoreError> {
        Ok(self.last_seqs([flow_id])?[flow_id.as_str()])
    }

    /// [`PgProducerTx::last_seq`] of several flows at once (each flow
    /// once), their head rows locked in flow id order, in two statements
    /// whatever their number (none for the heads this transaction locked
    /// already): keyed by flow id.
    pub fn last_seqs<'f>(
        &self,
        flows: impl IntoIterator<Item = &'f FlowId>,
    ) -> Result<HashMap<String, i64>, StoreError> {
        let mut names: Vec<&str> = flows.into_iter().map(FlowId::as_str).collect();
        names.sort_unstable();
        names.dedup();
        let mut locked = self.locked.borrow_mut();
        let new: Vec<&str> = names
            .iter()
            .copied()
            .filter(|name| !locked.contains_key(*name))
            .collect();
        if !new.is_empty() {
            locked.extend(self.lock_heads(&new)?);
        }
        Ok(names
            .iter()
            .map(|name| ((*name).to_owned(), locked[*name]))
            .collect())
    }

    /// Creates the heads of `names` (sorted, each once) that do not exist
    /// and locks them all; returns their last seqs.
    fn lock_heads(&self, names: &[&str]) -> Result<HashMap<String, i64>, StoreError> {
        let context = "producer: cannot lock the outbox head";
        self.conn.run(
            context,
            "INSERT INTO {s}.outbox_head (flow_id, last_seq)
             SELECT flow_id, 0 FROM unnest($1::text[]) AS flow_id
             ON CONFLICT (flow_id) DO NOTHING",
            &[&names],
        )?;
        let heads: HashMap<String, i64> = self
            .conn
            .rows(context, LOCK_HEADS_SQL, &[&names])?
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        match names.iter().find(|name| !heads.contains_key(**name)) {
            Some(missing) => Err(corrupt(context, format!("flow {missing} has no head row"))),
            None => Ok(heads),
        }
    }

    /// The time this transaction records on what it writes, in
    /// milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        self.now_ms
    }

    /// Appends the flow's next event to the outbox in this transaction, and
    /// returns it: its seq is the flow's last committed seq plus one, its id
    /// [`EventId::for_seq`], its payload `payload` serialized to a JSON
    /// object. A refusal writes nothing.
    pub fn append<T: serde::Serialize + ?Sized>(
        &mut self,
        flow_id: &FlowId,
        event_type: &str,
        schema_version: SchemaVersion,
        payload: &T,
    ) -> Result<Envelope, AppendError> {
        let event_type =
            EventType::new(event_type).map_err(|e| AppendError::Invalid(format!("type {e}")))?;
        let payload = match serde_json::to_value(payload) {
            Ok(serde_json::Value::Object(map)) => map,
            Ok(_) => {
                return Err(AppendError::Invalid(
                    "the payload must serialize to a JSON object".into(),
                ))
            }
            Err(e) => return Err(AppendError::Invalid(format!("payload: {e}"))),
        };
        let last_seq = self.last_seq(flow_id)?;
        let seq = Seq::after(last_seq).ok_or_else(|| AppendError::SeqExhausted {
            flow_id: flow_id.clone(),
        })?;
        let event = Envelope {
            event_id: EventId::for_seq(flow_id, seq),
            flow_id: flow_id.clone(),
            seq,
            schema_version,
            event_type,
            payload,
        };
        self.append_envelope(&event)?;
        Ok(event)
    }

    /// Appends an envelope the caller built to the outbox in this
    /// transaction. Its seq must be exactly the flow's
    /// [`PgProducerTx::last_seq`] plus one, and its event id unused;
    /// anything else is refused without writing, and the transaction can go
    /// on.
    pub fn append_envelope(&mut self, event: &Envelope) -> Result<(), AppendError> {
        self.append_envelopes(std::slice::from_ref(event))
    }

    /// Appends envelopes the caller built, in order, as
    /// [`PgProducerTx::append_envelope`] one after the other would, in a
    /// few statements whatever their number (arrays as parameters): the
    /// events before the first refusal are appended, and that refusal is
    /// returned (a caller that wants all or nothing rolls back, as
    /// [`ProducerStore::append_events`] does).
    pub fn append_envelopes(&mut self, events: &[Envelope]) -> Result<(), AppendError> {
        let context = "producer: cannot append to the outbox";
        if events.is_empty() {
            return Ok(());
        }
        let mut last = self.last_seqs(events.iter().map(|e| &e.flow_id))?;
        let mut refused = None;
        let mut valid = events.len();
        for (i, event) in events.iter().enumerate() {
            let last_seq = last[event.flow_id.as_str()];
            if last_seq.checked_add(1) != Some(event.seq.get()) {
                refused = Some(AppendError::NotNext {
                    flow_id: event.flow_id.clone(),
                    seq: event.seq,
                    last_seq,
                });
                valid = i;
                break;
            }
            last.insert(event.flow_id.as_str().to_owned(), event.seq.get());
        }
        if let Some((used, id)) = self.insert_outbox(context, &events[..valid])? {
            // An event id in use comes before any later refusal.
            (valid, refused) = (used, Some(AppendError::EventIdUsed(id)));
        }
        let appended = &events[..valid];
        // Each flow's first and last new seq, in the order flows are met.
        let mut flows: Vec<&str> = Vec::new();
        let (mut firsts, mut lasts): (Vec<i64>, Vec<i64>) = (Vec::new(), Vec::new());
        for event in appended {
            let flow = event.flow_id.as_str();
            match flows.iter().position(|f| *f == flow) {
                Some(at) => lasts[at] = event.seq.get(),
                None => {
                    flows.push(flow);
                    firsts.push(event.seq.get());
                    lasts.push(event.seq.get());
                }
            }
        }
        if !flows.is_empty() {
            let moved = self
                .conn
                .run(context, MOVE_HEADS_SQL, &[&flows, &firsts, &lasts])?;
            if moved != flows.len() as u64 {
                return Err(corrupt(
                    context,
                    format!(
                        "the heads of flows {flows:?} are not where this transaction locked them"
                    ),
                )
                .into());
            }
            let mut locked = self.locked.borrow_mut();
            for (flow, last) in flows.iter().zip(&lasts) {
                locked.insert((*flow).to_owned(), *last);
            }
        }
        self.appended += appended.len() as u64;
        refused.map_or(Ok(()), Err)
    }

    /// Inserts `events` (each its flow's next, the heads locked) into the
    /// outbox in one statement. When an event id is in use (or repeated in
    /// `events`), the first such event's index and id are returned and
    /// nothing from it on stays inserted.
    fn insert_outbox(
        &self,
        context: &str,
        events: &[Envelope],
    ) -> Result<Option<(usize, EventId)>, StoreError> {
        if events.is_empty() {
            return Ok(None);
        }
        let text = |f: fn(&Envelope) -> &str| events.iter().map(f).collect::<Vec<&str>>();
        let bodies: Vec<String> = events.iter().map(Envelope::stored_text).collect();
        let seqs: Vec<i64> = events.iter().map(|e| e.seq.get()).collect();
        let versions: Vec<i64> = events.iter().map(|e| e.schema_version.get()).collect();
        // Only the event id arbitrates: the heads are locked and each seq
        // is past its head, so no (flow, seq) is taken, and the position is
        // new. `ON CONFLICT` probes each arbiter index before inserting.
        let inserted: HashSet<(String, i64)> = self
            .conn
            .rows(
                context,
                "WITH appended AS (
                     INSERT INTO {s}.outbox (event_id, flow_id, seq, schema_version, type, body, created_at_ms)
                     SELECT e.event_id, e.flow_id, e.seq, e.schema_version, e.type, e.body, $7
                     FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::text[])
                          WITH ORDINALITY AS e(event_id, flow_id, seq, schema_version, type, body, i)
                     ORDER BY e.i
                     ON CONFLICT (event_id) DO NOTHING RETURNING position, flow_id, seq),
                 listed AS (
                     INSERT INTO {s}.outbox_pending (position) SELECT position FROM appended)
                 SELECT flow_id, seq FROM appended",
                &[
                    &text(|e| e.event_id.as_str()),
                    &text(|e| e.flow_id.as_str()),
                    &seqs,
                    &versions,
                    &text(|e| e.event_type.as_str()),
                    &bodies,
                    &self.now_ms,
                ],
            )?
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        let is_in = |e: &Envelope| inserted.contains(&(e.flow_id.as_str().to_owned(), e.seq.get()));
        // The head is locked and each seq is past it: an insert that did
        // not happen is an event id in use.
        let Some(used) = events.iter().position(|e| !is_in(e)) else {
            return Ok(None);
        };
        let (flows, seqs): (Vec<&str>, Vec<i64>) = events[used..]
            .iter()
            .filter(|e| is_in(e))
            .map(|e| (e.flow_id.as_str(), e.seq.get()))
            .unzip();
        if !flows.is_empty() {
            self.conn.run(
                context,
                "WITH gone AS (
                     DELETE FROM {s}.outbox o USING unnest($1::text[], $2::bigint[]) AS d(flow_id, seq)
                     WHERE o.flow_id = d.flow_id AND o.seq = d.seq RETURNING o.position)
                 DELETE FROM {s}.outbox_pending p WHERE p.position IN (SELECT position FROM gone)",
                &[&flows, &seqs],
            )?;
        }
        Ok(Some((used, events[used].event_id.clone())))
    }
}

/// Parses a stored body back into its envelope; anything else is damage.
pub(crate) fn stored_envelope(context: &str, body: &str) -> Result<Envelope, StoreError> {
    Envelope::from_stored(body).map_err(|e| corrupt(context, e))
}

fn envelopes(rows: Vec<Row>) -> Result<Vec<Envelope>, StoreError> {
    rows.iter()
        .map(|row| stored_envelope(BODY, row.get(0)))
        .collect()
}

fn outbox_records(rows: Vec<Row>) -> Result<Vec<OutboxRecord>, StoreError> {
    rows.iter()
        .map(|row| {
            Ok(OutboxRecord {
                envelope: stored_envelope(BODY, row.get(0))?,
                accepted: row.get(1),
            })
        })
        .collect()
}

/// Every outbox row in commit order, read through `conn` (for reads inside
/// [`PgProducer::read`] beside the application's own tables).
pub fn read_outbox(conn: &PgTx) -> Result<Vec<OutboxRecord>, StoreError> {
    outbox_records(conn.rows(
        "producer: cannot read the outbox",
        "SELECT body, accepted FROM {s}.outbox ORDER BY position",
        &[],
    )?)
}

/// How a bookkeeping transaction checks the fences of its flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fences {
    /// Read and locked until the transaction ends: no claim comes between
    /// the check and the commit (failures, quarantines, conflicts).
    Locked,
    /// Read only: custody needs no fence, so receipts of `accepted` and
    /// `duplicate` written just after another relay's claim only make the
    /// consumer answer that relay `duplicate`.
    Seen,
}

/// Whether moving the relay heads records a new round of service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// The flows were served: they take the next turn of the relay's
    /// sequence, so that the flows served longest ago come first.
    Next,
    /// Their turn stays.
    Keep,
}

/// Moves each flow's relay head to its lowest seq neither accepted nor
/// quarantined, with that event's next attempt time; records the round in
/// which the flows were served with [`Turn::Next`]. The search starts at
/// the current head, or at `reopened` (a seq whose quarantine was cleared)
/// when that is earlier. A flow with nothing eligible keeps a NULL head.
fn refresh_heads(
    conn: &PgTx,
    flows: &BTreeSet<String>,
    turn: Turn,
    reopened: Option<i64>,
) -> Result<(), StoreError> {
    if flows.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = flows.iter().map(String::as_str).collect();
    // One turn for the whole round, drawn once (an uncorrelated subquery).
    conn.run(
        "producer: cannot move the relay heads",
        REFRESH_HEADS_SQL,
        &[&names, &(turn == Turn::Next), &reopened],
    )?;
    Ok(())
}

impl ProducerStore for PgProducer {
    fn append_events(&mut self, events: &[Envelope]) -> Result<(), AppendError> {
        self.write(|ptx| ptx.append_envelopes(events))
    }

    fn outbox(&mut self) -> Result<Vec<OutboxRecord>, StoreError> {
        read_outbox(&self.conn)
    }

    fn outbox_event(&mut self, event_id: &EventId) -> Result<Option<OutboxRecord>, StoreError> {
        let rows = self.conn.rows(
            "producer: cannot read the outbox",
            "SELECT body, accepted FROM {s}.outbox WHERE event_id = $1",
            &[&event_id.as_str()],
        )?;
        Ok(outbox_records(rows)?.pop())
    }

    fn pending(&mut self, limit: usize) -> Result<Vec<Envelope>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        envelopes(self.conn.rows(
            "producer: cannot read pending events",
            PENDING_SQL,
            &[&limit],
        )?)
    }

    fn oldest_unaccepted(&mut self, now_ms: i64) -> Result<Option<Envelope>, StoreError> {
        let row = self.conn.row(
            "producer: cannot read the oldest unaccepted event",
            PENDING_SQL,
            &[&1i64],
        )?;
        match row {
            Some(row) if row.get::<_, i64>(1) <= now_ms => {
                Ok(Some(stored_envelope(BODY, row.get(0))?))
            }
            _ => Ok(None),
        }
    }

    /// Claims the flows of the round first (see [`PgProducer`]): only the
    /// heads of flows this handle holds are returned.
    fn fair_round(
        &mut self,
        limit: usize,
        skip: &BTreeSet<FlowId>,
        now_ms: i64,
    ) -> Result<Vec<Envelope>, StoreError> {
        self.fair_round_deep(limit, 1, skip, now_ms)
    }

    /// Claims about as many flows as the round's events need, at the events
    /// per flow of this handle's last round (one before its first).
    fn fair_round_deep(
        &mut self,
        limit: usize,
        flow_events_max: usize,
        skip: &BTreeSet<FlowId>,
        now_ms: i64,
    ) -> Result<Vec<Envelope>, StoreError> {
        let per_flow = self.events_per_flow.clamp(1, flow_events_max.max(1));
        let flows_max = limit.div_ceil(per_flow).max(1);
        let skip: Vec<&str> = skip.iter().map(FlowId::as_str).collect();
        let flows_sql = i64::try_from(flows_max).unwrap_or(i64::MAX);
        self.held = self.claim(flows_sql, &skip, now_ms)?;
        if self.held.is_empty() {
            return Ok(Vec::new());
        }
        let flows: Vec<&str> = self.held.keys().map(String::as_str).collect();
        let limit_sql = i64::try_from(limit).unwrap_or(i64::MAX);
        let depth_sql = i64::try_from(flow_events_max.max(1)).unwrap_or(i64::MAX);
        let round = envelopes(self.conn.rows(
            "producer: cannot pick a fair round",
            ROUND_SQL,
            &[&now_ms, &limit_sql, &flows, &depth_sql],
        )?)?;
        let served: HashSet<&str> = round.iter().map(|e| e.flow_id.as_str()).collect();
        self.events_per_flow = round.len().checked_div(served.len()).unwrap_or(1);
        if round.len() < limit {
            let idle: BTreeSet<String> = (self.held.keys())
                .filter(|flow| !served.contains(flow.as_str()))
                .cloned()
                .collect();
            self.refresh_idle_heads(&idle)?;
        }
        Ok(round)
    }

    /// Committed without waiting for the WAL flush: an accepted mark lost
    /// with the server only makes the relay hand the event over again, and
    /// the consumer answers duplicate. Refused whole ([`ErrorKind::LeaseLost`])
    /// when another relay claimed one of the events' flows since this
    /// handle's round.
    fn record_receipts(
        &mut self,
        receipts: &[(EventId, Receipt)],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let ids: Vec<&str> = receipts.iter().map(|(id, _)| id.as_str()).collect();
        let fences = if receipts.iter().any(|(_, r)| *r == Receipt::Conflict) {
            Fences::Locked
        } else {
            Fences::Seen
        };
        self.bookkeeping(&ids, fences, |tx, store_now_ms| {
            record_receipts_in(tx, receipts, store_now_ms.max(now_ms))
        })
    }

    /// Refused whole ([`ErrorKind::LeaseLost`]) when another relay claimed
    /// one of the events' flows since this handle's round.
    fn record_failure(
        &mut self,
        event_ids: &[EventId],
        error: &str,
        now_ms: i64,
        backoff: &Backoff,
    ) -> Result<(), StoreError> {
        let ids: Vec<&str> = event_ids.iter().map(EventId::as_str).collect();
        self.bookkeeping(&ids, Fences::Locked, |tx, _| {
            let mut flows = BTreeSet::new();
            for event_id in event_ids {
                let row = tx.row(
                    "producer: cannot record a delivery failure",
                    "UPDATE {s}.outbox SET attempts = attempts + 1, last_outcome = 'error', last_error = $2
                     WHERE event_id = $1 AND NOT accepted RETURNING flow_id, attempts",
                    &[&event_id.as_str(), &error],
                )?;
                let Some(row) = row else { continue };
                let attempts: i64 = row.get(1);
                let delay_ms = backoff
                    .delay_ms(u32::try_from(attempts).unwrap_or(u32::MAX), fastrand::f64());
                // Strictly later than the failure, whatever the jitter drew.
                let due = now_ms
                    .saturating_add(1)
                    .saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX));
                tx.run(
                    "producer: cannot record a delivery failure",
                    "UPDATE {s}.outbox SET next_attempt_at_ms = $2 WHERE event_id = $1",
                    &[&event_id.as_str(), &due],
                )?;
                flows.insert(row.get::<_, String>(0));
            }
            refresh_heads(tx, &flows, Turn::Keep, None)
        })
    }

    /// Refused ([`ErrorKind::LeaseLost`]) when another relay claimed the
    /// event's flow since this handle's round.
    fn quarantine(
        &mut self,
        event_id: &EventId,
        outcome: &str,
        reason: &str,
        _now_ms: i64,
    ) -> Result<(), StoreError> {
        self.bookkeeping(&[event_id.as_str()], Fences::Locked, |tx, _| {
            let row = tx.row(
                "producer: cannot quarantine an event",
                "UPDATE {s}.outbox SET quarantined = true, quarantine_reason = $2,
                     attempts = attempts + 1, last_outcome = $3, last_error = $2
                 WHERE event_id = $1 AND NOT accepted RETURNING flow_id",
                &[&event_id.as_str(), &reason, &outcome],
            )?;
            let flows = row.map(|row| row.get::<_, String>(0)).into_iter().collect();
            refresh_heads(tx, &flows, Turn::Keep, None)
        })
    }

    fn outbox_entries(
        &mut self,
        quarantined_only: bool,
        limit: usize,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.conn.rows(
            "producer: cannot list the outbox",
            "SELECT body, accepted, quarantined, quarantine_reason, attempts, last_outcome, last_error,
                    next_attempt_at_ms, created_at_ms, accepted_at_ms
             FROM {s}.outbox WHERE (NOT $1 OR quarantined) ORDER BY position LIMIT $2",
            &[&quarantined_only, &limit],
        )?;
        rows.iter().map(outbox_entry).collect()
    }

    fn retry_quarantined(
        &mut self,
        event_id: &EventId,
    ) -> Result<Result<(), RetryRefused>, StoreError> {
        self.write(|ptx| {
            let context = "producer: cannot retry a quarantined event";
            let row = ptx.conn.row(
                context,
                "SELECT flow_id, seq, quarantined FROM {s}.outbox WHERE event_id = $1 FOR UPDATE",
                &[&event_id.as_str()],
            )?;
            let (flow, seq) = match row {
                None => return Ok(Err(RetryRefused::Unknown(event_id.clone()))),
                Some(row) if !row.get::<_, bool>(2) => {
                    return Ok(Err(RetryRefused::NotQuarantined(event_id.clone())))
                }
                Some(row) => (row.get::<_, String>(0), row.get::<_, i64>(1)),
            };
            ptx.conn.run(
                context,
                "UPDATE {s}.outbox SET quarantined = false, quarantine_reason = NULL,
                     next_attempt_at_ms = 0
                 WHERE event_id = $1",
                &[&event_id.as_str()],
            )?;
            refresh_heads(ptx.conn, &BTreeSet::from([flow]), Turn::Keep, Some(seq))?;
            Ok(Ok(()))
        })
    }

    fn producer_status(&mut self, now_ms: i64) -> Result<ProducerStatus, StoreError> {
        let row = self.conn.row(
            "producer: cannot read the status",
            "SELECT count(*), min(o.created_at_ms), count(*) FILTER (WHERE o.quarantined),
                    count(*) FILTER (WHERE NOT o.quarantined AND o.next_attempt_at_ms > $1)
             FROM {s}.outbox_pending p JOIN {s}.outbox o ON o.position = p.position",
            &[&now_ms],
        )?;
        let row = row.expect("an aggregate returns one row");
        let count = |i: usize| row.get::<_, i64>(i).max(0) as u64;
        Ok(ProducerStatus {
            backlog: count(0),
            oldest_pending_created_at_ms: row.get(1),
            quarantined: count(2),
            backing_off: count(3),
        })
    }

    fn prune_outbox(&mut self, cutoff_ms: i64) -> Result<Pruned, StoreError> {
        self.write(|ptx| {
            let rows = ptx.conn.run(
                "producer: cannot prune the outbox",
                "DELETE FROM {s}.outbox WHERE accepted AND accepted_at_ms < $1",
                &[&cutoff_ms],
            )?;
            Ok(Pruned {
                rows,
                fingerprints: 0,
            })
        })
    }

    fn producer_flows_page(
        &mut self,
        prefix: &str,
        after: Option<&FlowId>,
        limit: usize,
    ) -> Result<Vec<ProducerFlow>, StoreError> {
        crate::browse::producer_flows_page(&self.conn, prefix, after, limit)
    }

    fn flow_outbox_entries(
        &mut self,
        flow_id: &FlowId,
        limit: usize,
    ) -> Result<Vec<OutboxEntry>, StoreError> {
        crate::browse::flow_outbox_entries(&self.conn, flow_id, limit)
    }
}

/// `accepted_at` is the later of the relay's clock and the store's. The
/// latest receipt of each event is recorded, every event in one statement
/// (arrays as parameters), and the flows' heads moved in two more.
fn record_receipts_in(
    conn: &PgTx,
    receipts: &[(EventId, Receipt)],
    accepted_at: i64,
) -> Result<(), StoreError> {
    let context = "producer: cannot record receipts";
    let mut latest: BTreeMap<&str, Receipt> = BTreeMap::new();
    for (event_id, receipt) in receipts {
        latest.insert(event_id.as_str(), *receipt);
    }
    let (conflicts, stored): (Vec<_>, Vec<_>) = latest
        .into_iter()
        .partition(|(_, receipt)| *receipt == Receipt::Conflict);
    let mut flows = BTreeSet::new();
    // An event no longer in the outbox was settled and pruned meanwhile:
    // there is nothing left to mark.
    if !conflicts.is_empty() {
        let ids: Vec<&str> = conflicts.iter().map(|(id, _)| *id).collect();
        flows.extend(
            conn.rows(
                context,
                "UPDATE {s}.outbox SET quarantined = NOT accepted,
                     quarantine_reason = CASE WHEN accepted THEN NULL ELSE $2 END,
                     attempts = attempts + 1, last_outcome = 'conflict'
                 WHERE event_id = ANY ($1) RETURNING flow_id",
                &[&ids, &CONFLICT_REASON],
            )?
            .iter()
            .map(|row| row.get::<_, String>(0)),
        );
    }
    if !stored.is_empty() {
        let ids: Vec<&str> = stored.iter().map(|(id, _)| *id).collect();
        let outcomes: Vec<&str> = stored.iter().map(|(_, receipt)| receipt.as_str()).collect();
        flows.extend(
            conn.rows(context, MARK_ACCEPTED_SQL, &[&ids, &outcomes, &accepted_at])?
                .iter()
                .map(|row| row.get::<_, String>(0)),
        );
    }
    refresh_heads(conn, &flows, Turn::Next, None)?;
    crash::point(crash::RELAY_MARK_BEFORE_COMMIT);
    Ok(())
}

pub(crate) fn outbox_entry(row: &Row) -> Result<OutboxEntry, StoreError> {
    Ok(OutboxEntry {
        envelope: stored_envelope(BODY, row.get(0))?,
        accepted: row.get(1),
        quarantined: row.get(2),
        quarantine_reason: row.get(3),
        attempts: u64::try_from(row.get::<_, i64>(4)).unwrap_or(0),
        last_outcome: row.get(5),
        last_error: row.get(6),
        next_attempt_at_ms: row.get(7),
        created_at_ms: row.get(8),
        accepted_at_ms: row.get(9),
    })
}

#[cfg(test)]
mod tests {
    use super::{
        CLAIM_SQL, FENCES_SEEN_SQL, FENCES_SQL, LOCK_HEADS_SQL, MARK_ACCEPTED_SQL, MOVE_HEADS_SQL,
        PENDING_SQL, REFRESH_HEADS_SQL, RELEASE_SQL, ROUND_SQL,
    };
    use crate::plans::{assert_indexed, assert_indexed_by_batch, plans_by_batch, Filled, Side};

    /// `n` copies of `value` as an SQL array as long as the SQL array `of`.
    fn alongside(of: &str, value: &str) -> String {
        format!("array_fill({value}, ARRAY[cardinality({of})])")
    }

    /// The fence check of a round's receipts reads the leases by key
    /// however many events the round had.
    #[test]
    fn the_fence_check_reads_leases_by_key_on_many_flows() {
        for sql in [FENCES_SQL, FENCES_SEEN_SQL] {
            assert_indexed_by_batch(Side::Producer, sql, "text[]", "-1", |events| events);
        }
    }

    /// An append's heads are locked and moved by key however many flows it
    /// names.
    #[test]
    fn an_append_locks_and_moves_heads_by_key_on_many_flows() {
        assert_indexed_by_batch(Side::Producer, LOCK_HEADS_SQL, "text[]", "", |flows| flows);
        let types = "text[], bigint[], bigint[]";
        assert_indexed_by_batch(Side::Producer, MOVE_HEADS_SQL, types, "", |flows| {
            let (firsts, lasts) = (
                alongside(&flows, "2::bigint"),
                alongside(&flows, "3::bigint"),
            );
            format!("{flows}, {firsts}, {lasts}")
        });
    }

    /// A round's events are read, marked accepted and its heads moved by
    /// key however many flows it holds.
    #[test]
    fn a_round_reads_and_marks_by_key_on_many_flows() {
        assert_indexed_by_batch(
            Side::Producer,
            ROUND_SQL,
            "bigint, bigint, text[], bigint",
            "",
            |flows| format!("0, 1000, {flows}, 4"),
        );
        let types = "text[], text[], bigint";
        assert_indexed_by_batch(Side::Producer, MARK_ACCEPTED_SQL, types, "-1", |events| {
            let outcomes = alongside(&events, "'accepted'::text");
            format!("{events}, {outcomes}, 0")
        });
    }

    /// A round's heads are moved by key, in key order (a plain index scan
    /// of the sorted keys, never a bitmap scan in the table's order): an
    /// appender locks its heads in key order too, so neither waits for the
    /// other in a cycle.
    #[test]
    fn a_rounds_heads_are_locked_by_key_in_key_order() {
        let types = "text[], boolean, bigint";
        let plans = plans_by_batch(Side::Producer, REFRESH_HEADS_SQL, types, "", |flows| {
            format!("{flows}, true, NULL")
        });
        for plan in plans {
            assert_indexed(&plan);
            assert!(
                plan.contains("Index Scan using outbox_head_pkey on outbox_head h"),
                "the heads by key:\n{plan}"
            );
            // The lock follows the statement's ORDER BY: the index's order,
            // or a sort.
            assert!(
                plan.contains("LockRows")
                    && (plan.contains("Index Scan using outbox_head_pkey on outbox_head ")
                        || plan.contains("Sort Key: outbox_head.flow_id")),
                "the heads locked in key order:\n{plan}"
            );
        }
    }

    /// A claim walks the due heads in the relay's order on their index,
    /// each lease read on its head (no join, no sort of every due flow),
    /// and locks the flows it claims by key.
    #[test]
    fn a_claim_walks_the_due_heads_in_order() {
        let mut filled = Filled::new("claim");
        let schema = filled.p.clone();
        let types = "bigint, bigint, text[], text, bigint";
        for limit in ["1", "256"] {
            let params = format!("0, {limit}, ARRAY[]::text[], 'me', 10000");
            let plan = filled.plan(&schema, CLAIM_SQL, types, &params);
            assert_indexed(&plan);
            assert!(
                plan.contains("Index Scan using outbox_head_relay on outbox_head h"),
                "the due heads in order:\n{plan}"
            );
            assert!(!plan.contains("Sort"), "no sort:\n{plan}");
            assert!(!plan.contains("Join"), "no join:\n{plan}");
        }
        let plan = filled.plan(
            &schema,
            RELEASE_SQL,
            "text, text[]",
            "'me', ARRAY['f-000001', 'f-000002']",
        );
        assert_indexed(&plan);
    }

    /// The oldest events not yet accepted are read by key on an outbox
    /// where every event is, not by a scan of either table.
    #[test]
    fn the_oldest_unaccepted_events_are_read_by_key() {
        let mut filled = Filled::new("pending");
        let schema = filled.p.clone();
        for limit in ["1", "256"] {
            assert_indexed(&filled.plan(&schema, PENDING_SQL, "bigint", limit));
        }
    }
}
