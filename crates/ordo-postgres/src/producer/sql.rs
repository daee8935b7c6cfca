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
        // 10: custody per destination (PROTOCOL.md section 12).
        CUSTODY_MIGRATION,
        // 11: nothing of the producer's (the consumer's effect intents).
        "SELECT 1;",
    ],
};

/// Version 10: custody per destination. Each destination's marks on an
/// outbox row (`custody`, the events it has yet to hold listed in
/// `custody_pending`) and its relay head, bookkeeping and lease of each
/// flow delivered to it (`relay_head`, created with the flow's first
/// event). `default` takes over the marks, heads and leases the outbox and
/// its heads kept; the outbox row keeps `accepted` as its settled mark,
/// with the count of destinations still to hold it
/// (`destinations_waiting`, changed under the row's lock, so that two
/// destinations' relays marking it at once never both leave it unsettled).
const CUSTODY_MIGRATION: &str = "
CREATE TABLE {s}.relay_head (
    flow_id             text   COLLATE \"C\" NOT NULL,
    destination         bigint NOT NULL,
    -- The flow's last seq as its appenders left it (see REFRESH_HEADS_SQL).
    last_seq            bigint NOT NULL DEFAULT 0,
    relay_seq           bigint,
    relay_due_ms        bigint NOT NULL DEFAULT 0,
    relay_turn          bigint NOT NULL DEFAULT 0,
    relay_stop_seq      bigint,
    abandoned_seq       bigint,
    lease_owner         text,
    lease_fence         bigint NOT NULL DEFAULT 0,
    lease_expires_at_ms bigint NOT NULL DEFAULT 0,
    lease_backend_pid   integer,
    PRIMARY KEY (flow_id, destination)
) WITH (fillfactor = 50);
CREATE INDEX relay_head_turn ON {s}.relay_head (destination, relay_turn, flow_id)
    WHERE relay_seq IS NOT NULL;
CREATE TABLE {s}.custody (
    position           bigint  NOT NULL,
    destination        bigint  NOT NULL,
    accepted           boolean NOT NULL DEFAULT false,
    accepted_at_ms     bigint,
    quarantined        boolean NOT NULL DEFAULT false,
    quarantine_reason  text,
    quarantine_detail  text,
    attempts           bigint  NOT NULL DEFAULT 0,
    last_outcome       text,
    last_error         text,
    next_attempt_at_ms bigint  NOT NULL DEFAULT 0,
    abandoned          boolean NOT NULL DEFAULT false,
    PRIMARY KEY (position, destination),
    CHECK (NOT (accepted AND quarantined))
) WITH (fillfactor = 50);
CREATE TABLE {s}.custody_pending (
    destination bigint NOT NULL,
    position    bigint NOT NULL,
    PRIMARY KEY (destination, position)
);
ALTER TABLE {s}.outbox ADD COLUMN destinations_waiting bigint NOT NULL DEFAULT 0
    CHECK (destinations_waiting >= 0);
UPDATE {s}.outbox SET destinations_waiting = 1 WHERE NOT accepted;
INSERT INTO {s}.relay_head (flow_id, destination, last_seq, relay_seq, relay_due_ms, relay_turn,
        relay_stop_seq, lease_owner, lease_fence, lease_expires_at_ms, lease_backend_pid)
    SELECT h.flow_id, d.id, h.last_seq, h.relay_seq, h.relay_due_ms, h.relay_turn, h.relay_stop_seq,
           h.lease_owner, h.lease_fence, h.lease_expires_at_ms, h.lease_backend_pid
    FROM {s}.outbox_head h CROSS JOIN {s}.destination d
    WHERE d.name = 'default' AND h.last_seq >= 1;
