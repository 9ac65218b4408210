//! A release whose connection breaks is sent again; one that then finds the lock gone is
//! `Unavailable`, not "not ours".

use std::time::Duration;

use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{ErrorKind, LockOptions, MutexGuard};
use lockkit_etcd::EtcdBackend;

use crate::{client, support};

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
