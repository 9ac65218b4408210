//! The metrics lockkit records, through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! Install any `metrics` recorder (Prometheus, StatsD, ...) to collect them; without one they
//! cost next to nothing. Every series carries two labels: `backend` (`memory`, `redis`,
//! `redlock`, `etcd`, `zk`) and `tier` (`local`, `single`, `replicated`, `quorum`,
//! `consensus`), which tells a single Redis (`single`) from a Sentinel group (`replicated`).
//! Each [`LockClient`](crate::LockClient) describes them (help text and unit) to the recorder
//! installed when it is created, and registers its backend's counters without an `outcome`
//! and its gauge at zero; call [`describe`] after installing a recorder later.
//!
//! | name | type | unit | labels | meaning |
//! |---|---|---|---|---|
//! | `lockkit_acquire_total` | counter | count | `outcome` = granted, contended, timeout, error, cancelled | finished acquisitions: `contended` is a `try_lock` that found the lock taken, `cancelled` an acquire future dropped before its end |
//! | `lockkit_acquire_seconds` | histogram | seconds | | time from `lock()` to the grant, waiting included |
//! | `lockkit_wait_seconds` | histogram | seconds | | the part of that time spent waiting for another holder |
//! | `lockkit_contended_total` | counter | count | | acquisition attempts that found the lock taken |
//! | `lockkit_held_locks` | gauge | count | | locks held by this process now |
//! | `lockkit_hold_seconds` | histogram | seconds | | how long a lock was held: from its grant to its release or loss |
//! | `lockkit_release_seconds` | histogram | seconds | | latency of one release request to the backend |
//! | `lockkit_renew_seconds` | histogram | seconds | | latency of one renewal round trip (a batch of leases counts once) |
//! | `lockkit_renew_failures_total` | counter | count | | renewals that failed and will be retried |
//! | `lockkit_lost_total` | counter | count | | held locks that were lost |
//!
//! Tracing spans (through [`tracing`](https://docs.rs/tracing)), with the fields they carry;
//! no span or event ever carries an owner token:
//!
//! | span | level | fields | around |
//! |---|---|---|---|
//! | `lockkit.acquire` | info | `key`, `backend` | one acquisition, all its attempts and waits |
//! | `lockkit.wait` | debug | `max_ms` | one wait for the holder between attempts |
//! | `lockkit.renew` | debug | `backend`, `leases` | one batch of renewals |
//! | `lockkit.release` | debug | `key`, `backend` | one release request |
//!
//! Events worth an alert: `lock lost` (warn), `renewal failed; retrying before the validity
//! deadline` (warn), and the clean-up warnings after a failed release or abandon.
//!
//! `examples/metrics.rs` serves these at `/metrics` with `metrics-exporter-prometheus` while
//! a few tasks contend; CI runs it and checks that every name of [`ALL`] is in its output.
//! An excerpt of that output, on a single Redis (histograms are summaries unless the exporter
//! is given buckets):
//!
//! ```text
//! # HELP lockkit_acquire_total Finished lock acquisitions, by outcome (granted, contended, timeout, error, cancelled).
//! # TYPE lockkit_acquire_total counter
//! lockkit_acquire_total{backend="redis",tier="single",outcome="granted"} 21
//! lockkit_acquire_total{backend="redis",tier="single",outcome="contended"} 1
//! lockkit_acquire_total{backend="redis",tier="single",outcome="cancelled"} 1
//! # HELP lockkit_held_locks Locks held by this process now.
//! # TYPE lockkit_held_locks gauge
//! lockkit_held_locks{backend="redis",tier="single"} 0
//! # HELP lockkit_lost_total Held locks that were lost (expired, taken away, or their session ended).
//! # TYPE lockkit_lost_total counter
//! lockkit_lost_total{backend="redis",tier="single"} 1
//! # HELP lockkit_hold_seconds How long a lock was held, from its grant to its release or loss.
//! # TYPE lockkit_hold_seconds summary
//! lockkit_hold_seconds{backend="redis",tier="single",quantile="0.5"} 0.0113
//! lockkit_hold_seconds{backend="redis",tier="single",quantile="0.99"} 0.0156
//! lockkit_hold_seconds_sum{backend="redis",tier="single"} 1.3972
//! lockkit_hold_seconds_count{backend="redis",tier="single"} 21
//! ```

use std::time::Duration;

use metrics::Unit;

use crate::backend::LockBackend;

/// Name of the finished-acquisitions counter.
pub const ACQUIRE_TOTAL: &str = "lockkit_acquire_total";
/// Name of the acquire-latency histogram.
pub const ACQUIRE_SECONDS: &str = "lockkit_acquire_seconds";
/// Name of the wait-time histogram.
pub const WAIT_SECONDS: &str = "lockkit_wait_seconds";
/// Name of the contended-attempts counter.
pub const CONTENDED_TOTAL: &str = "lockkit_contended_total";
/// Name of the held-locks gauge.
pub const HELD_LOCKS: &str = "lockkit_held_locks";
/// Name of the hold-duration histogram.
pub const HOLD_SECONDS: &str = "lockkit_hold_seconds";
/// Name of the release-latency histogram.
pub const RELEASE_SECONDS: &str = "lockkit_release_seconds";
/// Name of the renewal-latency histogram.
pub const RENEW_SECONDS: &str = "lockkit_renew_seconds";
/// Name of the failed-renewals counter.
pub const RENEW_FAILURES_TOTAL: &str = "lockkit_renew_failures_total";
/// Name of the lost-locks counter.
pub const LOST_TOTAL: &str = "lockkit_lost_total";

