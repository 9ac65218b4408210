//! Elections over backends that bend the contract as far as it allows: waits that return at
//! once (the observer must not spin), reads that go back in term (a stale replica: the
//! observer must skip them), and backends without elections (refused with the reason).
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use lockkit_core::backend::{
    AcquireRequest, Attempt, Leader, Lease, LockBackend, Renewal, async_trait,
};
use lockkit_core::{
    Capabilities, Error, ErrorKind, FencingGuarantee, FencingToken, LockClient, LockInfo, LockKey,
    LockOptions, MemoryBackend, Result, Support, Tier, WaitStrategy,
};

/// A memory backend whose leader reads come from a script, once it runs out the memory
/// backend's own, and whose waits for a leader change return at once.
#[derive(Debug, Default)]
struct Restless {
    memory: MemoryBackend,
    script: StdMutex<VecDeque<Option<Leader>>>,
    reads: AtomicUsize,
    /// How many proclamations still fail with a retryable error.
    failing_proclaims: AtomicUsize,
    /// How many proclamations are still answered a second after they were stored.
    slow_proclaims: AtomicUsize,
    /// How many proclamations are still answered 8 ms before their grant's validity ends.
    late_proclaims: AtomicUsize,
    /// How many proclamations still find the leadership gone.
    refused_proclaims: AtomicUsize,
    /// How many proclamations were asked for.
    proclaims: AtomicUsize,
    /// Whether terms may go back (a Redis tier's best-effort fencing).
    best_effort: AtomicBool,
}

#[async_trait]
impl LockBackend for Restless {
    fn name(&self) -> &'static str {
        "restless"
    }
    fn tier(&self) -> Tier {
        Tier::Local
    }
    fn capabilities(&self) -> Capabilities {
        if self.best_effort.load(Ordering::SeqCst) {
            return Capabilities::new(FencingGuarantee::BestEffort, WaitStrategy::Notify)
                .with_election(Support::Supported);
        }
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
    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool> {
        self.proclaims.fetch_add(1, Ordering::SeqCst);
        if self
            .refused_proclaims
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Ok(false);
        }
        if self
            .failing_proclaims
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Error::new(ErrorKind::Unavailable, "restless", "a blip"));
        }
        if self
            .slow_proclaims
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            // Stored at once, answered a second later.
            let stored = self.memory.proclaim(lease, value).await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            return Ok(stored);
        }
        if self
            .late_proclaims
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            // The validity ends at the grant's send time + TTL - drift (1% + 2 ms).
            let drift = lease.ttl() / 100 + Duration::from_millis(2);
            let answer_at = lease.acquired_at() + lease.ttl() - drift - Duration::from_millis(8);
            let stored = self.memory.proclaim(lease, value).await?;
            tokio::time::sleep_until(answer_at.into()).await;
            return Ok(stored);
        }
        self.memory.proclaim(lease, value).await
    }
    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let scripted = self.script.lock().unwrap().pop_front();
        match scripted {
            Some(leader) => Ok(leader),
            None => self.memory.leader(key).await,
        }
    }
    async fn wait_for_leader_change(
        &self,
        _key: &LockKey,
        _seen: Option<&Leader>,
        _max_wait: Duration,
    ) -> Result<()> {
        // At once, but yielding: a spinning observer then fails the test instead of hanging it.
        tokio::task::yield_now().await;
        Ok(())
    }
}

fn leader(term: u64, value: &str) -> Option<Leader> {
    Some(Leader::new(FencingToken(term), Some(value.into())))
}

#[tokio::test]
async fn an_observer_of_a_backend_that_wakes_at_once_does_not_spin() {
    let backend = Arc::new(Restless::default());
    let options =
        LockOptions::default().with_backoff(Duration::from_millis(10), Duration::from_millis(200));
    let locks = LockClient::with_options(backend.clone(), "ns", options).unwrap();
    let election = locks.election("calm").unwrap();
    let mut changes = election.observe();
    assert_eq!(changes.next().await.unwrap().unwrap(), None);
    // Nothing changes for a second while every wait returns at once.
    let quiet = tokio::time::timeout(Duration::from_secs(1), changes.next()).await;
    assert!(quiet.is_err(), "a change was reported: {quiet:?}");
    let reads = backend.reads.load(Ordering::SeqCst);
    assert!(
        reads < 50,
        "{reads} leader reads in a quiet second: the observer spins"
    );
}

