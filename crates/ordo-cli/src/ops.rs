//! Operator commands: outbox and inbox inspection and repair, status with
//! alert thresholds, pruning.

#[allow(unused_imports)]
use ordo_reservation::ApplyOptions;
use std::collections::BTreeMap;

use ordo_core::effect::EffectState;
use ordo_core::ops::{
    age_s, ConsumerStatus, InboxEntry, InboxScope, OutboxEntry, ProducerStatus, RepairRecord,
    SkipRequest,
};
use ordo_core::{InboxFlow, StoreId, APPLY_BATCH_LEN_DEFAULT};
use serde_json::{json, Value};

use crate::args::{InboxCommand, OutboxCommand, PruneArgs, StatusArgs};
use crate::context::{
    check_sides, clock, consumer_if_exists, emit, open_consumer, open_producer,
    open_reservation_consumer, producer_if_exists,
};
use crate::stores::Location;
use crate::stores::ReservationInbox;
use crate::{render, Failure};

fn outbox_entry(e: &OutboxEntry) -> Value {
    render::envelope_with(
        &e.envelope,
        json!({
            "accepted": e.accepted,
            "quarantined": e.quarantined,
            "quarantine_reason": e.quarantine_reason,
            "quarantine_detail": e.quarantine_detail,
            "destinations": render::destinations(e),
            "attempts": e.attempts,
            "last_outcome": e.last_outcome,
            "last_error": e.last_error,
            "next_attempt_at_ms": e.next_attempt_at_ms,
            "created_at_ms": e.created_at_ms,
            "accepted_at_ms": e.accepted_at_ms,
        }),
    )
}

/// The row `e` as the destination `name` keeps it, under a row's own keys;
/// `None` for a row of a flow not delivered there.
fn of_destination(e: OutboxEntry, name: &ordo_core::DestinationName) -> Option<OutboxEntry> {
    let c = e
        .destinations
        .iter()
        .find(|c| &c.destination == name)?
        .clone();
    Some(OutboxEntry {
        accepted: c.accepted,
        accepted_at_ms: c.accepted_at_ms,
        attempts: c.attempts,
        last_outcome: c.last_outcome.clone(),
        last_error: c.last_error.clone(),
        next_attempt_at_ms: c.next_attempt_at_ms,
        quarantined: c.quarantined,
        quarantine_reason: c.quarantine_reason.clone(),
        quarantine_detail: c.quarantine_detail.clone(),
        destinations: vec![c],
        ..e
    })
}

fn inbox_entry(e: &InboxEntry) -> Value {
    render::envelope_with(
        &e.envelope,
        json!({
            "status": e.status.as_str(),
            "reason": e.status.reason().map(|r| r.as_str()),
            "detail": e.status.reason().and_then(|r| r.detail.as_deref()),
            "received_at_ms": e.received_at_ms,
            "settled_at_ms": e.settled_at_ms,
            "producer": e.envelope.producer.as_str(),
            "store_id": e.store_id.as_ref().map(StoreId::as_str),
        }),
    )
}

fn repair(r: &RepairRecord) -> Value {
    json!({
        "id": r.id,
        "action": r.action,
        "producer": r.producer.as_str(),
        "flow_id": r.flow_id.as_str(),
        "store_id": r.store_id.as_ref().map(StoreId::as_str),
        "seq": r.seq.get(),
        "event_id": r.event_id.as_str(),
        "reason": r.reason,
        "by": r.by,
        "at_ms": r.at_ms,
        "key": r.key.as_ref().map(|k| k.as_str()),
    })
}

/// The rows `outbox list` prints: with `destination`, that destination's
/// bookkeeping of the rows of its flows.
fn listed(
    producer: &Location,
    quarantined: bool,
    destination: Option<&ordo_core::DestinationName>,
    limit: u64,
) -> Result<Vec<OutboxEntry>, Failure> {
    let mut producer = open_producer(producer)?;
    let handle = producer.handle();
    if let Some(name) = destination {
        crate::destinations::choose(handle, Some(name))?;
    }
    let entries = handle.outbox_entries(quarantined, limit as usize)?;
    Ok(match destination {
        Some(name) => (entries.into_iter())
            .filter_map(|e| of_destination(e, name))
            .collect(),
        None => entries,
    })
}

