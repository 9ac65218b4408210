//! The mutex under hostile values and a misbehaving backend: deadlines that would overflow, a TTL
//! past the maximum, a leader election that answers errors for a while, and a wake-up that never
//! comes.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockkit_core::{
    AcquireRequest, Attempt, Capabilities, Contention, Error, ErrorKind, Lease, LockBackend,
    LockClient, LockInfo, LockKey, LockOptions, MemoryBackend, Renewal, Result, Tier, async_trait,
};

/// A memory backend that answers `Unavailable` to the first `failures` attempts, at once, as
/// a cluster does while it elects a leader.
#[derive(Debug)]
struct Electing {
    memory: MemoryBackend,
    failures: usize,
    attempts: AtomicUsize,
}

impl Electing {
    fn new(failures: usize) -> Self {
        Electing {
            memory: MemoryBackend::new(),
            failures,
            attempts: AtomicUsize::new(0),
        }
    }
}

#[async_trait]
impl LockBackend for Electing {
    fn name(&self) -> &'static str {
        "electing"
    }
    fn tier(&self) -> Tier {
        self.memory.tier()
    }
    fn capabilities(&self) -> Capabilities {
        self.memory.capabilities()
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        if self.attempts.fetch_add(1, Ordering::SeqCst) < self.failures {
            return Err(Error::new(
                ErrorKind::Unavailable,
                "electing",
                "etcdserver: no leader",
            ));
        }
        self.memory.try_acquire(request).await
    }
    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
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

/// A memory backend whose waits never hear the release (a pub/sub message lost in a
/// reconnect), and whose contention says the holder may keep the lock for a minute.
#[derive(Debug, Default)]
struct Deaf {
    memory: MemoryBackend,
}

#[async_trait]
impl LockBackend for Deaf {
    fn name(&self) -> &'static str {
        "deaf"
    }
    fn tier(&self) -> Tier {
        self.memory.tier()
    }
    fn capabilities(&self) -> Capabilities {
        self.memory.capabilities()
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        Ok(match self.memory.try_acquire(request).await? {
            Attempt::Contended(_) => {
                Attempt::Contended(Contention::new().with_retry_after(Duration::from_secs(60)))
            }
            granted => granted,
        })
    }
    // `wait_for_change` is the trait's default: it sleeps `max_wait` and hears nothing.
    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
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

fn locks(backend: Arc<dyn LockBackend>, options: LockOptions) -> LockClient {
    LockClient::with_options(backend, "robustness", options).unwrap()
}

#[tokio::test]
async fn a_wait_too_long_for_a_deadline_waits_instead_of_panicking() {
    let locks = locks(Arc::new(MemoryBackend::new()), LockOptions::default());
    let mutex = locks.mutex("forever").unwrap();
    let guard = mutex.lock_timeout(Duration::MAX).await.unwrap();
    let waiter = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.lock_timeout(Duration::MAX).await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(guard.release().await.unwrap());
    tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter was granted after the release")
        .unwrap()
        .unwrap();

    let endless = LockOptions::default().with_wait_timeout(Some(Duration::MAX));
    let guard = mutex.clone().with_options(endless).lock().await.unwrap();
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn a_ttl_above_the_maximum_is_refused_as_invalid_config() {
    let locks = locks(Arc::new(MemoryBackend::new()), LockOptions::default());
    for ttl in [
        LockOptions::MAX_TTL + Duration::from_secs(1),
        Duration::from_secs(99_999_999_999),
        Duration::MAX,
    ] {
        let err = locks
            .mutex("huge")
            .unwrap()
            .with_ttl(ttl)
            .lock()
            .await
            .expect_err("a TTL past the maximum is refused");
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
        assert!(err.to_string().contains("lock.ttl"), "{err}");
    }
}

#[tokio::test]
async fn a_waiting_lock_rides_out_a_burst_of_retryable_errors() {
    // Fifty errors in a row, answered at once: far more than any count of retries a fast
    // error rate runs through in the second an election takes.
    let backend = Arc::new(Electing::new(50));
    let options =
        LockOptions::default().with_backoff(Duration::from_millis(1), Duration::from_millis(5));
    let guard = locks(backend.clone(), options)
        .mutex("election")
        .unwrap()
        .lock()
        .await
        .expect("lock() rides out the election");
    assert!(backend.attempts.load(Ordering::SeqCst) > 50);
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn errors_that_outlast_the_budget_end_the_wait_with_the_last_error() {
    let backend = Arc::new(Electing::new(usize::MAX));
    let options = LockOptions::default()
        .with_backoff(Duration::from_millis(1), Duration::from_millis(20))
        .with_error_budget(Duration::from_millis(300));
    let started = Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        locks(backend.clone(), options)
            .mutex("down")
            .unwrap()
            .lock(),
    )
    .await
    .expect("the budget ends the wait")
    .expect_err("a backend that never answers grants nothing");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        backend.attempts.load(Ordering::SeqCst) > 2,
        "it retried with backoff"
    );

    let started = Instant::now();
    let err = locks(Arc::new(Electing::new(usize::MAX)), LockOptions::default())
        .mutex("down")
        .unwrap()
        .lock_timeout(Duration::from_millis(200))
        .await
        .expect_err("the wait timeout bounds the budget");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(started.elapsed() < LockOptions::default().error_budget);
}

#[tokio::test]
async fn try_lock_does_not_retry_errors() {
    let backend = Arc::new(Electing::new(1));
    let err = locks(backend.clone(), LockOptions::default())
        .mutex("once")
        .unwrap()
        .try_lock()
        .await
        .expect_err("the one attempt failed");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert_eq!(backend.attempts.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_missed_release_notification_costs_at_most_backoff_max() {
    let options =
        LockOptions::default().with_backoff(Duration::from_millis(5), Duration::from_millis(100));
    let locks = locks(Arc::new(Deaf::default()), options);
    let mutex = locks.mutex("deaf").unwrap();
    let guard = mutex.lock().await.unwrap();
    let waiter = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.lock_timeout(Duration::from_secs(60)).await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(guard.release().await.unwrap());
    // 30 times `backoff_max`: patience for a loaded machine, and far below the minute the
    // holder claimed, which is how long the waiter slept when nothing capped it.
    tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("the waiter retried within about backoff_max of the missed release")
        .unwrap()
        .unwrap();
}
