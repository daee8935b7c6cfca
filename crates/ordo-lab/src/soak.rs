//! The soak: producers, relays and appliers as child processes, killed with
//! SIGKILL at random instants, then left to converge; the end state is
//! checked against the protocol's invariants. Over HTTP the relays post to
//! an `ordo serve` child, which is killed and started again too.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ordo_core::{Clock, SystemClock};
use ordo_testkit::check::{check_end_state, EndState, Finished, Snapshot, Violation};

use crate::experiment::child::{finish_within, WATCHDOG};
use crate::serve::{loopback_any, ServeSpec};
use crate::{internal, LabError, Progress};

/// The shortest and longest pause between two kills.
const KILL_PAUSE_MS: (u64, u64) = (5, 60);
/// Attempts to start a killed server again on its port before it takes a
/// new one.
const SERVER_BIND_ATTEMPTS: u32 = 20;
/// The pause between two of those attempts.
const SERVER_BIND_PAUSE: Duration = Duration::from_millis(25);

/// How the relays reach the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoakTransport {
    /// They open the consumer file.
    File,
    /// They post to an `ordo serve` child on the loopback interface.
    Http,
}

impl SoakTransport {
    /// The transport's name, as `--transport` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            SoakTransport::File => "file",
            SoakTransport::Http => "http",
        }
    }
}

/// What the soak runs.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// The `ordo` binary, whose hidden `worker` command the workers run.
    pub exe: PathBuf,
    /// How long to keep killing workers.
    pub seconds: u64,
    /// How many flows the producers drive through all three steps.
    pub flows: u64,
    /// The seed of the kill schedule (random if `None`).
    pub seed: Option<u64>,
    /// Keep the files in this directory (a temporary one if `None`).
    pub dir: Option<PathBuf>,
    /// Also give half of the workers started while killing an injected
    /// fault (an I/O error or a full disk at a random write, a failed sync
    /// at a random sync): such a worker fails as a real disk would make it
    /// fail, and is started again.
    pub faults: bool,
    /// How the relays reach the consumer.
    pub transport: SoakTransport,
    /// Threads in each producer process: 1 is one thread calling
    /// `advance`; more share one group-committing writer and record every
    /// event acknowledged to them, which the end check looks for.
    pub producer_threads: u64,
}

/// What the soak did and found.
#[derive(Debug, Clone)]
pub struct SoakReport {
    /// How long workers were killed, in seconds.
    pub seconds: u64,
    /// How many flows.
    pub flows: u64,
    /// The seed of the kill schedule.
    pub seed: u64,
    /// How the relays reached the consumer.
    pub transport: SoakTransport,
    /// Times a killed server could not have its port again and took a new
    /// one (relays started later use it).
    pub server_moves: u64,
    /// SIGKILLs sent, by role.
    pub kills_by_role: BTreeMap<Role, u64>,
    /// Events committed.
    pub events: usize,
    /// Workers started with an injected fault armed.
    pub faults_armed: u64,
    /// Workers that exited with an error while a fault was armed (the
    /// fault met, or its consequences): expected, started again.
    pub fault_exits: u64,
    /// Workers that exited with an error, one line each.
    pub worker_failures: Vec<String>,
    /// The end state's violations.
    pub end_state: Vec<Violation>,
    /// Events acknowledged as committed to a grouped producer's threads,
    /// each checked to be in the outbox (0 with one thread per producer).
    pub acknowledged: u64,
}

impl SoakReport {
    /// Every violation, worker failures first; empty when the soak held.
    pub fn violations(&self) -> Vec<String> {
        let end_state = self.end_state.iter().map(|v| v.to_string());
        self.worker_failures
            .iter()
            .cloned()
            .chain(end_state)
            .collect()
    }

    /// All kills.
    pub fn kills(&self) -> u64 {
        self.kills_by_role.values().sum()
    }
}

/// A worker's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Advances flows.
    Produce,
    /// Relays events.
    Relay,
    /// Applies events.
    Apply,
    /// Serves the consumer's inbox over HTTP.
    Server,
}

