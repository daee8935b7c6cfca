//! The reads for browsing (the operator console): each side's flows by id
//! prefix, keyset-paged, in the bytes' order of their ids; one flow's
//! outbox rows; one inbox row, by flow and seq or by event id. Every backend gives the same rows in the
//! same order as the full listings they page through.

#[allow(unused_imports)]
use ordo_reservation::{Advance, FlowState, Projection, ReservationConsumer, ReservationProducer};
use std::path::Path;

use ordo_core::ops::{ConsumerFlow, ProducerFlow};
use ordo_core::{ConsumerOps, FlowId, ProducerOps, Receipt, Receive, Step};

use crate::support::*;
use crate::Backend;
use ordo_core::ops::InboxScope;
use ordo_core::{InboxFlow, ProducerName};

/// Flow ids whose order differs between a byte order and a language's
/// collation (upper case, `-`, `_`, digits); unsorted.
const IDS: [&str; 9] = ["b", "a-2", "ab", "a_", "B", "a-10", "a", "a1", "a-1"];

/// [`IDS`] in the bytes' order.
fn ids_sorted() -> Vec<&'static str> {
    let mut ids = IDS.to_vec();
    ids.sort_unstable();
    assert_eq!(
        ids,
        ["B", "a", "a-1", "a-10", "a-2", "a1", "a_", "ab", "b"],
        "the suite's own order"
    );
    ids
}

/// Whether `id` stands at an even index of [`IDS`] (the flows the suites
/// take a step further than the others).
fn at_even_index(id: &str) -> bool {
    IDS.iter().position(|i| *i == id).expect("one of IDS") % 2 == 0
}

/// The ids of a page of flows, each read by `id`.
fn flow_ids<T>(page: Vec<T>, id: impl Fn(&T) -> &FlowId) -> Vec<String> {
    page.iter().map(|f| id(f).as_str().to_owned()).collect()
}

/// The flows a page reader lists for `(prefix, after, limit)`, by id.
type Pager<'a> = dyn FnMut(&str, Option<&FlowId>, usize) -> Vec<String> + 'a;

/// Checks one side's flow pages against `all` (every flow the side knows,
/// in byte order): the whole list, prefixes, keyset pages of every size
/// walked to the end, `after` past a prefix, a limit of zero.
fn check_pages(page: &mut Pager<'_>, all: &[&str]) {
    let all: Vec<String> = all.iter().map(|s| s.to_string()).collect();
    let with = |prefix: &str| -> Vec<String> {
        all.iter()
            .filter(|f| f.starts_with(prefix))
            .cloned()
            .collect()
    };
    assert_eq!(page("", None, 100), all, "every flow, in byte order");
    for prefix in ["a", "a-", "a-1", "B", "b", "ab", "zz", "a-100"] {
        assert_eq!(page(prefix, None, 100), with(prefix), "prefix {prefix:?}");
    }
    for size in 1..=4 {
        for prefix in ["", "a"] {
            let mut walked = Vec::new();
            let mut after: Option<FlowId> = None;
            loop {
                let got = page(prefix, after.as_ref(), size);
                assert!(got.len() <= size, "a page holds at most its limit");
                if got.is_empty() {
                    break;
                }
                after = Some(flow(got.last().unwrap()));
                walked.extend(got);
            }
            assert_eq!(walked, with(prefix), "pages of {size} under {prefix:?}");
        }
    }
    assert_eq!(page("a", Some(&flow("a-2")), 100), ["a1", "a_", "ab"]);
    assert_eq!(page("a", Some(&flow("b")), 100), Vec::<String>::new());
    assert_eq!(page("b", Some(&flow("B")), 100), ["b"]);
    assert_eq!(page("", None, 0), Vec::<String>::new());
}

