//! Each freed permit goes to the next waiter in queue order, and a release wakes only the
//! waiters whose place in the queue changed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::LockClient;
use lockkit_core::testing::Recording;
use lockkit_etcd::{EtcdBackend, EtcdConfig};
use tokio::sync::mpsc;

use crate::{PATIENCE, QUEUE_TTL, client, client_of, next_grant, queue_waiter, support};

/// A client like [`client`] whose calls are recorded.
async fn recorded_client(config: &EtcdConfig, ns: &str) -> (LockClient, Arc<Recording>) {
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    let recording = Arc::new(Recording::new(Arc::new(backend)));
    (client_of(recording.clone(), ns, QUEUE_TTL).await, recording)
}

/// Two permits, six waiters queued one after the other. Permits are freed by holders at
/// either end of the holding pair (not always the key just ahead of the next waiter), and each
/// free permit goes to the next waiter in queue order: a waiter that became the first waiter
/// when the one ahead of it was granted learns so (from its touch) and is woken by the
/// departure of any holder.
#[tokio::test]
async fn waiters_are_granted_in_queue_order() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("sem-order");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let holder = client(&config, &ns).await;
    let pool = holder.semaphore("order", 2).expect("semaphore");
    let first = pool.acquire().await.expect("first permit");
    let second = pool.acquire().await.expect("second permit");
    let (sender, mut granted) = mpsc::unbounded_channel();
    for index in 0..6 {
        let waiter = client(&config, &ns).await;
        let semaphore = waiter.semaphore("order", 2).expect("semaphore");
        queue_waiter(&admin, &ns, 3 + index, index, semaphore, &sender).await;
    }
    // Holding [first, second]; the newest holder leaves.
    assert!(second.release().await.expect("release"));
    let w0 = next_grant(&mut granted, 0).await;
    // Holding [first, w0]; the oldest leaves: w1 was behind w0 and must have moved up.
    assert!(first.release().await.expect("release"));
    let w1 = next_grant(&mut granted, 1).await;
    // Holding [w0, w1]; the newest leaves.
    assert!(w1.release().await.expect("release"));
    let w2 = next_grant(&mut granted, 2).await;
    // Holding [w0, w2]; the oldest leaves.
    assert!(w0.release().await.expect("release"));
    let w3 = next_grant(&mut granted, 3).await;
    // Holding [w2, w3]; both leave at once, as a session's end takes several keys.
    let (a, b) = tokio::join!(w2.release(), w3.release());
    assert!(a.expect("release") && b.expect("release"));
    let w4 = next_grant(&mut granted, 4).await;
    let w5 = next_grant(&mut granted, 5).await;
    assert!(w4.fencing_token() < w5.fencing_token());
    for permit in [w4, w5] {
        assert!(permit.release().await.expect("release"));
    }
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}

/// Two permits held, six waiters queued, each its own client with its calls recorded. One
/// release makes the first waiter a holder and the second the first waiter; the other four
/// keep their places. Bound asserted: the promoted waiter makes exactly one attempt (its
/// grant), the second exactly one (woken by the promoted waiter's touch, it reads its new
/// place), the four behind them none.
#[tokio::test]
async fn a_release_wakes_only_the_waiters_whose_place_changed() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("sem-herd");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let holder = client(&config, &ns).await;
    let pool = holder.semaphore("herd", 2).expect("semaphore");
    let first = pool.acquire().await.expect("first permit");
    let second = pool.acquire().await.expect("second permit");
    let (sender, mut granted) = mpsc::unbounded_channel();
    let mut recordings = Vec::new();
    for index in 0..6 {
        let (waiter, recording) = recorded_client(&config, &ns).await;
        let semaphore = waiter.semaphore("herd", 2).expect("semaphore");
        queue_waiter(&admin, &ns, 3 + index, index, semaphore, &sender).await;
        recordings.push(recording);
    }
    // Every waiter is in its wait (its watch open) before the release.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before: Vec<usize> = recordings.iter().map(|r| r.count("try_acquire")).collect();
    assert!(second.release().await.expect("release"));
    let w0 = next_grant(&mut granted, 0).await;
    let attempts_since = |index: usize| recordings[index].count("try_acquire") - before[index];
    let deadline = Instant::now() + PATIENCE;
    while attempts_since(1) == 0 {
        assert!(
            Instant::now() < deadline,
            "the waiter behind the promoted one was not woken by its touch"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Room for any stray wake to show before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let attempts: Vec<usize> = (0..6).map(attempts_since).collect();
    assert_eq!(
        attempts,
        [1, 1, 0, 0, 0, 0],
        "attempts per waiter after one release"
    );
    // The second waiter did move up: the other holder's release grants it.
    assert!(first.release().await.expect("release"));
    let w1 = next_grant(&mut granted, 1).await;
    assert!(w0.release().await.expect("release"));
    assert!(w1.release().await.expect("release"));
    for index in 2..6 {
        let permit = next_grant(&mut granted, index).await;
        assert!(permit.release().await.expect("release"));
    }
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}
