//! ordo's producer tables and the statements of the relay's bookkeeping.

use crate::conn::Tables;

/// ordo's producer tables, version by version.
pub(crate) const TABLES: Tables = Tables {
    role: ordo_core::Role::Producer,
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
        // 6: the store's identity.
        crate::conn::STORE_ID_MIGRATION,
        // 7: a flow rewound at a seq (a receipt of cause
        // producer_rewound) relays nothing from there on.
        "ALTER TABLE {s}.outbox_head ADD COLUMN IF NOT EXISTS relay_stop_seq bigint;",
        // 8: the destinations, `default` holding the outbox's marks, and
        // the producer's audit log.
        "CREATE TABLE IF NOT EXISTS {s}.destination (
             id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             name              text   COLLATE \"C\" NOT NULL UNIQUE,
             start             text   NOT NULL CHECK (start IN ('start', 'now')),
             consumer_store_id text,
             created_at_ms     bigint NOT NULL
         );
         INSERT INTO {s}.destination (name, start, created_at_ms)
             SELECT 'default', 'start', (extract(epoch FROM clock_timestamp()) * 1000)::bigint
             WHERE NOT EXISTS (SELECT 1 FROM {s}.destination);
         CREATE TABLE IF NOT EXISTS {s}.producer_repair (
             id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             action      text   NOT NULL,
             destination text,
             flow_id     text,
             seq         bigint,
             event_id    text,
             reason      text   NOT NULL,
             by          text   NOT NULL,
             at_ms       bigint NOT NULL
         );",
        // 9: nothing for the producer (the consumer's producer namespaces).
        "SELECT 1;",
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
pub(super) const FENCES_SQL: &str = fences_sql!(" FOR NO KEY UPDATE OF h");

/// [`fences_sql`] without a lock (a lock is a WAL record per lease).
pub(super) const FENCES_SEEN_SQL: &str = fences_sql!("");

/// ordo's producer tables as version 1 created them (`{s}` is the
/// schema). `outbox_head` holds each flow's last seq, the row a writer
/// locks to allocate the next one, and the relay's bookkeeping (its head,
/// when it is due, when it was served; from version 5 the flow's lease).
pub(super) const DDL: &str = "
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

pub use ordo_core::CONFLICT_REASON;

// The batch statements below name their rows by key through
// `= ANY (ARRAY(SELECT unnest($1)))`: the planner cannot count that array,
// so it reads the rows by index whatever the tables' sizes and statistics.
// Handed the array itself, it counts it and, on a table of a few thousand
// rows, scans the whole table once per batch instead (its cost model
// prices each index read as a disk read); as the table grows, every batch
// then costs more.

/// Locks the heads of the flows `$1`, in key order.
pub(super) const LOCK_HEADS_SQL: &str = "SELECT flow_id, last_seq FROM {s}.outbox_head
     WHERE flow_id = ANY (ARRAY(SELECT unnest($1::text[])))
     ORDER BY flow_id FOR UPDATE";

/// Moves the heads of the flows `$1` past the events appended, each only
/// from the seq before its first (`$2`) to its last (`$3`).
pub(super) const MOVE_HEADS_SQL: &str = "UPDATE {s}.outbox_head h SET last_seq = m.last_seq,
         relay_seq = CASE WHEN h.relay_stop_seq IS NULL THEN coalesce(h.relay_seq, m.first_seq)
                          ELSE h.relay_seq END,
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
pub(super) const REFRESH_HEADS_SQL: &str = "WITH locked AS (
         SELECT flow_id FROM {s}.outbox_head
         WHERE flow_id = ANY (ARRAY(SELECT unnest($1::text[])))
         ORDER BY flow_id FOR NO KEY UPDATE)
     UPDATE {s}.outbox_head h SET
         (relay_seq, relay_due_ms) = (SELECT
                 coalesce(max(seq), (SELECT seen.last_seq + 1 FROM {s}.outbox_head seen
                                     WHERE seen.flow_id = h.flow_id
                                       AND seen.last_seq < h.last_seq
                                       AND h.relay_stop_seq IS NULL)),
                 coalesce(max(due), 0)
             FROM (SELECT o.seq AS seq, o.next_attempt_at_ms AS due FROM {s}.outbox o
                   WHERE o.flow_id = h.flow_id AND NOT o.accepted AND NOT o.quarantined
                     AND o.seq >= least(h.relay_seq, $3::bigint)
                     AND o.seq < coalesce(h.relay_stop_seq, 9223372036854775807)
                   ORDER BY o.seq LIMIT 1) AS next),
         relay_turn = CASE WHEN $2 THEN (SELECT nextval('{s}.relay_turn')) ELSE h.relay_turn END
     WHERE h.flow_id = ANY (ARRAY(SELECT flow_id FROM locked))";

