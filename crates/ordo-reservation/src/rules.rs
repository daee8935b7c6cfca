//! The reservation flow's rules: `new -> reserved -> confirmed ->
//! released`, one event per step, with one fixed quantity. Pure decisions
//! only; the handler and `advance` run them inside the stores'
//! transactions.

use std::fmt;

use serde_json::{Map, Value};

use ordo_core::envelope::{Envelope, EventType};
use ordo_core::{
    BlockCode, BlockReason, EventId, FlowId, InboxFlow, ProducerName, RuleViolation, SchemaVersion,
    Seq,
};

/// The largest quantity a flow may carry.
pub const QUANTITY_MAX: i64 = 1_000_000;

/// The consumer does not decode this schema version (yet).
pub const UNSUPPORTED_SCHEMA: BlockReason =
    BlockReason::code(BlockCode::from_static("unsupported_schema"));
/// The payload is not exactly `{"amount": q}` (schema 1) or `{"units": q}`
/// (schema 2) with a quantity in `1..=1_000_000`.
pub const INVALID_PAYLOAD: BlockReason =
    BlockReason::code(BlockCode::from_static("invalid_payload"));
/// The event is not the legal next step of the projection, or changes the
/// flow's quantity.
pub const INVALID_TRANSITION: BlockReason =
    BlockReason::code(BlockCode::from_static("invalid_transition"));

/// The fixed quantity a reservation flow carries: `1..=1_000_000`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity(i64);

impl Quantity {
    /// Builds a quantity, refusing anything outside `1..=1_000_000`.
    pub fn new(value: i64) -> Result<Self, RuleViolation> {
        if (1..=QUANTITY_MAX).contains(&value) {
            Ok(Quantity(value))
        } else {
            Err(RuleViolation {
                rule: format!("must be an integer in 1..={QUANTITY_MAX} (got {value})"),
            })
        }
    }

    /// The quantity as an integer.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The state of a reservation flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlowState {
    /// Never advanced.
    New,
    /// Quantity reserved.
    Reserved,
    /// Reservation confirmed.
    Confirmed,
    /// Reservation released; the flow is finished.
    Released,
}

impl FlowState {
    /// The state's name as it appears on the wire and in storage.
    pub fn as_str(self) -> &'static str {
        match self {
            FlowState::New => "new",
            FlowState::Reserved => "reserved",
            FlowState::Confirmed => "confirmed",
            FlowState::Released => "released",
        }
    }

    /// Reads a state name.
    pub fn parse(name: &str) -> Option<FlowState> {
        match name {
            "new" => Some(FlowState::New),
            "reserved" => Some(FlowState::Reserved),
            "confirmed" => Some(FlowState::Confirmed),
            "released" => Some(FlowState::Released),
            _ => None,
        }
    }

    /// The only legal next state, or `None` for `released`: no step is
    /// skipped, no flow reopens or loops.
    pub fn next(self) -> Option<FlowState> {
        match self {
            FlowState::New => Some(FlowState::Reserved),
            FlowState::Reserved => Some(FlowState::Confirmed),
            FlowState::Confirmed => Some(FlowState::Released),
            FlowState::Released => None,
        }
    }
}

impl fmt::Display for FlowState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A producer's record of one flow. A flow without a record is `new` with
/// `last_seq = 0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowRecord {
    /// The flow.
    pub flow_id: FlowId,
    /// Its current state.
    pub state: FlowState,
    /// Its quantity (`None` only while `new`).
    pub quantity: Option<Quantity>,
    /// The seq of its last committed event (0 if none).
    pub last_seq: i64,
}

impl FlowRecord {
    /// The record of a flow that was never advanced.
    pub fn new_flow(flow_id: FlowId) -> FlowRecord {
        FlowRecord {
            flow_id,
            state: FlowState::New,
            quantity: None,
            last_seq: 0,
        }
    }
}