impl Role {
    /// The role's name, as the `worker` command takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Produce => "produce",
            Role::Relay => "relay",
            Role::Apply => "apply",
            Role::Server => "server",
        }
    }
}

struct Worker {
    role: Role,
    child: Option<Child>,
    /// Whether the running child has a fault armed.
    faulted: bool,
    /// The server address a relay over HTTP was started with.
    server: Option<SocketAddr>,
}

impl Worker {
    fn new(role: Role) -> Worker {
        Worker {
            role,
            child: None,
            faulted: false,
            server: None,
        }
    }
}

/// What the kill loop and the workers' exits added up to.
#[derive(Default)]
struct Tally {
    kills: BTreeMap<Role, u64>,
    faults_armed: u64,
    fault_exits: u64,
    failures: Vec<String>,
    server_moves: u64,
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
    /// The directory of both files, armed by a worker's fault.
    dir: PathBuf,
    /// Whether workers started while killing get faults.
    faults: bool,
    /// The address of the server, once one started.
    server: Cell<Option<SocketAddr>>,
    /// The servers' logs.
    serve_log: PathBuf,
    /// Threads per producer process, and the file of their acks.
    producer_threads: u64,
    acks: PathBuf,
}

impl Soak {
    /// Starts `worker` again, with a fault armed half of the time when the
    /// soak injects faults.
    fn start(
        &self,
        worker: &mut Worker,
        tally: &mut Tally,
        rng: &mut fastrand::Rng,
    ) -> Result<(), LabError> {
        if worker.role == Role::Server {
            worker.child = Some(self.spawn_server(tally)?);
            return Ok(());
        }
        let fault = (self.faults && rng.bool()).then(|| crate::faults::draw(rng, &self.dir));
        worker.faulted = fault.is_some();
        tally.faults_armed += u64::from(worker.faulted);
        worker.server = self.server.get();
        worker.child = Some(self.spawn(worker.role, fault.as_deref())?);
        Ok(())
    }

    /// Starts the server on the port it had (any free port the first
    /// time), retrying while the port is not free yet; past
    /// [`SERVER_BIND_ATTEMPTS`] on a new port, which relays started from
    /// then on use.
    fn spawn_server(&self, tally: &mut Tally) -> Result<Child, LabError> {
        let start = |listen: SocketAddr| {
            crate::serve::start(&ServeSpec {
                exe: &self.exe,
                consumer: &self.consumer,
                listen,
                crash_point: None,
                log: Some(&self.serve_log),
                flags: &[],
            })
        };
        let mut last_error = String::new();
        if let Some(listen) = self.server.get() {
            for _ in 0..SERVER_BIND_ATTEMPTS {
                match start(listen) {
                    Ok(served) => return Ok(served.child),
                    Err(e) => last_error = e,
                }
                std::thread::sleep(SERVER_BIND_PAUSE);
            }
            tally.server_moves += 1;
        }
        let served = start(loopback_any())
            .map_err(|e| LabError::Internal(format!("{e} (before: {last_error})")))?;
        self.server.set(Some(served.addr));
        Ok(served.child)
    }

    /// Starts a worker, with `fault` (a [`crate::faults::FAULT_ENV`] value)
    /// armed in its process if given.
    fn spawn(&self, role: Role, fault: Option<&str>) -> Result<Child, LabError> {
        let mut command = Command::new(&self.exe);
        match fault {
            Some(fault) => command.env(crate::faults::FAULT_ENV, fault),
            None => command.env_remove(crate::faults::FAULT_ENV),
        };
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
            Role::Relay => {
                command.arg("--producer").arg(&self.producer);
                match self.server.get() {
                    Some(addr) => command.arg("--to").arg(format!("http://{addr}")),
                    None => command.arg("--consumer").arg(&self.consumer),
                };
                command.arg("--until").arg(&self.produced_marker)
            }
            Role::Apply => command
                .arg("--consumer")
                .arg(&self.consumer)
                .arg("--until")
                .arg(&self.relayed_marker),
            Role::Server => unreachable!("the server is started by spawn_server"),
        };
        if role == Role::Produce && self.producer_threads > 1 {
            command
                .args(["--threads", &self.producer_threads.to_string(), "--acks"])
                .arg(&self.acks);
        }
        command
            .env_remove(ordo_core::crash::CRASH_POINT_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| LabError::Internal(format!("cannot start {}: {e}", self.exe.display())))
    }
}

