//! A backend that passes every call on and measures the renewal ticks: how many, how many
//! leases each, how long each took, and what they answered.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lockkit::backend::{
    AcquireRequest, Attempt, Contention, Lease, LockBackend, LockPage, Renewal, async_trait,
};
use lockkit::{Capabilities, LockInfo, LockKey, Result, Tier};

/// One `renew_many` call: one renewal tick of the core's scheduler.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tick {
    pub(crate) at: Instant,
    pub(crate) leases: usize,
    pub(crate) took: Duration,
    pub(crate) lost: usize,
    pub(crate) failed: usize,
}

/// Passes every call on to `inner`; records each renewal tick.
#[derive(Debug)]
pub(crate) struct Counting {
    inner: Arc<dyn LockBackend>,
    ticks: Mutex<Vec<Tick>>,
    /// The first renewal error, to show why renewals failed.
    first_error: Mutex<Option<String>>,
}

impl Counting {
    pub(crate) fn new(inner: Arc<dyn LockBackend>) -> Self {
        Counting {
            inner,
            ticks: Mutex::new(Vec::new()),
            first_error: Mutex::new(None),
        }
    }

    /// The ticks that started in `from..to`.
    pub(crate) fn ticks_between(&self, from: Instant, to: Instant) -> Vec<Tick> {
        self.ticks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|t| t.at >= from && t.at < to)
            .copied()
            .collect()
    }

    /// The first error a renewal answered, if any.
    pub(crate) fn first_error(&self) -> Option<String> {
        self.first_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[async_trait]
impl LockBackend for Counting {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn tier(&self) -> Tier {
        self.inner.tier()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        self.inner.try_acquire(request).await
    }

    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<()> {
        self.inner
            .wait_for_change(request, contention, max_wait)
            .await
    }

    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        self.inner.abandon(request).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        self.inner.renew(lease).await
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
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
        };
        if let Some(Err(e)) = answers.iter().find(|a| a.is_err()) {
            self.first_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert_with(|| e.display_chain().to_string());
        }
        self.ticks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(tick);
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
}
