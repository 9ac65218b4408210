//! How locks are taken: TTL, waiting, backoff, drift, renewal.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Options for taking locks; the `[lock]` table of the configuration.
///
/// Every field has a default, listed in `reference.toml`.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LockOptions {
    /// How long a grant lives without renewal. A crashed holder blocks the key this long.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// How long [`Mutex::lock`](crate::Mutex::lock) waits before failing with
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout); `None` waits for as long as it takes.
    #[serde(with = "humantime_serde")]
    pub wait_timeout: Option<Duration>,
    /// Whether held locks are renewed in the background (at a third of the TTL). Without it a
    /// grant simply expires after its TTL and the guard reports it lost then.
    pub auto_renew: bool,
    /// The shortest pause between polling attempts, and the largest jitter after a release
    /// notification.
    #[serde(with = "humantime_serde")]
    pub backoff_min: Duration,
    /// The longest pause between polling attempts.
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// The share of the TTL assumed lost to clock drift between client and server, on top of a
    /// fixed 2 ms (see [`clock_drift`](crate::backend::clock_drift)).
    pub clock_drift_factor: f64,
    /// How long an acquisition that waits keeps retrying retryable backend errors in a row
    /// (an etcd or ZooKeeper leader election, a Sentinel failover, a rolling restart), with
    /// backoff between the retries, before it gives up with the last one. The streak is counted
    /// from its first error and ends with any answer that is not an error. The wait timeout
    /// still bounds the whole acquisition. The default, 10 s, covers an election (about 1-2 s
    /// for etcd and ZooKeeper with their default timeouts) and a Sentinel failover with
    /// `down-after-milliseconds` up to a few seconds. `try_lock` never retries errors.
    #[serde(with = "humantime_serde")]
    pub error_budget: Duration,
    /// Whether a contended mutex or semaphore goes to its waiters in the order they came
    /// (`true`, the default) or to whoever asks first after a release (`false`).
    ///
    /// - **Fair** (first come, first served): a release hands the lock (or the permit) to the
    ///   longest waiting acquirer, so no waiter starves and the longest wait is bounded by the
    ///   queue ahead of it; no later acquirer takes a permit while one waits. The next holder gets the lock without an acquire round trip, by a
    ///   notification's trip during which the lock is idle.
    /// - **Non-fair**: a release frees the lock and wakes a waiter (one per process), and
    ///   whoever asks first takes it, often the releasing process itself; a waiter can be
    ///   passed over again and again (rslock's and Redisson's `RLock` behaviour). It is not
    ///   the faster choice under contention from many processes: every process woken by a
    ///   release attempts, where a hand-over sends nothing, and the comparison suite's W2
    ///   (8 processes on one key) measured it slower than the fair lock on every Redis tier
    ///   (`docs/measurements.md`). It suits a process that re-takes a lock it just released
    ///   while others rarely want it.
    ///
    /// Both keep exclusion, fencing, the lost signal and cancel safety, and fair and non-fair
    /// acquirers of one key exclude each other (a non-fair one can take a free lock ahead of
    /// fair waiters queued for it; a release still hands over to them). It applies to
    /// mutexes (also within `lock_all` and an election's candidacy) on the Redis backends
    /// (single, Sentinel, Cluster, Redlock) and the memory backend, and to semaphores on
    /// those of them that have semaphores (Redlock has none); etcd's and ZooKeeper's locks
    /// and semaphores are queues by construction (a key or sequential node per waiter,
    /// granted in creation order) and stay fair whatever it says. A read-write lock's
    /// writers queue and are served in order on every backend whatever it says; its readers
    /// share.
    pub fair: bool,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(10),
            wait_timeout: None,
            auto_renew: true,
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(500),
            clock_drift_factor: 0.01,
            error_budget: Duration::from_secs(10),
            fair: true,
        }
    }
}

impl LockOptions {
    /// The longest TTL lockkit accepts: a crashed holder blocks its key at most this long.
    /// Longer critical sections keep a shorter TTL and rely on renewal.
    pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

    /// Sets the TTL.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets how long `lock()` waits.
    #[must_use]
    pub fn with_wait_timeout(mut self, wait_timeout: Option<Duration>) -> Self {
        self.wait_timeout = wait_timeout;
        self
    }

