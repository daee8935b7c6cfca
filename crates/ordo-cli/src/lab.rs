//! `ordo demo`, `experiment`, `soak`, `bench` and the hidden `worker`: the
//! flags become the lab's options, the lab runs, its report is printed
//! (`render_lab`), and progress bars show on stderr meanwhile.

use std::sync::{Arc, Mutex};

use indicatif::{ProgressBar, ProgressStyle};
use ordo_lab::transports::{self, TRANSPORTS};
use ordo_lab::{
    bench, bench_destinations, bench_http, bench_pg, bench_producers, demo, experiment, soak,
    soak_effects, soak_topology, worker, worker_group, LabError, Progress,
};

use crate::args::{
    BackendArg, BenchArgs, DemoArgs, ExperimentArgs, FlowIdsArg, SoakArgs, TransportArg,
    WorkerCommand,
};
use crate::context::{clock, emit, open_options};
use crate::{render_destinations, render_lab, render_producers, Failure};
use ordo_lab::soak_effects::EffectsSoakReport;
use serde_json::{json, Value};

/// A lab error, by exit status.
fn failure(error: LabError) -> Failure {
    match error {
        LabError::Usage(message) => Failure::Usage(message),
        LabError::Store(store) => Failure::from(store),
        LabError::Check(message) => Failure::Check(message),
        other => Failure::Internal(other.to_string()),
    }
}

/// Fails a `run` that found any `found` (each a `noun`), naming the first.
fn check_found(run: &str, noun: &str, found: &[String]) -> Result<(), Failure> {
    match found.first() {
        None => Ok(()),
        Some(first) => Err(Failure::Check(format!(
            "{run} found {} {noun}(s); first: {first}",
            found.len()
        ))),
    }
}

fn ordo_binary() -> Result<std::path::PathBuf, Failure> {
    std::env::current_exe()
        .map_err(|e| Failure::Internal(format!("cannot find the ordo binary: {e}")))
}

/// Progress bars on stderr, one phase at a time, drawn with one template.
struct Bars {
    template: &'static str,
    bar: Mutex<Option<ProgressBar>>,
}

impl Bars {
    fn new(template: &'static str) -> Bars {
        Bars {
            template,
            bar: Mutex::new(None),
        }
    }

    fn with(&self, f: impl FnOnce(&ProgressBar)) {
        let bar = self
            .bar
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(bar) = bar.as_ref() {
            f(bar);
        }
    }
}

impl Progress for Bars {
    fn start(&self, label: &str, len: u64) {
        let bar = if len == 0 {
            let spinner = ProgressBar::new_spinner();
            spinner.set_message(label.to_owned());
            spinner
        } else {
            let bar = ProgressBar::new(len);
            bar.set_style(
                ProgressStyle::with_template(self.template)
                    .expect("the template is valid")
                    .progress_chars("=> "),
            );
            bar.set_prefix(label.to_owned());
            bar
        };
        *self
            .bar
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(bar);
    }

    fn inc(&self, steps: u64) {
        self.with(|bar| bar.inc(steps));
    }

    fn set(&self, position: u64, note: &str) {
        self.with(|bar| {
            bar.set_position(position);
            bar.set_message(note.to_owned());
        });
    }

    fn finish(&self) {
        let bar = self
            .bar
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
    }
}

pub fn demo(json_mode: bool, args: DemoArgs) -> Result<(), Failure> {
    let options = demo::DemoOptions {
        dir: args.dir,
        flows: args.flows,
        force: args.force,
    };
    let bars = Bars::new("{prefix:>8} [{bar:40}] {pos}/{len} {per_sec}");
    let report = demo::run(&options, &bars).map_err(failure)?;
    emit(json_mode, &render_lab::demo(&report), || {
        render_lab::demo_text(&report)
    });
    let problems = report.problems();
    if problems.is_empty() {
        return Ok(());
    }
    Err(Failure::Check(format!(
        "demo end state check failed: {}",
        problems.join("; ")
    )))
}

