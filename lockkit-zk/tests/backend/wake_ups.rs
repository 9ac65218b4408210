//! Waiters watch only their predecessor: each release wakes exactly one of fifty waiters, in
//! queue order.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use lockkit_core::{LockClient, LockOptions};
use lockkit_zk::ZkBackend;

use crate::support::{TEST_CHROOT, admin, test_config};
use crate::{assert_no_znodes, client, namespace};

/// (4) Fifty waiters queue on one key; every release wakes exactly one of them, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_release_wakes_exactly_one_of_fifty_waiters() {
    const WAITERS: u64 = 50;
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, holder) = client(&config, &ns).await;
    let waiters_backend = ZkBackend::connect(config.clone()).await.unwrap();
    // Only a watch can wake a waiter: the polling cap is far beyond the test.
    let waiters = LockClient::with_options(
        Arc::new(waiters_backend.clone()),
        &ns,
        LockOptions::default().with_backoff(Duration::from_millis(1), Duration::from_secs(600)),
    )
    .unwrap();
    let first = holder.mutex("herd").unwrap().lock().await.unwrap();
    let wakes_at_grant = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..WAITERS {
        let (waiters, backend, wakes) = (
            waiters.clone(),
            waiters_backend.clone(),
            wakes_at_grant.clone(),
        );
        tasks.spawn(async move {
            let guard = waiters.mutex("herd").unwrap().lock().await.unwrap();
            wakes.lock().unwrap().push(backend.watch_events());
            tokio::time::sleep(Duration::from_millis(2)).await;
            assert!(guard.release().await.unwrap());
        });
    }
    let parent = format!("/{ns}/herd");
    let deadline = Instant::now() + Duration::from_secs(30);
    while admin.list_children(&parent).await.map_or(0, |c| c.len()) < WAITERS as usize + 1 {
        assert!(Instant::now() < deadline, "the waiters did not all queue");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let every waiter set its watch on its predecessor.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        waiters_backend.watch_events(),
        0,
        "a waiter woke while nothing changed"
    );
    assert!(first.release().await.unwrap());
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let wakes = wakes_at_grant.lock().unwrap().clone();
    let expected: Vec<u64> = (1..=WAITERS).collect();
    assert_eq!(
        wakes, expected,
        "watch events seen by each grant, in grant order"
    );
    assert_eq!(waiters_backend.watch_events(), WAITERS);
    assert_no_znodes(&admin, &ns).await;
}
