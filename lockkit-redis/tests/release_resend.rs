//! A release whose reply is lost and whose connection then drops is sent again; the second
//! send finds the lock (or the permit) gone (the first released it and handed it on). That
//! must not be reported as "the lock was not ours" (a lost lock that was in fact released):
//! the outcome is unknown, and the release says so with an error. An operator's break sent
//! again must not break the grant the first send handed on.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{ErrorKind, LockClient, LockOptions, Result};
use lockkit_redis::RedisBackend;

/// A client of the single server through a fault proxy, in a fresh namespace.
async fn through_proxy(harness: &common::RedisHarness) -> (FaultProxy, LockClient) {
    let common::Topology::Single(config) = &harness.topology else {
        panic!("the single harness runs on one server");
    };
    let proxy = FaultProxy::start(&config.hosts).await.unwrap();
    let mut through_proxy = config.clone();
    through_proxy.hosts = proxy.hosts();
    through_proxy.response_timeout = Duration::from_secs(5);
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let locks = LockClient::with_options(
        Arc::new(RedisBackend::connect(through_proxy).await.unwrap()),
        &namespace,
        LockOptions::default().with_ttl(Duration::from_secs(30)),
    )
    .unwrap();
    (proxy, locks)
}

/// Runs `release` with its reply swallowed: it reaches the server and runs, then the
/// connection drops and the client sends it once more on a new one. Its answer must be
/// "released" or `Unavailable`, never "not ours".
async fn release_with_its_reply_lost(
    proxy: &FaultProxy,
    release: impl Future<Output = Result<bool>> + Send + 'static,
) {
    proxy.set(Direction::Replies, Fault::Drop);
    let releasing = tokio::spawn(release);
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.heal();
    proxy.reset();
    let answer = tokio::time::timeout(Duration::from_secs(10), releasing)
        .await
        .expect("the release hung")
        .unwrap();
    match answer {
        Ok(false) => panic!("a released grant was reported as not ours"),
        Ok(true) => {}
        Err(e) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_resent_after_its_reply_was_lost_does_not_report_the_lock_lost() {
    let Some(harness) = common::single().await else {
        return;
    };
    let (proxy, locks) = through_proxy(&harness).await;
    let guard = locks.mutex("resent").unwrap().lock().await.unwrap();
    release_with_its_reply_lost(&proxy, guard.release()).await;
    let checker = LockClient::with_options(
        harness.backend().await.unwrap(),
        locks.namespace(),
        LockOptions::default(),
    )
    .unwrap();
    assert!(
        checker.inspect("resent").await.unwrap().is_none(),
        "the lock is still held after its release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_resent_after_its_reply_was_lost_does_not_report_the_permit_lost() {
    let Some(harness) = common::single().await else {
        return;
    };
    let (proxy, locks) = through_proxy(&harness).await;
    let permit = locks
        .semaphore("resent", 1)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    release_with_its_reply_lost(&proxy, permit.release()).await;
    let checker = LockClient::with_options(
        harness.backend().await.unwrap(),
        locks.namespace(),
        LockOptions::default(),
    )
    .unwrap();
    let next = checker.semaphore("resent", 1).unwrap().try_acquire().await;
    let next = next
        .unwrap()
        .expect("the permit is still held after its release");
    assert!(next.release().await.unwrap());
}

/// The force-release script as the backend loads it (classic pub/sub).
const FORCE_RELEASE: &str = concat!(
    include_str!("../scripts/publish_classic.lua"),
    include_str!("../scripts/common.lua"),
    include_str!("../scripts/queue.lua"),
    include_str!("../scripts/mutex_prelude.lua"),
    include_str!("../scripts/force_release.lua")
);

/// An operator's break that is sent again (its reply was lost, its connection dropped, or on
/// a Cluster its primary failed over) must not break the grant the first send handed to the
/// first waiter and hand the lock to the next one: two holders until the first waiter's next
/// renewal. The backend reads the holder once and sends the break with what it read, so
/// both sends carry the same value; here they are sent by hand, which no fault timing could
/// make happen as surely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_release_sent_again_hands_the_lock_to_one_waiter_only() {
    let Some(harness) = common::single().await else {
        return;
    };
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let client = || async {
        LockClient::with_options(
            harness.backend().await.unwrap(),
            &namespace,
            LockOptions::default().with_ttl(Duration::from_secs(30)),
        )
        .unwrap()
    };
    let (holder, first, second) = (client().await, client().await, client().await);
    let stale = holder.mutex("broken").unwrap().lock().await.unwrap();
    let lock = common::lock_key(&holder.key("broken").unwrap());
    let mut raw = harness.servers().await.unwrap().remove(0);
    let queued = |n: usize| {
        let (queue, mut raw) = (format!("{lock}:queue"), raw.clone());
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let count: usize = redis::cmd("ZCARD")
                    .arg(&queue)
                    .query_async(&mut raw)
                    .await
                    .unwrap();
                if count == n {
                    return;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{count} waiters queued, not {n}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let waiter = |client: LockClient| {
        tokio::spawn(async move { client.mutex("broken").unwrap().lock().await })
    };
    let b = waiter(first);
    queued(1).await;
    let mut c = waiter(second);
    queued(2).await;

    let read: String = redis::cmd("GET")
        .arg(&lock)
        .query_async(&mut raw)
        .await
        .unwrap();
    for _ in 0..2 {
        let _: i64 = redis::Script::new(FORCE_RELEASE)
            .key(&lock)
            .key(format!("{lock}:fence"))
            .key(format!("{lock}:queue"))
            .key(format!("{lock}:queue:entries"))
            .key(format!("{lock}:value"))
            .arg(format!("lockkit:released:{lock}"))
            .arg(3_600_000)
            .arg("")
            .arg(&read)
            .invoke_async(&mut raw)
            .await
            .unwrap();
    }

    let granted = tokio::time::timeout(Duration::from_secs(10), b)
        .await
        .expect("the first waiter was not granted")
        .unwrap()
        .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(1), &mut c)
            .await
            .is_err(),
        "the second waiter was granted while the first holds the lock"
    );
    let info = holder.inspect("broken").await.unwrap().expect("held");
    assert_eq!(info.fencing_token, granted.fencing_token());
    drop(stale);
    granted.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), c)
        .await
        .expect("the second waiter was not granted after the first released")
        .unwrap()
        .unwrap();
    next.release().await.unwrap();
}
