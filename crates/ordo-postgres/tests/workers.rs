//! Several relays and several appliers at once on one PostgreSQL database,
//! each with its own store handle and connections: relays claim whole
//! flows under leases whose fences refuse a stale relay's bookkeeping;
//! appliers take a flow one at a time and never wait for each other on
//! different flows.

mod support;

use ordo_core::OutboxTx;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use ordo_core::{
    process_all, relay, ApplyContext, ApplyHandler, Backoff, Clock, ConsumerOps, ConsumerStore,
    DrainStop, Envelope, ErrorKind, EventId, ProducerOps, ProducerStore, Receipt, Receive,
    StoreError, SystemClock, Verdict,
};
use ordo_postgres::PgTx;
use support::fresh_database_alone;
use support::workers::{
    all_settled, append, backlog, check_converged, client, consumer, fair_round_now, flow,
    inbox_summary, producer, relay_options, wait_until, Ordered, Violations,
};

// These tests open up to ten connections each: one at a time.
const BOUND: Duration = Duration::from_secs(120);

fn ids(events: &[Envelope]) -> Vec<&str> {
    events.iter().map(|e| e.event_id.as_str()).collect()
}

/// Asserts that `round` holds exactly `events`, by id and in order.
#[track_caller]
fn assert_round(round: &[Envelope], events: &[&Envelope], why: &str) {
    let expected: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids(round), expected, "{why}");
}

/// A relay (`owner`, long leases) on `target` that has taken flow 1's
/// first event in a round: the relay, the flow and the event.
fn relay_holding_first(
    target: &str,
    owner: &str,
) -> (ordo_postgres::PgProducer, ordo_core::FlowId, Envelope) {
    let mut relay = producer(target, owner, 600_000);
    let f = flow(1);
    let first = append(&mut relay, &f).unwrap();
    let round = fair_round_now(&mut relay, 10);
    assert_round(&round, &[&first], "the flow's head");
    (relay, f, first)
}

/// Records that `relay` delivered `event` and it was accepted, now.
fn record_accepted(relay: &mut ordo_postgres::PgProducer, event: &Envelope) {
    relay
        .record_receipts(
            &[(event.event_id.clone(), Receipt::Accepted)],
            SystemClock.now_ms(),
        )
        .unwrap();
}

#[test]
fn a_stale_fence_refuses_bookkeeping_and_writes_nothing() {
    let (_serial, _dir, target) = fresh_database_alone();
    // `slow`'s leases lapse as soon as they are taken.
    let mut slow = producer(&target, "slow", 0);
    let mut holder = producer(&target, "holder", 600_000);
    let f = flow(1);
    let first = append(&mut slow, &f).unwrap();
    append(&mut slow, &f).unwrap();
    let now = SystemClock.now_ms();
    let none = BTreeSet::new();

    let round = slow.fair_round(10, &none, now).unwrap();
    assert_round(&round, &[&first], "one head per flow");
    let slow_fence = slow.held_flows()[&f];
    let round = holder.fair_round(10, &none, now).unwrap();
    assert_round(&round, &[&first], "");
    let holder_fence = holder.held_flows()[&f];
    assert!(holder_fence > slow_fence, "a new claim moves the fence on");

    let before = holder.outbox_entries(false, 10).unwrap();
    let refused = [
        slow.record_receipts(&[(first.event_id.clone(), Receipt::Accepted)], now),
        slow.record_receipts(&[(first.event_id.clone(), Receipt::Conflict)], now),
        slow.record_failure(
            std::slice::from_ref(&first.event_id),
            "lost",
            now,
            &Backoff::default(),
        ),
        slow.quarantine(&first.event_id, "too_large", "too_large: test", now),
    ];
    for outcome in refused {
        let error = outcome.expect_err("a stale fence is refused");
        assert_eq!(error.kind(), ErrorKind::LeaseLost, "{error}");
    }
    assert_eq!(
        holder.outbox_entries(false, 10).unwrap(),
        before,
        "nothing written"
    );

    // A live lease is never shared.
    let mut third = producer(&target, "third", 600_000);
    assert!(third.fair_round(10, &none, now).unwrap().is_empty());

    holder
        .record_receipts(&[(first.event_id.clone(), Receipt::Accepted)], now)
        .unwrap();
    let entries = holder.outbox_entries(false, 10).unwrap();
    assert!(entries[0].accepted, "the holder's bookkeeping is written");
    assert_eq!(entries[0].attempts, 1);

    // The holder releases the flow when it drops; the third relay takes it.
    drop(holder);
    let round = third.fair_round(10, &none, now).unwrap();
    assert_eq!(round[0].seq.get(), 2, "the flow's next head");
    assert!(third.held_flows()[&f] > holder_fence);
}

