//! Rwlocks under deployment settings: the minimal ACL, `min_replicas` on Sentinel, and
//! Redlock's refusal.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::backend::{AcquireRequest, Hold, OwnerToken};
use lockkit_core::{ErrorKind, LockClient, LockKey, LockOptions};
use lockkit_redis::{RedisBackend, RedisConfig};

use crate::{PATIENCE, client, common, keys_but_fences, namespace, reader_gets_in};

/// Under the README's minimal ACL plus the semaphore's commands, read and write locks are
/// taken, a writer waits (recorded, and woken by a release notification), grants are renewed
/// and given back, and the server logs no denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlocks_work_under_the_minimal_acl() {
    let Some(harness) = common::single().await else {
        return;
    };
    let common::Topology::Single(config) = &harness.topology else {
        panic!("the single harness runs on one server");
    };
    let ns = namespace();
    let commands: Vec<&str> = [common::LOCKKIT_COMMANDS, common::NOTIFY_COMMANDS].concat();
    let user = common::AclUser::create(&config.hosts[0], &ns, &commands).await;
    let mut limited: RedisConfig = config.clone();
    limited.username = Some(user.name.clone());
    limited.password = Some(user.password.clone());
    let ttl = Duration::from_millis(600);
    let connect = || async {
        client(
            Arc::new(RedisBackend::connect(limited.clone()).await.unwrap()),
            &ns,
            ttl,
        )
    };
    let (a, b) = (connect().await, connect().await);
    let reading = a.rwlock("acl").unwrap().read().await.unwrap();
    let writer = b.rwlock("acl").unwrap();
    let writing = tokio::spawn(async move { writer.write().await });
    tokio::time::sleep(ttl * 2).await;
    assert!(!writing.is_finished(), "a writer got in beside a reader");
    assert!(!reader_gets_in(&a, "acl").await);
    assert!(
        reading.is_held().await.unwrap(),
        "the renewed read lock is not held"
    );
    assert!(reading.release().await.unwrap());
    let written = tokio::time::timeout(PATIENCE, writing)
        .await
        .expect("the writer was not woken")
        .unwrap()
        .unwrap();
    assert!(written.release().await.unwrap());
    assert_eq!(user.denials().await, []);
}

/// With `min_replicas`, a grant is made once the replica acknowledged it; one that fewer
/// replicas acknowledged (2 asked, the group has 1) is refused with `QuorumNotReached` and
/// given back, leaving nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_applies_to_rwlocks() {
    let Some(harness) = common::sentinel().await else {
        return;
    };
    let common::Topology::Sentinel(config) = &harness.topology else {
        panic!("the sentinel harness runs on Sentinel");
    };
    let ns = namespace();
    let replicated = |min_replicas: u32| {
        let mut config = config.clone();
        config.min_replicas = min_replicas;
        // Room for a starved replica to acknowledge (the refusals below wait for all of it),
        // inside the request's own timeout.
        config.replica_timeout = Duration::from_secs(2);
        config.response_timeout = Duration::from_secs(5);
        let ns = ns.clone();
        async move {
            let backend = Arc::new(RedisBackend::connect(config).await.unwrap());
            LockClient::with_options(backend, &ns, LockOptions::default()).unwrap()
        }
    };
    let acked = replicated(1).await;
    let read = acked.rwlock("replicated").unwrap().try_read().await;
    let read = read.unwrap().expect("a free read lock was refused");
    assert!(read.release().await.unwrap());

    let unacked = replicated(2).await;
    for refused in [
        unacked
            .rwlock("replicated")
            .unwrap()
            .try_read()
            .await
            .map(drop),
        unacked
            .rwlock("replicated")
            .unwrap()
            .try_write()
            .await
            .map(drop),
    ] {
        match refused {
            Err(e) => assert!(
                matches!(e.kind(), ErrorKind::QuorumNotReached { got: 1, need: 2 }),
                "{e}"
            ),
            Ok(()) => panic!("granted with one replica of two"),
        }
    }
    let mut con = harness.servers().await.unwrap().remove(0);
    assert_eq!(keys_but_fences(&mut con, &ns).await, Vec::<String>::new());
}

/// Redlock refuses read-write locks at creation, and a request sent to it directly, saying
/// why (the waiting-writer records and fencing counters of independent nodes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_rwlocks_and_says_why() {
    let Some(harness) = common::redlock().await else {
        return;
    };
    let backend = harness.backend().await.unwrap();
    let ns = namespace();
    let locks = LockClient::with_options(backend.clone(), &ns, LockOptions::default()).unwrap();
    let err = locks.rwlock("table").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("waiting-writer records"), "{err}");
    for hold in [Hold::Read, Hold::Write] {
        let request = AcquireRequest::new(
            LockKey::new(&ns, "table").unwrap(),
            OwnerToken::generate().unwrap(),
            Duration::from_secs(1),
            true,
        )
        .with_hold(hold);
        let err = backend.try_acquire(&request).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        assert!(err.to_string().contains("waiting-writer records"), "{err}");
    }
    for con in &mut harness.servers().await.unwrap() {
        assert_eq!(
            common::keys_of(con, &ns).await.unwrap(),
            Vec::<String>::new()
        );
    }
}
