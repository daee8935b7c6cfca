//! The producer store: the outbox and the per-flow head of its sequence in
//! ordo's producer schema, beside the application's own tables.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use ordo_core::ops::{
    whole_read, whole_read_limit, OutboxEntry, ProducerStatus, Pruned, RetryRefused,
    WHOLE_READ_ROWS_MAX,
};
use ordo_core::{
    crash, AppendError, Backoff, Clock, Envelope, ErrorKind, EventId, FlowId, OutboxRecord,
    OutboxTx, ProducerName, ProducerStore, Receipt, StoreError,
};
use postgres::Row;

use crate::conn::{open, Opened, PgOptions, PgTx};
use crate::error::corrupt;
use crate::wake::Wake;

mod append;
mod custody;
mod sql;
mod store;

pub use sql::CONFLICT_REASON;
pub(crate) use sql::TABLES;
use sql::*;

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
    store_id: ordo_core::StoreId,
    producer_name: ProducerName,
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
    /// The destination the relay's calls act on, once chosen (see
    /// [`ProducerOps::use_destination`](ordo_core::ProducerOps::use_destination)).
    destination: Option<i64>,
    /// A destination and the consumer store it was found to have recorded
    /// (see [`ProducerStore::recorded_consumer`]).
    consumer_recorded: Option<(i64, ordo_core::StoreId)>,
    wake: Wake,
}

/// A write transaction on the producer, in which the caller changes its own
/// state (through [`PgProducerTx::sql`]) and appends events: both commit
/// together or not at all.
pub struct PgProducerTx<'c> {
    conn: &'c PgTx,
    producer_name: &'c ProducerName,
    now_ms: i64,
    appended: u64,
    /// The heads this transaction has locked, at the last seq it read or
    /// appended: no other transaction moves them until it ends.
    locked: RefCell<HashMap<String, i64>>,
}

impl PgProducer {
    ordo_core::open_constructors!(PgProducer, url: &str, PgOptions, TABLES, open);
    crate::conn::store_accessors!(crate::conn::Role::Producer);

    fn from_opened(opened: Opened, clock: Arc<dyn Clock>, options: &PgOptions) -> PgProducer {
        PgProducer {
            wake: opened.wake,
            conn: opened.conn,
            domain: opened.domain,
            store_id: opened.store_id,
            producer_name: opened.producer_name,
            clock,
            commits: 0,
            owner: opened.owner,
            lease_ms: i64::try_from(options.lease_ms).unwrap_or(i64::MAX),
            held: HashMap::new(),
            claimed: Some(HashSet::new()),
            events_per_flow: 1,
            destination: None,
            consumer_recorded: None,
        }
    }