/// Collects a finished worker. A non-zero exit is a failure, unless the
/// worker had a fault armed: then it is counted, and the caller starts it
/// again. Returns whether it exited by a fault.
fn collect(
    child: Child,
    worker: &Worker,
    tally: &mut Tally,
    watchdog: Duration,
) -> Result<bool, LabError> {
    let role = worker.role;
    let run = finish_within(child, role.as_str(), watchdog).map_err(LabError::Internal)?;
    if run.code == 0 {
        return Ok(false);
    }
    if worker.faulted {
        tally.fault_exits += 1;
        return Ok(true);
    }
    tally.failures.push(format!(
        "a {} worker exited {}: {}",
        role.as_str(),
        run.code,
        run.stderr.trim()
    ));
    Ok(false)
}

/// Collects a worker that exited by itself, and starts again one that an
/// injected fault stopped, and a server (whose exit is a failure: it runs
/// until stopped).
fn reap(
    soak: &Soak,
    worker: &mut Worker,
    tally: &mut Tally,
    rng: &mut fastrand::Rng,
) -> Result<(), LabError> {
    let Some(child) = worker.child.as_mut() else {
        return Ok(());
    };
    match child.try_wait() {
        Ok(None) => Ok(()),
        Ok(Some(_)) => {
            let child = worker.child.take().expect("checked above");
            if collect(child, worker, tally, WATCHDOG)? || worker.role == Role::Server {
                soak.start(worker, tally, rng)?;
            }
            Ok(())
        }
        Err(e) => Err(LabError::Internal(format!("cannot wait for a worker: {e}"))),
    }
}

/// The directory of the files: `dir`, which must not hold ordo files yet,
/// or else `temp`.
fn soak_dir(dir: Option<&Path>, temp: &Path) -> Result<PathBuf, LabError> {
    let Some(dir) = dir else {
        return Ok(temp.to_path_buf());
    };
    std::fs::create_dir_all(dir)
        .map_err(|e| LabError::Internal(format!("cannot create {}: {e}", dir.display())))?;
    if dir.join("producer.db").exists() || dir.join("consumer.db").exists() {
        return Err(LabError::Usage(format!(
            "--dir {} already holds ordo files",
            dir.display()
        )));
    }
    Ok(dir.to_path_buf())
}