/// Up to `$4` events of each of the flows `$3` whose relay head is due at
/// `$1`: the head and the events after it neither accepted nor
/// quarantined, below the flow's stop, in seq order; flows in the relay's order, at most `$2`
/// events in all.
pub(super) const ROUND_SQL: &str = "SELECT e.body FROM {s}.outbox_head h
     CROSS JOIN LATERAL (
         SELECT o.body, o.seq FROM {s}.outbox o
         WHERE o.flow_id = h.flow_id AND o.seq >= h.relay_seq
           AND o.seq < coalesce(h.relay_stop_seq, 9223372036854775807)
           AND NOT o.accepted AND NOT o.quarantined
         ORDER BY o.seq LIMIT $4) AS e
     WHERE h.flow_id = ANY (ARRAY(SELECT unnest($3::text[])))
       AND h.relay_seq IS NOT NULL AND h.relay_due_ms <= $1
     ORDER BY h.relay_turn, h.flow_id, e.seq
     LIMIT $2";

/// Marks the events `$1` accepted with their receipts `$2` at `$3`;
/// returns their flows.
pub(super) const MARK_ACCEPTED_SQL: &str = "WITH marked AS (
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
pub(super) const CLAIM_SQL: &str = concat!(
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
pub(super) const RELEASE_SQL: &str =
    "UPDATE {s}.outbox_head SET lease_owner = NULL, lease_expires_at_ms = 0
     WHERE flow_id = ANY (ARRAY(SELECT flow_id FROM {s}.outbox_head
                                WHERE flow_id = ANY (ARRAY(SELECT unnest($2::text[])))
                                  AND lease_owner = $1
                                FOR NO KEY UPDATE SKIP LOCKED))";

/// [`RELEASE_SQL`] for every flow the owner `$1` holds, found by reading
/// every head (no index names the lease's owner, so that a claim is a
/// HOT update).
pub(super) const RELEASE_ALL_SQL: &str =
    "UPDATE {s}.outbox_head SET lease_owner = NULL, lease_expires_at_ms = 0
     WHERE flow_id = ANY (ARRAY(SELECT flow_id FROM {s}.outbox_head WHERE lease_owner = $1
                                FOR NO KEY UPDATE SKIP LOCKED))";

/// The most flows a handle remembers having claimed, to release them by
/// key; past that, a release reads every head.
pub(super) const CLAIMED_TRACKED_MAX: usize = 65_536;

/// The first `$1` events not yet accepted, oldest first, and when each is
/// due, on the keys of `outbox_pending` and of the outbox.
pub(super) const PENDING_SQL: &str = "SELECT o.body, o.next_attempt_at_ms
     FROM {s}.outbox_pending p JOIN {s}.outbox o ON o.position = p.position
     ORDER BY p.position LIMIT $1";

pub(super) const BODY: &str = "producer: stored outbox body";
pub(super) const LEASE: &str = "producer: relay lease";
pub(super) const BEGIN_SYNCED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";
pub(super) const BEGIN_UNSYNCED: &str =
    "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = off";