/// The backend of `--backend` and `--url`, which go together.
fn lab_backend(backend: BackendArg, url: Option<&String>) -> Result<experiment::Backend, Failure> {
    match (backend, url) {
        (BackendArg::Sqlite, None) => Ok(experiment::Backend::Sqlite),
        (BackendArg::Sqlite, Some(_)) => {
            Err(Failure::Usage("--url needs --backend postgres".into()))
        }
        (BackendArg::Postgres, None) => Err(Failure::Usage(
            "--backend postgres needs --url postgres://USER@HOST:PORT".into(),
        )),
        (BackendArg::Postgres, Some(url)) => {
            experiment::pg::check_url(url).map_err(failure)?;
            Ok(experiment::Backend::Postgres { url: url.clone() })
        }
    }
}

pub fn experiment(json_mode: bool, args: ExperimentArgs) -> Result<(), Failure> {
    let options = experiment::ExperimentOptions {
        backend: lab_backend(args.backend, args.url.as_ref())?,
        exe: ordo_binary()?,
        only: args.only,
        expected: args.expected,
    };
    let mut show = |result: &experiment::ScenarioResult| {
        if !json_mode {
            let verdict = if result.passed() { "pass" } else { "FAIL" };
            eprintln!("{verdict} {}", result.name);
        }
    };
    let report = experiment::run(&options, &mut show).map_err(failure)?;
    let value = render_lab::experiment(&report);
    if let Some(path) = &args.output {
        let text = serde_json::to_string_pretty(&value).expect("a JSON value serializes");
        std::fs::write(path, text + "\n")
            .map_err(|e| Failure::Internal(format!("cannot write {}: {e}", path.display())))?;
    }
    emit(json_mode, &value, || render_lab::experiment_text(&report));
    let failed = report.failed();
    if args.check && failed > 0 {
        let first = report
            .scenarios
            .iter()
            .find(|r| !r.passed())
            .map(|r| format!("{}: {}", r.name, r.differences[0]))
            .unwrap_or_default();
        return Err(Failure::Check(format!(
            "{failed} scenario(s) failed; first: {first}"
        )));
    }
    Ok(())
}

pub fn soak(json_mode: bool, args: SoakArgs) -> Result<(), Failure> {
    let backend = lab_backend(args.backend, args.url.as_ref())?;
    let workers = match backend {
        experiment::Backend::Sqlite => soak::WORKERS_SQLITE,
        experiment::Backend::Postgres { .. } => soak::WORKERS_POSTGRES,
    };
    // A topology relays over HTTP, one relay per (producer, destination),
    // with appliers counted per consumer.
    let (transport, relays, appliers) = match args.topology {
        None => (
            args.transport.map_or(&TRANSPORTS[0], |t| t.0),
            args.relays.map_or(workers, |n| n as usize),
            args.appliers.map_or(workers, |n| n as usize),
        ),
        Some(topology) => {
            if args.relays.is_some() {
                return Err(Failure::Usage(format!(
                    "--topology {topology} runs one relay per (producer, destination): without --relays"
                )));
            }
            let http = transports::by_name("http").expect("the lab has an http transport");
            (
                args.transport.map_or(http, |t| t.0),
                topology.producers * topology.consumers,
                args.appliers
                    .map_or(soak_topology::APPLIERS_DEFAULT, |n| n as usize),
            )
        }
    };
    let options = soak::SoakOptions {
        exe: ordo_binary()?,
        seconds: args.seconds,
        flows: args.flows,
        seed: args.seed,
        dir: args.dir,
        faults: args.faults,
        transport,
        producer_threads: args.producer_threads,
        backend,
        relays,
        appliers,
        keep: args.keep,
        topology: args.topology,
    };
    let bars = Bars::new("soak [{bar:40}] {pos}/{len} s {msg}");
    if args.effects {
        return soak_effects(json_mode, options, (args.relays, args.appliers), &bars);
    }
    let report = soak::run(&options, &bars).map_err(failure)?;
    emit(json_mode, &render_lab::soak(&report), || {
        render_lab::soak_text(&report)
    });
    check_found("soak", "violation", &report.violations())
}

