//! The shared renewal scheduler: not starved by blocked user runtimes, one batch per backend
//! per tick, and the lost signal when renewals stop working.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockkit_core::backend::{
    AcquireRequest, Attempt, Grant, Lease, LockBackend, Renewal, async_trait,
};
use lockkit_core::{
    Capabilities, Error, ErrorKind, LockClient, LockInfo, LockKey, LockOptions, MemoryBackend,
    MutexGuard, Result, Tier,
};

/// Wraps the memory backend, counts renewal batches, and can make renewals fail.
#[derive(Debug, Clone, Default)]
struct Instrumented {
    memory: MemoryBackend,
    batches: Arc<AtomicUsize>,
    renewed: Arc<AtomicUsize>,
    failing: Arc<AtomicBool>,
    /// Grants report only a quarter of the TTL as valid (as after a slow quorum fan-out).
    short_grants: Arc<AtomicBool>,
    /// Every renewal takes this many milliseconds.
    renew_delay_ms: Arc<AtomicU64>,
    /// The next renewal alone takes this many milliseconds.
    next_renew_delay_ms: Arc<AtomicU64>,
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
        match self.memory.try_acquire(request).await? {
            Attempt::Granted(grant) if self.short_grants.load(Ordering::SeqCst) => Ok(
                Attempt::Granted(Grant::new(grant.fencing_token, grant.valid_for / 4)),
            ),
            other => Ok(other),
        }
    }
    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        self.memory.abandon(request).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        let delay = self.renew_delay_ms.load(Ordering::SeqCst)
            + self.next_renew_delay_ms.swap(0, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(delay)).await;
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
        futures_util::future::join_all(leases.iter().map(|lease| self.renew(lease))).await
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

/// Takes the lock `name`, which the test expects to be free.
async fn hold(locks: &LockClient, name: &str) -> MutexGuard {
    locks
        .mutex(name)
        .expect("valid key")
        .lock()
        .await
        .expect("a free lock")
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
        let guard = hold(&locks, "busy").await;
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
        guards.push(hold(&locks, &format!("lock-{i}")).await);
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
    let guard = hold(&locks, "doomed").await;
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
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_auto_renew_the_lease_expires_and_reports_lost() {
    let backend = Instrumented::default();
    let options = LockOptions::default()
        .with_ttl(Duration::from_millis(200))
        .with_auto_renew(false);
    let locks = LockClient::with_options(Arc::new(backend.clone()), "renewal-test", options)
        .expect("valid");
    let guard = hold(&locks, "lease").await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_with_little_validity_left_is_renewed_in_time() {
    let backend = Instrumented::default();
    backend.short_grants.store(true, Ordering::SeqCst);
    // The grant has 500 ms: its renewal is due at a third of that and has 300 ms to answer
    // (a loaded machine's scheduling delays fit), while a renewal timed from the TTL (due at
    // 667 ms) would come after the deadline.
    let ttl = Duration::from_secs(2);
    let locks = client(&backend, ttl);
    let guard = hold(&locks, "short").await;
    tokio::time::sleep(ttl).await;
    assert!(
        !guard.is_lost(),
        "a grant with a quarter of its TTL left was not renewed before its deadline"
    );
    assert!(guard.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_extend_never_moves_the_deadline_back() {
    let backend = Instrumented::default();
    let ttl = Duration::from_millis(600);
    let locks = client(&backend, ttl);
    let guard = hold(&locks, "slow-extend").await;
    backend.next_renew_delay_ms.store(450, Ordering::SeqCst);
    let mut best_seen = guard.valid_until();
    let outcome = {
        let extend = guard.extend();
        tokio::pin!(extend);
        loop {
            tokio::select! {
                outcome = &mut extend => break outcome,
                () = tokio::time::sleep(Duration::from_millis(10)) => best_seen = best_seen.max(guard.valid_until()),
            }
        }
    };
    outcome.expect("the slow extend succeeds");
    assert!(
        guard.valid_until() >= best_seen,
        "a late extend answer moved the deadline back"
    );
    tokio::time::sleep(ttl).await;
    assert!(!guard.is_lost());
    assert!(guard.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_answered_after_release_does_not_fire_lost() {
    let backend = Instrumented::default();
    backend.renew_delay_ms.store(250, Ordering::SeqCst);
    let ttl = Duration::from_millis(450);
    let locks = client(&backend, ttl);
    let guard = hold(&locks, "released").await;
    let lost = guard.lost_signal();
    // The first renewal starts at ttl/3 and answers 250 ms later, after the release.
    tokio::time::sleep(ttl / 3 + Duration::from_millis(50)).await;
    assert!(guard.release().await.expect("release"));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!lost.is_fired(), "a normal release fired the lost signal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_without_auto_renew_renews_once() {
    let backend = Instrumented::default();
    let ttl = Duration::from_millis(300);
    let options = LockOptions::default().with_ttl(ttl).with_auto_renew(false);
    let locks = LockClient::with_options(Arc::new(backend.clone()), "renewal-test", options)
        .expect("valid");
    let guard = hold(&locks, "manual").await;
    guard.extend().await.expect("extend");
    tokio::time::timeout(ttl * 5, guard.lost())
        .await
        .expect("the lease still expires");
    assert_eq!(
        backend.renewed.load(Ordering::SeqCst),
        1,
        "extend turned background renewal on"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_renewals_of_many_leases_do_not_lose_them() {
    let backend = Instrumented::default();
    backend.renew_delay_ms.store(5, Ordering::SeqCst);
    let ttl = Duration::from_millis(600);
    let locks = client(&backend, ttl);
    let mut guards = Vec::new();
    for i in 0..100 {
        guards.push(hold(&locks, &format!("slow-{i}")).await);
    }
    tokio::time::sleep(ttl * 3).await;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    assert_eq!(lost, 0, "{lost} of 100 leases lost to 5 ms renewals");
    for guard in guards {
        assert!(guard.release().await.expect("release"));
    }
}
