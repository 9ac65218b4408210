//! Queue waiters against the compose cluster: quiet while the lock is held, and granted
//! after every fault that could hide the release from them (a reset connection, a dead link
//! across the release, a revoked session). None of these disturb the cluster.

mod support;

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::testing::Recording;
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::testing::queue::{
    self, a_queue_waiter_is_granted_after, a_waiter_cut_off_across_the_release_is_granted,
    a_waiter_whose_connection_is_reset_is_granted,
};
use lockkit_core::{LockClient, LockOptions};
use lockkit_etcd::{EtcdBackend, EtcdConfig};
use support::harness::EtcdHarness;

async fn client(config: &EtcdConfig, namespace: &str) -> LockClient {
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    let options = LockOptions::default().with_ttl(Duration::from_secs(2));
    LockClient::with_options(Arc::new(backend), namespace, options).expect("client")
}

/// A holder on the cluster, and a waiter that reaches it through a fault proxy.
async fn holder_and_proxied_waiter(
    config: &EtcdConfig,
    ns: &str,
) -> (LockClient, LockClient, FaultProxy) {
    let proxy = FaultProxy::start(&config.endpoints)
        .await
        .expect("a fault proxy");
    let mut through_proxy = config.clone();
    through_proxy.endpoints = proxy.hosts();
    through_proxy.request_timeout = Duration::from_secs(1);
    (
        client(config, ns).await,
        client(&through_proxy, ns).await,
        proxy,
    )
}

#[tokio::test]
async fn a_queue_waiter_sends_nothing_while_the_lock_is_held() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let harness = EtcdHarness::connect(config).await.expect("harness");
    if let Err(failure) = queue::a_queue_waiter_sends_nothing_while_the_lock_is_held(&harness).await
    {
        panic!("{failure}");
    }
}

/// The waiter's connections are reset while it waits (its watch stream breaks), then the
/// holder releases: the broken watch ended the wait, and the waiter is granted.
#[tokio::test]
async fn a_waiter_whose_watch_stream_breaks_is_granted_after_the_release() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("queue-reset");
    let (holder, waiter, proxy) = holder_and_proxied_waiter(&config, &ns).await;
    let outcome = a_waiter_whose_connection_is_reset_is_granted(&holder, &waiter, &proxy)
        .await
        .unwrap_or_else(|failure| panic!("{failure}"));
    eprintln!("granted {:?} after the release", outcome.granted_after);
}

/// The waiter's link goes dead (nothing passes, nothing is refused) and the holder releases
/// meanwhile; then the link heals with its connections reset, as a host coming back does:
/// the release is not lost on the waiter.
#[tokio::test]
async fn a_waiter_cut_off_across_the_release_is_granted_once_it_is_back() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("queue-dead-link");
    let (holder, waiter, proxy) = holder_and_proxied_waiter(&config, &ns).await;
    let down = Duration::from_millis(700);
    let outcome = a_waiter_cut_off_across_the_release_is_granted(&holder, &waiter, &proxy, down)
        .await
        .unwrap_or_else(|failure| panic!("{failure}"));
    eprintln!("granted {:?} after the link healed", outcome.granted_after);
}

/// The waiter's session lease is revoked behind its back while it waits (its queue key goes
/// with it); its wait ends with the session, it queues again on a new one and is granted
/// after the holder's release.
#[tokio::test]
async fn a_waiter_whose_session_is_revoked_queues_again_and_is_granted() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("queue-revoked");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let holder = client(&config, &ns).await;
    let waiter = client(&config, &ns).await;
    let outcome = a_queue_waiter_is_granted_after(&holder, &waiter, |held| async move {
        let lease = lockkit_core::backend::lease_of(&held);
        let own = lease.handle().expect("an etcd grant names its key");
        let keys = support::keys_under(&admin, &ns).await.expect("list keys");
        let queued = keys
            .iter()
            .find(|key| key.as_str() != own)
            .unwrap_or_else(|| panic!("no queue key besides the holder's in {keys:?}"));
        admin
            .client()
            .lease_revoke(support::lease_of(queued))
            .await
            .expect("revoke the waiter's session lease");
        // Past the waiter's next keep-alive (TTL / 3): it learns that its session is gone.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(held.release().await.expect("release"));
    })
    .await
    .unwrap_or_else(|failure| panic!("{failure}"));
    eprintln!("granted {:?} after the release", outcome.granted_after);
}

/// The waiter's link goes dead for longer than its connection's keep-alive waits for an
/// answer, and the holder releases meanwhile. The waiter's session outlives the outage (TTL
/// 30 s), so nothing but the connection's own keep-alive can tell the watch that its
/// connection is gone: it drops the connection, the wait ends, and the waiter is granted
/// over a new connection once the link is back.
#[tokio::test]
async fn a_waiter_on_a_connection_gone_silent_is_granted_over_a_new_one() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("queue-silent");
    let proxy = FaultProxy::start(&config.endpoints)
        .await
        .expect("a fault proxy");
    let mut through_proxy = config.clone();
    through_proxy.endpoints = proxy.hosts();
    through_proxy.request_timeout = Duration::from_secs(1);
    let long = LockOptions::default().with_ttl(Duration::from_secs(30));
    let mut clients = Vec::new();
    for config in [config.clone(), through_proxy] {
        let backend = EtcdBackend::connect(config).await.expect("connect");
        clients
            .push(LockClient::with_options(Arc::new(backend), &ns, long.clone()).expect("client"));
    }
    let (holder, waiter) = (&clients[0], &clients[1]);
    let proxy = &proxy;
    let outcome = a_queue_waiter_is_granted_after(holder, waiter, |held| async move {
        proxy.set(Direction::Both, Fault::Drop);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(held.release().await.expect("release"));
        // Past the keep-alive's 10 s of silence and 1 s for the answer; no reset: the old
        // connection is left for the waiter's side to give up on.
        tokio::time::sleep(Duration::from_secs(13)).await;
        proxy.heal();
    })
    .await
    .unwrap_or_else(|failure| panic!("{failure}"));
    eprintln!("granted {:?} after the link healed", outcome.granted_after);
}

/// With `require_leader = false` a member cut off from the leader would keep a waiter's
/// watch open and silent, so the waiter re-checks the queue once per TTL: over three TTLs of
/// a held lock it attempts more than once.
#[tokio::test]
async fn without_require_leader_a_waiter_re_checks_once_per_ttl() {
    let Some(mut config) = support::cluster_config().await else {
        return;
    };
    config.require_leader = false;
    let ns = support::namespace("queue-no-leader");
    let ttl = Duration::from_secs(2);
    let options = LockOptions::default().with_ttl(ttl);
    let holder = client(&config, &ns).await;
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    let recording = Arc::new(Recording::new(Arc::new(backend)));
    let waiter = LockClient::with_options(recording.clone(), &ns, options).expect("client");
    let held = holder
        .mutex("re-check")
        .unwrap()
        .lock()
        .await
        .expect("lock");
    let mutex = waiter.mutex("re-check").unwrap();
    let waiting = tokio::spawn(async move { mutex.lock_timeout(Duration::from_secs(60)).await });
    tokio::time::sleep(ttl * 3).await;
    let attempts = recording.count("try_acquire");
    assert!(
        attempts >= 2,
        "{attempts} attempt in three TTLs: the waiter trusted a watch that may be silent"
    );
    assert!(held.release().await.expect("release"));
    let granted = waiting.await.expect("join").expect("granted");
    assert!(granted.release().await.expect("release"));
}
