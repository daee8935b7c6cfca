//! One function per command: validate, open (the implied `init`), call the
//! library, print.

use ordo_reservation::{Advance, AdvanceError, AdvanceRequest, ApplyOptions, ReservationHandler};
use std::collections::HashMap;
use std::io::Read;

use ordo_core::envelope::{parse_stream, StreamError};
use ordo_core::ops::InboxScope;
use ordo_core::{
    relay_each, relay_event, Envelope, ErrorKind, EventId, RelayError, RelayOptions, RelayPolicy,
    RelayStop, StoreError, StoreId, Transport,
};
use ordo_sqlite::OpenOptions;
use serde_json::{json, Value};

use crate::args::{
    AdvanceArgs, ApplyArgs, Cli, Command, Files, InitArgs, PolicyArg, ReceiveArgs, RelayArgs, Sides,
};
use crate::context::{
    adopt_consumer, adopt_producer, adoptable, check_distinct, check_producer, check_sides, clock,
    emit, existing_consumer_domain, existing_producer_domain, fixed_now_ms, open_both,
    open_consumer, open_consumer_of, open_existing_producer, open_producer, open_producer_of,
    open_reservation_consumer, open_reservation_producer, producer_if_exists, set_open_options,
};
use crate::stores::{AnyConsumer, AnyProducer, Location};
use crate::stores::{ReservationInbox, ReservationSide};
use crate::{destinations, follow, lab, ops, remote, render, Failure};
use ordo_core::DestinationName;

/// Runs a command; returns the exit status of a completed command (0, or 3
/// for a breached `status` threshold).
pub fn run(cli: Cli) -> Result<u8, Failure> {
    let json_mode = cli.json;
    fixed_now_ms()?;
    set_open_options(OpenOptions {
        busy_timeout: std::time::Duration::from_millis(cli.busy_timeout_ms),
        ..OpenOptions::default()
    });
    if let Command::Status(args) = cli.command {
        return Ok(ops::status(json_mode, args)?.unwrap_or(0));
    }
    match cli.command {
        Command::Init(args) => init(json_mode, args),
        Command::Advance(args) => advance(json_mode, args),
        Command::Relay(args) => relay_cmd(json_mode, args),
        Command::Receive(args) => receive(json_mode, args),
        Command::Apply(args) => apply(json_mode, args),
        Command::Snapshot(sides) => snapshot(json_mode, sides),
        Command::Demo(args) => lab::demo(json_mode, args),
        Command::Experiment(args) => lab::experiment(json_mode, args),
        Command::Soak(args) => lab::soak(json_mode, args),
        Command::Bench(args) => lab::bench(json_mode, args),
        Command::Worker { role } => lab::worker(json_mode, role),
        Command::Destination { command } => crate::destinations::run(json_mode, command),
        Command::Effects { command } => crate::effects::run(json_mode, command),
        Command::Outbox { command } => ops::outbox(json_mode, command),
        Command::Inbox { command } => ops::inbox(json_mode, command),
        Command::Prune(args) => ops::prune(json_mode, args),
        Command::Serve(args) => crate::serve::serve(json_mode, args),
        Command::Console(args) => crate::console::console(json_mode, args),
        Command::Status(_) => unreachable!("handled above"),
    }
    .map(|()| 0)
}