/// A consumer's projection of one flow, built only by applied events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Projection {
    /// The producer whose flow it is.
    pub producer: ProducerName,
    /// The flow.
    pub flow_id: FlowId,
    /// The state reached by the applied events.
    pub state: FlowState,
    /// The quantity set by the applied `reserved` event.
    pub quantity: Option<Quantity>,
    /// The seq of the last applied event (0 if none).
    pub applied_seq: i64,
}

impl Projection {
    /// The projection of a flow nothing was applied to.
    pub fn empty(flow_id: FlowId) -> Projection {
        Projection::empty_of(&InboxFlow::of_default(flow_id))
    }

    /// The projection of the inbox flow `flow` nothing was applied to.
    pub fn empty_of(flow: &InboxFlow) -> Projection {
        Projection {
            producer: flow.producer.clone(),
            flow_id: flow.flow_id.clone(),
            state: FlowState::New,
            quantity: None,
            applied_seq: 0,
        }
    }

    /// The inbox flow it is the projection of.
    pub fn inbox_flow(&self) -> InboxFlow {
        InboxFlow::new(self.producer.clone(), self.flow_id.clone())
    }
}

/// A validated request to advance a flow by one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdvanceRequest {
    /// The flow to advance.
    pub flow_id: FlowId,
    /// The `last_seq` the caller believes the flow has (`0..=i64::MAX`).
    pub expected_seq: i64,
    /// The target state (never `new`).
    pub to: FlowState,
    /// The quantity: required for `reserved`; for later steps it defaults to
    /// the flow's and must equal it when given.
    pub quantity: Option<Quantity>,
    /// The payload schema the producer emits: 1 or 2.
    pub schema_version: SchemaVersion,
}

/// Why an advance request is invalid before any storage is touched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    /// `expected_seq` is negative.
    #[error("--expected-seq must be an integer in 0..=9223372036854775807 (got {0})")]
    ExpectedSeq(i64),
    /// The target is `new`.
    #[error("--to must be one of reserved, confirmed, released (got new)")]
    TargetNew,
    /// `reserved` without a quantity.
    #[error("--quantity is required for --to reserved")]
    QuantityRequired,
    /// A schema the producer cannot emit.
    #[error("--schema must be 1 or 2 (got {0})")]
    Schema(i64),
}

impl AdvanceRequest {
    /// Checks the request's own rules (not the flow's).
    pub fn new(
        flow_id: FlowId,
        expected_seq: i64,
        to: FlowState,
        quantity: Option<Quantity>,
        schema_version: SchemaVersion,
    ) -> Result<AdvanceRequest, InvalidRequest> {
        if expected_seq < 0 {
            return Err(InvalidRequest::ExpectedSeq(expected_seq));
        }
        if to == FlowState::New {
            return Err(InvalidRequest::TargetNew);
        }
        if to == FlowState::Reserved && quantity.is_none() {
            return Err(InvalidRequest::QuantityRequired);
        }
        if schema_version != SchemaVersion::V1 && schema_version != SchemaVersion::V2 {
            return Err(InvalidRequest::Schema(schema_version.get()));
        }
        Ok(AdvanceRequest {
            flow_id,
            expected_seq,
            to,
            quantity,
            schema_version,
        })
    }
}

/// Why a well-formed advance request is refused by the flow's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdvanceRefused {
    /// The request names a quantity different from the flow's.
    #[error("--quantity {requested} differs from flow {flow_id}'s quantity {fixed} (a flow's quantity never changes)")]
    QuantityMismatch {
        /// The flow.
        flow_id: FlowId,
        /// The flow's fixed quantity.
        fixed: Quantity,
        /// The quantity requested.
        requested: Quantity,
    },
    /// The flow's seq would pass `i64::MAX`.
    #[error("flow {flow_id}: no seq is left after {}", i64::MAX)]
    SeqExhausted {
        /// The flow.
        flow_id: FlowId,
    },
    /// A `reserved` step without a quantity (a request built without
    /// [`AdvanceRequest::new`], which refuses it).
    #[error("flow {flow_id}: --quantity is required for --to reserved")]
    QuantityRequired {
        /// The flow.
        flow_id: FlowId,
    },
}

