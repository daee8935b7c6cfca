//! One function per command: validate, open (the implied `init`), call the
//! library, print.

use std::io::Read;
use std::path::{Path, PathBuf};

use ordo_core::envelope::{parse_stream, StreamError};
use ordo_core::{
    drain, process_all, relay, relay_event, Advance, AdvanceError, AdvanceRequest, ApplyOptions,
    ConsumerStore, Envelope, ProducerStore, RelayError, RelayOptions, RelayPolicy, RelayReport,
    StoreError, SystemClock,
};
use ordo_core::{Clock, FixedClock};
use ordo_sqlite::{ConsumerDb, OpenOptions, ProducerDb};
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};

use crate::args::{AdvanceArgs, ApplyArgs, Cli, Command, Files, PolicyArg, ReceiveArgs, RelayArgs};
use crate::{bench, demo, experiment, ops, render, soak, Failure};

/// Prints a result: the JSON document with `--json`, else the text.
pub fn emit(json_mode: bool, value: &Value, text: impl FnOnce() -> String) {
    if json_mode {
        println!("{value}");
    } else {
        let text = text();
        if !text.is_empty() {
            println!("{text}");
        }
    }
}

/// Runs a command; returns the exit status of a completed command (0, or 3
/// for a breached `status` threshold).
pub fn run(cli: Cli) -> Result<u8, Failure> {
    let json_mode = cli.json;
    if let Ok(value) = std::env::var("ORDO_NOW_MS") {
        value.parse::<i64>().map_err(|_| {
            Failure::Usage(format!(
                "ORDO_NOW_MS must be milliseconds since the Unix epoch as an integer (got {value:?})"
            ))
        })?;
    }
    OPEN_OPTIONS
        .set(OpenOptions {
            busy_timeout: std::time::Duration::from_millis(cli.busy_timeout_ms),
        })
        .expect("run is called once per process");
    if let Command::Status(args) = cli.command {
        return Ok(ops::status(json_mode, args)?.unwrap_or(0));
    }
    match cli.command {
        Command::Init(files) => init(json_mode, files),
        Command::Advance(args) => advance(json_mode, args),
        Command::Relay(args) => relay_cmd(json_mode, args),
        Command::Receive(args) => receive(json_mode, args),
        Command::Apply(args) => apply(json_mode, args),
        Command::Snapshot(files) => snapshot(json_mode, files),
        Command::Demo(args) => demo::run(json_mode, args),
        Command::Experiment(args) => experiment::run(json_mode, args),
        Command::Soak(args) => soak::run(json_mode, args),
        Command::Bench(args) => bench::run(json_mode, args),
        Command::Worker { role } => experiment::worker::run(json_mode, role),
        Command::Outbox { command } => ops::outbox(json_mode, command),
        Command::Inbox { command } => ops::inbox(json_mode, command),
        Command::Prune(args) => ops::prune(json_mode, args),
        Command::Status(_) => unreachable!("handled above"),
    }
    .map(|()| 0)
}

/// The clock every command uses: the system's, unless `ORDO_NOW_MS` fixes
/// the time (milliseconds since the Unix epoch) for tests and replays.
pub fn clock() -> Arc<dyn Clock> {
    match std::env::var("ORDO_NOW_MS").ok().map(|v| v.parse::<i64>()) {
        Some(Ok(now_ms)) => Arc::new(FixedClock(now_ms)),
        // Checked by `run` before any command starts.
        Some(Err(_)) | None => Arc::new(SystemClock),
    }
}

/// The options of every store this process opens (`--busy-timeout-ms`).
static OPEN_OPTIONS: OnceLock<OpenOptions> = OnceLock::new();

fn open_options() -> OpenOptions {
    OPEN_OPTIONS.get().cloned().unwrap_or_default()
}

/// Opens (creating if missing) the producer file with [`clock`].
pub fn open_producer(path: &Path) -> Result<ProducerDb, Failure> {
    Ok(ProducerDb::open_with(path, clock(), &open_options())?)
}

