//! What the lock keys are: fenced writes go through only while the key is there, locks of one
//! TTL share a session lease, a client reuses its key name, and a key holds the token's digest.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{ErrorKind, LockClient, LockOptions};
use lockkit_etcd::EtcdBackend;
use lockkit_etcd::etcd_client::TxnOp;

use crate::{client, support};

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
