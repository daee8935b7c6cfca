//! A producer store's destinations (PROTOCOL.md section 12): each keeps its
//! own custody of the outbox, and the operator's views add them up.

use crate::identity::StoreId;
use crate::ids::{DestinationName, FlowId};
use crate::ops::ProducerStatus;

/// Which flows a destination added later receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestinationStart {
    /// Every flow, from seq 1 (refused while an early event of one was
    /// pruned).
    Start,
    /// Only the flows whose seq 1 commits after it was added.
    Now,
}

impl DestinationStart {
    /// `start` or `now`.
    pub fn as_str(self) -> &'static str {
        match self {
            DestinationStart::Start => "start",
            DestinationStart::Now => "now",
        }
    }

    /// The start of its name, `None` for anything else.
    pub fn parse(name: &str) -> Option<DestinationStart> {
        match name {
            "start" => Some(DestinationStart::Start),
            "now" => Some(DestinationStart::Now),
            _ => None,
        }
    }
}

/// One destination as `destination list` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Destination {
    /// Its name.
    pub name: DestinationName,
    /// Which flows it receives.
    pub from: DestinationStart,
    /// The consumer store it delivered to first, once it has delivered.
    pub consumer_store_id: Option<StoreId>,
    /// When it was added.
    pub created_at_ms: i64,
    /// Its own signals: its backlog, quarantine and backoff.
    pub status: ProducerStatus,
}

/// One destination's custody of one outbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Custody {
    /// The destination.
    pub destination: DestinationName,
    /// The destination's consumer holds the event.
    pub accepted: bool,
    /// When it took it.
    pub accepted_at_ms: Option<i64>,
    /// Deliveries attempted there.
    pub attempts: u64,
    /// The last receipt there, or `error`.
    pub last_outcome: Option<String>,
    /// The last transient error there.
    pub last_error: Option<String>,
    /// The relay of that destination does not try it before this time.
    pub next_attempt_at_ms: i64,
    /// Quarantined there.
    pub quarantined: bool,
    /// The quarantine's code: `conflict`, `producer_rewound`, `too_large`
    /// or `rejected_by_consumer`.
    pub quarantine_reason: Option<String>,
    /// The quarantine's text.
    pub quarantine_detail: Option<String>,
    /// Its flow was abandoned for that destination: never delivered there.
    pub abandoned: bool,
}

/// One row of the producer's audit log (`outbox repairs`): an operator's
/// action on the store's destinations, with who decided it and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerRepair {
    /// Its place in the log.
    pub id: i64,
    /// What was done (`destination_remove`, `abandon`).
    pub action: String,
    /// The destination acted on.
    pub destination: Option<String>,
    /// The flow acted on, when the action names one.
    pub flow_id: Option<String>,
    /// The seq acted on, when the action names one.
    pub seq: Option<i64>,
    /// The event acted on, when the action names one.
    pub event_id: Option<String>,
    /// Why.
    pub reason: String,
    /// Who decided.
    pub by: String,
    /// When.
    pub at_ms: i64,
}

/// An operator's decision to abandon a flow for one destination
/// (`outbox abandon`, PROTOCOL.md section 12): its unaccepted events, and
/// every later one, are never delivered there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbandonRequest {
    /// The destination.
    pub destination: DestinationName,
    /// The flow.
    pub flow: FlowId,
    /// Who decided.
    pub by: String,
    /// Why.
    pub reason: String,
}

/// Why a destination command is refused. Nothing is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DestinationRefused {
    /// The name is taken.
    #[error("destination {0} already exists")]
    Exists(DestinationName),
    /// No destination of that name.
    #[error("no destination named {0}")]
    Unknown(DestinationName),
    /// The last destination cannot be removed.
    #[error("destination {0} is the store's last one and cannot be removed")]
    Last(DestinationName),
    /// `--from start` while an early event of this flow was pruned.
    #[error("flow {0} was pruned from its start: a destination added --from start would begin it in the middle (add it --from now)")]
    Pruned(FlowId),
    /// Several destinations and none named.
    #[error("the store has {0} destinations: name one with --destination")]
    Ambiguous(usize),
    /// The flow is not delivered to that destination.
    #[error("flow {flow} is not delivered to destination {destination}")]
    NotDelivered {
        /// The flow.
        flow: FlowId,
        /// The destination.
        destination: DestinationName,
    },
    /// No flow of that id in the outbox.
    #[error("no flow {0} in the outbox")]
    UnknownFlow(FlowId),
    /// The flow was abandoned for that destination already.
    #[error("flow {flow} is already abandoned for destination {destination}")]
    AlreadyAbandoned {
        /// The flow.
        flow: FlowId,
        /// The destination.
        destination: DestinationName,
    },
}

