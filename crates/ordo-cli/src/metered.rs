//! The metrics of the runner's loops: what a relay round or an apply page
//! did, counted into the HTTP.md metrics (`relay --follow`, `apply
//! --follow`, `serve --apply`).

use std::sync::Arc;

use ordo_core::Receipt;
use ordo_http::Metrics;
use ordo_reservation::{INVALID_PAYLOAD, INVALID_TRANSITION, UNSUPPORTED_SCHEMA};
use ordo_runtime::{ApplyRound, RelayRound};

/// Lists the reservation domain's block codes at zero.
pub fn expect_reservation_blocks(metrics: &Metrics) {
    let codes = [UNSUPPORTED_SCHEMA, INVALID_PAYLOAD, INVALID_TRANSITION];
    metrics.expect_block_reasons(codes.iter().map(|r| r.code.as_str()));
}

/// Counts what a relay round to `destination` recorded.
pub fn count_relay(metrics: &Option<Arc<Metrics>>, destination: &str, round: &RelayRound) {
    let Some(metrics) = metrics else { return };
    let totals = &round.totals;
    for (receipt, count) in [
        (Receipt::Accepted, totals.accepted),
        (Receipt::Duplicate, totals.duplicate),
        (Receipt::Conflict, totals.conflict),
    ] {
        metrics.count_deliveries(destination, receipt, count);
    }
    for kind in &round.failures {
        metrics.count_relay_error(destination, kind.as_str());
    }
}

pub fn count_apply(metrics: &Option<Arc<Metrics>>, round: &ApplyRound) {
    let Some(metrics) = metrics else { return };
    metrics.apply_applied_total.inc_by(round.totals.applied);
    for code in &round.blocked {
        metrics
            .apply_blocked_total
            .with_label_values(&[code.as_str()])
            .inc();
    }
    for lag_ms in &round.lags_ms {
        metrics.apply_lag_seconds.observe(*lag_ms as f64 / 1000.0);
    }
}
