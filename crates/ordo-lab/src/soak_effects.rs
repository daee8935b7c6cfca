//! `ordo soak --effects`: the soak with external effects (EFFECTS.md). One
//! producer store has two destinations, `dedup` and `plain`, each relayed
//! to a consumer store of its own; each consumer's appliers are `ordo apply
//! --follow --webhook URL` processes, recording a `webhook` intent for every
//! event they apply, and its executors `ordo effects run --follow` processes
//! posting them to a fake provider on loopback run by the soak itself:
//! `dedup` deduplicates by `Idempotency-Key` (its executors declare a dedup
//! window), `plain` acts on every request (its executors declare none). Both
//! providers answer 503 at random before acting. Producers, relays,
//! appliers and executors are killed with SIGKILL at random instants; then
//! the run converges (appliers and executors stopped with SIGTERM, a
//! one-shot apply, one-shot executor runs until nothing is left to do,
//! leases of killed executors waited out) and is checked: the soak's
//! invariants for each destination, and the effects' against the
//! providers' logs (`soak_effects_check`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ordo_core::destination::DestinationStart;
use ordo_core::effect::{EffectEntry, EffectFilter, EffectOps, EffectState};
use ordo_core::{Clock, DestinationName, ProducerOps, SystemClock};
use ordo_sqlite::{OpenOptions, ProducerDb};

use crate::experiment::child::{finish_within, WATCHDOG};
use crate::experiment::Backend;
use crate::soak::{Role, SoakOptions, SoakReport};
use crate::soak_effects_check::{effects_check, end_state, Provider};
use crate::{internal, LabError, Progress};

/// The shortest and longest pause between two kills, as the soak's.
const KILL_PAUSE_MS: (u64, u64) = (5, 60);
/// Producer processes.
const PRODUCERS: usize = 2;
/// Executor processes of each consumer.
pub const EXECUTORS: usize = 2;
/// The appliers of each consumer when not told.
pub const APPLIERS_DEFAULT: usize = 1;
/// The executors' call timeout and lease, in ms.
const TIMEOUT_MS: u64 = 1000;
const LEASE_MS: u64 = 6000;
/// The dedup window the `dedup` side's executors declare.
const DEDUP_WINDOW: &str = "1h";
/// How long the executors may take to leave nothing to do once the kills
/// stopped (leases of killed executors, backoffs after 503s).
const EFFECTS_CONVERGE: Duration = Duration::from_secs(180);
/// The pause between two one-shot executor runs while converging.
const EFFECTS_PAUSE: Duration = Duration::from_millis(300);
/// How long a process stopped with SIGTERM may take to exit.
const STOP_WITHIN: Duration = Duration::from_secs(30);
/// The most intents read back from a consumer.
const INTENTS_MAX: usize = 10_000_000;

/// The two sides of the run: the destination (and provider) names.
pub const SIDES: [&str; 2] = ["dedup", "plain"];

/// What the effects part of the soak found.
#[derive(Debug, Clone, Default)]
pub struct EffectsReport {
    /// Intents recorded, on both consumers.
    pub intents: u64,
    /// Of those, `succeeded`.
    pub succeeded: u64,
    /// Of those, `outcome_unknown` (the `plain` side only).
    pub outcome_unknown: u64,
    /// Of those, `pending` behind an `outcome_unknown` intent of their flow,
    /// as ordered intents wait (the `plain` side only).
    pub waiting_behind_unknown: u64,
    /// Actions each provider took, `dedup` then `plain`.
    pub provider_actions: [u64; 2],
    /// Requests each provider answered 503, `dedup` then `plain`.
    pub provider_unavailable: [u64; 2],
    /// Requests of a key sent again after a 503 to that key.
    pub repeats_after_retry: u64,
    /// Requests the `dedup` provider answered from memory (a key it had
    /// acted on: resent after an expired lease or a timeout).
    pub answered_from_memory: u64,
    /// SIGKILLs of executors.
    pub executor_kills: u64,
    /// How long the executors took to leave nothing to do.
    pub converge: Duration,
    /// What broke the effects' invariants.
    pub violations: Vec<String>,
}

/// The soak's report and its effects part.
#[derive(Debug, Clone)]
pub struct EffectsSoakReport {
    /// The soak's figures (its end state checked for each destination).
    pub soak: SoakReport,
    /// The effects' figures.
    pub effects: EffectsReport,
}