/// What a destination does with `delivered`, the identity of the consumer
/// store whose receipts it is about to record, having recorded `recorded`
/// at its first delivery (PROTOCOL.md section 12): `Ok(Some(id))` to record
/// (its first delivery from a known consumer), `Ok(None)` to go on as it
/// is (the same consumer, or one of unknown identity), and for another
/// consumer an error naming both, to be returned with nothing marked.
pub fn check_consumer(
    destination: &DestinationName,
    recorded: Option<&StoreId>,
    delivered: Option<&StoreId>,
) -> Result<Option<StoreId>, crate::StoreError> {
    match (recorded, delivered) {
        (None, Some(delivered)) => Ok(Some(delivered.clone())),
        (Some(recorded), Some(delivered)) if recorded != delivered => Err(crate::StoreError::new(
            crate::ErrorKind::Other,
            format!(
                "destination {destination} delivers to consumer store {recorded} (recorded at \
                     its first delivery), and this delivery's consumer store is {delivered}: \
                     nothing was marked; a rebuilt or another consumer gets a new destination \
                     (ordo destination add, then ordo destination remove of this one)"
            ),
        )),
        _ => Ok(None),
    }
}

/// Who decided an audited action on a destination and why, checked as a
/// skip's are: neither blank, neither too long.
pub fn check_who_why(by: &str, reason: &str) -> Result<(), String> {
    if reason.trim().is_empty() || reason.len() > crate::ops::REPAIR_REASON_LEN_MAX {
        return Err(format!(
            "--reason must be 1 to {} bytes, not blank",
            crate::ops::REPAIR_REASON_LEN_MAX
        ));
    }
    if by.trim().is_empty() || by.len() > crate::ops::REPAIR_BY_LEN_MAX {
        return Err(format!(
            "--by must be 1 to {} bytes, not blank",
            crate::ops::REPAIR_BY_LEN_MAX
        ));
    }
    Ok(())
}

/// The aggregate of the destinations' signals: backlogs and quarantines
/// summed, the oldest pending event the oldest of any.
pub fn sum_statuses<'a>(statuses: impl IntoIterator<Item = &'a ProducerStatus>) -> ProducerStatus {
    let mut sum = ProducerStatus::default();
    for status in statuses {
        sum.backlog += status.backlog;
        sum.quarantined += status.quarantined;
        sum.rewound += status.rewound;
        sum.backing_off += status.backing_off;
        sum.oldest_pending_created_at_ms = match (
            sum.oldest_pending_created_at_ms,
            status.oldest_pending_created_at_ms,
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    sum
}

/// The custody a row's top-level keys show: the first destination that
/// does not hold it (by name), else the first; `None` for a row of a flow
/// delivered nowhere.
pub fn shown_custody(custody: &[Custody]) -> Option<&Custody> {
    custody
        .iter()
        .find(|c| !c.accepted && !c.abandoned)
        .or_else(|| custody.first())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(backlog: u64, oldest: Option<i64>) -> ProducerStatus {
        ProducerStatus {
            backlog,
            oldest_pending_created_at_ms: oldest,
            quarantined: backlog / 2,
            rewound: 0,
            backing_off: 1,
        }
    }

    #[test]
    fn aggregates_sum_the_counts_and_keep_the_oldest() {
        let sum = sum_statuses(&[status(4, Some(7)), status(2, None), status(0, Some(3))]);
        assert_eq!(sum.backlog, 6);
        assert_eq!(sum.quarantined, 3);
        assert_eq!(sum.backing_off, 3);
        assert_eq!(sum.oldest_pending_created_at_ms, Some(3));
        assert_eq!(sum_statuses(&[]), ProducerStatus::default());
    }

    #[test]
    fn starts_parse_their_names() {
        for start in [DestinationStart::Start, DestinationStart::Now] {
            assert_eq!(DestinationStart::parse(start.as_str()), Some(start));
        }
        assert_eq!(DestinationStart::parse("later"), None);
    }
}
