//! Every time a store records (received, settled, a repair's, an outbox
//! row's creation) is read while the store holds the write lock, so that
//! times follow commit order across processes: a writer that waited for
//! the lock never stamps an earlier time than the writer it waited for.

use ordo_core::OutboxTx;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ordo_core::ops::SkipRequest;
use ordo_core::{
    ApplyContext, Clock, ConsumerOps, ConsumerStore, Envelope, FlowId, ProducerOps, ProducerStore,
    Receipt, Receive, SchemaVersion, Seq, StoreError, SystemClock, Verdict,
};
use ordo_sqlite::rusqlite::{Connection, ErrorCode};
use ordo_sqlite::{ConsumerDb, OpenOptions, ProducerDb, Schema};
use ordo_testkit::support::envelope;
use serde_json::json;

/// A clock that, each time it is read, tries to take the write lock of one
/// file through a connection of its own that does not wait: if the store
/// reading the clock holds the lock, the attempt finds the file busy.
struct LockProbe {
    path: PathBuf,
    reads: Mutex<Vec<bool>>,
}

impl LockProbe {
    fn new(path: &Path) -> Arc<LockProbe> {
        Arc::new(LockProbe {
            path: path.to_owned(),
            reads: Mutex::new(Vec::new()),
        })
    }

    /// Whether each read so far happened under another connection's lock.
    fn take(&self) -> Vec<bool> {
        std::mem::take(&mut self.reads.lock().unwrap())
    }
}

impl Clock for LockProbe {
    fn now_ms(&self) -> i64 {
        let probe = Connection::open(&self.path).unwrap();
        probe.busy_timeout(std::time::Duration::ZERO).unwrap();
        let locked = match probe.execute_batch("BEGIN IMMEDIATE; ROLLBACK;") {
            Ok(()) => false,
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) => true,
            Err(e) => panic!("probe: {e}"),
        };
        self.reads.lock().unwrap().push(locked);
        1_700_000_000_000
    }
}

/// Event `seq` of `flow`, of type `placed`.
fn event(flow: &str, seq: i64) -> Envelope {
    envelope(&format!("{flow}-{seq}"), flow, seq, 1, "placed", json!({}))
}

/// How a store of domain `app` is opened at a path with a clock.
type Open<S> = fn(PathBuf, &Schema, Arc<dyn Clock>, &OpenOptions) -> Result<S, StoreError>;

/// A store `name` of domain `app` in a fresh directory, made first, then
/// opened again by `open` with a [`LockProbe`] on its file as its clock;
/// the probe's reads while it opened are dropped.
fn probed<S>(name: &str, open: Open<S>) -> (tempfile::TempDir, S, Arc<LockProbe>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    let schema = Schema::new("app").unwrap();
    let options = OpenOptions::default();
    drop(open(path.clone(), &schema, Arc::new(SystemClock), &options).unwrap());
    let clock = LockProbe::new(&path);
    let store = open(path, &schema, clock.clone(), &options).unwrap();
    clock.take();
    (dir, store, clock)
}

fn all_under_lock(reads: Vec<bool>, what: &str) {
    assert!(!reads.is_empty(), "{what} read no time");
    assert!(reads.iter().all(|&locked| locked), "{what}: {reads:?}");
}

#[test]
fn settle_times_are_read_under_the_write_lock() {
    let (_dir, mut consumer, clock) = probed("consumer.db", ConsumerDb::open_with);

    consumer
        .receive_batch(&[event("f", 1), event("f", 2), event("g", 1)])
        .unwrap();
    all_under_lock(clock.take(), "receive");

    let mut apply = |_: &mut ApplyContext<Connection>,
                     _: &Envelope|
     -> Result<Verdict, StoreError> { Ok(Verdict::Apply) };
    consumer
        .apply_next_with(
            &ordo_core::InboxFlow::of_default(FlowId::new("f").unwrap()),
            &mut apply,
        )
        .unwrap();
    all_under_lock(clock.take(), "apply");
    consumer
        .apply_batch_with(
            &[(
                ordo_core::InboxFlow::of_default(FlowId::new("f").unwrap()),
                None,
            )],
            10,
            &mut apply,
        )
        .unwrap();
    all_under_lock(clock.take(), "apply batch");

    let skip = SkipRequest::new(
        ordo_core::InboxFlow::of_default(FlowId::new("g").unwrap()),
        Seq::FIRST,
        "not needed".into(),
        "ops".into(),
    )
    .unwrap();
    consumer.skip(&skip).unwrap().unwrap();
    all_under_lock(clock.take(), "skip");
}

#[test]
fn creation_times_are_read_under_the_write_lock() {
    let (_dir, mut producer, clock) = probed("producer.db", ProducerDb::open_with);
    let flow = FlowId::new("f").unwrap();
    let event = producer
        .write(|tx| tx.append(&flow, "placed", SchemaVersion::V1, &json!({})))
        .unwrap();
    all_under_lock(clock.take(), "append");
    // The relay's own time is older than the lock: the store's is recorded.
    producer
        .record_receipts(&[(event.event_id.clone(), Receipt::Accepted)], 0)
        .unwrap();
    all_under_lock(clock.take(), "record receipts");
    let entry = &producer.outbox_entries(false, 10).unwrap()[0];
    assert_eq!(entry.accepted_at_ms, Some(1_700_000_000_000));
}