/// A flow's lease, in its head: its owner, fence and expiry (which every
/// claim and renewal moves on).
fn lease_row(
    checker: &mut postgres::Client,
    flow_id: &ordo_core::FlowId,
) -> (Option<String>, i64, i64) {
    let row = checker
        .query_one(
            "SELECT lease_owner, lease_fence, lease_expires_at_ms
             FROM ordo_producer.relay_head WHERE flow_id = $1",
            &[&flow_id.as_str()],
        )
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

#[test]
fn a_relay_keeps_its_flows_across_rounds_caught_up_or_not() {
    let (_serial, _dir, target) = fresh_database_alone();
    let mut first = producer(&target, "first", 600_000);
    let mut second = producer(&target, "second", 600_000);
    let mut checker = client(&target);
    let (busy, done) = (flow(1), flow(2));
    append(&mut first, &busy).unwrap();
    append(&mut first, &busy).unwrap();
    append(&mut first, &done).unwrap();
    let now = SystemClock.now_ms();
    let none = BTreeSet::new();
    let accept = |events: &[Envelope]| -> Vec<(EventId, Receipt)> {
        events
            .iter()
            .map(|e| (e.event_id.clone(), Receipt::Accepted))
            .collect()
    };

    let round = first.fair_round(10, &none, now).unwrap();
    assert_eq!(round.len(), 2, "one head per flow");
    let fences = first.held_flows();
    first.record_receipts(&accept(&round), now).unwrap();
    let owner = Some(first.owner().to_owned());
    let kept = lease_row(&mut checker, &busy);
    let caught_up = lease_row(&mut checker, &done);
    assert_eq!(kept.0, owner, "an event still due: kept");
    assert_eq!(caught_up.0, owner, "caught up: kept too");

    // A caught-up flow given a new event stays with its holder: another
    // relay's round passes both flows by.
    append(&mut first, &done).unwrap();
    assert!(second.fair_round(10, &none, now).unwrap().is_empty());

    // The holder's next round serves both under the fences it claimed,
    // the leases not written.
    let round = first.fair_round(10, &none, now).unwrap();
    let taken: BTreeSet<(&ordo_core::FlowId, i64)> =
        round.iter().map(|e| (&e.flow_id, e.seq.get())).collect();
    assert_eq!(taken, BTreeSet::from([(&busy, 2), (&done, 2)]));
    assert_eq!(first.held_flows(), fences);
    assert_eq!(lease_row(&mut checker, &busy), kept, "untouched");
    assert_eq!(lease_row(&mut checker, &done), caught_up, "untouched");
    first.record_receipts(&accept(&round), now).unwrap();

    // Released (as dropping the handle does), a flow with a new event goes
    // to whichever relay claims it, under a new fence.
    assert_eq!(first.release_leases().unwrap(), 2);
    assert_eq!(lease_row(&mut checker, &done).0, None, "released");
    append(&mut first, &done).unwrap();
    let round = second.fair_round(10, &none, now).unwrap();
    assert_eq!((&round[0].flow_id, round[0].seq.get()), (&done, 3));
    assert!(second.held_flows()[&done] > fences[&done]);
}

#[test]
fn a_deep_round_takes_several_events_of_each_flow_in_order() {
    let (_serial, _dir, target) = fresh_database_alone();
    let mut relay = producer(&target, "deep", 600_000);
    for i in 1..=3 {
        for _ in 0..3 {
            append(&mut relay, &flow(i)).unwrap();
        }
    }
    let now = SystemClock.now_ms();
    let none = BTreeSet::new();
    let taken = |round: &[Envelope]| -> Vec<(String, i64)> {
        round
            .iter()
            .map(|e| (e.flow_id.as_str().to_owned(), e.seq.get()))
            .collect()
    };
    let pairs = |list: &[(usize, i64)]| -> Vec<(String, i64)> {
        list.iter()
            .map(|(i, seq)| (flow(*i).as_str().to_owned(), *seq))
            .collect()
    };

    // Two of each flow, flows in the relay's order, five in all.
    let round = relay.fair_round_deep(5, 2, &none, now).unwrap();
    assert_eq!(
        taken(&round),
        pairs(&[(1, 1), (1, 2), (2, 1), (2, 2), (3, 1)])
    );
    let receipts: Vec<(EventId, Receipt)> = round
        .iter()
        .map(|e| (e.event_id.clone(), Receipt::Accepted))
        .collect();
    relay.record_receipts(&receipts, now).unwrap();

    // Each flow from its new head (all three were served by the same
    // round, so they go in flow order).
    let round = relay.fair_round_deep(10, 2, &none, now).unwrap();
    assert_eq!(taken(&round), pairs(&[(1, 3), (2, 3), (3, 2), (3, 3)]));
    let entries = relay.outbox_entries(false, 20).unwrap();
    assert_eq!(entries.iter().filter(|e| e.accepted).count(), 5);
}

#[test]
fn a_dead_relays_flows_are_taken_over_once_its_session_is_gone() {
    let (_serial, _dir, target) = fresh_database_alone();
    // Leases far longer than the test: only the session's end frees them.
    let mut dead = producer(&target, "dead", 3_600_000);
    for i in 0..6 {
        for _ in 0..3 {
            append(&mut dead, &flow(i)).unwrap();
        }
    }
    let claimed = dead
        .fair_round(100, &BTreeSet::new(), SystemClock.now_ms())
        .unwrap();
    assert_eq!(claimed.len(), 6);
    let fences = dead.held_flows();
    // The relay dies holding its flows: its connection ends without a
    // release.
    let mut checker = client(&target);
    checker
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'ordo-relay-dead'",
            &[],
        )
        .unwrap();
    std::mem::forget(dead);

    let mut live = producer(&target, "live", 60_000);
    let mut inbox = consumer(&target, "receiver");
    wait_until("the dead relay's flows delivered", BOUND, || {
        relay(&mut live, &mut inbox, &relay_options(4), &SystemClock).unwrap();
        backlog(&mut live) == 0
    });
    for (flow_id, fence) in fences {
        let now: i64 = checker
            .query_one(
                "SELECT lease_fence FROM ordo_producer.relay_head WHERE flow_id = $1",
                &[&flow_id.as_str()],
            )
            .unwrap()
            .get(0);
        assert!(now > fence, "flow {flow_id} was claimed anew");
    }
    assert_eq!(
        inbox.inbox().unwrap().len(),
        18,
        "{}",
        inbox_summary(&mut inbox)
    );
}

