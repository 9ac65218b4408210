//! The conformance suite on the memory backend, and proof that the suite catches a backend
//! that breaks mutual exclusion or fencing.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use lockkit_core::backend::{
    AcquireRequest, Attempt, Contention, Grant, Leader, Lease, LockBackend, Renewal, async_trait,
};
use lockkit_core::testing::{self, Harness};
use lockkit_core::{
    Capabilities, LockClient, LockInfo, LockKey, LockOptions, LockPage, MemoryBackend, Result, Tier,
};

/// Clients of one harness share one memory backend, as processes share one server.
struct MemoryHarness<B = MemoryBackend> {
    backend: B,
    memory: MemoryBackend,
}

impl MemoryHarness {
    fn new() -> Self {
        let memory = MemoryBackend::new();
        MemoryHarness {
            backend: memory.clone(),
            memory,
        }
    }
}

#[async_trait]
impl<B: LockBackend + Clone> Harness for MemoryHarness<B> {
    async fn client(&self, namespace: &str, options: LockOptions) -> Result<LockClient> {
        LockClient::with_options(Arc::new(self.backend.clone()), namespace, options)
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(400)
    }

    async fn force_release(&self, key: &LockKey) -> Result<()> {
        self.memory.force_release(key);
        Ok(())
    }

    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>> {
        Ok(self
            .memory
            .held_keys(namespace)
            .iter()
            .map(ToString::to_string)
            .collect())
    }
}

async fn memory_harness() -> Option<MemoryHarness> {
    Some(MemoryHarness::new())
}

lockkit_core::conformance_tests!(memory_harness);

/// The memory backend behind a slow link, with a server-side waiting queue: every call takes
/// 1-3 ms, so cancellations land in the middle of attempts, grants and clean-ups, and a
/// waiter that is not cleaned up leaves a queue entry the leftovers check sees.
#[derive(Debug, Clone, Default)]
struct Slow {
    memory: MemoryBackend,
    queue: Arc<StdMutex<HashSet<(LockKey, String)>>>,
}

async fn lag() {
    tokio::time::sleep(Duration::from_micros(rand::random_range(1_000..3_000))).await;
}

impl Slow {
    fn queue(&self) -> std::sync::MutexGuard<'_, HashSet<(LockKey, String)>> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl LockBackend for Slow {
    fn name(&self) -> &'static str {
        "slow-memory"
    }
    fn tier(&self) -> Tier {
        Tier::Local
    }
    fn capabilities(&self) -> Capabilities {
        self.memory.capabilities()
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        lag().await;
        let attempt = self.memory.try_acquire(request).await?;
        let entry = (request.key.clone(), request.owner.expose_hex());
        match &attempt {
            Attempt::Contended(_) if request.wait => {
                self.queue().insert(entry);
            }
            _ => {
                self.queue().remove(&entry);
            }
        }
        lag().await;
        Ok(attempt)
    }
    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        self.memory
            .wait_for_change(request, contention, max_wait)
            .await
    }
    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        lag().await;
        self.queue()
            .remove(&(request.key.clone(), request.owner.expose_hex()));
        self.memory.abandon(request).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        lag().await;
        self.memory.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<bool> {
        lag().await;
        self.memory.release(lease).await
    }
    async fn is_held(&self, lease: &Lease) -> Result<bool> {
        lag().await;
        self.memory.is_held(lease).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        lag().await;
        self.memory.inspect(key).await
    }
    async fn ping(&self) -> Result<()> {
        Ok(())
    }
    async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        lag().await;
        self.memory.list(namespace, prefix, cursor, limit).await
    }
    async fn force_release(&self, key: &LockKey) -> Result<bool> {
        lag().await;
        LockBackend::force_release(&self.memory, key).await
    }
    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool> {
        lag().await;
        self.memory.proclaim(lease, value).await
    }
    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>> {
        lag().await;
        self.memory.leader(key).await
    }
    async fn wait_for_leader_change(
        &self,
        key: &LockKey,
        seen: Option<&Leader>,
        max_wait: Duration,
    ) -> Result<()> {
        self.memory
            .wait_for_leader_change(key, seen, max_wait)
            .await
    }
}

struct SlowHarness(Slow);

