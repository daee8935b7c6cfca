//! What `ordo soak --topology PxC` adds to the soak's report: the
//! topology, its workers and each (producer, destination) pair's counts,
//! in the JSON document and in the text.

use ordo_lab::soak::{PairCount, SoakReport, TopologyReport};
use serde_json::{json, Value};

use crate::render_lab::seconds;

/// Adds the topology's keys to the soak's JSON document `value`.
pub fn extend(value: &mut Value, report: &SoakReport, topology: &TopologyReport) {
    if let Some(value) = value.as_object_mut() {
        value.extend([
            ("topology".into(), json!(topology.topology.to_string())),
            ("relays".into(), json!(report.relays)),
            ("appliers".into(), json!(report.appliers)),
            ("converge_seconds".into(), json!(seconds(report.converge))),
            ("pairs".into(), pairs(&topology.pairs)),
        ]);
    }
}

/// A topology's (producer, destination) pairs, each with its counts.
fn pairs(pairs: &[PairCount]) -> Value {
    let pairs = pairs.iter().map(|p| {
        json!({
            "producer": p.producer,
            "destination": p.destination,
            "committed": p.committed,
            "held": p.held,
            "applied": p.applied,
            "effects": p.effects,
        })
    });
    Value::Array(pairs.collect())
}

/// Adds the topology's lines to the soak's text: what ran after the seed,
/// each pair before the verdict.
pub fn lines(lines: &mut Vec<String>, report: &SoakReport, topology: &TopologyReport) {
    lines.insert(
        1,
        format!(
            "topology {}: {} relays (one per producer and destination), {} applier(s) per consumer",
            topology.topology, report.relays, report.appliers
        ),
    );
    lines.extend(topology.pairs.iter().map(|p| {
        format!(
            "pair     {} to {}: {} committed, {} held, {} applied, {} effects",
            p.producer, p.destination, p.committed, p.held, p.applied, p.effects
        )
    }));
}
