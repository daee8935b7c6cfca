//! # ordo-metrics
//!
//! Every metric of HTTP.md's Metrics table, on one Prometheus registry per
//! process: the inbox server's, the applier's and the relay's, so that
//! `serve`, `apply --follow` and `relay --follow` expose the same names on
//! either backend, whatever transport serves them.
//!
//! Inbox metrics carry a `producer` label (the producer whose namespace the
//! events are in), outbox and relay metrics a `destination` label (the
//! destination the relay delivers to). Both are validated names
//! (`[a-z][a-z0-9_-]{0,63}`) that a store records, so the number of series
//! is bounded by the producers a consumer store holds rows of and the
//! destinations a producer store has.
//!
//! Labelled counters with a closed set of label values (`receipt`, `kind`)
//! start at zero for every value, so that their names appear in the first
//! scrape: the inbox's for the default producer, the relay's for the
//! destination the caller names ([`Metrics::expect_destination`]);
//! `status` starts with `200`, and `reason` with the codes the caller names
//! ([`Metrics::expect_block_reasons`]). The inbox gauges start at zero for
//! the default producer.
//!
//! The effect executor's metrics (EFFECTS.md): the gauge `ordo_effects{state}`
//! set from the store's counts ([`Metrics::set_effects`]), and the counter
//! `ordo_effect_attempts_total{name, outcome}` of the calls made
//! ([`Metrics::count_effect_attempt`]), listed at zero for every outcome of
//! the names an executor runs ([`Metrics::expect_effect`]).
//!
//! Invariant: this crate only counts. It reads no store, knows no transport
//! and serves nothing by itself; the caller updates the gauges from its own
//! status reads ([`Metrics::set_inbox`], [`Metrics::set_outbox`]) and
//! chooses where the exposition is served (ordo-http's `metrics_router`).

#![warn(missing_docs)]

use std::collections::BTreeSet;

