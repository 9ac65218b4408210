//! A session that ends (its lease revoked, its keep-alive cut, its backend closed) fires lost()
//! on its holders in time and frees their locks; a waiter whose session is lost queues again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{LockClient, LockOptions};
use lockkit_etcd::EtcdBackend;

use crate::{client, hold_with_a_waiter, support};

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
