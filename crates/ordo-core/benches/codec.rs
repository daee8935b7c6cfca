//! Micro-benchmarks of the envelope codec: strict parsing, the canonical
//! body and its hash, the refusal of malformed input, and the cost of an
//! unarmed crash point.
//!
//! Run with `cargo bench -p ordo-core`; each benchmark measures for 2 s after
//! a 1 s warm-up, so the whole run takes about a minute. `cargo test -p
//! ordo-core --benches` runs each benchmark once, as a smoke test.

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use ordo_core::crash::{self, CRASH_POINT_ENV};
use ordo_core::envelope::{BodyHash, MalformedEnvelope};
use ordo_core::Envelope;
use sha2::{Digest, Sha256};

/// A typical stored event, in canonical form (keys sorted, as `body()` writes it).
const TYPICAL: &str = r#"{"event_id":"reservation-7f3a9c2e-41d8-2","flow_id":"reservation-7f3a9c2e-41d8","payload":{"amount":5},"schema_version":1,"seq":2,"type":"confirmed"}"#;

/// The same event with its keys in the protocol's (non-canonical) order.
const TYPICAL_UNSORTED: &str = r#"{"event_id":"reservation-7f3a9c2e-41d8-2","flow_id":"reservation-7f3a9c2e-41d8","seq":2,"schema_version":1,"type":"confirmed","payload":{"amount":5}}"#;

/// A repeated key (`seq`) inside the envelope: refused by the JSON reader.
const REPEATED_KEY: &str = r#"{"event_id":"reservation-7f3a9c2e-41d8-2","flow_id":"reservation-7f3a9c2e-41d8","payload":{"amount":5},"schema_version":1,"seq":2,"seq":3,"type":"confirmed"}"#;

/// A seq of 0: valid JSON, refused by the field rules.
const BAD_SEQ: &str = r#"{"event_id":"reservation-7f3a9c2e-41d8-2","flow_id":"reservation-7f3a9c2e-41d8","payload":{"amount":5},"schema_version":1,"seq":0,"type":"confirmed"}"#;

/// An envelope whose payload has 20 keys of mixed types, every object's keys
/// written in reverse canonical order.
fn large_unsorted() -> String {
    let mut payload = Vec::new();
    for i in (0..20).rev() {
        let value = match i % 5 {
            0 => format!("{}", i * 1_000 + 7),
            1 => format!("\"value-{i}-lorem-ipsum\""),
            2 => format!("{}.25", i),
            3 => (if i % 2 == 0 { "true" } else { "false" }).to_owned(),
            _ => format!("[{i},\"x\",null]"),
        };
        payload.push(format!("\"field_{i:02}\":{value}"));
    }
    format!(
        r#"{{"type":"confirmed","seq":2,"schema_version":1,"payload":{{{}}},"flow_id":"reservation-7f3a9c2e-41d8","event_id":"reservation-7f3a9c2e-41d8-2"}}"#,
        payload.join(",")
    )
}

fn configure(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(1));
}

fn parse(c: &mut Criterion) {
    let large = large_unsorted();
    let inputs = [
        ("typical", TYPICAL.to_owned()),
        ("typical_unsorted", TYPICAL_UNSORTED.to_owned()),
        ("payload_20_keys_unsorted", large),
    ];
    let mut group = c.benchmark_group("parse");
    configure(&mut group);
    for (name, text) in &inputs {
        Envelope::parse(text.as_bytes()).expect("the fixture is a valid envelope");
        let id = format!("{name}/{}B", text.len());
        group.bench_function(id, |b| {
            b.iter(|| Envelope::parse(black_box(text.as_bytes())))
        });
        // The same envelope as the stores keep it, read back.
        let stored = Envelope::parse(text.as_bytes()).unwrap().stored_text();
        group.bench_function(format!("from_stored/{name}/{}B", stored.len()), |b| {
            b.iter(|| Envelope::from_stored(black_box(&stored)))
        });
    }
    group.finish();
}

fn canonical_body(c: &mut Criterion) {
    let typical = Envelope::parse(TYPICAL.as_bytes()).unwrap();
    let large = Envelope::parse(large_unsorted().as_bytes()).unwrap();
    assert_eq!(typical.body(), TYPICAL, "the fixture is canonical");
    let mut group = c.benchmark_group("body");
    configure(&mut group);
    for (name, envelope) in [("typical", &typical), ("payload_20_keys", &large)] {
        let body = envelope.body();
        group.bench_function(format!("body/{name}"), |b| {
            b.iter(|| black_box(envelope).body())
        });
        group.bench_function(format!("body_hash/{name}"), |b| {
            b.iter(|| black_box(envelope).body_hash())
        });
        group.bench_function(format!("stored_text/{name}"), |b| {
            b.iter(|| black_box(envelope).stored_text())
        });
        group.bench_function(format!("sha256_hex_only/{name}/{}B", body.len()), |b| {
            b.iter(|| BodyHash::of(black_box(&body)))
        });
        if name == "typical" {
            // Baseline: the digest alone, without the hex encoding of BodyHash::of.
            group.bench_function(format!("sha256_digest_only/{name}/{}B", body.len()), |b| {
                b.iter(|| Sha256::digest(black_box(body.as_bytes())))
            });
        }
    }
    group.finish();
}

fn malformed(c: &mut Criterion) {
    assert!(matches!(
        Envelope::parse(REPEATED_KEY.as_bytes()),
        Err(MalformedEnvelope::NotJson { .. })
    ));
    assert!(matches!(
        Envelope::parse(BAD_SEQ.as_bytes()),
        Err(MalformedEnvelope::InvalidField { field: "seq", .. })
    ));
    let mut group = c.benchmark_group("malformed");
    configure(&mut group);
    group.bench_function("repeated_key", |b| {
        b.iter(|| Envelope::parse(black_box(REPEATED_KEY.as_bytes())))
    });
    group.bench_function("bad_seq", |b| {
        b.iter(|| Envelope::parse(black_box(BAD_SEQ.as_bytes())))
    });
    group.finish();
}

/// An unarmed crash point, as every production path passes one: a load of a
/// once-initialised value and a comparison with `None`.
fn crash_point(c: &mut Criterion) {
    assert!(
        std::env::var_os(CRASH_POINT_ENV).is_none(),
        "{CRASH_POINT_ENV} is set: this benchmark measures an unarmed point"
    );
    // The first call reads the environment; the measured calls do not.
    crash::point(crash::RELAY_BEFORE_RECEIVE);
    let mut group = c.benchmark_group("crash_point");
    configure(&mut group);
    group.bench_function("unarmed/relay.before_receive", |b| {
        b.iter(|| crash::point(black_box(crash::RELAY_BEFORE_RECEIVE)))
    });
    group.finish();
}

criterion_group!(benches, parse, canonical_body, malformed, crash_point);
criterion_main!(benches);