use ordo_core::effect::{EffectCounts, EffectState};
use ordo_core::ops::{ConsumerStatus, ProducerInbox, ProducerStatus};
use ordo_core::{ProducerName, Receipt};
use prometheus::core::Collector;
use prometheus::{
    exponential_buckets, Encoder, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The content type of the text exposition format, version 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The label values of `ordo_relay_errors_total{kind}`.
pub const ERROR_KINDS: [&str; 5] = ["busy", "connection", "timeout", "http", "other"];

/// The label values of `ordo_effect_attempts_total{outcome}`: what a call
/// answered.
pub const EFFECT_OUTCOMES: [&str; 4] = ["succeeded", "retry", "failed", "unknown"];

/// The receipts a delivery or a reception records.
const RECEIPTS: [Receipt; 3] = [Receipt::Accepted, Receipt::Duplicate, Receipt::Conflict];

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
    /// `ordo_inbox_pending{producer}`: stored events waiting for apply.
    pub inbox_pending: IntGaugeVec,
    /// `ordo_inbox_blocked{producer}`: blocked inbox rows.
    pub inbox_blocked: IntGaugeVec,
    /// `ordo_inbox_gap_flows{producer}`: flows waiting on a missing seq.
    pub inbox_gap_flows: IntGaugeVec,
    /// `ordo_apply_applied_total`: events applied (committed).
    pub apply_applied_total: IntCounter,
    /// `ordo_apply_blocked_total{reason}`: events blocked, by block code.
    pub apply_blocked_total: IntCounterVec,
    /// `ordo_apply_lag_seconds`: from an event's receive to its apply.
    pub apply_lag_seconds: Histogram,
    /// `ordo_outbox_backlog{destination}`: events the destination has not
    /// accepted yet.
    pub outbox_backlog: IntGaugeVec,
    /// `ordo_outbox_oldest_pending_age_seconds{destination}`: age of the
    /// oldest of them.
    pub outbox_oldest_pending_age_seconds: GaugeVec,
    /// `ordo_outbox_quarantined{destination}`: events quarantined there.
    pub outbox_quarantined: IntGaugeVec,
    /// `ordo_outbox_rewound{destination}`: of those, quarantined by a
    /// receipt of cause `producer_rewound`.
    pub outbox_rewound: IntGaugeVec,
    /// `ordo_relay_deliveries_total{destination, receipt}`: receipts the
    /// relay recorded.
    pub relay_deliveries_total: IntCounterVec,
    /// `ordo_relay_errors_total{destination, kind}`: transient delivery
    /// failures by kind ([`ERROR_KINDS`]).
    pub relay_errors_total: IntCounterVec,
    /// `ordo_effects{state}`: effect intents by state.
    pub effects: IntGaugeVec,
    /// `ordo_effect_attempts_total{name, outcome}`: calls an effect
    /// executor made, by effect name and answer ([`EFFECT_OUTCOMES`]).
    pub effect_attempts_total: IntCounterVec,
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
        let effects = int_gauge_vec(
            &registry,
            "ordo_effects",
            "Effect intents in the consumer store, by state.",
            "state",
        );
        let effect_attempts_total = counter_vec(
            &registry,
            "ordo_effect_attempts_total",
            "Calls the effect executor made, by effect name and outcome.",
            &["name", "outcome"],
        );
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
            effects,
            effect_attempts_total,
            registry,
        };
        metrics.start_at_zero();
        metrics
    }

    fn start_at_zero(&self) {
        let producer = ProducerName::DEFAULT;
        for receipt in RECEIPTS {
            self.inbox_received_total
                .with_label_values(&[producer, receipt.as_str()]);
        }
        self.set_producer(producer, ProducerInbox::default());
        self.http_requests_total.with_label_values(&["200"]);
    }

    /// Lists `codes` in `ordo_apply_blocked_total` at zero, so that the
    /// name appears before the first block (the handler's known codes).
    pub fn expect_block_reasons<'a>(&self, codes: impl IntoIterator<Item = &'a str>) {
        for code in codes {
            self.apply_blocked_total.with_label_values(&[code]);
        }
    }

    /// Lists the relay counters of `destination` at zero (every receipt
    /// and error kind), so that their names appear before the first
    /// delivery: a relay names the destination it delivers to.
    pub fn expect_destination(&self, destination: &str) {
        for receipt in RECEIPTS {
            self.relay_deliveries_total
                .with_label_values(&[destination, receipt.as_str()]);
        }
        for kind in ERROR_KINDS {
            self.relay_errors_total
                .with_label_values(&[destination, kind]);
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

    /// Counts `n` receipts recorded by the relay of `destination`.
    pub fn count_deliveries(&self, destination: &str, receipt: Receipt, n: u64) {
        self.relay_deliveries_total
            .with_label_values(&[destination, receipt.as_str()])
            .inc_by(n);
    }

    /// Counts one transient failure of `kind` ([`ERROR_KINDS`]) of the
    /// relay of `destination`.
    pub fn count_relay_error(&self, destination: &str, kind: &str) {
        self.relay_errors_total
            .with_label_values(&[destination, kind])
            .inc();
    }

    /// Sets the inbox gauges from a status read, each producer's from its
    /// share; a producer listed before and not in `status` (its rows all
    /// pruned) is set to zero.
    pub fn set_inbox(&self, status: &ConsumerStatus) {
        let listed = label_values(&self.inbox_pending, "producer");
        let absent = listed
            .iter()
            .filter(|name| !status.producers.keys().any(|p| p.as_str() == name.as_str()));
        for producer in absent {
            self.set_producer(producer, ProducerInbox::default());
        }
        for (producer, share) in &status.producers {
            self.set_producer(producer.as_str(), *share);
        }
    }

    fn set_producer(&self, producer: &str, share: ProducerInbox) {
        let labels = [producer];
        let set = |gauge: &IntGaugeVec, value| gauge.with_label_values(&labels).set(value);
        set(&self.inbox_pending, saturating_i64(share.pending));
        set(&self.inbox_blocked, saturating_i64(share.blocked));
        set(&self.inbox_gap_flows, saturating_i64(share.gap_flows));
    }

    /// Sets the outbox gauges of `destination` from its own status read at
    /// `now_ms`.
    pub fn set_outbox(&self, destination: &str, status: &ProducerStatus, now_ms: i64) {
        let labels = [destination];
        let set = |gauge: &IntGaugeVec, value| gauge.with_label_values(&labels).set(value);
        set(&self.outbox_backlog, saturating_i64(status.backlog));
        set(&self.outbox_quarantined, saturating_i64(status.quarantined));
        set(&self.outbox_rewound, saturating_i64(status.rewound));
        let age_ms = status
            .oldest_pending_created_at_ms
            .map_or(0, |created_ms| now_ms.saturating_sub(created_ms).max(0));
        self.outbox_oldest_pending_age_seconds
            .with_label_values(&labels)
            .set(age_ms as f64 / 1000.0);
    }

    /// Lists `ordo_effect_attempts_total` of the effect `name` at zero for
    /// every outcome, and `ordo_effects` at zero for every state, so that
    /// both names appear before the first call: an executor names the
    /// effects it runs.
    pub fn expect_effect(&self, name: &str) {
        for outcome in EFFECT_OUTCOMES {
            self.effect_attempts_total
                .with_label_values(&[name, outcome]);
        }
        for state in EffectState::ALL {
            self.effects.with_label_values(&[state.as_str()]);
        }
    }

    /// Counts one call of the effect `name` that answered `outcome` (one of
    /// [`EFFECT_OUTCOMES`]).
    pub fn count_effect_attempt(&self, name: &str, outcome: &str) {
        self.effect_attempts_total
            .with_label_values(&[name, outcome])
            .inc();
    }

    /// Sets `ordo_effects{state}` from the store's counts.
    pub fn set_effects(&self, counts: &EffectCounts) {
        for state in EffectState::ALL {
            self.effects
                .with_label_values(&[state.as_str()])
                .set(saturating_i64(counts.of(state)));
        }
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

/// The values of `label` among the series `metric` holds.
fn label_values(metric: &impl Collector, label: &str) -> BTreeSet<String> {
    let families = metric.collect();
    let series = families.iter().flat_map(|family| family.get_metric());
    let pairs = series.flat_map(|one| one.get_label());
    pairs
        .filter(|pair| pair.name() == label)
        .map(|pair| pair.value().to_owned())
        .collect()
}

/// The inbox server's metrics: its receipts, its HTTP responses and the
/// inbox gauges.
struct InboxMetrics {
    received_total: IntCounterVec,
    http_requests_total: IntCounterVec,
    http_request_seconds: Histogram,
    pending: IntGaugeVec,
    blocked: IntGaugeVec,
    gap_flows: IntGaugeVec,
}

impl InboxMetrics {
    /// Registers each metric in `registry`, in field order.
    fn register(registry: &Registry) -> InboxMetrics {
        InboxMetrics {
            received_total: counter_vec(
                registry,
                "ordo_inbox_received_total",
                "Receipts answered by the inbox, by producer and receipt.",
                &["producer", "receipt"],
            ),
            http_requests_total: counter_vec(
                registry,
                "ordo_http_requests_total",
                "HTTP responses, by status code.",
                &["status"],
            ),
            http_request_seconds: histogram(
                registry,
                "ordo_http_request_seconds",
                "Time from a request's head to its response, in seconds.",
                prometheus::DEFAULT_BUCKETS.to_vec(),
            ),
            pending: int_gauge_vec(
                registry,
                "ordo_inbox_pending",
                "Stored events waiting for apply, by producer.",
                "producer",
            ),
            blocked: int_gauge_vec(
                registry,
                "ordo_inbox_blocked",
                "Blocked inbox rows, by producer.",
                "producer",
            ),
            gap_flows: int_gauge_vec(
                registry,
                "ordo_inbox_gap_flows",
                "Flows waiting on a missing seq, by producer.",
                "producer",
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
                &["reason"],
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

/// The relay's metrics: the outbox gauges and its delivery counters, by
/// destination.
struct RelayMetrics {
    outbox_backlog: IntGaugeVec,
    outbox_oldest_pending_age_seconds: GaugeVec,
    outbox_quarantined: IntGaugeVec,
    outbox_rewound: IntGaugeVec,
    deliveries_total: IntCounterVec,
    errors_total: IntCounterVec,
}

impl RelayMetrics {
    /// Registers each metric in `registry`, in field order.
    fn register(registry: &Registry) -> RelayMetrics {
        let destination = "destination";
        RelayMetrics {
            outbox_backlog: int_gauge_vec(
                registry,
                "ordo_outbox_backlog",
                "Outbox events the destination has not accepted yet.",
                destination,
            ),
            outbox_oldest_pending_age_seconds: register(
                registry,
                GaugeVec::new(
                    Opts::new(
                        "ordo_outbox_oldest_pending_age_seconds",
                        "Age of the oldest outbox event the destination has not accepted yet, in seconds.",
                    ),
                    &[destination],
                )
                .expect("valid metric"),
            ),
            outbox_quarantined: int_gauge_vec(
                registry,
                "ordo_outbox_quarantined",
                "Outbox events quarantined for the destination.",
                destination,
            ),
            outbox_rewound: int_gauge_vec(
                registry,
                "ordo_outbox_rewound",
                "Outbox events quarantined for the destination because their producer store was rewound (restored from an older backup).",
                destination,
            ),
            deliveries_total: counter_vec(
                registry,
                "ordo_relay_deliveries_total",
                "Receipts the relay recorded, by destination and receipt.",
                &[destination, "receipt"],
            ),
            errors_total: counter_vec(
                registry,
                "ordo_relay_errors_total",
                "Transient delivery failures, by destination and kind.",
                &[destination, "kind"],
            ),
        }
    }
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn register<M: Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("each metric name is registered once");
    metric
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    register(registry, metric)
}

fn int_counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    register(registry, IntCounter::new(name, help).expect("valid metric"))
}

fn int_gauge_vec(registry: &Registry, name: &str, help: &str, label: &str) -> IntGaugeVec {
    let metric = IntGaugeVec::new(Opts::new(name, help), &[label]).expect("valid metric");
    register(registry, metric)
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

    fn has_line(text: &str, line: &str) {
        assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
    }

    fn share(pending: u64, blocked: u64, gap_flows: u64) -> ProducerInbox {
        ProducerInbox {
            pending,
            blocked,
            gap_flows,
        }
    }

    fn status_of(shares: &[(&str, ProducerInbox)]) -> ConsumerStatus {
        let producers = shares
            .iter()
            .map(|(name, share)| (ProducerName::new(*name).unwrap(), *share))
            .collect();
        ConsumerStatus {
            producers,
            ..ConsumerStatus::default()
        }
    }

    #[test]
    fn every_name_is_exposed_once_a_relay_names_its_destination() {
        let metrics = Metrics::new();
        metrics.expect_block_reasons(["invalid_payload"]);
        let fresh = metrics.encode();
        assert!(!fresh.contains("destination="), "{fresh}");
        metrics.expect_destination("default");
        metrics.set_outbox("default", &ProducerStatus::default(), 0);
        let text = metrics.encode();
        for name in NAMES {
            assert!(
                text.lines().any(|l| l.starts_with(name)),
                "{name} missing:\n{text}"
            );
        }
        for line in [
            "ordo_inbox_pending{producer=\"default\"} 0",
            "ordo_inbox_blocked{producer=\"default\"} 0",
            "ordo_inbox_gap_flows{producer=\"default\"} 0",
            "ordo_relay_deliveries_total{destination=\"default\",receipt=\"duplicate\"} 0",
            "ordo_relay_errors_total{destination=\"default\",kind=\"timeout\"} 0",
            "ordo_outbox_oldest_pending_age_seconds{destination=\"default\"} 0",
        ] {
            has_line(&text, line);
        }
    }

    #[test]
    fn counts_and_gauges_show_in_the_exposition_by_destination() {
        let metrics = Metrics::new();
        metrics.expect_destination("billing");
        metrics.count_received("orders", Receipt::Duplicate);
        metrics.count_deliveries("billing", Receipt::Conflict, 2);
        metrics.count_relay_error("billing", "busy");
        metrics.set_outbox(
            "billing",
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
            "ordo_relay_deliveries_total{destination=\"billing\",receipt=\"conflict\"} 2",
            "ordo_relay_deliveries_total{destination=\"billing\",receipt=\"accepted\"} 0",
            "ordo_relay_errors_total{destination=\"billing\",kind=\"busy\"} 1",
            "ordo_outbox_backlog{destination=\"billing\"} 3",
            "ordo_outbox_oldest_pending_age_seconds{destination=\"billing\"} 2.5",
            "ordo_outbox_quarantined{destination=\"billing\"} 1",
            "ordo_outbox_rewound{destination=\"billing\"} 1",
        ] {
            has_line(&text, line);
        }
        assert!(!text.contains("destination=\"default\""), "{text}");
    }

    #[test]
    fn effect_metrics_start_at_zero_for_the_names_run_and_follow_the_counts() {
        let metrics = Metrics::new();
        assert!(!metrics.encode().contains("ordo_effect"));
        metrics.expect_effect("webhook");
        has_line(
            &metrics.encode(),
            "ordo_effect_attempts_total{name=\"webhook\",outcome=\"unknown\"} 0",
        );
        metrics.count_effect_attempt("webhook", "retry");
        let mut counts = EffectCounts::default();
        counts.count("succeeded", 3).unwrap();
        counts.count("outcome_unknown", 1).unwrap();
        metrics.set_effects(&counts);
        let text = metrics.encode();
        for line in [
            "ordo_effect_attempts_total{name=\"webhook\",outcome=\"retry\"} 1",
            "ordo_effects{state=\"succeeded\"} 3",
            "ordo_effects{state=\"outcome_unknown\"} 1",
            "ordo_effects{state=\"pending\"} 0",
        ] {
            has_line(&text, line);
        }
    }

    #[test]
    fn inbox_gauges_are_each_producers_own_and_a_gone_one_drops_to_zero() {
        let metrics = Metrics::new();
        metrics.set_inbox(&status_of(&[
            ("billing", share(0, 2, 1)),
            ("orders", share(5, 0, 0)),
        ]));
        let text = metrics.encode();
        for line in [
            "ordo_inbox_pending{producer=\"billing\"} 0",
            "ordo_inbox_blocked{producer=\"billing\"} 2",
            "ordo_inbox_gap_flows{producer=\"billing\"} 1",
            "ordo_inbox_pending{producer=\"orders\"} 5",
            "ordo_inbox_blocked{producer=\"orders\"} 0",
            "ordo_inbox_pending{producer=\"default\"} 0",
        ] {
            has_line(&text, line);
        }
        // The orders rows all pruned: its series stays, at zero.
        metrics.set_inbox(&status_of(&[("billing", share(1, 2, 0))]));
        let text = metrics.encode();
        for line in [
            "ordo_inbox_pending{producer=\"billing\"} 1",
            "ordo_inbox_gap_flows{producer=\"billing\"} 0",
            "ordo_inbox_pending{producer=\"orders\"} 0",
        ] {
            has_line(&text, line);
        }
    }
}
