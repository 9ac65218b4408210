//! [`Recording`]: a backend that passes every call on to another and records it, for tests
//! that check what the core asks of a backend (how often, for whom, in what batches), and for
//! benchmarks that time the renewal ticks.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::backend::{
    AcquireRequest, Attempt, Contention, Grant, Leader, Lease, LockBackend, LockPage, OwnerToken,
    Renewal, SharedBackend,
};
use crate::{Capabilities, LockInfo, LockKey, Result, Tier};

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

/// Passes every call on to `inner`, unchanged, and records it.
#[derive(Debug)]
pub struct Recording {
    inner: SharedBackend,
    calls: Mutex<Vec<Call>>,
    ticks: Mutex<Vec<Tick>>,
}

impl Recording {
    /// Records the calls made to `inner`.
    pub fn new(inner: SharedBackend) -> Self {
        Recording {
            inner,
            calls: Mutex::new(Vec::new()),
            ticks: Mutex::new(Vec::new()),
        }
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
        self.inner.try_acquire(request).await
    }

    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        self.record("wait_for_change", Some(&request.owner), 0);
        self.inner
            .wait_for_change(request, contention, max_wait)
            .await
    }

    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        self.record("abandon", Some(&request.owner), 0);
        self.inner.abandon(request).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        self.record("renew", Some(lease.owner()), 1);
        self.inner.renew(lease).await
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        self.record("renew_many", None, leases.len());
        let at = Instant::now();
        let answers = self.inner.renew_many(leases).await;
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
