//! `ordo soak`: producers, relays and appliers as child processes, killed with
//! SIGKILL at random instants, then left to converge; the end state is checked
//! against the protocol's invariants.

#[allow(unused_imports)]
use ordo_reservation::{
    AdvanceRequest, ApplyOptions, FlowState, Quantity, ReservationHandler, ReservationProducer,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use ordo_core::{Clock, InboxStatus, SystemClock};
use serde_json::json;

use crate::args::SoakArgs;
use crate::context::emit;
use crate::experiment::child::finish;
use crate::Failure;

/// The shortest and longest pause between two kills.
const KILL_PAUSE_MS: (u64, u64) = (5, 60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    Produce,
    Relay,
    Apply,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Produce => "produce",
            Role::Relay => "relay",
            Role::Apply => "apply",
        }
    }
}

struct Worker {
    role: Role,
    child: Option<Child>,
}

struct Soak {
    exe: PathBuf,
    producer: PathBuf,
    consumer: PathBuf,
    produced_marker: PathBuf,
    relayed_marker: PathBuf,
    flows: u64,
    /// Producers spread the flows over this window (ms since the epoch).
    spread_ms: (i64, i64),
}

impl Soak {
    fn spawn(&self, role: Role) -> Result<Child, Failure> {
        let mut command = Command::new(&self.exe);
        command.args(["--json", "worker", role.as_str()]);
        match role {
            Role::Produce => command.arg("--producer").arg(&self.producer).args([
                "--count",
                &self.flows.to_string(),
                "--quantity",
                "7",
                "--spread-from-ms",
                &self.spread_ms.0.to_string(),
                "--spread-until-ms",
                &self.spread_ms.1.to_string(),
            ]),
            Role::Relay => command
                .arg("--producer")
                .arg(&self.producer)
                .arg("--consumer")
                .arg(&self.consumer)
                .arg("--until")
                .arg(&self.produced_marker),
            Role::Apply => command
                .arg("--consumer")
                .arg(&self.consumer)
                .arg("--until")
                .arg(&self.relayed_marker),
        };
        command
            .env_remove(ordo_core::crash::CRASH_POINT_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Failure::Internal(format!("cannot start {}: {e}", self.exe.display())))
    }
}

/// Collects a worker that exited by itself; a non-zero exit is a violation.
fn reap(worker: &mut Worker, violations: &mut Vec<String>) -> Result<bool, Failure> {
    let Some(child) = worker.child.as_mut() else {
        return Ok(true);
    };
    match child.try_wait() {
        Ok(None) => Ok(false),
        Ok(Some(_)) => {
            let child = worker.child.take().expect("checked above");
            let run = finish(child, worker.role.as_str()).map_err(Failure::Internal)?;
            if run.code != 0 {
                violations.push(format!(
                    "a {} worker exited {}: {}",
                    worker.role.as_str(),
                    run.code,
                    run.stderr.trim()
                ));
            }
            Ok(true)
        }
        Err(e) => Err(Failure::Internal(format!("cannot wait for a worker: {e}"))),
    }
}