#[tokio::test]
async fn an_observer_skips_a_read_that_goes_back_in_term() {
    let backend = Arc::new(Restless::default());
    backend.script.lock().unwrap().extend([
        leader(5, "five"),
        leader(3, "three, from a stale replica"),
        None,
        leader(3, "three again"),
        leader(6, "six"),
    ]);
    let locks = LockClient::with_options(backend, "ns", LockOptions::default()).unwrap();
    let mut changes = locks.election("ordered").unwrap().observe();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(changes.next().await.unwrap().unwrap());
    }
    assert_eq!(seen, [leader(5, "five"), None, leader(6, "six")]);
}

#[tokio::test]
async fn where_terms_can_go_back_an_observer_reports_a_lower_term() {
    let backend = Arc::new(Restless::default());
    backend.best_effort.store(true, Ordering::SeqCst);
    backend.script.lock().unwrap().extend([
        leader(5, "five"),
        leader(1, "one, after a restart without persistence"),
        leader(2, "two"),
    ]);
    let locks = LockClient::with_options(backend, "ns", LockOptions::default()).unwrap();
    let mut changes = locks.election("restarted").unwrap().observe();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let next = tokio::time::timeout(Duration::from_secs(5), changes.next())
            .await
            .unwrap_or_else(|_| panic!("no change after {seen:?}: a lower term was hidden"));
        seen.push(next.unwrap().unwrap());
    }
    assert_eq!(
        seen,
        [
            leader(5, "five"),
            leader(1, "one, after a restart without persistence"),
            leader(2, "two")
        ]
    );
}

#[tokio::test]
async fn a_campaign_whose_leaderships_keep_ending_backs_off_and_gives_up_after_its_budget() {
    let backend = Arc::new(Restless::default());
    backend
        .refused_proclaims
        .store(usize::MAX, Ordering::SeqCst);
    let options = LockOptions::default()
        .with_backoff(Duration::from_millis(10), Duration::from_millis(50))
        .with_error_budget(Duration::from_millis(500));
    let locks = LockClient::with_options(backend.clone(), "ns", options).unwrap();
    let election = locks.election("ending").unwrap();
    let failed = tokio::time::timeout(Duration::from_secs(10), election.campaign("v"))
        .await
        .expect("the campaign gave up after its error budget")
        .unwrap_err();
    assert_eq!(failed.kind(), ErrorKind::Unavailable, "{failed}");
    let proclaims = backend.proclaims.load(Ordering::SeqCst);
    assert!(
        proclaims <= 60,
        "{proclaims} proclamations in half a second: the campaign does not back off"
    );
    locks.close().await;
    assert!(locks.inspect("ending").await.unwrap().is_none());
}

#[tokio::test]
async fn a_backend_without_elections_is_refused_with_its_reason() {
    #[derive(Debug)]
    struct Plain(MemoryBackend);
    #[async_trait]
    impl LockBackend for Plain {
        fn name(&self) -> &'static str {
            "plain"
        }
        fn tier(&self) -> Tier {
            Tier::Local
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::new(FencingGuarantee::Monotonic, WaitStrategy::Notify)
                .with_election(Support::Unsupported("plain locks only, for this test"))
        }
        async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
            self.0.try_acquire(request).await
        }
        async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
            self.0.abandon(request).await
        }
        async fn renew(&self, lease: &Lease) -> Result<Renewal> {
            self.0.renew(lease).await
        }
        async fn release(&self, lease: &Lease) -> Result<bool> {
            self.0.release(lease).await
        }
        async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
            self.0.inspect(key).await
        }
        async fn ping(&self) -> Result<()> {
            Ok(())
        }
    }
    let locks = LockClient::new(Plain(MemoryBackend::new()));
    let refused = locks.election("e").unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Unsupported);
    assert!(
        refused.to_string().contains("plain locks only"),
        "the reason is missing: {refused}"
    );
    // A mutex on the same backend works.
    assert!(
        locks
            .mutex("e")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn an_oversized_value_is_refused_before_anything_is_taken() {
    let locks = LockClient::new(MemoryBackend::new());
    let election = locks.election("big").unwrap();
    let value = "x".repeat(lockkit_core::MAX_VALUE_LEN + 1);
    let refused = election.campaign(value).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidConfig);
    assert!(
        locks.inspect("big").await.unwrap().is_none(),
        "the lock was taken"
    );
}

