//! The `otel` feature: an event's trace context to and from OpenTelemetry's,
//! through `tracing-opentelemetry`.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::Context;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::TraceParent;

/// The OpenTelemetry context whose (remote) parent is `traceparent`.
pub fn context_of(traceparent: &TraceParent) -> Context {
    let trace_id = TraceId::from_hex(traceparent.trace_id()).expect("32 hex digits");
    let span_id = SpanId::from_hex(traceparent.parent_id()).expect("16 hex digits");
    let flags = TraceFlags::new(traceparent.flags());
    let remote = SpanContext::new(trace_id, span_id, flags, true, TraceState::default());
    Context::new().with_remote_span_context(remote)
}

/// The traceparent of the span in `cx`, when it has a valid one.
pub fn traceparent_in(cx: &Context) -> Option<TraceParent> {
    let span = cx.span();
    let span_context = span.span_context();
    if !span_context.is_valid() {
        return None;
    }
    TraceParent::from_ids(
        u128::from_be_bytes(span_context.trace_id().to_bytes()),
        u64::from_be_bytes(span_context.span_id().to_bytes()),
        span_context.trace_flags().to_u8(),
    )
}

/// The current trace context: OpenTelemetry's current context, else the
/// current `tracing` span's under the OpenTelemetry layer.
pub fn current() -> Option<TraceParent> {
    traceparent_in(&Context::current())
        .or_else(|| traceparent_in(&tracing::Span::current().context()))
}

/// Makes `span` (not yet entered) a child of `traceparent`. A span the
/// OpenTelemetry layer does not see, or one already started, is left as
/// it is.
pub fn set_parent(span: &tracing::Span, traceparent: &TraceParent) {
    let _ = span.set_parent(context_of(traceparent));
}
