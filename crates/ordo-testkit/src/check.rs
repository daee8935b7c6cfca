//! The one end-state checker: what must hold of a producer and a consumer
//! of the reservation domain, read from their snapshots. Some rules hold at
//! every instant (custody, one effect per applied event, nothing applied past
//! a gap, the projection at the last applied event); [`EndState`] adds what
//! must hold once a run has converged (everything delivered and applied,
//! every expected flow finished).
//!
//! Every store gives the parts of a [`Snapshot`]: the SQLite stores through
//! `ordo_reservation::{producer_snapshot, consumer_snapshot}`, any backend
//! through the reservation traits.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use ordo_core::{FlowId, InboxRecord, InboxStatus, OutboxRecord, ProducerName};
use ordo_reservation::{EffectRecord, FlowRecord, FlowState, Projection};

/// The most rows one violation names; the count is always given.
const NAMED_ROWS_MAX: usize = 20;

/// Everything the checker reads: both stores' rows. A side that is not
/// checked is left empty.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// The producer's flow records.
    pub flows: Vec<FlowRecord>,
    /// The producer's outbox, in commit order.
    pub outbox: Vec<OutboxRecord>,
    /// The consumer's inbox as listed.
    pub inbox: Vec<InboxRecord>,
    /// Inbox rows pruned from the listing: their identities remain, so they
    /// count as held (custody) and as settled (order).
    pub pruned_inbox: Vec<InboxRecord>,
    /// The consumer's projections.
    pub projections: Vec<Projection>,
    /// The consumer's effects.
    pub effects: Vec<EffectRecord>,
}

/// The producer's part of a snapshot, as `producer_snapshot` returns it.
pub type ProducerRows = (Vec<FlowRecord>, Vec<OutboxRecord>);
/// The consumer's part of a snapshot, as `consumer_snapshot` returns it.
pub type ConsumerRows = (Vec<InboxRecord>, Vec<Projection>, Vec<EffectRecord>);

impl Snapshot {
    /// Both sides, as the stores' snapshot functions return them.
    pub fn new(producer: ProducerRows, consumer: ConsumerRows) -> Snapshot {
        let (flows, outbox) = producer;
        let (inbox, projections, effects) = consumer;
        Snapshot {
            flows,
            outbox,
            inbox,
            pruned_inbox: Vec::new(),
            projections,
            effects,
        }
    }

    /// The consumer side alone.
    pub fn consumer(consumer: ConsumerRows) -> Snapshot {
        Snapshot::new((Vec::new(), Vec::new()), consumer)
    }
}

/// What must hold besides the rules of every instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndState {
    /// Every committed event accepted, held by the inbox with exactly the
    /// committed envelope, no other event held, and every row applied.
    pub delivered: bool,
    /// Exactly these flows exist on both sides, each finished.
    pub finished: Option<Finished>,
}

/// Flows that must all have reached one state at one seq.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    /// How many flows.
    pub flows: usize,
    /// The state each reached, on the producer and in the projection.
    pub state: FlowState,
    /// The seq of its last event, committed and applied.
    pub last_seq: i64,
}

impl Finished {
    /// `flows` reservation flows through all three steps.
    pub fn released(flows: usize) -> Finished {
        Finished {
            flows,
            state: FlowState::Released,
            last_seq: 3,
        }
    }
}

/// The rule a violation breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    /// A committed (or accepted) event that the inbox does not hold.
    Lost,
    /// An event held with another body than the one committed.
    Body,
    /// Inbox rows out of order, or one event or `(flow, seq)` held twice.
    InboxRows,
    /// Not exactly one effect per applied event.
    Effects,
    /// A flow's settled seqs with a hole: a gap passed over.
    Gap,
    /// A projection that is not where its applied events put it.
    Projection,
    /// Outbox seqs out of order or past the flow's last seq.
    OutboxSeqs,
    /// A committed event never accepted ([`EndState::delivered`]).
    Unaccepted,
    /// An inbox row not applied ([`EndState::delivered`]).
    NotApplied,
    /// A held event the producer never committed ([`EndState::delivered`]).
    Extra,
    /// A flow missing, extra or not finished ([`EndState::finished`]).
    Unfinished,
}