#[test]
fn a_stalled_relays_flows_are_taken_over_when_its_leases_expire() {
    let (_serial, _dir, target) = fresh_database_alone();
    let mut stalled = producer(&target, "stalled", 300);
    for i in 0..4 {
        append(&mut stalled, &flow(i)).unwrap();
    }
    let now = SystemClock.now_ms();
    assert_eq!(
        stalled
            .fair_round(100, &BTreeSet::new(), now)
            .unwrap()
            .len(),
        4
    );
    // Its session lives on, but it renews nothing: another relay gets
    // nothing until the leases expire, then everything.
    let mut other = producer(&target, "other", 60_000);
    assert!(other
        .fair_round(100, &BTreeSet::new(), now)
        .unwrap()
        .is_empty());
    wait_until("the stalled relay's leases expired", BOUND, || {
        other
            .fair_round(100, &BTreeSet::new(), SystemClock.now_ms())
            .unwrap()
            .len()
            == 4
    });
    drop(stalled);
}

/// Relays and appliers on a database of their own (the test running
/// alone), each on a thread of its own, running until [`Crew::stop`].
struct Crew {
    _serial: std::sync::MutexGuard<'static, ()>,
    _dir: tempfile::TempDir,
    target: String,
    stop: Arc<AtomicBool>,
    violations: Violations,
}

impl Crew {
    fn new() -> Crew {
        let (serial, dir, target) = fresh_database_alone();
        Crew {
            _serial: serial,
            _dir: dir,
            target,
            stop: Arc::default(),
            violations: Arc::default(),
        }
    }

    /// `n` relays (`r0`, `r1`, ...) of rounds of `batch_len_max`, each
    /// collecting every delivery it made.
    fn relays(
        &self,
        n: usize,
        batch_len_max: usize,
    ) -> Vec<std::thread::JoinHandle<Vec<(EventId, Receipt)>>> {
        (0..n)
            .map(|i| {
                let (target, stop) = (self.target.clone(), self.stop.clone());
                std::thread::spawn(move || {
                    let owner = format!("r{i}");
                    let mut relay_store = producer(&target, &owner, 2_000);
                    let mut to = consumer(&target, &owner);
                    let mut deliveries = Vec::new();
                    until_stopped(&stop, &format!("relay {owner}"), || {
                        let options = relay_options(batch_len_max);
                        let report = relay(&mut relay_store, &mut to, &options, &SystemClock)?;
                        let busy = !report.deliveries.is_empty();
                        deliveries.extend(
                            report
                                .deliveries
                                .into_iter()
                                .map(|d| (d.event_id, d.receipt)),
                        );
                        Ok::<_, ordo_core::RelayError>(busy)
                    });
                    deliveries
                })
            })
            .collect()
    }

