//! A release whose reply is lost and whose connection then drops is sent again; the second
//! send finds the lock gone (the first released it and handed it on). That must not be
//! reported as "the lock was not ours" (a lost lock that was in fact released): the outcome is
//! unknown, and the release says so with an error.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{ErrorKind, LockClient, LockOptions};
use lockkit_redis::RedisBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_resent_after_its_reply_was_lost_does_not_report_the_lock_lost() {
    let Some(harness) = common::single().await else {
        return;
    };
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
    let guard = locks.mutex("resent").unwrap().lock().await.unwrap();
    proxy.set(Direction::Replies, Fault::Drop);
    let releasing = tokio::spawn(async move { guard.release().await });
    // The release reaches the server and runs; its reply is swallowed. Then the connection
    // drops, and the client sends the release once more on a new one.
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.heal();
    proxy.reset();
    let answer = tokio::time::timeout(Duration::from_secs(10), releasing)
        .await
        .expect("the release hung")
        .unwrap();
    match answer {
        Ok(false) => panic!("a released lock was reported as not ours"),
        Ok(true) => {}
        Err(e) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}"),
    }
    let checker = LockClient::with_options(
        harness.backend().await.unwrap(),
        &namespace,
        LockOptions::default(),
    )
    .unwrap();
    assert!(
        checker.inspect("resent").await.unwrap().is_none(),
        "the lock is still held after its release"
    );
}
