//! `lock_timeout` bounds the whole acquisition, including an attempt that the backend takes
//! far longer to answer than the caller is willing to wait.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockkit_core::backend::{AcquireRequest, Attempt, Lease, LockBackend, Renewal, async_trait};
use lockkit_core::{
    Capabilities, ErrorKind, LockClient, LockInfo, LockKey, MemoryBackend, Result, Tier,
};

/// A memory backend whose attempts hang for a long time (a failover in progress).
#[derive(Debug, Default)]
struct Hanging {
    memory: MemoryBackend,
    abandoned: AtomicUsize,
}

#[async_trait]
impl LockBackend for Hanging {
    fn name(&self) -> &'static str {
        "hanging"
    }
    fn tier(&self) -> Tier {
        self.memory.tier()
    }
    fn capabilities(&self) -> Capabilities {
        self.memory.capabilities()
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        tokio::time::sleep(Duration::from_secs(30)).await;
        self.memory.try_acquire(request).await
    }
    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        self.abandoned.fetch_add(1, Ordering::SeqCst);
        self.memory.abandon(request).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        self.memory.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<bool> {
        self.memory.release(lease).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.memory.inspect(key).await
    }
    async fn ping(&self) -> Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn lock_timeout_bounds_an_attempt_that_hangs_and_cleans_up_after_it() {
    let backend = Arc::new(Hanging::default());
    let locks = LockClient::with_options(
        backend.clone(),
        "deadline",
        lockkit_core::LockOptions::default(),
    )
    .unwrap();
    let started = Instant::now();
    let err = locks
        .mutex("slow")
        .unwrap()
        .lock_timeout(Duration::from_millis(200))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        took < Duration::from_secs(5),
        "lock_timeout(200ms) took {took:?}"
    );
    assert_eq!(
        backend.abandoned.load(Ordering::SeqCst),
        1,
        "the cut attempt was not cleaned up"
    );
}