impl EffectsSoakReport {
    /// Every violation: the soak's, then the effects'.
    pub fn violations(&self) -> Vec<String> {
        let mut all = self.soak.violations();
        all.extend(self.effects.violations.iter().cloned());
        all
    }
}

// ---------------------------------------------------------------------------
// The workers.

/// What a worker process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Produce,
    Relay,
    Apply,
    Execute,
}

struct Worker {
    kind: Kind,
    /// The side it works for (an index of [`SIDES`]; 0 for producers).
    side: usize,
    child: Option<Child>,
}

/// The run's files and providers.
struct Run {
    exe: PathBuf,
    dir: PathBuf,
    producer: PathBuf,
    consumers: [PathBuf; 2],
    providers: [Provider; 2],
    produced_marker: PathBuf,
    flows: u64,
    spread_ms: (i64, i64),
}

impl Run {
    /// The flags of a one-shot or following `effects run` of `side`.
    fn executor_args(&self, side: usize) -> Vec<String> {
        let mut args = vec![
            "effects".to_owned(),
            "run".into(),
            "--consumer".into(),
            self.consumers[side].display().to_string(),
            "--allow-url-prefix".into(),
            self.providers[side].prefix(),
            "--timeout-ms".into(),
            TIMEOUT_MS.to_string(),
            "--lease-ms".into(),
            LEASE_MS.to_string(),
        ];
        if side == 0 {
            args.extend(["--dedup-window".into(), DEDUP_WINDOW.into()]);
        }
        args
    }

    /// The flags of a one-shot or following `apply` of `side`.
    fn apply_args(&self, side: usize) -> Vec<String> {
        vec![
            "apply".to_owned(),
            "--consumer".into(),
            self.consumers[side].display().to_string(),
            "--webhook".into(),
            self.providers[side].url(),
        ]
    }

    /// Starts `worker`'s process.
    fn spawn(&self, worker: &Worker) -> Result<Child, LabError> {
        let mut command = Command::new(&self.exe);
        let side = worker.side;
        let log = |name: &str| self.dir.join(format!("{name}-{}.log", SIDES[side]));
        let (stdout, stderr) = match worker.kind {
            Kind::Produce => {
                command.args(["--json", "worker", "produce", "--producer"]);
                command.arg(&self.producer).args([
                    "--count",
                    &self.flows.to_string(),
                    "--quantity",
                    "7",
                    "--spread-from-ms",
                    &self.spread_ms.0.to_string(),
                    "--spread-until-ms",
                    &self.spread_ms.1.to_string(),
                ]);
                (Stdio::piped(), Stdio::piped())
            }
            Kind::Relay => {
                command.args(["--json", "worker", "relay", "--producer"]);
                command.arg(&self.producer);
                command.args(["--destination", SIDES[side], "--consumer"]);
                command.arg(&self.consumers[side]);
                command.arg("--until").arg(&self.produced_marker);
                (Stdio::piped(), Stdio::piped())
            }
            Kind::Apply => {
                command.args(self.apply_args(side)).arg("--follow");
                (Stdio::null(), append(&log("apply"))?)
            }
            Kind::Execute => {
                command.args(self.executor_args(side)).arg("--follow");
                (Stdio::null(), append(&log("effects-run"))?)
            }
        };
        command
            .env_remove(crate::faults::FAULT_ENV)
            .env_remove(ordo_core::crash::CRASH_POINT_ENV)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|e| LabError::Internal(format!("cannot start {}: {e}", self.exe.display())))
    }

    /// Runs a one-shot `ordo ARGS` to its end; a non-zero exit is an error.
    fn once(&self, args: &[String]) -> Result<(), LabError> {
        let child = Command::new(&self.exe)
            .args(args)
            .env_remove(crate::faults::FAULT_ENV)
            .env_remove(ordo_core::crash::CRASH_POINT_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(internal)?;
        let run = finish_within(child, &args.join(" "), WATCHDOG).map_err(LabError::Internal)?;
        match run.code {
            0 => Ok(()),
            code => Err(LabError::Internal(format!(
                "`ordo {}` exited {code}: {}",
                args.join(" "),
                run.stderr.trim()
            ))),
        }
    }
}

/// A log file opened for appending, as a child's stderr.
fn append(path: &Path) -> Result<Stdio, LabError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| LabError::Internal(format!("cannot open {}: {e}", path.display())))?;
    Ok(Stdio::from(file))
}

