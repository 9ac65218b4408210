//! A Redis Cluster resharded under load: the slot of a contended lock migrates to another
//! primary and back (`CLUSTER SETSLOT ... IMPORTING / MIGRATING`, `MIGRATE`, `SETSLOT ...
//! NODE`, as `redis-cli --cluster reshard` does) while 8 clients take it in turn, and a
//! lock of the same slot stays held across both moves with a TTL shorter than the test.
//! No grant overlaps another, tokens increase, no error reaches a client, the held lock is
//! renewed on each new primary, and nothing is left behind.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lockkit_core::{LockClient, LockKey, LockOptions};
use redis::aio::MultiplexedConnection;

const CONTENDERS: usize = 8;

/// The number of keys of `slot` on a node.
async fn keys_in_slot(con: &mut MultiplexedConnection, slot: u16) -> i64 {
    redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query_async(con)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrating_under_contention_loses_nothing_and_leaves_nothing() {
    let Some(harness) = common::cluster().await else {
        return;
    };
    let common::Topology::Cluster(config) = &harness.topology else {
        panic!("the cluster harness runs on a cluster");
    };
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let contended = LockKey::new(&namespace, "contended").unwrap();
    let slot = lockkit_redis::RedisClusterBackend::slot_of(&contended).unwrap();
    // Another lock of the same slot, held (and renewed) all along.
    let held_name = (0..)
        .map(|i| format!("held-{i}"))
        .find(|name| {
            lockkit_redis::RedisClusterBackend::slot_of(&LockKey::new(&namespace, name).unwrap())
                == Some(slot)
        })
        .unwrap();
    let (origin, destination) = common::owner_and_another_primary(config, slot).await;

    let options = LockOptions::default()
        .with_ttl(Duration::from_millis(800))
        .with_wait_timeout(Some(Duration::from_secs(30)));
    let keeper = LockClient::with_options(
        harness.backend().await.unwrap(),
        &namespace,
        options.clone(),
    )
    .unwrap();
    let held = keeper.mutex(&held_name).unwrap().lock().await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let inside = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut contenders = Vec::new();
    for _ in 0..CONTENDERS {
        let backend = harness.backend().await.unwrap();
        let locks = LockClient::with_options(backend.clone(), &namespace, options.clone()).unwrap();
        let (stop, inside, tokens) = (stop.clone(), inside.clone(), tokens.clone());
        contenders.push(tokio::spawn(async move {
            let mutex = locks.mutex("contended").unwrap();
            let mut grants = 0;
            while !stop.load(Ordering::SeqCst) {
                let guard = mutex.lock().await.expect("no error reaches a client");
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                tokens.lock().unwrap().push(guard.fencing_token().get());
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                assert!(guard.release().await.expect("no error reaches a client"));
                grants += 1;
            }
            locks.close().await;
            // A subscription the moving slot's old primary answered with MOVED is no
            // refusal: the waiters still listen, not poll.
            assert_eq!(
                backend.capabilities().wait,
                lockkit_core::WaitStrategy::Notify,
                "the migration made waiters poll"
            );
            grants
        }));
    }

    tokio::time::sleep(Duration::from_millis(300)).await;
    common::migrate_slot(slot, &origin, &destination).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    common::migrate_slot(slot, &destination, &origin).await;
    // Longer than the held lock's TTL since the last move: only renewals on the slot's
    // primary of the moment can have kept it.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::SeqCst);
    let mut grants = 0;
    for contender in contenders {
        grants += contender.await.unwrap();
    }

    let tokens = tokens.lock().unwrap().clone();
    assert!(grants > CONTENDERS, "only {grants} grants in all");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens went back: {tokens:?}"
    );
    assert!(!held.is_lost(), "the held lock was lost in the migration");
    let info = keeper
        .inspect(&held_name)
        .await
        .unwrap()
        .expect("still held");
    assert_eq!(info.fencing_token, held.fencing_token());
    assert!(held.release().await.unwrap());
    keeper.close().await;

    let left = lockkit_core::testing::Harness::leftovers(&harness, &namespace)
        .await
        .unwrap();
    assert!(left.is_empty(), "left behind: {left:?}");
    let mut origin_con = common::connect(&origin.addr).await.unwrap();
    let mut destination_con = common::connect(&destination.addr).await.unwrap();
    assert_eq!(
        keys_in_slot(&mut destination_con, slot).await,
        0,
        "keys stayed on the node the slot left"
    );
    // Of this test's keys, only fence counters remain, on the slot's owner, with their TTL
    // (other tests' keys may share the slot).
    let ours: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(10_000)
        .query_async::<Vec<String>>(&mut origin_con)
        .await
        .unwrap()
        .into_iter()
        .filter(|key| key.starts_with(&format!("{{{namespace}/")))
        .collect();
    assert!(ours.iter().all(|key| key.ends_with(":fence")), "{ours:?}");
    eprintln!(
        "{grants} grants while slot {slot} moved {} -> {} -> {}",
        origin.addr, destination.addr, origin.addr
    );
}