    /// `n` appliers (`a0`, `a1`, ...) with [`Ordered`] handlers, each
    /// counting the events it applied.
    fn appliers(&self, n: usize) -> Vec<std::thread::JoinHandle<u64>> {
        (0..n)
            .map(|i| {
                let (target, stop) = (self.target.clone(), self.stop.clone());
                let violations = self.violations.clone();
                std::thread::spawn(move || {
                    let owner = format!("a{i}");
                    let mut store = consumer(&target, &owner);
                    let mut handler = Ordered { violations };
                    let mut applied = 0;
                    until_stopped(&stop, &format!("applier {owner}"), || {
                        let drains = process_all(&mut store, None, &mut handler, 16)?;
                        let now: u64 = drains.iter().map(|d| d.applied).sum();
                        applied += now;
                        Ok::<_, StoreError>(now > 0)
                    });
                    applied
                })
            })
            .collect()
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// A worker's loop: runs `round` until `stop`, pausing a little after a
/// round that found nothing to do (`Ok(false)`); an error fails the test.
fn until_stopped<E: std::fmt::Display>(
    stop: &AtomicBool,
    worker: &str,
    mut round: impl FnMut() -> Result<bool, E>,
) {
    while !stop.load(Ordering::SeqCst) {
        match round() {
            Ok(true) => {}
            Ok(false) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("{worker}: {e}"),
        }
    }
}

#[test]
fn several_relays_and_appliers_deliver_and_apply_every_event_once_in_order() {
    const FLOWS: usize = 24;
    const PER_FLOW: usize = 25;
    let crew = Crew::new();

    let producing = {
        let target = crew.target.clone();
        std::thread::spawn(move || {
            let mut store = producer(&target, "producer", 2_000);
            for _ in 0..PER_FLOW {
                for i in 0..FLOWS {
                    append(&mut store, &flow(i)).unwrap();
                }
            }
        })
    };
    let relays = crew.relays(3, 8);
    let appliers = crew.appliers(2);

    producing.join().expect("the producer");
    let mut checker = client(&crew.target);
    wait_until("every event delivered and applied", BOUND, || {
        all_settled(&mut checker)
    });
    crew.stop();
    let mut accepted: BTreeMap<EventId, usize> = BTreeMap::new();
    let mut relays_used = 0;
    for relay in relays {
        let deliveries = relay.join().expect("a relay");
        relays_used += usize::from(!deliveries.is_empty());
        for (event_id, receipt) in deliveries {
            if receipt == Receipt::Accepted {
                *accepted.entry(event_id).or_default() += 1;
            } else {
                assert_eq!(receipt, Receipt::Duplicate, "{event_id}");
            }
        }
    }
    let applied: u64 = appliers
        .into_iter()
        .map(|a| a.join().expect("an applier"))
        .sum();

    let per_flow = check_converged(&crew.target);
    assert_eq!(per_flow.len(), FLOWS);
    assert!(per_flow.values().all(|n| *n == PER_FLOW as i64));
    assert_eq!(
        applied,
        (FLOWS * PER_FLOW) as u64,
        "each event applied once"
    );
    assert_eq!(accepted.len(), FLOWS * PER_FLOW, "every event delivered");
    assert!(
        accepted.values().all(|n| *n == 1),
        "custody moves once per event"
    );
    assert!(relays_used >= 2, "the relays shared the work");
    let violations = &crew.violations;
    assert!(violations.lock().unwrap().is_empty(), "{violations:?}");
}

#[test]
fn several_appliers_apply_each_event_once_in_order() {
    const FLOWS: usize = 30;
    const PER_FLOW: usize = 20;
    let crew = Crew::new();
    let appliers = crew.appliers(4);

    // Events arrive while the appliers run, each flow's out of order
    // within a chunk (gaps that close), through the producer's envelopes.
    let mut source = producer(&crew.target, "source", 60_000);
    let mut events = Vec::new();
    for _ in 0..PER_FLOW {
        for i in 0..FLOWS {
            events.push(append(&mut source, &flow(i)).unwrap());
        }
    }
    let mut receiver = consumer(&crew.target, "receiver");
    for chunk in events.chunks(FLOWS * 3) {
        let mut chunk = chunk.to_vec();
        chunk.reverse();
        let receipts = receiver.receive_batch(&chunk).unwrap();
        assert!(receipts.iter().all(|r| *r == Receipt::Accepted));
    }
    let mut checker = client(&crew.target);
    wait_until("every event applied", BOUND, || {
        checker
            .query_one(
                "SELECT count(*) FROM ordo_testkit.inbox WHERE status <> 'applied'",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0)
            == 0
    });
    crew.stop();
    let applied: Vec<u64> = appliers
        .into_iter()
        .map(|a| a.join().expect("an applier"))
        .collect();
    assert_eq!(applied.iter().sum::<u64>(), (FLOWS * PER_FLOW) as u64);
    let handled: i64 = checker
        .query_one("SELECT count(*) FROM handled", &[])
        .unwrap()
        .get(0);
    assert_eq!(handled, (FLOWS * PER_FLOW) as i64, "one effect per event");
    let violations = &crew.violations;
    assert!(violations.lock().unwrap().is_empty(), "{violations:?}");
}

/// Applies like [`Ordered`], but holds its transaction open on the first
/// event of `gated` until told to go on.
struct Gate {
    inner: Ordered,
    gated: String,
    entered: Option<mpsc::Sender<()>>,
    go_on: mpsc::Receiver<()>,
}

impl ApplyHandler<PgTx> for Gate {
    fn apply(
        &mut self,
        tx: &mut ApplyContext<'_, PgTx>,
        event: &Envelope,
    ) -> Result<Verdict, StoreError> {
        if event.flow_id.as_str() == self.gated {
            if let Some(entered) = self.entered.take() {
                entered.send(()).unwrap();
                self.go_on
                    .recv_timeout(BOUND)
                    .expect("the test lets the gate go on");
            }
        }
        self.inner.apply(tx, event)
    }
}

/// Appends `per_flow` events to each of `flows` and has the consumer
/// receive them all.
fn received(target: &str, flows: impl IntoIterator<Item = usize>, per_flow: usize) {
    let mut source = producer(target, "source", 60_000);
    let mut events = Vec::new();
    for i in flows {
        for _ in 0..per_flow {
            events.push(append(&mut source, &flow(i)).unwrap());
        }
    }
    consumer(target, "receiver").receive_batch(&events).unwrap();
}

/// Starts an applier, named "slow", that runs `body` with a [`Gate`] on
/// flow 1, and returns once it holds its transaction open there: the thread
/// and the sender that lets it go on.
fn gated_applier(
    target: &str,
    violations: &Violations,
    body: impl FnOnce(&mut ordo_postgres::PgConsumer, &mut Gate) -> Vec<ordo_core::Drain>
        + Send
        + 'static,
) -> (
    std::thread::JoinHandle<Vec<ordo_core::Drain>>,
    mpsc::Sender<()>,
) {
    let (entered_tx, entered) = mpsc::channel();
    let (go_on, go_on_rx) = mpsc::channel();
    let (target, violations) = (target.to_owned(), violations.clone());
    let slow = std::thread::spawn(move || {
        let mut store = consumer(&target, "slow");
        let mut gate = Gate {
            inner: Ordered { violations },
            gated: flow(1).as_str().to_string(),
            entered: Some(entered_tx),
            go_on: go_on_rx,
        };
        body(&mut store, &mut gate)
    });
    entered
        .recv_timeout(BOUND)
        .expect("the slow applier holds flow 1");
    (slow, go_on)
}

#[test]
fn appliers_on_different_flows_never_wait_for_each_other() {
    let (_serial, _dir, target) = fresh_database_alone();
    received(&target, [1, 2], 3);
    let violations: Violations = Arc::default();

    // Flow 1 alone: a batch locks each of its flows before its handler
    // call, so flow 2 would be held too.
    let (slow, go_on) = gated_applier(&target, &violations, |store, gate| {
        vec![ordo_core::drain(
            store,
            &ordo_core::InboxFlow::of_default(flow(1)),
            None,
            gate,
            16,
        )
        .unwrap()]
    });

    // While flow 1 is held, another applier drains flow 2 and passes flow 1
    // by without waiting.
    let (done_tx, done) = mpsc::channel();
    let quick = {
        let (target, violations) = (target.clone(), violations.clone());
        std::thread::spawn(move || {
            let mut store = consumer(&target, "quick");
            let drains = process_all(&mut store, None, &mut Ordered { violations }, 16).unwrap();
            done_tx.send(()).unwrap();
            drains
        })
    };
    done.recv_timeout(BOUND)
        .expect("the quick applier finishes while flow 1 is held");
    let drains = quick.join().unwrap();
    let by_flow: BTreeMap<String, (u64, DrainStop)> = drains
        .into_iter()
        .map(|d| (d.flow.flow_id.as_str().to_string(), (d.applied, d.stop)))
        .collect();
    assert_eq!(by_flow[flow(1).as_str()], (0, DrainStop::Idle), "passed by");
    assert_eq!(by_flow[flow(2).as_str()], (3, DrainStop::Idle));

    go_on.send(()).unwrap();
    let drains = slow.join().unwrap();
    assert_eq!(drains[0].applied, 3, "the slow applier drains flow 1");
    let handled: i64 = client(&target)
        .query_one("SELECT count(*) FROM handled", &[])
        .unwrap()
        .get(0);
    assert_eq!(handled, 6);
    assert!(violations.lock().unwrap().is_empty(), "{violations:?}");
}

#[test]
fn a_batch_holds_about_the_flows_its_events_need() {
    let (_serial, _dir, target) = fresh_database_alone();
    received(&target, 1..=8, 3);
    let violations: Violations = Arc::default();

    // A batch of 8 events over all eight flows needs flows 1 to 3; it is
    // held open on its first event. It may lock a flow or so more than it
    // needs (it guesses their events before it reads them), never all.
    let (slow, go_on) = gated_applier(&target, &violations, |store, gate| {
        let work: Vec<_> = (1..=8)
            .map(|i| (ordo_core::InboxFlow::of_default(flow(i)), None))
            .collect();
        store.apply_batch_with(&work, 8, gate).unwrap()
    });

    // Meanwhile another applier drains every flow the batch does not reach.
    let mut quick = consumer(&target, "quick");
    let drains = process_all(
        &mut quick,
        None,
        &mut Ordered {
            violations: violations.clone(),
        },
        64,
    )
    .unwrap();
    go_on.send(()).unwrap();
    let slow_drains = slow.join().unwrap();
    let applied = |drains: &[ordo_core::Drain], i: usize| -> u64 {
        drains
            .iter()
            .filter(|d| d.flow.flow_id == flow(i))
            .map(|d| d.applied)
            .sum()
    };
    for i in 5..=8 {
        assert_eq!(
            applied(&drains, i),
            3,
            "flow {i} was left to the other applier"
        );
    }
    let slow_applied: u64 = (1..=3).map(|i| applied(&slow_drains, i)).sum();
    assert_eq!(slow_applied, 8);
    assert!(violations.lock().unwrap().is_empty(), "{violations:?}");
}

/// Waits until exactly one session of the test's database (named
/// `application_name`, when given) waits for a lock.
fn wait_for_one_lock_wait(target: &str, application_name: Option<&str>, what: &str) {
    let mut checker = client(target);
    wait_until(what, BOUND, || {
        checker
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                 AND ($1::text IS NULL OR application_name = $1) AND wait_event_type = 'Lock'",
                &[&application_name],
            )
            .unwrap()
            .get::<_, i64>(0)
            == 1
    });
}

/// A writer that has appended a flow's next event in a transaction it
/// keeps open (the flow's head locked) until told to commit.
struct OpenAppend {
    commit: mpsc::Sender<()>,
    writer: std::thread::JoinHandle<Envelope>,
}

impl OpenAppend {
    /// Returns once the event is appended, its transaction still open.
    fn start(target: &str, flow_id: &ordo_core::FlowId) -> OpenAppend {
        let (appended_tx, appended) = mpsc::channel();
        let (commit, told) = mpsc::channel::<()>();
        let (target, flow_id) = (target.to_owned(), flow_id.clone());
        let writer = std::thread::spawn(move || {
            let mut store = producer(&target, "writer", 600_000);
            store
                .write(|ptx| {
                    let event = ptx.append(
                        &flow_id,
                        "record",
                        ordo_core::SchemaVersion::V1,
                        &serde_json::json!({}),
                    )?;
                    appended_tx.send(()).unwrap();
                    told.recv_timeout(BOUND).expect("told to commit");
                    Ok::<_, ordo_core::AppendError>(event)
                })
                .unwrap()
        });
        appended.recv_timeout(BOUND).expect("the writer appended");
        OpenAppend { commit, writer }
    }

