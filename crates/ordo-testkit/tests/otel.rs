//! The `otel` feature: an append inside an OpenTelemetry span takes its
//! trace context, and the relay's, the inbox's and the applier's spans of
//! the event are children of it.

use opentelemetry::trace::{SpanId, TraceContextExt, TraceId, TracerProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use ordo_core::{ApplyContext, Envelope, OutboxTx, RelayOptions, SchemaVersion, SystemClock};
use ordo_core::{FlowId, StoreError, Verdict};
use ordo_sqlite::rusqlite::Connection;
use ordo_sqlite::{ConsumerDb, ProducerDb, Schema};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

#[test]
fn an_append_takes_the_current_context_and_each_events_spans_follow_it() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("ordo-test"));
    let subscriber = tracing_subscriber::registry().with(layer);
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema::new("app").unwrap();
    let mut producer = ProducerDb::open(dir.path().join("p.db"), &schema).unwrap();
    let mut consumer = ConsumerDb::open(dir.path().join("c.db"), &schema).unwrap();
    let (event, root) = tracing::subscriber::with_default(subscriber, || {
        let root = tracing::info_span!("place_order");
        let event = root.in_scope(|| {
            let flow = FlowId::new("f").unwrap();
            let payload = serde_json::json!({});
            producer
                .write(|tx| tx.append(&flow, "noted", SchemaVersion::V1, &payload))
                .unwrap()
        });
        let root_cx = root.context().span().span_context().clone();
        drop(root);
        ordo_core::relay(
            &mut producer,
            &mut consumer,
            &RelayOptions::default(),
            &SystemClock,
        )
        .unwrap();
        let mut handler = |_: &mut ApplyContext<'_, Connection>, _: &Envelope| {
            Ok::<_, StoreError>(Verdict::Apply)
        };
        ordo_core::process_all(&mut consumer, None, &mut handler, 16).unwrap();
        (event, root_cx)
    });
    let traceparent = event
        .traceparent()
        .expect("the append took the current context");
    assert_eq!(
        TraceId::from_hex(traceparent.trace_id()).unwrap(),
        root.trace_id()
    );
    assert_eq!(
        SpanId::from_hex(traceparent.parent_id()).unwrap(),
        root.span_id()
    );
    let spans = exporter.get_finished_spans().unwrap();
    for name in ["relay_event", "receive_event", "apply_event"] {
        let span = spans.iter().find(|s| s.name == name);
        let span = span.unwrap_or_else(|| panic!("no {name} span"));
        assert_eq!(span.span_context.trace_id(), root.trace_id(), "{name}");
        assert_eq!(span.parent_span_id, root.span_id(), "{name}");
    }
}
