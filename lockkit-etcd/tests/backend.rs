//! etcd-specific behaviour against the compose cluster, none of which disturbs the cluster:
//! sessions lost by revocation and by a dead link, the waiting queue, fenced writes.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use lockkit_core::backend::OwnerToken;
use lockkit_core::testing::Recording;
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{ErrorKind, LockClient, LockOptions, MutexGuard};
use lockkit_etcd::etcd_client::{Compare, CompareOp, DeleteOptions, TxnOp};
use lockkit_etcd::{EtcdBackend, EtcdConfig};

async fn client(config: &EtcdConfig, namespace: &str, options: LockOptions) -> LockClient {
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    LockClient::with_options(Arc::new(backend), namespace, options).expect("client")
}

type Waiting = tokio::task::JoinHandle<lockkit_core::Result<(MutexGuard, Instant)>>;

/// `holder` takes "job"; `waiter` queues for it and reports when it is granted.
async fn hold_with_a_waiter(holder: &LockClient, waiter: LockClient) -> (MutexGuard, Waiting) {
    let held = holder
        .mutex("job")
        .expect("key")
        .lock()
        .await
        .expect("lock");
    let waiting = tokio::spawn(async move {
        let guard = waiter
            .mutex("job")?
            .lock_timeout(Duration::from_secs(30))
            .await?;
        Ok((guard, Instant::now()))
    });
    (held, waiting)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_lease_fires_lost_at_once_and_the_next_waiter_is_granted() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("revoke");
    let ttl = Duration::from_secs(6);
    let options = LockOptions::default().with_ttl(ttl);
    let holder = client(&config, &ns, options.clone()).await;
    let waiter = client(&config, &ns, options).await;
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");

    let (held, waiting) = hold_with_a_waiter(&holder, waiter).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let lease = support::lease_of(
        lockkit_core::backend::lease_of(&held)
            .handle()
            .expect("etcd grants carry their key"),
    );
    let revoked_at = Instant::now();
    admin
        .client()
        .lease_revoke(lease)
        .await
        .expect("revoke the holder's session lease");
    tokio::time::timeout(ttl / 2, held.lost())
        .await
        .expect("lost() fires well before the TTL once the lease is revoked");
    let lost_after = revoked_at.elapsed();

    let (next, granted_at) = waiting.await.expect("join").expect("the waiter is granted");
    assert!(granted_at >= revoked_at);
    assert!(
        next.fencing_token() > held.fencing_token(),
        "{} after {}",
        next.fencing_token(),
        held.fencing_token()
    );
    assert!(!held.is_held().await.expect("is_held"));
    assert!(
        !held.release().await.expect("release"),
        "a revoked grant was released as ours"
    );
    assert!(next.release().await.expect("release"));
    eprintln!("lost {lost_after:?} after the revoke (TTL {ttl:?})");
    support::expect_no_keys(&admin, &ns, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_whose_keep_alive_is_cut_sees_lost_within_its_ttl() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("cut");
    let ttl = Duration::from_secs(3);
    let proxy = FaultProxy::start(&config.endpoints)
        .await
        .expect("a fault proxy");
    let mut cut_config = config.clone();
    cut_config.endpoints = proxy.hosts();
    cut_config.request_timeout = Duration::from_secs(1);
    let options = LockOptions::default().with_ttl(ttl);
    let holder = client(&cut_config, &ns, options.clone()).await;
    let waiter = client(&config, &ns, options).await;
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");

    let (held, waiting) = hold_with_a_waiter(&holder, waiter).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let cut_at = Instant::now();
    proxy.set(Direction::Both, Fault::Blackhole);
    // The lease was last confirmed before the cut, so lost() is due within the TTL; 100 ms
    // covers timer and scheduling delay on a loaded machine.
    tokio::time::timeout(ttl + Duration::from_millis(100), held.lost())
        .await
        .expect("lost() fires within the TTL after the keep-alive is cut");
    let lost_at = Instant::now();

    let (next, granted_at) = waiting.await.expect("join").expect("the waiter is granted");
    assert!(
        granted_at >= lost_at,
        "the waiter was granted {:?} before the cut-off holder saw lost()",
        lost_at - granted_at
    );
    assert!(next.fencing_token() > held.fencing_token());
    assert!(next.release().await.expect("release"));
    eprintln!(
        "lost {:?} after the cut (TTL {ttl:?}); next holder granted {:?} after the cut",
        lost_at - cut_at,
        granted_at - cut_at
    );
    drop(held);
    support::expect_no_keys(&admin, &ns, Duration::from_secs(5)).await;
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_if_held_writes_only_while_the_lock_is_held() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("fenced");
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    let locks = LockClient::with_options(Arc::new(backend.clone()), &ns, LockOptions::default())
        .expect("client");
    let data = format!("{}/{ns}-data", support::PREFIX);
    let guard = locks
        .mutex("fenced")
        .expect("key")
        .lock()
        .await
        .expect("lock");
    backend
        .txn_if_held(&guard, [TxnOp::put(data.clone(), "first", None)])
        .await
        .expect("a write while held goes through");
    // The lock key vanishes behind the holder's back (an expired session, an operator): the
    // guard has not noticed yet, and its write must still be refused.
    let lock_key = lockkit_core::backend::lease_of(&guard)
        .handle()
        .expect("an etcd lease names its key")
        .to_owned();
    let mut client = backend.client();
    client
        .delete(lock_key, None)
        .await
        .expect("delete the lock key");
    let err = backend
        .txn_if_held(&guard, [TxnOp::put(data.clone(), "stale", None)])
        .await
        .expect_err("a write once the lock is gone is refused");
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert!(
        !guard.release().await.expect("release"),
        "the lock was gone"
    );
    let stored = client.get(data.clone(), None).await.expect("get");
    assert_eq!(stored.kvs()[0].value(), b"first");
    client.delete(data, None).await.expect("clean up");
    support::expect_no_keys(&backend, &ns, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_of_one_ttl_share_one_session_lease() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("shared");
    let locks = client(
        &config,
        &ns,
        LockOptions::default().with_ttl(Duration::from_secs(4)),
    )
    .await;
    let a = locks.mutex("a").expect("key").lock().await.expect("lock");
    let b = locks.mutex("b").expect("key").lock().await.expect("lock");
    let c = locks
        .mutex("c")
        .expect("key")
        .with_ttl(Duration::from_secs(7))
        .expect("a valid TTL")
        .lock()
        .await
        .expect("lock");
    let lease = |g: &lockkit_core::MutexGuard| {
        support::lease_of(lockkit_core::backend::lease_of(g).handle().expect("key"))
    };
    assert_eq!(
        lease(&a),
        lease(&b),
        "two locks of one TTL granted two leases"
    );
    assert_ne!(
        lease(&a),
        lease(&c),
        "locks of different TTLs share a lease"
    );
    for guard in [a, b, c] {
        assert!(guard.release().await.expect("release"));
    }
    let admin = EtcdBackend::connect(config).await.expect("connect");
    support::expect_no_keys(&admin, &ns, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_revokes_the_sessions_and_frees_the_locks_at_once() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("close");
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    let locks = LockClient::with_options(
        Arc::new(backend.clone()),
        &ns,
        LockOptions::default().with_ttl(Duration::from_secs(60)),
    )
    .expect("client");
    let held = locks.mutex("job").expect("key").lock().await.expect("lock");
    backend.close().await.expect("close");
    tokio::time::timeout(Duration::from_secs(1), held.lost())
        .await
        .expect("lost() fires when the backend is closed");
    let other = client(&config, &ns, LockOptions::default()).await;
    let next = other
        .mutex("job")
        .expect("key")
        .try_lock()
        .await
        .expect("try_lock")
        .expect("the closed session's lock is free at once, not after its 60 s TTL");
    assert!(next.release().await.expect("release"));
    let again = locks
        .mutex("job")
        .expect("key")
        .lock()
        .await
        .expect("a new session after close");
    assert!(again.release().await.expect("release"));
    drop(held);
    support::expect_no_keys(&backend, &ns, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_reuses_its_key_name_and_contenders_get_their_own() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("names");
    let locks = client(&config, &ns, LockOptions::default()).await;
    let mut names = std::collections::HashSet::new();
    for _ in 0..5 {
        let guard = locks.mutex("job").expect("key").lock().await.expect("lock");
        names.insert(
            lockkit_core::backend::lease_of(&guard)
                .handle()
                .expect("key")
                .to_owned(),
        );
        assert!(guard.release().await.expect("release"));
    }
    assert_eq!(names.len(), 1, "sequential acquisitions used {names:?}");
    let held = locks.mutex("job").expect("key").lock().await.expect("lock");
    let contender = locks.clone();
    let waiting = tokio::spawn(async move {
        contender
            .mutex("job")?
            .lock_timeout(Duration::from_secs(10))
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let held_name = lockkit_core::backend::lease_of(&held)
        .handle()
        .expect("key")
        .to_owned();
    assert!(held.release().await.expect("release"));
    let next = waiting.await.expect("join").expect("granted");
    assert_ne!(
        lockkit_core::backend::lease_of(&next).handle(),
        Some(held_name.as_str())
    );
    assert!(next.release().await.expect("release"));
    let admin = EtcdBackend::connect(config).await.expect("connect");
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

/// Whoever may read the lock's prefix sees the key's value: it holds a digest of the owner
/// token, never the token, which would let that reader release or extend the lock. The
/// lookups by value still find the own key: release, the renewal check, and `is_held`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_key_holds_a_digest_of_the_owner_token_not_the_token() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("digest");
    let locks = client(
        &config,
        &ns,
        LockOptions::default().with_ttl(Duration::from_secs(2)),
    )
    .await;
    let guard = locks.mutex("job").expect("key").lock().await.expect("lock");
    let admin = EtcdBackend::connect(config).await.expect("connect");
    let key = lockkit_core::backend::lease_of(&guard)
        .handle()
        .expect("etcd grants carry their key");
    let stored = admin.client().get(key, None).await.expect("get");
    let stored = String::from_utf8_lossy(stored.kvs()[0].value()).into_owned();
    let owner = lockkit_core::backend::lease_of(&guard).owner();
    assert!(
        !stored.contains(&owner.expose_hex()),
        "the lock key shows the owner token"
    );
    assert_eq!(stored, owner.digest_hex());
    // Past the TTL: the renewal checks found the key by its value.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!guard.is_lost());
    assert!(guard.is_held().await.expect("is_held"));
    assert!(guard.release().await.expect("release"));
    support::expect_no_keys(&admin, &ns, Duration::from_secs(5)).await;
}

/// A waiter's queue key lives on its session lease. When that session is lost (here the
/// lease is revoked behind its back), the key is gone and waiting on the predecessor is for
/// nothing: the wait ends and the waiter queues again on a new session, long before its
/// polling cap, while the holder keeps the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_session_is_lost_stops_waiting_and_queues_on_a_new_one() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("waitlost");
    let options = LockOptions::default().with_ttl(Duration::from_secs(6));
    let holder = client(&config, &ns, options.clone()).await;
    // Only the end of the wait can bring it back in time: its polling cap is a minute.
    let waiter = client(
        &config,
        &ns,
        options.with_backoff(Duration::from_millis(5), Duration::from_secs(60)),
    )
    .await;
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let (held, waiting) = hold_with_a_waiter(&holder, waiter).await;
    let holder_key = lockkit_core::backend::lease_of(&held)
        .handle()
        .expect("key")
        .to_owned();
    let waiter_key = || async {
        let keys = support::keys_under(&admin, &ns).await.expect("list keys");
        keys.into_iter().find(|k| *k != holder_key)
    };
    let queued_by = Instant::now() + Duration::from_secs(10);
    let first = loop {
        if let Some(key) = waiter_key().await {
            break key;
        }
        assert!(Instant::now() < queued_by, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let revoked = support::lease_of(&first);
    admin
        .client()
        .lease_revoke(revoked)
        .await
        .expect("revoke the waiter's session lease");
    // The keep-alive notices within a third of the TTL; the waiter then queues at once.
    let requeued_by = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(key) = waiter_key().await
            && support::lease_of(&key) != revoked
        {
            break;
        }
        assert!(
            Instant::now() < requeued_by,
            "the waiter did not queue again after its session was lost"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(held.release().await.expect("release"));
    let (next, _) = waiting.await.expect("join").expect("the waiter is granted");
    assert!(next.release().await.expect("release"));
    support::expect_no_keys(&admin, &ns, Duration::from_secs(5)).await;
}

/// The session's epoch key, as the backend names it.
fn epoch_key(config: &EtcdConfig, lease: i64) -> String {
    format!("{}/../sessions/{lease:016x}", config.prefix)
}

/// Waits (up to 10 s) until the session `lease`'s epoch key was written: its clean-up settled
/// the unanswered attempts.
async fn settled(admin: &EtcdBackend, config: &EtcdConfig, lease: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = admin
            .client()
            .get(epoch_key(config, lease), None)
            .await
            .expect("read the epoch key");
        if let Some(kv) = found.kvs().first() {
            return kv.mod_revision();
        }
        assert!(
            Instant::now() < deadline,
            "the session's unanswered attempt was not settled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A cancelled attempt's put can be held up (on a slow link to one member) past every
/// clean-up delete. Were it to land then, it would sit on the session lease, which the backend
/// renews for as long as it lives, and hold the lock for good. The session's clean-up settles
/// it first: it writes the session's epoch key, which every put compares, so the put, as the
/// server sees it (the acquisition's key name absent, the epoch it was sent with), can no
/// longer apply.
///
/// The attempt is cancelled in flight for real (a proxy delays it); its put arriving late is
/// then replayed by an operator client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_held_up_past_its_clean_up_cannot_land_after_the_settlement() {
    let Some(mut config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("lateput");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let direct = config.clone();
    let proxy = FaultProxy::start(&config.endpoints)
        .await
        .expect("a fault proxy");
    config.endpoints = proxy.hosts();
    config.request_timeout = Duration::from_secs(1);
    let ttl = Duration::from_secs(2);
    let options = LockOptions::default().with_ttl(ttl);
    let locks = client(&config, &ns, options.clone()).await;
    // The session and the key name its acquisitions of "job" reuse.
    let first = locks.mutex("job").expect("key").lock().await.expect("lock");
    let name = lockkit_core::backend::lease_of(&first)
        .handle()
        .expect("key")
        .to_owned();
    let lease = support::lease_of(&name);
    assert!(first.release().await.expect("release"));

    proxy.set(
        Direction::Requests,
        Fault::Delay {
            base: Duration::from_millis(300),
            jitter: Duration::ZERO,
        },
    );
    let cancelled = tokio::time::timeout(
        Duration::from_millis(50),
        locks.mutex("job").expect("key").lock(),
    )
    .await;
    assert!(cancelled.is_err(), "the attempt was not in flight");
    proxy.heal();
    let epoch = settled(&admin, &direct, lease).await;
    assert!(epoch > 0);
    support::expect_no_keys(&admin, &ns, Duration::from_secs(5)).await;

    let late = lockkit_etcd::etcd_client::Txn::new()
        .when([
            Compare::create_revision(name.as_str(), CompareOp::Equal, 0),
            Compare::mod_revision(epoch_key(&direct, lease), CompareOp::Equal, 0),
        ])
        .and_then([TxnOp::put(
            name.as_str(),
            OwnerToken::generate().expect("token").digest_hex(),
            Some(lockkit_etcd::etcd_client::PutOptions::new().with_lease(lease)),
        )]);
    let replayed = admin.client().txn(late).await.expect("the late put");
    assert!(
        !replayed.succeeded(),
        "a put sent before the settlement landed after it"
    );
    support::expect_no_keys(&admin, &ns, Duration::from_secs(1)).await;
    // The session goes on: later attempts put under the new epoch.
    let next = locks
        .mutex("job")
        .expect("key")
        .lock_timeout(Duration::from_secs(5))
        .await
        .expect("a lock after the settlement");
    assert!(next.release().await.expect("release"));
    support::expect_no_keys(&admin, &ns, Duration::from_secs(5)).await;
}

/// How many `LeaseTimeToLive` calls the etcd serving `client_port` has handled.
async fn lease_listings(client_port: u16) -> u64 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", client_port))
        .await
        .expect("the metrics endpoint");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("ask for the metrics");
    let mut body = String::new();
    stream
        .read_to_string(&mut body)
        .await
        .expect("read the metrics");
    body.lines()
        .filter(|line| {
            line.starts_with("grpc_server_handled_total")
                && line.contains("grpc_method=\"LeaseTimeToLive\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Once a session's unanswered attempts are settled, nothing more is done for them: the
/// session's keys are not listed every TTL for the rest of its life (a listing costs as much
/// as the keys on the lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_session_is_not_swept_again() {
    let Some(etcd) = support::private::PrivateEtcd::start("lk-settle", 22100..22120, None) else {
        return;
    };
    let direct = etcd.config();
    let admin = etcd.ready(&direct).await;
    let ns = support::namespace("settle");
    let proxy = FaultProxy::start(&direct.endpoints)
        .await
        .expect("a fault proxy");
    let mut config = direct.clone();
    config.endpoints = proxy.hosts();
    config.request_timeout = Duration::from_secs(1);
    let ttl = Duration::from_secs(2);
    let locks = client(&config, &ns, LockOptions::default().with_ttl(ttl)).await;
    let first = locks.mutex("job").expect("key").lock().await.expect("lock");
    let lease = support::lease_of(
        lockkit_core::backend::lease_of(&first)
            .handle()
            .expect("key"),
    );
    assert!(first.release().await.expect("release"));
    proxy.set(
        Direction::Requests,
        Fault::Delay {
            base: Duration::from_millis(300),
            jitter: Duration::ZERO,
        },
    );
    let cancelled = tokio::time::timeout(
        Duration::from_millis(50),
        locks.mutex("job").expect("key").lock(),
    )
    .await;
    assert!(cancelled.is_err(), "the attempt was not in flight");
    proxy.heal();
    settled(&admin, &direct, lease).await;
    // Past the settlement's own listing.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = lease_listings(etcd.client_port).await;
    assert!(before > 0, "the settlement did not list the session's keys");
    tokio::time::sleep(ttl * 3).await;
    let after = lease_listings(etcd.client_port).await;
    assert_eq!(
        after, before,
        "the session's keys were listed again after its attempts were settled"
    );
}

/// A lock held in a fresh namespace by a client whose link to the cluster goes through a
/// fault proxy (2 s request timeout), with a direct client to look at the keys.
async fn held_through_a_proxy(what: &str) -> Option<(String, EtcdBackend, FaultProxy, MutexGuard)> {
    let mut config = support::cluster_config().await?;
    let ns = support::namespace(what);
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let proxy = FaultProxy::start(&config.endpoints)
        .await
        .expect("a fault proxy");
    config.endpoints = proxy.hosts();
    config.request_timeout = Duration::from_secs(2);
    let holder = client(&config, &ns, LockOptions::default()).await;
    let held = holder
        .mutex("job")
        .expect("key")
        .lock()
        .await
        .expect("lock");
    Some((ns, admin, proxy, held))
}

/// A release whose connection breaks under it (its request lost, then the connection reset)
/// is sent again over a new connection within the request timeout and releases the lock; it
/// was an `Unavailable` error, seen in CI as a waiter granted over a healed link whose
/// release found a connection the server had closed.
#[tokio::test]
async fn a_release_whose_connection_breaks_under_it_is_sent_again() {
    let Some((ns, admin, proxy, held)) = held_through_a_proxy("release-broken").await else {
        return;
    };
    proxy.set(Direction::Requests, Fault::Drop);
    let releasing = tokio::spawn(async move { held.release().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.reset();
    proxy.heal();
    let released = releasing.await.expect("join");
    assert!(
        matches!(released, Ok(true)),
        "the release over a broken connection: {released:?}"
    );
    support::expect_no_keys(&admin, &ns, Duration::ZERO).await;
}

/// A release applied whose answer is lost with its connection is sent again and finds the
/// key gone: it cannot tell that from a lock lost before, and says so with an `Unavailable`
/// error instead of reporting the released lock as not ours.
#[tokio::test]
async fn a_release_sent_again_that_finds_the_lock_gone_is_unavailable() {
    let Some((ns, admin, proxy, held)) = held_through_a_proxy("release-answer-lost").await else {
        return;
    };
    proxy.set(Direction::Replies, Fault::Drop);
    let releasing = tokio::spawn(async move { held.release().await });
    // The delete is applied at once; only its answer is dropped.
    support::expect_no_keys(&admin, &ns, Duration::from_secs(1)).await;
    proxy.reset();
    proxy.heal();
    let released = releasing.await.expect("join");
    assert!(
        matches!(&released, Err(e) if e.kind() == ErrorKind::Unavailable),
        "a resent release that found the lock gone: {released:?}"
    );
}