/// The workers, in the order they start: the producers, then for each
/// side its relay, appliers and executors.
fn workers(appliers: usize) -> Vec<Worker> {
    let worker = |kind, side| Worker {
        kind,
        side,
        child: None,
    };
    let mut all: Vec<Worker> = (0..PRODUCERS).map(|_| worker(Kind::Produce, 0)).collect();
    for side in 0..SIDES.len() {
        all.push(worker(Kind::Relay, side));
        all.extend((0..appliers).map(|_| worker(Kind::Apply, side)));
        all.extend((0..EXECUTORS).map(|_| worker(Kind::Execute, side)));
    }
    all
}

/// The kills and the failures of the run's workers.
#[derive(Default)]
struct Tally {
    kills: BTreeMap<Kind, u64>,
    failures: Vec<String>,
}

/// Collects a worker that exited by itself: a producer that finished stays
/// finished; any other exit is a failure, and the worker starts again.
fn reap(run: &Run, worker: &mut Worker, tally: &mut Tally) -> Result<(), LabError> {
    let Some(child) = worker.child.as_mut() else {
        return Ok(());
    };
    match child.try_wait().map_err(internal)? {
        None => Ok(()),
        Some(status) => {
            let mut child = worker.child.take().expect("checked above");
            let stderr = match worker.kind {
                Kind::Produce | Kind::Relay => finish_within(child, "worker", WATCHDOG)
                    .map(|r| r.stderr)
                    .unwrap_or_default(),
                _ => {
                    let _ = child.wait();
                    String::from("(see its log in the run's directory)")
                }
            };
            let code = status.code();
            if worker.kind == Kind::Produce && code == Some(0) {
                return Ok(());
            }
            tally.failures.push(format!(
                "a {:?} process of {} exited {code:?}: {}",
                worker.kind,
                SIDES[worker.side],
                stderr.trim()
            ));
            worker.child = Some(run.spawn(worker)?);
            Ok(())
        }
    }
}

/// Kills a random live worker after each short pause, of a kind not
/// killed yet while there is one, and starts it again, for `seconds`.
fn kill_loop(
    run: &Run,
    workers: &mut [Worker],
    seconds: u64,
    rng: &mut fastrand::Rng,
    tally: &mut Tally,
    progress: &dyn Progress,
) -> Result<(), LabError> {
    progress.start("soak", seconds);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(
            rng.u64(KILL_PAUSE_MS.0..=KILL_PAUSE_MS.1),
        ));
        for worker in workers.iter_mut() {
            reap(run, worker, tally)?;
        }
        let live: Vec<usize> = (0..workers.len())
            .filter(|&i| workers[i].child.is_some())
            .collect();
        let spared: Vec<usize> = (live.iter().copied())
            .filter(|&i| !tally.kills.contains_key(&workers[i].kind))
            .collect();
        let pool = if spared.is_empty() { live } else { spared };
        if pool.is_empty() {
            continue;
        }
        let victim = &mut workers[pool[rng.usize(..pool.len())]];
        let mut child = victim.child.take().expect("a live worker has a child");
        if child.kill().is_ok() {
            *tally.kills.entry(victim.kind).or_default() += 1;
        }
        let _ = child.wait();
        victim.child = Some(run.spawn(victim)?);
        let note = format!("{} kills", tally.kills.values().sum::<u64>());
        progress.set(started.elapsed().as_secs().min(seconds), &note);
    }
    progress.finish();
    Ok(())
}