INSERT INTO {s}.custody (position, destination, accepted, accepted_at_ms, quarantined,
        quarantine_reason, quarantine_detail, attempts, last_outcome, last_error, next_attempt_at_ms)
    SELECT o.position, d.id, o.accepted, o.accepted_at_ms, o.quarantined,
           -- The code: the last outcome, unless a delivery after the quarantine
           -- (the first-pending policy hands over quarantined rows) failed;
           -- then the text's, which begins with it.
           CASE WHEN o.quarantined THEN CASE
               WHEN o.last_outcome IN ('conflict', 'producer_rewound', 'too_large',
                                       'rejected_by_consumer') THEN o.last_outcome
               WHEN split_part(o.quarantine_reason, ':', 1)
                   IN ('producer_rewound', 'too_large', 'rejected_by_consumer')
                   THEN split_part(o.quarantine_reason, ':', 1)
               ELSE 'conflict' END END,
           CASE WHEN o.quarantined THEN o.quarantine_reason END,
           o.attempts, o.last_outcome, o.last_error, o.next_attempt_at_ms
    FROM {s}.outbox o CROSS JOIN {s}.destination d WHERE d.name = 'default';
INSERT INTO {s}.custody_pending (destination, position)
    SELECT d.id, p.position FROM {s}.outbox_pending p CROSS JOIN {s}.destination d
    WHERE d.name = 'default';
DROP TABLE {s}.outbox_pending;
DROP INDEX {s}.outbox_head_relay;
ALTER TABLE {s}.outbox_head DROP COLUMN relay_seq, DROP COLUMN relay_due_ms,
    DROP COLUMN relay_turn, DROP COLUMN relay_stop_seq, DROP COLUMN lease_owner,
    DROP COLUMN lease_fence, DROP COLUMN lease_expires_at_ms, DROP COLUMN lease_backend_pid;
ALTER TABLE {s}.outbox DROP COLUMN quarantined, DROP COLUMN quarantine_reason,
    DROP COLUMN attempts, DROP COLUMN last_outcome, DROP COLUMN last_error,
    DROP COLUMN next_attempt_at_ms;
";

