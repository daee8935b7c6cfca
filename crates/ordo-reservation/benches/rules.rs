//! Micro-benchmarks of the reservation domain's decisions: payload
//! decoding and the apply and advance decisions.
//!
//! Run with `cargo bench -p ordo-reservation`; `cargo test -p
//! ordo-reservation --benches` runs each benchmark once, as a smoke test.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use ordo_core::{Envelope, FlowId, SchemaVersion};
use ordo_reservation::rules::{decide_advance, decide_apply, decode_quantity, AdvanceDecision};
use ordo_reservation::{AdvanceRequest, ApplyOptions, FlowRecord, FlowState, Projection, Quantity};

/// A typical stored event, in canonical form.
const TYPICAL: &str = r#"{"event_id":"reservation-7f3a9c2e-41d8-2","flow_id":"reservation-7f3a9c2e-41d8","payload":{"amount":5},"schema_version":1,"seq":2,"type":"confirmed"}"#;

/// The same event in schema 2.
const TYPICAL_V2: &str = r#"{"event_id":"reservation-7f3a9c2e-41d8-2","flow_id":"reservation-7f3a9c2e-41d8","payload":{"units":5},"schema_version":2,"seq":2,"type":"confirmed"}"#;

fn payload(c: &mut Criterion) {
    let v1 = Envelope::parse(TYPICAL.as_bytes()).unwrap();
    let v2 = Envelope::parse(TYPICAL_V2.as_bytes()).unwrap();
    let options_v1 = ApplyOptions::default();
    let options_v2 = ApplyOptions { support_v2: true };
    let flow_id = FlowId::new("reservation-7f3a9c2e-41d8").unwrap();
    let quantity = Quantity::new(5).unwrap();
    let reserved = Projection {
        producer: ordo_core::ProducerName::default(),
        flow_id: flow_id.clone(),
        state: FlowState::Reserved,
        quantity: Some(quantity),
        applied_seq: 1,
    };
    assert_eq!(decode_quantity(&v1, options_v1), Ok(quantity));
    assert_eq!(decode_quantity(&v2, options_v2), Ok(quantity));
    assert!(decide_apply(&reserved, &v1, options_v1).is_ok());
    let record = FlowRecord {
        flow_id: flow_id.clone(),
        state: FlowState::Reserved,
        quantity: Some(quantity),
        last_seq: 1,
    };
    let request =
        AdvanceRequest::new(flow_id, 1, FlowState::Confirmed, None, SchemaVersion::V1).unwrap();
    assert!(matches!(
        decide_advance(&record, &request),
        Ok(AdvanceDecision::Commit { .. })
    ));

    let mut group = c.benchmark_group("payload");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    group.bench_function("decode_quantity/schema_1", |b| {
        b.iter(|| decode_quantity(black_box(&v1), black_box(options_v1)))
    });
    group.bench_function("decode_quantity/schema_2", |b| {
        b.iter(|| decode_quantity(black_box(&v2), black_box(options_v2)))
    });
    group.bench_function("decide_apply/reserved_to_confirmed", |b| {
        b.iter(|| decide_apply(black_box(&reserved), black_box(&v1), black_box(options_v1)))
    });
    group.bench_function("decide_advance/reserved_to_confirmed", |b| {
        b.iter(|| decide_advance(black_box(&record), black_box(&request)))
    });
    group.finish();
}

criterion_group!(benches, payload);
criterion_main!(benches);
