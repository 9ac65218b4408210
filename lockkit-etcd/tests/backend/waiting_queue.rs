//! The waiting queue: each release wakes only the next waiter, in queue order, a waiter whose
//! key was deleted queues again, and a holder that queues again at once never stalls its rival.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use lockkit_core::backend::OwnerToken;
use lockkit_core::testing::Recording;
use lockkit_core::{LockClient, LockOptions};
use lockkit_etcd::EtcdBackend;
use lockkit_etcd::etcd_client::DeleteOptions;

use crate::{client, support};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_release_wakes_only_the_next_of_fifty_waiters() {
    const WAITERS: usize = 50;
    const CLIENTS: usize = 5;
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("queue");
    // Only a watch can wake a waiter: the polling cap is far beyond the test's length.
    let options = LockOptions::default()
        .with_ttl(Duration::from_secs(10))
        .with_backoff(Duration::from_millis(5), Duration::from_secs(300));
    let mut recordings = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let etcd = EtcdBackend::connect(config.clone()).await.expect("connect");
        let recording = Arc::new(Recording::new(Arc::new(etcd)));
        recordings.push(recording.clone());
        clients.push(LockClient::with_options(recording, &ns, options.clone()).expect("client"));
    }
    // The acquisition attempts of every request, over all clients.
    let attempts_by_owner = || {
        let mut attempts: HashMap<OwnerToken, usize> = HashMap::new();
        for call in recordings.iter().flat_map(|r| r.calls()) {
            if let ("try_acquire", Some(owner)) = (call.method, call.owner) {
                *attempts.entry(owner).or_default() += 1;
            }
        }
        attempts
    };
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");

    let first = clients[0]
        .mutex("queue")
        .expect("key")
        .lock()
        .await
        .expect("lock");
    let grants = Arc::new(StdMutex::new(Vec::new()));
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..WAITERS {
        let (client, grants, inside) =
            (clients[i % CLIENTS].clone(), grants.clone(), inside.clone());
        tasks.spawn(async move {
            let guard = client
                .mutex("queue")?
                .lock_timeout(Duration::from_secs(120))
                .await?;
            assert_eq!(
                inside.fetch_add(1, Ordering::SeqCst),
                0,
                "two holders at once"
            );
            grants.lock().expect("grants").push(guard.fencing_token());
            tokio::time::sleep(Duration::from_millis(2)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.release().await
        });
    }
    let queued_by = Instant::now() + Duration::from_secs(30);
    loop {
        let info = clients[0]
            .inspect("queue")
            .await
            .expect("inspect")
            .expect("held");
        if info.waiters == Some(WAITERS) {
            break;
        }
        assert!(
            Instant::now() < queued_by,
            "only {:?} waiters queued",
            info.waiters
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let attempts_while_queued: usize = attempts_by_owner().values().sum();
    first.release().await.expect("release");
    while let Some(done) = tasks.join_next().await {
        assert!(
            done.expect("waiter panicked").expect("waiter"),
            "a release found the lock gone"
        );
    }

    let grants = grants.lock().expect("grants").clone();
    assert_eq!(grants.len(), WAITERS);
    assert!(
        grants.windows(2).all(|w| w[0] < w[1]),
        "waiters were not granted in queue order: {grants:?}"
    );
    let attempts = attempts_by_owner();
    // The holder's one attempt, then one per waiter to queue and one more when its own
    // predecessor left. A release that woke the herd would add dozens per release.
    assert_eq!(attempts_while_queued, WAITERS + 1);
    let woken_more_than_once: Vec<usize> = attempts.values().copied().filter(|&n| n > 2).collect();
    assert!(
        woken_more_than_once.is_empty(),
        "some waiters tried more than once after queueing: {woken_more_than_once:?}"
    );
    assert_eq!(attempts.values().sum::<usize>(), 2 * WAITERS + 1);
    support::expect_no_keys(&admin, &ns, Duration::from_secs(5)).await;
}

/// A waiter retries after a wait with reads alone; if its queue key was deleted meanwhile
/// (by an operator, say), the retry queues a new key rather than deciding on the missing one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_key_was_deleted_queues_again_and_is_granted() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("requeue");
    let options = LockOptions::default().with_ttl(Duration::from_secs(10));
    let holder = client(&config, &ns, options.clone()).await;
    let waiter = client(&config, &ns, options).await;
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");

    let held = holder
        .mutex("job")
        .expect("key")
        .lock()
        .await
        .expect("lock");
    let holder_key = lockkit_core::backend::lease_of(&held)
        .handle()
        .expect("etcd grants carry their key")
        .to_owned();
    let holder_token = held.fencing_token();
    let waiting = tokio::spawn(async move {
        waiter
            .mutex("job")?
            .lock_timeout(Duration::from_secs(20))
            .await
    });
    let queued_by = Instant::now() + Duration::from_secs(10);
    let waiter_key = loop {
        let keys = support::keys_under(&admin, &ns).await.expect("list keys");
        if let Some(key) = keys.into_iter().find(|k| *k != holder_key) {
            break key;
        }
        assert!(Instant::now() < queued_by, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let deleted = admin
        .client()
        .delete(
            waiter_key.as_str(),
            Some(DeleteOptions::new().with_prev_key()),
        )
        .await
        .expect("delete the waiter's key");
    let first_queued_at = deleted
        .prev_kvs()
        .first()
        .expect("the waiter's key was there")
        .create_revision();

    assert!(held.release().await.expect("release"));
    let next = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the waiter was not granted")
        .expect("join")
        .expect("the waiter is granted");
    assert!(next.fencing_token() > holder_token);
    // Granted on a key queued again (its name is reused), not on the deleted one.
    assert!(next.fencing_token().get() > first_queued_at as u64);
    assert!(next.is_held().await.expect("is_held"));
    assert!(next.release().await.expect("release"));
    support::expect_no_keys(&admin, &ns, Duration::from_secs(5)).await;
}

/// Two clients take and release one lock in tight loops. Each reuses its key name, so a
/// holder that releases and queues again at once reappears under the name its rival is
/// about to watch, now behind the rival: a waiter that checked its predecessor by name
/// alone would wait on a key queued after its own, and both would sit out `backoff_max`.
/// Every handoff must instead take a few round trips.
///
/// A stall from waiting on the wrong key lasts the whole `backoff_max` (4 s here), so the
/// test counts waits of a quarter of that: a handoff on a saturated machine takes tens of
/// milliseconds (a 100 ms threshold was crossed by a correct handoff with both cores busy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_looping_on_one_lock_never_wait_on_a_requeued_predecessor() {
    const CYCLES: usize = 200;
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("pingpong");
    let backoff_max = Duration::from_secs(4);
    let options = LockOptions::default()
        .with_ttl(Duration::from_secs(10))
        .with_backoff(Duration::from_millis(5), backoff_max);
    let stall = backoff_max / 4;
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let locks = client(&config, &ns, options.clone()).await;
        loops.spawn(async move {
            let mutex = locks.mutex("pingpong").expect("key");
            let mut stalls = Vec::new();
            for _ in 0..CYCLES {
                let asked = Instant::now();
                let guard = mutex
                    .lock_timeout(Duration::from_secs(30))
                    .await
                    .expect("lock");
                let waited = asked.elapsed();
                if waited > stall {
                    stalls.push(waited);
                }
                assert!(guard.release().await.expect("release"));
                if stalls.len() >= 3 {
                    break;
                }
            }
            stalls
        });
    }
    let mut stalls = Vec::new();
    while let Some(done) = loops.join_next().await {
        stalls.extend(done.expect("a loop panicked"));
    }
    assert!(
        stalls.is_empty(),
        "lock() waited longer than {stall:?} for a lock released at once: {stalls:?}"
    );
    let admin = EtcdBackend::connect(config).await.expect("connect");
    support::expect_no_keys(&admin, &ns, Duration::from_secs(5)).await;
}
