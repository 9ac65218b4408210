//! Redlock's queues: every node queues a lock's waiters in the order their acquisitions
//! began, and a holder's release hands each node's key to the first of them, so waiters are
//! granted in that order, by the release alone (a waiter makes one attempt, the one that
//! queues it), with tokens above the holder's; when the last waiter is done nothing is left
//! on any node.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::time::Duration;

use lockkit_core::testing::Recording;
use lockkit_core::{LockClient, LockKey, LockOptions, MutexGuard};
use redis::aio::MultiplexedConnection;
use tokio::sync::oneshot;

/// How many waiters every node has queued for `queue`.
async fn queued_everywhere(nodes: &mut [MultiplexedConnection], queue: &str) -> Vec<usize> {
    let mut counts = Vec::new();
    for node in nodes.iter_mut() {
        counts.push(
            redis::cmd("ZCARD")
                .arg(queue)
                .query_async::<usize>(node)
                .await
                .unwrap(),
        );
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_handed_the_lock_in_the_order_they_began_waiting() {
    let Some(harness) = common::redlock().await else {
        return;
    };
    let mut nodes = harness.servers().await.unwrap();
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let lock = common::lock_key(&LockKey::new(&namespace, "k").unwrap());
    let queue = format!("{lock}:queue");
    let options = LockOptions::default()
        .with_ttl(Duration::from_secs(30))
        .with_backoff(Duration::from_millis(20), Duration::from_secs(10));
    let client = |backend| LockClient::with_options(backend, &namespace, options.clone()).unwrap();
    let holder = client(harness.backend().await.unwrap());
    let held = holder.mutex("k").unwrap().lock().await.unwrap();
    let mut last = held.fencing_token();
    let mut waiters = Vec::new();
    for i in 1..=3 {
        let recording = std::sync::Arc::new(Recording::new(harness.backend().await.unwrap()));
        let mutex = client(recording.clone()).mutex("k").unwrap();
        let (granted, guard) = oneshot::channel::<MutexGuard>();
        tokio::spawn(async move {
            let _ = granted.send(mutex.lock().await.unwrap());
        });
        let by = tokio::time::Instant::now() + Duration::from_secs(10);
        while queued_everywhere(&mut nodes, &queue).await != vec![i; 5] {
            assert!(
                tokio::time::Instant::now() < by,
                "waiter {i} did not queue on every node"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        waiters.push((recording, guard));
    }
    assert!(held.release().await.unwrap());
    for (i, (recording, granted)) in waiters.into_iter().enumerate() {
        let guard = tokio::time::timeout(Duration::from_secs(10), granted)
            .await
            .unwrap_or_else(|_| panic!("waiter {} was not granted in 10 s", i + 1))
            .unwrap();
        assert!(guard.fencing_token() > last, "tokens go up with each grant");
        last = guard.fencing_token();
        assert_eq!(
            queued_everywhere(&mut nodes, &queue).await,
            vec![2 - i; 5],
            "waiter {} was granted out of turn",
            i + 1
        );
        // Queued by its attempt and handed the lock by a release (the first wait of a
        // client subscribes its inbox, then looks once more).
        let attempts = recording
            .calls()
            .iter()
            .filter(|c| c.method == "try_acquire")
            .count();
        assert!(
            attempts <= 2,
            "waiter {} made {attempts} attempts: it was not handed the lock",
            i + 1
        );
        assert!(guard.release().await.unwrap());
    }
    for node in nodes.iter_mut() {
        let left: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{{{namespace}/*"))
            .query_async(node)
            .await
            .unwrap();
        assert!(
            left.iter().all(|key| key.ends_with(":fence")),
            "left on a node: {left:?}"
        );
    }
}