/// One broken rule, with what was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The rule broken.
    pub rule: Rule,
    /// What was found, naming the rows concerned.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

/// Every violation of the rules of every instant and of `expected`, in the
/// order of [`Rule`]'s checks; empty when all hold.
pub fn check_end_state(snapshot: &Snapshot, expected: &EndState) -> Vec<Violation> {
    let mut found = Found(Vec::new());
    let settled = Settled::of(snapshot);
    custody(snapshot, expected.delivered, &mut found);
    inbox_rows(snapshot, &mut found);
    effects(snapshot, &settled, &mut found);
    gaps(&settled, &mut found);
    projections(snapshot, &settled, &mut found);
    outbox_seqs(snapshot, &mut found);
    if expected.delivered {
        delivered(snapshot, &mut found);
    }
    if let Some(finished) = expected.finished {
        finished_flows(snapshot, finished, &mut found);
    }
    found.0
}

struct Found(Vec<Violation>);

impl Found {
    fn unless(&mut self, ok: bool, rule: Rule, detail: impl FnOnce() -> String) {
        if !ok {
            self.0.push(Violation {
                rule,
                detail: detail(),
            });
        }
    }

    /// A violation of `rule`, `what` then the items named, unless there
    /// are none.
    fn unless_none<T: fmt::Display>(&mut self, items: &[T], rule: Rule, what: &str) {
        self.unless(items.is_empty(), rule, || {
            format!("{what}: {}", named(items))
        });
    }
}

/// Names up to [`NAMED_ROWS_MAX`] items, then how many more.
fn named<T: fmt::Display>(items: &[T]) -> String {
    let mut text: Vec<String> = items
        .iter()
        .take(NAMED_ROWS_MAX)
        .map(ToString::to_string)
        .collect();
    if items.len() > NAMED_ROWS_MAX {
        text.push(format!("and {} more", items.len() - NAMED_ROWS_MAX));
    }
    text.join(", ")
}

type Key = (String, i64);

/// An inbox flow as one key, `"FLOW_ID PRODUCER"`: ordered as the inbox
/// orders its flows (by flow id, then producer; a flow id holds no space).
fn flow_key(producer: &ProducerName, flow_id: &FlowId) -> String {
    format!("{flow_id} {producer}")
}

/// The applied and skipped rows, listed or pruned, by `(flow, seq)`.
struct Settled {
    applied: BTreeMap<Key, String>,
    skipped: BTreeSet<Key>,
}

impl Settled {
    fn of(snapshot: &Snapshot) -> Settled {
        let mut settled = Settled {
            applied: BTreeMap::new(),
            skipped: BTreeSet::new(),
        };
        for row in snapshot.inbox.iter().chain(&snapshot.pruned_inbox) {
            let e = &row.envelope;
            let key = (flow_key(&e.producer, &e.flow_id), e.seq.get());
            match row.status {
                InboxStatus::Applied => {
                    settled.applied.insert(key, e.event_id.to_string());
                }
                InboxStatus::Skipped => {
                    settled.skipped.insert(key);
                }
                InboxStatus::Pending | InboxStatus::Blocked(_) => {}
            }
        }
        settled
    }

    fn applied_seqs(&self, flow: &str) -> Vec<i64> {
        self.applied
            .keys()
            .filter(|(f, _)| f == flow)
            .map(|(_, seq)| *seq)
            .collect()
    }

    fn skips(&self, flow: &str) -> usize {
        self.skipped.iter().filter(|(f, _)| f == flow).count()
    }
}

