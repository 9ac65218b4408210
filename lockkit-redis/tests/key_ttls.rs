//! No key that lockkit writes is ever left without a TTL: after a workload on every topology
//! (grants, contention, cancelled waits, renewals, releases, expiries), every key on every
//! server that looks like a lockkit key (`{...}`) has one. And a released lock leaves no key
//! behind on any node, not even on the Redlock nodes whose answers the release did not wait
//! for.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::time::Duration;

use lockkit_core::{LockClient, LockOptions};

async fn workload(harness: &common::RedisHarness) {
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let options = LockOptions::default().with_ttl(Duration::from_millis(800));
    let a = LockClient::with_options(
        harness.backend().await.unwrap(),
        &namespace,
        options.clone(),
    )
    .unwrap();
    let b =
        LockClient::with_options(harness.backend().await.unwrap(), &namespace, options).unwrap();
    let held = a.mutex("w").unwrap().lock().await.unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.mutex("w").unwrap().lock().await.unwrap().release().await })
    };
    let cancelled =
        tokio::time::timeout(Duration::from_millis(50), a.mutex("w").unwrap().lock()).await;
    assert!(cancelled.is_err(), "a contended lock was granted");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(held.release().await.unwrap());
    assert!(waiter.await.unwrap().unwrap());
    // A grant left to expire, never released.
    let abandoned = a
        .mutex("expire")
        .unwrap()
        .with_options(
            LockOptions::default()
                .with_ttl(Duration::from_millis(300))
                .with_auto_renew(false),
        )
        .unwrap();
    std::mem::forget(abandoned.lock().await.unwrap());
    // A permit left to expire, where semaphores exist (not on Redlock).
    if let Ok(pool) = a.semaphore("pool", 2) {
        let pool = pool
            .with_options(
                LockOptions::default()
                    .with_ttl(Duration::from_millis(300))
                    .with_auto_renew(false),
            )
            .unwrap();
        let kept = pool.acquire().await.unwrap();
        std::mem::forget(pool.acquire().await.unwrap());
        assert!(kept.release().await.unwrap());
    }
    // A leader's value, where elections exist (not on Redlock).
    if let Ok(election) = a.election("elected") {
        let election = election
            .with_options(
                LockOptions::default()
                    .with_ttl(Duration::from_millis(300))
                    .with_auto_renew(false),
            )
            .unwrap();
        std::mem::forget(election.campaign("value").await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lockkit_key_has_a_ttl() {
    let mut harnesses = Vec::new();
    for var in [
        "LOCKKIT_TEST_REDIS_URL",
        "LOCKKIT_TEST_SENTINEL_URL",
        "LOCKKIT_TEST_REDLOCK_URL",
        "LOCKKIT_TEST_REDIS_CLUSTER_URL",
    ] {
        if let Some(harness) = common::harness(var).await {
            harnesses.push(harness);
        }
    }
    for harness in &harnesses {
        workload(harness).await;
    }
    let mut checked = 0;
    for harness in &harnesses {
        for mut con in harness.servers().await.unwrap() {
            let mut cursor: u64 = 0;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg("{*")
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut con)
                    .await
                    .unwrap();
                for key in keys {
                    let pttl: i64 = redis::cmd("PTTL")
                        .arg(&key)
                        .query_async(&mut con)
                        .await
                        .unwrap();
                    assert!(pttl != -1, "key {key} has no TTL");
                    checked += 1;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
    }
    assert!(
        harnesses.is_empty() || checked > 0,
        "no lockkit keys found to check"
    );
}

/// Redlock answers once a majority did the work; the other nodes' requests must still be
/// sent, each after the same lock's earlier requests on that node. A release left unsent (or
/// overtaken by its acquire) keeps its key on that node until the TTL (60 s here), so any
/// release lost in the loop shows at the end. Run it with the machine's cores saturated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_release_reaches_every_node() {
    let Some(harness) = common::redlock().await else {
        return;
    };
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let locks = LockClient::with_options(
        harness.backend().await.unwrap(),
        &namespace,
        LockOptions::default().with_ttl(Duration::from_secs(60)),
    )
    .unwrap();
    let mutex = locks.mutex("cycled").unwrap();
    let mut unanswered = 0;
    for _ in 0..5000 {
        let guard = mutex.lock().await.unwrap();
        // On a saturated machine a majority may not answer within the node timeout: the
        // release is still on its way to every node, which is what this test checks.
        match guard.release().await {
            Ok(released) => assert!(released, "a held lock was not ours to release"),
            Err(e) if e.is_retryable() => unanswered += 1,
            Err(e) => panic!("release failed: {e}"),
        }
    }
    eprintln!("releases without a majority's answer in time: {unanswered}");
    // The stragglers are pursued for the lock's TTL, however slow the machine: give them
    // a third of it (a key that is still there after that was never released; one that
    // expired would take the full minute).
    let by = tokio::time::Instant::now() + Duration::from_secs(20);
    let left = loop {
        let mut left = Vec::new();
        for (node, mut con) in harness.servers().await.unwrap().into_iter().enumerate() {
            for key in common::keys_of(&mut con, &namespace).await.unwrap() {
                if !key.ends_with(":fence") {
                    left.push(format!("node {node}: {key}"));
                }
            }
        }
        if left.is_empty() || tokio::time::Instant::now() >= by {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(left.is_empty(), "released locks left keys behind: {left:?}");
}

/// A lock held longer than `fence_ttl` keeps its fence counter: renewal keeps the counter
/// alive with the lock (on every node), so the next grant's token counts on from it instead
/// of falling back to a clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_past_fence_ttl_keeps_its_fence_counter() {
    let mut harnesses = Vec::new();
    for var in [
        "LOCKKIT_TEST_REDIS_URL",
        "LOCKKIT_TEST_SENTINEL_URL",
        "LOCKKIT_TEST_REDLOCK_URL",
        "LOCKKIT_TEST_REDIS_CLUSTER_URL",
    ] {
        if let Some(harness) = common::harness(var).await {
            harnesses.push(harness);
        }
    }
    let fence_ttl = Duration::from_millis(100);
    for harness in &mut harnesses {
        match &mut harness.topology {
            common::Topology::Single(c)
            | common::Topology::Sentinel(c)
            | common::Topology::Cluster(c) => c.fence_ttl = fence_ttl,
            common::Topology::Redlock(c) => c.fence_ttl = fence_ttl,
        }
        let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
        let locks = LockClient::with_options(
            harness.backend().await.unwrap(),
            &namespace,
            LockOptions::default().with_ttl(Duration::from_secs(1)),
        )
        .unwrap();
        let mutex = locks.mutex("long").unwrap();
        let guard = mutex.lock().await.unwrap();
        // Many fence TTLs, and a few renewals.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(guard.is_held().await.unwrap(), "the lock was lost");
        let fence = format!("{}:fence", common::lock_key(mutex.key()));
        let mut checked = 0;
        for (node, mut con) in harness.servers().await.unwrap().into_iter().enumerate() {
            let pttl: i64 = match redis::cmd("PTTL").arg(&fence).query_async(&mut con).await {
                // A cluster's other primaries do not serve the key's slot.
                Err(e) if e.code() == Some("MOVED") => continue,
                pttl => pttl.unwrap(),
            };
            checked += 1;
            assert!(
                pttl > 0,
                "{:?}: the fence counter of a held lock expired on server {node} (PTTL {pttl})",
                harness.topology
            );
        }
        assert!(checked > 0, "no server holds the fence counter");
        assert!(guard.release().await.unwrap());
    }
}