fn init(json_mode: bool, args: InitArgs) -> Result<(), Failure> {
    if args.producer_name.is_some() && args.sides.producer.is_none() {
        return Err(Failure::Usage(
            "--producer-name names a producer store: give --producer".into(),
        ));
    }
    let domain = args
        .domain
        .as_ref()
        .map_or(ordo_reservation::DOMAIN, |d| d.as_str());
    if args.adopt {
        // An application's own database: the store refuses another
        // program's file, an ordo store of another domain, and tables named
        // like ordo's, before it writes anything.
        for location in [&args.sides.producer, &args.sides.consumer]
            .into_iter()
            .flatten()
        {
            adoptable(location)?;
        }
        if let Some(files) = args.sides.both() {
            check_distinct(&files)?;
        }
    } else {
        // Every given store is checked before any is created or changed;
        // without --domain an existing store is left as it is, whatever its
        // domain.
        check_sides(&args.sides)?;
        let checked = args.domain.as_ref().map(|_| domain);
        if let Some(location) = &args.sides.producer {
            check_domain(location, existing_producer_domain(location)?, checked)?;
        }
        if let Some(location) = &args.sides.consumer {
            check_domain(location, existing_consumer_domain(location)?, checked)?;
        }
    }
    let mut value = serde_json::Map::new();
    let mut lines = Vec::new();
    if let Some(location) = &args.sides.producer {
        let store = match args.adopt {
            true => adopt_producer(location, domain, args.producer_name.as_ref())?,
            false => open_producer_of(location, domain, args.producer_name.as_ref())?,
        };
        value.insert("producer".into(), location.to_string().into());
        lines.push(format!("producer {location} (domain {})", store.domain()));
    }
    if let Some(location) = &args.sides.consumer {
        let store = match args.adopt {
            true => adopt_consumer(location, domain)?,
            false => open_consumer_of(location, domain)?,
        };
        value.insert("consumer".into(), location.to_string().into());
        lines.push(format!("consumer {location} (domain {})", store.domain()));
    }
    emit(json_mode, &Value::Object(value), || {
        format!("initialised {}", lines.join(" and "))
    });
    Ok(())
}