/// `ordo soak --effects`: one relay per destination, appliers counted per
/// consumer.
fn soak_effects(
    json_mode: bool,
    mut options: soak::SoakOptions,
    (relays, appliers): (Option<u64>, Option<u64>),
    bars: &Bars,
) -> Result<(), Failure> {
    if relays.is_some() {
        return Err(Failure::Usage(
            "--effects runs one relay per destination: without --relays".into(),
        ));
    }
    options.appliers = appliers.map_or(soak_effects::APPLIERS_DEFAULT, |n| n as usize);
    let report = soak_effects::run(&options, bars).map_err(failure)?;
    emit(json_mode, &soak_effects_json(&report), || {
        soak_effects_text(&report)
    });
    check_found("soak", "violation", &report.violations())
}

/// `soak --effects`: the soak's document, its kills and verdict counting
/// the executors (`kills_by_role.execute`), with `effects` added.
fn soak_effects_json(report: &EffectsSoakReport) -> Value {
    let mut value = render_lab::soak(&report.soak);
    let effects = &report.effects;
    let violations = report.violations();
    value["kills"] = json!(report.soak.kills() + effects.executor_kills);
    value["kills_by_role"]["execute"] = json!(effects.executor_kills);
    value["relays"] = json!(report.soak.relays);
    value["appliers"] = json!(report.soak.appliers);
    value["converge_seconds"] = json!(render_lab::seconds(report.soak.converge));
    value["verdict"] = json!(if violations.is_empty() {
        "ok"
    } else {
        "violated"
    });
    value["violations"] = json!(violations);
    value["effects"] = json!({
        "intents": effects.intents,
        "succeeded": effects.succeeded,
        "outcome_unknown": effects.outcome_unknown,
        "waiting_behind_unknown": effects.waiting_behind_unknown,
        "provider_actions": {"dedup": effects.provider_actions[0], "plain": effects.provider_actions[1]},
        "provider_unavailable": {"dedup": effects.provider_unavailable[0], "plain": effects.provider_unavailable[1]},
        "repeats_after_retry": effects.repeats_after_retry,
        "answered_from_memory": effects.answered_from_memory,
        "converge_seconds": render_lab::seconds(effects.converge),
        "violations": effects.violations,
    });
    value
}

fn soak_effects_text(report: &EffectsSoakReport) -> String {
    let e = &report.effects;
    let mut lines = vec![render_lab::soak_text(&report.soak)];
    lines.push(format!(
        "effects  {} intents: {} succeeded, {} outcome_unknown, {} waiting behind one; executors killed {} times; settled in {:.3} s",
        e.intents, e.succeeded, e.outcome_unknown, e.waiting_behind_unknown, e.executor_kills,
        e.converge.as_secs_f64()
    ));
    lines.push(format!(
        "provider dedup acted {} times ({} answered from memory), plain {}; 503s {} and {}; {} repeats, each after a 503",
        e.provider_actions[0], e.answered_from_memory, e.provider_actions[1],
        e.provider_unavailable[0], e.provider_unavailable[1], e.repeats_after_retry
    ));
    if !e.violations.is_empty() {
        lines.push("effects  VIOLATED".into());
        lines.extend(e.violations.iter().map(|v| format!("  {v}")));
    }
    lines.join("\n")
}

/// The HTTP bench's load, when `--transport http` (which measures nothing
/// else, so the other modes are refused with it), its wake part on the
/// server `wake_server` when there is one.
fn http_load(
    args: &BenchArgs,
    wake_server: Option<String>,
) -> Result<Option<bench_http::HttpLoad>, Failure> {
    if args.transport == TransportArg::File {
        return Ok(None);
    }
    if args.sweep || args.growth {
        return Err(Failure::Usage(
            "--transport http measures the transport alone: without --sweep or --growth".into(),
        ));
    }
    Ok(Some(bench_http::HttpLoad {
        exe: ordo_binary()?,
        clients: args.clients,
        seconds: args.load_seconds,
        wake_server,
    }))
}