/// Runs the soak; a violated end state is in the report, not an error.
pub fn run(options: &SoakOptions, progress: &dyn Progress) -> Result<SoakReport, LabError> {
    let seed = options.seed.unwrap_or_else(|| fastrand::u64(..));
    let temp = tempfile::Builder::new()
        .prefix("ordo-soak-")
        .tempdir()
        .map_err(|e| LabError::Internal(format!("cannot create a temporary directory: {e}")))?;
    let dir = soak_dir(options.dir.as_deref(), temp.path())?;
    let soak = Soak {
        exe: options.exe.clone(),
        producer: dir.join("producer.db"),
        consumer: dir.join("consumer.db"),
        produced_marker: dir.join("produced.done"),
        relayed_marker: dir.join("relayed.done"),
        flows: options.flows,
        spread_ms: {
            let now_ms = SystemClock.now_ms();
            // Most of the kill window, so that kills meet producers at work.
            (now_ms, now_ms + (options.seconds as i64 * 1000) * 4 / 5)
        },
        serve_log: dir.join("serve.log"),
        dir: dir.clone(),
        faults: options.faults,
        server: Cell::new(None),
        producer_threads: options.producer_threads,
        acks: dir.join("acks.log"),
    };
    // Create both files before any worker starts.
    ordo_reservation::open_producer(&soak.producer)?;
    ordo_reservation::open_consumer(&soak.consumer)?;

    // The server first: the relays take its address.
    let server = (options.transport == SoakTransport::Http).then_some(Role::Server);
    let roles = server.into_iter().chain([
        Role::Produce,
        Role::Produce,
        Role::Relay,
        Role::Relay,
        Role::Apply,
        Role::Apply,
    ]);
    let mut tally = Tally::default();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut workers = Vec::new();
    for role in roles {
        let mut worker = Worker::new(role);
        soak.start(&mut worker, &mut tally, &mut rng)?;
        workers.push(worker);
    }
    kill_loop(
        &soak,
        &mut workers,
        options.seconds,
        &mut rng,
        &mut tally,
        progress,
    )?;
    converge(&soak, &mut workers, &mut tally)?;
    let (events, end_state) = check_files(&soak.producer, &soak.consumer, options.flows)?;
    let acknowledged = check_acks(&soak.producer, &soak.acks, &mut tally)?;
    Ok(SoakReport {
        seconds: options.seconds,
        flows: options.flows,
        seed,
        transport: options.transport,
        server_moves: tally.server_moves,
        kills_by_role: tally.kills,
        events,
        faults_armed: tally.faults_armed,
        fault_exits: tally.fault_exits,
        worker_failures: tally.failures,
        end_state,
        acknowledged,
    })
}

/// Checks that every event acknowledged to a producer thread is in the
/// outbox; returns how many were acknowledged.
fn check_acks(producer: &Path, acks: &Path, tally: &mut Tally) -> Result<u64, LabError> {
    let text = match std::fs::read_to_string(acks) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => {
            return Err(LabError::Internal(format!(
                "cannot read {}: {e}",
                acks.display()
            )))
        }
    };
    let (_, outbox) =
        ordo_reservation::producer_snapshot(&mut ordo_reservation::open_producer(producer)?)?;
    let stored: std::collections::BTreeSet<&str> = outbox
        .iter()
        .map(|r| r.envelope.event_id.as_str())
        .collect();
    let mut acknowledged = 0;
    for id in text.lines() {
        acknowledged += 1;
        if !stored.contains(id) {
            tally.failures.push(format!(
                "event {id} was acknowledged as committed but is not in the outbox"
            ));
        }
    }
    Ok(acknowledged)
}

/// Kills a random live worker after each short pause, and starts it again,
/// for `seconds`.
fn kill_loop(
    soak: &Soak,
    workers: &mut [Worker],
    seconds: u64,
    rng: &mut fastrand::Rng,
    tally: &mut Tally,
    progress: &dyn Progress,
) -> Result<(), LabError> {
    progress.start("soak", seconds);
    let started = Instant::now();
    let window = Duration::from_secs(seconds);
    while started.elapsed() < window {
        std::thread::sleep(Duration::from_millis(
            rng.u64(KILL_PAUSE_MS.0..=KILL_PAUSE_MS.1),
        ));
        for worker in workers.iter_mut() {
            reap(soak, worker, tally, rng)?;
        }
        let Some(victim) = pick_victim(workers, &tally.kills, rng) else {
            continue;
        };
        let victim = &mut workers[victim];
        let mut child = victim.child.take().expect("a live worker has a child");
        // Child::kill sends SIGKILL on Unix.
        if child.kill().is_ok() {
            *tally.kills.entry(victim.role).or_default() += 1;
        }
        let _ = child.wait();
        soak.start(victim, tally, rng)?;
        let note = format!("{} kills", tally.kills.values().sum::<u64>());
        progress.set(started.elapsed().as_secs().min(seconds), &note);
    }
    progress.finish();
    Ok(())
}