    /// Commits the writer's transaction; returns the event it appended.
    fn commit(self) -> Envelope {
        self.commit.send(()).unwrap();
        self.writer.join().unwrap()
    }
}

#[test]
fn a_relay_head_is_not_moved_past_an_event_appended_during_bookkeeping() {
    let (_serial, _dir, target) = fresh_database_alone();
    let (mut relay_store, f, first) = relay_holding_first(&target, "bookkeeper");

    // A writer appends the flow's next event and holds its transaction
    // open, the flow's head locked.
    let writer = OpenAppend::start(&target, &f);
    // The relay records the first event's receipt meanwhile: it waits for
    // the writer's lock.
    let bookkeeping = std::thread::spawn(move || {
        record_accepted(&mut relay_store, &first);
        relay_store
    });
    wait_for_one_lock_wait(
        &target,
        Some("ordo-relay-bookkeeper"),
        "the bookkeeping waits for the writer",
    );
    let second = writer.commit();
    let mut relay_store = bookkeeping.join().unwrap();
    let round = fair_round_now(&mut relay_store, 10);
    assert_round(&round, &[&second], "the new event is the head");
}

/// A relay's bookkeeping takes the heads of its flows in key order, as
/// writers do, whatever order the server reads them in: a writer that
/// holds one flow's head and then asks for the next never waits for a
/// relay that holds the next and waits for the first (a deadlock, which the
/// server breaks by failing one of them). The relay's session is told to
/// read every table in storage order, where the later flow's head comes
/// first.
#[test]
fn a_relays_bookkeeping_and_a_writer_take_heads_in_one_order() {
    let (_serial, _dir, target) = fresh_database_alone();
    let storage_order = format!(
        "{target}?options=-c%20enable_indexscan%3Doff%20-c%20enable_bitmapscan%3Doff%20-c%20enable_indexonlyscan%3Doff"
    );
    let mut relay_store = producer(&storage_order, "bookkeeper", 600_000);
    let (first_key, second_key) = (flow(1), flow(2));
    // The second flow's head is stored first.
    let second = append(&mut relay_store, &second_key).unwrap();
    let first = append(&mut relay_store, &first_key).unwrap();
    let round = fair_round_now(&mut relay_store, 10);
    assert_eq!(round.len(), 2, "{:?}", ids(&round));

    // A writer appends to the first flow, then (when told) to the second,
    // in one transaction.
    let (appended_tx, appended) = mpsc::channel();
    let (go, told) = mpsc::channel::<()>();
    let writer = {
        let (target, first_key, second_key) =
            (target.clone(), first_key.clone(), second_key.clone());
        std::thread::spawn(move || {
            let mut store = producer(&target, "writer", 600_000);
            store.write(|ptx| {
                let mut append = |flow_id| {
                    ptx.append(
                        flow_id,
                        "record",
                        ordo_core::SchemaVersion::V1,
                        &serde_json::json!({}),
                    )
                };
                let a = append(&first_key)?;
                appended_tx.send(()).unwrap();
                told.recv_timeout(BOUND).expect("told to go on");
                let b = append(&second_key)?;
                Ok::<_, ordo_core::AppendError>((a, b))
            })
        })
    };
    appended.recv_timeout(BOUND).expect("the writer appended");
    // The relay records both receipts meanwhile: it waits for the writer's
    // lock on the first flow's head.
    let receipts = [
        (first.event_id.clone(), Receipt::Accepted),
        (second.event_id.clone(), Receipt::Accepted),
    ];
    let bookkeeping = std::thread::spawn(move || {
        let recorded = relay_store.record_receipts(&receipts, SystemClock.now_ms());
        (recorded, relay_store)
    });
    wait_for_one_lock_wait(
        &target,
        Some("ordo-relay-bookkeeper"),
        "the bookkeeping waits for the writer",
    );
    go.send(()).unwrap();
    let (a, b) = writer.join().unwrap().expect("the writer commits");
    let (recorded, mut relay_store) = bookkeeping.join().unwrap();
    recorded.expect("the bookkeeping commits");
    let round = fair_round_now(&mut relay_store, 10);
    let mut relayed = ids(&round);
    relayed.sort_unstable();
    let mut written = [a.event_id.as_str(), b.event_id.as_str()];
    written.sort_unstable();
    assert_eq!(relayed, written, "the writer's events are the heads");
}

/// A claim passes by a flow whose head a writer has locked (the head holds
/// the flow's lease) instead of waiting for the writer, and takes the
/// flow in a round after the writer commits.
#[test]
fn a_claim_passes_by_a_flow_a_writer_is_appending_to() {
    let (_serial, _dir, target) = fresh_database_alone();
    let mut relay = producer(&target, "claimer", 600_000);
    let (busy, free) = (flow(1), flow(2));
    let first = append(&mut relay, &busy).unwrap();
    let other = append(&mut relay, &free).unwrap();

    let writer = OpenAppend::start(&target, &busy);
    // The writer commits only once this round has returned: a claim that
    // waited for its lock would never return.
    let round = fair_round_now(&mut relay, 10);
    assert_round(&round, &[&other], "the busy flow passed by");
    writer.commit();

    let round = relay
        .fair_round(10, &BTreeSet::from([free]), SystemClock.now_ms())
        .unwrap();
    assert_round(&round, &[&first], "taken once the writer committed");
}

/// A relay head left at an event that is already accepted (a head moved
/// while its flow's writer committed, the writer's event then accepted by
/// another relay before the head was) is moved by the next round that
/// finds nothing to relay for it.
#[test]
fn a_head_left_at_an_accepted_event_is_moved_by_the_next_round() {
    let (_serial, _dir, target) = fresh_database_alone();
    let (mut relay, f, first) = relay_holding_first(&target, "relay");
    record_accepted(&mut relay, &first);
    let mut checker = client(&target);
    let head = |checker: &mut postgres::Client| -> Option<i64> {
        checker
            .query_one(
                "SELECT relay_seq FROM ordo_producer.relay_head WHERE flow_id = $1",
                &[&f.as_str()],
            )
            .unwrap()
            .get(0)
    };
    assert_eq!(head(&mut checker), None, "caught up");
    checker
        .execute(
            "UPDATE ordo_producer.relay_head SET relay_seq = 1 WHERE flow_id = $1",
            &[&f.as_str()],
        )
        .unwrap();

    let round = fair_round_now(&mut relay, 10);
    assert!(round.is_empty(), "nothing to relay: {:?}", ids(&round));
    assert_eq!(
        head(&mut checker),
        None,
        "the head is moved past the accepted event"
    );
    let second = append(&mut relay, &f).unwrap();
    let round = fair_round_now(&mut relay, 10);
    assert_round(&round, &[&second], "");
}

/// Delivers to a consumer, letting another relay claim the round's flows
/// first (the lease lapsed while the round was on its way).
struct OvertakenOnTheWay<'a> {
    to: &'a mut ordo_postgres::PgConsumer,
    overtaker: &'a mut ordo_postgres::PgProducer,
}