/// Custody: each accepted event (each committed one, when everything must
/// be delivered) is held by the inbox with the same body (the same
/// envelope, when everything must be delivered).
fn custody(snapshot: &Snapshot, delivered: bool, found: &mut Found) {
    let held: BTreeMap<(&str, &str), &InboxRecord> = snapshot
        .inbox
        .iter()
        .chain(&snapshot.pruned_inbox)
        .map(|r| {
            (
                (r.envelope.producer.as_str(), r.envelope.event_id.as_str()),
                r,
            )
        })
        .collect();
    for row in snapshot.outbox.iter().filter(|r| delivered || r.accepted) {
        let e = &row.envelope;
        let Some(stored) = held.get(&(e.producer.as_str(), e.event_id.as_str())) else {
            found.unless(false, Rule::Lost, || {
                format!("committed event {} lost: not in the inbox", e.event_id)
            });
            continue;
        };
        let same = if delivered {
            stored.envelope == *e
        } else {
            stored.envelope.body() == e.body()
        };
        found.unless(same, Rule::Body, || {
            format!("event {} stored with a different body", e.event_id)
        });
    }
}

/// The listed inbox is ordered by `(flow, seq)` with one row per key, and
/// no event id is held twice.
fn inbox_rows(snapshot: &Snapshot, found: &mut Found) {
    let keys: Vec<(String, i64)> = snapshot
        .inbox
        .iter()
        .map(|r| {
            (
                flow_key(&r.envelope.producer, &r.envelope.flow_id),
                r.envelope.seq.get(),
            )
        })
        .collect();
    found.unless(
        keys.windows(2).all(|w| w[0] < w[1]),
        Rule::InboxRows,
        || "inbox rows are not ordered by (flow, seq) without repeats".into(),
    );
    let all = snapshot.inbox.len() + snapshot.pruned_inbox.len();
    let ids: BTreeSet<(&str, &str)> = snapshot
        .inbox
        .iter()
        .chain(&snapshot.pruned_inbox)
        .map(|r| (r.envelope.producer.as_str(), r.envelope.event_id.as_str()))
        .collect();
    found.unless(ids.len() == all, Rule::InboxRows, || {
        format!(
            "inbox holds {all} rows for {} distinct event ids",
            ids.len()
        )
    });
}

/// Exactly one effect per applied `(flow, seq)`, with its event id, listed
/// by flow then seq, and none for any other row.
fn effects(snapshot: &Snapshot, settled: &Settled, found: &mut Found) {
    let keys: Vec<(String, i64)> = snapshot
        .effects
        .iter()
        .map(|e| (flow_key(&e.producer, &e.flow_id), e.seq.get()))
        .collect();
    let distinct: BTreeSet<&(String, i64)> = keys.iter().collect();
    found.unless(distinct.len() == keys.len(), Rule::Effects, || {
        format!(
            "{} effects for {} distinct (flow, seq): an event applied twice",
            keys.len(),
            distinct.len()
        )
    });
    found.unless(keys.windows(2).all(|w| w[0] <= w[1]), Rule::Effects, || {
        "effects are not listed by flow then seq".into()
    });
    let by_key: BTreeMap<Key, String> = snapshot
        .effects
        .iter()
        .map(|e| {
            (
                (flow_key(&e.producer, &e.flow_id), e.seq.get()),
                e.event_id.to_string(),
            )
        })
        .collect();
    let wrong: Vec<String> = by_key
        .iter()
        .filter(|(key, id)| settled.applied.get(*key) != Some(*id))
        .map(|((flow, seq), id)| format!("{flow} {seq} ({id})"))
        .collect();
    found.unless_none(
        &wrong,
        Rule::Effects,
        "effects that match no applied inbox event",
    );
    let missing: Vec<String> = settled
        .applied
        .iter()
        .filter(|(key, _)| !by_key.contains_key(*key))
        .map(|((flow, seq), id)| format!("{flow} {seq} ({id})"))
        .collect();
    found.unless_none(&missing, Rule::Effects, "applied events without an effect");
}