/// The decision for an advance request, given the flow's current record.
// A decision lives for one request and is matched at once: boxing the
// event would cost an allocation per advance for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum AdvanceDecision {
    /// Write `flow` and insert `event`, in one transaction.
    Commit {
        /// The flow's new record.
        flow: FlowRecord,
        /// The event to append to the outbox.
        event: Envelope,
    },
    /// `expected_seq` differs from the flow's `last_seq`.
    Stale {
        /// The flow's actual `last_seq`.
        last_seq: i64,
    },
    /// The target is not the legal next step.
    InvalidTransition {
        /// The flow's current state.
        from: FlowState,
        /// The requested state.
        to: FlowState,
    },
}

/// The payload of a reservation event in the given schema (1 or 2).
pub fn payload_for(schema_version: SchemaVersion, quantity: Quantity) -> Map<String, Value> {
    let key = if schema_version == SchemaVersion::V2 {
        "units"
    } else {
        "amount"
    };
    let mut payload = Map::new();
    payload.insert(key.into(), quantity.get().into());
    payload
}

/// Decides an advance. Order of checks: `stale`, then `invalid_transition`,
/// then a quantity different from the flow's, then seq exhaustion.
pub fn decide_advance(
    current: &FlowRecord,
    request: &AdvanceRequest,
) -> Result<AdvanceDecision, AdvanceRefused> {
    debug_assert_eq!(current.flow_id, request.flow_id);
    if request.expected_seq != current.last_seq {
        return Ok(AdvanceDecision::Stale {
            last_seq: current.last_seq,
        });
    }
    if current.state.next() != Some(request.to) {
        return Ok(AdvanceDecision::InvalidTransition {
            from: current.state,
            to: request.to,
        });
    }
    let quantity = match (current.quantity, request.quantity) {
        (None, Some(requested)) => requested,
        (Some(fixed), None) => fixed,
        (Some(fixed), Some(requested)) if fixed == requested => fixed,
        (Some(fixed), Some(requested)) => {
            return Err(AdvanceRefused::QuantityMismatch {
                flow_id: current.flow_id.clone(),
                fixed,
                requested,
            })
        }
        // `AdvanceRequest::new` refuses this, but the fields are public: a
        // request built by hand gets a refusal, not a panic.
        (None, None) => {
            return Err(AdvanceRefused::QuantityRequired {
                flow_id: current.flow_id.clone(),
            })
        }
    };
    let seq = Seq::after(current.last_seq).ok_or_else(|| AdvanceRefused::SeqExhausted {
        flow_id: current.flow_id.clone(),
    })?;
    let event = Envelope {
        event_id: EventId::for_seq(&current.flow_id, seq),
        flow_id: current.flow_id.clone(),
        seq,
        schema_version: request.schema_version,
        event_type: EventType::new(request.to.as_str()).expect("state names are event types"),
        payload: payload_for(request.schema_version, quantity),
        producer: ordo_core::ProducerName::default(),
        headers: Default::default(),
    };
    Ok(AdvanceDecision::Commit {
        flow: FlowRecord {
            flow_id: current.flow_id.clone(),
            state: request.to,
            quantity: Some(quantity),
            last_seq: seq.get(),
        },
        event,
    })
}

/// Consumer options that change how stored events are decoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyOptions {
    /// Decode schema 2 (`{"units": q}`) as well as schema 1.
    pub support_v2: bool,
}

/// Reads the quantity of a stored event's payload. Order: the schema must be
/// supported, then the payload must be exactly `{"amount": q}` (schema 1) or
/// `{"units": q}` (schema 2) with `q` an integer in `1..=1_000_000`.
pub fn decode_quantity(event: &Envelope, options: ApplyOptions) -> Result<Quantity, BlockReason> {
    let key = match event.schema_version.get() {
        1 => "amount",
        2 if options.support_v2 => "units",
        _ => return Err(UNSUPPORTED_SCHEMA),
    };
    if event.payload.len() != 1 {
        return Err(INVALID_PAYLOAD);
    }
    event
        .payload
        .get(key)
        .and_then(integral)
        .and_then(|q| Quantity::new(q).ok())
        .ok_or(INVALID_PAYLOAD)
}

