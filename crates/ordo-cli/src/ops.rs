//! Operator commands: outbox and inbox inspection and repair, status with
//! alert thresholds, pruning.

#[allow(unused_imports)]
use ordo_reservation::ApplyOptions;
use std::collections::BTreeMap;

use ordo_core::ops::{
    ConsumerStatus, InboxEntry, OutboxEntry, ProducerStatus, RepairRecord, SkipRequest,
};
use ordo_core::{drain, ConsumerStore, ProducerStore, APPLY_BATCH_LEN_DEFAULT};
use serde_json::{json, Value};

use crate::args::{InboxCommand, OutboxCommand, PruneArgs, StatusArgs};
use crate::context::{
    clock, emit, open_both, open_consumer, open_producer, open_reservation_consumer,
};
use crate::{render, Failure};

fn outbox_entry(e: &OutboxEntry) -> Value {
    render::envelope_with(
        &e.envelope,
        json!({
            "accepted": e.accepted,
            "quarantined": e.quarantined,
            "quarantine_reason": e.quarantine_reason,
            "attempts": e.attempts,
            "last_outcome": e.last_outcome,
            "last_error": e.last_error,
            "next_attempt_at_ms": e.next_attempt_at_ms,
            "created_at_ms": e.created_at_ms,
            "accepted_at_ms": e.accepted_at_ms,
        }),
    )
}

fn inbox_entry(e: &InboxEntry) -> Value {
    render::envelope_with(
        &e.envelope,
        json!({
            "status": e.status.as_str(),
            "reason": e.status.reason().map(|r| r.as_str()),
            "received_at_ms": e.received_at_ms,
            "settled_at_ms": e.settled_at_ms,
        }),
    )
}

fn repair(r: &RepairRecord) -> Value {
    json!({
        "id": r.id,
        "action": r.action,
        "flow_id": r.flow_id.as_str(),
        "seq": r.seq.get(),
        "event_id": r.event_id.as_str(),
        "reason": r.reason,
        "by": r.by,
        "at_ms": r.at_ms,
    })
}