/// Every metric above, by name.
pub const ALL: [&str; 10] = [
    ACQUIRE_TOTAL,
    ACQUIRE_SECONDS,
    WAIT_SECONDS,
    CONTENDED_TOTAL,
    HELD_LOCKS,
    HOLD_SECONDS,
    RELEASE_SECONDS,
    RENEW_SECONDS,
    RENEW_FAILURES_TOTAL,
    LOST_TOTAL,
];

/// Describes every metric (help text and unit) to the installed recorder, so that Prometheus
/// shows `# HELP` lines. [`LockClient`](crate::LockClient) calls it when it is created;
/// calling it again is harmless.
pub fn describe() {
    metrics::describe_counter!(
        ACQUIRE_TOTAL,
        Unit::Count,
        "Finished lock acquisitions, by outcome (granted, contended, timeout, error, cancelled)."
    );
    metrics::describe_histogram!(
        ACQUIRE_SECONDS,
        Unit::Seconds,
        "Time from lock() to the grant, waiting included."
    );
    metrics::describe_histogram!(
        WAIT_SECONDS,
        Unit::Seconds,
        "Time an acquisition spent waiting for another holder."
    );
    metrics::describe_counter!(
        CONTENDED_TOTAL,
        Unit::Count,
        "Acquisition attempts that found the lock taken."
    );
    metrics::describe_gauge!(HELD_LOCKS, Unit::Count, "Locks held by this process now.");
    metrics::describe_histogram!(
        HOLD_SECONDS,
        Unit::Seconds,
        "How long a lock was held, from its grant to its release or loss."
    );
    metrics::describe_histogram!(
        RELEASE_SECONDS,
        Unit::Seconds,
        "Latency of one release request to the backend."
    );
    metrics::describe_histogram!(
        RENEW_SECONDS,
        Unit::Seconds,
        "Latency of one renewal round trip to the backend (a batch counts once)."
    );
    metrics::describe_counter!(
        RENEW_FAILURES_TOTAL,
        Unit::Count,
        "Renewals that failed and will be retried before the validity deadline."
    );
    metrics::describe_counter!(
        LOST_TOTAL,
        Unit::Count,
        "Held locks that were lost (expired, taken away, or their session ended)."
    );
}

/// Registers the series of `backend` that carry no outcome at zero, so that they exist (and
/// alerts on `rate(...)` work) before the first event: the contended, failed-renewal and
/// lost counters and the held-locks gauge.
pub(crate) fn register(backend: &dyn LockBackend) {
    for name in [CONTENDED_TOTAL, RENEW_FAILURES_TOTAL, LOST_TOTAL] {
        metrics::counter!(name, &labels(backend)).increment(0);
    }
    metrics::gauge!(HELD_LOCKS, &labels(backend)).increment(0.0);
}

/// The labels of every series: the backend's name and its tier.
fn labels(backend: &dyn LockBackend) -> [(&'static str, &'static str); 2] {
    [
        ("backend", backend.name()),
        ("tier", backend.tier().as_str()),
    ]
}

pub(crate) fn acquired(
    backend: &dyn LockBackend,
    outcome: &'static str,
    total: Duration,
    waited: Duration,
) {
    let [b, t] = labels(backend);
    metrics::counter!(ACQUIRE_TOTAL, b.0 => b.1, t.0 => t.1, "outcome" => outcome).increment(1);
    if outcome == "granted" {
        metrics::histogram!(ACQUIRE_SECONDS, &labels(backend)).record(total.as_secs_f64());
        metrics::histogram!(WAIT_SECONDS, &labels(backend)).record(waited.as_secs_f64());
    }
}

pub(crate) fn cancelled(backend: &dyn LockBackend) {
    let [b, t] = labels(backend);
    metrics::counter!(ACQUIRE_TOTAL, b.0 => b.1, t.0 => t.1, "outcome" => "cancelled").increment(1);
}

pub(crate) fn contended(backend: &dyn LockBackend) {
    metrics::counter!(CONTENDED_TOTAL, &labels(backend)).increment(1);
}

pub(crate) fn held(backend: &dyn LockBackend) {
    metrics::gauge!(HELD_LOCKS, &labels(backend)).increment(1.0);
}

pub(crate) fn no_longer_held(backend: &dyn LockBackend, held_for: Duration) {
    metrics::gauge!(HELD_LOCKS, &labels(backend)).decrement(1.0);
    metrics::histogram!(HOLD_SECONDS, &labels(backend)).record(held_for.as_secs_f64());
}

pub(crate) fn released(backend: &dyn LockBackend, took: Duration) {
    metrics::histogram!(RELEASE_SECONDS, &labels(backend)).record(took.as_secs_f64());
}

pub(crate) fn renewed(backend: &dyn LockBackend, took: Duration) {
    metrics::histogram!(RENEW_SECONDS, &labels(backend)).record(took.as_secs_f64());
}

pub(crate) fn renew_failed(backend: &dyn LockBackend) {
    metrics::counter!(RENEW_FAILURES_TOTAL, &labels(backend)).increment(1);
}

pub(crate) fn lost(backend: &dyn LockBackend) {
    metrics::counter!(LOST_TOTAL, &labels(backend)).increment(1);
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_table_documents_every_metric_and_nothing_else() {
        let documented: Vec<&str> = include_str!("metrics.rs")
            .lines()
            .filter_map(|line| line.strip_prefix("//! | `lockkit_"))
            .filter_map(|rest| rest.split('`').next())
            .collect();
        let all: Vec<String> = super::ALL
            .iter()
            .map(|name| name.trim_start_matches("lockkit_").to_owned())
            .collect();
        assert_eq!(documented, all, "the metrics table and ALL disagree");
    }
}