/// The producer's flows: every flow with a committed event, with its last
/// seq, by id prefix and keyset-paged; a flow whose advance was refused
/// (nothing committed) is none.
pub fn browse_producer_flows_by_prefix_and_page<B: Backend>(dir: &Path) {
    let (mut p, _c) = B::open(dir);
    for (i, id) in IDS.iter().enumerate() {
        commit(&mut p, &request(id, 0, FlowState::Reserved, Some(1), 1));
        if i % 2 == 0 {
            commit(&mut p, &request(id, 1, FlowState::Confirmed, None, 1));
        }
    }
    // A stale advance on a new flow writes nothing: no flow.
    let refused = p
        .advance(&request("a-0", 2, FlowState::Released, None, 1))
        .expect("a refusal is no error");
    assert!(
        !matches!(refused, Advance::Committed(_)),
        "stale: {refused:?}"
    );
    let sorted = ids_sorted();
    let flows = p.producer_flows_page("", None, 100).unwrap();
    let expected: Vec<ProducerFlow> = sorted
        .iter()
        .map(|id| ProducerFlow {
            flow_id: flow(id),
            last_seq: seq(if at_even_index(id) { 2 } else { 1 }),
        })
        .collect();
    assert_eq!(flows, expected);
    check_pages(
        &mut |prefix, after, limit| {
            let page = p.producer_flows_page(prefix, after, limit);
            flow_ids(page.expect("producer_flows_page"), |f| &f.flow_id)
        },
        &sorted,
    );
}

/// A flow's outbox rows are the outbox listing's rows of that flow, with
/// the same delivery bookkeeping, in seq order, up to the limit; an unknown
/// flow has none.
pub fn browse_flow_outbox_entries_in_seq_order<B: Backend>(dir: &Path) {
    let (mut p, mut c) = B::open(dir);
    commit_full_flow(&mut p, "f", 2);
    commit(&mut p, &request("g", 0, FlowState::Reserved, Some(1), 1));
    commit(&mut p, &request("f-1", 0, FlowState::Reserved, Some(1), 1));
    // Bookkeeping to compare: f-1 is delivered once (accepted), f's rows
    // and g's stay pending; a conflicting body quarantines g-1.
    relay_one(&mut p, &mut c, &event_id("f-1-1")).expect("deliver f-1-1");
    let conflicting = reservation_event("g", 1, 99);
    assert_eq!(c.receive(&conflicting).unwrap(), Receipt::Accepted);
    relay_one(&mut p, &mut c, &event_id("g-1")).expect("deliver g-1");
    let all = outbox_entries(&mut p);
    let of = |flow_id: &str| -> Vec<_> {
        let mut rows: Vec<_> = all
            .iter()
            .filter(|e| e.envelope.flow_id.as_str() == flow_id)
            .cloned()
            .collect();
        rows.sort_by_key(|e| e.envelope.seq);
        rows
    };
    let f = p.flow_outbox_entries(&flow("f"), 100).unwrap();
    assert_eq!(f.len(), 3);
    assert_eq!(f, of("f"));
    assert_eq!(p.flow_outbox_entries(&flow("f"), 2).unwrap(), of("f")[..2]);
    let g = p.flow_outbox_entries(&flow("g"), 100).unwrap();
    assert!(g[0].quarantined, "{g:?}");
    assert_eq!(g, of("g"));
    let f1 = p.flow_outbox_entries(&flow("f-1"), 100).unwrap();
    assert!(f1[0].accepted, "{f1:?}");
    assert_eq!(f1, of("f-1"));
    assert!(p.flow_outbox_entries(&flow("h"), 100).unwrap().is_empty());
    assert!(p.flow_outbox_entries(&flow("f"), 0).unwrap().is_empty());
}