pub fn outbox(json_mode: bool, command: OutboxCommand) -> Result<(), Failure> {
    match command {
        OutboxCommand::List {
            producer,
            quarantined,
            destination,
            limit,
        } => {
            let entries = listed(&producer, quarantined, destination.as_ref(), limit)?;
            let value = json!({"outbox": entries.iter().map(outbox_entry).collect::<Vec<_>>()});
            emit(json_mode, &value, || {
                let mut lines: Vec<String> = entries
                    .iter()
                    .map(|e| {
                        let state = if e.accepted {
                            "accepted".to_string()
                        } else if e.quarantined {
                            format!(
                                "QUARANTINED ({})",
                                e.quarantine_detail.as_deref().unwrap_or("")
                            )
                        } else {
                            "pending".to_string()
                        };
                        format!(
                            "{} {} seq {} {}: {state}, attempts {}, last {}",
                            e.envelope.event_id,
                            e.envelope.flow_id,
                            e.envelope.seq,
                            e.envelope.event_type,
                            e.attempts,
                            e.last_outcome.as_deref().unwrap_or("-")
                        )
                    })
                    .collect();
                lines.push(format!("{} rows", entries.len()));
                lines.join("\n")
            });
            Ok(())
        }
        OutboxCommand::Repairs { producer } => crate::destinations::repairs(json_mode, &producer),
        OutboxCommand::Abandon(args) => crate::destinations::abandon(json_mode, args),
        OutboxCommand::Retry {
            producer,
            event_id,
            destination,
        } => {
            let Some(mut store) = producer_if_exists(&producer)? else {
                return Err(Failure::Usage(format!(
                    "{event_id}: no such event in the outbox"
                )));
            };
            crate::destinations::choose(store.handle(), destination.as_ref())?;
            store
                .handle()
                .retry_quarantined(&event_id)?
                .map_err(|refused| Failure::Usage(refused.to_string()))?;
            emit(
                json_mode,
                &json!({"event_id": event_id.as_str(), "retried": true}),
                || format!("{event_id}: quarantine cleared; the next relay tries it once more"),
            );
            Ok(())
        }
    }
}

pub fn inbox(json_mode: bool, command: InboxCommand) -> Result<(), Failure> {
    match command {
        InboxCommand::List {
            consumer,
            blocked,
            flow,
            producer_name,
            limit,
        } => {
            let flow = flow.map(|f| InboxFlow::new(producer_name.clone().unwrap_or_default(), f));
            let scope = match (&flow, &producer_name) {
                (Some(flow), _) => InboxScope::Flow(flow),
                (None, Some(producer)) => InboxScope::Producer(producer),
                (None, None) => InboxScope::All,
            };
            inbox_list(json_mode, &consumer, blocked, scope, limit)
        }
        InboxCommand::Retry {
            consumer,
            flow,
            producer_name,
            support_v2,
        } => {
            let flow = InboxFlow::new(producer_name, flow);
            inbox_retry(json_mode, &consumer, &flow, support_v2)
        }
        InboxCommand::Skip {
            consumer,
            flow,
            producer_name,
            seq,
            reason,
            by,
        } => {
            let flow = InboxFlow::new(producer_name, flow);
            let request = SkipRequest::new(flow, seq, reason, by)
                .map_err(|e| Failure::Usage(e.to_string()))?;
            inbox_skip(json_mode, &consumer, &request)
        }
        InboxCommand::Repairs { consumer } => inbox_repairs(json_mode, &consumer),
    }
}

/// One line per item, then how many there are: "N rows".
fn counted(lines: impl Iterator<Item = String>, n: usize, noun: &str) -> String {
    let mut lines: Vec<String> = lines.collect();
    lines.push(format!("{n} {noun}"));
    lines.join("\n")
}

/// `inbox list`'s line for one row.
fn inbox_line(e: &InboxEntry) -> String {
    let reason = render::reason_suffix(e.status.reason());
    format!(
        "{} {} seq {} {}: {}{reason}",
        e.envelope.event_id,
        e.envelope.inbox_flow(),
        e.envelope.seq,
        e.envelope.event_type,
        e.status.as_str()
    )
}

