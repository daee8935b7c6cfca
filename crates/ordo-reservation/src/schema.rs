//! The reservation domain's tables, as one [`Schema`] per side carrying
//! the SQL of both dialects, so that one open specification creates or
//! migrates a store of either backend.

use ordo_core::domain::Schema;

use crate::sqlite::DOMAIN;

/// The producer's table: one row per flow that has advanced. Its last seq
/// is the outbox's.
const SQLITE_FLOW_TABLE: &str = "CREATE TABLE IF NOT EXISTS flow (
    flow_id  TEXT    PRIMARY KEY,
    state    TEXT    NOT NULL,
    quantity INTEGER NOT NULL
) WITHOUT ROWID;";

/// The consumer's tables: the projection of each flow, and one effect per
/// applied event. `IF NOT EXISTS`, because stores of the first release
/// already hold them.
const SQLITE_PROJECTION_TABLES: &str = "CREATE TABLE IF NOT EXISTS projection (
    flow_id     TEXT    PRIMARY KEY,
    state       TEXT    NOT NULL,
    quantity    INTEGER NOT NULL,
    applied_seq INTEGER NOT NULL
) WITHOUT ROWID;
-- One effect per (flow_id, seq): a second effect for the same seq cannot
-- commit.
CREATE TABLE IF NOT EXISTS effect (
    flow_id  TEXT    NOT NULL,
    seq      INTEGER NOT NULL,
    event_id TEXT    NOT NULL,
    PRIMARY KEY (flow_id, seq)
) WITHOUT ROWID;";

/// The producer's table: one row per flow that has advanced.
const PG_FLOW_TABLE: &str = "CREATE TABLE flow (
    flow_id  text   COLLATE \"C\" PRIMARY KEY,
    state    text   NOT NULL,
    quantity bigint NOT NULL
);";

/// The consumer's tables: the projection of each flow, and one effect per
/// applied event (a second effect for the same seq cannot commit).
const PG_PROJECTION_TABLES: &str = "CREATE TABLE projection (
    flow_id     text   COLLATE \"C\" PRIMARY KEY,
    state       text   NOT NULL,
    quantity    bigint NOT NULL,
    applied_seq bigint NOT NULL
);
CREATE TABLE effect (
    flow_id  text   COLLATE \"C\" NOT NULL,
    seq      bigint NOT NULL,
    event_id text   NOT NULL,
    PRIMARY KEY (flow_id, seq)
);";

/// Version 2 of the producer's table: half of each page left free, so
/// that a flow's next state is written on its page (a HOT update: no new
/// entry in the key's index).
const PG_FLOW_ROOM: &str = "ALTER TABLE flow SET (fillfactor = 50);";

/// Version 2 of the consumer's tables: the same room for the projections.
const PG_PROJECTION_ROOM: &str = "ALTER TABLE projection SET (fillfactor = 50);";

/// Version 2 on SQLite: nothing (a page's free room is PostgreSQL's).
const SQLITE_NOTHING: &str = "";

/// Version 3 of the consumer's tables on SQLite: each projection and
/// effect in the namespace of the producer whose flow it is (PROTOCOL.md
/// section 12), the earlier rows the default producer's (rebuilt: SQLite
/// cannot change a primary key in place).
const SQLITE_PROJECTION_BY_PRODUCER: &str = "
ALTER TABLE projection RENAME TO projection_v2;
ALTER TABLE effect RENAME TO effect_v2;
CREATE TABLE projection (
    flow_id     TEXT    NOT NULL,
    producer    TEXT    NOT NULL,
    state       TEXT    NOT NULL,
    quantity    INTEGER NOT NULL,
    applied_seq INTEGER NOT NULL,
    PRIMARY KEY (flow_id, producer)
) WITHOUT ROWID;
CREATE TABLE effect (
    flow_id  TEXT    NOT NULL,
    producer TEXT    NOT NULL,
    seq      INTEGER NOT NULL,
    event_id TEXT    NOT NULL,
    PRIMARY KEY (flow_id, producer, seq)
) WITHOUT ROWID;
INSERT INTO projection SELECT flow_id, 'default', state, quantity, applied_seq FROM projection_v2;
INSERT INTO effect SELECT flow_id, 'default', seq, event_id FROM effect_v2;
DROP TABLE projection_v2;
DROP TABLE effect_v2;";

/// Version 3 of the consumer's tables on PostgreSQL: the same namespaces.
const PG_PROJECTION_BY_PRODUCER: &str = "
ALTER TABLE projection ADD COLUMN producer text COLLATE \"C\" NOT NULL DEFAULT 'default';
ALTER TABLE projection ALTER COLUMN producer DROP DEFAULT;
ALTER TABLE projection DROP CONSTRAINT projection_pkey;
ALTER TABLE projection ADD PRIMARY KEY (flow_id, producer);
ALTER TABLE effect ADD COLUMN producer text COLLATE \"C\" NOT NULL DEFAULT 'default';
ALTER TABLE effect ALTER COLUMN producer DROP DEFAULT;
ALTER TABLE effect DROP CONSTRAINT effect_pkey;
ALTER TABLE effect ADD PRIMARY KEY (flow_id, producer, seq);";

/// The producer side's schema, on either backend.
pub fn producer_schema() -> Schema {
    Schema::new(DOMAIN)
        .expect("the domain name is valid")
        .migration_each(SQLITE_FLOW_TABLE, PG_FLOW_TABLE)
        .migration_each(SQLITE_NOTHING, PG_FLOW_ROOM)
}

/// The consumer side's schema, on either backend.
pub fn consumer_schema() -> Schema {
    Schema::new(DOMAIN)
        .expect("the domain name is valid")
        .migration_each(SQLITE_PROJECTION_TABLES, PG_PROJECTION_TABLES)
        .migration_each(SQLITE_NOTHING, PG_PROJECTION_ROOM)
        .migration_each(SQLITE_PROJECTION_BY_PRODUCER, PG_PROJECTION_BY_PRODUCER)
}
