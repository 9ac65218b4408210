//! The failover hole of the `replicated` tier, shown deterministically: a grant that never
//! reached the replica is lost when the replica is promoted, and the key is granted twice.
//! `min_replicas = 1` refuses that grant instead.
//!
//! One test: it stops, kills and restarts members of the Sentinel topology, and leaves it
//! whole again (both members up, one primary and one replica) whatever happens.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::time::{Duration, Instant};

use lockkit_core::{ErrorKind, LockClient, LockOptions};
use lockkit_redis::{RedisBackend, RedisConfig};

fn leader() -> String {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../compose/member.sh");
    let out = std::process::Command::new(script)
        .args(["leader", "sentinel"])
        .output()
        .expect("member.sh leader");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn replica_of(primary: &str) -> &'static str {
    if primary == "sentinel-primary" {
        "sentinel-replica"
    } else {
        "sentinel-primary"
    }
}

async fn client(config: &RedisConfig, namespace: &str) -> LockClient {
    let backend = RedisBackend::connect(config.clone())
        .await
        .expect("connect via Sentinel");
    LockClient::with_options(
        std::sync::Arc::new(backend),
        namespace,
        LockOptions::default().with_ttl(Duration::from_secs(30)),
    )
    .expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_grants_twice_without_min_replicas_and_min_replicas_refuses() {
    let Some(harness) = common::sentinel().await else {
        return;
    };
    let common::Topology::Sentinel(config) = &harness.topology else {
        panic!("the sentinel harness runs on Sentinel");
    };
    let _restore = common::RestoreMembers(&["sentinel-primary", "sentinel-replica"]);
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let primary = leader();
    let replica = replica_of(&primary);

    // The replica stops applying writes, and its replication link is cut from the primary's
    // side: with SIGSTOP alone, a write already in the replica's socket buffer would still be
    // applied on resume. Nothing granted from now on reaches the replica.
    common::member("pause", replica);
    let mut raw_primary = common::connect(&format!("127.0.0.1:{}", port_of(&primary)))
        .await
        .unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut raw_primary)
        .await
        .unwrap();

    let mut synced = config.clone();
    synced.min_replicas = 1;
    synced.replica_timeout = Duration::from_millis(200);
    let careful = client(&synced, &namespace).await;
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

    let first = client(config, &namespace).await;
    let held = first.mutex("order").unwrap().lock().await.unwrap();

    common::member("kill", &primary);
    common::member("resume", replica);
    let promoted_by = Instant::now() + Duration::from_secs(30);
    while leader() != replica {
        assert!(
            Instant::now() < promoted_by,
            "Sentinel did not promote {replica}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let second = client(config, &namespace).await;
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
    assert!(stolen.release().await.unwrap());
    drop(held);

    // Bring the old primary back; Sentinel demotes it to a replica of the new one (or, on a
    // loaded machine, may fail over once more, back to it: then it is the primary again,
    // with its replica). Either way the topology is whole for the tests after this one.
    common::member("restart", &primary);
    let rejoined_by = Instant::now() + Duration::from_secs(40);
    loop {
        // Demotion closes client connections: ask on a fresh one each time.
        let info = match common::connect(&format!("127.0.0.1:{}", port_of(&primary))).await {
            Ok(mut probe) => redis::cmd("INFO")
                .arg("replication")
                .query_async::<String>(&mut probe)
                .await
                .unwrap_or_default(),
            Err(_) => String::new(),
        };
        let replica = info.contains("role:slave") && info.contains("master_link_status:up");
        let primary_again = info.contains("role:master") && !info.contains("connected_slaves:0");
        if replica || primary_again {
            break;
        }
        assert!(
            Instant::now() < rejoined_by,
            "the old primary did not rejoin as a replica: {info}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The port compose/lib.sh gives the member (shifted by LOCKKIT_COMPOSE_PORT_OFFSET).
fn port_of(member: &str) -> u16 {
    let offset: u16 = std::env::var("LOCKKIT_COMPOSE_PORT_OFFSET")
        .ok()
        .and_then(|o| o.parse().ok())
        .unwrap_or(0);
    offset
        + if member == "sentinel-primary" {
            20010
        } else {
            20011
        }
}
