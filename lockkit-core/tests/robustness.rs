//! The mutex under hostile values and a misbehaving backend: deadlines that would overflow, a TTL
//! past the maximum, a leader election that answers errors for a while, a wake-up that never
//! comes, and releases still on their way when the process shuts down.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockkit_core::backend::{
    AcquireRequest, Attempt, Contention, Grant, Lease, LockBackend, Renewal, async_trait,
};
use lockkit_core::{
    Capabilities, Error, ErrorKind, FencingGuarantee, LockClient, LockInfo, LockKey, LockOptions,
    MemoryBackend, Result, Tier, WaitStrategy,
};

/// How [`Twisted`] bends the memory backend it wraps.
#[derive(Debug, Clone, Copy)]
enum Twist {
    /// Answers `Unavailable` at once to the first N attempts, as a cluster does while it
    /// elects a leader.
    Electing(usize),
    /// Its waits never hear a release (a pub/sub message lost in a reconnect), and its
    /// contention says the holder may keep the lock for a minute.
    Deaf,
    /// Declares a queue (`WaitStrategy::Queue`), woken by the release like a watch.
    Queueing,
    /// Its grants arrive with no validity left (the attempt queued behind thousands of
    /// others), while a renewal sent afterwards answers in time.
    Late,
    /// Its attempts answer a grant for the full TTL only after this long (an attempt that
    /// waited behind a failover), while a renewal answers at once.
    Slow(Duration),
    /// Its releases take this long to reach the server (a slow link at shutdown).
    SlowRelease(Duration),
}

/// A memory backend with one [`Twist`], counting attempts and clean-ups.
#[derive(Debug)]
struct Twisted {
    memory: MemoryBackend,
    twist: Twist,
    attempts: AtomicUsize,
    abandoned: AtomicUsize,
}

impl Twisted {
    fn new(twist: Twist) -> Arc<Self> {
        Arc::new(Twisted {
            memory: MemoryBackend::new(),
            twist,
            attempts: AtomicUsize::new(0),
            abandoned: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl LockBackend for Twisted {
    fn name(&self) -> &'static str {
        "twisted"
    }
    fn tier(&self) -> Tier {
        self.memory.tier()
    }
    fn capabilities(&self) -> Capabilities {
        match self.twist {
            Twist::Queueing => Capabilities::new(FencingGuarantee::Monotonic, WaitStrategy::Queue),
            _ => self.memory.capabilities(),
        }
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let attempt = self.attempts.fetch_add(1, Ordering::SeqCst);
        if let Twist::Electing(failures) = self.twist
            && attempt < failures
        {
            return Err(Error::new(
                ErrorKind::Unavailable,
                "twisted",
                "etcdserver: no leader",
            ));
        }
        Ok(
            match (self.twist, self.memory.try_acquire(request).await?) {
                (Twist::Deaf, Attempt::Contended(_)) => {
                    Attempt::Contended(Contention::new().with_retry_after(Duration::from_secs(60)))
                }
                (Twist::Late, Attempt::Granted(grant)) => {
                    Attempt::Granted(Grant::new(grant.fencing_token, Duration::from_millis(1)))
                }
                (Twist::Slow(delay), attempt) => {
                    tokio::time::sleep(delay).await;
                    attempt
                }
                (_, attempt) => attempt,
            },
        )
    }
    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        match self.twist {
            // Sleeps `max_wait` and hears nothing, as the trait's default does.
            Twist::Deaf => {
                tokio::time::sleep(max_wait).await;
                Ok(None)
            }
            _ => {
                self.memory
                    .wait_for_change(request, contention, max_wait)
                    .await
            }
        }
    }
    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        self.abandoned.fetch_add(1, Ordering::SeqCst);
        self.memory.abandon(request).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        self.memory.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> Result<bool> {
        if let Twist::SlowRelease(delay) = self.twist {
            tokio::time::sleep(delay).await;
        }
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
    let guard = mutex
        .clone()
        .with_options(endless)
        .unwrap()
        .lock()
        .await
        .unwrap();
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
            .expect_err("a TTL past the maximum is refused when the mutex is built");
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
        assert!(err.to_string().contains("lock.ttl"), "{err}");
    }
}

#[tokio::test]
async fn a_waiting_lock_rides_out_a_burst_of_retryable_errors() {
    // Fifty errors in a row, answered at once: far more than any count of retries a fast
    // error rate runs through in the second an election takes.
    let backend = Twisted::new(Twist::Electing(50));
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
    let backend = Twisted::new(Twist::Electing(usize::MAX));
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
    let err = locks(
        Twisted::new(Twist::Electing(usize::MAX)),
        LockOptions::default(),
    )
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
    let backend = Twisted::new(Twist::Electing(1));
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
    let locks = locks(Twisted::new(Twist::Deaf), options);
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

#[tokio::test]
async fn a_queue_waiter_does_not_re_read_the_queue_every_backoff_max() {
    let backend = Twisted::new(Twist::Queueing);
    let options = LockOptions::default()
        .with_ttl(Duration::from_secs(20))
        .with_backoff(Duration::from_millis(5), Duration::from_millis(20));
    let locks = locks(backend.clone(), options);
    let mutex = locks.mutex("queue").unwrap();
    let guard = mutex.lock().await.unwrap();
    let waiter = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.lock_timeout(Duration::from_secs(60)).await.map(drop) }
    });
    // 50 times `backoff_max`: a waiter that re-read the queue that often would attempt ~50 times.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let attempts = backend.attempts.load(Ordering::SeqCst);
    assert!(
        attempts <= 4,
        "{attempts} attempts while the lock was held: the waiter polled its queue"
    );
    assert!(guard.release().await.unwrap());
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the release woke the queue waiter")
        .unwrap()
        .unwrap();
}