/// Per flow, the settled seqs (applied or skipped) are `1..=k`: nothing is
/// applied past a gap or a row that is not settled.
fn gaps(settled: &Settled, found: &mut Found) {
    let mut seqs: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for (flow, seq) in settled.applied.keys().chain(&settled.skipped) {
        seqs.entry(flow.as_str()).or_default().push(*seq);
    }
    for (flow, mut seqs) in seqs {
        seqs.sort_unstable();
        let contiguous = seqs.iter().zip(1..).all(|(seq, want)| *seq == want);
        found.unless(contiguous, Rule::Gap, || {
            format!("flow {flow}: settled seqs {seqs:?} have a hole: a gap was passed")
        });
    }
}

/// Projections are listed by flow, exist exactly for the flows with applied
/// events, stand at the last applied seq and, with no skip, at the state
/// and quantity of that step.
fn projections(snapshot: &Snapshot, settled: &Settled, found: &mut Found) {
    let flows: Vec<String> = snapshot
        .projections
        .iter()
        .map(|p| flow_key(&p.producer, &p.flow_id))
        .collect();
    found.unless(
        flows.windows(2).all(|w| w[0] < w[1]),
        Rule::Projection,
        || "projections are not listed by flow, one per flow".into(),
    );
    let projected: BTreeSet<&str> = flows.iter().map(String::as_str).collect();
    let applied: BTreeSet<&str> = settled.applied.keys().map(|(f, _)| f.as_str()).collect();
    found.unless(projected == applied, Rule::Projection, || {
        let only_projected: Vec<&&str> = projected.difference(&applied).collect();
        let only_applied: Vec<&&str> = applied.difference(&projected).collect();
        format!(
            "projection without applied events: {}; applied events without a projection: {}",
            named(&only_projected),
            named(&only_applied)
        )
    });
    for p in &snapshot.projections {
        projection(p, settled, found);
    }
}

fn projection(p: &Projection, settled: &Settled, found: &mut Found) {
    let key = flow_key(&p.producer, &p.flow_id);
    let flow = key.as_str();
    let seqs = settled.applied_seqs(flow);
    found.unless(
        seqs.last() == Some(&p.applied_seq),
        Rule::Projection,
        || {
            format!(
                "projection of {flow}: applied_seq {} but applied seqs {seqs:?}",
                p.applied_seq
            )
        },
    );
    if settled.skips(flow) > 0 {
        return;
    }
    let step = step_state(p.applied_seq);
    found.unless(
        seqs.len() as i64 == p.applied_seq && step == Some(p.state) && p.quantity.is_some(),
        Rule::Projection,
        || {
            format!(
                "projection of {flow}: {} at applied_seq {} with quantity {:?}, after {} applied events",
                p.state,
                p.applied_seq,
                p.quantity.map(|q| q.get()),
                seqs.len()
            )
        },
    );
}

/// The state a reservation flow reaches at step `seq`.
fn step_state(seq: i64) -> Option<FlowState> {
    match seq {
        1 => Some(FlowState::Reserved),
        2 => Some(FlowState::Confirmed),
        3 => Some(FlowState::Released),
        _ => None,
    }
}

/// Per producer flow, outbox seqs increase and lie in `1..=last_seq`.
fn outbox_seqs(snapshot: &Snapshot, found: &mut Found) {
    let mut by_flow: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for row in &snapshot.outbox {
        let e = &row.envelope;
        by_flow
            .entry(e.flow_id.as_str())
            .or_default()
            .push(e.seq.get());
    }
    for flow in &snapshot.flows {
        let seqs = by_flow.remove(flow.flow_id.as_str()).unwrap_or_default();
        let ok = seqs.windows(2).all(|w| w[0] < w[1])
            && seqs.iter().all(|s| (1..=flow.last_seq).contains(s));
        found.unless(ok, Rule::OutboxSeqs, || {
            format!(
                "flow {}: last_seq {} but outbox seqs {seqs:?}",
                flow.flow_id, flow.last_seq
            )
        });
    }
}

