//! A release whose reply is lost and whose connection then drops is sent again; the second
//! send finds the lock (or the permit) gone (the first released it and handed it on). That
//! must not be reported as "the lock was not ours" (a lost lock that was in fact released):
//! the outcome is unknown, and the release says so with an error.
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