#[tokio::test]
async fn a_campaign_retries_a_proclamation_that_failed_on_a_blip() {
    let backend = Arc::new(Restless::default());
    backend.failing_proclaims.store(3, Ordering::SeqCst);
    let options =
        LockOptions::default().with_backoff(Duration::from_millis(1), Duration::from_millis(5));
    let locks = LockClient::with_options(backend.clone(), "ns", options).unwrap();
    let leadership = locks
        .election("blips")
        .unwrap()
        .campaign("v")
        .await
        .unwrap();
    assert_eq!(backend.failing_proclaims.load(Ordering::SeqCst), 0);
    assert_eq!(leadership.value(), "v");
    assert!(leadership.resign().await.unwrap());

    // Past the error budget, the error is the campaign's, and the grant is given back.
    backend
        .failing_proclaims
        .store(usize::MAX, Ordering::SeqCst);
    let short_budget = LockOptions::default()
        .with_backoff(Duration::from_millis(1), Duration::from_millis(5))
        .with_error_budget(Duration::from_millis(50));
    let locks = LockClient::with_options(backend.clone(), "ns", short_budget).unwrap();
    let failed = locks
        .election("blips")
        .unwrap()
        .campaign("v")
        .await
        .unwrap_err();
    assert_eq!(failed.kind(), ErrorKind::Unavailable);
    locks.close().await;
    assert!(
        locks.inspect("blips").await.unwrap().is_none(),
        "the grant was kept"
    );
}

#[tokio::test]
async fn a_campaign_whose_proclamation_outlived_the_grant_campaigns_again() {
    let backend = Arc::new(Restless::default());
    backend.slow_proclaims.store(1, Ordering::SeqCst);
    // Not renewed: the first grant's 300 ms of validity run out while its proclamation's
    // answer takes a second.
    let options = LockOptions::default()
        .with_ttl(Duration::from_millis(300))
        .with_auto_renew(false);
    let locks = LockClient::with_options(backend.clone(), "ns", options).unwrap();
    let election = locks.election("slow").unwrap();
    let leadership = election.campaign("v").await.unwrap();
    assert!(
        !leadership.is_lost(),
        "the campaign returned a leadership past its validity"
    );
    assert_eq!(backend.slow_proclaims.load(Ordering::SeqCst), 0);
    assert!(leadership.resign().await.unwrap());
}

#[tokio::test]
async fn a_leadership_proclaimed_with_almost_no_validity_left_is_renewed_first() {
    let backend = Arc::new(Restless::default());
    backend.late_proclaims.store(1, Ordering::SeqCst);
    // Not renewed in the background: only the campaign's own renewal can restore it.
    let ttl = Duration::from_secs(1);
    let options = LockOptions::default().with_ttl(ttl).with_auto_renew(false);
    let locks = LockClient::with_options(backend.clone(), "ns", options).unwrap();
    let election = locks.election("late").unwrap();
    let leadership = election.campaign("v").await.unwrap();
    // Handed out as answered, it would have 8 ms (less if this machine is slow) left: a lost
    // signal firing before the leader's first step. Renewed (or, if the answer came past the
    // validity, campaigned for again), it has most of its TTL.
    assert!(
        leadership.guard().remaining() > ttl / 2,
        "the campaign returned a leadership with {:?} left",
        leadership.guard().remaining()
    );
    assert_eq!(backend.late_proclaims.load(Ordering::SeqCst), 0);
    assert!(leadership.resign().await.unwrap());
}
