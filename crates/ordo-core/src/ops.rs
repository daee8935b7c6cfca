//! Operator views and decisions: delivery bookkeeping, quarantine, blocked
//! rows, audited repairs, status signals and retention.

use std::collections::BTreeMap;

use crate::destination::Custody;
use crate::envelope::Envelope;
use crate::error::{ErrorKind, StoreError};
use crate::identity::StoreId;
use crate::ids::{EventId, FlowId, InboxFlow, ProducerName, Seq};
use crate::outcome::InboxStatus;

/// The most gap-waiting flows a status lists (all are counted).
pub const GAPS_LISTED_MAX: usize = 1_000;
/// The longest repair reason, in bytes.
pub const REPAIR_REASON_LEN_MAX: usize = 1000;
/// The longest name of whoever decided a repair, in bytes.
pub const REPAIR_BY_LEN_MAX: usize = 100;

/// One outbox row with its delivery bookkeeping.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEntry {
    /// The committed event.
    pub envelope: Envelope,
    /// Custody has moved to the consumer.
    pub accepted: bool,
    /// A conflict receipt quarantined it; it is never retried automatically.
    pub quarantined: bool,
    /// Why it is quarantined: `conflict`, `producer_rewound`, `too_large`
    /// or `rejected_by_consumer`.
    pub quarantine_reason: Option<String>,
    /// The quarantine's text.
    pub quarantine_detail: Option<String>,
    /// Deliveries attempted.
    pub attempts: u64,
    /// The last receipt (`accepted`, `duplicate`, `conflict`) or `error`.
    pub last_outcome: Option<String>,
    /// The last transient error.
    pub last_error: Option<String>,
    /// The relay does not try it before this time.
    pub next_attempt_at_ms: i64,
    /// When it was committed.
    pub created_at_ms: i64,
    /// When custody moved.
    pub accepted_at_ms: Option<i64>,
    /// Each destination's custody of it, by name: the destinations its flow
    /// is delivered to. The keys above add them up: `accepted` when every
    /// one holds it, the rest those of the first one that does not.
    pub destinations: Vec<Custody>,
}

impl OutboxEntry {
    /// The row of `envelope`, committed at `created_at_ms`, with its
    /// destinations' custody (sorted here by name). A row of a flow
    /// delivered nowhere is `accepted` as `settled` says.
    pub fn of_custody(
        envelope: Envelope,
        created_at_ms: i64,
        settled: bool,
        mut custody: Vec<Custody>,
    ) -> OutboxEntry {
        custody.sort_by(|a, b| a.destination.cmp(&b.destination));
        let accepted = custody.iter().all(|c| c.accepted) && (settled || !custody.is_empty());
        let accepted_at_ms = if accepted {
            custody.iter().filter_map(|c| c.accepted_at_ms).max()
        } else {
            None
        };
        let shown = crate::destination::shown_custody(&custody).cloned();
        let shown = shown.as_ref();
        OutboxEntry {
            envelope,
            accepted,
            quarantined: custody.iter().any(|c| c.quarantined),
            quarantine_reason: shown.and_then(|c| c.quarantine_reason.clone()),
            quarantine_detail: shown.and_then(|c| c.quarantine_detail.clone()),
            attempts: shown.map_or(0, |c| c.attempts),
            last_outcome: shown.and_then(|c| c.last_outcome.clone()),
            last_error: shown.and_then(|c| c.last_error.clone()),
            next_attempt_at_ms: shown.map_or(0, |c| c.next_attempt_at_ms),
            created_at_ms,
            accepted_at_ms,
            destinations: custody,
        }
    }
}

/// One inbox row with its times.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxEntry {
    /// The event as stored.
    pub envelope: Envelope,
    /// Its status.
    pub status: InboxStatus,
    /// When it was received.
    pub received_at_ms: i64,
    /// When it was applied or skipped.
    pub settled_at_ms: Option<i64>,
    /// The producer store that delivered it, if known (unknown for a row
    /// stored before the third release, or delivered without one).
    pub store_id: Option<StoreId>,
}

/// Which inbox rows a listing reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboxScope<'a> {
    /// Every producer's.
    All,
    /// One producer's.
    Producer(&'a ProducerName),
    /// One flow's.
    Flow(&'a InboxFlow),
}

impl<'a> InboxScope<'a> {
    /// The producer and flow id to match, as SQL parameters: `None` matches
    /// any.
    pub fn bounds(self) -> (Option<&'a str>, Option<&'a str>) {
        match self {
            InboxScope::All => (None, None),
            InboxScope::Producer(p) => (Some(p.as_str()), None),
            InboxScope::Flow(f) => (Some(f.producer.as_str()), Some(f.flow_id.as_str())),
        }
    }
}

/// An explicit, audited business decision to skip one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkipRequest {
    /// The flow.
    pub flow: InboxFlow,
    /// The seq to skip: must be the flow's next one, stored, not applied.
    pub seq: Seq,
    /// Why (non-empty, at most 1000 bytes).
    pub reason: String,
    /// Who decided (non-empty, at most 100 bytes).
    pub by: String,
}

