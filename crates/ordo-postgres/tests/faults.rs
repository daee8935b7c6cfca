//! ordo's own connections ended by the server (`pg_terminate_backend`,
//! chosen by their `application_name`) at random instants while a
//! producer, two relays and two appliers run: every store reconnects, and
//! everything converges with nothing lost, each event accepted and applied
//! once, in order.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ordo_core::{process_all, relay, ErrorKind, SystemClock};
use support::workers::{
    all_settled, append, check_converged, client, flow, opened, relay_options, try_consumer,
    try_producer, wait_until, Ordered, Violations,
};
use support::{database_for, url};

const BOUND: Duration = Duration::from_secs(180);
const FLOWS: usize = 12;
const EVENTS: usize = 1_200;
const KILLS: usize = 80;

#[test]
fn terminated_connections_at_random_instants_still_converge() {
    converge_through_terminations("");
}

/// The same over TLS: a session ended by the server is a closed TLS stream,
/// seen and recovered from as a closed socket is.
#[test]
fn terminated_tls_connections_at_random_instants_still_converge() {
    converge_through_terminations("?sslmode=require");
}

/// Runs the workers on a fresh database through the URL with `params`
/// while their sessions are ended at random.
fn converge_through_terminations(params: &str) {
    let dir = tempfile::tempdir().unwrap();
    let target = format!("{}{params}", url(&database_for(dir.path())));
    let stop = Arc::new(AtomicBool::new(false));
    let violations: Violations = Arc::default();
    let errors: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let note = |errors: &Arc<Mutex<BTreeSet<String>>>, kind: ErrorKind| {
        errors.lock().unwrap().insert(format!("{kind:?}"));
    };

    // The producer appends EVENTS events, retrying what failed; an append
    // acknowledged must be in the outbox at the end.
    let producing = {
        let (target, errors) = (target.clone(), errors.clone());
        std::thread::spawn(move || {
            let mut store = opened(100, || try_producer(&target, "producer", 1_000));
            let mut acknowledged = Vec::new();
            let mut unknown = 0;
            while acknowledged.len() < EVENTS {
                let f = flow(acknowledged.len() % FLOWS);
                match append(&mut store, &f) {
                    Ok(event) => acknowledged.push(event.event_id),
                    Err(e) if e.kind() == ErrorKind::CommitOutcomeUnknown => {
                        note(&errors, e.kind());
                        unknown += 1;
                    }
                    Err(e) => note(&errors, e.kind()),
                }
            }
            (acknowledged, unknown)
        })
    };
    let relays: Vec<_> = (0..2)
        .map(|i| {
            let (target, stop, errors) = (target.clone(), stop.clone(), errors.clone());
            std::thread::spawn(move || {
                let owner = format!("r{i}");
                let mut from = opened(100, || try_producer(&target, &owner, 1_000));
                let mut to = opened(100, || try_consumer(&target, &owner));
                while !stop.load(Ordering::SeqCst) {
                    match relay(&mut from, &mut to, &relay_options(8), &SystemClock) {
                        Ok(report) if report.deliveries.is_empty() => {
                            std::thread::sleep(Duration::from_millis(5))
                        }
                        Ok(_) => {}
                        Err(e) => {
                            note(&errors, e.kind().unwrap_or(ErrorKind::Other));
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                }
            })
        })
        .collect();
    let appliers: Vec<_> = (0..2)
        .map(|i| {
            let (target, stop, errors) = (target.clone(), stop.clone(), errors.clone());
            let violations = violations.clone();
            std::thread::spawn(move || {
                let mut store = opened(100, || try_consumer(&target, &format!("a{i}")));
                let mut handler = Ordered { violations };
                while !stop.load(Ordering::SeqCst) {
                    match process_all(&mut store, None, &mut handler, 16) {
                        Ok(drains) if drains.iter().all(|d| d.applied == 0) => {
                            std::thread::sleep(Duration::from_millis(5))
                        }
                        Ok(_) => {}
                        Err(e) => {
                            note(&errors, e.kind());
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                }
            })
        })
        .collect();

    // Ends one of ordo's connections on this database at a time, never
    // another program's (nor this checking connection).
    let mut killer = client(&target);
    let mut killed = BTreeSet::new();
    for _ in 0..KILLS {
        std::thread::sleep(Duration::from_millis(fastrand::u64(5..60)));
        let victims: Vec<(i32, String)> = killer
            .query(
                "SELECT pid, application_name FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name LIKE 'ordo-%'
                   AND pid <> pg_backend_pid()",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        if victims.is_empty() {
            continue;
        }
        let (pid, name) = &victims[fastrand::usize(..victims.len())];
        let ended: bool = killer
            .query_one("SELECT pg_terminate_backend($1)", &[pid])
            .unwrap()
            .get(0);
        if ended {
            killed.insert(name.clone());
        }
    }
    let (acknowledged, unknown) = producing.join().expect("the producer");
    wait_until("everything converges", BOUND, || all_settled(&mut killer));
    stop.store(true, Ordering::SeqCst);
    relays
        .into_iter()
        .chain(appliers)
        .for_each(|t| t.join().expect("a worker"));

    eprintln!(
        "ended connections of {killed:?}; errors seen: {:?}",
        errors.lock().unwrap()
    );
    let per_flow = check_converged(&target);
    let outbox: BTreeSet<String> = killer
        .query("SELECT event_id FROM ordo_producer.outbox", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for event_id in &acknowledged {
        assert!(outbox.contains(event_id.as_str()), "{event_id} was lost");
    }
    let total: i64 = per_flow.values().sum();
    assert!(
        total as usize >= acknowledged.len() && total as usize <= acknowledged.len() + unknown,
        "{total} events for {} acknowledged and {unknown} unknown",
        acknowledged.len()
    );
    assert!(violations.lock().unwrap().is_empty(), "{violations:?}");
    assert!(
        killed.len() >= 3,
        "connections of several workers were ended: {killed:?}"
    );
}