impl ordo_core::Transport for OvertakenOnTheWay<'_> {
    fn deliver(
        &mut self,
        _: Option<&ordo_core::StoreId>,
        events: &[Envelope],
    ) -> Result<Vec<Receipt>, ordo_core::TransportError> {
        let claimed = self
            .overtaker
            .fair_round(100, &BTreeSet::new(), SystemClock.now_ms())
            .expect("the other relay claims");
        assert_eq!(claimed.len(), events.len(), "it claims the round's flows");
        Ok(self.to.receive_batch(events)?)
    }
}

#[test]
fn a_relay_overtaken_on_a_round_leaves_its_flows_to_the_new_holder() {
    let (_serial, _dir, target) = fresh_database_alone();
    let mut slow = producer(&target, "slow", 0);
    let mut other = producer(&target, "other", 600_000);
    for i in 0..3 {
        append(&mut slow, &flow(i)).unwrap();
    }
    let mut to = consumer(&target, "receiver");
    let mut transport = OvertakenOnTheWay {
        to: &mut to,
        overtaker: &mut other,
    };
    let report = relay(&mut slow, &mut transport, &relay_options(8), &SystemClock)
        .expect("the run goes on past the refused bookkeeping");
    assert_eq!(report.stop, ordo_core::RelayStop::Drained);
    assert!(
        report.deliveries.is_empty(),
        "nothing recorded by the slow relay"
    );
    assert!(
        slow.outbox_entries(false, 10)
            .unwrap()
            .iter()
            .all(|e| !e.accepted && e.attempts == 0),
        "nothing written"
    );
    // The new holder hands the events over again: duplicates, now marked.
    let report = relay(&mut other, &mut to, &relay_options(8), &SystemClock).unwrap();
    assert_eq!(report.deliveries.len(), 3);
    assert!(report
        .deliveries
        .iter()
        .all(|d| d.receipt == Receipt::Duplicate));
    assert_eq!(backlog(&mut other), 0);
}

