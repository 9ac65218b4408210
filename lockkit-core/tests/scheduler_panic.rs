//! The renewal scheduler survives a panic inside it: every lease it was watching reports lost
//! (nobody renewed it meanwhile), and a new scheduler renews the leases that come after. The
//! deadline thread survives one too, and goes on firing lost signals on time. Its own test
//! binary, since the scheduler and the deadline thread are one per process.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lockkit_core::backend::{AcquireRequest, Attempt, Lease, LockBackend, Renewal, async_trait};
use lockkit_core::{
    Capabilities, LockClient, LockInfo, LockKey, LockOptions, MemoryBackend, Result, Tier,
};

/// A memory backend whose `name()` panics once armed: the scheduler asks for it when it
/// starts a renewal under a subscriber that records debug spans, and the deadline thread
/// when it reports a lease lost.
#[derive(Debug, Default)]
struct Booby {
    memory: MemoryBackend,
    armed: AtomicBool,
}

#[async_trait]
impl LockBackend for Booby {
    fn name(&self) -> &'static str {
        assert!(!self.armed.load(Ordering::SeqCst), "planted panic");
        "booby"
    }
    fn tier(&self) -> Tier {
        self.memory.tier()
    }
    fn capabilities(&self) -> Capabilities {
        self.memory.capabilities()
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_panic_fires_lost_on_its_leases_and_a_new_scheduler_takes_over() {
    // Debug spans on: the scheduler's renewal span then asks the backend for its name.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_test_writer()
        .init();
    let healthy = LockClient::with_options(
        Arc::new(MemoryBackend::new()),
        "scheduler",
        LockOptions::default().with_ttl(Duration::from_secs(2)),
    )
    .unwrap();
    let renewed = healthy.mutex("renewed").unwrap().lock().await.unwrap();

    let booby = Arc::new(Booby::default());
    let doomed = LockClient::with_options(
        booby.clone(),
        "scheduler",
        LockOptions::default().with_ttl(Duration::from_millis(200)),
    )
    .unwrap();
    let renewing = doomed.mutex("renewing").unwrap().lock().await.unwrap();
    let expiring = doomed
        .mutex("expiring")
        .unwrap()
        .with_options(
            LockOptions::default()
                .with_ttl(Duration::from_millis(200))
                .with_auto_renew(false),
        )
        .unwrap()
        .lock()
        .await
        .unwrap();
    booby.armed.store(true, Ordering::SeqCst);

    tokio::time::timeout(Duration::from_secs(20), renewed.lost())
        .await
        .expect("the lease of the panicked scheduler reports lost");
    tokio::time::timeout(Duration::from_secs(20), expiring.lost())
        .await
        .expect("the lease whose backend panicked in the deadline thread reports lost");
    booby.armed.store(false, Ordering::SeqCst);
    drop((renewing, expiring));

    let unrenewed = healthy
        .mutex("unrenewed")
        .unwrap()
        .with_options(
            LockOptions::default()
                .with_ttl(Duration::from_millis(300))
                .with_auto_renew(false),
        )
        .unwrap()
        .lock()
        .await
        .unwrap();
    let deadline = unrenewed.valid_until();
    tokio::time::timeout(Duration::from_secs(20), unrenewed.lost())
        .await
        .expect("the deadline thread still fires lost signals");
    assert!(std::time::Instant::now() >= deadline);

    let after = healthy
        .mutex("after")
        .unwrap()
        .with_ttl(Duration::from_millis(300))
        .expect("a valid TTL")
        .lock()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        !after.is_lost(),
        "a new scheduler renews the leases that come after"
    );
    assert!(after.is_held().await.unwrap());
    assert!(after.release().await.unwrap());
}