/// A JSON number's integer value, also when written with a fraction of zero
/// (`5.0`), since the canonical body treats `5` and `5.0` as one number.
fn integral(value: &Value) -> Option<i64> {
    let number = value.as_number()?;
    if let Some(i) = number.as_i64() {
        return Some(i);
    }
    let f = number.as_f64()?;
    (f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0).then_some(f as i64)
}

/// Decides whether a stored event applies to a projection. Returns the new
/// projection, or the reason the event is blocked (the first that applies in
/// the order `unsupported_schema`, `invalid_payload`, `invalid_transition`).
pub fn decide_apply(
    projection: &Projection,
    event: &Envelope,
    options: ApplyOptions,
) -> Result<Projection, BlockReason> {
    debug_assert!(event.is_of(&projection.inbox_flow()));
    debug_assert!(
        projection.applied_seq < event.seq.get(),
        "apply moves forward"
    );
    let quantity = decode_quantity(event, options)?;
    let target = FlowState::parse(event.event_type.as_str()).ok_or(INVALID_TRANSITION)?;
    if projection.state.next() != Some(target) {
        return Err(INVALID_TRANSITION);
    }
    if let Some(fixed) = projection.quantity {
        if fixed != quantity {
            return Err(INVALID_TRANSITION);
        }
    }
    Ok(Projection {
        producer: projection.producer.clone(),
        flow_id: projection.flow_id.clone(),
        state: target,
        quantity: Some(quantity),
        applied_seq: event.seq.get(),
    })
}