#[async_trait]
impl Harness for SlowHarness {
    async fn client(&self, namespace: &str, options: LockOptions) -> Result<LockClient> {
        LockClient::with_options(Arc::new(self.0.clone()), namespace, options)
    }
    fn ttl(&self) -> Duration {
        Duration::from_millis(400)
    }
    async fn force_release(&self, key: &LockKey) -> Result<()> {
        self.0.memory.force_release(key);
        Ok(())
    }
    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>> {
        let mut left: Vec<String> = self
            .0
            .memory
            .held_keys(namespace)
            .iter()
            .map(ToString::to_string)
            .collect();
        left.extend(
            self.0
                .queue()
                .iter()
                .filter(|(key, _)| key.namespace() == namespace)
                .map(|(key, _)| format!("queue entry of {key}")),
        );
        Ok(left)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_suite_passes_over_a_slow_link() {
    let harness = SlowHarness(Slow::default());
    let failures = testing::run_all(&harness).await;
    assert!(failures.is_empty(), "{failures:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_that_drift_would_eat_is_refused() {
    let locks = LockClient::new(MemoryBackend::new());
    let err = locks
        .mutex("tiny")
        .expect("key")
        .with_ttl(Duration::from_millis(2))
        .expect_err("a 2 ms TTL cannot be honoured: refused when the mutex is built");
    assert_eq!(err.kind(), lockkit_core::ErrorKind::InvalidConfig, "{err}");
}

#[test]
fn the_macro_generates_every_scenario() {
    let source = include_str!("../src/testing/mod.rs");
    for (name, _) in testing::SCENARIOS {
        assert!(
            source.contains(&format!("            {name},")),
            "conformance_tests! misses {name}"
        );
    }
}

/// A backend that grants every request: no exclusion at all.
#[derive(Debug, Clone, Default)]
struct GrantsEveryone {
    memory: MemoryBackend,
    fence: Arc<AtomicU64>,
}

#[async_trait]
impl LockBackend for GrantsEveryone {
    fn name(&self) -> &'static str {
        "broken"
    }
    fn tier(&self) -> Tier {
        Tier::Local
    }
    fn capabilities(&self) -> Capabilities {
        self.memory.capabilities()
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let token = self.fence.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Attempt::Granted(Grant::new(
            lockkit_core::FencingToken(token),
            request.ttl,
        )))
    }
    async fn abandon(&self, _request: &AcquireRequest) -> Result<()> {
        Ok(())
    }
    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        Ok(Renewal::Extended(lease.ttl()))
    }
    async fn release(&self, _lease: &Lease) -> Result<bool> {
        Ok(true)
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.memory.inspect(key).await
    }
    async fn ping(&self) -> Result<()> {
        Ok(())
    }
}

/// A backend that excludes correctly but hands out the same fencing token every time.
#[derive(Debug, Clone, Default)]
struct RepeatsTokens {
    memory: MemoryBackend,
}

#[async_trait]
impl LockBackend for RepeatsTokens {
    fn name(&self) -> &'static str {
        "broken"
    }
    fn tier(&self) -> Tier {
        Tier::Local
    }
    fn capabilities(&self) -> Capabilities {
        self.memory.capabilities()
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        Ok(match self.memory.try_acquire(request).await? {
            Attempt::Granted(grant) => {
                Attempt::Granted(Grant::new(lockkit_core::FencingToken(1), grant.valid_for))
            }
            contended => contended,
        })
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

fn broken<B: LockBackend + Clone>(backend: B, memory: MemoryBackend) -> MemoryHarness<B> {
    MemoryHarness { backend, memory }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_catches_a_backend_without_exclusion() {
    let backend = GrantsEveryone::default();
    let harness = broken(backend.clone(), backend.memory.clone());
    let failure = testing::run_scenario(&harness, "mutual_exclusion_under_contention")
        .await
        .expect_err("mutual exclusion must fail on a backend that grants everyone");
    assert!(
        failure.0.contains("overlapped") || failure.0.contains("lost"),
        "{failure}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_catches_repeated_fencing_tokens() {
    let backend = RepeatsTokens::default();
    let harness = broken(backend.clone(), backend.memory.clone());
    let failure = testing::run_scenario(&harness, "fencing_tokens_strictly_increase")
        .await
        .expect_err("fencing must fail on a backend that repeats tokens");
    assert!(failure.0.contains("not above"), "{failure}");
    let failure = testing::run_scenario(&harness, "mutual_exclusion_under_contention")
        .await
        .expect_err("grant order must show the repeated tokens");
    assert!(failure.0.contains("fencing tokens"), "{failure}");
}
