//! The shared renewal scheduler: not starved by blocked user runtimes, one batch per backend
//! per tick, and the lost signal when renewals stop working.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockkit_core::{
    AcquireRequest, Attempt, Capabilities, Error, ErrorKind, Lease, LockBackend, LockClient,
    LockInfo, LockKey, LockOptions, MemoryBackend, Renewal, Result, Tier, async_trait,
};

/// Wraps the memory backend, counts renewal batches, and can make renewals fail.
#[derive(Debug, Clone, Default)]
struct Instrumented {
    memory: MemoryBackend,
    batches: Arc<AtomicUsize>,
    renewed: Arc<AtomicUsize>,
    failing: Arc<AtomicBool>,
}

#[async_trait]
impl LockBackend for Instrumented {
    fn name(&self) -> &'static str {
        "instrumented"
    }
    fn tier(&self) -> Tier {
        Tier::Local
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
        if self.failing.load(Ordering::SeqCst) {
            return Err(Error::new(
                ErrorKind::Unavailable,
                "instrumented",
                "connection refused",
            ));
        }
        self.renewed.fetch_add(1, Ordering::SeqCst);
        self.memory.renew(lease).await
    }
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        let mut out = Vec::new();
        for lease in leases {
            out.push(self.renew(lease).await);
        }
        out
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

fn client(backend: &Instrumented, ttl: Duration) -> LockClient {
    let options = LockOptions::default().with_ttl(ttl);
    LockClient::with_options(Arc::new(backend.clone()), "renewal-test", options)
        .expect("valid options")
}

#[test]
fn renewal_continues_while_the_user_runtime_is_blocked() {
    let backend = Instrumented::default();
    let locks = client(&backend, Duration::from_millis(300));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let guard = locks
            .mutex("busy")
            .expect("key")
            .lock()
            .await
            .expect("lock");
        // CPU-bound work that never yields, for more than three TTLs: the user's only worker
        // thread is blocked, yet the lock must stay renewed.
        std::thread::sleep(Duration::from_millis(1_000));
        assert!(
            !guard.is_lost(),
            "the lock was lost while the user runtime was blocked"
        );
        assert!(guard.is_held().await.expect("inspect"));
        assert!(guard.release().await.expect("release"));
    });
    assert!(
        backend.renewed.load(Ordering::SeqCst) >= 2,
        "renewals did not run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_batch_per_tick_renews_every_held_lock() {
    let backend = Instrumented::default();
    let ttl = Duration::from_millis(600);
    let locks = client(&backend, ttl);
    let mut guards = Vec::new();
    for i in 0..100 {
        guards.push(
            locks
                .mutex(&format!("lock-{i}"))
                .expect("key")
                .lock()
                .await
                .expect("lock"),
        );
    }
    let started = Instant::now();
    tokio::time::sleep(ttl * 3).await;
    let (batches, renewed) = (
        backend.batches.load(Ordering::SeqCst),
        backend.renewed.load(Ordering::SeqCst),
    );
    let ticks = (started.elapsed().as_secs_f64() / (ttl.as_secs_f64() / 3.0)).ceil() as usize;
    assert!(
        renewed >= 100 * 3,
        "only {renewed} renewals for 100 locks over 3 TTLs"
    );
    assert!(
        batches <= ticks * 3 + 3,
        "{batches} renewal batches for {ticks} ticks: leases are not renewed together"
    );
    for guard in guards {
        assert!(!guard.is_lost());
        assert!(guard.release().await.expect("release"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_renewals_fire_lost_at_the_validity_deadline() {
    let backend = Instrumented::default();
    let ttl = Duration::from_millis(400);
    let locks = client(&backend, ttl);
    let guard = locks
        .mutex("doomed")
        .expect("key")
        .lock()
        .await
        .expect("lock");
    let deadline = guard.valid_until();
    backend.failing.store(true, Ordering::SeqCst);
    tokio::time::timeout(ttl * 5, guard.lost())
        .await
        .expect("lost must fire");
    let fired_at = Instant::now();
    assert!(
        fired_at >= deadline,
        "lost fired before the validity deadline"
    );
    assert!(guard.is_lost());
    let err = guard.extend().await.expect_err("extend after loss");
    assert_eq!(err.kind(), ErrorKind::Unavailable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_auto_renew_the_lease_expires_and_reports_lost() {
    let backend = Instrumented::default();
    let options = LockOptions::default()
        .with_ttl(Duration::from_millis(200))
        .with_auto_renew(false);
    let locks = LockClient::with_options(Arc::new(backend.clone()), "renewal-test", options)
        .expect("valid");
    let guard = locks
        .mutex("lease")
        .expect("key")
        .lock()
        .await
        .expect("lock");
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost must fire");
    assert_eq!(backend.renewed.load(Ordering::SeqCst), 0);
    // The local deadline is conservative (drift comes off it); the server lets go a little later.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !guard.release().await.expect("release"),
        "an expired lease was still ours"
    );
}