/// Why a skip request is invalid before any storage is touched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSkip {
    /// Empty or too long reason.
    #[error("--reason must be 1 to {REPAIR_REASON_LEN_MAX} bytes of text (got {0} bytes)")]
    Reason(usize),
    /// Empty or too long name.
    #[error("--by must be 1 to {REPAIR_BY_LEN_MAX} bytes of text (got {0} bytes)")]
    By(usize),
}

impl SkipRequest {
    /// Checks the request's own rules.
    pub fn new(
        flow: InboxFlow,
        seq: Seq,
        reason: String,
        by: String,
    ) -> Result<SkipRequest, InvalidSkip> {
        if reason.trim().is_empty() || reason.len() > REPAIR_REASON_LEN_MAX {
            return Err(InvalidSkip::Reason(reason.len()));
        }
        if by.trim().is_empty() || by.len() > REPAIR_BY_LEN_MAX {
            return Err(InvalidSkip::By(by.len()));
        }
        Ok(SkipRequest {
            flow,
            seq,
            reason,
            by,
        })
    }
}

/// Why a skip is refused by the flow's state. Nothing is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkipRefused {
    /// The seq is at or before the flow's applied seq.
    #[error(
        "flow {flow} seq {seq} is already applied or skipped (applied through seq {applied_seq})"
    )]
    AlreadySettled {
        /// The flow.
        flow: InboxFlow,
        /// The requested seq.
        seq: Seq,
        /// The flow's applied seq.
        applied_seq: i64,
    },
    /// The seq is after the flow's next one.
    #[error("flow {flow} seq {seq} is not the flow's next seq ({next}); only the next one can be skipped")]
    NotNext {
        /// The flow.
        flow: InboxFlow,
        /// The requested seq.
        seq: Seq,
        /// The flow's next seq.
        next: i64,
    },
    /// Nothing is stored at the seq: the event may still arrive.
    #[error("flow {flow} seq {seq} is not stored in the inbox; a missing event cannot be skipped")]
    NotStored {
        /// The flow.
        flow: InboxFlow,
        /// The requested seq.
        seq: Seq,
    },
}

/// Decides a skip from the flow's applied seq and whether the seq is stored.
pub fn decide_skip(
    request: &SkipRequest,
    applied_seq: i64,
    stored: bool,
) -> Result<(), SkipRefused> {
    let seq = request.seq.get();
    if seq <= applied_seq {
        return Err(SkipRefused::AlreadySettled {
            flow: request.flow.clone(),
            seq: request.seq,
            applied_seq,
        });
    }
    if Some(seq) != applied_seq.checked_add(1) {
        return Err(SkipRefused::NotNext {
            flow: request.flow.clone(),
            seq: request.seq,
            next: applied_seq + 1,
        });
    }
    if !stored {
        return Err(SkipRefused::NotStored {
            flow: request.flow.clone(),
            seq: request.seq,
        });
    }
    Ok(())
}

/// One entry of the append-only repair log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairRecord {
    /// Its position in the log.
    pub id: i64,
    /// The action (`skip`).
    pub action: String,
    /// The flow's producer.
    pub producer: ProducerName,
    /// The flow.
    pub flow_id: FlowId,
    /// The producer store that delivered the event acted on, if known.
    pub store_id: Option<StoreId>,
    /// The seq acted on.
    pub seq: Seq,
    /// The event acted on.
    pub event_id: EventId,
    /// Why.
    pub reason: String,
    /// Who decided.
    pub by: String,
    /// When.
    pub at_ms: i64,
    /// The effect intent acted on, for an effect action (`None` otherwise).
    pub key: Option<crate::effect::EffectKey>,
}

/// Why retrying a quarantined event is refused. Nothing is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetryRefused {
    /// No such event in the outbox.
    #[error("{0}: no such event in the outbox")]
    Unknown(EventId),
    /// The event is not quarantined.
    #[error("{0} is not quarantined")]
    NotQuarantined(EventId),
    /// The destination named is not one of the store's.
    #[error(transparent)]
    Destination(crate::destination::DestinationRefused),
}

/// The producer's alerting signals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProducerStatus {
    /// Events not yet accepted (quarantined ones included).
    pub backlog: u64,
    /// Creation time of the oldest event not yet accepted.
    pub oldest_pending_created_at_ms: Option<i64>,
    /// Quarantined events.
    pub quarantined: u64,
    /// Of those, events quarantined by a receipt of cause
    /// `producer_rewound` (a store restored from an older backup).
    pub rewound: u64,
    /// Events waiting for a backoff to expire.
    pub backing_off: u64,
}

