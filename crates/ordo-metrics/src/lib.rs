//! # ordo-metrics
//!
//! Every metric of HTTP.md's Metrics table, on one Prometheus registry per
//! process: the inbox server's, the applier's and the relay's, so that
//! `serve`, `apply --follow` and `relay --follow` expose the same names on
//! either backend, whatever transport serves them.
//!
//! Labelled counters with a closed set of label values (`receipt`, `kind`)
//! start at zero for every value, so that their names appear in the first
//! scrape; `status` starts with `200`, and `reason` with the codes the
//! caller names ([`Metrics::expect_block_reasons`]).
//!
//! Invariant: this crate only counts. It reads no store, knows no transport
//! and serves nothing by itself; the caller updates the gauges from its own
//! status reads ([`Metrics::set_inbox`], [`Metrics::set_outbox`]) and
//! chooses where the exposition is served (ordo-http's `metrics_router`).

#![warn(missing_docs)]

use ordo_core::ops::{ConsumerStatus, ProducerStatus};
use ordo_core::Receipt;
use prometheus::{
    exponential_buckets, Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec,
    IntGauge, Opts, Registry, TextEncoder,
};

/// The content type of the text exposition format, version 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The label values of `ordo_relay_errors_total{kind}`.
pub const ERROR_KINDS: [&str; 5] = ["busy", "connection", "timeout", "http", "other"];

/// The metrics of one process. Every field is registered in
/// [`Metrics::registry`]; update them directly (they are cheap to clone
/// and safe to share between threads).
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// `ordo_inbox_received_total{producer, receipt}`: receipts answered
    /// by `serve`, by the producer whose namespace the event is in.
    pub inbox_received_total: IntCounterVec,
    /// `ordo_http_requests_total{status}`: responses by status code.
    pub http_requests_total: IntCounterVec,
    /// `ordo_http_request_seconds`: time from a request's head to its response.
    pub http_request_seconds: Histogram,
    /// `ordo_inbox_pending`: stored events waiting for apply.
    pub inbox_pending: IntGauge,
    /// `ordo_inbox_blocked`: blocked inbox rows.
    pub inbox_blocked: IntGauge,
    /// `ordo_inbox_gap_flows`: flows waiting on a missing seq.
    pub inbox_gap_flows: IntGauge,
    /// `ordo_apply_applied_total`: events applied (committed).
    pub apply_applied_total: IntCounter,
    /// `ordo_apply_blocked_total{reason}`: events blocked, by block code.
    pub apply_blocked_total: IntCounterVec,
    /// `ordo_apply_lag_seconds`: from an event's receive to its apply.
    pub apply_lag_seconds: Histogram,
    /// `ordo_outbox_backlog`: events not yet accepted.
    pub outbox_backlog: IntGauge,
    /// `ordo_outbox_oldest_pending_age_seconds`: age of the oldest of them.
    pub outbox_oldest_pending_age_seconds: Gauge,
    /// `ordo_outbox_quarantined`: quarantined events.
    pub outbox_quarantined: IntGauge,
    /// `ordo_outbox_rewound`: of those, quarantined by a receipt of cause
    /// `producer_rewound`.
    pub outbox_rewound: IntGauge,
    /// `ordo_relay_deliveries_total{receipt}`: receipts the relay recorded.
    pub relay_deliveries_total: IntCounterVec,
    /// `ordo_relay_errors_total{kind}`: transient delivery failures by kind
    /// ([`ERROR_KINDS`]).
    pub relay_errors_total: IntCounterVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh registry holding every metric, at zero.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let inbox = InboxMetrics::register(&registry);
        let apply = ApplyMetrics::register(&registry);
        let relay = RelayMetrics::register(&registry);
        let metrics = Metrics {
            inbox_received_total: inbox.received_total,
            http_requests_total: inbox.http_requests_total,
            http_request_seconds: inbox.http_request_seconds,
            inbox_pending: inbox.pending,
            inbox_blocked: inbox.blocked,
            inbox_gap_flows: inbox.gap_flows,
            apply_applied_total: apply.applied_total,
            apply_blocked_total: apply.blocked_total,
            apply_lag_seconds: apply.lag_seconds,
            outbox_backlog: relay.outbox_backlog,
            outbox_oldest_pending_age_seconds: relay.outbox_oldest_pending_age_seconds,
            outbox_quarantined: relay.outbox_quarantined,
            outbox_rewound: relay.outbox_rewound,
            relay_deliveries_total: relay.deliveries_total,
            relay_errors_total: relay.errors_total,
            registry,
        };
        metrics.start_at_zero();
        metrics
    }

    fn start_at_zero(&self) {
        for receipt in [Receipt::Accepted, Receipt::Duplicate, Receipt::Conflict] {
            self.inbox_received_total
                .with_label_values(&[ordo_core::ProducerName::DEFAULT, receipt.as_str()]);
            self.relay_deliveries_total
                .with_label_values(&[receipt.as_str()]);
        }
        for kind in ERROR_KINDS {
            self.relay_errors_total.with_label_values(&[kind]);
        }
        self.http_requests_total.with_label_values(&["200"]);
    }

    /// Lists `codes` in `ordo_apply_blocked_total` at zero, so that the
    /// name appears before the first block (the handler's known codes).
    pub fn expect_block_reasons<'a>(&self, codes: impl IntoIterator<Item = &'a str>) {
        for code in codes {
            self.apply_blocked_total.with_label_values(&[code]);
        }
    }

    /// The registry, to register metrics of the caller's own.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Counts one receipt answered by the inbox for an event of `producer`.
    pub fn count_received(&self, producer: &str, receipt: Receipt) {
        self.inbox_received_total
            .with_label_values(&[producer, receipt.as_str()])
            .inc();
    }

    /// Counts one receipt recorded by the relay.
    pub fn count_delivery(&self, receipt: Receipt) {
        self.relay_deliveries_total
            .with_label_values(&[receipt.as_str()])
            .inc();
    }

    /// Sets the inbox gauges from a status read.
    pub fn set_inbox(&self, status: &ConsumerStatus) {
        let blocked: u64 = status.blocked.values().sum();
        self.inbox_pending.set(saturating_i64(status.pending));
        self.inbox_blocked.set(saturating_i64(blocked));
        self.inbox_gap_flows.set(saturating_i64(status.gaps_total));
    }

    /// Sets the outbox gauges from a status read at `now_ms`.
    pub fn set_outbox(&self, status: &ProducerStatus, now_ms: i64) {
        self.outbox_backlog.set(saturating_i64(status.backlog));
        self.outbox_quarantined
            .set(saturating_i64(status.quarantined));
        self.outbox_rewound.set(saturating_i64(status.rewound));
        let age_ms = status
            .oldest_pending_created_at_ms
            .map_or(0, |created_ms| now_ms.saturating_sub(created_ms).max(0));
        self.outbox_oldest_pending_age_seconds
            .set(age_ms as f64 / 1000.0);
    }

    /// The text exposition (format 0.0.4) of every metric.
    pub fn encode(&self) -> String {
        let mut buffer = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buffer)
            .expect("the text encoder writes to memory");
        String::from_utf8(buffer).expect("the text exposition is UTF-8")
    }
}