/// A random live worker, of a role not killed yet while there is one, so
/// that even a short soak kills every role. Producers that finished stay
/// finished; the other roles never do.
fn pick_victim(
    workers: &[Worker],
    kills: &BTreeMap<Role, u64>,
    rng: &mut fastrand::Rng,
) -> Option<usize> {
    let live: Vec<usize> = (0..workers.len())
        .filter(|&i| workers[i].child.is_some())
        .collect();
    let spared: Vec<usize> = live
        .iter()
        .copied()
        .filter(|&i| !kills.contains_key(&workers[i].role))
        .collect();
    let pool = if spared.is_empty() { live } else { spared };
    (!pool.is_empty()).then(|| pool[rng.usize(..pool.len())])
}

/// How long convergence may wait for one worker: the experiment's watchdog,
/// plus 5 ms for each of the soak's events, since a producer started late
/// may still have every flow to drive.
fn converge_watchdog(flows: u64) -> Duration {
    WATCHDOG + Duration::from_millis(flows.saturating_mul(3 * 5))
}

/// Lets the workers converge without kills and without faults: workers
/// with a fault armed, and relays started with a server address that is no
/// longer the server's, are stopped and started again without; then
/// producers finish, then relays, then appliers, each told by a marker
/// file that the stage before is done; then the server is stopped.
fn converge(soak: &Soak, workers: &mut [Worker], tally: &mut Tally) -> Result<(), LabError> {
    let stale = |w: &Worker| w.role == Role::Relay && w.server != soak.server.get();
    for worker in workers.iter_mut().filter(|w| w.faulted || stale(w)) {
        if let Some(mut child) = worker.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            worker.faulted = false;
            worker.server = soak.server.get();
            worker.child = Some(soak.spawn(worker.role, None)?);
        }
    }
    let watchdog = converge_watchdog(soak.flows);
    for (role, marker) in [
        (Role::Produce, Some(&soak.produced_marker)),
        (Role::Relay, Some(&soak.relayed_marker)),
        (Role::Apply, None),
    ] {
        for worker in workers.iter_mut().filter(|w| w.role == role) {
            if let Some(child) = worker.child.take() {
                collect(child, worker, tally, watchdog)?;
            }
        }
        if let Some(marker) = marker {
            std::fs::write(marker, b"done").map_err(|e| {
                LabError::Internal(format!("cannot write {}: {e}", marker.display()))
            })?;
        }
    }
    for server in workers.iter_mut().filter(|w| w.role == Role::Server) {
        if let Some(mut child) = server.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    Ok(())
}

/// Checks the end state of a soak's two files: every event delivered and
/// applied once, every one of `flows` flows released. Returns the number of
/// committed events and the violations.
pub fn check_files(
    producer: &Path,
    consumer: &Path,
    flows: u64,
) -> Result<(usize, Vec<Violation>), LabError> {
    let snapshot = Snapshot::new(
        ordo_reservation::producer_snapshot(&mut ordo_reservation::open_producer(producer)?)?,
        ordo_reservation::consumer_snapshot(&mut ordo_reservation::open_consumer(consumer)?)?,
    );
    let expected = EndState {
        delivered: true,
        finished: Some(Finished::released(
            usize::try_from(flows).map_err(internal)?,
        )),
    };
    Ok((snapshot.outbox.len(), check_end_state(&snapshot, &expected)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ordo_core::{relay, FlowId, RelayOptions, SchemaVersion};
    use ordo_reservation::{
        AdvanceRequest, FlowState, Quantity, ReservationHandler, ReservationProducer,
    };

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
        let (events, violations) = check_files(&p, &c, 2).unwrap();
        assert_eq!(events, 6);
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
            let (_, violations) = check_files(&p, &c, 2).unwrap();
            assert!(
                violations.iter().any(|v| v.detail.contains(expected)),
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
        let (_, violations) = check_files(&p, &c, 2).unwrap();
        assert!(
            violations
                .iter()
                .any(|v| v.detail.contains("never accepted")),
            "{violations:?}"
        );
    }
}
