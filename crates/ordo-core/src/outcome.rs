//! Protocol outcomes: values, never errors.

use std::fmt;

use crate::envelope::Envelope;
use crate::ids::{BlockCode, EventId, InboxFlow, Seq};

/// The consumer's answer to one received envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Receipt {
    /// New `event_id` and new `(flow_id, seq)`: stored durably as `pending`.
    Accepted,
    /// The same `event_id` with the same body is already stored. Nothing changed.
    Duplicate,
    /// The same `event_id` with a different body, or the same `(flow_id, seq)`
    /// under a different `event_id`. Nothing changed. Cause `conflict`.
    Conflict,
    /// A later envelope of a flow whose earlier envelope in the same
    /// delivery was a conflict: not stored, whatever the inbox holds, so that
    /// a consumer never applies the held event followed by events built on
    /// the refused one. On the wire a `conflict` of cause `after_conflict`;
    /// the relay leaves it unmarked (PROTOCOL.md section 12).
    AfterConflict,
    /// A conflict whose held row (or its fingerprint) was stored from the
    /// same producer store identity as the delivery's: the producer was
    /// restored from an older backup and forgot what it committed. Nothing
    /// changed. On the wire a `conflict` of cause `producer_rewound`; the
    /// relay quarantines the event with that reason (PROTOCOL.md section
    /// 12).
    ProducerRewound,
}

/// Every receipt, in the order of [`Receipt::as_str`]'s names.
const RECEIPTS: [Receipt; 5] = [
    Receipt::Accepted,
    Receipt::Duplicate,
    Receipt::Conflict,
    Receipt::AfterConflict,
    Receipt::ProducerRewound,
];

/// The reason recorded on an event quarantined by a `conflict` receipt.
pub const CONFLICT_REASON: &str =
    "conflict: the consumer holds a different body under this event id, or another event id at this (flow_id, seq)";

/// The reason recorded on an event quarantined by a `conflict` receipt of
/// cause `producer_rewound`.
pub const PRODUCER_REWOUND_REASON: &str =
    "producer_rewound: the consumer holds another body at this event's identity, stored from this same producer store: the store was restored from an older backup and commits again what it had forgotten";

impl Receipt {
    /// The receipt's wire name: `accepted`, `duplicate` or `conflict`.
    pub fn as_str(self) -> &'static str {
        match self {
            Receipt::Accepted => "accepted",
            Receipt::Duplicate => "duplicate",
            Receipt::Conflict | Receipt::AfterConflict | Receipt::ProducerRewound => "conflict",
        }
    }

    /// A conflict's cause on the wire (`conflict`, `after_conflict` or
    /// `producer_rewound`);
    /// `None` for the receipts that are not conflicts.
    pub fn cause(self) -> Option<&'static str> {
        match self {
            Receipt::Accepted | Receipt::Duplicate => None,
            Receipt::Conflict => Some("conflict"),
            Receipt::AfterConflict => Some("after_conflict"),
            Receipt::ProducerRewound => Some("producer_rewound"),
        }
    }

    /// For a receipt that quarantines its event (`conflict` of cause
    /// `conflict` or `producer_rewound`), the recorded outcome (its cause)
    /// and the reason; `None` for every other receipt.
    pub fn quarantine(self) -> Option<(&'static str, &'static str)> {
        match self {
            Receipt::Conflict => Some(("conflict", CONFLICT_REASON)),
            Receipt::ProducerRewound => Some(("producer_rewound", PRODUCER_REWOUND_REASON)),
            Receipt::Accepted | Receipt::Duplicate | Receipt::AfterConflict => None,
        }
    }

    /// Whether the receipt is a `conflict`, of any cause.
    pub fn is_conflict(self) -> bool {
        self.as_str() == "conflict"
    }

    /// The receipt of a wire name and, for a conflict, its cause (a
    /// conflict without one, as an earlier release answers, is cause
    /// `conflict`); `None` for anything else.
    pub fn parse(name: &str, cause: Option<&str>) -> Option<Receipt> {
        let cause = match (name, cause) {
            ("conflict", None) => Some("conflict"),
            (_, cause) => cause,
        };
        RECEIPTS
            .into_iter()
            .find(|r| r.as_str() == name && r.cause() == cause)
    }

    /// Whether custody has moved to the consumer (`accepted` or `duplicate`):
    /// only then may the producer mark its outbox row accepted.
    pub fn moves_custody(self) -> bool {
        matches!(self, Receipt::Accepted | Receipt::Duplicate)
    }

    /// Whether the relay records this receipt: every one but
    /// [`Receipt::AfterConflict`], whose event it leaves unmarked.
    pub fn is_recorded(self) -> bool {
        self != Receipt::AfterConflict
    }
}

