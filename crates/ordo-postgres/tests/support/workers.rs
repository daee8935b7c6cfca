//! Several workers on one database: stores opened under owner names, a
//! handler that checks order and exactly-once as it applies, and the end
//! state every run must converge to.

use ordo_core::OutboxTx;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ordo_core::{
    ApplyContext, ApplyHandler, Backoff, Clock, ConsumerOps, Envelope, ErrorKind, FlowId,
    InboxStatus, ProducerOps, ProducerStore, RelayOptions, SchemaVersion, StoreError, SystemClock,
    Verdict,
};
use ordo_postgres::postgres::Client;
use ordo_postgres::{PgConsumer, PgOptions, PgProducer, PgTx};
use ordo_reservation::producer_schema;

use super::{test_options, test_schema};

/// Opens a producer that relays as `owner`, its leases lasting `lease_ms`.
pub fn producer(target: &str, owner: &str, lease_ms: u64) -> PgProducer {
    try_producer(target, owner, lease_ms).expect("open the producer")
}

/// [`producer`], or why it could not be opened.
pub fn try_producer(target: &str, owner: &str, lease_ms: u64) -> Result<PgProducer, StoreError> {
    PgProducer::open_with(
        target,
        &producer_schema(),
        Arc::new(SystemClock),
        &PgOptions {
            owner: Some(owner.into()),
            lease_ms,
            ..PgOptions::default()
        },
    )
}

/// Opens the test domain's consumer as `owner`.
pub fn consumer(target: &str, owner: &str) -> PgConsumer {
    try_consumer(target, owner).expect("open the consumer")
}

/// [`consumer`], or why it could not be opened.
pub fn try_consumer(target: &str, owner: &str) -> Result<PgConsumer, StoreError> {
    PgConsumer::open_with(
        target,
        &test_schema(),
        Arc::new(SystemClock),
        &PgOptions {
            owner: Some(owner.into()),
            ..test_options()
        },
    )
}