fn inbox_list(
    json_mode: bool,
    consumer: &Location,
    blocked: bool,
    scope: InboxScope<'_>,
    limit: u64,
) -> Result<(), Failure> {
    let mut consumer = open_consumer(consumer)?;
    let entries = consumer
        .handle()
        .inbox_entries(blocked, scope, limit as usize)?;
    let value = json!({"inbox": entries.iter().map(inbox_entry).collect::<Vec<_>>()});
    emit(json_mode, &value, || {
        counted(entries.iter().map(inbox_line), entries.len(), "rows")
    });
    Ok(())
}

fn inbox_retry(
    json_mode: bool,
    consumer: &Location,
    flow: &InboxFlow,
    support_v2: bool,
) -> Result<(), Failure> {
    let mut consumer = open_reservation_consumer(consumer)?;
    let (reopened, d) = reevaluate_blocked(&mut consumer, flow, support_v2)?;
    let value = json!({
        "flow_id": flow.flow_id.as_str(),
        "producer": flow.producer.as_str(),
        "reopened": reopened,
        "applied": d.applied,
        "stop": d.stop.as_str(),
        "reason": d.stop.reason().map(|r| r.as_str()),
        "detail": d.stop.reason().and_then(|r| r.detail.as_deref()),
    });
    emit(json_mode, &value, || {
        let reason = render::reason_suffix(d.stop.reason());
        format!(
            "{flow}: reopened {reopened} blocked rows, applied {}, stop {}{reason}",
            d.applied,
            d.stop.as_str()
        )
    });
    Ok(())
}

fn inbox_skip(json_mode: bool, consumer: &Location, request: &SkipRequest) -> Result<(), Failure> {
    let Some(mut store) = consumer_if_exists(consumer)? else {
        return Err(Failure::Usage(format!(
            "flow {} seq {} is not stored in the inbox; a missing event cannot be skipped",
            request.flow, request.seq
        )));
    };
    let record = store
        .handle()
        .skip(request)?
        .map_err(|refused| Failure::Usage(refused.to_string()))?;
    emit(json_mode, &json!({ "repair": repair(&record) }), || {
        format!(
            "skipped {} seq {} ({}) by {}: {} [repair {}]",
            record.flow_id, record.seq, record.event_id, record.by, record.reason, record.id
        )
    });
    Ok(())
}

/// `inbox repairs`'s line for one record.
fn repair_line(r: &RepairRecord) -> String {
    let key = r
        .key
        .as_ref()
        .map_or(String::new(), |k| format!(" key {k}"));
    format!(
        "#{} at {}: {} {} seq {} ({}){key} by {}: {}",
        r.id,
        render::utc_ms(r.at_ms),
        r.action,
        r.flow_id,
        r.seq,
        r.event_id,
        r.by,
        r.reason
    )
}

fn inbox_repairs(json_mode: bool, consumer: &Location) -> Result<(), Failure> {
    let mut consumer = open_consumer(consumer)?;
    let records = consumer.handle().repairs()?;
    let value = json!({"repairs": records.iter().map(repair).collect::<Vec<_>>()});
    emit(json_mode, &value, || {
        counted(records.iter().map(repair_line), records.len(), "repairs")
    });
    Ok(())
}

/// A duration the way `--older-than` takes it: `7d`, `12h`, `1d 2h 30m`,
/// `0s`.
fn compact_duration(duration: std::time::Duration) -> String {
    let mut rest_ms = duration.as_millis();
    let units: [(&str, u128); 5] = [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ];
    let mut parts = Vec::new();
    for (name, unit_ms) in units {
        let n = rest_ms / unit_ms;
        if n > 0 {
            parts.push(format!("{n}{name}"));
            rest_ms -= n * unit_ms;
        }
    }
    if parts.is_empty() {
        return "0s".into();
    }
    parts.join(" ")
}