/// The positions of `custody_pending` (the one destination's) and of the
/// outbox rows not accepted.
fn pending_positions(checker: &mut postgres::Client) -> (Vec<i64>, Vec<i64>) {
    let column = |checker: &mut postgres::Client, sql: &str| -> Vec<i64> {
        checker
            .query(sql, &[])
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    };
    (
        column(
            checker,
            "SELECT position FROM ordo_producer.custody_pending ORDER BY position",
        ),
        column(
            checker,
            "SELECT position FROM ordo_producer.outbox WHERE NOT accepted ORDER BY position",
        ),
    )
}

#[test]
fn the_pending_list_follows_custody_appends_refusals_marks_and_quarantines() {
    let (_serial, _dir, target) = fresh_database_alone();
    let mut relay = producer(&target, "custody", 600_000);
    let mut checker = client(&target);
    let a1 = append(&mut relay, &flow(1)).unwrap();
    let b1 = append(&mut relay, &flow(2)).unwrap();
    let a2 = append(&mut relay, &flow(1)).unwrap();
    // A batch whose second event reuses an id keeps its first event and
    // takes back the third, inserted before the refusal was known.
    let first_of = |i: usize| Envelope {
        flow_id: flow(i),
        event_id: EventId::for_seq(&flow(i), a1.seq),
        ..a1.clone()
    };
    let (c1, d1) = (first_of(3), first_of(5));
    let reused = Envelope {
        event_id: a1.event_id.clone(),
        ..first_of(4)
    };
    relay
        .write(|ptx| -> Result<(), ordo_core::AppendError> {
            match ptx.append_envelopes(&[c1.clone(), reused, d1]) {
                Err(ordo_core::AppendError::EventIdUsed(id)) => assert_eq!(id, a1.event_id),
                other => panic!("an event id in use is refused: {other:?}"),
            }
            Ok(())
        })
        .unwrap();
    let now = SystemClock.now_ms();
    let (listed, unaccepted) = pending_positions(&mut checker);
    assert_eq!(listed, unaccepted);
    assert_eq!(
        listed.len(),
        4,
        "the refused events left nothing: {listed:?}"
    );
    assert_eq!(
        ids(&relay.pending(10).unwrap()),
        ids(&[a1.clone(), b1.clone(), a2.clone(), c1.clone()]),
        "in append order"
    );
    assert_eq!(relay.producer_status(now).unwrap().backlog, 4);

    let round = relay.fair_round(10, &BTreeSet::new(), now).unwrap();
    assert_eq!(ids(&round), ids(&[a1.clone(), b1.clone(), c1.clone()]));
    relay
        .record_receipts(&[(a1.event_id.clone(), Receipt::Accepted)], now)
        .unwrap();
    relay
        .quarantine(&b1.event_id, "too_large", "too_large: test", now)
        .unwrap();
    let (listed, unaccepted) = pending_positions(&mut checker);
    assert_eq!(listed, unaccepted);
    assert_eq!(listed.len(), 3, "the accepted event left the list");
    assert_eq!(relay.oldest_unaccepted(now).unwrap(), Some(b1.clone()));
    let status = relay.producer_status(now).unwrap();
    assert_eq!((status.backlog, status.quarantined), (3, 1));
}