/// Sets a slot back to `STABLE` on both nodes when dropped, so that a failing test leaves the
/// cluster as it found it.
struct Migrating {
    slot: u16,
    nodes: [String; 2],
}

impl Drop for Migrating {
    fn drop(&mut self) {
        for addr in &self.nodes {
            if let Ok(client) = redis::Client::open(format!("redis://{addr}"))
                && let Ok(mut con) = client.get_connection()
            {
                let _: redis::RedisResult<()> = redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(self.slot)
                    .arg("STABLE")
                    .query(&mut con);
            }
        }
    }
}

/// A slot that stays `MIGRATING` for a long time (a reshard paused half way, before any key
/// moved): the locks held in it keep renewing. A renewal that named a key that does not exist
/// (the election value of a lock that proclaimed nothing, the writer's marker of a read lock)
/// is refused with `TRYAGAIN` for as long as the slot migrates, and the lease is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_locks_keep_renewing_while_their_slot_stays_migrating() {
    let Some(harness) = common::cluster().await else {
        return;
    };
    let common::Topology::Cluster(config) = &harness.topology else {
        panic!("the cluster harness runs on a cluster");
    };
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    // The mutex, the read lock and the permit of one name share its hash tag, so its slot.
    let key = LockKey::new(&namespace, "migrating").unwrap();
    let slot = lockkit_redis::RedisClusterBackend::slot_of(&key).unwrap();
    let (origin, destination) = common::owner_and_another_primary(config, slot).await;
    let ttl = Duration::from_secs(2);
    let locks = LockClient::with_options(
        harness.backend().await.unwrap(),
        &namespace,
        LockOptions::default().with_ttl(ttl),
    )
    .unwrap();
    let mutex = locks.mutex("migrating").unwrap().lock().await.unwrap();
    let read = locks.rwlock("migrating").unwrap().read().await.unwrap();
    let permit = locks
        .semaphore("migrating", 2)
        .unwrap()
        .acquire()
        .await
        .unwrap();

    let _restore = Migrating {
        slot,
        nodes: [origin.addr.clone(), destination.addr.clone()],
    };
    let mut source = common::connect(&origin.addr).await.unwrap();
    let mut target = common::connect(&destination.addr).await.unwrap();
    let () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("IMPORTING")
        .arg(&origin.id)
        .query_async(&mut target)
        .await
        .unwrap();
    let () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("MIGRATING")
        .arg(&destination.id)
        .query_async(&mut source)
        .await
        .unwrap();
    tokio::time::sleep(ttl * 3).await;
    for (what, guard) in [
        ("the mutex", &mutex),
        ("the read lock", read.as_guard()),
        ("the permit", permit.as_guard()),
    ] {
        assert!(!guard.is_lost(), "{what} was lost while its slot migrated");
        assert!(guard.is_held().await.unwrap(), "{what} is not held");
    }
}