fn producer_status_value(now_ms: i64, p: &ProducerStatus, store_id: &StoreId) -> Value {
    json!({
        "store_id": store_id.as_str(),
        "backlog": p.backlog,
        "oldest_pending_age_s": p.oldest_pending_age_s(now_ms),
        "quarantined": p.quarantined,
        "rewound": p.rewound,
        "backing_off": p.backing_off,
    })
}

fn consumer_status_value(now_ms: i64, c: &ConsumerStatus, store_id: &StoreId) -> Value {
    let blocked_total: u64 = c.blocked.values().sum();
    json!({
        "store_id": store_id.as_str(),
        "pending": c.pending,
        "blocked": {"total": blocked_total, "by_reason": c.blocked},
        "gaps": c.gaps.iter().map(|g| json!({
            "flow_id": g.flow_id.as_str(),
            "producer": g.producer.as_str(),
            "missing_seq": g.missing.get(),
            "since_ms": g.since_ms,
            "waiting_s": age_s(now_ms, g.since_ms),
        })).collect::<Vec<_>>(),
        "gaps_total": c.gaps_total,
        "applied": c.applied,
        "skipped": c.skipped,
    })
}

/// Refuses a threshold of a side that was not given.
fn check_thresholds(args: &StatusArgs) -> Result<(), Failure> {
    let producer_only = [
        ("--max-backlog", args.max_backlog),
        ("--max-age", args.max_age),
        ("--max-quarantined", args.max_quarantined),
        ("--max-rewound", args.max_rewound),
    ];
    for (flag, value) in producer_only {
        if value.is_some() && args.sides.producer.is_none() {
            return Err(Failure::Usage(format!("{flag} needs --producer")));
        }
    }
    let consumer_only = [
        ("--max-blocked", args.max_blocked),
        ("--max-unknown-effects", args.max_unknown_effects),
    ];
    for (flag, value) in consumer_only {
        if value.is_some() && args.sides.consumer.is_none() {
            return Err(Failure::Usage(format!("{flag} needs --consumer")));
        }
    }
    Ok(())
}

