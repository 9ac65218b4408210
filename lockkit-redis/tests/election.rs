//! Elections on single Redis and Sentinel, where the conformance suite cannot look: the
//! value key lives exactly as long as the lock (through renewals, and gone with a release,
//! a forced release or an expiry), and a proclamation wakes every observer by notification,
//! not by their polling bound.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::time::Duration;

use futures_util::StreamExt as _;
use lockkit_core::{Leader, LockClient, LockOptions};
use redis::aio::MultiplexedConnection;

fn namespace() -> String {
    format!("lk-test-{:08x}", rand::random::<u32>())
}

async fn client(harness: &common::RedisHarness, ns: &str, options: LockOptions) -> LockClient {
    LockClient::with_options(harness.backend().await.unwrap(), ns, options).unwrap()
}

async fn pttl(con: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(con).await.unwrap()
}

async fn topologies() -> Vec<common::RedisHarness> {
    let mut out = Vec::new();
    for harness in [common::single().await, common::sentinel().await] {
        out.extend(harness);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_value_lives_and_dies_with_the_lock() {
    for harness in topologies().await {
        let ns = namespace();
        let ttl = Duration::from_millis(1500);
        let locks = client(&harness, &ns, LockOptions::default().with_ttl(ttl)).await;
        let mut con = harness.servers().await.unwrap().remove(0);
        let election = locks.election("kept").unwrap();
        let lock = common::lock_key(election.key());
        let value = format!("{lock}:value");

        let leadership = election.campaign("v").await.unwrap();
        let (lock_ttl, value_ttl) = (pttl(&mut con, &lock).await, pttl(&mut con, &value).await);
        assert!(
            value_ttl > 0 && value_ttl <= lock_ttl + 50,
            "the value's TTL is {value_ttl} ms, the lock's {lock_ttl} ms"
        );
        // Several TTLs of renewals: the value is renewed with the lock.
        tokio::time::sleep(ttl * 3).await;
        assert!(!leadership.is_lost(), "the renewed leadership was lost");
        let seen = election.leader().await.unwrap();
        assert_eq!(
            seen,
            Some(Leader::new(leadership.term(), Some("v".into()))),
            "the value did not last as long as the renewed lock"
        );
        assert!(leadership.resign().await.unwrap());
        assert_eq!(pttl(&mut con, &value).await, -2, "a resign left the value");

        let leadership = election.campaign("w").await.unwrap();
        assert!(locks.force_release("kept").await.unwrap());
        assert_eq!(
            pttl(&mut con, &value).await,
            -2,
            "a forced release left the value"
        );
        drop(leadership);

        let unrenewed = election
            .clone()
            .with_options(LockOptions::default().with_ttl(ttl).with_auto_renew(false))
            .unwrap();
        std::mem::forget(unrenewed.campaign("x").await.unwrap());
        tokio::time::sleep(ttl + Duration::from_millis(200)).await;
        assert_eq!(
            pttl(&mut con, &value).await,
            -2,
            "the value outlived its expired lock"
        );
        assert!(election.leader().await.unwrap().is_none());
        locks.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclamation_wakes_every_observer_at_once() {
    const OBSERVERS: usize = 3;
    for harness in topologies().await {
        let ns = namespace();
        // Observers re-read at least every backoff_max: a minute here, so only the
        // notification can bring them the new value in time.
        let slow_polling =
            LockOptions::default().with_backoff(Duration::from_millis(10), Duration::from_secs(60));
        let locks = client(&harness, &ns, slow_polling).await;
        let election = locks.election("watched").unwrap();
        let leadership = election.campaign("first").await.unwrap();
        let mut observers = Vec::new();
        let mut proclaimed = Vec::new();
        for _ in 0..OBSERVERS {
            let mut changes = election.observe();
            let first = changes.next().await.unwrap().unwrap();
            assert_eq!(first.and_then(|l| l.value).as_deref(), Some("first"));
            // Each observer waits for the next two changes in its own task, and says when it
            // saw the first of them.
            let (saw, seen) = tokio::sync::oneshot::channel();
            proclaimed.push(seen);
            observers.push(tokio::spawn(async move {
                let second = changes.next().await.unwrap().unwrap();
                let _ = saw.send(());
                [second, changes.next().await.unwrap().unwrap()]
            }));
        }
        // Long enough for every observer to be waiting, not reading.
        tokio::time::sleep(Duration::from_millis(500)).await;
        leadership.proclaim("second").await.unwrap();
        // The resignation waits until every observer saw the proclamation, so that none reads
        // after it and sees only the vacancy.
        for (i, seen) in proclaimed.into_iter().enumerate() {
            tokio::time::timeout(Duration::from_secs(20), seen)
                .await
                .unwrap_or_else(|_| panic!("observer {i} was not woken by the proclamation"))
                .unwrap();
        }
        let term = leadership.term();
        assert!(leadership.resign().await.unwrap());
        for (i, observer) in observers.into_iter().enumerate() {
            let seen = tokio::time::timeout(Duration::from_secs(20), observer)
                .await
                .unwrap_or_else(|_| panic!("observer {i} was not woken by the changes"))
                .unwrap();
            assert_eq!(
                seen,
                [Some(Leader::new(term, Some("second".into()))), None],
                "observer {i}"
            );
        }
    }
}
