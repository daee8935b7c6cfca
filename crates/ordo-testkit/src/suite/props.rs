//! Property tests run against a backend: random arrival orders with
//! duplicates on the consumer, random advance requests on the producer, each
//! compared with a small model. Case counts are small so the suite stays
//! fast; set `PROPTEST_CASES` to run more.

#[allow(unused_imports)]
use ordo_reservation::{
    Advance, AdvanceError, AdvanceRefused, FlowRecord, FlowState, ReservationConsumer,
    ReservationProducer, INVALID_TRANSITION,
};
use std::collections::BTreeSet;
use std::path::Path;

use ordo_core::{
    ConsumerOps, DrainStop, Envelope, EventType, InboxStatus, OutboxRecord, ProducerOps,
    ProducerStore, Receipt, SchemaVersion, Step,
};
use ordo_reservation::rules::payload_for;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::support::*;
use crate::Backend;

const CASES: u32 = 32;

fn runner() -> TestRunner {
    let defaults = Config::default();
    TestRunner::new(Config {
        // an explicit PROPTEST_CASES wins over the suite's small default
        cases: if std::env::var_os("PROPTEST_CASES").is_some() {
            defaults.cases
        } else {
            CASES
        },
        max_shrink_iters: 256,
        failure_persistence: None,
        ..defaults
    })
}

fn run_property<S: Strategy>(
    name: &str,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    if let Err(failure) = runner().run(&strategy, test) {
        panic!("property {name} failed: {failure}");
    }
}

/// What the consumer does after one arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Nothing,
    ApplyNext,
    DrainOne,
    /// `process_all` applying at most this many events per transaction.
    ProcessAll(u64),
    Reopen,
}

#[derive(Debug, Clone)]
struct ArrivalPlan {
    /// One quantity per flow.
    quantities: Vec<i64>,
    /// `(flow index, seq)`, every event at least once, in arrival order.
    arrivals: Vec<(usize, i64)>,
    /// Whether each arrival joins a batch delivered with the next one that
    /// does not.
    batched: Vec<bool>,
    /// What happens after each arrival (after its batch is delivered).
    actions: Vec<Action>,
}

fn arrival_plan() -> impl Strategy<Value = ArrivalPlan> {
    (
        prop::collection::vec(1i64..=1_000_000, 1..=3),
        prop::collection::vec(
            prop_oneof![4 => Just(0usize), 2 => Just(1), 1 => Just(2)],
            9,
        ),
    )
        .prop_flat_map(|(quantities, dups)| {
            let mut arrivals = Vec::new();
            for f in 0..quantities.len() {
                for s in 1..=3i64 {
                    for _ in 0..=dups[f * 3 + (s as usize - 1)] {
                        arrivals.push((f, s));
                    }
                }
            }
            let n = arrivals.len();
            let action = prop_oneof![
                4 => Just(Action::Nothing),
                3 => Just(Action::ApplyNext),
                1 => Just(Action::DrainOne),
                2 => prop_oneof![Just(1u64), Just(2), Just(256)].prop_map(Action::ProcessAll),
                1 => Just(Action::Reopen),
            ];
            (
                Just(quantities),
                Just(arrivals).prop_shuffle(),
                prop::collection::vec(prop::bool::weighted(0.25), n),
                prop::collection::vec(action, n),
            )
        })
        .prop_map(|(quantities, arrivals, batched, actions)| ArrivalPlan {
            quantities,
            arrivals,
            batched,
            actions,
        })
}

fn flow_name(f: usize) -> String {
    format!("flow-{f}")
}

/// The consumer model: per flow, which seqs are stored and how many applied.
struct ConsumerModel {
    received: Vec<BTreeSet<i64>>,
    applied: Vec<i64>,
    quantities: Vec<i64>,
}

impl ConsumerModel {
    fn prefix(&self, f: usize) -> i64 {
        (1..=3).take_while(|s| self.received[f].contains(s)).count() as i64
    }

    fn expected_step(&self, f: usize) -> Step {
        let next = self.applied[f] + 1;
        if self.received[f].contains(&next) {
            applied_at(next)
        } else if self.received[f].iter().any(|s| *s > next) {
            Step::Gap { missing: seq(next) }
        } else {
            Step::Idle
        }
    }

    fn check<C: ReservationConsumer>(&self, c: &mut C, when: &str) -> Result<(), TestCaseError> {
        check_consumer_invariants(c);
        for f in 0..self.quantities.len() {
            let want = match self.applied[f] {
                0 => (FlowState::New, None, 0),
                a => (state_of_step(a), Some(self.quantities[f]), a),
            };
            prop_assert_eq!(projected(c, &flow_name(f)), want, "flow {} {}", f, when);
        }
        Ok(())
    }
}