/// One signal: its name, value, threshold, whether it is breached, and the
/// destination it is of (named when the store has several).
type Signal = (&'static str, Value, Option<u64>, bool, Option<String>);

fn producer_signals(
    args: &StatusArgs,
    p: &ProducerStatus,
    oldest_age_s: f64,
    destination: Option<&str>,
) -> Vec<Signal> {
    let signals = [
        (
            "backlog",
            json!(p.backlog),
            args.max_backlog,
            args.max_backlog.is_some_and(|t| p.backlog > t),
        ),
        (
            "oldest_pending_age_s",
            json!(oldest_age_s),
            args.max_age,
            args.max_age.is_some_and(|t| oldest_age_s > t as f64),
        ),
        (
            "quarantined",
            json!(p.quarantined),
            args.max_quarantined,
            args.max_quarantined.is_some_and(|t| p.quarantined > t),
        ),
        (
            "rewound",
            json!(p.rewound),
            args.max_rewound,
            args.max_rewound.is_some_and(|t| p.rewound > t),
        ),
    ];
    let destination = destination.map(str::to_owned);
    (signals.into_iter())
        .map(|(name, value, threshold, breached)| {
            (name, value, threshold, breached, destination.clone())
        })
        .collect()
}

/// Each destination's signals under `destinations` in `value`, and into
/// `signals`: each destination's own when the store has several (a breach
/// names it), the store's otherwise.
fn destination_signals(
    destinations: &[ordo_core::destination::Destination],
    args: &StatusArgs,
    now_ms: i64,
    value: &mut Value,
    signals: &mut Vec<Signal>,
) {
    let mut map = serde_json::Map::new();
    for d in destinations {
        let age = d.status.oldest_pending_age_s(now_ms);
        map.insert(
            d.name.to_string(),
            json!({
                "backlog": d.status.backlog,
                "oldest_pending_age_s": age,
                "quarantined": d.status.quarantined,
                "rewound": d.status.rewound,
                "backing_off": d.status.backing_off,
            }),
        );
        if destinations.len() > 1 {
            let name = Some(d.name.as_str());
            signals.extend(producer_signals(args, &d.status, age.unwrap_or(0.0), name));
        }
    }
    value["destinations"] = Value::Object(map);
}

/// The producer's part of `status`: its JSON and its text line; its
/// signals are added to `signals`.
fn producer_side(
    location: &Location,
    args: &StatusArgs,
    now_ms: i64,
    signals: &mut Vec<Signal>,
) -> Result<(Value, String), Failure> {
    let mut producer = open_producer(location)?;
    let destinations = producer.handle().destinations(now_ms)?;
    let p = ordo_core::destination::sum_statuses(destinations.iter().map(|d| &d.status));
    let mut value = producer_status_value(now_ms, &p, producer.handle().store_id());
    value["producer_name"] = producer.producer_name().as_str().into();
    // Nothing pending: no age to claim ("-" in the text, null in JSON),
    // and no age threshold can be breached.
    let oldest_age_s = p.oldest_pending_age_s(now_ms);
    if destinations.len() <= 1 {
        signals.extend(producer_signals(
            args,
            &p,
            oldest_age_s.unwrap_or(0.0),
            None,
        ));
    }
    destination_signals(&destinations, args, now_ms, &mut value, signals);
    let oldest = oldest_age_s.map_or("-".to_owned(), |age| format!("{age:.1} s"));
    let rewound = match p.rewound {
        0 => String::new(),
        n => format!(" (rewound {n})"),
    };
    let line = format!(
        "producer: backlog {} (oldest {oldest}), quarantined {}{rewound}, backing off {}",
        p.backlog, p.quarantined, p.backing_off
    );
    Ok((value, line))
}

/// The consumer's part of `status`: its JSON and its text lines; its
/// signal is added to `signals`.
fn consumer_side(
    location: &Location,
    args: &StatusArgs,
    now_ms: i64,
    signals: &mut Vec<Signal>,
) -> Result<(Value, Vec<String>), Failure> {
    let mut consumer = open_consumer(location)?;
    let c = consumer.handle().consumer_status()?;
    let store_id = consumer.handle().store_id().clone();
    let blocked_total: u64 = c.blocked.values().sum();
    signals.push((
        "blocked",
        json!(blocked_total),
        args.max_blocked,
        args.max_blocked.is_some_and(|t| blocked_total > t),
        None,
    ));
    let by_reason: BTreeMap<&String, &u64> = c.blocked.iter().collect();
    let mut lines = vec![format!(
        "consumer: pending {}, blocked {} {:?}, applied {}, skipped {}",
        c.pending, blocked_total, by_reason, c.applied, c.skipped
    )];
    for g in &c.gaps {
        lines.push(format!(
            "  gap: {} waits for seq {} since {:.1} s",
            g.flow_id,
            g.missing,
            age_s(now_ms, g.since_ms)
        ));
    }
    let mut value = consumer_status_value(now_ms, &c, &store_id);
    let effects = crate::effects::status_counts(&mut consumer, now_ms)?;
    let unknown = effects.of(EffectState::OutcomeUnknown);
    signals.push((
        "outcome_unknown",
        json!(unknown),
        args.max_unknown_effects,
        args.max_unknown_effects.is_some_and(|t| unknown > t),
        None,
    ));
    // A store without intents keeps its text as it was.
    if effects.by_state.iter().sum::<u64>() > 0 {
        lines.push(crate::effects::counts_line(&effects));
    }
    value["effects"] = crate::effects::counts_value(&effects);
    Ok((value, lines))
}

pub fn status(json_mode: bool, args: StatusArgs) -> Result<Option<u8>, Failure> {
    check_thresholds(&args)?;
    check_sides(&args.sides)?;
    let now_ms = clock().now_ms();
    let mut value = serde_json::Map::new();
    let mut lines = Vec::new();
    let mut signals: Vec<Signal> = Vec::new();
    if let Some(location) = &args.sides.producer {
        let (side, line) = producer_side(location, &args, now_ms, &mut signals)?;
        value.insert("producer".into(), side);
        lines.push(line);
    }
    if let Some(location) = &args.sides.consumer {
        let (side, side_lines) = consumer_side(location, &args, now_ms, &mut signals)?;
        value.insert("consumer".into(), side);
        lines.extend(side_lines);
    }
    // In the contract's order; counts are compared and printed as
    // integers, the age in seconds.
    const ORDER: [&str; 6] = [
        "backlog",
        "oldest_pending_age_s",
        "blocked",
        "quarantined",
        "rewound",
        "outcome_unknown",
    ];
    signals.sort_by_key(|(name, ..)| ORDER.iter().position(|n| n == name));
    let breaches: Vec<Value> = signals
        .into_iter()
        .filter(|(_, _, _, breached, _)| *breached)
        .map(|(signal, value, threshold, _, destination)| {
            let mut breach = json!({"signal": signal, "value": value, "threshold": threshold});
            if let Some(destination) = destination {
                breach["destination"] = destination.into();
            }
            breach
        })
        .collect();
    for b in &breaches {
        let at = b["destination"]
            .as_str()
            .map_or(String::new(), |d| format!(" (destination {d})"));
        lines.push(format!(
            "ALERT {} = {} > {}{at}",
            b["signal"].as_str().unwrap_or(""),
            b["value"],
            b["threshold"]
        ));
    }
    value.insert("ok".into(), json!(breaches.is_empty()));
    value.insert("breaches".into(), Value::Array(breaches.clone()));
    emit(json_mode, &Value::Object(value), || lines.join("\n"));
    Ok((!breaches.is_empty()).then_some(3))
}

pub fn prune(json_mode: bool, args: PruneArgs) -> Result<(), Failure> {
    check_sides(&args.sides)?;
    let older_than_ms = i64::try_from(args.older_than.as_millis()).unwrap_or(i64::MAX);
    let cutoff_ms = clock().now_ms().saturating_sub(older_than_ms);
    let mut value = serde_json::Map::new();
    value.insert("cutoff_ms".into(), json!(cutoff_ms));
    let mut parts = Vec::new();
    if let Some(location) = &args.sides.producer {
        let p = open_producer(location)?.handle().prune_outbox(cutoff_ms)?;
        value.insert("producer".into(), json!({"removed": p.rows}));
        parts.push(format!("{} accepted outbox rows", p.rows));
    }
    if let Some(location) = &args.sides.consumer {
        let c = open_consumer(location)?.handle().prune_inbox(cutoff_ms)?;
        value.insert(
            "consumer".into(),
            json!({"removed": c.rows, "fingerprints": c.fingerprints}),
        );
        parts.push(format!(
            "{} settled inbox rows (kept {} fingerprints)",
            c.rows, c.fingerprints
        ));
    }
    emit(json_mode, &Value::Object(value), || {
        format!(
            "pruned {} older than {}",
            parts.join(" and "),
            compact_duration(args.older_than)
        )
    });
    Ok(())
}

/// `inbox retry`: sets the flow's blocked rows back to pending and drains
/// the flow through the reservation handler; how many rows were reopened,
/// and the drain. The console's re-evaluation makes the same calls.
pub fn reevaluate_blocked(
    consumer: &mut crate::stores::AnyConsumer,
    flow: &InboxFlow,
    support_v2: bool,
) -> Result<(u64, ordo_core::Drain), Failure> {
    let reopened = consumer.handle().reopen_blocked(flow)?;
    let options = ApplyOptions { support_v2 };
    let drained = consumer.drain_reservation(
        flow,
        None,
        &mut ordo_reservation::ReservationHandler::new(options),
        APPLY_BATCH_LEN_DEFAULT,
    )?;
    Ok((reopened, drained))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn prune_durations_read_as_they_are_written() {
        let cases = [
            (Duration::from_secs(7 * 86_400), "7d"),
            (Duration::from_secs(12 * 3_600), "12h"),
            (Duration::from_secs(30 * 60), "30m"),
            (
                Duration::from_secs(86_400 + 2 * 3_600 + 30 * 60),
                "1d 2h 30m",
            ),
            (Duration::from_millis(1_500), "1s 500ms"),
            (Duration::ZERO, "0s"),
        ];
        for (duration, text) in cases {
            assert_eq!(compact_duration(duration), text, "{duration:?}");
        }
    }
}