pub fn bench(json_mode: bool, args: BenchArgs) -> Result<(), Failure> {
    let http = args.transport == TransportArg::Http;
    // With --transport http, the server is the wake part's.
    let wake_server = match lab_backend(args.backend, args.url.as_ref())? {
        experiment::Backend::Postgres { url } if http => Some(url),
        experiment::Backend::Postgres { url } => return bench_pg(json_mode, args, url),
        experiment::Backend::Sqlite => None,
    };
    if !args.workers.is_empty() {
        return Err(Failure::Usage(match http {
            true => "--workers measures relays and appliers: without --transport http".into(),
            false => "--workers needs --backend postgres".into(),
        }));
    }
    if !args.producers.is_empty() {
        if args.transport == TransportArg::Http {
            return Err(Failure::Usage(
                "--producers measures the producer alone: without --transport http".into(),
            ));
        }
        return bench_producers(json_mode, args);
    }
    if args.destinations.is_some() {
        if http {
            return Err(Failure::Usage(
                "--destinations relays in process: without --transport http".into(),
            ));
        }
        return bench_destinations(json_mode, args);
    }
    let http = http_load(&args, wake_server)?;
    if let Some(plot) = &args.plot {
        if !args.sweep {
            return Err(Failure::Usage("--plot needs --sweep".into()));
        }
        if plot.extension().and_then(|e| e.to_str()) != Some("svg") {
            return Err(Failure::Usage(format!(
                "--plot {}: the file name must end in .svg",
                plot.display()
            )));
        }
    }
    let options = bench::BenchOptions {
        flows: args.flows,
        batch: args.batch,
        sweep: args.sweep,
        rate: args.rate,
        dir: args.dir,
        growth: args.growth,
        http,
    };
    let bars = Arc::new(Bars::new("{prefix:>12} [{bar:40}] {pos}/{len} {per_sec}"));
    let report = bench::run(&options, bars).map_err(failure)?;
    let value = render_lab::bench(&report);
    if let (Some(plot), bench::BenchReport::Throughput(throughput)) = (&args.plot, &report) {
        render_lab::draw(plot, &value["runs"], throughput)?;
    }
    emit(json_mode, &value, || {
        render_lab::bench_text(&report, &value)
    });
    let problems = match &report {
        bench::BenchReport::Http(http) => http.problems(),
        _ => Vec::new(),
    };
    check_found("bench", "problem", &problems)
}

/// `ordo bench --backend postgres --url URL --workers N,...`: relays and
/// appliers at once, per worker count, F_pg measured around each run.
fn bench_pg(json_mode: bool, args: BenchArgs, url: String) -> Result<(), Failure> {
    let other_modes = [
        (args.sweep, "--sweep"),
        (args.growth, "--growth"),
        (args.plot.is_some(), "--plot"),
        (args.dir.is_some(), "--dir"),
        (!args.producers.is_empty(), "--producers"),
        (args.destinations.is_some(), "--destinations"),
    ];
    if let Some((_, flag)) = other_modes.iter().find(|(given, _)| *given) {
        return Err(Failure::Usage(format!(
            "--backend postgres measures relays and appliers at once: without {flag}"
        )));
    }
    let workers = if args.workers.is_empty() {
        bench_pg::WORKERS_DEFAULT.to_vec()
    } else {
        args.workers.iter().map(|&n| n as usize).collect()
    };
    let options = bench_pg::PgBenchOptions {
        url,
        workers,
        flows: args.flows,
        batch: args.batch,
    };
    let bars = Bars::new("{prefix:>12} [{bar:40}] {pos}/{len} {per_sec}");
    let report = bench_pg::run(&options, &bars).map_err(failure)?;
    emit(json_mode, &render_lab::bench_pg(&report), || {
        render_lab::bench_pg_text(&report)
    });
    Ok(())
}

