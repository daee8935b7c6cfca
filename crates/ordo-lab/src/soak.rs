//! The soak: producers, relays and appliers as child processes, killed with
//! SIGKILL at random instants, then left to converge; the end state is
//! checked against the protocol's invariants. Over a transport with a
//! network hop (`http`) the relays post to its server role (an `ordo serve`
//! child), which is killed and started again too.
//!
//! On PostgreSQL the run has one fresh database (both roles' schemas in it,
//! as one application database would hold them), several relays and
//! appliers at once, and the server also ends ordo's own connections to
//! that database (`pg_terminate_backend`, chosen by `application_name`) at
//! random instants; the end check adds the relays' leases.
//!
//! With a topology ([`crate::soak_topology`]) the run has several producer
//! and consumer stores, every producer delivering to every consumer, and
//! the end check is made for each (producer, destination) pair.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ordo_core::{Clock, OutboxRecord, SystemClock};
use ordo_testkit::check::{check_end_state, EndState, Finished, Snapshot, Violation};

use crate::experiment::child::{finish_within, WATCHDOG};
use crate::experiment::Backend;
use crate::pg::{Database, Server, SOAK_PREFIX};
use crate::serve::{loopback_any, ServeSpec};
use crate::soak_pg::{database_state, pg_consumer, pg_producer, sessions_gone};
pub use crate::soak_topology::{PairCount, Topology, TopologyReport};
use crate::transports::{Hop, LabTransport};
use crate::{internal, LabError, Progress};

/// The shortest and longest pause between two kills.
const KILL_PAUSE_MS: (u64, u64) = (5, 60);
/// Attempts to start a killed server again on its port before it takes a
/// new one.
const SERVER_BIND_ATTEMPTS: u32 = 20;
/// The pause between two of those attempts.
const SERVER_BIND_PAUSE: Duration = Duration::from_millis(25);
/// Producer processes.
const PRODUCERS: usize = 2;
/// Relay and applier processes of each when not told: on SQLite, whose
/// writers take turns on each file.
pub const WORKERS_SQLITE: usize = 2;
/// Relay and applier processes of each when not told: on PostgreSQL, where
/// they work on different flows at once.
pub const WORKERS_POSTGRES: usize = 4;
/// The most relays, and the most appliers, of one run: on PostgreSQL each
/// relay has two connections and each applier one, and the server's
/// connections are shared.
pub const WORKERS_MAX: usize = 8;
/// What convergence allows each event beyond the watchdog, in ms, on
/// SQLite and on PostgreSQL (where a producer started late walks every
/// flow again with one round trip to the server per step, on a server
/// that other programs share).
const CONVERGE_PER_EVENT_MS: (u64, u64) = (5, 25);
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
    /// How the relays reach the consumer: one of
    /// [`TRANSPORTS`](crate::transports::TRANSPORTS).
    pub transport: &'static LabTransport,
    /// Threads in each producer process: 1 is one thread calling
    /// `advance`; more share one group-committing writer (SQLite only).
    /// Every event acknowledged to a producer on PostgreSQL, or to grouped
    /// threads, is recorded, and the end check looks for it.
    pub producer_threads: u64,
    /// Two SQLite files, or one fresh database on a PostgreSQL server.
    pub backend: Backend,
    /// Relay processes.
    pub relays: usize,
    /// Applier processes.
    pub appliers: usize,
    /// Keep the PostgreSQL database after the run (its name ends in
    /// `_kept`; the report names it) instead of dropping it.
    pub keep: bool,
    /// P producer stores and C consumer stores, every producer with one
    /// destination per consumer ([`crate::soak_topology`]), instead of one
    /// of each; `relays` is then P × C, one per (producer, destination),
    /// and `appliers` the appliers of each consumer.
    pub topology: Option<Topology>,
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
    pub transport: &'static LabTransport,
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
    /// Events acknowledged as committed to a grouped producer's threads or
    /// to a producer on PostgreSQL, each checked to be in the outbox (0
    /// with one thread per producer on SQLite).
    pub acknowledged: u64,
    /// Relay processes.
    pub relays: usize,
    /// Applier processes.
    pub appliers: usize,
    /// How long the workers took to finish once the kills stopped.
    pub converge: Duration,
    /// What only a run on PostgreSQL reports.
    pub postgres: Option<PgSoakReport>,
    /// What only a run of a topology reports.
    pub topology: Option<TopologyReport>,
}

