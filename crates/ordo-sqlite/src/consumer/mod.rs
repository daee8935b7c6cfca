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
mod browse;
pub(crate) mod ops;
mod receive;
pub(crate) mod schema;

use std::path::Path;
use std::sync::Arc;

use ordo_core::ops::{ConsumerStatus, InboxEntry, Pruned, RepairRecord, SkipRefused, SkipRequest};
use ordo_core::{
    ApplyHandler, BlockCode, Clock, ConsumerOps, ConsumerStore, Drain, Envelope, EventId, FlowId,
    InboxRecord, Receipt, Receive, Step, StoreError, SystemClock,
};
use rusqlite::Connection;

use crate::conn::{open, sql_error, OpenOptions, Role, Want};
use crate::domain::Schema;
use crate::watch::{signal_for, DataVersion};

/// The consumer's SQLite file: the inbox (every received event, durably,
/// with its status), the per-flow apply cursor, and the application's own
/// tables (declared by its [`Schema`], written by its [`ApplyHandler`]).
///
/// Every write runs in a `BEGIN IMMEDIATE` transaction on a file in WAL mode
/// with `synchronous=FULL`.
pub struct ConsumerDb {
    conn: Connection,
    domain: String,
    wake: ordo_core::Signal,
    data_version: DataVersion,
    clock: Arc<dyn Clock>,
    commits: u64,
}

impl ConsumerDb {
    crate::conn::open_constructors!(ConsumerDb, Role::Consumer);

    fn open_inner(
        path: &Path,
        want: Want<'_>,
        clock: Arc<dyn Clock>,
        options: &OpenOptions,
    ) -> Result<ConsumerDb, StoreError> {
        let conn = open(path, Role::Consumer, &schema::TABLES, want, options)?;
        let domain = crate::conn::read_domain(&conn, path)?;
        Ok(ConsumerDb {
            conn,
            domain,
            wake: signal_for(path),
            data_version: DataVersion::default(),
            clock,
            commits: 0,
        })
    }

    /// The domain that owns this store.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The clock this store stamps its writes with.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    /// The underlying connection, for reading pragmas and for the caller's
    /// own reads.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// How many write transactions this handle has committed.
    pub fn commits(&self) -> u64 {
        self.commits
    }

    /// Runs `f` inside one read transaction, so that everything it reads
    /// (the inbox, the application's tables) is one consistent snapshot.
    pub fn read<T>(
        &mut self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let tx = self
            .conn
            .transaction()
            .map_err(|e| sql_error("consumer: cannot begin a read transaction", e))?;
        f(&tx)
    }
}

/// Every inbox row, ordered by flow id then seq, read through `conn` (for
/// reads inside [`ConsumerDb::read`] beside the application's own tables).
pub fn read_inbox(conn: &Connection) -> Result<Vec<InboxRecord>, StoreError> {
    schema::read_inbox(conn)
}

impl ordo_core::RunStore for ConsumerDb {
    fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    /// Raised by every commit of this process that stores a new event in
    /// this file.
    fn signal(&self) -> ordo_core::Signal {
        self.wake.clone()
    }

    /// Another process's commit to this file (a receive by `ordo serve`),
    /// seen by the file's `data_version`.
    fn changed_elsewhere(&mut self) -> Result<bool, StoreError> {
        self.data_version.changed(&self.conn)
    }
}

impl ordo_core::RunConsumer for ConsumerDb {
    fn received_at_ms(tx: &Connection, event: &Envelope) -> Result<Option<i64>, StoreError> {
        use rusqlite::OptionalExtension;
        tx.prepare_cached("SELECT received_at_ms FROM inbox WHERE flow_id = ?1 AND seq = ?2")
            .and_then(|mut statement| {
                statement
                    .query_row(
                        rusqlite::params![event.flow_id.as_str(), event.seq.get()],
                        |row| row.get(0),
                    )
                    .optional()
            })
            .map_err(|e| sql_error("consumer: cannot read when an event was received", e))
    }
}

impl Receive for ConsumerDb {
    fn receive_batch(&mut self, envelopes: &[Envelope]) -> Result<Vec<Receipt>, StoreError> {
        receive::receive_batch(self, envelopes)
    }
}

impl ConsumerOps for ConsumerDb {
    fn domain(&self) -> &str {
        ConsumerDb::domain(self)
    }

    fn inbox(&mut self) -> Result<Vec<InboxRecord>, StoreError> {
        schema::read_inbox(&self.conn)
    }

    fn inbox_entries(
        &mut self,
        blocked_only: bool,
        flow_id: Option<&FlowId>,
        limit: usize,
    ) -> Result<Vec<InboxEntry>, StoreError> {
        ops::inbox_entries(self, blocked_only, flow_id, limit)
    }

    fn reopen_blocked(&mut self, flow_id: &FlowId) -> Result<u64, StoreError> {
        ops::reopen_blocked(self, flow_id)
    }

    fn skip(
        &mut self,
        request: &SkipRequest,
    ) -> Result<Result<RepairRecord, SkipRefused>, StoreError> {
        ops::skip(self, request)
    }

    fn repairs(&mut self) -> Result<Vec<RepairRecord>, StoreError> {
        ops::repairs(self)
    }

    fn consumer_status(&mut self) -> Result<ConsumerStatus, StoreError> {
        ops::consumer_status(self)
    }

    fn prune_inbox(&mut self, cutoff_ms: i64) -> Result<Pruned, StoreError> {
        ops::prune_inbox(self, cutoff_ms)
    }

    fn consumer_flows_page(
        &mut self,
        prefix: &str,
        after: Option<&FlowId>,
        limit: usize,
    ) -> Result<Vec<ordo_core::ops::ConsumerFlow>, StoreError> {
        browse::consumer_flows_page(&self.conn, prefix, after, limit)
    }

    fn inbox_entry_at(
        &mut self,
        flow_id: &FlowId,
        seq: ordo_core::Seq,
    ) -> Result<Option<InboxEntry>, StoreError> {
        browse::inbox_entry_at(&self.conn, flow_id, seq)
    }

    fn inbox_entry_of_event(
        &mut self,
        event_id: &EventId,
    ) -> Result<Option<InboxEntry>, StoreError> {
        browse::inbox_entry_of_event(&self.conn, event_id)
    }
}

impl ConsumerStore for ConsumerDb {
    type Tx = Connection;

    fn apply_next_with<H>(&mut self, flow_id: &FlowId, handler: &mut H) -> Result<Step, StoreError>
    where
        H: ApplyHandler<Connection> + ?Sized,
    {
        apply::apply_next(self, flow_id, handler)
    }

    fn apply_batch_with<H>(
        &mut self,
        flows: &[(FlowId, Option<u64>)],
        events_max: u64,
        handler: &mut H,
    ) -> Result<Vec<Drain>, StoreError>
    where
        H: ApplyHandler<Connection> + ?Sized,
    {
        apply::apply_batch(self, flows, events_max, handler)
    }

    fn flows_with_work_page(
        &mut self,
        after: Option<&FlowId>,
        limit: usize,
        reevaluate: &[BlockCode],
    ) -> Result<Vec<FlowId>, StoreError> {
        apply::flows_with_work_page(self, after, limit, reevaluate)
    }
}
