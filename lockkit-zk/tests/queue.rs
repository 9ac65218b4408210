//! Queue waiters against the ensemble: quiet while the lock is held, and granted after every
//! fault that could hide the release from them (a reset connection, a dead link across the
//! release, an expired session). None of these disturb the ensemble.

mod support;

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::testing::proxy::FaultProxy;
use lockkit_core::testing::queue::{
    self, a_queue_waiter_is_granted_after, a_waiter_cut_off_across_the_release_is_granted,
    a_waiter_whose_connection_is_reset_is_granted,
};
use lockkit_core::{LockClient, LockOptions};
use lockkit_zk::{ZkBackend, ZkConfig};
use support::harness::ZkHarness;
use support::{TEST_CHROOT, admin, test_config};

fn namespace(what: &str) -> String {
    format!("lk-zk-{what}-{:08x}", rand::random::<u32>())
}

async fn client(config: &ZkConfig, ns: &str) -> (ZkBackend, LockClient) {
    let backend = ZkBackend::connect(config.clone()).await.expect("connect");
    let options = LockOptions::default().with_ttl(Duration::from_secs(2));
    let client = LockClient::with_options(Arc::new(backend.clone()), ns, options).expect("client");
    (backend, client)
}

/// A holder on the ensemble, and a waiter that reaches it through a fault proxy.
async fn holder_and_proxied_waiter(
    config: &ZkConfig,
    ns: &str,
) -> (LockClient, LockClient, FaultProxy) {
    let proxy = FaultProxy::start(&config.hosts)
        .await
        .expect("a fault proxy");
    let mut through_proxy = config.clone();
    through_proxy.hosts = proxy.hosts();
    let (_, holder) = client(config, ns).await;
    let (_, waiter) = client(&through_proxy, ns).await;
    (holder, waiter, proxy)
}

#[tokio::test]
async fn a_queue_waiter_sends_nothing_while_the_lock_is_held() {
    let Some(config) = test_config() else {
        return;
    };
    let harness = ZkHarness::new(config.clone(), admin(&config, TEST_CHROOT).await);
    if let Err(failure) = queue::a_queue_waiter_sends_nothing_while_the_lock_is_held(&harness).await
    {
        panic!("{failure}");
    }
}

/// The waiter's connection is reset while it waits; the client reconnects (the same session)
/// and sets its watch again; then the holder releases and the waiter is granted.
#[tokio::test]
async fn a_waiter_whose_connection_is_reset_is_granted_after_the_release() {
    let Some(config) = test_config() else {
        return;
    };
    let ns = namespace("reset");
    let (holder, waiter, proxy) = holder_and_proxied_waiter(&config, &ns).await;
    let outcome = a_waiter_whose_connection_is_reset_is_granted(&holder, &waiter, &proxy)
        .await
        .unwrap_or_else(|failure| panic!("{failure}"));
    eprintln!("granted {:?} after the release", outcome.granted_after);
}

/// The holder releases while the waiter's link is dead, so the predecessor's deletion never
/// reaches the waiter's connection; once the link is back (connections reset, as a host
/// coming back does) the client reconnects within its session, the server replays the
/// deletion to the watch it sets again, and the waiter is granted.
#[tokio::test]
async fn a_waiter_cut_off_across_the_release_is_granted_once_it_is_back() {
    let Some(config) = test_config() else {
        return;
    };
    let ns = namespace("dead-link");
    let (holder, waiter, proxy) = holder_and_proxied_waiter(&config, &ns).await;
    let down = Duration::from_millis(500);
    let outcome = a_waiter_cut_off_across_the_release_is_granted(&holder, &waiter, &proxy, down)
        .await
        .unwrap_or_else(|failure| panic!("{failure}"));
    eprintln!("granted {:?} after the link healed", outcome.granted_after);
}

/// The waiter's session is expired by the server while it waits (its queue node goes with
/// it): the wait ends with the session, the waiter queues again on a new one and is granted
/// after the holder's release.
#[tokio::test]
async fn a_waiter_whose_session_expires_queues_again_and_is_granted() {
    let Some(config) = test_config() else {
        return;
    };
    let ns = namespace("expired");
    let (_, holder) = client(&config, &ns).await;
    let (waiter_backend, waiter) = client(&config, &ns).await;
    let outcome = a_queue_waiter_is_granted_after(&holder, &waiter, |held| async move {
        waiter_backend
            .expire_session()
            .await
            .expect("expire the waiter's session");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(held.release().await.expect("release"));
    })
    .await
    .unwrap_or_else(|failure| panic!("{failure}"));
    eprintln!("granted {:?} after the release", outcome.granted_after);
}