/// A receipt and, for a conflict, the event the consumer holds in the
/// envelope's place (`held_event_id`): the row at its `(flow_id, seq)` if
/// any, else the row under its event id; `None` when only a prune
/// watermark remains, and for every receipt that is not a conflict
/// (PROTOCOL.md section 12).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The receipt.
    pub receipt: Receipt,
    /// The held event a conflict names.
    pub held_event_id: Option<EventId>,
}

impl Answer {
    /// An answer naming no held event.
    pub fn of(receipt: Receipt) -> Answer {
        Answer {
            receipt,
            held_event_id: None,
        }
    }
}

impl fmt::Display for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a stored event cannot be applied, as decided by the application's
/// handler: a code, and optional detail for the operator. The stored body is
/// never changed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlockReason {
    /// What kind of block this is; a handler may be asked to evaluate again
    /// the rows blocked with some codes (see
    /// [`ApplyHandler::reevaluate`](crate::handler::ApplyHandler::reevaluate)).
    pub code: BlockCode,
    /// Free text for the operator, at most [`BLOCK_DETAIL_LEN_MAX`] bytes
    /// (longer text is cut at a character boundary when stored).
    pub detail: Option<String>,
}

/// The longest block detail that is stored, in bytes.
pub const BLOCK_DETAIL_LEN_MAX: usize = 1_000;

impl BlockReason {
    /// A reason with a code and no detail.
    pub const fn code(code: BlockCode) -> BlockReason {
        BlockReason { code, detail: None }
    }

    /// A reason with a code and detail text.
    pub fn with_detail(code: BlockCode, detail: impl Into<String>) -> BlockReason {
        BlockReason {
            code,
            detail: Some(detail.into()),
        }
        .normalized()
    }

    /// The reason as it is stored: detail cut to [`BLOCK_DETAIL_LEN_MAX`]
    /// bytes at a character boundary, and empty detail as none.
    pub fn normalized(mut self) -> BlockReason {
        if let Some(detail) = &mut self.detail {
            if detail.len() > BLOCK_DETAIL_LEN_MAX {
                let mut end = BLOCK_DETAIL_LEN_MAX;
                while !detail.is_char_boundary(end) {
                    end -= 1;
                }
                detail.truncate(end);
            }
        }
        if self.detail.as_deref() == Some("") {
            self.detail = None;
        }
        self
    }

    /// The code as text.
    pub fn as_str(&self) -> &str {
        self.code.as_str()
    }
}

impl fmt::Display for BlockReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.detail {
            Some(detail) => write!(f, "{}: {detail}", self.code),
            None => write!(f, "{}", self.code),
        }
    }
}

/// The outcome of one `apply_next` on a flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The event at `seq` was applied: the handler's writes and the inbox
    /// mark were committed together.
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
    pub fn as_str(&self) -> &'static str {
        match self {
            DrainStop::Limit => "limit",
            DrainStop::Gap => "gap",
            DrainStop::Blocked(_) => "blocked",
            DrainStop::Idle => "idle",
        }
    }

    /// The block reason, when the drain stopped on a blocked event.
    pub fn reason(&self) -> Option<&BlockReason> {
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
    pub flow: InboxFlow,
    /// How many events were applied.
    pub applied: u64,
    /// Why it stopped.
    pub stop: DrainStop,
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
    pub fn as_str(&self) -> &'static str {
        match self {
            InboxStatus::Pending => "pending",
            InboxStatus::Applied => "applied",
            InboxStatus::Blocked(_) => "blocked",
            InboxStatus::Skipped => "skipped",
        }
    }

    /// The reason of a blocked row.
    pub fn reason(&self) -> Option<&BlockReason> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every receipt reads back from its wire name and cause; a conflict
    /// without a cause (an earlier release's) is cause `conflict`; anything
    /// else is no receipt.
    #[test]
    fn receipts_read_back_from_their_name_and_cause() {
        for receipt in RECEIPTS {
            assert_eq!(
                Receipt::parse(receipt.as_str(), receipt.cause()),
                Some(receipt)
            );
        }
        assert_eq!(Receipt::parse("conflict", None), Some(Receipt::Conflict));
        for (name, cause) in [
            ("conflict", Some("producer_rewound_later")),
            ("accepted", Some("conflict")),
            ("duplicate", Some("after_conflict")),
            ("refused", None),
        ] {
            assert_eq!(Receipt::parse(name, cause), None, "{name} {cause:?}");
        }
        assert!(!Receipt::AfterConflict.moves_custody());
        assert!(!Receipt::AfterConflict.is_recorded());
        assert!(Receipt::Conflict.is_recorded());
    }
}