/// `ordo bench --producers N,...`: producer threads through one group writer.
fn bench_producers(json_mode: bool, args: BenchArgs) -> Result<(), Failure> {
    let options = bench_producers::ProducersOptions {
        counts: args.producers.iter().map(|&n| n as usize).collect(),
        flow_ids: match args.flow_ids {
            FlowIdsArg::Sequential => bench_producers::FlowIds::Sequential,
            FlowIdsArg::Random => bench_producers::FlowIds::Random,
        },
        run: std::time::Duration::from_secs(args.producers_seconds),
        dir: args.dir,
    };
    let bars = Bars::new("{prefix:>12} {msg}");
    let report = bench_producers::run(&options, &bars).map_err(failure)?;
    let value = render_producers::producers(&report);
    emit(json_mode, &value, || {
        render_producers::producers_text(&report)
    });
    Ok(())
}

/// `ordo bench --destinations N,...`: one producer file fanned out to N
/// consumer files, one relay each.
fn bench_destinations(json_mode: bool, args: BenchArgs) -> Result<(), Failure> {
    let options = bench_destinations::DestinationsOptions {
        counts: (args.destinations.iter().flatten())
            .map(|&n| n as usize)
            .collect(),
        flows: args.destinations_flows,
        batch: args.batch,
        dir: args.dir,
    };
    let bars = Bars::new("{prefix:>12} {msg}");
    let report = bench_destinations::run(&options, &bars).map_err(failure)?;
    let value = render_destinations::destinations(&report);
    emit(json_mode, &value, || {
        render_destinations::destinations_text(&report)
    });
    Ok(())
}

/// Where a relay worker hands its events: the consumer file, or else the
/// HTTP inbox at `to`, signed with `key` (its id and file) if given.
fn relay_target(
    consumer: Option<std::path::PathBuf>,
    to: Option<String>,
    key: Option<(String, std::path::PathBuf)>,
) -> worker::RelayTarget {
    match (consumer, to) {
        (Some(consumer), _) => worker::RelayTarget::File(consumer),
        (None, to) => worker::RelayTarget::Http {
            url: to.expect("clap requires --consumer or --to"),
            key: key.map(|(id, file)| worker::RelayKey { id, file }),
        },
    }
}

pub fn worker(json_mode: bool, command: WorkerCommand) -> Result<(), Failure> {
    let role = match command {
        WorkerCommand::Produce {
            producer,
            mut flows,
            count,
            quantity,
            spread_until_ms,
            spread_from_ms,
            threads,
            acks,
        } => {
            flows.extend(worker::counted_flows(count.unwrap_or(0)).map_err(failure)?);
            if let Some(threads) = threads {
                worker::WorkerRole::ProduceGrouped(worker_group::GroupedProduce {
                    producer,
                    flows,
                    quantity,
                    spread_ms: spread_from_ms.zip(spread_until_ms),
                    threads: threads as usize,
                    acks,
                })
            } else {
                worker::WorkerRole::Produce {
                    producer,
                    flows,
                    quantity,
                    spread_ms: spread_from_ms.zip(spread_until_ms),
                    acks,
                }
            }
        }
        WorkerCommand::Relay {
            producer,
            consumer,
            to,
            destination,
            key_id,
            key_file,
            until,
        } => worker::WorkerRole::Relay {
            producer,
            destination,
            target: relay_target(consumer, to, key_id.zip(key_file)),
            until,
        },
        WorkerCommand::Apply { consumer, until } => worker::WorkerRole::Apply { consumer, until },
        WorkerCommand::UnsafeDualWrite {
            producer,
            flow,
            quantity,
        } => worker::WorkerRole::UnsafeDualWrite {
            producer,
            flow,
            quantity,
        },
    };
    let env = worker::WorkerEnv {
        clock: clock(),
        options: open_options(),
    };
    let report = worker::run(role, &env).map_err(failure)?;
    let (value, text) = render_lab::worker(report);
    emit(json_mode, &value, || text);
    Ok(())
}
