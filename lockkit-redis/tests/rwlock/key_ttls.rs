//! An abandoned rwlock's keys live no longer than what they hold, and vanish by their TTLs.

use std::time::{Duration, Instant};

use lockkit_core::LockKey;
use lockkit_core::backend::{Hold, OwnerToken};

use crate::{PATIENCE, attempt, common, keys_but_fences, namespace, pttl, rw_key};

/// A reader and a writer that crash (a raw write grant of 1 s, then a raw read grant and a
/// waiting writer's entry of 3 s): every key lives no longer than what it holds (the waiting
/// writers' queue, as every queue, at most two of its entries' TTLs: `scripts/queue.lua`),
/// with no call to the server after the grants, and then vanishes by its own TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_rwlock_vanishes_by_its_ttls() {
    let Some(harness) = common::single().await else {
        return;
    };
    let backend = harness.backend().await.unwrap();
    let ns = namespace();
    let (short, long) = (Duration::from_millis(1000), Duration::from_secs(3));
    let mut con = harness.servers().await.unwrap().remove(0);

    let written = LockKey::new(&ns, "written").unwrap();
    let writer = OwnerToken::generate().unwrap();
    assert!(
        attempt(&backend, &written, &writer, Hold::Write, short, false)
            .await
            .is_some()
    );
    let read = LockKey::new(&ns, "read").unwrap();
    assert!(
        attempt(
            &backend,
            &read,
            &OwnerToken::generate().unwrap(),
            Hold::Read,
            long,
            false
        )
        .await
        .is_some()
    );
    let long_sent = Instant::now();
    assert_eq!(
        attempt(
            &backend,
            &read,
            &OwnerToken::generate().unwrap(),
            Hold::Write,
            long,
            true
        )
        .await,
        None
    );
    drop(backend);

    let mut expected = vec![
        rw_key(&read, "holders"),
        rw_key(&read, "tokens"),
        rw_key(&read, "waiting"),
        rw_key(&read, "waiting:entries"),
        rw_key(&written, "holders"),
        rw_key(&written, "tokens"),
        rw_key(&written, "writer"),
    ];
    expected.sort();
    assert_eq!(keys_but_fences(&mut con, &ns).await, expected);
    for k in &expected {
        let left = pttl(&mut con, k).await;
        let bound = if k.contains("written") {
            short
        } else if k.contains("waiting") {
            long * 2
        } else {
            long
        };
        assert!(
            left > 0 && left <= bound.as_millis() as i64,
            "{k} lives {left} ms, longer than what it holds ({bound:?})"
        );
    }
    let deadline = long_sent + long * 2 + PATIENCE;
    while !keys_but_fences(&mut con, &ns).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the rwlock's keys outlived their TTL"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(pttl(&mut con, &rw_key(&read, "fence")).await > 0);
}