/// Locks with `twist` and `ttl`, and checks that the grant was confirmed by a renewal (never
/// given back) and handed out with more than half the TTL left. A round whose renewal could
/// not answer in the little validity left (a busy machine) gives the grant back and takes it
/// again, which is correct but proves nothing: it is run again, up to five rounds.
async fn confirmed_by_a_renewal(twist: Twist, ttl: Duration) {
    for _ in 0..5 {
        let backend = Twisted::new(twist);
        let guard = locks(backend.clone(), LockOptions::default().with_ttl(ttl))
            .mutex("late")
            .unwrap()
            .lock_timeout(Duration::from_secs(5))
            .await
            .expect("the renewal confirmed the grant");
        if backend.abandoned.load(Ordering::SeqCst) > 0 {
            drop(guard);
            continue;
        }
        assert!(
            guard.remaining() > ttl / 2,
            "handed out with {:?} left instead of the renewal's validity",
            guard.remaining()
        );
        assert!(guard.is_held().await.unwrap());
        assert!(guard.release().await.unwrap());
        return;
    }
    panic!("in 5 rounds every grant was given back: none was confirmed by a renewal");
}

#[tokio::test]
async fn a_grant_that_arrives_too_late_is_confirmed_by_a_renewal_not_given_back() {
    confirmed_by_a_renewal(Twist::Late, Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_grant_that_arrives_nearly_expired_is_confirmed_by_a_renewal() {
    // 950 ms of a 1 s TTL gone on the way: under the floor of a tenth, the guard would be lost
    // before its holder's first step.
    confirmed_by_a_renewal(
        Twist::Slow(Duration::from_millis(950)),
        Duration::from_secs(1),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_waits_for_the_background_releases_of_dropped_guards() {
    let backend = Twisted::new(Twist::SlowRelease(Duration::from_secs(3)));
    let locks = locks(backend.clone(), LockOptions::default());
    for name in ["a", "b", "c"] {
        drop(locks.mutex(name).unwrap().lock().await.unwrap());
    }
    // A cancelled release is background work too.
    let guard = locks.mutex("d").unwrap().lock().await.unwrap();
    let _ = tokio::time::timeout(Duration::ZERO, guard.release()).await;
    assert!(
        locks.inspect("a").await.unwrap().is_some(),
        "the releases are still on their way: without close, a process exiting now leaves them"
    );
    let started = Instant::now();
    locks.clone().close().await;
    for name in ["a", "b", "c", "d"] {
        assert!(
            locks.inspect(name).await.unwrap().is_none(),
            "{name} still held after close returned (after {:?})",
            started.elapsed()
        );
    }
    // Nothing left running: close returns at once.
    tokio::time::timeout(Duration::from_secs(5), locks.close())
        .await
        .expect("close with nothing in the background returns");
}
