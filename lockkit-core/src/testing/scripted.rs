//! [`Scripted`]: a backend that passes every call on to a real one and changes only what a
//! scenario scripts (grants that say they have little validity left, renewals that fail),
//! so that the conformance scenarios of the validity floor run over every backend.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::{
    AcquireRequest, Attempt, Contention, Grant, Leader, Lease, LockBackend, LockPage, Renewal,
    SharedBackend, clock_drift,
};
use crate::error::{Error, ErrorKind};
use crate::{Capabilities, LockInfo, LockKey, LockOptions, Result, Tier};

/// Passes every call on to `inner`, except what is scripted:
/// - with [`Scripted::shorten_grants`], every grant (of an attempt or of a wait) comes back
///   saying it is valid for a twentieth of what the backend can promise, plus the clock
///   drift the default options take off: a grant that arrived late, as after a failover or
///   a descheduled process. The grant on the server is untouched;
/// - with [`Scripted::fail_renewals`], the next renewals fail with a retryable error.
#[derive(Debug)]
pub struct Scripted {
    inner: SharedBackend,
    short: AtomicBool,
    failing_renewals: AtomicUsize,
    renewals: AtomicUsize,
    abandons: AtomicUsize,
}

impl Scripted {
    /// Passes every call on to `inner`, unchanged until scripted.
    pub fn new(inner: SharedBackend) -> Self {
        Scripted {
            inner,
            short: AtomicBool::new(false),
            failing_renewals: AtomicUsize::new(0),
            renewals: AtomicUsize::new(0),
            abandons: AtomicUsize::new(0),
        }
    }

    /// Makes every grant from now on say it has little validity left (or stops it).
    pub fn shorten_grants(&self, short: bool) {
        self.short.store(short, Ordering::SeqCst);
    }

    /// Makes the next `n` renewals (of `renew` or `renew_many`) fail.
    pub fn fail_renewals(&self, n: usize) {
        self.failing_renewals.store(n, Ordering::SeqCst);
    }

    /// How many renewals reached the backend (each lease of a `renew_many` counts).
    pub fn renewals(&self) -> usize {
        self.renewals.load(Ordering::SeqCst)
    }

    /// How many acquisitions were abandoned (given back or cleaned up).
    pub fn abandons(&self) -> usize {
        self.abandons.load(Ordering::SeqCst)
    }

    /// The validity a shortened grant of `ttl` says it has: a twentieth of the promise,
    /// plus the drift the default options take off, so half the floor is left.
    pub fn short_validity(&self, ttl: Duration) -> Duration {
        let drift = clock_drift(ttl, LockOptions::default().clock_drift_factor);
        self.inner.max_validity(ttl) / 20 + drift
    }

    fn script(&self, mut grant: Grant, ttl: Duration) -> Grant {
        if self.short.load(Ordering::SeqCst) {
            grant.valid_for = grant.valid_for.min(self.short_validity(ttl));
        }
        grant
    }

    fn renewal(&self) -> Result<()> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        let failing = self
            .failing_renewals
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        match failing {
            Ok(_) => Err(Error::new(
                ErrorKind::Unavailable,
                self.inner.name(),
                "a scripted renewal failure",
            )),
            Err(_) => Ok(()),
        }
    }
}

#[async_trait]
impl LockBackend for Scripted {
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
        Ok(match self.inner.try_acquire(request).await? {
            Attempt::Granted(grant) => Attempt::Granted(self.script(grant, request.ttl)),
            contended => contended,
        })
    }

    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        let grant = self
            .inner
            .wait_for_change(request, contention, max_wait)
            .await?;
        Ok(grant.map(|grant| self.script(grant, request.ttl)))
    }

    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        self.abandons.fetch_add(1, Ordering::SeqCst);
        self.inner.abandon(request).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        self.renewal()?;
        self.inner.renew(lease).await
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        let failed: Vec<Result<()>> = leases.iter().map(|_| self.renewal()).collect();
        let mut answers = self.inner.renew_many(leases).await;
        for (answer, failed) in answers.iter_mut().zip(failed) {
            if let Err(e) = failed {
                *answer = Err(e);
            }
        }
        answers
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        self.inner.release(lease).await
    }

    async fn is_held(&self, lease: &Lease) -> Result<bool> {
        self.inner.is_held(lease).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.inner.inspect(key).await
    }

    async fn ping(&self) -> Result<()> {
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
        self.inner.list(namespace, prefix, cursor, limit).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<bool> {
        self.inner.force_release(key).await
    }

    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool> {
        self.inner.proclaim(lease, value).await
    }

    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>> {
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
