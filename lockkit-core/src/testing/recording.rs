//! [`Recording`]: a backend that passes every call on to another and records it, for tests
//! that check what the core asks of a backend (how often, for whom, in what batches), and for
//! benchmarks that time the renewal ticks. A test can also script what the inner backend
//! answers (grants that say they have little validity left, renewals that fail), so that the
//! conformance scenarios of the validity floor run over every backend.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::backend::{
    AcquireRequest, Attempt, Contention, Grant, Leader, Lease, LockBackend, LockPage, OwnerToken,
    Renewal, SharedBackend, clock_drift,
};
use crate::error::{Error, ErrorKind};
use crate::{Capabilities, LockInfo, LockKey, LockOptions, Result, Tier};

/// One call that reached the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The trait method: `"try_acquire"`, `"renew_many"`, ...
    pub method: &'static str,
    /// The owner of the request or lease, for the methods that take one.
    pub owner: Option<OwnerToken>,
    /// How many leases `renew_many` was given (1 for the other lease methods, else 0).
    pub leases: usize,
}

/// One finished `renew_many` call (a renewal tick of the core's scheduler): when it started,
/// how many leases it carried, how long it took and what it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tick {
    /// When the call was made.
    pub at: Instant,
    /// How many leases it renewed.
    pub leases: usize,
    /// How long the backend took to answer.
    pub took: Duration,
    /// Leases answered `Lost`.
    pub lost: usize,
    /// Leases answered with an error.
    pub failed: usize,
    /// The first of those errors, as `display_chain` shows it.
    pub first_error: Option<String>,
}

/// Passes every call on to `inner` and records it; unchanged, except what a test scripts:
/// - with [`Recording::shorten_grants`], every grant (of an attempt or of a wait) comes back
///   saying it is valid for a twentieth of what the backend can promise, plus the clock
///   drift the default options take off: a grant that arrived late, as after a failover or
///   on a descheduled process (the grant on the server is untouched);
/// - with [`Recording::fail_renewals`], the next renewals fail with a retryable error.
#[derive(Debug)]
pub struct Recording {
    inner: SharedBackend,
    calls: Mutex<Vec<Call>>,
    ticks: Mutex<Vec<Tick>>,
    short: AtomicBool,
    failing_renewals: AtomicUsize,
}

impl Recording {
    /// Records the calls made to `inner`.
    pub fn new(inner: SharedBackend) -> Self {
        Recording {
            inner,
            calls: Mutex::new(Vec::new()),
            ticks: Mutex::new(Vec::new()),
            short: AtomicBool::new(false),
            failing_renewals: AtomicUsize::new(0),
        }
    }

    /// Makes every grant from now on say it has little validity left (or stops it).
    pub fn shorten_grants(&self, short: bool) {
        self.short.store(short, Ordering::SeqCst);
    }

    /// Makes the next `n` renewals (each lease of a `renew_many` counts) fail.
    pub fn fail_renewals(&self, n: usize) {
        self.failing_renewals.store(n, Ordering::SeqCst);
    }

    /// The validity a shortened grant of `ttl` says it has: a twentieth of the promise,
    /// plus the drift the default options take off, so that half the floor is left.
    pub fn short_validity(&self, ttl: Duration) -> Duration {
        let drift = clock_drift(ttl, LockOptions::default().clock_drift_factor);
        self.inner.max_validity(ttl) / 20 + drift
    }

    /// How many leases were renewed (by `renew` or in a `renew_many`).
    pub fn renewals(&self) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.method == "renew" || c.method == "renew_many")
            .map(|c| c.leases)
            .sum()
    }

    fn scripted(&self, mut grant: Grant, ttl: Duration) -> Grant {
        if self.short.load(Ordering::SeqCst) {
            grant.valid_for = grant.valid_for.min(self.short_validity(ttl));
        }
        grant
    }

    /// Whether this renewal is scripted to fail.
    fn failing_renewal(&self) -> Option<Error> {
        self.failing_renewals
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .ok()
            .map(|_| {
                Error::new(
                    ErrorKind::Unavailable,
                    self.inner.name(),
                    "a scripted renewal failure",
                )
            })
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Every finished `renew_many` call so far, in the order they finished.
    pub fn ticks(&self) -> Vec<Tick> {
        self.ticks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many calls of `method` there were.
    pub fn count(&self, method: &str) -> usize {
        self.calls().iter().filter(|c| c.method == method).count()
    }

    fn record(&self, method: &'static str, owner: Option<&OwnerToken>, leases: usize) {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Call {
                method,
                owner: owner.cloned(),
                leases,
            });
    }
}

#[async_trait]
impl LockBackend for Recording {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn tier(&self) -> Tier {
        self.inner.tier()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn max_validity(&self, ttl: Duration) -> Duration {
        self.inner.max_validity(ttl)
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        self.record("try_acquire", Some(&request.owner), 0);
        Ok(match self.inner.try_acquire(request).await? {
            Attempt::Granted(grant) => Attempt::Granted(self.scripted(grant, request.ttl)),
            contended => contended,
        })
    }

    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        self.record("wait_for_change", Some(&request.owner), 0);
        let grant = self
            .inner
            .wait_for_change(request, contention, max_wait)
            .await?;
        Ok(grant.map(|grant| self.scripted(grant, request.ttl)))
    }

    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        self.record("abandon", Some(&request.owner), 0);
        self.inner.abandon(request).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        self.record("renew", Some(lease.owner()), 1);
        if let Some(failure) = self.failing_renewal() {
            return Err(failure);
        }
        self.inner.renew(lease).await
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        self.record("renew_many", None, leases.len());
        let failures: Vec<Option<Error>> = leases.iter().map(|_| self.failing_renewal()).collect();
        let at = Instant::now();
        let mut answers = self.inner.renew_many(leases).await;
        for (answer, failure) in answers.iter_mut().zip(failures) {
            if let Some(failure) = failure {
                *answer = Err(failure);
            }
        }
        let tick = Tick {
            at,
            leases: leases.len(),
            took: at.elapsed(),
            lost: answers
                .iter()
                .filter(|a| matches!(a, Ok(Renewal::Lost)))
                .count(),
            failed: answers.iter().filter(|a| a.is_err()).count(),
            first_error: answers
                .iter()
                .find_map(|a| a.as_ref().err())
                .map(|e| e.display_chain().to_string()),
        };
        self.ticks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(tick);
        answers
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        self.record("release", Some(lease.owner()), 1);
        self.inner.release(lease).await
    }

    async fn is_held(&self, lease: &Lease) -> Result<bool> {
        self.record("is_held", Some(lease.owner()), 1);
        self.inner.is_held(lease).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.record("inspect", None, 0);
        self.inner.inspect(key).await
    }

    async fn ping(&self) -> Result<()> {
        self.record("ping", None, 0);
        self.inner.ping().await
    }

    async fn idle(&self) {
        self.inner.idle().await;
    }

    async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        self.record("list", None, 0);
        self.inner.list(namespace, prefix, cursor, limit).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<bool> {
        self.record("force_release", None, 0);
        self.inner.force_release(key).await
    }

    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool> {
        self.record("proclaim", Some(lease.owner()), 1);
        self.inner.proclaim(lease, value).await
    }

    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>> {
        self.record("leader", None, 0);
        self.inner.leader(key).await
    }

    async fn wait_for_leader_change(
        &self,
        key: &LockKey,
        seen: Option<&Leader>,
        max_wait: Duration,
    ) -> Result<()> {
        self.inner.wait_for_leader_change(key, seen, max_wait).await
    }
}