/// Refuses an existing store (of domain `stored`) of a domain other than
/// `wanted`, when one is asked for.
fn check_domain(
    location: &Location,
    stored: Option<String>,
    wanted: Option<&str>,
) -> Result<(), Failure> {
    match (stored, wanted) {
        (Some(stored), Some(wanted)) if stored != wanted => Err(Failure::Usage(format!(
            "{location} belongs to domain \"{stored}\", not \"{wanted}\"; init never changes a store's domain"
        ))),
        _ => Ok(()),
    }
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
    let mut producer = open_reservation_producer(&args.producer)?;
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

pub fn relay_failure(error: RelayError) -> Failure {
    match error {
        RelayError::UnknownEvent(_) => Failure::Usage(error.to_string()),
        RelayError::Store(store) => Failure::from(store),
        other => Failure::Internal(other.to_string()),
    }
}

pub fn relay_options(args: &RelayArgs) -> RelayOptions {
    RelayOptions {
        policy: match args.policy {
            PolicyArg::Fair => RelayPolicy::Fair,
            PolicyArg::FirstPending => RelayPolicy::FirstPending,
        },
        max: args.max,
        batch_len_max: args.batch as usize,
        flow_events_max: args.flow_events as usize,
        ..RelayOptions::default()
    }
}

fn relay_cmd(json_mode: bool, args: RelayArgs) -> Result<(), Failure> {
    if args.follow {
        return follow::relay(json_mode, &args);
    }
    let Some(consumer) = &args.consumer else {
        let transport = remote::transport(&args)?;
        let mut producer = open_existing_producer(&args.producer)?;
        destinations::choose(producer.handle(), args.destination.as_ref())?;
        remote::check_key_producer(&transport, &mut producer, &args)?;
        return relay_once(json_mode, &args, &mut producer, transport);
    };
    let files = Files {
        producer: args.producer.clone(),
        consumer: consumer.clone(),
    };
    check_distinct(&files)?;
    // An unknown --event is invalid input: refuse it before the consumer
    // store is opened (and so created), and without creating the producer.
    check_producer(&args.producer)?;
    match &mut producer_if_exists(&args.producer)? {
        Some(producer) => {
            destinations::choose(producer.handle(), args.destination.as_ref())?;
            if let Some(event_id) = &args.event {
                check_event(producer, event_id, args.destination.as_ref())?;
            }
        }
        None => {
            if let Some(event_id) = &args.event {
                return Err(relay_failure(RelayError::UnknownEvent(event_id.clone())));
            }
            if let Some(name) = args
                .destination
                .as_ref()
                .filter(|n| n.as_str() != "default")
            {
                return Err(Failure::Usage(format!("no destination named {name}")));
            }
        }
    }
    let (mut producer, consumer) = open_both(&files)?;
    destinations::choose(producer.handle(), args.destination.as_ref())?;
    relay_once(json_mode, &args, &mut producer, consumer)
}

/// Refuses an `--event` that is not in the outbox, or whose flow is not
/// delivered to the destination `name` (or the store's only one).
fn check_event(
    producer: &mut AnyProducer,
    event_id: &EventId,
    name: Option<&DestinationName>,
) -> Result<(), Failure> {
    let handle = producer.handle();
    let Some(record) = handle.outbox_event(event_id)? else {
        return Err(relay_failure(RelayError::UnknownEvent(event_id.clone())));
    };
    let event = &record.envelope;
    let destination = match name {
        Some(name) => name.clone(),
        None => match handle.destinations(0)?.pop() {
            Some(only) => only.name,
            None => return Ok(()),
        },
    };
    let rows = handle.flow_outbox_entries(&event.flow_id, event.seq.get() as usize)?;
    let entry = rows.iter().find(|e| &e.envelope.event_id == event_id);
    let delivered = entry.is_some_and(|e| {
        (e.destinations.iter()).any(|c| c.destination == destination && !c.abandoned)
    });
    if delivered {
        return Ok(());
    }
    Err(Failure::Usage(
        ordo_core::destination::DestinationRefused::NotDelivered {
            flow: event.flow_id.clone(),
            destination,
        }
        .to_string(),
    ))
}

/// One relay run through `transport`, printed.
fn relay_once<T: Transport>(
    json_mode: bool,
    args: &RelayArgs,
    producer: &mut AnyProducer,
    mut transport: T,
) -> Result<(), Failure> {
    let mut run = render::RelayRun::default();
    let clock = clock();
    let stop = match &args.event {
        Some(event_id) => {
            check_event(producer, event_id, args.destination.as_ref())?;
            let report = relay_event(producer.handle(), &mut transport, event_id, clock.as_ref())
                .map_err(relay_failure)?;
            report
                .deliveries
                .into_iter()
                .for_each(|d| run.deliveries.push(d));
            report
                .refusals
                .into_iter()
                .for_each(|r| run.refusals.push(r));
            run.transient_errors = report.transient_errors;
            report.stop
        }
        None => relay_each(
            producer.handle(),
            &mut transport,
            &relay_options(args),
            clock.as_ref(),
            |handover| run.note(handover),
        )
        .map_err(relay_failure)?,
    };
    emit(json_mode, &render::relay(&run, stop), || {
        relay_text(&run, stop)
    });
    Ok(())
}

fn relay_text(run: &render::RelayRun, stop: RelayStop) -> String {
    let deliveries = &run.deliveries;
    let mut lines: Vec<String> = deliveries
        .listed
        .iter()
        .map(|d| format!("{} {} seq {}: {}", d.event_id, d.flow_id, d.seq, d.receipt))
        .collect();
    lines.extend(deliveries.more_line());
    lines.extend(run.refusals.listed.iter().map(|r| {
        format!(
            "{} {} seq {}: quarantined, {}: {}",
            r.event_id,
            r.flow_id,
            r.seq,
            r.reason.as_str(),
            r.message
        )
    }));
    lines.extend(run.refusals.more_line());
    let mut summary = format!("{} deliveries", deliveries.total);
    if run.refusals.total > 0 {
        summary.push_str(&format!(", {} refused", run.refusals.total));
    }
    if run.transient_errors > 0 {
        summary.push_str(&format!(
            ", {} rounds failed transiently (backing off)",
            run.transient_errors
        ));
    }
    lines.push(format!("{summary}, stop: {}", stop.as_str()));
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
    let answers = consumer.handle().receive_answers(&envelopes)?;
    let received = || envelopes.iter().zip(&answers);
    let value = json!({
        "receipts": received().map(|(e, a)| render::receipt(e, a)).collect::<Vec<_>>()
    });
    emit(json_mode, &value, || {
        let mut lines: Vec<String> = received()
            .map(|(e, a)| render::receipt_line(e, a))
            .collect();
        lines.push(format!("{} envelopes received", answers.len()));
        lines.join("\n")
    });
    Ok(())
}

fn apply(json_mode: bool, args: ApplyArgs) -> Result<(), Failure> {
    if args.follow {
        return follow::apply(json_mode, &args);
    }
    let options = ApplyOptions {
        support_v2: args.support_v2,
    };
    let mut consumer = open_reservation_consumer(&args.consumer)?;
    let mut handler = reservation_handler(options, args.webhook.as_deref());
    let mut drains = render::Bounded::default();
    match &args.flow {
        Some(flow_id) => drains.push(consumer.drain_reservation(
            &ordo_core::InboxFlow::new(
                args.producer_name.clone().unwrap_or_default(),
                flow_id.clone(),
            ),
            args.limit,
            &mut handler,
            args.batch,
        )?),
        None => consumer
            .process_reservation_each(args.limit, &mut handler, args.batch, |d| drains.push(d))?,
    };
    emit(json_mode, &render::drains(&drains), || {
        let mut lines: Vec<String> = drains
            .listed
            .iter()
            .map(|d| {
                let reason = render::reason_suffix(d.stop.reason());
                format!(
                    "{}: applied {}, stop {}{reason}",
                    d.flow,
                    d.applied,
                    d.stop.as_str()
                )
            })
            .collect();
        lines.extend(drains.more_line());
        if lines.is_empty() {
            lines.push("no flow has work".into());
        }
        lines.join("\n")
    });
    Ok(())
}

/// The reservation handler of `options`, recording a `webhook` intent per
/// applied event when `webhook` names a URL.
pub fn reservation_handler(options: ApplyOptions, webhook: Option<&str>) -> ReservationHandler {
    let handler = ReservationHandler::new(options);
    match webhook {
        Some(url) => handler.with_webhook(url),
        None => handler,
    }
}

/// The producer's rows in one read transaction (no flows for a store of
/// another domain than the reservation).
fn producer_snapshot_value(producer: &mut AnyProducer) -> Result<Value, StoreError> {
    let (flows, outbox) = producer.snapshot()?;
    Ok(json!({
        "store_id": producer.handle().store_id().as_str(),
        "producer_name": producer.handle().producer_name().as_str(),
        "flows": flows.iter().map(render::flow).collect::<Vec<_>>(),
        "outbox": outbox.iter().map(render::outbox).collect::<Vec<_>>(),
    }))
}

/// An inbox row's identity `(producer, flow_id, seq)`: it never holds
/// another row, so a row's delivering store read apart stays its own.
type InboxKey = (String, String, i64);

fn inbox_key(envelope: &Envelope) -> InboxKey {
    let producer = envelope.producer.as_str().to_owned();
    (
        producer,
        envelope.flow_id.as_str().to_owned(),
        envelope.seq.get(),
    )
}

/// How many times `snapshot` reads the consumer again when a row it read
/// was pruned before its delivering store was read.
const SNAPSHOT_READS_MAX: usize = 3;

/// The consumer's rows in one read transaction (no projection or effects
/// for a store of another domain than the reservation), each inbox row
/// with its delivering store, read right after from the same rows (a
/// row pruned in between reads the whole snapshot again).
fn consumer_snapshot_value(consumer: &mut AnyConsumer) -> Result<Value, StoreError> {
    let rows_max = ordo_core::ops::WHOLE_READ_ROWS_MAX;
    for _ in 0..SNAPSHOT_READS_MAX {
        let (inbox, projections, effects) = consumer.snapshot()?;
        let entries = (consumer.handle()).inbox_entries(false, InboxScope::All, rows_max)?;
        let store_ids: HashMap<InboxKey, Option<StoreId>> = (entries.into_iter())
            .map(|e| (inbox_key(&e.envelope), e.store_id))
            .collect();
        let rows: Option<Vec<Value>> = (inbox.iter())
            .map(|r| {
                (store_ids.get(&inbox_key(&r.envelope))).map(|id| render::inbox(r, id.as_ref()))
            })
            .collect();
        let Some(rows) = rows else { continue };
        return Ok(json!({
            "store_id": consumer.handle().store_id().as_str(),
            "inbox": rows,
            "projection": projections.iter().map(render::projection).collect::<Vec<_>>(),
            "effects": effects.iter().map(render::effect).collect::<Vec<_>>(),
        }));
    }
    Err(StoreError::new(
        ErrorKind::Busy,
        "inbox rows were pruned while the snapshot read them, each time; run it again",
    ))
}

fn snapshot(json_mode: bool, sides: Sides) -> Result<(), Failure> {
    check_sides(&sides)?;
    let mut value = serde_json::Map::new();
    if let Some(location) = &sides.producer {
        let mut producer = open_producer(location)?;
        value.insert("producer".into(), producer_snapshot_value(&mut producer)?);
    }
    if let Some(location) = &sides.consumer {
        let mut consumer = open_consumer(location)?;
        value.insert("consumer".into(), consumer_snapshot_value(&mut consumer)?);
    }
    let value = Value::Object(value);
    emit(json_mode, &value, || snapshot_text(&value));
    Ok(())
}

/// A row's marks at each destination, ` (A accepted, B pending)`, when
/// its flow is delivered to more than one; else nothing.
fn destination_marks(destinations: &Value) -> String {
    let Some(by_name) = destinations.as_object().filter(|d| d.len() > 1) else {
        return String::new();
    };
    let mark = |c: &Value| {
        let marks = ["accepted", "abandoned", "quarantined"];
        let set = marks.into_iter().find(|mark| c[*mark] == true);
        set.unwrap_or("pending")
    };
    let marks: Vec<String> = (by_name.iter())
        .map(|(name, c)| format!("{name} {}", mark(c)))
        .collect();
    format!(" ({})", marks.join(", "))
}

fn snapshot_text(value: &Value) -> String {
    let rows = |side: &str, table: &str| value[side][table].as_array().cloned().unwrap_or_default();
    fn text(v: &Value) -> &str {
        v.as_str().unwrap_or("")
    }
    /// A table's row as its line shows it.
    type Line = fn(&Value) -> String;
    // Each table of a side given: its name, then a line a row.
    let tables: [(&str, &str, Line); 4] = [
        ("producer", "flows", |f| {
            let (flow, state) = (text(&f["flow_id"]), text(&f["state"]));
            format!(
                "{flow} {state} quantity {} last_seq {}",
                f["quantity"], f["last_seq"]
            )
        }),
        ("producer", "outbox", |e| {
            let (event, flow, kind) = (text(&e["event_id"]), text(&e["flow_id"]), text(&e["type"]));
            format!(
                "{event} {flow} seq {} {kind} accepted={}{}",
                e["seq"],
                e["accepted"],
                destination_marks(&e["destinations"])
            )
        }),
        ("consumer", "inbox", |e| {
            let (event, flow, kind) = (text(&e["event_id"]), text(&e["flow_id"]), text(&e["type"]));
            let status = text(&e["status"]);
            let reason = e["reason"]
                .as_str()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default();
            format!("{event} {flow} seq {} {kind} {status}{reason}", e["seq"])
        }),
        ("consumer", "projection", |p| {
            let (flow, state) = (text(&p["flow_id"]), text(&p["state"]));
            format!(
                "{flow} {state} quantity {} applied_seq {}",
                p["quantity"], p["applied_seq"]
            )
        }),
    ];
    let mut out = Vec::new();
    for (side, table, line) in tables {
        if value.get(side).is_some() {
            out.push(format!("{side} {table}:"));
            out.extend(
                rows(side, table)
                    .iter()
                    .map(|row| format!("  {}", line(row))),
            );
        }
    }
    if value.get("consumer").is_some() {
        out.push(format!(
            "consumer effects: {}",
            rows("consumer", "effects").len()
        ));
    }
    out.join("\n")
}