/// The relay heads of one destination (`$2`) of the flows of some events
/// (`check_fences`), with their leases: by their primary key whatever the
/// planner guesses of the tables (`ARRAY(...)`; a join was planned as a
/// scan of every lease).
macro_rules! fences_sql {
    ($lock:literal) => {
        concat!(
            "SELECT h.flow_id, h.lease_owner, h.lease_fence,
                 h.lease_expires_at_ms > (extract(epoch FROM clock_timestamp()) * 1000)::bigint
             FROM {s}.relay_head h
             WHERE h.flow_id = ANY (ARRAY(
                 SELECT o.flow_id FROM {s}.outbox o WHERE o.event_id = ANY ($1)))
               AND h.destination = $2
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
/// locks to allocate the next one; up to version 9 also the relay's
/// bookkeeping (its head, when it is due, when it was served; from version
/// 5 the flow's lease), which version 10 moved to `relay_head`, one per
/// destination.
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
pub(super) const MOVE_HEADS_SQL: &str = "UPDATE {s}.outbox_head h SET last_seq = m.last_seq
     FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS m(flow_id, first_seq, last_seq)
     WHERE h.flow_id = ANY (ARRAY(SELECT unnest($1::text[])))
       AND h.flow_id = m.flow_id AND h.last_seq = m.first_seq - 1";

/// Hands the rows just appended (positions `$4`) to the destinations of
/// their flows (`$1`, each from its first new seq `$2` to its last `$3`),
/// in the appender's transaction: a flow begun here becomes every
/// destination's (a relay head each, decided in this transaction, which
/// `destination add` waits for or makes wait, see `lock_for_membership`);
/// a flow's other heads not abandoned move past the new events (`$heads`
/// names them: see [`HAND_SQL`] and [`HAND_ONE_SQL`]); each row gets a
/// mark per destination waiting for it, listed pending. Returns each flow
/// with the number of destinations each of its rows was given (a flow
/// given none is not returned): the rows were inserted counting every
/// destination ([`INSERT_OUTBOX_SQL`]), and only a flow whose count
/// differs has its rows written again ([`WAITING_SQL`]), so that an append
/// writes one version of each outbox row.
macro_rules! hand_sql {
    ($locked:literal, $heads:literal) => {
        concat!(
            "WITH m AS (
                 SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])
                     AS m(flow_id, first_seq, last_seq)),",
            $locked,
            "
             moved AS (
                 UPDATE {s}.relay_head h SET last_seq = m.last_seq,
                     relay_seq = CASE WHEN h.relay_stop_seq IS NULL
                                      THEN coalesce(h.relay_seq, m.first_seq)
                                      ELSE h.relay_seq END,
                     relay_due_ms = CASE WHEN h.relay_seq IS NULL THEN 0 ELSE h.relay_due_ms END
                 FROM m
                 WHERE h.flow_id = ANY (ARRAY(",
            $heads,
            "))
                   AND h.flow_id = m.flow_id AND h.abandoned_seq IS NULL
                 RETURNING h.flow_id, h.destination),
             created AS (
                 INSERT INTO {s}.relay_head (flow_id, destination, last_seq, relay_seq)
                 SELECT m.flow_id, d.id, m.last_seq, 1 FROM m CROSS JOIN {s}.destination d
                 WHERE m.first_seq = 1
                 RETURNING flow_id, destination),
             given AS (
                 INSERT INTO {s}.custody (position, destination)
                 SELECT o.position, w.destination FROM {s}.outbox o
                 JOIN (SELECT flow_id, destination FROM moved
                       UNION ALL SELECT flow_id, destination FROM created) AS w
                     ON w.flow_id = o.flow_id
                 WHERE o.position = ANY (ARRAY(SELECT unnest($4::bigint[])))
                 RETURNING position, destination),
             listed AS (
                 INSERT INTO {s}.custody_pending (destination, position)
                 SELECT destination, position FROM given)
             SELECT w.flow_id, count(*) FROM (SELECT flow_id FROM moved
                                              UNION ALL SELECT flow_id FROM created) AS w
             GROUP BY w.flow_id"
        )
    };
}

/// [`hand_sql`] for several flows: their heads are locked first, in key
/// order as relays lock them, whatever order the server reads them in.
pub(super) const HAND_SQL: &str = hand_sql!(
    "
     locked AS (
         SELECT h.flow_id, h.destination FROM {s}.relay_head h
         WHERE h.flow_id = ANY (ARRAY(SELECT flow_id FROM m WHERE first_seq > 1))
           AND h.abandoned_seq IS NULL
         ORDER BY h.flow_id, h.destination FOR NO KEY UPDATE),",
    "SELECT flow_id FROM locked"
);

/// [`hand_sql`] for one flow: its heads are each locked as they are
/// updated, without a locking read first. The order does not matter: a
/// relay's transaction takes one destination's heads, so it never holds
/// one of the flow's heads while it waits for another.
pub(super) const HAND_ONE_SQL: &str = hand_sql!("", "SELECT flow_id FROM m WHERE first_seq > 1");

/// Inserts a batch of envelopes (the columns of `EnvelopeColumns`, `$1`
/// to `$6`) into the outbox at `$7`, each waiting for every destination
/// (settled at once when there is none); returns each inserted row's flow,
/// seq, position and count of destinations waiting. Only the event id
/// arbitrates: the heads are locked and each seq is past its head, so no
/// (flow, seq) is taken, and the position is new (`ON CONFLICT` probes
/// each arbiter index before inserting).
pub(super) const INSERT_OUTBOX_SQL: &str = "INSERT INTO {s}.outbox (event_id, flow_id, seq,
         schema_version, type, body, created_at_ms, destinations_waiting, accepted, accepted_at_ms)
     SELECT e.event_id, e.flow_id, e.seq, e.schema_version, e.type, e.body, $7::bigint,
         d.n, d.n = 0, CASE WHEN d.n = 0 THEN $7::bigint END
     FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::text[])
          WITH ORDINALITY AS e(event_id, flow_id, seq, schema_version, type, body, i)
     CROSS JOIN (SELECT count(*) AS n FROM {s}.destination) AS d
     ORDER BY e.i
     ON CONFLICT (event_id) DO NOTHING RETURNING flow_id, seq, position, destinations_waiting";

/// Sets the count of destinations waiting for each outbox row `$1` to `$2`
/// (from [`HAND_SQL`], where it differs from the count the row was
/// inserted with), settling at `$3` those none waits for.
pub(super) const WAITING_SQL: &str = "UPDATE {s}.outbox o SET destinations_waiting = w.n,
         accepted = w.n = 0, accepted_at_ms = CASE WHEN w.n = 0 THEN $3::bigint END
     FROM unnest($1::bigint[], $2::bigint[]) AS w(position, n)
     WHERE o.position = ANY (ARRAY(SELECT unnest($1::bigint[]))) AND o.position = w.position";

