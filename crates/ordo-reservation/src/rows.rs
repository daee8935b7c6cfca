//! The reservation tables' rows as every backend decodes them: the stored
//! text and integers made into the domain's types, anything else reported
//! as a damaged store.

use ordo_core::{EventId, FlowId, ProducerName, Seq, StoreError};

use crate::rules::{parse_state, FlowRecord, FlowState, Projection, Quantity};
use crate::sqlite::EffectRecord;

/// A damaged row: what `context` read, and what is wrong with it.
pub(crate) fn corrupt(context: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::new(
        ordo_core::ErrorKind::Corrupt,
        format!("{context}: {detail}"),
    )
}

/// The columns a flow row and a projection row share.
fn flow_columns(
    context: &str,
    flow_id: &str,
    state: &str,
    quantity: i64,
) -> Result<(FlowId, FlowState, Option<Quantity>), StoreError> {
    Ok((
        FlowId::new(flow_id).map_err(|e| corrupt(context, e))?,
        parse_state(state).map_err(|e| corrupt(context, e))?,
        Some(Quantity::new(quantity).map_err(|e| corrupt(context, e))?),
    ))
}

/// A `projection` row of the flow `(producer, flow_id)`.
pub(crate) fn projection(
    (producer, flow_id): (&str, &str),
    state: &str,
    quantity: i64,
    applied_seq: i64,
) -> Result<Projection, StoreError> {
    let context = "consumer: stored projection";
    let (flow_id, state, quantity) = flow_columns(context, flow_id, state, quantity)?;
    Ok(Projection {
        producer: ProducerName::new(producer).map_err(|e| corrupt(context, e))?,
        flow_id,
        state,
        quantity,
        applied_seq,
    })
}

/// A `flow` row, with its flow's last seq.
pub(crate) fn flow_record(
    flow_id: &str,
    state: &str,
    quantity: i64,
    last_seq: i64,
) -> Result<FlowRecord, StoreError> {
    let (flow_id, state, quantity) =
        flow_columns("producer: stored flow", flow_id, state, quantity)?;
    Ok(FlowRecord {
        flow_id,
        state,
        quantity,
        last_seq,
    })
}

/// An `effect` row of the flow `(producer, flow_id)`.
pub(crate) fn effect_record(
    (producer, flow_id): (String, String),
    seq: i64,
    event_id: String,
) -> Result<EffectRecord, StoreError> {
    let context = "consumer: stored effect";
    Ok(EffectRecord {
        producer: ProducerName::new(producer).map_err(|e| corrupt(context, e))?,
        flow_id: FlowId::new(flow_id).map_err(|e| corrupt(context, e))?,
        seq: Seq::new(seq).map_err(|e| corrupt(context, e))?,
        event_id: EventId::new(event_id).map_err(|e| corrupt(context, e))?,
    })
}