pub fn outbox(json_mode: bool, command: OutboxCommand) -> Result<(), Failure> {
    match command {
        OutboxCommand::List {
            producer,
            quarantined,
            limit,
        } => {
            let mut producer = open_producer(&producer)?;
            let entries = producer.outbox_entries(quarantined, limit as usize)?;
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
                                e.quarantine_reason.as_deref().unwrap_or("")
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
        OutboxCommand::Retry { producer, event_id } => {
            if !producer.exists() {
                return Err(Failure::Usage(format!(
                    "{event_id}: no such event in the outbox"
                )));
            }
            let mut store = open_producer(&producer)?;
            store
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
            limit,
        } => {
            let mut consumer = open_consumer(&consumer)?;
            let entries = consumer.inbox_entries(blocked, flow.as_ref(), limit as usize)?;
            let value = json!({"inbox": entries.iter().map(inbox_entry).collect::<Vec<_>>()});
            emit(json_mode, &value, || {
                let mut lines: Vec<String> = entries
                    .iter()
                    .map(|e| {
                        let reason = render::reason_suffix(e.status.reason());
                        format!(
                            "{} {} seq {} {}: {}{reason}",
                            e.envelope.event_id,
                            e.envelope.flow_id,
                            e.envelope.seq,
                            e.envelope.event_type,
                            e.status.as_str()
                        )
                    })
                    .collect();
                lines.push(format!("{} rows", entries.len()));
                lines.join("\n")
            });
            Ok(())
        }
        InboxCommand::Retry {
            consumer,
            flow,
            support_v2,
        } => {
            let mut consumer = open_reservation_consumer(&consumer)?;
            let reopened = consumer.reopen_blocked(&flow)?;
            let options = ApplyOptions { support_v2 };
            let d = drain(
                &mut consumer,
                &flow,
                None,
                &mut ordo_reservation::ReservationHandler::new(options),
                APPLY_BATCH_LEN_DEFAULT,
            )?;
            let value = json!({
                "flow_id": flow.as_str(),
                "reopened": reopened,
                "applied": d.applied,
                "stop": d.stop.as_str(),
                "reason": d.stop.reason().map(|r| r.as_str()),
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
        InboxCommand::Skip {
            consumer,
            flow,
            seq,
            reason,
            by,
        } => {
            let request = SkipRequest::new(flow, seq, reason, by)
                .map_err(|e| Failure::Usage(e.to_string()))?;
            if !consumer.exists() {
                return Err(Failure::Usage(format!(
                    "flow {} seq {} is not stored in the inbox; a missing event cannot be skipped",
                    request.flow_id, request.seq
                )));
            }
            let mut store = open_consumer(&consumer)?;
            let record = store
                .skip(&request)?
                .map_err(|refused| Failure::Usage(refused.to_string()))?;
            emit(json_mode, &json!({ "repair": repair(&record) }), || {
                format!(
                    "skipped {} seq {} ({}) by {}: {} [repair {}]",
                    record.flow_id,
                    record.seq,
                    record.event_id,
                    record.by,
                    record.reason,
                    record.id
                )
            });
            Ok(())
        }
        InboxCommand::Repairs { consumer } => {
            let mut consumer = open_consumer(&consumer)?;
            let records = consumer.repairs()?;
            emit(
                json_mode,
                &json!({"repairs": records.iter().map(repair).collect::<Vec<_>>()}),
                || {
                    let mut lines: Vec<String> = records
                        .iter()
                        .map(|r| {
                            format!(
                                "#{} at {} ms: {} {} seq {} ({}) by {}: {}",
                                r.id,
                                r.at_ms,
                                r.action,
                                r.flow_id,
                                r.seq,
                                r.event_id,
                                r.by,
                                r.reason
                            )
                        })
                        .collect();
                    lines.push(format!("{} repairs", records.len()));
                    lines.join("\n")
                },
            );
            Ok(())
        }
    }
}

fn age_s(now_ms: i64, since_ms: i64) -> f64 {
    ((now_ms - since_ms).max(0) as f64) / 1000.0
}

fn status_value(now_ms: i64, p: &ProducerStatus, c: &ConsumerStatus, breaches: &[Value]) -> Value {
    let blocked_total: u64 = c.blocked.values().sum();
    json!({
        "producer": {
            "backlog": p.backlog,
            "oldest_pending_age_s": p.oldest_pending_created_at_ms.map(|t| age_s(now_ms, t)),
            "quarantined": p.quarantined,
            "backing_off": p.backing_off,
        },
        "consumer": {
            "pending": c.pending,
            "blocked": {"total": blocked_total, "by_reason": c.blocked},
            "gaps": c.gaps.iter().map(|g| json!({
                "flow_id": g.flow_id.as_str(),
                "missing_seq": g.missing.get(),
                "since_ms": g.since_ms,
                "waiting_s": age_s(now_ms, g.since_ms),
            })).collect::<Vec<_>>(),
            "gaps_total": c.gaps_total,
            "applied": c.applied,
            "skipped": c.skipped,
        },
        "breaches": breaches,
        "ok": breaches.is_empty(),
    })
}

pub fn status(json_mode: bool, args: StatusArgs) -> Result<Option<u8>, Failure> {
    let (mut producer, mut consumer) = open_both(&args.files)?;
    let now_ms = clock().now_ms();
    let p = producer.producer_status(now_ms)?;
    let c = consumer.consumer_status()?;
    let blocked_total: u64 = c.blocked.values().sum();
    let oldest_age = p
        .oldest_pending_created_at_ms
        .map(|t| age_s(now_ms, t))
        .unwrap_or(0.0);
    // Counts are compared and printed as integers, the age in seconds.
    let signals = [
        (
            "backlog",
            json!(p.backlog),
            args.max_backlog,
            args.max_backlog.is_some_and(|t| p.backlog > t),
        ),
        (
            "oldest_pending_age_s",
            json!(oldest_age),
            args.max_age,
            args.max_age.is_some_and(|t| oldest_age > t as f64),
        ),
        (
            "blocked",
            json!(blocked_total),
            args.max_blocked,
            args.max_blocked.is_some_and(|t| blocked_total > t),
        ),
        (
            "quarantined",
            json!(p.quarantined),
            args.max_quarantined,
            args.max_quarantined.is_some_and(|t| p.quarantined > t),
        ),
    ];
    let breaches: Vec<Value> = signals
        .into_iter()
        .filter(|(_, _, _, breached)| *breached)
        .map(|(signal, value, threshold, _)| json!({"signal": signal, "value": value, "threshold": threshold}))
        .collect();
    let value = status_value(now_ms, &p, &c, &breaches);
    emit(json_mode, &value, || {
        let by_reason: BTreeMap<&String, &u64> = c.blocked.iter().collect();
        let mut lines = vec![
            format!(
                "producer: backlog {} (oldest {:.1} s), quarantined {}, backing off {}",
                p.backlog, oldest_age, p.quarantined, p.backing_off
            ),
            format!(
                "consumer: pending {}, blocked {} {:?}, applied {}, skipped {}",
                c.pending, blocked_total, by_reason, c.applied, c.skipped
            ),
        ];
        for g in &c.gaps {
            lines.push(format!(
                "  gap: {} waits for seq {} since {:.1} s",
                g.flow_id,
                g.missing,
                age_s(now_ms, g.since_ms)
            ));
        }
        for b in &breaches {
            lines.push(format!(
                "ALERT {} = {} > {}",
                b["signal"].as_str().unwrap_or(""),
                b["value"],
                b["threshold"]
            ));
        }
        lines.join("\n")
    });
    Ok((!breaches.is_empty()).then_some(3))
}

pub fn prune(json_mode: bool, args: PruneArgs) -> Result<(), Failure> {
    let older_than_ms = i64::try_from(args.older_than.as_millis()).unwrap_or(i64::MAX);
    let (mut producer, mut consumer) = open_both(&args.files)?;
    let cutoff_ms = clock().now_ms().saturating_sub(older_than_ms);
    let p = producer.prune_outbox(cutoff_ms)?;
    let c = consumer.prune_inbox(cutoff_ms)?;
    let value = json!({
        "cutoff_ms": cutoff_ms,
        "producer": {"removed": p.rows},
        "consumer": {"removed": c.rows, "fingerprints": c.fingerprints},
    });
    emit(json_mode, &value, || {
        format!(
            "pruned {} accepted outbox rows and {} settled inbox rows (kept {} fingerprints) older than {}",
            p.rows,
            c.rows,
            c.fingerprints,
            humantime::format_duration(args.older_than)
        )
    });
    Ok(())
}