/// Every committed event accepted, the inbox holds exactly the committed
/// events, and every inbox row is applied.
fn delivered(snapshot: &Snapshot, found: &mut Found) {
    let unaccepted = snapshot.outbox.iter().filter(|r| !r.accepted).count();
    found.unless(unaccepted == 0, Rule::Unaccepted, || {
        format!("{unaccepted} outbox events never accepted")
    });
    let committed: BTreeSet<&str> = snapshot
        .outbox
        .iter()
        .map(|r| r.envelope.event_id.as_str())
        .collect();
    let extra: Vec<&str> = snapshot
        .inbox
        .iter()
        .chain(&snapshot.pruned_inbox)
        .map(|r| r.envelope.event_id.as_str())
        .filter(|id| !committed.contains(id))
        .collect();
    found.unless_none(
        &extra,
        Rule::Extra,
        "inbox holds events the producer never committed",
    );
    let not_applied: Vec<String> = snapshot
        .inbox
        .iter()
        .filter(|r| r.status != InboxStatus::Applied)
        .map(|r| format!("{} ({})", r.envelope.event_id, r.status.as_str()))
        .collect();
    found.unless_none(&not_applied, Rule::NotApplied, "inbox rows not applied");
}

/// Exactly `finished.flows` flows on both sides, each at its final state
/// and seq, with one event and one effect per step.
fn finished_flows(snapshot: &Snapshot, finished: Finished, found: &mut Found) {
    let events = finished.flows * finished.last_seq.max(0) as usize;
    let flows = &snapshot.flows;
    side_finished(found, finished, "producer", "at", flows, |f| {
        (f.state, f.last_seq)
    });
    found.unless(snapshot.outbox.len() == events, Rule::Unfinished, || {
        format!(
            "outbox holds {} events, expected {events}",
            snapshot.outbox.len()
        )
    });
    found.unless(snapshot.effects.len() == events, Rule::Unfinished, || {
        format!(
            "{} effects, expected exactly one per event ({events})",
            snapshot.effects.len()
        )
    });
    let (projections, in_order) = (&snapshot.projections, "in order at");
    side_finished(found, finished, "projection", in_order, projections, |p| {
        (p.state, p.applied_seq)
    });
}

