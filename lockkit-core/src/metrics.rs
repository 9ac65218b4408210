//! The metrics lockkit records, through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! Install any `metrics` recorder (Prometheus, StatsD, ...) to collect them; without one they
//! cost next to nothing. Every series carries a `backend` label.
//!
//! | name | type | meaning |
//! |---|---|---|
//! | `lockkit_acquire_total` | counter, label `outcome` = granted, contended, timeout, error | finished acquisitions |
//! | `lockkit_acquire_seconds` | histogram | time from `lock()` to the grant, waiting included |
//! | `lockkit_wait_seconds` | histogram | the part of that time spent waiting for another holder |
//! | `lockkit_contended_total` | counter | acquisition attempts that found the lock taken |
//! | `lockkit_renew_failures_total` | counter | renewals that failed and will be retried |
//! | `lockkit_lost_total` | counter | held locks that were lost |

use std::time::Duration;

/// Name of the finished-acquisitions counter.
pub const ACQUIRE_TOTAL: &str = "lockkit_acquire_total";
/// Name of the acquire-latency histogram.
pub const ACQUIRE_SECONDS: &str = "lockkit_acquire_seconds";
/// Name of the wait-time histogram.
pub const WAIT_SECONDS: &str = "lockkit_wait_seconds";
/// Name of the contended-attempts counter.
pub const CONTENDED_TOTAL: &str = "lockkit_contended_total";
/// Name of the failed-renewals counter.
pub const RENEW_FAILURES_TOTAL: &str = "lockkit_renew_failures_total";
/// Name of the lost-locks counter.
pub const LOST_TOTAL: &str = "lockkit_lost_total";

pub(crate) fn acquired(
    backend: &'static str,
    outcome: &'static str,
    total: Duration,
    waited: Duration,
) {
    metrics::counter!(ACQUIRE_TOTAL, "backend" => backend, "outcome" => outcome).increment(1);
    if outcome == "granted" {
        metrics::histogram!(ACQUIRE_SECONDS, "backend" => backend).record(total.as_secs_f64());
        metrics::histogram!(WAIT_SECONDS, "backend" => backend).record(waited.as_secs_f64());
    }
}

pub(crate) fn contended(backend: &'static str) {
    metrics::counter!(CONTENDED_TOTAL, "backend" => backend).increment(1);
}

pub(crate) fn renew_failed(backend: &'static str) {
    metrics::counter!(RENEW_FAILURES_TOTAL, "backend" => backend).increment(1);
}

pub(crate) fn lost(backend: &'static str) {
    metrics::counter!(LOST_TOTAL, "backend" => backend).increment(1);
}