/// Sets the relay heads of the flows `$1` at the destination `$4` to their
/// first event to relay there, and moves them to the back of the relay's
/// order when `$2`. Run only in a transaction begun with [`KEY_ORDER`].
///
/// The heads are read by key from the primary key's index, which yields
/// them in key order (a btree scan for an array of keys sorts them): each
/// is locked as it is updated, in the order writers lock them, without a
/// locking read first (a WAL record and a read of each head more).
/// [`KEY_ORDER`] leaves the planner no other way to read them, whatever
/// the session's settings: an update takes each row in the order the
/// server reads them (storage order under a sequential or bitmap scan),
/// and a writer holding one head while it asks for the next would wait
/// for this statement while it waits for the writer (a deadlock).
///
/// A writer appending to one of the flows holds its heads locked until it
/// commits; the update then waits for it and takes the head the writer
/// left (`h`, read again after the wait), while the subqueries still read
/// the statement's snapshot, without the writer's events. `seen` is the
/// head in that snapshot, read only when the snapshot has nothing left to
/// relay: when `h.last_seq` is past its `last_seq`, the first event to
/// relay is the writer's first, `seen.last_seq + 1`.
pub(super) const REFRESH_HEADS_SQL: &str = "UPDATE {s}.relay_head h SET
         (relay_seq, relay_due_ms) = (SELECT
                 coalesce(max(seq), (SELECT seen.last_seq + 1 FROM {s}.relay_head seen
                                     WHERE seen.flow_id = h.flow_id
                                       AND seen.destination = h.destination
                                       AND seen.last_seq < h.last_seq
                                       AND h.relay_stop_seq IS NULL
                                       AND h.abandoned_seq IS NULL)),
                 coalesce(max(due), 0)
             FROM (SELECT o.seq AS seq, c.next_attempt_at_ms AS due FROM {s}.outbox o
                   JOIN {s}.custody c ON c.position = o.position AND c.destination = h.destination
                   WHERE o.flow_id = h.flow_id
                     AND NOT c.accepted AND NOT c.quarantined AND NOT c.abandoned
                     AND o.seq >= least(h.relay_seq, $3::bigint)
                     AND o.seq < coalesce(h.relay_stop_seq, 9223372036854775807)
                   ORDER BY o.seq LIMIT 1) AS next),
         relay_turn = CASE WHEN $2 THEN (SELECT nextval('{s}.relay_turn')) ELSE h.relay_turn END
     WHERE h.flow_id = ANY (ARRAY(SELECT unnest($1::text[]))) AND h.destination = $4";

/// Up to `$4` events of each of the flows `$3` whose relay head at the
/// destination `$5` is due at `$1`: the head and the events after it
/// neither accepted, quarantined nor abandoned there, below the flow's
/// stop, in seq order; flows in the relay's order, at most `$2` events in
/// all.
pub(super) const ROUND_SQL: &str = "SELECT e.body FROM {s}.relay_head h
     CROSS JOIN LATERAL (
         SELECT o.body, o.seq FROM {s}.outbox o
         JOIN {s}.custody c ON c.position = o.position AND c.destination = h.destination
         WHERE o.flow_id = h.flow_id AND o.seq >= h.relay_seq
           AND o.seq < coalesce(h.relay_stop_seq, 9223372036854775807)
           AND NOT c.accepted AND NOT c.quarantined AND NOT c.abandoned
         ORDER BY o.seq LIMIT $4) AS e
     WHERE h.flow_id = ANY (ARRAY(SELECT unnest($3::text[]))) AND h.destination = $5
       AND h.relay_seq IS NOT NULL AND h.relay_due_ms <= $1
     ORDER BY h.relay_turn, h.flow_id, e.seq
     LIMIT $2";

