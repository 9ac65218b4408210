//! Redlock under contention: an attempt that cannot win a majority any more returns without
//! waiting for the nodes still silent, and without waiting for its own rollback; what it
//! sent still reaches those nodes in order and is cleaned up (by the lanes, by `abandon`, by
//! a dropped acquisition's background clean-up that `LockClient::close` waits for).
//!
//! The contender reaches two of the five nodes through fault proxies that hold its requests
//! back; the shared servers themselves are never paused.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::backend::{AcquireRequest, Attempt, LockBackend, OwnerToken};
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{LockClient, LockKey, LockOptions};
use lockkit_redis::{RedlockBackend, RedlockConfig};
use redis::aio::MultiplexedConnection;

/// Long enough that waiting for a silent node, or for a rollback sent to one, cannot be
/// mistaken for a slow machine: the attempts below get half of it.
const NODE_TIMEOUT: Duration = Duration::from_secs(4);
const TTL: Duration = Duration::from_secs(20);

struct Setup {
    config: RedlockConfig,
    namespace: String,
    /// Raw connections to the five nodes.
    nodes: Vec<MultiplexedConnection>,
    /// In front of the last two nodes, for the contender only.
    proxies: Vec<FaultProxy>,
    contender: Arc<RedlockBackend>,
}

async fn setup() -> Option<Setup> {
    let harness = common::redlock().await?;
    let common::Topology::Redlock(config) = &harness.topology else {
        panic!("the redlock harness runs on Redlock");
    };
    assert_eq!(config.nodes.len(), 5, "these tests need five nodes");
    let mut proxies = Vec::new();
    for node in &config.nodes[3..] {
        proxies.push(FaultProxy::start(std::slice::from_ref(node)).await.unwrap());
    }
    let mut contender_config = config.clone();
    contender_config.node_timeout = NODE_TIMEOUT;
    for (slot, proxy) in contender_config.nodes[3..].iter_mut().zip(&proxies) {
        *slot = proxy.hosts()[0].clone();
    }
    let contender = Arc::new(RedlockBackend::connect(contender_config).await.unwrap());
    Some(Setup {
        config: config.clone(),
        namespace: format!("lk-test-{:08x}", rand::random::<u32>()),
        nodes: harness.servers().await.unwrap(),
        proxies,
        contender,
    })
}

impl Setup {
    /// A holder of `name` on the first three nodes only: the last two are free.
    async fn hold_on_three(&mut self, name: &str) -> (LockClient, lockkit_core::MutexGuard) {
        let backend = RedlockBackend::connect(self.config.clone()).await.unwrap();
        let locks = LockClient::with_options(
            Arc::new(backend),
            &self.namespace,
            LockOptions::default().with_ttl(TTL),
        )
        .unwrap();
        let guard = locks.mutex(name).unwrap().lock().await.unwrap();
        let key = common::lock_key(&LockKey::new(&self.namespace, name).unwrap());
        for node in &mut self.nodes[3..] {
            let _: i64 = redis::cmd("DEL").arg(&key).query_async(node).await.unwrap();
        }
        (locks, guard)
    }

    /// Holds back the contender's requests to the last two nodes (they wait, unread).
    fn silence(&self) {
        for proxy in &self.proxies {
            proxy.set(Direction::Requests, Fault::Pause);
        }
    }

    fn heal(&self) {
        for proxy in &self.proxies {
            proxy.heal();
        }
    }

