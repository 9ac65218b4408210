//! Waiting on a Redis Cluster by sharded pub/sub: a queued waiter listens on a shard channel
//! of its lock's slot (`SSUBSCRIBE` on the slot's primary; no classic subscription anywhere),
//! the hand-over is announced there (`SPUBLISH`, heard by that shard only), and when the
//! slot moves to another primary the waiter follows it: the old primary ends the
//! subscription, the waiter queues again on the new one and listens there, and is handed
//! the lock there.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::time::{Duration, Instant};

use lockkit_core::backend::LockBackend;
use lockkit_core::{LockClient, LockKey, LockOptions, MutexGuard};

/// The tests of this file read server-wide counters and subscriptions: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The shard channels subscribed on the node at `addr` whose name ends with `suffix`.
async fn shard_channels(addr: &str, suffix: &str) -> Vec<String> {
    let mut con = common::connect(addr).await.unwrap();
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("SHARDCHANNELS")
        .arg("lockkit:*")
        .query_async(&mut con)
        .await
        .unwrap();
    channels
        .into_iter()
        .filter(|c| c.ends_with(suffix))
        .collect()
}

/// Waits until the node at `addr` has a waiter's inbox channel for `lock` (a lock key),
/// and returns it; panics after `within`.
async fn inbox_channel_on(addr: &str, lock: &str, within: Duration) -> String {
    let started = Instant::now();
    loop {
        let found = shard_channels(addr, &format!(":{lock}")).await;
        if let Some(channel) = found.into_iter().find(|c| c.starts_with("lockkit:inbox:")) {
            return channel;
        }
        assert!(
            started.elapsed() < within,
            "no inbox channel of {lock} on {addr} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// No node of the cluster has a classic subscription to a lockkit channel.
async fn assert_no_classic_subscription(config: &lockkit_redis::RedisConfig) {
    for node in common::cluster_nodes(config).await {
        let mut con = common::connect(&node.addr).await.unwrap();
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg("lockkit:*")
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(
            channels.is_empty(),
            "classic subscriptions on {}: {channels:?}",
            node.addr
        );
    }
}

/// A lock held by one client and waited for by another (each with a backend of its own).
/// Their TTL is 60 s and their `backoff_max` 20 s: a waiter that is not woken looks again
/// only after 20 s, and no renewal runs for 20 s.
struct Queue {
    holder: LockClient,
    waiter: LockClient,
    held: MutexGuard,
    waiting: tokio::task::JoinHandle<lockkit_core::Result<MutexGuard>>,
}

impl Queue {
    async fn on(harness: &common::RedisHarness, key: &LockKey) -> Queue {
        let options = LockOptions::default()
            .with_ttl(Duration::from_secs(60))
            .with_backoff(Duration::from_millis(10), Duration::from_secs(20))
            .with_wait_timeout(Some(Duration::from_secs(60)));
        let client = || async {
            LockClient::with_options(
                harness.backend().await.unwrap(),
                key.namespace(),
                options.clone(),
            )
            .unwrap()
        };
        let (holder, waiter) = (client().await, client().await);
        let held = holder.mutex(key.name()).unwrap().lock().await.unwrap();
        let waiting = {
            let mutex = waiter.mutex(key.name()).unwrap();
            tokio::spawn(async move { mutex.lock().await })
        };
        Queue {
            holder,
            waiter,
            held,
            waiting,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_is_announced_on_a_shard_channel_of_the_locks_slot() {
    let _serial = SERIAL.lock().await;
    let Some(harness) = common::cluster().await else {
        return;
    };
    let common::Topology::Cluster(config) = &harness.topology else {
        panic!("the cluster harness runs on a cluster");
    };
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let key = LockKey::new(&namespace, "handed-over").unwrap();
    let slot = lockkit_redis::RedisClusterBackend::slot_of(&key).unwrap();
    let owner = common::cluster_owner(config, slot).await.unwrap();
    let Queue {
        holder,
        waiter,
        held,
        waiting,
    } = Queue::on(&harness, &key).await;
    let held_token = held.fencing_token();

    let lock_key = common::lock_key(&key);
    let channel = inbox_channel_on(&owner.addr, &lock_key, Duration::from_secs(10)).await;
    assert_no_classic_subscription(config).await;

    let mut raw = common::connect(&owner.addr).await.unwrap();
    let before = common::command_calls(&mut raw).await;
    assert!(held.release().await.unwrap());
    let guard = waiting.await.unwrap().unwrap();
    let after = common::command_calls(&mut raw).await;
    let calls =
        |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    assert_eq!(
        calls("evalsha"),
        1,
        "the release alone: the waiter was handed the lock without asking again"
    );
    assert_eq!(
        calls("spublish"),
        2,
        "the hand-over's announcement, and the release on the lock's channel (for election observers)"
    );
    assert_eq!(calls("publish"), 0, "nothing broadcast on the cluster bus");
    assert!(guard.fencing_token() > held_token);
    assert!(guard.release().await.unwrap());
    holder.close().await;
    waiter.close().await;
    eprintln!("announced on {channel} at {}", owner.addr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_follows_its_lock_to_the_primary_its_slot_moved_to() {
    let _serial = SERIAL.lock().await;
    let Some(harness) = common::cluster().await else {
        return;
    };
    let common::Topology::Cluster(config) = &harness.topology else {
        panic!("the cluster harness runs on a cluster");
    };
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let key = LockKey::new(&namespace, "moving").unwrap();
    let slot = lockkit_redis::RedisClusterBackend::slot_of(&key).unwrap();
    let (origin, destination) = common::owner_and_another_primary(config, slot).await;
    // A waiter that is not woken looks again only after 20 s (see `Queue`): the 10 s given
    // to find it on the new primary are only met by following the slot.
    let Queue {
        holder,
        waiter,
        held,
        waiting,
    } = Queue::on(&harness, &key).await;
    let held_token = held.fencing_token();
    let lock_key = common::lock_key(&key);
    inbox_channel_on(&origin.addr, &lock_key, Duration::from_secs(10)).await;

    common::migrate_slot(slot, &origin, &destination).await;
    // Each primary's notifier has an inbox of its own: the waiter's channel there.
    inbox_channel_on(&destination.addr, &lock_key, Duration::from_secs(10)).await;
    assert!(
        shard_channels(&origin.addr, &format!(":{lock_key}"))
            .await
            .is_empty(),
        "the slot's old primary still has its subscription"
    );
    assert!(!waiting.is_finished(), "granted while the holder holds");

    assert!(held.release().await.unwrap());
    let guard = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the waiter was handed the lock on the new primary")
        .unwrap()
        .unwrap();
    assert!(guard.fencing_token() > held_token);
    assert!(guard.release().await.unwrap());
    assert_no_classic_subscription(config).await;
    holder.close().await;
    waiter.close().await;
    common::migrate_slot(slot, &destination, &origin).await;
}

/// An observer whose map still names the slot's old primary subscribes there and is answered
/// `MOVED`: that is no refusal (which would make every waiter of that primary poll for 30 s),
/// the wait follows the slot and listens on its new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_answered_moved_follows_the_slot() {
    let _serial = SERIAL.lock().await;
    let Some(harness) = common::cluster().await else {
        return;
    };
    let common::Topology::Cluster(config) = &harness.topology else {
        panic!("the cluster harness runs on a cluster");
    };
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let key = LockKey::new(&namespace, "observed").unwrap();
    let slot = lockkit_redis::RedisClusterBackend::slot_of(&key).unwrap();
    let (origin, destination) = common::owner_and_another_primary(config, slot).await;
    let backend = std::sync::Arc::new(
        lockkit_redis::RedisClusterBackend::connect(config.clone())
            .await
            .unwrap(),
    );
    common::migrate_slot(slot, &origin, &destination).await;

    let observing = {
        let (backend, key) = (backend.clone(), key.clone());
        tokio::spawn(async move {
            backend
                .wait_for_leader_change(&key, None, Duration::from_secs(3))
                .await
        })
    };
    let channel = format!("lockkit:released:{}", common::lock_key(&key));
    let started = Instant::now();
    while !shard_channels(&destination.addr, &channel)
        .await
        .contains(&channel)
    {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the observer does not listen on the slot's new primary"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    observing.await.unwrap().unwrap();
    assert_eq!(
        backend.capabilities().wait,
        lockkit_core::WaitStrategy::Notify,
        "a MOVED subscription was taken for a refusal"
    );
    common::migrate_slot(slot, &destination, &origin).await;
}