/// A flow waiting on a missing seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GapWait {
    /// The flow's producer.
    pub producer: ProducerName,
    /// The flow.
    pub flow_id: FlowId,
    /// The missing seq.
    pub missing: Seq,
    /// When the earliest event after the gap was received.
    pub since_ms: i64,
}

/// One producer's share of the consumer's signals: its rows and flows in
/// the inbox (the `producer` label of the inbox metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProducerInbox {
    /// Its stored events waiting for apply.
    pub pending: u64,
    /// Its blocked events, whatever their reason.
    pub blocked: u64,
    /// Its flows waiting on a gap, listed or not.
    pub gap_flows: u64,
}

/// The consumer's alerting signals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerStatus {
    /// Stored events waiting for apply.
    pub pending: u64,
    /// Blocked events by reason.
    pub blocked: BTreeMap<String, u64>,
    /// Flows waiting on a gap, by flow id, at most [`GAPS_LISTED_MAX`].
    pub gaps: Vec<GapWait>,
    /// How many flows wait on a gap in all.
    pub gaps_total: u64,
    /// Applied events (pruned ones included).
    pub applied: u64,
    /// Skipped events.
    pub skipped: u64,
    /// Each producer's share of `pending`, `blocked` and the gap-waiting
    /// flows, for every producer with a row in the inbox (pruned rows
    /// aside), by name.
    pub producers: BTreeMap<ProducerName, ProducerInbox>,
}

impl ConsumerStatus {
    /// Counts `n` inbox rows of `producer` of a stored `status` (and block
    /// `reason`); an unknown status or an invalid producer name is a corrupt
    /// store.
    pub fn count_rows(
        &mut self,
        producer: String,
        status: &str,
        reason: String,
        n: i64,
    ) -> Result<(), StoreError> {
        let n = n.max(0) as u64;
        let share = self
            .producers
            .entry(stored_producer(producer)?)
            .or_default();
        match status {
            "pending" => {
                self.pending += n;
                share.pending += n;
            }
            "applied" => self.applied += n,
            "skipped" => self.skipped += n,
            "blocked" => {
                *self.blocked.entry(reason).or_default() += n;
                share.blocked += n;
            }
            other => {
                return Err(StoreError::corrupt(
                    "consumer: stored inbox status",
                    format!("unknown status {other:?}"),
                ))
            }
        }
        Ok(())
    }

    /// Counts `n` fingerprints of pruned rows of a stored `status`.
    pub fn count_fingerprints(&mut self, status: &str, n: i64) {
        let n = n.max(0) as u64;
        if status == "applied" {
            self.applied += n;
        } else {
            self.skipped += n;
        }
    }

    /// Counts a flow waiting at its `missing` seq since `since_ms`, listed
    /// while fewer than [`GAPS_LISTED_MAX`] are.
    pub fn count_gap(
        &mut self,
        (producer, flow_id): (String, String),
        missing: i64,
        since_ms: i64,
    ) -> Result<(), StoreError> {
        let producer = stored_producer(producer)?;
        self.gaps_total += 1;
        self.producers
            .entry(producer.clone())
            .or_default()
            .gap_flows += 1;
        if self.gaps.len() >= GAPS_LISTED_MAX {
            return Ok(());
        }
        self.gaps.push(GapWait {
            producer,
            flow_id: FlowId::new(flow_id)
                .map_err(|e| StoreError::corrupt("consumer: stored flow id", e))?,
            missing: Seq::new(missing)
                .map_err(|e| StoreError::corrupt("consumer: stored cursor", e))?,
            since_ms,
        });
        Ok(())
    }
}

/// A producer name read from the inbox; an invalid one is a corrupt store.
fn stored_producer(name: String) -> Result<ProducerName, StoreError> {
    ProducerName::new(name).map_err(|e| StoreError::corrupt("consumer: stored producer", e))
}

/// What a prune removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Rows removed.
    pub rows: u64,
    /// Fingerprints kept for them (consumer side).
    pub fingerprints: u64,
}

/// The most rows one whole-table read returns (every outbox row, every
/// inbox row, the repair log, a domain's table in a snapshot). A store
/// past it is read in pages instead (`outbox list`, `inbox list --limit`,
/// the console's flow pages) or pruned: the read fails rather than hold
/// an unbounded table in memory.
pub const WHOLE_READ_ROWS_MAX: usize = 1_000_000;

/// The row count a whole-table read of at most `rows_max` rows asks its
/// database for: one more, so that [`whole_read`] can tell a table past
/// the bound from one at it.
pub fn whole_read_limit(rows_max: usize) -> i64 {
    i64::try_from(rows_max).map_or(i64::MAX, |max| max.saturating_add(1))
}

