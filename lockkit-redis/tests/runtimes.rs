//! One client used from several application runtimes, one after the other and at once: each
//! runtime's tasks send their attempts and releases on a connection that runtime drives, and
//! when a runtime shuts down its connection is forgotten, so that the next runtime's requests
//! and lockkit's own background work (a dropped guard's release) go on unharmed. The work
//! runs in spawned tasks: a future that `block_on` runs is no task, and uses lockkit's
//! connection.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::RedisHarness;
use lockkit_core::{LockClient, LockOptions};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A client of its own backend on `harness`'s server, in `namespace`, with a 30 s TTL.
async fn client(harness: &RedisHarness, namespace: &str) -> LockClient {
    LockClient::with_options(
        harness.backend().await.unwrap(),
        namespace,
        LockOptions::default().with_ttl(Duration::from_secs(30)),
    )
    .unwrap()
}

#[test]
fn a_client_outlives_the_runtime_that_first_used_it() {
    let first = runtime();
    let Some(harness) = first.block_on(common::single()) else {
        return;
    };
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let (locks, other) = first.block_on(async {
        (
            client(&harness, &namespace).await,
            client(&harness, &namespace).await,
        )
    });
    // The first runtime's tasks lock and release, and leave a guard to drop later.
    let in_first = locks.clone();
    let held = first
        .block_on(first.spawn(async move {
            let guard = in_first.mutex("a").unwrap().lock().await.unwrap();
            assert!(guard.release().await.unwrap());
            in_first.mutex("b").unwrap().lock().await.unwrap()
        }))
        .unwrap();
    drop(first);

    let second = runtime();
    let task = second.spawn(async move {
        let bounded = Duration::from_secs(10);
        // Released in the background, on lockkit's runtime, after the runtime that took it
        // is gone.
        drop(held);
        tokio::time::timeout(bounded, locks.close()).await.unwrap();
        let guard = tokio::time::timeout(bounded, other.mutex("b").unwrap().lock())
            .await
            .expect("the dropped guard's lock was released")
            .unwrap();
        assert!(guard.release().await.unwrap());
        // The client goes on from the second runtime: a contended hand-over included.
        let held = locks.mutex("a").unwrap().lock().await.unwrap();
        let mutex = other.mutex("a").unwrap();
        let waiter = tokio::spawn(async move { mutex.lock().await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(held.release().await.unwrap());
        let next = tokio::time::timeout(bounded, waiter)
            .await
            .expect("the waiter was handed the lock")
            .unwrap()
            .unwrap();
        assert!(next.release().await.unwrap());
    });
    second.block_on(task).unwrap();
}

#[test]
fn two_runtimes_use_one_client_at_once() {
    let (first, second) = (runtime(), runtime());
    let Some(harness) = first.block_on(common::single()) else {
        return;
    };
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let locks = first.block_on(client(&harness, &namespace));
    let shared = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let work = |locks: LockClient, shared: std::sync::Arc<std::sync::atomic::AtomicU64>| async move {
        for _ in 0..200 {
            let guard = locks.mutex("k").unwrap().lock().await.unwrap();
            let seen = shared.load(std::sync::atomic::Ordering::SeqCst);
            tokio::task::yield_now().await;
            shared.store(seen + 1, std::sync::atomic::Ordering::SeqCst);
            assert!(guard.release().await.unwrap());
        }
    };
    let other = second.spawn(work(locks.clone(), shared.clone()));
    first
        .block_on(first.spawn(work(locks.clone(), shared.clone())))
        .unwrap();
    second.block_on(other).unwrap();
    assert_eq!(shared.load(std::sync::atomic::Ordering::SeqCst), 400);
    first.block_on(locks.close());
}

/// A current-thread runtime's tasks lock and release; then, while that runtime sits idle
/// (alive, with nobody blocking on it), another runtime's tasks use the same client: their
/// requests must not wait on a connection only the idle runtime would drive.
#[test]
fn an_idle_current_thread_runtime_stalls_no_other() {
    let idle = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let Some(harness) = idle.block_on(common::single()) else {
        return;
    };
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let locks = idle.block_on(client(&harness, &namespace));
    let in_idle = locks.clone();
    idle.block_on(idle.spawn(async move {
        let guard = in_idle.mutex("a").unwrap().lock().await.unwrap();
        assert!(guard.release().await.unwrap());
    }))
    .unwrap();

    let busy = runtime();
    let in_busy = locks.clone();
    busy.block_on(busy.spawn(async move {
        let bounded = Duration::from_secs(10);
        for _ in 0..20 {
            let guard = tokio::time::timeout(bounded, in_busy.mutex("a").unwrap().lock())
                .await
                .expect("a lock waited on the idle runtime's connection")
                .unwrap();
            let released = tokio::time::timeout(bounded, guard.release())
                .await
                .expect("a release waited on the idle runtime's connection");
            assert!(released.unwrap());
        }
    }))
    .unwrap();
    busy.block_on(locks.close());
    drop(idle);
}
