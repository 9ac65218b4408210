//! Sentinel with `min_replicas`: an acquire attempt and `WAIT` go on a connection of their
//! own, where they may wait behind another task's `WAIT`. An attempt cancelled while it waits
//! there is cleaned up AFTER the server ran it, never before (which would leave a grant
//! nobody holds, blocking the key for a TTL).
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{LockClient, LockOptions};
use lockkit_redis::RedisBackend;

/// How many clients the server is blocking (in `WAIT`, here).
async fn blocked_clients(con: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(con)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("blocked_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_attempt_queued_behind_a_wait_is_cleaned_up_after_it_ran() {
    let Some(harness) = common::sentinel().await else {
        return;
    };
    let common::Topology::Sentinel(config) = &harness.topology else {
        panic!("the sentinel harness runs on Sentinel");
    };
    let mut config = config.clone();
    // One replica exists, so every WAIT for two blocks its connection for replica_timeout.
    config.min_replicas = 2;
    config.replica_timeout = Duration::from_millis(800);
    config.response_timeout = Duration::from_secs(3);
    let ttl = Duration::from_secs(30);
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let locks = LockClient::with_options(
        Arc::new(RedisBackend::connect(config.clone()).await.unwrap()),
        &namespace,
        LockOptions::default().with_ttl(ttl),
    )
    .unwrap();
    let mut primary = common::connect(&common::primary_addr(&config).await.unwrap())
        .await
        .unwrap();
    let before = blocked_clients(&mut primary).await;

    // Another task's attempt: its WAIT holds the replication connection for 800 ms.
    let blocker = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.mutex("blocker").unwrap().try_lock().await })
    };
    let by = tokio::time::Instant::now() + Duration::from_secs(10);
    while blocked_clients(&mut primary).await <= before {
        assert!(
            tokio::time::Instant::now() < by,
            "the blocker's WAIT never blocked"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // This attempt is queued behind that WAIT on the server, and cancelled there.
    let victim = locks.mutex("victim").unwrap();
    let cancelled = tokio::time::timeout(Duration::from_millis(100), victim.lock()).await;
    assert!(cancelled.is_err(), "the queued attempt was not cancelled");
    let _ = blocker.await;

    // The clean-up runs after the attempt did, within the WAITs queued before it: far less
    // than the TTL a phantom grant would hold the key for.
    let key = common::lock_key(victim.key());
    let by = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let exists: bool = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut primary)
            .await
            .unwrap();
        if !exists {
            break;
        }
        assert!(
            tokio::time::Instant::now() < by,
            "the cancelled attempt was granted after its clean-up: {key} is held by nobody for the TTL"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
