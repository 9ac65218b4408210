//! Redlock with nodes killed: a minority down changes nothing, a majority down fails fast with
//! `QuorumNotReached`, and a holder that loses its majority is told so by its validity deadline.
//!
//! One test: it kills and restarts members of the Redlock topology and leaves all five up
//! whatever happens.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::time::{Duration, Instant};

use lockkit_core::{ErrorKind, LockClient, LockOptions};
use lockkit_redis::{RedlockBackend, RedlockConfig};

const NODES: [&str; 5] = [
    "redlock-1",
    "redlock-2",
    "redlock-3",
    "redlock-4",
    "redlock-5",
];

async fn client(config: &RedlockConfig, namespace: &str, ttl: Duration) -> LockClient {
    let backend = RedlockBackend::connect(config.clone())
        .await
        .expect("connect");
    LockClient::with_options(
        std::sync::Arc::new(backend),
        namespace,
        LockOptions::default().with_ttl(ttl),
    )
    .expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_down_keeps_working_majority_down_fails_and_the_holder_learns_it() {
    let Some(harness) = common::redlock().await else {
        return;
    };
    let common::Topology::Redlock(config) = &harness.topology else {
        panic!("the redlock harness runs on Redlock");
    };
    let _restore = common::RestoreMembers(&NODES);
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let ttl = Duration::from_millis(1500);
    let locks = client(config, &namespace, ttl).await;

    // A holder with all five nodes; then two die under it.
    let held = locks.mutex("survivor").unwrap().lock().await.unwrap();
    common::member("kill", "redlock-4");
    common::member("kill", "redlock-5");
    tokio::time::sleep(ttl * 2).await;
    assert!(
        !held.is_lost(),
        "renewal with 3 of 5 nodes must keep the lock"
    );
    assert!(held.is_held().await.unwrap());
    let contender = client(config, &namespace, ttl).await;
    assert!(
        contender
            .mutex("survivor")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_none()
    );
    assert!(held.release().await.unwrap(), "release with 3 of 5 nodes");
    let regranted = contender
        .mutex("survivor")
        .unwrap()
        .lock_timeout(Duration::from_secs(5))
        .await
        .unwrap();
    assert!(regranted.release().await.unwrap());

    // A holder that loses its majority: lost() fires no later than its validity deadline.
    let doomed = locks.mutex("doomed").unwrap().lock().await.unwrap();
    common::member("kill", "redlock-3");
    let killed_at = Instant::now();
    let lost_by = tokio::time::timeout(ttl * 2, doomed.lost()).await;
    let lost_at = Instant::now();
    assert!(
        lost_by.is_ok(),
        "the holder was never told it lost its majority"
    );
    // A renewal sent before the kill returned may have succeeded and counts its validity
    // from its send; none sent after it can. The slack is for this task's wake-up only.
    assert!(
        lost_at <= killed_at + ttl + Duration::from_millis(500),
        "lost() fired {:?} after the last possible validity deadline",
        lost_at.duration_since(killed_at + ttl)
    );
    assert!(
        doomed.valid_until() <= lost_at + Duration::from_millis(5),
        "lost() fired while the guard still claimed validity"
    );
    drop(doomed);

    // Three of five down: acquire fails with QuorumNotReached within the wait timeout.
    let started = Instant::now();
    let err = locks
        .mutex("no-quorum")
        .unwrap()
        .lock_timeout(Duration::from_secs(2))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(err.kind(), ErrorKind::QuorumNotReached { got: 2, need: 3 }),
        "expected QuorumNotReached {{ got: 2, need: 3 }}: {err}"
    );
    // redlock-3, -4 and -5 are the last three nodes of the URL.
    for node in &config.nodes[2..5] {
        assert!(
            err.message().contains(node.as_str()),
            "the error names the failed node {node}: {err}"
        );
    }
    assert!(took < Duration::from_secs(3), "took {took:?}");
}