fn deliver<C: ReservationConsumer>(
    c: &mut C,
    model: &mut ConsumerModel,
    batch: &mut Vec<(usize, i64)>,
) -> Result<(), TestCaseError> {
    if batch.is_empty() {
        return Ok(());
    }
    let envelopes: Vec<Envelope> = batch
        .iter()
        .map(|&(f, s)| reservation_event(&flow_name(f), s, model.quantities[f]))
        .collect();
    let receipts = if envelopes.len() == 1 {
        vec![c.receive(&envelopes[0]).expect("receive")]
    } else {
        c.receive_batch(&envelopes).expect("receive_batch")
    };
    for (&(f, s), receipt) in batch.iter().zip(receipts) {
        let want = if model.received[f].insert(s) {
            Receipt::Accepted
        } else {
            Receipt::Duplicate
        };
        prop_assert_eq!(receipt, want, "flow {} seq {}", f, s);
    }
    batch.clear();
    Ok(())
}

/// Any arrival order of a few flows' events, with duplicates, delivered one
/// by one or in batches, interleaved with `apply_next`, `drain`,
/// `process_all` and reopens, gives the receipts, steps and projections of
/// the model at every point, and ends (after `process_all`) with every flow
/// `released` with its quantity and exactly one effect per `(flow, seq)`.
pub fn prop_any_arrival_order_with_duplicates<B: Backend>(dir: &Path) {
    run_property("any arrival order", arrival_plan(), |plan| {
        let case = tempfile::TempDir::new_in(dir).expect("case directory");
        let (mut _p, mut c) = B::open(case.path());
        let flows = plan.quantities.len();
        let mut model = ConsumerModel {
            received: vec![BTreeSet::new(); flows],
            applied: vec![0; flows],
            quantities: plan.quantities.clone(),
        };
        let mut batch = Vec::new();
        for (i, &(f, s)) in plan.arrivals.iter().enumerate() {
            batch.push((f, s));
            if plan.batched[i] {
                continue;
            }
            deliver(&mut c, &mut model, &mut batch)?;
            let name = flow_name(f);
            match plan.actions[i] {
                Action::Nothing => {}
                Action::ApplyNext => {
                    let want = model.expected_step(f);
                    let got = c.apply_next(&inbox_flow(&name), V1).expect("apply_next");
                    prop_assert_eq!(&got, &want, "apply_next on flow {}", f);
                    if matches!(got, Step::Applied { .. }) {
                        model.applied[f] += 1;
                    }
                }
                Action::DrainOne => {
                    let d = drain_flow(&mut c, &name, Some(1), V1);
                    let applied = u64::from(model.prefix(f) > model.applied[f]);
                    prop_assert_eq!(d.applied, applied, "drain(1) on flow {}", f);
                    model.applied[f] += applied as i64;
                }
                Action::ProcessAll(batch_len) => {
                    let drains = c.process_all(None, V1, batch_len).expect("process_all");
                    for d in &drains {
                        prop_assert!(
                            matches!(d.stop, DrainStop::Idle | DrainStop::Gap),
                            "{:?}",
                            d
                        );
                    }
                    for g in 0..flows {
                        let applied = model.prefix(g) - model.applied[g];
                        let reported = drains
                            .iter()
                            .find(|d| d.flow.flow_id.as_str() == flow_name(g))
                            .map_or(0, |d| d.applied as i64);
                        prop_assert_eq!(reported, applied, "process_all on flow {}", g);
                        model.applied[g] = model.prefix(g);
                    }
                }
                Action::Reopen => {
                    drop((_p, c));
                    (_p, c) = B::open(case.path());
                }
            }
            model.check(&mut c, &format!("after arrival {i}"))?;
        }
        deliver(&mut c, &mut model, &mut batch)?;
        process(&mut c, None, V1);
        prop_assert!(process(&mut c, None, V1).is_empty());
        let mut all_effects = Vec::new();
        for f in 0..flows {
            let name = flow_name(f);
            let q = plan.quantities[f];
            prop_assert_eq!(
                projected(&mut c, &name),
                (FlowState::Released, Some(q), 3),
                "flow {}",
                f
            );
            all_effects.extend(effects_for(reservation_events(&name, q)));
        }
        prop_assert_eq!(c.effects().expect("effects"), all_effects);
        let inbox = c.inbox().expect("inbox");
        prop_assert_eq!(inbox.len(), flows * 3);
        prop_assert!(inbox.iter().all(|r| r.status == InboxStatus::Applied));
        prop_assert!(c
            .flows_with_reservation_work(V2)
            .expect("flows_with_work")
            .is_empty());
        Ok(())
    });
}

#[derive(Debug, Clone)]
struct AdvanceOp {
    flow: usize,
    step: i64,
    expected_delta: i64,
    quantity: QuantityChoice,
    fresh_quantity: i64,
    schema: i64,
    reopen_before: bool,
}

#[derive(Debug, Clone, Copy)]
enum QuantityChoice {
    Omitted,
    Same,
    Fresh,
}