/// What a soak on PostgreSQL reports besides.
#[derive(Debug, Clone)]
pub struct PgSoakReport {
    /// The server, `postgres://USER@HOST:PORT` (no password).
    pub server: String,
    /// The run's database, `postgres://USER@HOST:PORT/NAME`, when kept.
    pub kept: Option<String>,
    /// Connections ended with `pg_terminate_backend`, by the role of the
    /// worker that held them.
    pub terminations_by_role: BTreeMap<Role, u64>,
    /// Relay leases still naming a relay after convergence, each free
    /// because its relay's session is gone (a killed relay cannot release
    /// its leases) or its lease expired.
    pub leases_left: u64,
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

    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        match self.postgres {
            Some(_) => "postgres",
            None => "sqlite",
        }
    }
}

impl PgSoakReport {
    /// All connections ended.
    pub fn terminations(&self) -> u64 {
        self.terminations_by_role.values().sum()
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
    /// The producer store it works on (an index of [`Soak::producers`]).
    producer: usize,
    /// The consumer store it works on, or relays to (an index of
    /// [`Soak::consumers`]).
    consumer: usize,
    child: Option<Child>,
    /// Whether the running child has a fault armed.
    faulted: bool,
    /// The server address a relay over a network hop was started with.
    server: Option<SocketAddr>,
}

impl Worker {
    fn new(&(role, producer, consumer): &WorkerSpec) -> Worker {
        Worker {
            role,
            producer,
            consumer,
            child: None,
            faulted: false,
            server: None,
        }
    }
}

/// What the kill loop and the workers' exits added up to.
#[derive(Default)]
pub(crate) struct Tally {
    kills: BTreeMap<Role, u64>,
    terminations: BTreeMap<Role, u64>,
    faults_armed: u64,
    fault_exits: u64,
    pub(crate) failures: Vec<String>,
    server_moves: u64,
}

/// One consumer store of a soak, with its server role (when the transport
/// has a network hop).
struct ConsumerSide {
    store: PathBuf,
    /// The address of its server, once one started.
    server: Cell<Option<SocketAddr>>,
    /// Its servers' logs.
    serve_log: PathBuf,
}

impl ConsumerSide {
    fn new(store: PathBuf, serve_log: PathBuf) -> ConsumerSide {
        ConsumerSide {
            store,
            server: Cell::new(None),
            serve_log,
        }
    }
}

struct Soak {
    exe: PathBuf,
    producers: Vec<PathBuf>,
    consumers: Vec<ConsumerSide>,
    produced_marker: PathBuf,
    relayed_marker: PathBuf,
    flows: u64,
    /// Producers spread the flows over this window (ms since the epoch).
    spread_ms: (i64, i64),
    /// The directory of the files, armed by a worker's fault.
    dir: PathBuf,
    /// Whether workers started while killing get faults.
    faults: bool,
    /// The transport's network hop, whose server role is one of the
    /// workers; `None` when the relays open the consumer store.
    hop: Option<&'static Hop>,
    /// Threads per producer process, and the file of the acks of each
    /// producer store.
    producer_threads: u64,
    acks: Vec<PathBuf>,
    /// Whether every producer records its acks (on PostgreSQL).
    record_acks: bool,
    /// What convergence allows each event (see [`converge_watchdog`]).
    per_event_ms: u64,
    /// The topology of the stores, if not one of each.
    topology: Option<Topology>,
}

impl Soak {
    /// The soak of `options`: its files and markers in `dir`, its stores
    /// there or in `database`.
    fn new(options: &SoakOptions, dir: &Path, database: Option<&Database>) -> Soak {
        let (producers, consumers, acks) = match (options.topology, database) {
            (Some(topology), _) => crate::soak_topology::stores(dir, topology),
            (None, Some(database)) => (
                vec![PathBuf::from(database.url())],
                vec![PathBuf::from(database.url())],
                vec![dir.join("acks.log")],
            ),
            (None, None) => (
                vec![dir.join("producer.db")],
                vec![dir.join("consumer.db")],
                vec![dir.join("acks.log")],
            ),
        };
        let serve_log = |k: usize| match options.topology {
            Some(_) => dir.join(format!("serve-{}.log", Topology::destination_name(k))),
            None => dir.join("serve.log"),
        };
        Soak {
            exe: options.exe.clone(),
            producers,
            consumers: (consumers.into_iter().enumerate())
                .map(|(k, store)| ConsumerSide::new(store, serve_log(k)))
                .collect(),
            produced_marker: dir.join("produced.done"),
            relayed_marker: dir.join("relayed.done"),
            flows: options.flows,
            spread_ms: {
                let now_ms = SystemClock.now_ms();
                // Most of the kill window, so that kills meet producers at work.
                (now_ms, now_ms + (options.seconds as i64 * 1000) * 4 / 5)
            },
            dir: dir.to_path_buf(),
            faults: options.faults,
            hop: options.transport.hop.as_ref(),
            producer_threads: options.producer_threads,
            acks,
            record_acks: database.is_some() || options.topology.is_some(),
            per_event_ms: match database {
                Some(_) => CONVERGE_PER_EVENT_MS.1,
                None => CONVERGE_PER_EVENT_MS.0,
            },
            topology: options.topology,
        }
    }