/// Stops a following process with SIGTERM (it finishes what it is doing)
/// and waits for it; an exit other than 0 is a failure.
fn stop(worker: &mut Worker, tally: &mut Tally) -> Result<(), LabError> {
    let Some(mut child) = worker.child.take() else {
        return Ok(());
    };
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    if !sent {
        let _ = child.kill();
    }
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(internal)? {
            if sent && status.code() != Some(0) {
                tally.failures.push(format!(
                    "a {:?} process of {} stopped with SIGTERM exited {:?}",
                    worker.kind,
                    SIDES[worker.side],
                    status.code()
                ));
            }
            return Ok(());
        }
        if started.elapsed() > STOP_WITHIN {
            let _ = child.kill();
            let _ = child.wait();
            tally.failures.push(format!(
                "a {:?} process of {} did not stop within {STOP_WITHIN:?} of SIGTERM",
                worker.kind, SIDES[worker.side]
            ));
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Lets the run converge without kills: producers finish, then relays
/// (told by the marker), then the following appliers and executors are
/// stopped with SIGTERM and a one-shot apply of each side applies what is
/// left; then one-shot executor runs go on until nothing is left to do.
/// Returns how long the executors took.
fn converge(run: &Run, workers: &mut [Worker], tally: &mut Tally) -> Result<Duration, LabError> {
    let watchdog = WATCHDOG + Duration::from_millis(run.flows.saturating_mul(15));
    for kind in [Kind::Produce, Kind::Relay] {
        for worker in workers.iter_mut().filter(|w| w.kind == kind) {
            if let Some(child) = worker.child.take() {
                let done = finish_within(child, "worker", watchdog).map_err(LabError::Internal)?;
                if done.code != 0 {
                    tally.failures.push(format!(
                        "a {kind:?} worker exited {}: {}",
                        done.code,
                        done.stderr.trim()
                    ));
                }
            }
        }
        if kind == Kind::Produce {
            std::fs::write(&run.produced_marker, b"done").map_err(internal)?;
        }
    }
    for worker in workers.iter_mut() {
        stop(worker, tally)?;
    }
    for side in 0..SIDES.len() {
        run.once(&run.apply_args(side))?;
    }
    let started = Instant::now();
    for (side, name) in SIDES.iter().enumerate() {
        loop {
            run.once(&run.executor_args(side))?;
            if settled(&intents(&run.consumers[side])?) {
                break;
            }
            if started.elapsed() > EFFECTS_CONVERGE {
                tally.failures.push(format!(
                    "the {name} side's intents did not settle within {EFFECTS_CONVERGE:?}"
                ));
                break;
            }
            std::thread::sleep(EFFECTS_PAUSE);
        }
    }
    Ok(started.elapsed())
}

/// Every intent of a consumer, by flow and seq.
pub(crate) fn intents(consumer: &Path) -> Result<Vec<EffectEntry>, LabError> {
    let mut db = ordo_reservation::open_consumer(consumer)?;
    Ok(db.effects(&EffectFilter::default(), INTENTS_MAX)?)
}

/// Whether nothing is left for an executor: none `in_flight`, and every
/// `pending` one behind an `outcome_unknown` intent of its flow.
fn settled(intents: &[EffectEntry]) -> bool {
    let unknown = unknown_heads(intents);
    intents.iter().all(|i| match i.state {
        EffectState::InFlight => false,
        EffectState::Pending => behind_unknown(i, &unknown),
        _ => true,
    })
}

/// The lowest seq of an `outcome_unknown` intent of each (producer, flow).
pub(crate) fn unknown_heads(intents: &[EffectEntry]) -> BTreeMap<(String, String), i64> {
    let mut heads = BTreeMap::new();
    for i in intents {
        if i.state == EffectState::OutcomeUnknown {
            let at = (i.producer.to_string(), i.flow_id.to_string());
            let seq = heads.entry(at).or_insert(i.seq.get());
            *seq = (*seq).min(i.seq.get());
        }
    }
    heads
}

pub(crate) fn behind_unknown(
    intent: &EffectEntry,
    heads: &BTreeMap<(String, String), i64>,
) -> bool {
    let at = (intent.producer.to_string(), intent.flow_id.to_string());
    heads.get(&at).is_some_and(|&seq| seq < intent.seq.get())
}

/// Creates the stores before any worker starts: the producer with the two
/// destinations from the start (its `default` removed), and a consumer
/// for each.
fn create_stores(producer: &Path, consumers: &[PathBuf; 2]) -> Result<(), LabError> {
    let schema = ordo_reservation::producer_schema();
    let mut db = ProducerDb::open_or_create(
        producer,
        &schema,
        Arc::new(SystemClock),
        &OpenOptions::default(),
    )?;
    for side in SIDES {
        let name = DestinationName::new(side).map_err(internal)?;
        db.add_destination(&name, DestinationStart::Start)?
            .map_err(internal)?;
    }
    let reason = "one destination per provider of the soak";
    db.remove_destination(&DestinationName::default_name(), "ordo soak", reason)?
        .map_err(internal)?;
    for path in consumers {
        ordo_reservation::open_consumer(path)?;
    }
    Ok(())
}

/// Refuses options that do not go with `--effects`; nothing is run.
pub fn check_options(options: &SoakOptions) -> Result<(), LabError> {
    let refused = [
        (options.topology.is_some(), "without --topology"),
        (
            !matches!(options.backend, Backend::Sqlite),
            "on SQLite only in this release: without --backend postgres",
        ),
        (options.faults, "without --faults"),
        (
            options.transport.hop.is_some(),
            "relays by opening each consumer file: without --transport http",
        ),
        (options.producer_threads > 1, "without --producer-threads"),
        (options.keep, "without --keep"),
    ];
    if let Some((_, what)) = refused.iter().find(|(given, _)| *given) {
        return Err(LabError::Usage(format!("--effects runs {what}")));
    }
    if !(1..=crate::soak::WORKERS_MAX).contains(&options.appliers) {
        return Err(LabError::Usage(format!(
            "--effects takes --appliers (of each consumer) in 1..={}",
            crate::soak::WORKERS_MAX
        )));
    }
    Ok(())
}

/// The directory of the files: `dir`, which must not hold them yet, or
/// else `temp`.
fn run_dir(dir: Option<&Path>, temp: &Path) -> Result<PathBuf, LabError> {
    let Some(dir) = dir else {
        return Ok(temp.to_path_buf());
    };
    std::fs::create_dir_all(dir)
        .map_err(|e| LabError::Internal(format!("cannot create {}: {e}", dir.display())))?;
    let files = ["producer.db", "consumer-dedup.db", "consumer-plain.db"];
    if files.iter().any(|name| dir.join(name).exists()) {
        return Err(LabError::Usage(format!(
            "--dir {} already holds ordo files",
            dir.display()
        )));
    }
    Ok(dir.to_path_buf())
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs the soak with effects; a violated end state is in the report, not
/// an error.
pub fn run(options: &SoakOptions, progress: &dyn Progress) -> Result<EffectsSoakReport, LabError> {
    check_options(options)?;
    let seed = options.seed.unwrap_or_else(|| fastrand::u64(..));
    let temp = tempfile::Builder::new()
        .prefix("ordo-soak-")
        .tempdir()
        .map_err(|e| LabError::Internal(format!("cannot create a temporary directory: {e}")))?;
    let dir = run_dir(options.dir.as_deref(), temp.path())?;
    let now_ms = SystemClock.now_ms();
    let run = Run {
        exe: options.exe.clone(),
        producer: dir.join("producer.db"),
        consumers: SIDES.map(|side| dir.join(format!("consumer-{side}.db"))),
        providers: [
            Provider::start(true, seed ^ 0xd1)?,
            Provider::start(false, seed ^ 0x91)?,
        ],
        produced_marker: dir.join("produced.done"),
        flows: options.flows,
        // Most of the kill window, so that kills meet producers at work.
        spread_ms: (now_ms, now_ms + (options.seconds as i64 * 1000) * 4 / 5),
        dir,
    };
    create_stores(&run.producer, &run.consumers)?;
    let mut workers = workers(options.appliers);
    for worker in workers.iter_mut() {
        worker.child = Some(run.spawn(worker)?);
    }
    let (mut tally, mut rng) = (Tally::default(), fastrand::Rng::with_seed(seed));
    kill_loop(
        &run,
        &mut workers,
        options.seconds,
        &mut rng,
        &mut tally,
        progress,
    )?;
    let converging = Instant::now();
    let effects_converge = converge(&run, &mut workers, &mut tally)?;
    let converge = converging.elapsed();
    let (events, end_state, applied) = end_state(&run.producer, &run.consumers, options.flows)?;
    let Run { providers, .. } = &run;
    let logs = [&providers[0], &providers[1]].map(Provider::take_log);
    let urls = [&providers[0], &providers[1]].map(Provider::url);
    let mut effects = effects_check(&run.consumers, &urls, &logs, &applied)?;
    effects.executor_kills = tally.kills.get(&Kind::Execute).copied().unwrap_or(0);
    effects.converge = effects_converge;
    let kills_by_role = (tally.kills.iter())
        .filter_map(|(kind, n)| Some((role_of(*kind)?, *n)))
        .collect();
    let soak = SoakReport {
        seconds: options.seconds,
        flows: options.flows,
        seed,
        transport: options.transport,
        server_moves: 0,
        kills_by_role,
        events,
        faults_armed: 0,
        fault_exits: 0,
        worker_failures: tally.failures,
        end_state,
        acknowledged: 0,
        relays: SIDES.len(),
        appliers: options.appliers,
        converge,
        postgres: None,
        topology: None,
    };
    Ok(EffectsSoakReport { soak, effects })
}

/// The soak's role of a worker kind; executors have none (they are
/// counted in the effects' figures).
fn role_of(kind: Kind) -> Option<Role> {
    match kind {
        Kind::Produce => Some(Role::Produce),
        Kind::Relay => Some(Role::Relay),
        Kind::Apply => Some(Role::Apply),
        Kind::Execute => None,
    }
}
