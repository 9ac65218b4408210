//! Waiters woken by releases, not by polling: every waiting reader of a process by a
//! writer's release notification, and a writer waiting for the last reader by that reader's
//! release, which hands it the lock; on a single server and on the Sentinel primary.

use std::time::{Duration, Instant};

use lockkit_core::{LockClient, LockOptions};

use crate::{
    PATIENCE, client, common, eventually, keys_but_fences, listeners, namespace, waiting_writers,
};

/// Three readers of one process waiting for a writer (a minute's TTL, a backoff cap of a
/// minute) are all granted right after its release, woken by its notification (each reader
/// granted passes the wake-up on), not by the cap or the writer's TTL; and a writer waiting
/// for those readers is handed the lock by the last one's release.
async fn waiters_are_woken_by_releases(harness: common::RedisHarness) {
    let ns = namespace();
    let ttl = Duration::from_secs(60);
    let cap = Duration::from_secs(60);
    let patient = LockOptions::default()
        .with_ttl(ttl)
        .with_backoff(Duration::from_millis(5), cap);
    let holder = client(harness.backend().await.unwrap(), &ns, ttl);
    let waiters =
        LockClient::with_options(harness.backend().await.unwrap(), &ns, patient.clone()).unwrap();
    let key = holder.key("woken").unwrap();
    let mut con = harness.servers().await.unwrap().remove(0);
    let written = holder.rwlock("woken").unwrap().write().await.unwrap();
    let mut readers = Vec::new();
    for _ in 0..3 {
        let lock = waiters.rwlock("woken").unwrap();
        readers.push(tokio::spawn(async move {
            let guard = lock.read().await.unwrap();
            (guard, Instant::now())
        }));
    }
    let readers_channel = format!("lockkit:released:{}:rw:readers", common::lock_key(&key));
    assert!(
        eventually(PATIENCE, || async {
            listeners(&mut con.clone(), &readers_channel).await >= 1
        })
        .await,
        "the readers never subscribed"
    );
    // Let every reader settle into its wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(readers.iter().all(|r| !r.is_finished()));
    let released = Instant::now();
    assert!(written.release().await.unwrap());
    let mut guards = Vec::new();
    for reader in readers {
        let (guard, granted) = tokio::time::timeout(PATIENCE, reader)
            .await
            .expect("a waiting reader slept through the writer's release")
            .unwrap();
        assert!(granted.duration_since(released) < PATIENCE);
        guards.push(guard);
    }

    let writers = LockClient::with_options(harness.backend().await.unwrap(), &ns, patient).unwrap();
    let lock = writers.rwlock("woken").unwrap();
    let writing = tokio::spawn(async move {
        let guard = lock.write().await.unwrap();
        (guard, Instant::now())
    });
    assert!(
        eventually(PATIENCE, || async {
            waiting_writers(&mut con.clone(), &key).await == 1
        })
        .await,
        "the writer did not record itself"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let last = guards.pop().unwrap();
    for guard in guards {
        assert!(guard.release().await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!writing.is_finished(), "a writer got in beside a reader");
    let released = Instant::now();
    assert!(last.release().await.unwrap());
    // The writer's own wait is at most a third of its TTL (20 s): well past the patience.
    let (guard, granted) = tokio::time::timeout(PATIENCE, writing)
        .await
        .expect("the waiting writer slept through the last reader's release")
        .unwrap();
    assert!(granted.duration_since(released) < PATIENCE);
    assert!(guard.release().await.unwrap());
    assert_eq!(keys_but_fences(&mut con, &ns).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_releases_not_by_polling() {
    let Some(harness) = common::single().await else {
        return;
    };
    waiters_are_woken_by_releases(harness).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_releases_on_the_sentinel_primary() {
    let Some(harness) = common::sentinel().await else {
        return;
    };
    waiters_are_woken_by_releases(harness).await;
}