    /// Starts `worker` again, with a fault armed half of the time when the
    /// soak injects faults.
    fn start(
        &self,
        worker: &mut Worker,
        tally: &mut Tally,
        rng: &mut fastrand::Rng,
    ) -> Result<(), LabError> {
        let side = &self.consumers[worker.consumer];
        if worker.role == Role::Server {
            worker.child = Some(self.spawn_server(side, tally)?);
            return Ok(());
        }
        let fault = (self.faults && rng.bool()).then(|| crate::faults::draw(rng, &self.dir));
        worker.faulted = fault.is_some();
        tally.faults_armed += u64::from(worker.faulted);
        worker.server = side.server.get();
        worker.child = Some(self.spawn(worker, fault.as_deref())?);
        Ok(())
    }

    /// Starts the server on the port it had (any free port the first
    /// time), retrying while the port is not free yet; past
    /// [`SERVER_BIND_ATTEMPTS`] on a new port, which relays started from
    /// then on use.
    fn spawn_server(&self, side: &ConsumerSide, tally: &mut Tally) -> Result<Child, LabError> {
        let hop = self
            .hop
            .ok_or_else(|| LabError::Internal("a server without a network hop".into()))?;
        let flags = match self.topology {
            Some(_) => crate::soak_topology::serve_flags(&self.dir),
            None => Vec::new(),
        };
        let start = |listen: SocketAddr| {
            hop.start(&ServeSpec {
                exe: &self.exe,
                consumer: &side.store,
                listen,
                crash_point: None,
                log: Some(&side.serve_log),
                flags: &flags,
            })
        };
        let mut last_error = String::new();
        if let Some(listen) = side.server.get() {
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
        side.server.set(Some(served.addr));
        Ok(served.child)
    }

    /// Starts `worker`'s process, with `fault` (a
    /// [`crate::faults::FAULT_ENV`] value) armed in it if given.
    fn spawn(&self, worker: &Worker, fault: Option<&str>) -> Result<Child, LabError> {
        let role = worker.role;
        let (producer, side) = (
            &self.producers[worker.producer],
            &self.consumers[worker.consumer],
        );
        let mut command = Command::new(&self.exe);
        match fault {
            Some(fault) => command.env(crate::faults::FAULT_ENV, fault),
            None => command.env_remove(crate::faults::FAULT_ENV),
        };
        command.args(["--json", "worker", role.as_str()]);
        match role {
            Role::Produce => command.arg("--producer").arg(producer).args([
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
                command.arg("--producer").arg(producer);
                match self.hop.zip(side.server.get()) {
                    Some((hop, addr)) => command.args(hop.relay_flags(addr)),
                    None => command.arg("--consumer").arg(&side.store),
                };
                if self.topology.is_some() {
                    let (i, k) = (worker.producer, worker.consumer);
                    command.args(crate::soak_topology::relay_flags(&self.dir, i, k));
                }
                command.arg("--until").arg(&self.produced_marker)
            }
            Role::Apply => command
                .arg("--consumer")
                .arg(&side.store)
                .arg("--until")
                .arg(&self.relayed_marker),
            Role::Server => unreachable!("the server is started by spawn_server"),
        };
        if role == Role::Produce && self.producer_threads > 1 {
            command.args(["--threads", &self.producer_threads.to_string()]);
        }
        if role == Role::Produce && (self.producer_threads > 1 || self.record_acks) {
            command.arg("--acks").arg(&self.acks[worker.producer]);
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

/// The directory of the files: `dir`, which must not hold the run's store
/// files (`stores`) yet, or else `temp`.
fn soak_dir(dir: Option<&Path>, temp: &Path, stores: &[String]) -> Result<PathBuf, LabError> {
    let Some(dir) = dir else {
        return Ok(temp.to_path_buf());
    };
    std::fs::create_dir_all(dir)
        .map_err(|e| LabError::Internal(format!("cannot create {}: {e}", dir.display())))?;
    if stores.iter().any(|name| dir.join(name).exists()) {
        return Err(LabError::Usage(format!(
            "--dir {} already holds ordo files",
            dir.display()
        )));
    }
    Ok(dir.to_path_buf())
}

/// A worker's role, its producer store and its consumer store (indices of
/// [`Soak::producers`] and [`Soak::consumers`]).
pub(crate) type WorkerSpec = (Role, usize, usize);

/// The workers, in the order they start, all on the one producer and the
/// one consumer: the transport's server role first, if it has a network
/// hop (the relays take its address), then the producers, the relays and
/// the appliers.
pub(crate) fn roles(options: &SoakOptions) -> Vec<WorkerSpec> {
    if let Some(topology) = options.topology {
        return crate::soak_topology::roles(options, topology);
    }
    let server = options.transport.hop.map(|_| Role::Server);
    server
        .into_iter()
        .chain(std::iter::repeat_n(Role::Produce, PRODUCERS))
        .chain(std::iter::repeat_n(Role::Relay, options.relays))
        .chain(std::iter::repeat_n(Role::Apply, options.appliers))
        .map(|role| (role, 0, 0))
        .collect()
}

/// Refuses options that do not go together; nothing is run.
pub(crate) fn check_options(options: &SoakOptions) -> Result<(), LabError> {
    if let Some(topology) = options.topology {
        return crate::soak_topology::check_options(options, topology);
    }
    for (flag, n) in [
        ("--relays", options.relays),
        ("--appliers", options.appliers),
    ] {
        if !(1..=WORKERS_MAX).contains(&n) {
            return Err(LabError::Usage(format!(
                "{flag} must be in 1..={WORKERS_MAX}"
            )));
        }
    }
    let hop = options.transport.hop.map(|hop| {
        let name = options.transport.name;
        format!(
            "--transport {name} posts to an `ordo {}` of an SQLite file",
            hop.command
        )
    });
    let sqlite_only = [
        (
            options.faults,
            "--faults injects faults into SQLite files".into(),
        ),
        (hop.is_some(), hop.unwrap_or_default()),
        (
            options.producer_threads > 1,
            "--producer-threads shares one SQLite group writer".into(),
        ),
    ];
    match options.backend {
        Backend::Postgres { .. } => match sqlite_only.iter().find(|(given, _)| *given) {
            Some((_, what)) => Err(LabError::Usage(format!(
                "{what}: it needs --backend sqlite"
            ))),
            None => Ok(()),
        },
        Backend::Sqlite if options.keep => Err(LabError::Usage(
            "--keep keeps a PostgreSQL database: it needs --backend postgres (--dir keeps SQLite files)"
                .into(),
        )),
        Backend::Sqlite => Ok(()),
    }
}

/// Runs the soak; a violated end state is in the report, not an error.
pub fn run(options: &SoakOptions, progress: &dyn Progress) -> Result<SoakReport, LabError> {
    check_options(options)?;
    let server = match &options.backend {
        Backend::Sqlite => None,
        Backend::Postgres { url } => Some(Server::connect(url, SOAK_PREFIX)?),
    };
    // Dropped at the end of the run, whatever its outcome, unless kept.
    let database = server
        .as_ref()
        .map(|server| server.create_as(options.keep))
        .transpose()?;
    let seed = options.seed.unwrap_or_else(|| fastrand::u64(..));
    let temp = tempfile::Builder::new()
        .prefix("ordo-soak-")
        .tempdir()
        .map_err(|e| LabError::Internal(format!("cannot create a temporary directory: {e}")))?;
    let dir = soak_dir(options.dir.as_deref(), temp.path(), &store_files(options))?;
    let soak = Soak::new(options, &dir, database.as_ref());
    match options.topology {
        Some(topology) => crate::soak_topology::create_stores(&dir, topology)?,
        None => create_stores(&soak, database.as_ref())?,
    }
    let mut tally = Tally::default();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut workers = Vec::new();
    for spec in roles(options) {
        let mut worker = Worker::new(&spec);
        soak.start(&mut worker, &mut tally, &mut rng)?;
        workers.push(worker);
    }
    kill_loop(
        &soak,
        database.as_ref(),
        &mut workers,
        options.seconds,
        &mut rng,
        &mut tally,
        progress,
    )?;
    let converging = Instant::now();
    converge(&soak, &mut workers, &mut tally)?;
    let converge = converging.elapsed();
    let ended = match options.topology {
        Some(topology) => {
            crate::soak_topology::end_check(&dir, topology, options.flows, &mut tally)?
        }
        None => end_check(
            &soak,
            options,
            database.as_ref(),
            server.as_ref(),
            &mut tally,
        )?,
    };
    Ok(SoakReport {
        seconds: options.seconds,
        flows: options.flows,
        seed,
        transport: options.transport,
        server_moves: tally.server_moves,
        kills_by_role: tally.kills,
        events: ended.events,
        faults_armed: tally.faults_armed,
        fault_exits: tally.fault_exits,
        worker_failures: tally.failures,
        end_state: ended.end_state,
        acknowledged: ended.acknowledged,
        relays: options.relays,
        appliers: options.appliers,
        converge,
        postgres: ended.postgres,
        topology: ended.topology,
    })
}

/// The names of the store files of a run on SQLite, in its directory.
fn store_files(options: &SoakOptions) -> Vec<String> {
    match options.topology {
        Some(topology) => crate::soak_topology::store_files(topology),
        None => vec!["producer.db".into(), "consumer.db".into()],
    }
}

/// What the end check found.
pub(crate) struct Ended {
    /// Events committed, by every producer store.
    pub(crate) events: usize,
    /// Events acknowledged to producers, each checked.
    pub(crate) acknowledged: u64,
    /// The end state's violations.
    pub(crate) end_state: Vec<Violation>,
    /// What only a run on PostgreSQL reports.
    pub(crate) postgres: Option<PgSoakReport>,
    /// What only a run of a topology reports.
    pub(crate) topology: Option<TopologyReport>,
}

/// Creates both stores of `soak` before any worker starts.
fn create_stores(soak: &Soak, database: Option<&Database>) -> Result<(), LabError> {
    match database {
        Some(database) => {
            pg_producer(&database.url(), true)?;
            pg_consumer(&database.url(), true)?;
        }
        None => {
            for producer in &soak.producers {
                ordo_reservation::open_producer(producer)?;
            }
            for side in &soak.consumers {
                ordo_reservation::open_consumer(&side.store)?;
            }
        }
    }
    Ok(())
}

/// What the soak found once its workers converged: the events, the
/// acknowledged ones checked, the end state's violations and, on
/// PostgreSQL, what only a run there reports.
fn end_check(
    soak: &Soak,
    options: &SoakOptions,
    database: Option<&Database>,
    server: Option<&Server>,
    tally: &mut Tally,
) -> Result<Ended, LabError> {
    let (snapshot, end_state, postgres) = match (database, server) {
        (Some(database), Some(server)) => {
            let mut end_state = sessions_gone(database)?;
            let (snapshot, leases) = database_state(&database.url())?;
            end_state.extend(end_violations(&snapshot, options.flows)?);
            end_state.extend(leases.violations);
            let report = PgSoakReport {
                server: server.shown().to_owned(),
                kept: options.keep.then(|| database.shown()),
                terminations_by_role: std::mem::take(&mut tally.terminations),
                leases_left: leases.left,
            };
            (snapshot, end_state, Some(report))
        }
        _ => {
            let snapshot = files_state(&soak.producers[0], &soak.consumers[0].store)?;
            let end_state = end_violations(&snapshot, options.flows)?;
            (snapshot, end_state, None)
        }
    };
    let acknowledged = check_acks(&snapshot.outbox, &soak.acks[0], "", tally)?;
    Ok(Ended {
        events: snapshot.outbox.len(),
        acknowledged,
        end_state,
        postgres,
        topology: None,
    })
}

/// Checks that every event acknowledged to a producer is in its `outbox`;
/// returns how many were acknowledged. A failure names the event and then
/// `of` (which producer, if there are several).
pub(crate) fn check_acks(
    outbox: &[OutboxRecord],
    acks: &Path,
    of: &str,
    tally: &mut Tally,
) -> Result<u64, LabError> {
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
    let stored: std::collections::BTreeSet<&str> = outbox
        .iter()
        .map(|r| r.envelope.event_id.as_str())
        .collect();
    let mut acknowledged = 0;
    for id in text.lines() {
        acknowledged += 1;
        if !stored.contains(id) {
            tally.failures.push(format!(
                "event {id}{of} was acknowledged as committed but is not in the outbox"
            ));
        }
    }
    Ok(acknowledged)
}

/// Kills a random live worker after each short pause, and starts it again,
/// for `seconds`; on PostgreSQL, half of the time ends one of a live
/// worker's connections to the run's database instead.
fn kill_loop(
    soak: &Soak,
    database: Option<&Database>,
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
        if let Some(database) = database.filter(|_| rng.bool()) {
            terminate_one(database, workers, tally, rng)?;
            let note = format!(
                "{} kills, {} terminations",
                tally.kills.values().sum::<u64>(),
                tally.terminations.values().sum::<u64>()
            );
            progress.set(started.elapsed().as_secs().min(seconds), &note);
            continue;
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
    let live: Vec<(usize, Role)> = (0..workers.len())
        .filter(|&i| workers[i].child.is_some())
        .map(|i| (i, workers[i].role))
        .collect();
    pick(&live, kills, rng)
}

/// A random one of `candidates`, of a role not `hit` yet while there is
/// one.
fn pick<T: Copy>(
    candidates: &[(T, Role)],
    hit: &BTreeMap<Role, u64>,
    rng: &mut fastrand::Rng,
) -> Option<T> {
    let spared: Vec<T> = candidates
        .iter()
        .filter(|(_, role)| !hit.contains_key(role))
        .map(|(c, _)| *c)
        .collect();
    let pool = if spared.is_empty() {
        candidates.iter().map(|(c, _)| *c).collect()
    } else {
        spared
    };
    (!pool.is_empty()).then(|| pool[rng.usize(..pool.len())])
}

/// Ends one connection that a live worker holds to the run's database
/// (`pg_terminate_backend`), of a role none of whose connections was ended
/// yet while there is one. Only ordo's own sessions of that database are
/// candidates, each known by its `application_name`.
fn terminate_one(
    database: &Database,
    workers: &[Worker],
    tally: &mut Tally,
    rng: &mut fastrand::Rng,
) -> Result<(), LabError> {
    let candidates: Vec<(i32, Role)> = database
        .ordo_sessions()?
        .iter()
        .filter_map(|(session, name)| {
            let pid = worker_pid(name)?;
            let worker = workers
                .iter()
                .find(|w| w.child.as_ref().is_some_and(|c| c.id() == pid))?;
            Some((*session, worker.role))
        })
        .collect();
    let Some(session) = pick(&candidates, &tally.terminations, rng) else {
        return Ok(());
    };
    if database.terminate(session)? {
        let role = candidates
            .iter()
            .find(|(s, _)| *s == session)
            .map(|(_, role)| *role)
            .expect("picked among the candidates");
        *tally.terminations.entry(role).or_default() += 1;
    }
    Ok(())
}

/// The process id of the worker whose store connection has this
/// `application_name`: `ordo-relay-OWNER` (a producer store) or
/// `ordo-apply-OWNER` (a consumer store), where a store's owner is
/// `PID-RANDOM` unless set ([`PgOptions::owner`]).
fn worker_pid(application_name: &str) -> Option<u32> {
    let owner = application_name
        .strip_prefix("ordo-relay-")
        .or_else(|| application_name.strip_prefix("ordo-apply-"))?;
    owner.split('-').next()?.parse().ok()
}

/// How long convergence may wait for one worker: the experiment's watchdog,
/// plus `per_event_ms` for each of the soak's events, since a producer
/// started late may still have every flow to drive.
fn converge_watchdog(flows: u64, per_event_ms: u64) -> Duration {
    WATCHDOG + Duration::from_millis(flows.saturating_mul(3 * per_event_ms))
}

/// Lets the workers converge without kills and without faults: workers
/// with a fault armed, and relays started with a server address that is no
/// longer the server's, are stopped and started again without; then
/// producers finish, then relays, then appliers, each told by a marker
/// file that the stage before is done; then the server is stopped.
fn converge(soak: &Soak, workers: &mut [Worker], tally: &mut Tally) -> Result<(), LabError> {
    let server = |w: &Worker| soak.consumers[w.consumer].server.get();
    let stale = |w: &Worker| w.role == Role::Relay && w.server != server(w);
    for worker in workers.iter_mut().filter(|w| w.faulted || stale(w)) {
        if let Some(mut child) = worker.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            worker.faulted = false;
            worker.server = server(worker);
            worker.child = Some(soak.spawn(worker, None)?);
        }
    }
    let watchdog = converge_watchdog(soak.flows, soak.per_event_ms);
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

/// The end state's violations in `snapshot`: every event delivered and
/// applied once, every one of `flows` flows released.
pub(crate) fn end_violations(snapshot: &Snapshot, flows: u64) -> Result<Vec<Violation>, LabError> {
    let expected = EndState {
        delivered: true,
        finished: Some(Finished::released(
            usize::try_from(flows).map_err(internal)?,
        )),
    };
    Ok(check_end_state(snapshot, &expected))
}

/// Both files of a soak, read.
fn files_state(producer: &Path, consumer: &Path) -> Result<Snapshot, LabError> {
    Ok(Snapshot::new(
        ordo_reservation::producer_snapshot(&mut ordo_reservation::open_producer(producer)?)?,
        ordo_reservation::consumer_snapshot(&mut ordo_reservation::open_consumer(consumer)?)?,
    ))
}

pub use crate::soak_pg::check_database;

/// Checks the end state of a soak's two files: every event delivered and
/// applied once, every one of `flows` flows released. Returns the number of
/// committed events and the violations.
pub fn check_files(
    producer: &Path,
    consumer: &Path,
    flows: u64,
) -> Result<(usize, Vec<Violation>), LabError> {
    let snapshot = files_state(producer, consumer)?;
    Ok((snapshot.outbox.len(), end_violations(&snapshot, flows)?))
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
            .execute_batch(
                "UPDATE custody SET accepted = 0, accepted_at_ms = NULL WHERE position =
                     (SELECT position FROM outbox WHERE event_id = 'flow-0000002-1');
                 UPDATE outbox SET accepted = 0 WHERE event_id = 'flow-0000002-1';",
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
