//! `destination add|list|remove`, and the choice of one destination that
//! `relay` and `outbox retry` act on.

use clap::Subcommand;
use ordo_core::destination::{
    check_who_why, AbandonRequest, Destination, DestinationStart, ProducerRepair,
};
use ordo_core::ops::age_s;
use ordo_core::{DestinationName, ProducerStore};
use serde_json::{json, Value};

use crate::context::{clock, emit, open_existing_producer};
use crate::stores::Location;
use crate::Failure;

#[derive(Debug, Subcommand)]
pub enum DestinationCommand {
    /// Add a destination: every flow from seq 1 (--from start) or the flows begun from now on.
    Add {
        /// The producer store: an SQLite file or a postgres:// URL.
        #[arg(long, value_name = "P")]
        producer: Location,
        /// Its name, `[a-z][a-z0-9_-]{0,63}`.
        #[arg(value_name = "NAME", value_parser = name)]
        name: DestinationName,
        /// Which flows it receives: start (every flow, from seq 1) or now.
        #[arg(long, value_name = "start|now", default_value = "start", value_parser = start)]
        from: DestinationStart,
    },
    /// The destinations with their backlogs and quarantines.
    List {
        /// The producer store: an SQLite file or a postgres:// URL.
        #[arg(long, value_name = "P")]
        producer: Location,
    },
    /// Remove a destination and its custody (never the last one), audited.
    Remove {
        /// The producer store: an SQLite file or a postgres:// URL.
        #[arg(long, value_name = "P")]
        producer: Location,
        /// The destination.
        #[arg(value_name = "NAME", value_parser = name)]
        name: DestinationName,
        /// Who decided.
        #[arg(long, value_name = "WHO")]
        by: String,
        /// Why.
        #[arg(long, value_name = "WHY")]
        reason: String,
    },
}

/// A destination name argument.
pub fn name(value: &str) -> Result<DestinationName, String> {
    DestinationName::new(value).map_err(|e| e.rule)
}

fn start(value: &str) -> Result<DestinationStart, String> {
    DestinationStart::parse(value).ok_or_else(|| "must be start or now".to_string())
}

/// Makes `producer` act on the destination `name`, or on its only one;
/// several and none named, or an unknown name, is invalid input.
pub fn choose(
    producer: &mut (dyn ProducerStore + Send),
    name: Option<&DestinationName>,
) -> Result<(), Failure> {
    producer
        .use_destination(name)?
        .map_err(|refused| Failure::Usage(refused.to_string()))
}

pub fn run(json_mode: bool, command: DestinationCommand) -> Result<(), Failure> {
    match command {
        DestinationCommand::Add {
            producer,
            name,
            from,
        } => {
            let mut store = open_existing_producer(&producer)?;
            store
                .handle()
                .add_destination(&name, from)?
                .map_err(|refused| Failure::Usage(refused.to_string()))?;
            let value = json!({"destination": name.as_str(), "from": from.as_str(), "added": true});
            emit(json_mode, &value, || {
                format!("destination {name} added (from {})", from.as_str())
            });
            Ok(())
        }
        DestinationCommand::List { producer } => list(json_mode, &producer),
        DestinationCommand::Remove {
            producer,
            name,
            by,
            reason,
        } => {
            check_who_why(&by, &reason).map_err(Failure::Usage)?;
            let mut store = open_existing_producer(&producer)?;
            store
                .handle()
                .remove_destination(&name, &by, &reason)?
                .map_err(|refused| Failure::Usage(refused.to_string()))?;
            let value = json!({"destination": name.as_str(), "removed": true});
            emit(json_mode, &value, || format!("destination {name} removed"));
            Ok(())
        }
    }
}

fn list(json_mode: bool, producer: &Location) -> Result<(), Failure> {
    let mut store = open_existing_producer(producer)?;
    let now_ms = clock().now_ms();
    let handle = store.handle();
    let destinations = handle.destinations(now_ms)?;
    let rows: Vec<Value> = destinations.iter().map(|d| row(d, now_ms)).collect();
    let value = json!({
        "producer_name": handle.producer_name().as_str(),
        "store_id": handle.store_id().as_str(),
        "destinations": rows,
    });
    emit(json_mode, &value, || {
        destinations
            .iter()
            .map(|d| {
                format!(
                    "{} (from {}): backlog {}, quarantined {}, rewound {}, consumer {}",
                    d.name,
                    d.from.as_str(),
                    d.status.backlog,
                    d.status.quarantined,
                    d.status.rewound,
                    d.consumer_store_id.as_ref().map_or("-", |id| id.as_str())
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    });
    Ok(())
}

fn row(d: &Destination, now_ms: i64) -> Value {
    json!({
        "name": d.name.as_str(),
        "from": d.from.as_str(),
        "consumer_store_id": d.consumer_store_id.as_ref().map(|id| id.as_str()),
        "backlog": d.status.backlog,
        "oldest_pending_age_s": d.status.oldest_pending_created_at_ms.map(|since| age_s(now_ms, since)),
        "quarantined": d.status.quarantined,
        "rewound": d.status.rewound,
        "created_at_ms": d.created_at_ms,
    })
}

/// One row of the producer's audit log as `outbox repairs --json` prints it.
fn repair(r: &ProducerRepair) -> Value {
    json!({
        "id": r.id, "action": r.action, "destination": r.destination,
        "flow_id": r.flow_id, "seq": r.seq, "event_id": r.event_id,
        "reason": r.reason, "by": r.by, "at_ms": r.at_ms,
    })
}

/// `outbox abandon`: the flow is never delivered to the destination from
/// its first event that destination does not hold; prints the audit row.
pub fn abandon(json_mode: bool, args: crate::args::AbandonArgs) -> Result<(), Failure> {
    check_who_why(&args.by, &args.reason).map_err(Failure::Usage)?;
    let mut store = open_existing_producer(&args.producer)?;
    let request = AbandonRequest {
        destination: args.destination,
        flow: args.flow,
        by: args.by,
        reason: args.reason,
    };
    let row = store
        .handle()
        .abandon_flow(&request)?
        .map_err(|refused| Failure::Usage(refused.to_string()))?;
    emit(json_mode, &repair(&row), || {
        format!(
            "flow {} abandoned for destination {} from seq {}",
            request.flow,
            request.destination,
            row.seq.unwrap_or_default()
        )
    });
    Ok(())
}

/// `outbox repairs`: the producer's audit log.
pub fn repairs(json_mode: bool, producer: &Location) -> Result<(), Failure> {
    let mut store = open_existing_producer(producer)?;
    let repairs = store.handle().producer_repairs()?;
    let rows: Vec<Value> = repairs.iter().map(repair).collect();
    emit(json_mode, &json!({"repairs": rows}), || {
        let mut lines: Vec<String> = (repairs.iter())
            .map(|r| {
                let at = r.destination.as_deref().unwrap_or("-");
                format!("#{} {} {at} by {}: {}", r.id, r.action, r.by, r.reason)
            })
            .collect();
        lines.push(format!("{} repairs", repairs.len()));
        lines.join("\n")
    });
    Ok(())
}
