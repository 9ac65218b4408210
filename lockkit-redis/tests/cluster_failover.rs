//! The failover hole of a Redis Cluster (tier `replicated`), shown deterministically, as
//! `failover.rs` shows it for Sentinel: a grant that never reached the slot's replica is
//! lost when the replica is promoted, the key is granted again while the first holder
//! still believes it holds it, and the first holder's next renewal reports it lost.
//! `min_replicas = 1` refuses that grant instead.
//!
//! One test: it pauses, kills and restarts members of the cluster topology, and leaves it
//! whole again (every slot served, the killed primary back as a replica) whatever happens.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::time::{Duration, Instant};

use lockkit_core::{ErrorKind, LockClient, LockKey, LockOptions};
use lockkit_redis::{RedisClusterBackend, RedisConfig};

async fn client(config: &RedisConfig, namespace: &str) -> LockClient {
    let backend = RedisClusterBackend::connect(config.clone())
        .await
        .expect("connect to the cluster");
    LockClient::with_options(
        std::sync::Arc::new(backend),
        namespace,
        LockOptions::default().with_ttl(Duration::from_secs(30)),
    )
    .expect("client")
}

/// Whether every node that answers says the cluster serves every slot and knows 6 nodes,
/// and `rejoined` answers as a replica with its link up.
async fn whole(config: &RedisConfig, rejoined: &str) -> bool {
    for node in common::cluster_nodes(config).await {
        let Ok(mut con) = common::connect(&node.addr).await else {
            return false;
        };
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut con)
            .await
            .unwrap_or_default();
        if !info.contains("cluster_state:ok") || !info.contains("cluster_known_nodes:6") {
            return false;
        }
    }
    let Ok(mut con) = common::connect(rejoined).await else {
        return false;
    };
    let replication: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut con)
        .await
        .unwrap_or_default();
    replication.contains("role:slave") && replication.contains("master_link_status:up")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_grants_twice_without_min_replicas_and_min_replicas_refuses() {
    let Some(harness) = common::cluster().await else {
        return;
    };
    let common::Topology::Cluster(config) = &harness.topology else {
        panic!("the cluster harness runs on a cluster");
    };
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let slot =
        lockkit_redis::RedisClusterBackend::slot_of(&LockKey::new(&namespace, "order").unwrap())
            .unwrap();
    let primary = common::cluster_owner(config, slot).await.unwrap();
    let replica = common::cluster_nodes(config)
        .await
        .into_iter()
        .find(|n| n.of.as_deref() == Some(primary.id.as_str()))
        .expect("the slot's primary has a replica");
    let (primary_member, replica_member) = (
        common::cluster_member(&primary.addr),
        common::cluster_member(&replica.addr),
    );
    let _restore = common::RestoreMembers(&[
        "cluster-1",
        "cluster-2",
        "cluster-3",
        "cluster-4",
        "cluster-5",
        "cluster-6",
    ]);
    // Connected while the cluster is whole: the failover below is what they must follow.
    let mut careful_config = config.clone();
    careful_config.min_replicas = 1;
    careful_config.replica_timeout = Duration::from_millis(200);
    let careful = client(&careful_config, &namespace).await;
    let first = client(config, &namespace).await;
    let second = client(config, &namespace).await;

    // The replica stops applying writes, and its replication link is cut from the primary's
    // side: nothing granted from now on reaches it.
    common::member("pause", replica_member);
    let mut raw_primary = common::connect(&primary.addr).await.unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut raw_primary)
        .await
        .unwrap();

    let err = careful
        .mutex("order")
        .unwrap()
        .try_lock()
        .await
        .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::QuorumNotReached { got: 0, need: 1 }),
        "min_replicas = 1 must refuse a grant no replica has: {err}"
    );
    assert!(
        careful.inspect("order").await.unwrap().is_none(),
        "the unreplicated grant was not given back"
    );

    let held = first.mutex("order").unwrap().lock().await.unwrap();

    common::member("kill", primary_member);
    common::member("resume", replica_member);
    let promoted_by = Instant::now() + Duration::from_secs(30);
    while common::cluster_owner(config, slot).await.map(|n| n.id) != Some(replica.id.clone()) {
        assert!(
            Instant::now() < promoted_by,
            "the cluster did not promote {replica_member}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The same clients, connected before the failover: they follow it.
    let stolen = second
        .mutex("order")
        .unwrap()
        .try_lock()
        .await
        .unwrap()
        .expect("the promoted replica never saw the grant, so it grants the key again");
    assert!(
        !held.is_lost() && held.valid_until() > Instant::now(),
        "the first holder still believes it holds the lock: a double grant"
    );
    eprintln!(
        "double grant after failover: first holder token {}, second holder token {}",
        held.fencing_token(),
        stolen.fencing_token()
    );
    // The first holder's next renewal finds the key another's: lost, and said so.
    let renewed = held.extend().await.unwrap_err();
    assert_eq!(renewed.kind(), ErrorKind::Lost, "{renewed}");
    assert!(held.is_lost());
    assert!(stolen.release().await.unwrap());
    drop(held);
    for locks in [&careful, &first, &second] {
        locks.close().await;
    }

    // The old primary comes back as a replica of the promoted one.
    common::member("restart", primary_member);
    let rejoined_by = Instant::now() + Duration::from_secs(40);
    while !whole(config, &primary.addr).await {
        assert!(
            Instant::now() < rejoined_by,
            "the old primary did not rejoin as a replica"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
