//! The consumer store: the inbox, the per-flow apply cursor, the prune
//! fingerprints and the repair log in one SQLite file, beside the
//! application's own tables.
//!
//! - `schema`: ordo's consumer tables and how their rows are read;
//! - `receive`: durable custody, dedup and conflict detection;
//! - `apply`: the application's handler run in order per flow;
//! - `ops`: listing, repairs, status and pruning.
//!
//! Invariant: this module never reads or writes the application's tables;
//! only the handler does, through the transaction it is handed.

mod apply;
pub use apply::ApplyTx;
mod browse;
mod effects;
pub(crate) mod ops;
mod receive;
pub(crate) mod schema;

use std::path::Path;
use std::sync::Arc;

use ordo_core::{Clock, Envelope, InboxRecord, StoreError};
use rusqlite::Connection;

use crate::conn::{sql_error, OpenOptions, Opened, Role};
use crate::watch::DataVersion;

/// The consumer's SQLite file: the inbox (every received event, durably,
/// with its status), the per-flow apply cursor, and the application's own
/// tables (declared by its [`Schema`](crate::Schema), written by its [`ApplyHandler`](ordo_core::ApplyHandler)).
///
/// Every write runs in a `BEGIN IMMEDIATE` transaction on a file in WAL mode
/// with `synchronous=FULL`.
pub struct ConsumerDb {
    conn: Connection,
    domain: String,
    store_id: ordo_core::StoreId,
    wake: ordo_core::Signal,
    data_version: DataVersion,
    clock: Arc<dyn Clock>,
    commits: u64,
}

impl ConsumerDb {
    crate::conn::open_constructors!(ConsumerDb, Role::Consumer, schema::TABLES);

    fn from_opened(opened: Opened, clock: Arc<dyn Clock>, _: &OpenOptions) -> ConsumerDb {
        ConsumerDb {
            conn: opened.conn,
            domain: opened.domain,
            store_id: opened.store_id,
            wake: opened.wake,
            data_version: DataVersion::default(),
            clock,
            commits: 0,
        }
    }
}

/// Every inbox row, ordered by flow id then seq, read through `conn` (for
/// reads inside [`ConsumerDb::read`] beside the application's own tables).
pub fn read_inbox(conn: &Connection) -> Result<Vec<InboxRecord>, StoreError> {
    schema::read_inbox(conn)
}

// The signal is raised by every commit of this process that stores a new
// event in this file; another process's commit (a receive by `ordo serve`)
// is seen by the file's `data_version`.
ordo_core::run_store_impl!(ConsumerDb, |db|
    signal: db.wake.clone(),
    changed_elsewhere: db.data_version.changed(&db.conn),
);

impl ordo_core::RunConsumer for ConsumerDb {
    fn received_at_ms(tx: &Connection, event: &Envelope) -> Result<Option<i64>, StoreError> {
        use rusqlite::OptionalExtension;
        tx.prepare_cached(
            "SELECT received_at_ms FROM inbox WHERE flow_id = ?1 AND producer = ?3 AND seq = ?2",
        )
        .and_then(|mut statement| {
            statement
                .query_row(
                    rusqlite::params![
                        event.flow_id.as_str(),
                        event.seq.get(),
                        event.producer.as_str()
                    ],
                    |row| row.get(0),
                )
                .optional()
        })
        .map_err(|e| sql_error("consumer: cannot read when an event was received", e))
    }
}

ordo_core::consumer_store_impls! {
    store: ConsumerDb, tx: Connection, inbox: schema::read_inbox,
    receive: receive, ops: ops, browse: browse, apply: apply,
}