/// The inbox server's metrics: its receipts, its HTTP responses and the
/// inbox gauges.
struct InboxMetrics {
    received_total: IntCounterVec,
    http_requests_total: IntCounterVec,
    http_request_seconds: Histogram,
    pending: IntGauge,
    blocked: IntGauge,
    gap_flows: IntGauge,
}

impl InboxMetrics {
    /// Registers each metric in `registry`, in field order.
    fn register(registry: &Registry) -> InboxMetrics {
        InboxMetrics {
            received_total: register(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "ordo_inbox_received_total",
                        "Receipts answered by the inbox, by producer and receipt.",
                    ),
                    &["producer", "receipt"],
                )
                .expect("valid metric"),
            ),
            http_requests_total: counter_vec(
                registry,
                "ordo_http_requests_total",
                "HTTP responses, by status code.",
                "status",
            ),
            http_request_seconds: histogram(
                registry,
                "ordo_http_request_seconds",
                "Time from a request's head to its response, in seconds.",
                prometheus::DEFAULT_BUCKETS.to_vec(),
            ),
            pending: int_gauge(
                registry,
                "ordo_inbox_pending",
                "Stored events waiting for apply.",
            ),
            blocked: int_gauge(registry, "ordo_inbox_blocked", "Blocked inbox rows."),
            gap_flows: int_gauge(
                registry,
                "ordo_inbox_gap_flows",
                "Flows waiting on a missing seq.",
            ),
        }
    }
}

/// The applier's metrics.
struct ApplyMetrics {
    applied_total: IntCounter,
    blocked_total: IntCounterVec,
    lag_seconds: Histogram,
}

impl ApplyMetrics {
    /// Registers each metric in `registry`, in field order.
    fn register(registry: &Registry) -> ApplyMetrics {
        ApplyMetrics {
            applied_total: int_counter(
                registry,
                "ordo_apply_applied_total",
                "Events applied (committed).",
            ),
            blocked_total: counter_vec(
                registry,
                "ordo_apply_blocked_total",
                "Events blocked by the handler, by block code.",
                "reason",
            ),
            lag_seconds: histogram(
                registry,
                "ordo_apply_lag_seconds",
                "Time from an event's receive to its apply, in seconds.",
                exponential_buckets(0.001, 4.0, 12).expect("valid buckets"),
            ),
        }
    }
}

