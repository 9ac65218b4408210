//! Round trips against a single Redis node, counted by the server: exactly two commands per
//! uncontended acquire+release, two per hand-over to a queued waiter (the waiter's attempt
//! that queued it and the holder's release: the woken waiter asks nothing more), one per
//! contended try (no clean-up after an answer that left nothing), and one pipelined renewal
//! batch per tick however many locks are held.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lockkit_core::testing::Recording;
use lockkit_core::{LockClient, LockOptions, MutexGuard};

/// The tests of this file read server-wide counters: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> HashMap<String, u64> {
    after
        .iter()
        .map(|(name, calls)| (name.clone(), calls - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, calls)| *calls > 0)
        .collect()
}

/// The commands the scripts run inside one `EVALSHA` (counted by the server too).
const INSIDE_SCRIPTS: &[&str] = &[
    "get", "set", "incr", "pexpire", "pttl", "time", "del", "publish", "zrange", "zrem", "zscore",
    "zadd", "hset", "hget", "hdel", "hincrby",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_acquire_and_release_take_exactly_two_commands() {
    let _serial = SERIAL.lock().await;
    let Some(harness) = common::single().await else {
        return;
    };
    let mut raw = harness.servers().await.expect("raw connection").remove(0);
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let backend = harness.backend().await.expect("connect");
    let locks =
        LockClient::with_options(backend, &namespace, LockOptions::default()).expect("client");
    // Warm up: scripts loaded, connections open.
    drop(
        locks
            .mutex("warm")
            .unwrap()
            .lock()
            .await
            .unwrap()
            .release()
            .await,
    );

    let cycles = 1000;
    let before = common::command_calls(&mut raw).await;
    for i in 0..cycles {
        let guard = locks
            .mutex(&format!("k{}", i % 10))
            .unwrap()
            .lock()
            .await
            .unwrap();
        assert!(guard.release().await.unwrap());
    }
    let after = common::command_calls(&mut raw).await;
    let delta = delta(&before, &after);

    assert_eq!(
        delta.get("evalsha").copied(),
        Some(2 * cycles),
        "commands: {delta:?}"
    );
    let others: Vec<_> = delta
        .iter()
        .filter(|(name, _)| name.as_str() != "evalsha" && name.as_str() != "info")
        .filter(|(name, _)| !INSIDE_SCRIPTS.contains(&name.as_str()))
        .collect();
    assert!(
        others.is_empty(),
        "commands other than the two scripts: {others:?}"
    );
    assert_eq!(delta.get("info").copied(), Some(1), "commands: {delta:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_takes_exactly_two_commands() {
    let _serial = SERIAL.lock().await;
    let Some(harness) = common::single().await else {
        return;
    };
    let mut raw = harness.servers().await.expect("raw connection").remove(0);
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let queue = format!(
        "{}:queue",
        common::lock_key(&lockkit_core::LockKey::new(&namespace, "k").unwrap())
    );
    let options = LockOptions::default()
        .with_ttl(Duration::from_secs(60))
        .with_backoff(Duration::from_millis(20), Duration::from_secs(10));
    let mut clients = Vec::new();
    for _ in 0..2 {
        let backend = harness.backend().await.expect("connect");
        clients
            .push(LockClient::with_options(backend, &namespace, options.clone()).expect("client"));
    }
    let mut held = clients[0].mutex("k").unwrap().lock().await.unwrap();
    // Each round: the other client queues, the holder releases, the lock is handed over.
    let hand_over =
        async |raw: &mut redis::aio::MultiplexedConnection, held: MutexGuard, next: &LockClient| {
            let mutex = next.mutex("k").unwrap();
            let waiting = tokio::spawn(async move { mutex.lock().await });
            loop {
                let queued: usize = redis::cmd("ZCARD")
                    .arg(&queue)
                    .query_async(raw)
                    .await
                    .unwrap();
                if queued == 1 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            assert!(held.release().await.unwrap());
            waiting.await.unwrap().unwrap()
        };
    // Warm up: both clients' inboxes subscribed (the first wait of a client subscribes, then
    // looks at the lock once more).
    for i in [1, 0] {
        held = hand_over(&mut raw, held, &clients[i]).await;
    }
    let rounds = 50;
    let before = common::command_calls(&mut raw).await;
    for round in 0..rounds {
        held = hand_over(&mut raw, held, &clients[(round + 1) % 2]).await;
    }
    let after = common::command_calls(&mut raw).await;
    let delta = delta(&before, &after);
    assert_eq!(
        delta.get("evalsha").copied(),
        Some(2 * rounds as u64),
        "commands: {delta:?}"
    );
    assert!(held.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contended_try_takes_exactly_one_command() {
    let _serial = SERIAL.lock().await;
    let Some(harness) = common::single().await else {
        return;
    };
    let mut raw = harness.servers().await.expect("raw connection").remove(0);
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let client = || async {
        LockClient::with_options(
            harness.backend().await.expect("connect"),
            &namespace,
            LockOptions::default().with_ttl(Duration::from_secs(60)),
        )
        .expect("client")
    };
    let (holder, contender) = (client().await, client().await);
    let locked = holder.mutex("k").unwrap().lock().await.unwrap();
    let permit = holder.semaphore("k", 1).unwrap().acquire().await.unwrap();
    let reading = holder.rwlock("k").unwrap().read().await.unwrap();
    let (mutex, semaphore, rwlock) = (
        contender.mutex("k").unwrap(),
        contender.semaphore("k", 1).unwrap(),
        contender.rwlock("k").unwrap(),
    );
    // Warm up: the contender's scripts loaded, its connection open.
    assert!(mutex.try_lock().await.unwrap().is_none());
    assert!(semaphore.try_acquire().await.unwrap().is_none());
    assert!(rwlock.try_write().await.unwrap().is_none());

    let tries = 100;
    let before = common::command_calls(&mut raw).await;
    for _ in 0..tries {
        assert!(mutex.try_lock().await.unwrap().is_none());
        assert!(semaphore.try_acquire().await.unwrap().is_none());
        assert!(rwlock.try_write().await.unwrap().is_none());
    }
    let after = common::command_calls(&mut raw).await;
    let delta = delta(&before, &after);
    assert_eq!(
        delta.get("evalsha").copied(),
        Some(3 * tries),
        "commands: {delta:?}"
    );
    let others: Vec<_> = delta
        .iter()
        .filter(|(name, _)| name.as_str() != "evalsha" && name.as_str() != "info")
        .filter(|(name, _)| !INSIDE_SCRIPTS.contains(&name.as_str()))
        .filter(|(name, _)| {
            !["zrangebyscore", "zrange", "zscore", "hget", "zcard"].contains(&name.as_str())
        })
        .collect();
    assert!(others.is_empty(), "commands besides the tries: {others:?}");
    assert!(locked.release().await.unwrap());
    assert!(permit.release().await.unwrap());
    assert!(reading.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pipelined_renewal_batch_per_tick_for_100_locks() {
    let _serial = SERIAL.lock().await;
    let Some(harness) = common::single().await else {
        return;
    };
    let mut raw = harness.servers().await.expect("raw connection").remove(0);
    let counting = Arc::new(Recording::new(harness.backend().await.expect("connect")));
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let ttl = Duration::from_millis(900);
    let locks = LockClient::with_options(
        counting.clone(),
        &namespace,
        LockOptions::default().with_ttl(ttl),
    )
    .expect("client");
    let mut guards = Vec::new();
    for i in 0..100 {
        guards.push(
            locks
                .mutex(&format!("held-{i}"))
                .unwrap()
                .lock()
                .await
                .unwrap(),
        );
    }
    // On a busy machine taking 100 locks can outlast a tick: the ticks before the leases fall
    // into step renew only those due. Count from the first tick that renewed all 100, and
    // start the server-side count between ticks.
    let by = tokio::time::Instant::now() + ttl * 10;
    let settled = loop {
        let calls = counting.calls();
        if let Some(full) = calls
            .iter()
            .position(|c| c.method == "renew_many" && c.leases == 100)
        {
            break full + 1;
        }
        assert!(
            tokio::time::Instant::now() < by,
            "no tick renewed all 100 locks: {:?}",
            calls.iter().map(|c| c.leases).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    tokio::time::sleep(ttl / 6).await;
    let before = common::command_calls(&mut raw).await;
    tokio::time::sleep(ttl * 3).await;
    let after = common::command_calls(&mut raw).await;
    let batches: Vec<usize> = counting
        .calls()
        .iter()
        .skip(settled)
        .filter(|c| c.method == "renew_many")
        .map(|c| c.leases)
        .collect();

    assert!(
        guards.iter().all(|g| !g.is_lost()),
        "a renewed lock was lost"
    );
    assert!(
        batches.len() >= 3,
        "expected a renewal every third of the TTL, got batches {batches:?}"
    );
    assert!(
        batches.iter().all(|&n| n == 100),
        "every tick should renew all 100 locks in one batch: {batches:?}"
    );
    assert_eq!(counting.count("renew"), 0);
    let evalsha = delta(&before, &after).get("evalsha").copied().unwrap_or(0);
    let batches_in_window = evalsha / 100;
    assert_eq!(
        evalsha % 100,
        0,
        "renewal scripts not in whole batches of 100: {evalsha}"
    );
    assert!(
        (2..=batches.len() as u64).contains(&batches_in_window),
        "{evalsha} renewal scripts in the window, batches seen {batches:?}"
    );
    for guard in guards {
        assert!(guard.release().await.unwrap());
    }
}

/// After `SCRIPT FLUSH` (as after a restart), every operation reloads the scripts by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_scripts_are_reloaded_transparently() {
    let _serial = SERIAL.lock().await;
    let Some(harness) = common::single().await else {
        return;
    };
    let mut raw = harness.servers().await.expect("raw connection").remove(0);
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let ttl = Duration::from_millis(600);
    let locks = LockClient::with_options(
        harness.backend().await.expect("connect"),
        &namespace,
        LockOptions::default().with_ttl(ttl),
    )
    .expect("client");
    let held = locks.mutex("renewed").unwrap().lock().await.unwrap();
    let flush = |raw: &mut redis::aio::MultiplexedConnection| {
        let mut raw = raw.clone();
        async move {
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut raw)
                .await
                .unwrap();
        }
    };
    flush(&mut raw).await;
    tokio::time::sleep(ttl).await;
    assert!(!held.is_lost(), "renewal failed after SCRIPT FLUSH");
    flush(&mut raw).await;
    assert!(
        locks
            .mutex("renewed")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_none()
    );
    flush(&mut raw).await;
    let other = locks.mutex("other").unwrap().lock().await.unwrap();
    flush(&mut raw).await;
    assert!(other.release().await.unwrap());
    flush(&mut raw).await;
    assert!(held.release().await.unwrap());
    // An election's proclamations (its first one comes with the campaign).
    let election = locks.election("elected").unwrap();
    flush(&mut raw).await;
    let leadership = election.campaign("first").await.unwrap();
    flush(&mut raw).await;
    leadership.proclaim("second").await.unwrap();
    let leader = election.leader().await.unwrap();
    assert_eq!(leader.and_then(|l| l.value).as_deref(), Some("second"));
    assert!(leadership.resign().await.unwrap());
}