    /// The value of `name`'s lock key on each of the last two nodes.
    async fn last_two(&mut self, name: &str) -> Vec<Option<String>> {
        let key = common::lock_key(&LockKey::new(&self.namespace, name).unwrap());
        let mut values = Vec::new();
        for node in &mut self.nodes[3..] {
            values.push(redis::cmd("GET").arg(&key).query_async(node).await.unwrap());
        }
        values
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_cannot_win_waits_neither_for_the_silent_nodes_nor_for_its_rollback() {
    let Some(mut setup) = setup().await else {
        return;
    };
    let (_holder, guard) = setup.hold_on_three("busy").await;
    setup.silence();
    let request = AcquireRequest::new(
        LockKey::new(&setup.namespace, "busy").unwrap(),
        OwnerToken::generate().unwrap(),
        TTL,
        true,
    );

    // Three of five said "contended": no majority is possible whatever the other two say.
    // The attempt returns then; its rollback for the two silent nodes is sent, not awaited.
    let attempt = tokio::time::timeout(NODE_TIMEOUT / 2, setup.contender.try_acquire(&request))
        .await
        .expect("the attempt waited for nodes that could not change its outcome")
        .unwrap();
    assert!(
        matches!(attempt, Attempt::Contended(_)),
        "three holders' keys: contended, got {attempt:?}"
    );
    assert_eq!(
        setup.last_two("busy").await,
        [None, None],
        "the silent nodes have not seen the attempt yet"
    );

    // The held-back acquire reaches the free nodes (and takes them), then its rollback.
    setup.heal();
    // abandon queues behind the attempt and its rollback on every node, so once it has
    // answered nothing of the acquisition is left anywhere.
    setup.contender.abandon(&request).await.unwrap();
    assert_eq!(setup.last_two("busy").await, [None, None]);
    assert!(guard.release().await.unwrap());
}

/// A try's late grants are rolled back. (A waiter's rollback keeps its place in the nodes'
/// queues: the key goes to whoever is first there, the waiter itself if nobody came before
/// it, as `wait.rs` says.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_grants_after_the_attempt_gave_up_is_rolled_back_without_anyone_asking() {
    let Some(mut setup) = setup().await else {
        return;
    };
    let (_holder, guard) = setup.hold_on_three("late").await;
    // The last two nodes apply the contender's requests at once but answer late.
    let late = NODE_TIMEOUT * 3 / 4;
    for proxy in &setup.proxies {
        proxy.set(
            Direction::Replies,
            Fault::Delay {
                base: late,
                jitter: Duration::ZERO,
            },
        );
    }
    let request = AcquireRequest::new(
        LockKey::new(&setup.namespace, "late").unwrap(),
        OwnerToken::generate().unwrap(),
        TTL,
        false,
    );
    let attempt = tokio::time::timeout(late / 2, setup.contender.try_acquire(&request))
        .await
        .expect("the attempt waited for late nodes that could not change its outcome")
        .unwrap();
    assert!(matches!(attempt, Attempt::Contended(_)), "{attempt:?}");
    // The free nodes took the contender's acquire: its keys are there...
    let by = tokio::time::Instant::now() + late;
    while setup.last_two("late").await.iter().any(Option::is_none) {
        assert!(
            tokio::time::Instant::now() < by,
            "the acquire never reached the free nodes"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ... and go once their late "granted" arrives, while the acquisition is still alive
    // (no abandon, no retry): they would otherwise block those nodes for the whole TTL.
    let by = tokio::time::Instant::now() + late + NODE_TIMEOUT;
    while setup.last_two("late").await != [None, None] {
        assert!(
            tokio::time::Instant::now() < by,
            "the late grants were never rolled back: {:?}",
            setup.last_two("late").await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    setup.heal();
    setup.contender.abandon(&request).await.unwrap();
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_dropped_while_its_rollbacks_are_held_back_leaves_nothing_after_close() {
    let Some(mut setup) = setup().await else {
        return;
    };
    let (_holder, guard) = setup.hold_on_three("held").await;
    let locks = LockClient::with_options(
        setup.contender.clone(),
        &setup.namespace,
        LockOptions::default().with_ttl(TTL),
    )
    .unwrap();
    setup.silence();
    // The waiter makes its attempts (each stops at three "contended"), and is dropped.
    let mutex = locks.mutex("held").unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), mutex.lock())
            .await
            .is_err(),
        "the lock is held: the waiter must still be waiting"
    );
    setup.heal();
    tokio::time::timeout(NODE_TIMEOUT * 2, locks.close())
        .await
        .expect("close() waits for the dropped waiter's clean-up, which the healed nodes answer");
    assert_eq!(
        setup.last_two("held").await,
        [None, None],
        "the dropped waiter's keys on the nodes that got its requests late are gone"
    );
    assert!(guard.release().await.unwrap());
}

/// A client of `namespace` whose nodes `cut` are reached through proxies that blackhole
/// everything (the proxies are returned: dropping them ends the fault).
async fn partly_cut_off(
    config: &RedlockConfig,
    namespace: &str,
    cut: std::ops::Range<usize>,
    options: LockOptions,
) -> (LockClient, Vec<FaultProxy>) {
    let mut through = config.clone();
    through.node_timeout = Duration::from_millis(300);
    let mut proxies = Vec::new();
    for slot in &mut through.nodes[cut] {
        let proxy = FaultProxy::start(std::slice::from_ref(slot)).await.unwrap();
        *slot = proxy.hosts()[0].clone();
        proxies.push(proxy);
    }
    // Connected while every node answers (a connect needs a majority), then cut off.
    let backend = RedlockBackend::connect(through).await.unwrap();
    for proxy in &proxies {
        proxy.set(Direction::Both, Fault::Blackhole);
        proxy.reset();
    }
    let locks = LockClient::with_options(Arc::new(backend), namespace, options).unwrap();
    (locks, proxies)
}

/// A waiter cut off from three of five nodes (a partition) cannot win, and must not keep the
/// two it still reaches: if its failed attempts queued it and its rollbacks put it back at
/// its turn, every release would hand those two nodes back to it, and everyone else would
/// need all of the other three (no fault tolerance left). With one more node down for
/// another waiter, that waiter must still get the lock on the four it reaches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cut_off_from_three_nodes_does_not_pin_the_other_two() {
    let Some(harness) = common::redlock().await else {
        return;
    };
    let common::Topology::Redlock(config) = &harness.topology else {
        panic!("the redlock harness runs on Redlock");
    };
    assert_eq!(config.nodes.len(), 5, "this test needs five nodes");
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let options = LockOptions::default()
        .with_ttl(Duration::from_secs(2))
        .with_error_budget(Duration::from_secs(60));
    let holder = LockClient::with_options(
        Arc::new(RedlockBackend::connect(config.clone()).await.unwrap()),
        &namespace,
        options.clone(),
    )
    .unwrap();
    let held = holder.mutex("pinned").unwrap().lock().await.unwrap();
    let (cut_off, _cut) = partly_cut_off(config, &namespace, 2..5, options.clone()).await;
    let pinning = {
        let mutex = cut_off.mutex("pinned").unwrap();
        tokio::spawn(async move { mutex.lock().await })
    };
    // Let the cut-off waiter queue (and fail) a few times first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (other, _down) = partly_cut_off(config, &namespace, 4..5, options).await;
    let waiting = {
        let mutex = other.mutex("pinned").unwrap();
        tokio::spawn(async move { mutex.lock_timeout(Duration::from_secs(8)).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(held.release().await.unwrap());
    let granted = waiting
        .await
        .unwrap()
        .expect("the waiter that reaches four nodes was not granted: the cut-off one kept two");
    assert!(granted.release().await.unwrap());
    pinning.abort();
}