/// A batch whose insert meets an event another receiver stored after the
/// batch read the inbox is decided again, one envelope at a time, against
/// what that receiver committed: the raced event is a duplicate, the
/// others are accepted, and each is stored once.
#[test]
fn a_received_batch_that_loses_a_race_is_decided_again() {
    let (_serial, _dir, target) = fresh_database_alone();
    let mut source = producer(&target, "source", 60_000);
    let events: Vec<Envelope> = (0..3)
        .map(|i| append(&mut source, &flow(i)).unwrap())
        .collect();

    // Another receiver stores the second event and holds its transaction
    // open: the batch reads the inbox without it, then waits on its key.
    let mut rival = client(&target);
    let mut open = rival.transaction().unwrap();
    let raced = &events[1];
    open.execute(
        "INSERT INTO ordo_testkit.inbox (event_id, flow_id, seq, schema_version, type, body,
             body_hash, status, received_at_ms, producer)
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', 0, 'default')",
        &[
            &raced.event_id.as_str(),
            &raced.flow_id.as_str(),
            &raced.seq.get(),
            &raced.schema_version.get(),
            &raced.event_type.as_str(),
            &raced.stored_text(),
            &raced.body_hash().as_str(),
        ],
    )
    .unwrap();
    let receiving = {
        let (target, events) = (target.clone(), events.clone());
        std::thread::spawn(move || consumer(&target, "receiver").receive_batch(&events))
    };
    wait_for_one_lock_wait(&target, None, "the batch waits for the rival's row");
    let mut checker = client(&target);
    open.commit().unwrap();

    let receipts = receiving.join().unwrap().unwrap();
    assert_eq!(
        receipts,
        [Receipt::Accepted, Receipt::Duplicate, Receipt::Accepted]
    );
    let stored: Vec<(String, i64)> = checker
        .query(
            "SELECT event_id, count(*) FROM ordo_testkit.inbox GROUP BY event_id ORDER BY event_id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let mut expected: Vec<(String, i64)> = events
        .iter()
        .map(|e| (e.event_id.as_str().to_owned(), 1))
        .collect();
    expected.sort();
    assert_eq!(stored, expected, "each event stored once");
}