/// The rows of a whole-table read of `what` that asked for
/// [`whole_read_limit`]`(rows_max)` rows; an error when more than
/// `rows_max` came (nothing is returned in part).
pub fn whole_read<T>(what: &str, rows_max: usize, rows: Vec<T>) -> Result<Vec<T>, StoreError> {
    if rows.len() <= rows_max {
        return Ok(rows);
    }
    Err(StoreError::new(
        ErrorKind::Other,
        format!(
            "{what} holds more than {rows_max} rows, more than one read returns: list it in pages, or prune it"
        ),
    ))
}

/// Seconds from `since_ms` to `now_ms`, never negative: the ages that
/// `status` reports.
pub fn age_s(now_ms: i64, since_ms: i64) -> f64 {
    (now_ms.saturating_sub(since_ms).max(0) as f64) / 1000.0
}

impl ProducerStatus {
    /// The age at `now_ms` of the oldest event not yet accepted, in
    /// seconds; `None` when every event is accepted.
    pub fn oldest_pending_age_s(&self, now_ms: i64) -> Option<f64> {
        self.oldest_pending_created_at_ms
            .map(|since| age_s(now_ms, since))
    }
}

impl ConsumerStatus {
    /// Blocked rows, whatever their reason.
    pub fn blocked_total(&self) -> u64 {
        self.blocked.values().sum()
    }
}

/// A flow as the producer knows it: its last committed seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerFlow {
    /// The flow.
    pub flow_id: FlowId,
    /// Its last committed seq.
    pub last_seq: Seq,
}

/// A flow as the consumer knows it: how far it is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerFlow {
    /// The flow's producer.
    pub producer: ProducerName,
    /// The flow.
    pub flow_id: FlowId,
    /// Its last applied (or skipped) seq; 0 before the first.
    pub applied_seq: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_read_past_its_bound_fails_whole() {
        assert_eq!(whole_read_limit(2), 3);
        assert_eq!(whole_read_limit(usize::MAX), i64::MAX);
        assert_eq!(whole_read("the outbox", 2, vec![1, 2]).unwrap(), [1, 2]);
        let error = whole_read("the outbox", 2, vec![1, 2, 3]).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("the outbox holds more than 2 rows"),
            "{error}"
        );
    }
    use crate::error::ErrorKind;

    #[test]
    fn a_status_counts_what_each_backend_reads() {
        let mut status = ConsumerStatus::default();
        let rows = [
            ("default", "pending", "", 2),
            ("default", "applied", "", 3),
            ("orders", "skipped", "", 1),
            ("default", "blocked", "late", 4),
            ("orders", "blocked", "late", 1),
            ("orders", "pending", "", -7),
        ];
        for (producer, state, reason, n) in rows {
            let producer = producer.to_owned();
            status
                .count_rows(producer, state, reason.into(), n)
                .unwrap();
        }
        status.count_fingerprints("applied", 10);
        status.count_fingerprints("skipped", 2);
        let counted = (status.pending, status.applied, status.skipped);
        assert_eq!(counted, (2, 13, 3));
        assert_eq!(status.blocked.get("late"), Some(&5));
        let share = |pending, blocked| ProducerInbox {
            pending,
            blocked,
            gap_flows: 0,
        };
        let shares: Vec<_> = status
            .producers
            .iter()
            .map(|(p, s)| (p.as_str(), *s))
            .collect();
        assert_eq!(shares, [("default", share(2, 4)), ("orders", share(0, 1))]);
        let error = status.count_rows("default".into(), "gone", String::new(), 1);
        assert_eq!(error.unwrap_err().kind(), ErrorKind::Corrupt);
        let error = status.count_rows("Bad".into(), "pending", String::new(), 1);
        assert_eq!(error.unwrap_err().kind(), ErrorKind::Corrupt);
        for i in 0..GAPS_LISTED_MAX + 2 {
            status
                .count_gap(("default".into(), format!("f{i}")), 2, 0)
                .unwrap();
        }
        assert_eq!(status.gaps.len(), GAPS_LISTED_MAX);
        assert_eq!(status.gaps_total, GAPS_LISTED_MAX as u64 + 2);
        let default = &status.producers[&ProducerName::default()];
        assert_eq!(
            default.gap_flows,
            GAPS_LISTED_MAX as u64 + 2,
            "listed or not"
        );
        assert!(
            status
                .count_gap(("default".into(), "bad id!".into()), 2, 0)
                .is_ok(),
            "past the list, only counted"
        );
        let mut fresh = ConsumerStatus::default();
        assert!(
            fresh
                .count_gap(("default".into(), "f".into()), 0, 0)
                .is_err(),
            "seq 0 is not a seq"
        );
    }
}
