//! The conformance suite on the memory backend, and proof that the suite catches a backend
//! that breaks mutual exclusion or fencing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lockkit_core::testing::{self, Harness};
use lockkit_core::{
    AcquireRequest, Attempt, Capabilities, Grant, Lease, LockBackend, LockClient, LockInfo,
    LockKey, LockOptions, MemoryBackend, Renewal, Result, Tier, async_trait,
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