fn advance_op() -> impl Strategy<Value = AdvanceOp> {
    (
        0usize..3,
        1i64..=3,
        prop_oneof![1 => Just(-1i64), 6 => Just(0), 1 => Just(1)],
        prop_oneof![
            Just(QuantityChoice::Omitted),
            Just(QuantityChoice::Same),
            Just(QuantityChoice::Fresh)
        ],
        prop_oneof![Just(1i64), Just(1_000_000), 1i64..=1_000_000],
        1i64..=2,
        prop::bool::weighted(0.05),
    )
        .prop_map(
            |(flow, step, expected_delta, quantity, fresh_quantity, schema, reopen_before)| {
                AdvanceOp {
                    flow,
                    step,
                    expected_delta,
                    quantity,
                    fresh_quantity,
                    schema,
                    reopen_before,
                }
            },
        )
}

/// Random advance requests (right or wrong `expected_seq`, legal or illegal
/// steps, omitted, same or different quantity, schema 1 or 2, with reopens)
/// give exactly the model's outcomes, and after each the producer holds
/// exactly the model's flows and outbox: state and event committed together
/// or not at all, seqs contiguous, nothing written on refusal.
pub fn prop_advance_matches_model<B: Backend>(dir: &Path) {
    run_property(
        "advance matches the model",
        prop::collection::vec(advance_op(), 1..24),
        |ops| {
            let case = tempfile::TempDir::new_in(dir).expect("case directory");
            let (mut p, mut _c) = B::open(case.path());
            let mut flows: Vec<FlowRecord> = (0..3)
                .map(|f| FlowRecord::new_flow(flow(&format!("m{f}"))))
                .collect();
            let mut outbox: Vec<OutboxRecord> = Vec::new();
            for op in &ops {
                if op.reopen_before {
                    drop((p, _c));
                    (p, _c) = B::open(case.path());
                }
                let current = flows[op.flow].clone();
                let to = state_of_step(op.step);
                let expected_seq = (current.last_seq + op.expected_delta).max(0);
                let requested = match op.quantity {
                    QuantityChoice::Omitted if to != FlowState::Reserved => None,
                    QuantityChoice::Same => {
                        Some(current.quantity.map_or(op.fresh_quantity, |q| q.get()))
                    }
                    _ => Some(op.fresh_quantity),
                };
                let req = request(
                    current.flow_id.as_str(),
                    expected_seq,
                    to,
                    requested,
                    op.schema,
                );
                let got = p.advance(&req);
                if expected_seq != current.last_seq {
                    prop_assert_eq!(
                        got.expect("advance"),
                        Advance::Stale {
                            last_seq: current.last_seq
                        }
                    );
                } else if current.state.next() != Some(to) {
                    prop_assert_eq!(
                        got.expect("advance"),
                        Advance::InvalidTransition {
                            from: current.state,
                            to
                        }
                    );
                } else if let (Some(fixed), Some(r)) = (current.quantity, requested) {
                    if fixed.get() != r {
                        let refused = matches!(
                            got,
                            Err(AdvanceError::Refused(
                                AdvanceRefused::QuantityMismatch { .. }
                            ))
                        );
                        prop_assert!(refused, "expected a quantity mismatch, got {:?}", got);
                    } else {
                        commit_model(&mut flows[op.flow], &mut outbox, &req, fixed.get(), got)?;
                    }
                } else {
                    let q = current
                        .quantity
                        .map(|q| q.get())
                        .or(requested)
                        .expect("a quantity");
                    commit_model(&mut flows[op.flow], &mut outbox, &req, q, got)?;
                }
                let mut want_flows: Vec<FlowRecord> =
                    flows.iter().filter(|f| f.last_seq > 0).cloned().collect();
                want_flows.sort_by(|a, b| a.flow_id.cmp(&b.flow_id));
                prop_assert_eq!(p.flows().expect("flows"), want_flows);
                prop_assert_eq!(p.outbox().expect("outbox"), outbox.clone());
            }
            let pending: Vec<Envelope> = outbox.iter().map(|r| r.envelope.clone()).collect();
            prop_assert_eq!(p.pending(usize::MAX).expect("pending"), pending);
            Ok(())
        },
    );
}

fn commit_model(
    flow: &mut FlowRecord,
    outbox: &mut Vec<OutboxRecord>,
    req: &ordo_reservation::AdvanceRequest,
    q: i64,
    got: Result<Advance, AdvanceError>,
) -> Result<(), TestCaseError> {
    let s = seq(flow.last_seq + 1);
    let event = Envelope {
        event_id: ordo_core::EventId::for_seq(&flow.flow_id, s),
        flow_id: flow.flow_id.clone(),
        seq: s,
        schema_version: req.schema_version,
        event_type: EventType::new(req.to.as_str()).expect("event type"),
        payload: payload_for(req.schema_version, quantity(q)),
        producer: ordo_core::ProducerName::default(),
        headers: Default::default(),
    };
    let key = if req.schema_version == SchemaVersion::V2 {
        "units"
    } else {
        "amount"
    };
    prop_assert_eq!(event.payload.get(key).and_then(|v| v.as_i64()), Some(q));
    prop_assert_eq!(got.expect("advance"), Advance::Committed(event.clone()));
    flow.state = req.to;
    flow.quantity = Some(quantity(q));
    flow.last_seq = s.get();
    outbox.push(OutboxRecord {
        envelope: event,
        accepted: false,
    });
    Ok(())
}