/// Parses a state name for storage decoding.
pub fn parse_state(name: &str) -> Result<FlowState, RuleViolation> {
    FlowState::parse(name).ok_or_else(|| RuleViolation {
        rule: format!("unknown flow state {name:?}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(state: FlowState, quantity: Option<i64>, last_seq: i64) -> FlowRecord {
        FlowRecord {
            flow_id: FlowId::new("f").unwrap(),
            state,
            quantity: quantity.map(|q| Quantity::new(q).unwrap()),
            last_seq,
        }
    }

    fn request(expected: i64, to: FlowState, quantity: Option<i64>) -> AdvanceRequest {
        AdvanceRequest::new(
            FlowId::new("f").unwrap(),
            expected,
            to,
            quantity.map(|q| Quantity::new(q).unwrap()),
            SchemaVersion::V1,
        )
        .unwrap()
    }

    #[test]
    fn advance_decisions() {
        use FlowState::*;
        // each flow with the requests tried on it: (expected_seq, to,
        // quantity, expected outcome name)
        let cases = [
            (
                flow(New, None, 0),
                vec![
                    (0, Reserved, Some(5), "commit"),
                    (1, Reserved, Some(5), "stale"),
                    (0, Confirmed, Some(5), "invalid_transition"),
                    (0, Released, Some(5), "invalid_transition"),
                ],
            ),
            (
                flow(Reserved, Some(5), 1),
                vec![
                    (1, Confirmed, None, "commit"),
                    (1, Confirmed, Some(5), "commit"),
                    (1, Confirmed, Some(6), "quantity"),
                    (1, Reserved, Some(5), "invalid_transition"),
                    (1, Released, None, "invalid_transition"),
                    (0, Confirmed, None, "stale"),
                    // an illegal step wins over a wrong quantity
                    (1, Reserved, Some(9), "invalid_transition"),
                ],
            ),
            (
                flow(Confirmed, Some(5), 2),
                vec![(2, Released, None, "commit")],
            ),
            (
                flow(Released, Some(5), 3),
                vec![
                    (3, Reserved, Some(5), "invalid_transition"),
                    (3, Released, None, "invalid_transition"),
                    // stale wins over an illegal step and a wrong quantity
                    (2, Reserved, Some(9), "stale"),
                ],
            ),
            (
                flow(Reserved, Some(5), i64::MAX),
                vec![(i64::MAX, Confirmed, None, "exhausted")],
            ),
        ];
        for (current, requests) in cases {
            for (expected_seq, to, quantity, expected) in requests {
                let req = request(expected_seq, to, quantity);
                let got = match decide_advance(&current, &req) {
                    Ok(AdvanceDecision::Commit { .. }) => "commit",
                    Ok(AdvanceDecision::Stale { .. }) => "stale",
                    Ok(AdvanceDecision::InvalidTransition { .. }) => "invalid_transition",
                    Err(AdvanceRefused::QuantityMismatch { .. }) => "quantity",
                    Err(AdvanceRefused::SeqExhausted { .. }) => "exhausted",
                    Err(AdvanceRefused::QuantityRequired { .. }) => "quantity_required",
                };
                assert_eq!(got, expected, "{current:?} {req:?}");
            }
        }
    }

    #[test]
    fn committed_event_carries_next_seq_and_payload() {
        let decision = decide_advance(
            &flow(FlowState::New, None, 0),
            &request(0, FlowState::Reserved, Some(7)),
        )
        .unwrap();
        let AdvanceDecision::Commit { flow, event } = decision else {
            panic!("expected a commit")
        };
        assert_eq!(flow.last_seq, 1);
        assert_eq!(event.seq, Seq::FIRST);
        assert_eq!(event.event_id.as_str(), "f-1");
        assert_eq!(event.event_type.as_str(), "reserved");
        assert_eq!(
            Value::Object(event.payload),
            serde_json::json!({"amount": 7})
        );
    }

    #[test]
    fn a_hand_built_reserved_request_without_quantity_is_refused_not_a_panic() {
        let request = AdvanceRequest {
            flow_id: FlowId::new("f").unwrap(),
            expected_seq: 0,
            to: FlowState::Reserved,
            quantity: None,
            schema_version: SchemaVersion::V1,
        };
        assert_eq!(
            decide_advance(&flow(FlowState::New, None, 0), &request),
            Err(AdvanceRefused::QuantityRequired {
                flow_id: FlowId::new("f").unwrap()
            })
        );
    }

    #[test]
    fn long_flow_ids_get_hashed_event_ids() {
        let long = FlowId::new("f".repeat(100)).unwrap();
        let id = EventId::for_seq(&long, Seq::FIRST);
        assert!(id.as_str().starts_with('h') && id.as_str().len() == 65);
        assert_ne!(id, EventId::for_seq(&long, Seq::new(2).unwrap()));
    }

    #[test]
    fn request_rules() {
        let f = || FlowId::new("f").unwrap();
        let q = Some(Quantity::new(1).unwrap());
        assert_eq!(
            AdvanceRequest::new(f(), -1, FlowState::Reserved, q, SchemaVersion::V1),
            Err(InvalidRequest::ExpectedSeq(-1))
        );
        assert_eq!(
            AdvanceRequest::new(f(), 0, FlowState::Reserved, None, SchemaVersion::V1),
            Err(InvalidRequest::QuantityRequired)
        );
        assert_eq!(
            AdvanceRequest::new(f(), 0, FlowState::New, q, SchemaVersion::V1),
            Err(InvalidRequest::TargetNew)
        );
        assert_eq!(
            AdvanceRequest::new(
                f(),
                0,
                FlowState::Reserved,
                q,
                SchemaVersion::new(3).unwrap()
            ),
            Err(InvalidRequest::Schema(3))
        );
        assert!(
            AdvanceRequest::new(f(), i64::MAX, FlowState::Confirmed, None, SchemaVersion::V2)
                .is_ok()
        );
    }

    fn stored(seq: i64, schema: i64, event_type: &str, payload: Value) -> Envelope {
        Envelope {
            event_id: EventId::new(format!("e{seq}")).unwrap(),
            flow_id: FlowId::new("f").unwrap(),
            seq: Seq::new(seq).unwrap(),
            schema_version: SchemaVersion::new(schema).unwrap(),
            event_type: EventType::new(event_type).unwrap(),
            payload: payload.as_object().unwrap().clone(),
            producer: ordo_core::ProducerName::default(),
            headers: Default::default(),
        }
    }

    #[test]
    fn apply_decisions() {
        use serde_json::json;
        use FlowState::*;
        let empty = Projection::empty(FlowId::new("f").unwrap());
        let reserved = Projection {
            state: Reserved,
            quantity: Some(Quantity::new(5).unwrap()),
            applied_seq: 1,
            ..empty.clone()
        };
        let v1 = ApplyOptions::default();
        let v2 = ApplyOptions { support_v2: true };
        type Outcome = Result<FlowState, BlockReason>;
        const PAYLOAD: Outcome = Err(INVALID_PAYLOAD);
        const SCHEMA: Outcome = Err(UNSUPPORTED_SCHEMA);
        const STEP: Outcome = Err(INVALID_TRANSITION);
        // each projection and options with the next events tried on them:
        // (schema, event type, payload, expected state or block)
        type Event = (i64, &'static str, Value, Outcome);
        let cases: [(&Projection, ApplyOptions, Vec<Event>); 3] = [
            (
                &empty,
                v1,
                vec![
                    (1, "reserved", json!({"amount": 5}), Ok(Reserved)),
                    (1, "reserved", json!({"amount": 1}), Ok(Reserved)),
                    (1, "reserved", json!({"amount": 1_000_000}), Ok(Reserved)),
                    (1, "reserved", json!({"amount": 0}), PAYLOAD),
                    (1, "reserved", json!({"amount": 1_000_001}), PAYLOAD),
                    (1, "reserved", json!({"amount": 5.5}), PAYLOAD),
                    (1, "reserved", json!({"amount": "5"}), PAYLOAD),
                    (1, "reserved", json!({"units": 5}), PAYLOAD),
                    (1, "reserved", json!({}), PAYLOAD),
                    (1, "reserved", json!({"amount": 5, "x": 1}), PAYLOAD),
                    (2, "reserved", json!({"units": 5}), SCHEMA),
                    // unsupported schema wins over a bad payload and a bad step
                    (9, "released", json!({}), SCHEMA),
                    // a bad payload wins over a bad step
                    (1, "released", json!({}), PAYLOAD),
                    (1, "confirmed", json!({"amount": 5}), STEP),
                    (1, "shipped", json!({"amount": 5}), STEP),
                ],
            ),
            (
                &empty,
                v2,
                vec![
                    (2, "reserved", json!({"units": 5}), Ok(Reserved)),
                    (2, "reserved", json!({"amount": 5}), PAYLOAD),
                    (9, "reserved", json!({"amount": 5}), SCHEMA),
                ],
            ),
            (
                &reserved,
                v1,
                vec![
                    (1, "confirmed", json!({"amount": 5}), Ok(Confirmed)),
                    (1, "confirmed", json!({"amount": 6}), STEP),
                    (1, "released", json!({"amount": 5}), STEP),
                    (1, "reserved", json!({"amount": 5}), STEP),
                ],
            ),
        ];
        for (projection, options, events) in cases {
            for (schema, event_type, payload, expected) in events {
                let seq = projection.applied_seq + 1;
                let event = stored(seq, schema, event_type, payload);
                let got = decide_apply(projection, &event, options).map(|p| p.state);
                assert_eq!(got, expected, "{event:?} with {options:?}");
            }
        }
    }
}

#[cfg(test)]
mod quantity_tests {
    use super::*;

    #[test]
    fn quantity_bounds() {
        for (value, ok) in [
            (0, false),
            (1, true),
            (1_000_000, true),
            (1_000_001, false),
            (-5, false),
        ] {
            assert_eq!(Quantity::new(value).is_ok(), ok, "quantity {value}");
        }
    }
}
