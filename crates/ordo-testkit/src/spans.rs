//! Span fields as a test sees them: a `tracing` layer that keeps the name
//! and the recorded fields of every span, so that a test can tell which
//! spans carried which `traceparent`.
//!
//! A field declared `tracing::field::Empty` and never recorded is absent.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One span as it was created and recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedSpan {
    /// The span's name.
    pub name: &'static str,
    /// Each recorded field's value, as `Debug` writes it (a string
    /// without quotes).
    pub fields: BTreeMap<String, String>,
}

impl CapturedSpan {
    /// The value of `field`, if it was recorded.
    pub fn field(&self, field: &str) -> Option<&str> {
        self.fields.get(field).map(String::as_str)
    }
}

/// A layer keeping every span it sees, shared by its clones.
#[derive(Debug, Clone, Default)]
pub struct SpanCapture {
    spans: Arc<Mutex<Vec<CapturedSpan>>>,
}

/// Where a span's record is in [`SpanCapture`]'s list.
struct Slot(usize);

impl SpanCapture {
    /// An empty capture.
    pub fn new() -> SpanCapture {
        SpanCapture::default()
    }

    /// Runs `f` with a subscriber of this capture alone as the default of
    /// this thread, and returns what `f` returned.
    pub fn during<R>(&self, f: impl FnOnce() -> R) -> R {
        anchor();
        let subscriber = tracing_subscriber::registry().with(self.clone());
        tracing::subscriber::with_default(subscriber, f)
    }

    /// The capture of every thread of this process: installed as the
    /// global default the first time (it fails if another global
    /// subscriber was installed before), shared afterwards.
    pub fn global() -> SpanCapture {
        static GLOBAL: OnceLock<SpanCapture> = OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                anchor();
                let capture = SpanCapture::new();
                let subscriber = tracing_subscriber::registry().with(capture.clone());
                tracing::subscriber::set_global_default(subscriber)
                    .expect("no other global subscriber");
                capture
            })
            .clone()
    }

    /// Every span seen so far, in creation order.
    pub fn spans(&self) -> Vec<CapturedSpan> {
        self.spans.lock().expect("the capture's lock").clone()
    }

    /// The spans named `name`, in creation order.
    pub fn named(&self, name: &str) -> Vec<CapturedSpan> {
        let spans = self.spans();
        spans.into_iter().filter(|s| s.name == name).collect()
    }

    /// `(event_id, traceparent)` of each span named `name`, in creation
    /// order (`None`: no traceparent recorded).
    pub fn traceparents(&self, name: &str) -> Vec<(String, Option<String>)> {
        let spans = self.named(name);
        let pair = |s: &CapturedSpan| {
            let event_id = s.field("event_id").unwrap_or_default().to_owned();
            (event_id, s.field("traceparent").map(str::to_owned))
        };
        spans.iter().map(pair).collect()
    }
}

/// Keeps a second dispatcher registered for the life of the process, so
/// that a callsite's interest is always asked of every registered one.
///
/// tracing caches each callsite's interest, process-wide, when the
/// callsite is first hit. While exactly one dispatcher is registered it
/// asks only the hitting thread's default: a thread of another test,
/// without a subscriber, would cache "never" while a capture is running,
/// and the capture would miss that span for good. With this anchor, never
/// interested in a span itself but answering "sometimes", the interest is
/// asked of all registered dispatchers, the running capture's among them.
fn anchor() {
    static ANCHOR: OnceLock<tracing::Dispatch> = OnceLock::new();
    ANCHOR.get_or_init(|| tracing::Dispatch::new(Anchor));
}

/// The subscriber of [`anchor`]: interested in every callsite, enabled
/// for none.
struct Anchor;

impl Subscriber for Anchor {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }

    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        false
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, _: &tracing::Event<'_>) {}

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Writes each visited field into a span's record.
struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S> Layer<S> for SpanCapture
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let name = attrs.metadata().name();
        let slot = {
            let mut spans = self.spans.lock().expect("the capture's lock");
            spans.push(CapturedSpan { name, fields });
            spans.len() - 1
        };
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Slot(slot));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let Some(Slot(slot)) = span.extensions().get::<Slot>().map(|s| Slot(s.0)) else {
            return;
        };
        let mut spans = self.spans.lock().expect("the capture's lock");
        values.record(&mut Fields(&mut spans[slot].fields));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A span of a callsite no other test hits.
    fn fresh_span() -> tracing::Span {
        tracing::info_span!("spans_test_fresh", event_id = "e")
    }

    /// tracing caches a callsite's interest process-wide when it is first
    /// hit; with one dispatcher registered it asks only the hitting
    /// thread's, so a thread without a subscriber (another test's) would
    /// make the span invisible to every capture from then on.
    #[test]
    fn a_span_first_made_by_a_thread_without_a_subscriber_is_still_captured() {
        let capture = SpanCapture::new();
        capture.during(|| {
            std::thread::spawn(|| drop(fresh_span())).join().unwrap();
            drop(fresh_span());
        });
        assert_eq!(capture.named("spans_test_fresh").len(), 1);
    }
}