/// Opens a store, again after each failure (its connection ended while it
/// opened), at most `attempts` times.
pub fn opened<T>(attempts: u32, mut open: impl FnMut() -> Result<T, StoreError>) -> T {
    let mut last = None;
    for _ in 0..attempts {
        match open() {
            Ok(store) => return store,
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("cannot open a store: {last:?}")
}

/// A fair round of at most `limit` events at the system's clock, the relay
/// holding no flows yet.
pub fn fair_round_now(relay: &mut PgProducer, limit: usize) -> Vec<Envelope> {
    relay
        .fair_round(
            limit,
            &std::collections::BTreeSet::new(),
            SystemClock.now_ms(),
        )
        .unwrap()
}

/// A relay's options for tests: small rounds, short backoffs.
pub fn relay_options(batch_len_max: usize) -> RelayOptions {
    RelayOptions {
        batch_len_max,
        backoff: Backoff {
            base_ms: 5,
            cap_ms: 50,
            floor_ms: 0,
        },
        ..RelayOptions::default()
    }
}

pub fn flow(i: usize) -> FlowId {
    FlowId::new(format!("f-{i:03}")).expect("a flow id")
}

/// Appends the flow's next event.
pub fn append(producer: &mut PgProducer, flow_id: &FlowId) -> Result<Envelope, StoreError> {
    producer
        .write(|ptx| {
            ptx.append(
                flow_id,
                "record",
                SchemaVersion::V1,
                &serde_json::json!({ "n": 1 }),
            )
        })
        .map_err(|e| match e {
            ordo_core::AppendError::Store(e) => e,
            other => panic!("append refused: {other}"),
        })
}

/// What the handler saw go wrong.
pub type Violations = Arc<Mutex<Vec<String>>>;

/// Records each event in `handled`, checking first that it is the flow's
/// next seq and not already handled: a double or out-of-order apply is a
/// violation (and an error, so nothing of it commits).
pub struct Ordered {
    pub violations: Violations,
}

impl ApplyHandler<PgTx> for Ordered {
    fn apply(
        &mut self,
        tx: &mut ApplyContext<'_, PgTx>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        let flow = event.flow_id.as_str();
        let seq = event.seq.get();
        let last: i64 = tx
            .query_one(
                "SELECT coalesce(max(seq), 0) FROM handled WHERE flow_id = $1",
                &[&flow],
            )?
            .get(0);
        if last + 1 != seq {
            let violation = format!("flow {flow}: seq {seq} applied after {last}");
            self.violations.lock().unwrap().push(violation.clone());
            return Err(StoreError::new(ErrorKind::Other, violation));
        }
        tx.execute(
            "INSERT INTO handled (flow_id, seq) VALUES ($1, $2)",
            &[&flow, &seq],
        )?;
        Ok(Verdict::Apply)
    }
}

/// A plain client on the test database, for checks and for ending ordo's
/// own connections.
pub fn client(target: &str) -> Client {
    ordo_postgres::PgUrl::parse(target)
        .expect("a test URL")
        .connect()
        .expect("a checking connection")
}

/// Polls `done` until it holds, failing after `bound`.
pub fn wait_until(what: &str, bound: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < bound, "{what}: not reached in {bound:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Checks the end state: every outbox event accepted, the inbox holding
/// exactly the outbox's events, each applied, and `handled` holding each
/// (flow, seq) once, seqs 1..=n per flow.
pub fn check_converged(target: &str) -> BTreeMap<String, i64> {
    let mut c = client(target);
    let unaccepted: i64 = c
        .query_one(
            "SELECT count(*) FROM ordo_producer.outbox WHERE NOT accepted",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(unaccepted, 0, "every event is accepted");
    let outbox: Vec<(String, i64, String)> = c
        .query(
            "SELECT flow_id, seq, event_id FROM ordo_producer.outbox ORDER BY flow_id, seq",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let inbox: Vec<(String, i64, String)> = c
        .query(
            "SELECT flow_id, seq, event_id FROM ordo_testkit.inbox ORDER BY flow_id, seq",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(inbox, outbox, "the inbox holds exactly the outbox's events");
    let not_applied: i64 = c
        .query_one(
            "SELECT count(*) FROM ordo_testkit.inbox WHERE status <> 'applied'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(not_applied, 0, "every event is applied");
    let handled: Vec<(String, i64)> = c
        .query(
            "SELECT flow_id, seq FROM handled ORDER BY flow_id, seq",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let expected: Vec<(String, i64)> = outbox.iter().map(|(f, s, _)| (f.clone(), *s)).collect();
    assert_eq!(handled, expected, "one effect per (flow, seq)");
    let mut per_flow = BTreeMap::new();
    for (flow, seq, _) in &outbox {
        let last = per_flow.entry(flow.clone()).or_insert(0);
        assert_eq!(*last + 1, *seq, "flow {flow}: seqs contiguous");
        *last = *seq;
    }
    // A relay that stopped released its flows, or they expire.
    wait_until("no flow held", Duration::from_secs(60), || {
        c.query_one(
            "SELECT count(*) FROM ordo_producer.relay_head WHERE lease_owner IS NOT NULL
             AND lease_expires_at_ms > (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .unwrap()
        .get::<_, i64>(0)
            == 0
    });
    per_flow
}

/// Whether every inbox row is applied and the outbox fully accepted.
pub fn all_settled(c: &mut Client) -> bool {
    let row = c
        .query_one(
            "SELECT (SELECT count(*) FROM ordo_producer.outbox WHERE NOT accepted),
                    (SELECT count(*) FROM ordo_testkit.inbox WHERE status <> 'applied'),
                    (SELECT count(*) FROM ordo_producer.outbox),
                    (SELECT count(*) FROM ordo_testkit.inbox)",
            &[],
        )
        .unwrap();
    let (unaccepted, unapplied, outbox, inbox): (i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    unaccepted == 0 && unapplied == 0 && outbox == inbox
}

/// The inbox statuses, for failure messages.
pub fn inbox_summary(consumer: &mut PgConsumer) -> String {
    let inbox = consumer.inbox().expect("read the inbox");
    let pending = inbox
        .iter()
        .filter(|r| r.status == InboxStatus::Pending)
        .count();
    format!("{} rows, {pending} pending", inbox.len())
}

/// The producer's backlog.
pub fn backlog(producer: &mut PgProducer) -> u64 {
    producer
        .producer_status(i64::MAX)
        .map(|s| s.backlog)
        .unwrap_or(u64::MAX)
}