    /// Turns background renewal on or off.
    #[must_use]
    pub fn with_auto_renew(mut self, auto_renew: bool) -> Self {
        self.auto_renew = auto_renew;
        self
    }

    /// Sets the polling backoff range.
    #[must_use]
    pub fn with_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = max;
        self
    }

    /// Sets the share of the TTL assumed lost to clock drift (see
    /// [`clock_drift_factor`](LockOptions::clock_drift_factor)).
    #[must_use]
    pub fn with_clock_drift_factor(mut self, clock_drift_factor: f64) -> Self {
        self.clock_drift_factor = clock_drift_factor;
        self
    }

    /// Sets how long retryable errors in a row are retried while waiting.
    #[must_use]
    pub fn with_error_budget(mut self, error_budget: Duration) -> Self {
        self.error_budget = error_budget;
        self
    }

    /// Chooses a fair (first come, first served) or a non-fair mutex (see
    /// [`fair`](LockOptions::fair)).
    #[must_use]
    pub fn with_fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Checks that the values make sense together.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) saying which value is wrong.
    pub fn validate(&self) -> Result<()> {
        if self.ttl < Duration::from_millis(10) {
            return Err(Error::invalid_config(format!(
                "lock.ttl must be at least 10ms, got {}",
                humantime::format_duration(self.ttl)
            )));
        }
        if self.ttl > Self::MAX_TTL {
            return Err(Error::invalid_config(format!(
                "lock.ttl must be at most {} (a crashed holder blocks the key for a TTL; renewal keeps longer critical sections alive), got {}",
                humantime::format_duration(Self::MAX_TTL),
                humantime::format_duration(self.ttl)
            )));
        }
        if self.backoff_min.is_zero() || self.backoff_min > self.backoff_max {
            return Err(Error::invalid_config(
                "lock.backoff_min must be above zero and at most lock.backoff_max",
            ));
        }
        crate::backend::validate_duration("lock.backoff_max", self.backoff_max)?;
        if self.error_budget > crate::backend::MAX_CONFIG_DURATION {
            return Err(Error::invalid_config(format!(
                "lock.error_budget must be at most {}, got {}",
                humantime::format_duration(crate::backend::MAX_CONFIG_DURATION),
                humantime::format_duration(self.error_budget)
            )));
        }
        if !(0.0..0.5).contains(&self.clock_drift_factor) {
            return Err(Error::invalid_config(format!(
                "lock.clock_drift_factor must be in [0, 0.5), got {}",
                self.clock_drift_factor
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        LockOptions::default()
            .validate()
            .expect("defaults are valid");
    }

    #[test]
    fn nonsense_values_are_refused() {
        let tiny = LockOptions::default().with_ttl(Duration::from_millis(1));
        assert!(
            tiny.validate()
                .unwrap_err()
                .to_string()
                .contains("lock.ttl")
        );
        let huge = LockOptions::default().with_ttl(Duration::from_secs(99_999_999_999));
        let message = huge.validate().unwrap_err().to_string();
        assert!(message.contains("at most 1day"), "{message}");
        LockOptions::default()
            .with_ttl(LockOptions::MAX_TTL)
            .validate()
            .expect("the maximum itself is accepted");
        let inverted =
            LockOptions::default().with_backoff(Duration::from_secs(2), Duration::from_secs(1));
        assert!(
            inverted
                .validate()
                .unwrap_err()
                .to_string()
                .contains("backoff_min")
        );
        let endless = LockOptions::default().with_backoff(Duration::from_millis(1), Duration::MAX);
        let message = endless.validate().unwrap_err().to_string();
        assert!(message.contains("lock.backoff_max"), "{message}");
        let budget = LockOptions::default().with_error_budget(Duration::MAX);
        let message = budget.validate().unwrap_err().to_string();
        assert!(message.contains("lock.error_budget"), "{message}");
        let drift = LockOptions::default().with_clock_drift_factor(0.7);
        assert!(
            drift
                .validate()
                .unwrap_err()
                .to_string()
                .contains("clock_drift_factor")
        );
    }
}