/// Lowers the count of destinations waiting for each outbox row listed
/// (by `position`, once per mark lifted) in the CTE `$held`, and settles
/// at `$at` the rows it brings to none. Under each row's lock: two
/// destinations' relays lifting marks of one row at once count both.
macro_rules! settle_sql {
    ($held:literal, $at:literal) => {
        concat!(
            "UPDATE {s}.outbox o SET destinations_waiting = o.destinations_waiting - k.n,
                 accepted = o.destinations_waiting = k.n,
                 accepted_at_ms = CASE WHEN o.destinations_waiting = k.n
                                       THEN coalesce(o.accepted_at_ms, ",
            $at,
            ") ELSE o.accepted_at_ms END
             FROM (SELECT position, count(*) AS n FROM ",
            $held,
            " GROUP BY position) AS k
             WHERE o.position = ANY (ARRAY(SELECT position FROM ",
            $held,
            ")) AND o.position = k.position"
        )
    };
}
pub(super) use settle_sql;

/// Marks the events `$1` held by the destination `$4` with their receipts
/// `$2` at `$3`; settles each row no other destination waits for (the
/// count of the waiting changed under the row's lock); returns the
/// marked events' flows.
pub(super) const MARK_ACCEPTED_SQL: &str = concat!(
    "WITH marked AS (
         UPDATE {s}.custody c SET accepted = true, quarantined = false,
             quarantine_reason = NULL, quarantine_detail = NULL,
             accepted_at_ms = coalesce(c.accepted_at_ms, $3),
             attempts = c.attempts + 1, last_outcome = r.outcome, last_error = NULL
         FROM {s}.outbox o, unnest($1::text[], $2::text[]) AS r(event_id, outcome)
         WHERE o.event_id = ANY (ARRAY(SELECT unnest($1::text[])))
           AND o.event_id = r.event_id
           AND c.position = o.position AND c.destination = $4
         RETURNING c.position, o.flow_id),
     held AS (
         DELETE FROM {s}.custody_pending p
         WHERE p.destination = $4 AND p.position = ANY (ARRAY(SELECT position FROM marked))
         RETURNING p.position),
     settled AS (",
    settle_sql!("held", "$3"),
    ")
     SELECT flow_id FROM marked"
);

/// Whether the lease on a head `h` is free for the claimer `$4`: unheld,
/// its own, expired, or held by a server session that is gone.
macro_rules! claimable {
    () => {
        "(h.lease_owner IS NULL OR h.lease_owner = $4
              OR h.lease_expires_at_ms <= (SELECT ms FROM now)
              OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = h.lease_backend_pid))"
    };
}

/// The claim of a round ([`PgProducer::claim`]) at the destination `$6`:
/// up to `$2` flows due at `$1`, none of `$3`, in the relay's order, for
/// the owner `$4` with leases of `$5` ms. `pick` walks the due heads
/// without locking them, each with its lease on the same row; a flow the
/// claimer's session holds with more than half its lease left is `kept` as
/// it is; the others are locked, skipping those another transaction holds
/// (a relay's claim or bookkeeping, or a writer appending to the flow),
/// and claimed if still free under the lock. The heads to claim go by
/// primary key through `= ANY (ARRAY(...))`, never a scan of every head.
pub(super) const CLAIM_SQL: &str = concat!(
    "WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms),
     pick AS (
         SELECT h.flow_id, h.lease_fence AS fence,
                coalesce(h.lease_owner = $4 AND h.lease_backend_pid = pg_backend_pid()
                         AND h.lease_expires_at_ms > (SELECT ms FROM now) + $5::bigint / 2,
                         false) AS kept
         FROM {s}.relay_head h
         WHERE h.destination = $6 AND h.relay_seq IS NOT NULL AND h.relay_due_ms <= $1
           AND NOT (h.flow_id = ANY ($3))
           AND ",
    claimable!(),
    "
         ORDER BY h.relay_turn, h.flow_id
         LIMIT $2),
     locked AS (
         SELECT h.flow_id FROM {s}.relay_head h
         WHERE h.flow_id = ANY (ARRAY(SELECT flow_id FROM pick WHERE NOT kept))
           AND h.destination = $6
           AND ",
    claimable!(),
    "
         FOR NO KEY UPDATE OF h SKIP LOCKED),
     claimed AS (
         UPDATE {s}.relay_head h SET
             lease_fence = CASE WHEN h.lease_owner = $4 AND h.lease_expires_at_ms > now.ms
                                THEN h.lease_fence ELSE h.lease_fence + 1 END,
             lease_owner = $4,
             lease_backend_pid = pg_backend_pid(),
             lease_expires_at_ms = now.ms + $5
         FROM now WHERE h.flow_id = ANY (ARRAY(SELECT flow_id FROM locked)) AND h.destination = $6
         RETURNING h.flow_id, h.lease_fence)
     SELECT flow_id, fence FROM pick WHERE kept
     UNION ALL
     SELECT flow_id, lease_fence FROM claimed"
);

/// Releases the leases at the destination `$3` of the flows `$2` that the
/// owner `$1` holds, passing by the heads another transaction has locked.
pub(super) const RELEASE_SQL: &str =
    "UPDATE {s}.relay_head SET lease_owner = NULL, lease_expires_at_ms = 0
     WHERE flow_id = ANY (ARRAY(SELECT flow_id FROM {s}.relay_head
                                WHERE flow_id = ANY (ARRAY(SELECT unnest($2::text[])))
                                  AND destination = $3 AND lease_owner = $1
                                FOR NO KEY UPDATE SKIP LOCKED))
       AND destination = $3";

/// [`RELEASE_SQL`] for every flow the owner `$1` holds at the destination
/// `$3`, found by reading every head of it (no index names the lease's
/// owner, so that a claim is a HOT update).
pub(super) const RELEASE_ALL_SQL: &str =
    "UPDATE {s}.relay_head SET lease_owner = NULL, lease_expires_at_ms = 0
     WHERE flow_id = ANY (ARRAY(SELECT flow_id FROM {s}.relay_head
                                WHERE destination = $2 AND lease_owner = $1
                                FOR NO KEY UPDATE SKIP LOCKED))
       AND destination = $2";

/// The most flows a handle remembers having claimed, to release them by
/// key; past that, a release reads every head.
pub(super) const CLAIMED_TRACKED_MAX: usize = 65_536;

/// The first `$1` events the destination `$2` has yet to hold, oldest
/// first, and when each is due there, on the keys of `custody_pending`,
/// `custody` and the outbox.
pub(super) const PENDING_SQL: &str = "SELECT o.body, c.next_attempt_at_ms
     FROM {s}.custody_pending p
     JOIN {s}.custody c ON c.position = p.position AND c.destination = p.destination
     JOIN {s}.outbox o ON o.position = p.position
     WHERE p.destination = $2
     ORDER BY p.position LIMIT $1";

/// Whether the outbox row `o` is held by every destination its flow is
/// delivered to: settled, and no destination abandoned it (an abandoned
/// destination settles a row without holding it).
macro_rules! held_everywhere_sql {
    () => {
        "(o.accepted AND NOT EXISTS (SELECT 1 FROM {s}.custody c
                                     WHERE c.position = o.position AND c.abandoned)
          AND NOT EXISTS (SELECT 1 FROM {s}.relay_head h
                          WHERE h.flow_id = o.flow_id AND h.abandoned_seq <= o.seq))"
    };
}
pub(super) use held_everywhere_sql;

pub(super) const BODY: &str = "producer: stored outbox body";
pub(super) const LEASE: &str = "producer: relay lease";
pub(super) const BEGIN_SYNCED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";
pub(super) const BEGIN_UNSYNCED: &str =
    "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = off";

/// Leaves the planner, until the transaction ends, no other way to read a
/// table by key than its index, which yields the rows in key order (see
/// [`REFRESH_HEADS_SQL`]). Every statement of ordo's transactions that set
/// it reads by key.
pub(super) const KEY_ORDER: &str = "SET LOCAL enable_seqscan = off;
     SET LOCAL enable_bitmapscan = off; SET LOCAL enable_indexscan = on";

/// [`BEGIN_UNSYNCED`] with [`KEY_ORDER`]: the relay's bookkeeping.
pub(super) const BEGIN_BOOKKEEPING: &str = concat!(
    "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = off; ",
    "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; ",
    "SET LOCAL enable_indexscan = on"
);