/// Exactly `finished.flows` of one side's `rows` (`what`), each at the
/// final state and seq (`at_seq` says how), as `reached` reads a row's.
fn side_finished<T>(
    found: &mut Found,
    finished: Finished,
    what: &str,
    at_seq: &str,
    rows: &[T],
    reached: impl Fn(&T) -> (FlowState, i64),
) {
    let Finished {
        flows,
        state,
        last_seq,
    } = finished;
    let done = rows
        .iter()
        .filter(|row| reached(row) == (state, last_seq))
        .count();
    found.unless(
        rows.len() == flows && done == flows,
        Rule::Unfinished,
        || {
            format!(
                "{what}: {} flows, {done} {state} {at_seq} seq {last_seq} (expected {flows})",
                rows.len()
            )
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::{flow, reservation_event, seq};
    use ordo_reservation::Quantity;

    /// Two flows through all three steps, delivered and applied.
    fn converged() -> Snapshot {
        let mut s = Snapshot::default();
        for name in ["f1", "f2"] {
            s.flows.push(FlowRecord {
                flow_id: flow(name),
                state: FlowState::Released,
                quantity: Quantity::new(7).ok(),
                last_seq: 3,
            });
            for n in 1..=3 {
                let e = reservation_event(name, n, 7);
                s.effects.push(EffectRecord {
                    producer: Default::default(),
                    flow_id: flow(name),
                    seq: seq(n),
                    event_id: e.event_id.clone(),
                });
                s.outbox.push(OutboxRecord {
                    envelope: e.clone(),
                    accepted: true,
                });
                s.inbox.push(InboxRecord {
                    envelope: e,
                    status: InboxStatus::Applied,
                });
            }
            s.projections.push(Projection {
                producer: Default::default(),
                flow_id: flow(name),
                state: FlowState::Released,
                quantity: Quantity::new(7).ok(),
                applied_seq: 3,
            });
        }
        s
    }

    const ALL: EndState = EndState {
        delivered: true,
        finished: Some(Finished {
            flows: 2,
            state: FlowState::Released,
            last_seq: 3,
        }),
    };

    fn rules(snapshot: &Snapshot, expected: &EndState) -> BTreeSet<Rule> {
        check_end_state(snapshot, expected)
            .into_iter()
            .map(|v| v.rule)
            .collect()
    }

    #[test]
    fn a_converged_state_has_no_violation() {
        assert_eq!(check_end_state(&converged(), &ALL), vec![]);
        assert_eq!(check_end_state(&converged(), &EndState::default()), vec![]);
    }

    #[test]
    fn each_broken_rule_is_reported() {
        type Break = fn(&mut Snapshot);
        let cases: [(&str, Break, Rule); 12] = [
            ("inbox row lost", |s| drop(s.inbox.remove(1)), Rule::Lost),
            (
                "body changed",
                |s| {
                    s.inbox[0]
                        .envelope
                        .payload
                        .insert("amount".into(), 8.into());
                },
                Rule::Body,
            ),
            (
                "row twice",
                |s| s.inbox.push(s.inbox[0].clone()),
                Rule::InboxRows,
            ),
            ("effect lost", |s| drop(s.effects.remove(4)), Rule::Effects),
            (
                "effect twice",
                |s| s.effects.insert(1, s.effects[0].clone()),
                Rule::Effects,
            ),
            (
                "applied past a gap",
                |s| {
                    s.inbox[1].status = InboxStatus::Pending;
                    s.effects.remove(1);
                },
                Rule::Gap,
            ),
            (
                "projection behind",
                |s| s.projections[0].applied_seq = 2,
                Rule::Projection,
            ),
            (
                "projection state",
                |s| s.projections[1].state = FlowState::Confirmed,
                Rule::Projection,
            ),
            (
                "outbox past last_seq",
                |s| s.flows[0].last_seq = 2,
                Rule::OutboxSeqs,
            ),
            (
                "never accepted",
                |s| s.outbox[2].accepted = false,
                Rule::Unaccepted,
            ),
            (
                "not applied",
                |s| {
                    s.inbox[5].status = InboxStatus::Pending;
                    s.effects.remove(5);
                    s.projections[1].applied_seq = 2;
                    s.projections[1].state = FlowState::Confirmed;
                },
                Rule::NotApplied,
            ),
            (
                "a flow missing",
                |s| drop(s.flows.remove(0)),
                Rule::Unfinished,
            ),
        ];
        for (name, break_it, rule) in cases {
            let mut s = converged();
            break_it(&mut s);
            assert!(
                rules(&s, &ALL).contains(&rule),
                "{name}: {:?}",
                check_end_state(&s, &ALL)
            );
        }
    }

    #[test]
    fn end_state_rules_apply_only_when_asked() {
        let mut s = converged();
        s.outbox[5].accepted = false;
        s.inbox.truncate(5);
        s.effects.truncate(5);
        s.projections[1].applied_seq = 2;
        s.projections[1].state = FlowState::Confirmed;
        assert_eq!(check_end_state(&s, &EndState::default()), vec![]);
        assert_eq!(
            rules(&s, &ALL),
            BTreeSet::from([Rule::Lost, Rule::Unaccepted, Rule::Unfinished])
        );
    }

    #[test]
    fn pruned_rows_count_as_held_and_settled() {
        let mut s = converged();
        let pruned: Vec<InboxRecord> = s.inbox.drain(..3).collect();
        assert!(rules(&s, &EndState::default()).contains(&Rule::Lost));
        s.pruned_inbox = pruned;
        assert_eq!(check_end_state(&s, &ALL), vec![]);
    }

    #[test]
    fn a_skipped_seq_settles_its_place() {
        let mut s = converged();
        s.inbox[1].status = InboxStatus::Skipped;
        s.effects.remove(1);
        assert_eq!(check_end_state(&s, &EndState::default()), vec![]);
        assert!(rules(&s, &ALL).contains(&Rule::NotApplied));
    }
}