    /// The destination the relay's calls act on: the one chosen, or the
    /// store's only one (several without a choice are the caller's error).
    fn destination_id(&mut self) -> Result<i64, StoreError> {
        if let Some(id) = self.destination {
            return Ok(id);
        }
        let id = custody::only(&self.conn)?;
        self.destination = Some(id);
        Ok(id)
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
        let Some(destination) = self.destination else {
            // No destination chosen: no round was served, nothing is held.
            self.held.clear();
            self.claimed = Some(HashSet::new());
            return Ok(0);
        };
        let owner = self.owner.clone();
        let tracked: Option<Vec<&str>> =
            (self.claimed.as_ref()).map(|flows| flows.iter().map(String::as_str).collect());
        let released = self
            .conn
            .in_tx_begun(LEASE, BEGIN_UNSYNCED, |tx| match &tracked {
                Some(flows) if flows.is_empty() => Ok(0),
                Some(flows) => tx.run(LEASE, RELEASE_SQL, &[&owner, flows, &destination]),
                None => tx.run(LEASE, RELEASE_ALL_SQL, &[&owner, &destination]),
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
        let destination = self.destination_id()?;
        let params: [&(dyn postgres::types::ToSql + Sync); 6] = [
            &now_ms,
            &limit,
            &skip,
            &self.owner,
            &self.lease_ms,
            &destination,
        ];
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
        (event_ids, destination): (&[&str], i64),
        fences: Fences,
    ) -> Result<(), StoreError> {
        let sql = match fences {
            Fences::Locked => FENCES_SQL,
            Fences::Seen => FENCES_SEEN_SQL,
        };
        let rows = tx.rows(LEASE, sql, &[&event_ids, &destination])?;
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
        let begin = if synced { BEGIN_SYNCED } else { BEGIN_UNSYNCED };
        let txid = conn.begin_with(context, begin)?;
        let mut ptx = PgProducerTx {
            conn,
            producer_name: &self.producer_name,
            now_ms: self.clock.now_ms(),
            appended: 0,
            locked: RefCell::default(),
        };
        let value = match f(&mut ptx) {
            Ok(value) => value,
            Err(e) => {
                conn.rollback();
                return Err(e);
            }
        };
        // One notification per transaction that appended, sent with the
        // COMMIT (delivered only if it commits).
        let appended = ptx.appended > 0;
        conn.commit_with(context, txid, self.wake.commit_statement(appended))?;
        self.commits += 1;
        if appended {
            self.wake.raise();
        }
        Ok(value)
    }

    /// Delivery bookkeeping on the events `event_ids`, in one transaction
    /// committed without waiting for the WAL flush, refused whole when the
    /// fence of one of their flows is stale (see [`PgProducer`]).
    fn bookkeeping<T>(
        &mut self,
        event_ids: &[&str],
        fences: Fences,
        f: impl FnOnce(&PgTx, i64, i64) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let destination = self.destination_id()?;
        let this = &*self;
        let value = this.conn.in_tx_begun(LEASE, BEGIN_BOOKKEEPING, |tx| {
            this.check_fences(tx, (event_ids, destination), fences)?;
            f(tx, destination, this.clock.now_ms())
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
        let destination = self.destination_id()?;
        (self.conn).in_tx_begun(LEASE, BEGIN_BOOKKEEPING, |tx| {
            refresh_heads(tx, (destination, idle), Turn::Next, None)
        })?;
        self.commits += 1;
        Ok(())
    }
}

// The signal is raised by every commit of this process that appends to
// this store (through any handle on the same URL and schema); another
// process's append is heard as the consumer's receives are (see
// `PgConsumer`'s `RunStore`).
ordo_core::run_store_impl!(PgProducer, |db|
    signal: db.wake.signal(),
    changed_elsewhere: db.wake.changed_elsewhere(),
);

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
    read_outbox_at_most(conn, WHOLE_READ_ROWS_MAX)
}

pub(crate) fn read_outbox_at_most(
    conn: &PgTx,
    rows_max: usize,
) -> Result<Vec<OutboxRecord>, StoreError> {
    let rows = outbox_records(conn.rows(
        "producer: cannot read the outbox",
        concat!(
            "SELECT body, ",
            held_everywhere_sql!(),
            " FROM {s}.outbox o ORDER BY position LIMIT $1"
        ),
        &[&whole_read_limit(rows_max)],
    )?)?;
    whole_read("the outbox", rows_max, rows)
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

/// Moves each flow's relay head at the destination to its lowest seq
/// neither accepted, quarantined nor abandoned there, with that event's
/// next attempt time; records the round in which the flows were served
/// with [`Turn::Next`]. The search starts at the current head, or at
/// `reopened` (a seq whose quarantine was cleared) when that is earlier. A
/// flow with nothing eligible keeps a NULL head. In a transaction begun
/// with [`KEY_ORDER`] (see [`REFRESH_HEADS_SQL`]).
fn refresh_heads(
    conn: &PgTx,
    (destination, flows): (i64, &BTreeSet<String>),
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
        &[&names, &(turn == Turn::Next), &reopened, &destination],
    )?;
    Ok(())
}

/// The outbox rows `rows` read as `position, body, created_at_ms,
/// accepted` (settled), each with its destinations' custody.
pub(crate) fn outbox_entries_of(conn: &PgTx, rows: &[Row]) -> Result<Vec<OutboxEntry>, StoreError> {
    let positions: Vec<i64> = rows.iter().map(|row| row.get(0)).collect();
    let mut custody = custody::custody_of(conn, &positions)?;
    rows.iter()
        .map(|row| {
            let position: i64 = row.get(0);
            Ok(OutboxEntry::of_custody(
                stored_envelope(BODY, row.get(1))?,
                row.get(2),
                row.get(3),
                custody.remove(&position).unwrap_or_default(),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{
        CLAIM_SQL, FENCES_SEEN_SQL, FENCES_SQL, HAND_ONE_SQL, HAND_SQL, KEY_ORDER, LOCK_HEADS_SQL,
        MARK_ACCEPTED_SQL, MOVE_HEADS_SQL, PENDING_SQL, REFRESH_HEADS_SQL, RELEASE_SQL, ROUND_SQL,
    };
    use crate::plans::{
        assert_indexed, assert_indexed_by_batch, plans_by_batch, Filled, Side, FLOWS,
    };

    /// `n` copies of `value` as an SQL array as long as the SQL array `of`.
    fn alongside(of: &str, value: &str) -> String {
        format!("array_fill({value}, ARRAY[cardinality({of})])")
    }

    /// The fence check of a round's receipts reads the leases by key
    /// however many events the round had.
    #[test]
    fn the_fence_check_reads_leases_by_key_on_many_flows() {
        for sql in [FENCES_SQL, FENCES_SEEN_SQL] {
            let types = "text[], bigint";
            assert_indexed_by_batch(Side::Producer, sql, types, "-1", |events| {
                format!("{events}, 1")
            });
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

    /// An append hands its rows to its flows' destinations by key however
    /// many flows it names, begun or going on. The destinations, a few
    /// rows, are read whole for a flow begun.
    #[test]
    fn an_append_hands_its_rows_to_the_destinations_by_key() {
        let types = "text[], bigint[], bigint[], bigint[], bigint";
        for (first, sql) in [
            ("1::bigint", HAND_SQL),
            ("2::bigint", HAND_SQL),
            ("2::bigint", HAND_ONE_SQL),
        ] {
            let plans = plans_by_batch(Side::Producer, sql, types, "", |flows| {
                let (firsts, lasts) = (alongside(&flows, first), alongside(&flows, first));
                let positions = alongside(&flows, "7::bigint");
                format!("{flows}, {firsts}, {lasts}, {positions}, 0")
            });
            for plan in plans {
                assert!(plan.contains("Index Scan using relay_head_pkey"), "{plan}");
                assert_indexed(&plan.replace("Seq Scan on destination d", "destinations"));
            }
        }
    }

    /// A round's events are read, marked accepted and its heads moved by
    /// key however many flows it holds.
    #[test]
    fn a_round_reads_and_marks_by_key_on_many_flows() {
        assert_indexed_by_batch(
            Side::Producer,
            ROUND_SQL,
            "bigint, bigint, text[], bigint, bigint",
            "",
            |flows| format!("0, 1000, {flows}, 4, 1"),
        );
        let types = "text[], text[], bigint, bigint";
        assert_indexed_by_batch(Side::Producer, MARK_ACCEPTED_SQL, types, "-1", |events| {
            let outcomes = alongside(&events, "'accepted'::text");
            format!("{events}, {outcomes}, 0, 1")
        });
    }

    /// A round's heads are moved by key, in key order (a plain index scan
    /// of the sorted keys, never a bitmap scan in the table's order),
    /// each locked as it is updated, even in a session told to read every
    /// table in storage order: an appender locks its heads in key order
    /// too, so neither waits for the other in a cycle.
    #[test]
    fn a_rounds_heads_are_locked_by_key_in_key_order() {
        let mut filled = Filled::new("refresh");
        let schema = filled.p.clone();
        let types = "text[], boolean, bigint, bigint";
        for n in [1, 16, 256] {
            let flows: Vec<String> = (0..n)
                .map(|k| format!("'f-{:06}'", 1 + k * (FLOWS / n)))
                .collect();
            let params = format!("ARRAY[{}], true, NULL, 1", flows.join(","));
            (filled.client)
                .batch_execute(&format!(
                    "SET enable_indexscan = off; SET enable_bitmapscan = off;
                     SET enable_indexonlyscan = off; BEGIN; {KEY_ORDER}"
                ))
                .unwrap();
            let plan = filled.plan(&schema, REFRESH_HEADS_SQL, types, &params);
            (filled.client)
                .batch_execute("ROLLBACK; RESET ALL")
                .unwrap();
            assert_indexed(&plan);
            assert!(
                plan.contains("Index Scan using relay_head_pkey on relay_head h"),
                "the heads by key:\n{plan}"
            );
            assert_heads_in_key_order(&plan);
        }
    }

    /// The relay heads in `plan` are read in key order: never by a bitmap
    /// scan (in the table's order), and locked by no read of their own.
    #[track_caller]
    fn assert_heads_in_key_order(plan: &str) {
        assert!(!plan.contains("Bitmap"), "a bitmap scan:\n{plan}");
        assert!(!plan.contains("LockRows"), "a locking read:\n{plan}");
    }

    /// A claim walks the due heads in the relay's order on their index,
    /// each lease read on its head (no join, no sort of every due flow),
    /// and locks the flows it claims by key.
    #[test]
    fn a_claim_walks_the_due_heads_in_order() {
        let mut filled = Filled::new("claim");
        let schema = filled.p.clone();
        let types = "bigint, bigint, text[], text, bigint, bigint";
        for limit in ["1", "256"] {
            let params = format!("0, {limit}, ARRAY[]::text[], 'me', 10000, 1");
            let plan = filled.plan(&schema, CLAIM_SQL, types, &params);
            assert_indexed(&plan);
            assert!(
                plan.contains("Index Scan using relay_head_turn on relay_head h"),
                "the due heads in order:\n{plan}"
            );
            assert!(!plan.contains("Sort"), "no sort:\n{plan}");
            assert!(!plan.contains("Join"), "no join:\n{plan}");
        }
        let plan = filled.plan(
            &schema,
            RELEASE_SQL,
            "text, text[], bigint",
            "'me', ARRAY['f-000001', 'f-000002'], 1",
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
            let params = format!("{limit}, 1");
            assert_indexed(&filled.plan(&schema, PENDING_SQL, "bigint, bigint", &params));
        }
    }
}