/// The consumer's flows: every flow with a stored row or an applied seq
/// (after its rows are pruned), with its applied seq, by id prefix and
/// keyset-paged; an apply that found nothing makes no flow. One inbox row
/// by flow and seq, or by event id, is the listing's row; one flow's
/// projection, the listing's.
pub fn browse_consumer_flows_and_one_inbox_row<B: Backend>(dir: &Path) {
    let clock = ManualClock::new(T0);
    let (_p, mut c) = open_at::<B>(dir, &clock);
    // Every flow gets seq 2; the even ones seq 1 too, applied (up to 2);
    // the odd ones wait on a gap.
    for (i, id) in IDS.iter().enumerate() {
        if i % 2 == 0 {
            assert_eq!(
                c.receive(&reservation_event(id, 1, 3)).unwrap(),
                Receipt::Accepted
            );
        }
        assert_eq!(
            c.receive(&reservation_event(id, 2, 3)).unwrap(),
            Receipt::Accepted
        );
    }
    // "b" (even) is applied first, and its rows pruned: it keeps its
    // applied seq.
    assert_eq!(drain_flow(&mut c, "b", None, V1).applied, 2);
    clock.set(T0 + 10_000);
    for (i, id) in IDS.iter().enumerate() {
        let applied = drain_flow(&mut c, id, None, V1).applied;
        let expected = if i % 2 == 0 && *id != "b" { 2 } else { 0 };
        assert_eq!(applied, expected, "{id}");
    }
    // Nothing stored: a refused event (another flow's event id) and an
    // apply that finds nothing make no flow.
    let refused = amount_event("b-1", "a-0", 1, 1, "reserved", 3);
    assert_eq!(c.receive(&refused).unwrap(), Receipt::Conflict);
    assert!(matches!(apply_step(&mut c, "a-0", V1), Step::Idle));
    c.prune_inbox(T0 + 5_000).expect("prune");
    assert!(c
        .inbox_entries(false, InboxScope::Flow(&inbox_flow("b")), 10)
        .unwrap()
        .is_empty());
    let sorted = ids_sorted();
    let expected: Vec<ConsumerFlow> = sorted
        .iter()
        .map(|id| ConsumerFlow {
            producer: ProducerName::default(),
            flow_id: flow(id),
            applied_seq: if at_even_index(id) { 2 } else { 0 },
        })
        .collect();
    assert_eq!(c.consumer_flows_page("", None, 100).unwrap(), expected);
    check_pages(
        &mut |prefix, after, limit| {
            let after = after.cloned().map(InboxFlow::of_default);
            let page = c.consumer_flows_page(prefix, after.as_ref(), limit);
            flow_ids(page.expect("consumer_flows_page"), |f| &f.flow_id)
        },
        &sorted,
    );
    // One row: the listing's, or none.
    let listed = inbox_entries(&mut c);
    assert!(!listed.is_empty());
    for entry in &listed {
        let at = c
            .inbox_entry_at(&entry.envelope.inbox_flow(), entry.envelope.seq)
            .unwrap();
        assert_eq!(at.as_ref(), Some(entry));
    }
    assert_eq!(c.inbox_entry_at(&inbox_flow("a-2"), seq(1)).unwrap(), None);
    assert_eq!(c.inbox_entry_at(&inbox_flow("b"), seq(1)).unwrap(), None);
    assert_eq!(c.inbox_entry_at(&inbox_flow("zz"), seq(1)).unwrap(), None);
    // One row by event id: the listing's, wherever its flow and seq; none
    // for an unknown id, or one pruned to its fingerprint ("b"'s).
    for entry in &listed {
        let of = c
            .inbox_entry_of_event(&entry.envelope.producer, &entry.envelope.event_id)
            .unwrap();
        assert_eq!(of.as_ref(), Some(entry));
    }
    let sent = reservation_event("a-2", 2, 3);
    let stored = c
        .inbox_entry_of_event(&sent.producer, &sent.event_id)
        .unwrap()
        .expect("a stored event id");
    assert_eq!(
        (&stored.envelope.flow_id, stored.envelope.seq),
        (&flow("a-2"), seq(2))
    );
    assert_eq!(stored.envelope.body(), sent.body());
    assert_eq!(
        c.inbox_entry_of_event(&ProducerName::default(), &event_id("zz-1"))
            .unwrap(),
        None
    );
    assert_eq!(
        c.inbox_entry_of_event(&ProducerName::default(), &event_id("b-1"))
            .unwrap(),
        None
    );
    // One flow's projection is the listing's, or the empty one.
    for id in IDS.iter().chain(&["zz"]) {
        let expected = projection(&mut c, id).unwrap_or_else(|| Projection::empty(flow(id)));
        assert_eq!(c.projection(&inbox_flow(id)).unwrap(), expected, "{id}");
    }
    assert_eq!(
        c.projection(&inbox_flow("b")).unwrap().state,
        FlowState::Confirmed
    );
}