/// The relay's metrics: the outbox gauges and its delivery counters.
struct RelayMetrics {
    outbox_backlog: IntGauge,
    outbox_oldest_pending_age_seconds: Gauge,
    outbox_quarantined: IntGauge,
    outbox_rewound: IntGauge,
    deliveries_total: IntCounterVec,
    errors_total: IntCounterVec,
}

impl RelayMetrics {
    /// Registers each metric in `registry`, in field order.
    fn register(registry: &Registry) -> RelayMetrics {
        RelayMetrics {
            outbox_backlog: int_gauge(
                registry,
                "ordo_outbox_backlog",
                "Outbox events not yet accepted.",
            ),
            outbox_oldest_pending_age_seconds: gauge(
                registry,
                "ordo_outbox_oldest_pending_age_seconds",
                "Age of the oldest outbox event not yet accepted, in seconds.",
            ),
            outbox_quarantined: int_gauge(
                registry,
                "ordo_outbox_quarantined",
                "Quarantined outbox events.",
            ),
            outbox_rewound: int_gauge(
                registry,
                "ordo_outbox_rewound",
                "Outbox events quarantined because their producer store was rewound (restored from an older backup).",
            ),
            deliveries_total: counter_vec(
                registry,
                "ordo_relay_deliveries_total",
                "Receipts the relay recorded, by receipt.",
                "receipt",
            ),
            errors_total: counter_vec(
                registry,
                "ordo_relay_errors_total",
                "Transient delivery failures, by kind.",
                "kind",
            ),
        }
    }
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn register<M: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("each metric name is registered once");
    metric
}

fn counter_vec(registry: &Registry, name: &str, help: &str, label: &str) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid metric");
    register(registry, metric)
}

fn int_counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    register(registry, IntCounter::new(name, help).expect("valid metric"))
}

fn int_gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    register(registry, IntGauge::new(name, help).expect("valid metric"))
}

fn gauge(registry: &Registry, name: &str, help: &str) -> Gauge {
    register(registry, Gauge::new(name, help).expect("valid metric"))
}

fn histogram(registry: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(buckets);
    register(registry, Histogram::with_opts(opts).expect("valid metric"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every sample name of HTTP.md's Metrics table.
    const NAMES: [&str; 17] = [
        "ordo_inbox_received_total",
        "ordo_http_requests_total",
        "ordo_http_request_seconds_bucket",
        "ordo_http_request_seconds_count",
        "ordo_inbox_pending",
        "ordo_inbox_blocked",
        "ordo_inbox_gap_flows",
        "ordo_apply_applied_total",
        "ordo_apply_blocked_total",
        "ordo_apply_lag_seconds_bucket",
        "ordo_outbox_backlog",
        "ordo_outbox_oldest_pending_age_seconds",
        "ordo_outbox_quarantined",
        "ordo_outbox_rewound",
        "ordo_relay_deliveries_total",
        "ordo_relay_errors_total",
        "ordo_apply_lag_seconds_sum",
    ];

    #[test]
    fn every_name_is_exposed_from_the_start() {
        let metrics = Metrics::new();
        metrics.expect_block_reasons(["invalid_payload"]);
        let text = metrics.encode();
        for name in NAMES {
            assert!(
                text.lines().any(|l| l.starts_with(name)),
                "{name} missing:\n{text}"
            );
        }
    }

    #[test]
    fn counts_and_gauges_show_in_the_exposition() {
        let metrics = Metrics::new();
        metrics.count_received("orders", Receipt::Duplicate);
        metrics.count_delivery(Receipt::Conflict);
        metrics
            .relay_errors_total
            .with_label_values(&["busy"])
            .inc();
        metrics.set_outbox(
            &ProducerStatus {
                backlog: 3,
                oldest_pending_created_at_ms: Some(1_000),
                quarantined: 1,
                rewound: 1,
                backing_off: 0,
            },
            3_500,
        );
        let text = metrics.encode();
        for line in [
            "ordo_inbox_received_total{producer=\"orders\",receipt=\"duplicate\"} 1",
            "ordo_inbox_received_total{producer=\"default\",receipt=\"accepted\"} 0",
            "ordo_relay_deliveries_total{receipt=\"conflict\"} 1",
            "ordo_relay_errors_total{kind=\"busy\"} 1",
            "ordo_outbox_backlog 3",
            "ordo_outbox_oldest_pending_age_seconds 2.5",
            "ordo_outbox_quarantined 1",
            "ordo_outbox_rewound 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
    }
}