pub fn run(json_mode: bool, args: SoakArgs) -> Result<(), Failure> {
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    let mut rng = fastrand::Rng::with_seed(seed);
    let temp = tempfile::Builder::new()
        .prefix("ordo-soak-")
        .tempdir()
        .map_err(|e| Failure::Internal(format!("cannot create a temporary directory: {e}")))?;
    let dir: PathBuf = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| Failure::Internal(format!("cannot create {}: {e}", dir.display())))?;
            if dir.join("producer.db").exists() || dir.join("consumer.db").exists() {
                return Err(Failure::Usage(format!(
                    "--dir {} already holds ordo files",
                    dir.display()
                )));
            }
            dir.clone()
        }
        None => temp.path().to_path_buf(),
    };
    let soak = Soak {
        exe: std::env::current_exe()
            .map_err(|e| Failure::Internal(format!("cannot find the ordo binary: {e}")))?,
        producer: dir.join("producer.db"),
        consumer: dir.join("consumer.db"),
        produced_marker: dir.join("produced.done"),
        relayed_marker: dir.join("relayed.done"),
        flows: args.flows,
        spread_ms: {
            let now_ms = SystemClock.now_ms();
            // Most of the kill window, so that kills meet producers at work.
            (now_ms, now_ms + (args.seconds as i64 * 1000) * 4 / 5)
        },
    };
    // Create both files before any worker starts.
    ordo_reservation::open_producer(&soak.producer)?;
    ordo_reservation::open_consumer(&soak.consumer)?;

    let roles = [
        Role::Produce,
        Role::Produce,
        Role::Relay,
        Role::Relay,
        Role::Apply,
        Role::Apply,
    ];
    let mut workers = Vec::new();
    for role in roles {
        workers.push(Worker {
            role,
            child: Some(soak.spawn(role)?),
        });
    }
    let mut violations = Vec::new();
    let mut kills: BTreeMap<Role, u64> = BTreeMap::new();
    let bar = ProgressBar::new(args.seconds);
    bar.set_style(
        ProgressStyle::with_template("soak [{bar:40}] {pos}/{len} s {msg}")
            .expect("the template is valid")
            .progress_chars("=> "),
    );

    let started = Instant::now();
    let window = Duration::from_secs(args.seconds);
    while started.elapsed() < window {
        std::thread::sleep(Duration::from_millis(
            rng.u64(KILL_PAUSE_MS.0..=KILL_PAUSE_MS.1),
        ));
        for worker in workers.iter_mut() {
            reap(worker, &mut violations)?;
        }
        // Producers that finished stay finished; relays and appliers never do.
        let live: Vec<usize> = (0..workers.len())
            .filter(|&i| workers[i].child.is_some())
            .collect();
        if live.is_empty() {
            continue;
        }
        let victim = &mut workers[live[rng.usize(..live.len())]];
        let mut child = victim.child.take().expect("a live worker has a child");
        // Child::kill sends SIGKILL on Unix.
        if child.kill().is_ok() {
            *kills.entry(victim.role).or_default() += 1;
        }
        let _ = child.wait();
        victim.child = Some(soak.spawn(victim.role)?);
        bar.set_position(started.elapsed().as_secs().min(args.seconds));
        bar.set_message(format!("{} kills", kills.values().sum::<u64>()));
    }
    bar.finish_and_clear();

    // Converge without kills: producers finish, then relays, then appliers.
    for (role, marker) in [
        (Role::Produce, Some(&soak.produced_marker)),
        (Role::Relay, Some(&soak.relayed_marker)),
        (Role::Apply, None),
    ] {
        for worker in workers.iter_mut().filter(|w| w.role == role) {
            if let Some(child) = worker.child.take() {
                let run = finish(child, role.as_str()).map_err(Failure::Internal)?;
                if run.code != 0 {
                    violations.push(format!(
                        "a {} worker exited {}: {}",
                        role.as_str(),
                        run.code,
                        run.stderr.trim()
                    ));
                }
            }
        }
        if let Some(marker) = marker {
            std::fs::write(marker, b"done").map_err(|e| {
                Failure::Internal(format!("cannot write {}: {e}", marker.display()))
            })?;
        }
    }
    let events = check_invariants(&soak.producer, &soak.consumer, args.flows, &mut violations)?;
    let total_kills: u64 = kills.values().sum();
    let value = json!({
        "seconds": args.seconds,
        "flows": args.flows,
        "seed": seed,
        "kills": total_kills,
        "kills_by_role": kills.iter().map(|(r, n)| (r.as_str().to_owned(), json!(n))).collect::<serde_json::Map<_, _>>(),
        "events": events,
        "violations": violations,
        "verdict": if violations.is_empty() { "ok" } else { "violated" },
    });
    emit(json_mode, &value, || {
        let mut lines = vec![
            format!("seed     {seed}"),
            format!("kills    {total_kills} (SIGKILL) over {} s", args.seconds),
            format!("events   {events}"),
        ];
        if violations.is_empty() {
            lines.push("verdict  ok: nothing lost, each event once, one effect per (flow, seq), in order, every flow released".into());
        } else {
            lines.push("verdict  VIOLATED".into());
            lines.extend(violations.iter().map(|v| format!("  {v}")));
        }
        lines.join("\n")
    });
    if violations.is_empty() {
        Ok(())
    } else {
        Err(Failure::Check(format!(
            "soak found {} violation(s); first: {}",
            violations.len(),
            violations[0]
        )))
    }
}