/// Opens (creating if missing) the consumer file with [`clock`].
pub fn open_consumer(path: &Path) -> Result<ConsumerDb, Failure> {
    Ok(ConsumerDb::open_with(path, clock(), &open_options())?)
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Refuses one file for both roles, before anything is opened.
fn check_distinct(files: &Files) -> Result<(), Failure> {
    let same = match (files.producer.canonicalize(), files.consumer.canonicalize()) {
        (Ok(p), Ok(c)) => p == c,
        _ => absolute(&files.producer) == absolute(&files.consumer),
    };
    if same {
        return Err(Failure::Usage(format!(
            "--producer and --consumer must be different files (both are {})",
            files.producer.display()
        )));
    }
    Ok(())
}

pub fn open_both(files: &Files) -> Result<(ProducerDb, ConsumerDb), Failure> {
    check_distinct(files)?;
    // Both files are checked before either is created or changed.
    ProducerDb::check_existing(&files.producer)?;
    ConsumerDb::check_existing(&files.consumer)?;
    let producer = open_producer(&files.producer)?;
    let consumer = open_consumer(&files.consumer)?;
    Ok((producer, consumer))
}

fn init(json_mode: bool, files: Files) -> Result<(), Failure> {
    open_both(&files)?;
    let value = json!({
        "producer": files.producer.display().to_string(),
        "consumer": files.consumer.display().to_string(),
    });
    emit(json_mode, &value, || {
        format!(
            "initialised producer {} and consumer {}",
            files.producer.display(),
            files.consumer.display()
        )
    });
    Ok(())
}

fn advance(json_mode: bool, args: AdvanceArgs) -> Result<(), Failure> {
    let request = AdvanceRequest::new(
        args.flow,
        args.expected_seq,
        args.to,
        args.quantity,
        args.schema,
    )
    .map_err(|e| Failure::Usage(e.to_string()))?;
    let mut producer = open_producer(&args.producer)?;
    let outcome = producer.advance(&request).map_err(|e| match e {
        AdvanceError::Refused(refused) => Failure::Usage(refused.to_string()),
        AdvanceError::Store(store) => Failure::from(store),
        other => Failure::Internal(other.to_string()),
    })?;
    emit(json_mode, &render::advance(&outcome), || match &outcome {
        Advance::Committed(event) => format!(
            "committed {} seq {} ({}) as event {}",
            event.flow_id, event.seq, event.event_type, event.event_id
        ),
        Advance::Stale { last_seq } => {
            format!("stale: flow {} is at seq {last_seq}", request.flow_id)
        }
        Advance::InvalidTransition { from, to } => {
            format!(
                "invalid_transition: flow {} cannot go from {from} to {to}",
                request.flow_id
            )
        }
    });
    Ok(())
}

fn relay_failure(error: RelayError) -> Failure {
    match error {
        RelayError::UnknownEvent(_) => Failure::Usage(error.to_string()),
        RelayError::Store(store) => Failure::from(store),
        other => Failure::Internal(other.to_string()),
    }
}

fn relay_cmd(json_mode: bool, args: RelayArgs) -> Result<(), Failure> {
    check_distinct(&args.files)?;
    // An unknown --event is invalid input: refuse it before the consumer file
    // is opened (and so created), and without creating the producer file.
    if let Some(event_id) = &args.event {
        let unknown = || relay_failure(RelayError::UnknownEvent(event_id.clone()));
        if !args.files.producer.exists() {
            return Err(unknown());
        }
        let mut producer = open_producer(&args.files.producer)?;
        if producer.outbox_event(event_id)?.is_none() {
            return Err(unknown());
        }
    }
    let (mut producer, mut consumer) = open_both(&args.files)?;
    let report = match &args.event {
        Some(event_id) => relay_event(&mut producer, &mut consumer, event_id, clock().as_ref()),
        None => {
            let options = RelayOptions {
                policy: match args.policy {
                    PolicyArg::Fair => RelayPolicy::Fair,
                    PolicyArg::FirstPending => RelayPolicy::FirstPending,
                },
                max: args.max,
                batch_len_max: args.batch as usize,
                ..RelayOptions::default()
            };
            relay(&mut producer, &mut consumer, &options, clock().as_ref())
        }
    }
    .map_err(relay_failure)?;
    emit(json_mode, &render::relay(&report), || relay_text(&report));
    Ok(())
}

fn relay_text(report: &RelayReport) -> String {
    let mut lines: Vec<String> = report
        .deliveries
        .iter()
        .map(|d| format!("{} {} seq {}: {}", d.event_id, d.flow_id, d.seq, d.receipt))
        .collect();
    lines.push(format!(
        "{} deliveries, stop: {}",
        report.deliveries.len(),
        report.stop.as_str()
    ));
    lines.join("\n")
}

/// Reads every envelope from `input` ([`parse_stream`]); any malformed one
/// refuses the whole input, naming its position and line.
pub fn parse_envelopes(input: &[u8]) -> Result<Vec<Envelope>, Failure> {
    parse_stream(input).map_err(|e| {
        Failure::Usage(match e {
            StreamError::NotUtf8 { offset } => {
                format!("stdin is not valid UTF-8 (invalid byte at offset {offset})")
            }
            StreamError::NotJson { line, error } => {
                format!("stdin line {line}: malformed envelope: {error}")
            }
            StreamError::SharedLine { line, index } => format!(
                "stdin line {line}: malformed envelope: envelope {index} starts on the line where envelope {} ends (one envelope per line)",
                index - 1
            ),
            StreamError::Envelope { index, line, error } => {
                format!("envelope {index} (stdin line {line}): malformed envelope: {error}")
            }
            other => format!("stdin: malformed envelope: {other}"),
        })
    })
}

/// The most input one `receive` takes (one transaction), in bytes.
pub const RECEIVE_INPUT_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// The most envelopes one `receive` takes (one transaction).
pub const RECEIVE_ENVELOPES_MAX: usize = 100_000;

fn receive(json_mode: bool, args: ReceiveArgs) -> Result<(), Failure> {
    let mut input = Vec::new();
    std::io::stdin()
        .take(RECEIVE_INPUT_BYTES_MAX + 1)
        .read_to_end(&mut input)
        .map_err(|e| Failure::Internal(format!("cannot read stdin: {e}")))?;
    if input.len() as u64 > RECEIVE_INPUT_BYTES_MAX {
        return Err(Failure::Usage(format!(
            "stdin holds more than {RECEIVE_INPUT_BYTES_MAX} bytes; split the input (one receive is one transaction)"
        )));
    }
    let envelopes = parse_envelopes(&input)?;
    if envelopes.len() > RECEIVE_ENVELOPES_MAX {
        return Err(Failure::Usage(format!(
            "stdin holds {} envelopes, more than {RECEIVE_ENVELOPES_MAX}; split the input (one receive is one transaction)",
            envelopes.len()
        )));
    }
    let mut consumer = open_consumer(&args.consumer)?;
    let receipts = consumer.receive_batch(&envelopes)?;
    let value = json!({
        "receipts": envelopes.iter().zip(&receipts).map(|(e, r)| json!({
            "event_id": e.event_id.as_str(),
            "receipt": r.as_str(),
        })).collect::<Vec<_>>()
    });
    emit(json_mode, &value, || {
        let mut lines: Vec<String> = envelopes
            .iter()
            .zip(&receipts)
            .map(|(e, r)| format!("{} {} seq {}: {r}", e.event_id, e.flow_id, e.seq))
            .collect();
        lines.push(format!("{} envelopes received", receipts.len()));
        lines.join("\n")
    });
    Ok(())
}

fn apply(json_mode: bool, args: ApplyArgs) -> Result<(), Failure> {
    let options = ApplyOptions {
        support_v2: args.support_v2,
    };
    let mut consumer = open_consumer(&args.consumer)?;
    let drains = match &args.flow {
        Some(flow_id) => vec![drain(
            &mut consumer,
            flow_id,
            args.limit,
            options,
            args.batch,
        )?],
        None => process_all(&mut consumer, args.limit, options, args.batch)?,
    };
    emit(json_mode, &render::drains(&drains), || {
        let mut lines: Vec<String> = drains
            .iter()
            .map(|d| {
                let reason = render::reason_suffix(d.stop.reason());
                format!(
                    "{}: applied {}, stop {}{reason}",
                    d.flow_id,
                    d.applied,
                    d.stop.as_str()
                )
            })
            .collect();
        if lines.is_empty() {
            lines.push("no flow has work".into());
        }
        lines.join("\n")
    });
    Ok(())
}

/// Both files' rows, one read transaction per file.
pub fn snapshot_value(
    producer: &mut ProducerDb,
    consumer: &mut ConsumerDb,
) -> Result<Value, StoreError> {
    let (flows, outbox) = producer.snapshot()?;
    let (inbox, projections, effects) = consumer.snapshot()?;
    Ok(json!({
        "producer": {
            "flows": flows.iter().map(render::flow).collect::<Vec<_>>(),
            "outbox": outbox.iter().map(render::outbox).collect::<Vec<_>>(),
        },
        "consumer": {
            "inbox": inbox.iter().map(render::inbox).collect::<Vec<_>>(),
            "projection": projections.iter().map(render::projection).collect::<Vec<_>>(),
            "effects": effects.iter().map(render::effect).collect::<Vec<_>>(),
        }
    }))
}

fn snapshot(json_mode: bool, files: Files) -> Result<(), Failure> {
    let (mut producer, mut consumer) = open_both(&files)?;
    let value = snapshot_value(&mut producer, &mut consumer)?;
    emit(json_mode, &value, || snapshot_text(&value));
    Ok(())
}

fn snapshot_text(value: &Value) -> String {
    let rows = |side: &str, table: &str| value[side][table].as_array().cloned().unwrap_or_default();
    let mut out = Vec::new();
    out.push("producer flows:".to_string());
    for f in rows("producer", "flows") {
        out.push(format!(
            "  {} {} quantity {} last_seq {}",
            f["flow_id"].as_str().unwrap_or(""),
            f["state"].as_str().unwrap_or(""),
            f["quantity"],
            f["last_seq"]
        ));
    }
    out.push("producer outbox:".to_string());
    for e in rows("producer", "outbox") {
        out.push(format!(
            "  {} {} seq {} {} accepted={}",
            e["event_id"].as_str().unwrap_or(""),
            e["flow_id"].as_str().unwrap_or(""),
            e["seq"],
            e["type"].as_str().unwrap_or(""),
            e["accepted"]
        ));
    }
    out.push("consumer inbox:".to_string());
    for e in rows("consumer", "inbox") {
        let reason = e["reason"]
            .as_str()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        out.push(format!(
            "  {} {} seq {} {} {}{reason}",
            e["event_id"].as_str().unwrap_or(""),
            e["flow_id"].as_str().unwrap_or(""),
            e["seq"],
            e["type"].as_str().unwrap_or(""),
            e["status"].as_str().unwrap_or(""),
        ));
    }
    out.push("consumer projection:".to_string());
    for p in rows("consumer", "projection") {
        out.push(format!(
            "  {} {} quantity {} applied_seq {}",
            p["flow_id"].as_str().unwrap_or(""),
            p["state"].as_str().unwrap_or(""),
            p["quantity"],
            p["applied_seq"]
        ));
    }
    out.push(format!(
        "consumer effects: {}",
        rows("consumer", "effects").len()
    ));
    out.join("\n")
}
