//! Jittered exponential backoff: for polling waits, and for the retries of backends' own
//! background work (reconnects, revokes, resent requests).

use std::time::Duration;

/// "Full jitter" backoff: the n-th delay is uniform in `[min, min(max, min × 2ⁿ)]`, so
/// waiters that started together spread out instead of retrying in lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    ceiling: Duration,
}

impl Backoff {
    /// Delays from `min` (the first one) growing to at most `max`.
    #[must_use]
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max: max.max(min),
            ceiling: min,
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let delay = jitter(self.min, self.ceiling);
        self.ceiling = self.ceiling.saturating_mul(2).min(self.max);
        delay
    }

    /// Starts again from the shortest delay.
    pub fn reset(&mut self) {
        self.ceiling = self.min;
    }
}

/// A uniformly random duration in `[low, high]`.
pub(crate) fn jitter(low: Duration, high: Duration) -> Duration {
    if high <= low {
        return low;
    }
    let span = (high - low).as_nanos().min(u128::from(u64::MAX)) as u64;
    low + Duration::from_nanos(rand::random_range(0..=span))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_in_range_and_grow_to_the_cap() {
        let (min, max) = (Duration::from_millis(10), Duration::from_millis(80));
        let mut b = Backoff::new(min, max);
        let delays: Vec<_> = (0..50).map(|_| b.next_delay()).collect();
        assert!(delays.iter().all(|d| *d >= min && *d <= max));
        assert_eq!(delays[0], min);
        assert!(
            delays[10..].iter().any(|d| *d > Duration::from_millis(40)),
            "{delays:?}"
        );
    }

    #[test]
    fn a_huge_maximum_grows_without_overflow() {
        let mut b = Backoff::new(Duration::from_millis(1), Duration::MAX);
        for _ in 0..200 {
            assert!(b.next_delay() >= Duration::from_millis(1));
        }
    }

    #[test]
    fn jitter_spreads() {
        let (lo, hi) = (Duration::from_millis(0), Duration::from_millis(100));
        let draws: std::collections::HashSet<_> = (0..100).map(|_| jitter(lo, hi)).collect();
        assert!(draws.len() > 50);
    }
}