/// Checks the end state; returns the number of committed events.
fn check_invariants(
    producer: &Path,
    consumer: &Path,
    flows: u64,
    violations: &mut Vec<String>,
) -> Result<usize, Failure> {
    let (flow_records, outbox) =
        ordo_reservation::producer_snapshot(&mut ordo_reservation::open_producer(producer)?)?;
    let (inbox, projections, effects) =
        ordo_reservation::consumer_snapshot(&mut ordo_reservation::open_consumer(consumer)?)?;
    let expected_events = flows as usize * 3;
    let mut report = |ok: bool, message: String| {
        if !ok {
            violations.push(message);
        }
    };
    report(
        flow_records.len() == flows as usize
            && flow_records
                .iter()
                .all(|f| f.state == FlowState::Released && f.last_seq == 3),
        format!(
            "producer: {} flows, not all released at seq 3 (expected {flows})",
            flow_records.len()
        ),
    );
    report(
        outbox.len() == expected_events,
        format!(
            "outbox holds {} events, expected {expected_events}",
            outbox.len()
        ),
    );
    let unaccepted = outbox.iter().filter(|r| !r.accepted).count();
    report(
        unaccepted == 0,
        format!("{unaccepted} outbox events never accepted"),
    );
    let by_id: BTreeMap<&str, &ordo_core::InboxRecord> = inbox
        .iter()
        .map(|r| (r.envelope.event_id.as_str(), r))
        .collect();
    report(
        by_id.len() == inbox.len() && inbox.len() == outbox.len(),
        format!(
            "inbox holds {} rows ({} distinct ids) for {} committed events",
            inbox.len(),
            by_id.len(),
            outbox.len()
        ),
    );
    for row in &outbox {
        match by_id.get(row.envelope.event_id.as_str()) {
            None => report(
                false,
                format!(
                    "committed event {} lost: not in the inbox",
                    row.envelope.event_id
                ),
            ),
            Some(stored) => report(
                stored.envelope == row.envelope,
                format!(
                    "event {} stored with a different body",
                    row.envelope.event_id
                ),
            ),
        }
    }
    let not_applied: Vec<String> = inbox
        .iter()
        .filter(|r| r.status != InboxStatus::Applied)
        .map(|r| format!("{} ({})", r.envelope.event_id, r.status.as_str()))
        .collect();
    report(
        not_applied.is_empty(),
        format!("inbox rows not applied: {}", not_applied.join(", ")),
    );
    let distinct: BTreeSet<(String, i64)> = effects
        .iter()
        .map(|e| (e.flow_id.to_string(), e.seq.get()))
        .collect();
    report(
        effects.len() == expected_events && distinct.len() == effects.len(),
        format!("{} effects for {} distinct (flow, seq); expected exactly one per event ({expected_events})", effects.len(), distinct.len()),
    );
    for effect in &effects {
        let matches = by_id
            .get(effect.event_id.as_str())
            .is_some_and(|r| r.envelope.flow_id == effect.flow_id && r.envelope.seq == effect.seq);
        report(
            matches,
            format!(
                "effect {} {} does not match its inbox event",
                effect.flow_id, effect.seq
            ),
        );
    }
    let released = projections
        .iter()
        .filter(|p| p.state == FlowState::Released && p.applied_seq == 3)
        .count();
    report(
        projections.len() == flows as usize && released == projections.len(),
        format!(
            "projection: {} flows, {released} released in order at seq 3 (expected {flows})",
            projections.len()
        ),
    );
    Ok(outbox.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_core::{relay, FlowId, RelayOptions, SchemaVersion, SystemClock};

    /// Two flows through all steps, relayed and applied, in `dir`.
    fn converged(dir: &Path) -> (PathBuf, PathBuf) {
        let (p, c) = (dir.join("producer.db"), dir.join("consumer.db"));
        let mut producer = ordo_reservation::open_producer(&p).unwrap();
        let mut consumer = ordo_reservation::open_consumer(&c).unwrap();
        for i in 1..=2 {
            let flow = FlowId::new(format!("flow-{i:07}")).unwrap();
            for (seq, to) in [
                FlowState::Reserved,
                FlowState::Confirmed,
                FlowState::Released,
            ]
            .into_iter()
            .enumerate()
            {
                let request = AdvanceRequest::new(
                    flow.clone(),
                    seq as i64,
                    to,
                    Some(Quantity::new(7).unwrap()),
                    SchemaVersion::V1,
                )
                .unwrap();
                producer.advance(&request).unwrap();
            }
        }
        relay(
            &mut producer,
            &mut consumer,
            &RelayOptions::default(),
            &SystemClock,
        )
        .unwrap();
        ordo_core::process_all(&mut consumer, None, &mut ReservationHandler::default(), 64)
            .unwrap();
        (p, c)
    }

    #[test]
    fn a_converged_state_has_no_violation() {
        let dir = tempfile::tempdir().unwrap();
        let (p, c) = converged(dir.path());
        let mut violations = Vec::new();
        assert_eq!(check_invariants(&p, &c, 2, &mut violations).unwrap(), 6);
        assert!(violations.is_empty(), "{violations:?}");
    }

    #[test]
    fn each_broken_invariant_is_reported() {
        let cases: [(&str, &str); 5] = [
            ("DELETE FROM inbox WHERE event_id = 'flow-0000001-2'", "lost"),
            ("DELETE FROM effect WHERE event_id = 'flow-0000002-3'", "effects"),
            ("UPDATE inbox SET status = 'pending' WHERE event_id = 'flow-0000001-3'", "not applied"),
            ("UPDATE projection SET state = 'confirmed', applied_seq = 2 WHERE flow_id = 'flow-0000001'", "projection"),
            ("UPDATE inbox SET body = replace(body, '\"amount\":7', '\"amount\":8') WHERE event_id = 'flow-0000001-1'", "different body"),
        ];
        for (sql, expected) in cases {
            let dir = tempfile::tempdir().unwrap();
            let (p, c) = converged(dir.path());
            ordo_sqlite::rusqlite::Connection::open(&c)
                .unwrap()
                .execute(sql, [])
                .unwrap();
            let mut violations = Vec::new();
            check_invariants(&p, &c, 2, &mut violations).unwrap();
            assert!(
                violations.iter().any(|v| v.contains(expected)),
                "{sql}: {violations:?} lacks {expected:?}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let (p, c) = converged(dir.path());
        ordo_sqlite::rusqlite::Connection::open(&p)
            .unwrap()
            .execute(
                "UPDATE outbox SET accepted = 0 WHERE event_id = 'flow-0000002-1'",
                [],
            )
            .unwrap();
        let mut violations = Vec::new();
        check_invariants(&p, &c, 2, &mut violations).unwrap();
        assert!(
            violations.iter().any(|v| v.contains("never accepted")),
            "{violations:?}"
        );
    }
}
