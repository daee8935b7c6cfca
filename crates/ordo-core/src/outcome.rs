//! Protocol outcomes: values, never errors.

use std::fmt;

use crate::envelope::Envelope;
use crate::ids::{EventId, FlowId, Seq};
use crate::reservation::FlowState;

/// The consumer's answer to one received envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Receipt {
    /// New `event_id` and new `(flow_id, seq)`: stored durably as `pending`.
    Accepted,
    /// The same `event_id` with the same body is already stored. Nothing changed.
    Duplicate,
    /// The same `event_id` with a different body, or the same `(flow_id, seq)`
    /// under a different `event_id`. Nothing changed.
    Conflict,
}

impl Receipt {
    /// The receipt's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Receipt::Accepted => "accepted",
            Receipt::Duplicate => "duplicate",
            Receipt::Conflict => "conflict",
        }
    }

    /// Whether custody has moved to the consumer (`accepted` or `duplicate`):
    /// only then may the producer mark its outbox row accepted.
    pub fn moves_custody(self) -> bool {
        matches!(self, Receipt::Accepted | Receipt::Duplicate)
    }
}

impl fmt::Display for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a stored event cannot be applied. The stored body is never changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockReason {
    /// The consumer does not decode this schema version (yet).
    UnsupportedSchema,
    /// The payload has no valid quantity.
    InvalidPayload,
    /// The event is not the legal next step of the projection, or changes the
    /// flow's quantity.
    InvalidTransition,
}

impl BlockReason {
    /// The reason's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockReason::UnsupportedSchema => "unsupported_schema",
            BlockReason::InvalidPayload => "invalid_payload",
            BlockReason::InvalidTransition => "invalid_transition",
        }
    }

    /// Reads a reason's wire name.
    pub fn parse(name: &str) -> Option<BlockReason> {
        match name {
            "unsupported_schema" => Some(BlockReason::UnsupportedSchema),
            "invalid_payload" => Some(BlockReason::InvalidPayload),
            "invalid_transition" => Some(BlockReason::InvalidTransition),
            _ => None,
        }
    }
}

impl fmt::Display for BlockReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of one `apply_next` on a flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The event at `seq` was applied: projection, effect and inbox mark were
    /// committed together.
    Applied {
        /// The applied seq.
        seq: Seq,
    },
    /// The next seq is missing while a later one is stored. Nothing is skipped.
    Gap {
        /// The missing seq.
        missing: Seq,
    },
    /// The next event is blocked (now or earlier) with this reason.
    Blocked {
        /// The blocked seq.
        seq: Seq,
        /// Why.
        reason: BlockReason,
    },
    /// Nothing for this flow is stored after the applied seq.
    Idle,
}

/// Why a drain stopped. Only `Idle` means caught up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainStop {
    /// The limit of applications was reached.
    Limit,
    /// The next seq is missing.
    Gap,
    /// The next event is blocked.
    Blocked(BlockReason),
    /// Nothing more is stored for the flow.
    Idle,
}

impl DrainStop {
    /// The stop's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            DrainStop::Limit => "limit",
            DrainStop::Gap => "gap",
            DrainStop::Blocked(_) => "blocked",
            DrainStop::Idle => "idle",
        }
    }

    /// The block reason, when the drain stopped on a blocked event.
    pub fn reason(self) -> Option<BlockReason> {
        match self {
            DrainStop::Blocked(reason) => Some(reason),
            _ => None,
        }
    }
}

/// The result of draining one flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drain {
    /// The flow.
    pub flow_id: FlowId,
    /// How many events were applied.
    pub applied: u64,
    /// Why it stopped.
    pub stop: DrainStop,
}

/// The outcome of an advance.
#[derive(Debug, Clone, PartialEq)]
pub enum Advance {
    /// The state change and the event were committed together.
    Committed(Envelope),
    /// `expected_seq` differed from the flow's `last_seq`; nothing was written.
    Stale {
        /// The flow's actual `last_seq`.
        last_seq: i64,
    },
    /// The target is not the legal next step; nothing was written.
    InvalidTransition {
        /// The flow's state.
        from: FlowState,
        /// The requested state.
        to: FlowState,
    },
}

/// One outbox row as the producer stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRecord {
    /// The committed event; its body never changes.
    pub envelope: Envelope,
    /// Whether custody has moved to the consumer.
    pub accepted: bool,
}

/// The status of an inbox row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboxStatus {
    /// Stored, waiting for apply.
    Pending,
    /// Applied exactly once.
    Applied,
    /// Held with a reason; apply does not pass it.
    Blocked(BlockReason),
    /// Passed over by an explicit, audited repair; no effect.
    Skipped,
}

impl InboxStatus {
    /// The status's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            InboxStatus::Pending => "pending",
            InboxStatus::Applied => "applied",
            InboxStatus::Blocked(_) => "blocked",
            InboxStatus::Skipped => "skipped",
        }
    }

    /// The reason of a blocked row.
    pub fn reason(self) -> Option<BlockReason> {
        match self {
            InboxStatus::Blocked(reason) => Some(reason),
            _ => None,
        }
    }
}

/// One inbox row as the consumer stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxRecord {
    /// The envelope as stored (see [`Envelope::stored_text`]).
    pub envelope: Envelope,
    /// Its status.
    pub status: InboxStatus,
}

/// One effect record: written once per applied event, in the same
/// transaction as the projection change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectRecord {
    /// The flow.
    pub flow_id: FlowId,
    /// The applied seq.
    pub seq: Seq,
    /// The applied event.
    pub event_id: EventId,
}
