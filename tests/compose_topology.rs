//! The test topologies that `compose/up.sh all` starts answer on the addresses it publishes in
//! `endpoints.env`. Fails (instead of skipping) under `LOCKKIT_REQUIRE_BACKENDS=1`.

use std::time::Duration;

use lockkit::backend::url::ConnectionUrl;
use lockkit_core::testing::{backend_missing, endpoint};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `request` to `addr` and returns what the server answers before it closes the
/// connection or goes quiet.
async fn exchange(addr: &str, request: &[u8]) -> String {
    let talk = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(request).await?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_millis(500), stream.read(&mut buf)).await {
                Ok(Ok(0)) | Err(_) => break,
                Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
                Ok(Err(e)) => return Err(e),
            }
        }
        std::io::Result::Ok(String::from_utf8_lossy(&answer).into_owned())
    };
    match tokio::time::timeout(Duration::from_secs(5), talk).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => panic!("{addr}: {e}"),
        Err(_) => panic!("{addr}: no answer within 5 s"),
    }
}

fn hosts(var: &str) -> Option<Vec<String>> {
    let Some(url) = endpoint(var) else {
        backend_missing(&format!("{var} (compose topology)"));
        return None;
    };
    let url = ConnectionUrl::parse(&url).unwrap_or_else(|e| panic!("{var}: {e}"));
    assert!(!url.hosts.is_empty(), "{var} lists no hosts");
    Some(url.hosts.iter().map(ToString::to_string).collect())
}

#[tokio::test]
async fn redis_single_node_answers_ping() {
    let Some(hosts) = hosts("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    assert_eq!(hosts.len(), 1);
    assert!(exchange(&hosts[0], b"PING\r\n").await.starts_with("+PONG"));
}

#[tokio::test]
async fn redlock_has_five_independent_nodes() {
    let Some(hosts) = hosts("LOCKKIT_TEST_REDLOCK_URL") else {
        return;
    };
    assert_eq!(hosts.len(), 5);
    for host in &hosts {
        let role = exchange(host, b"ROLE\r\n").await;
        assert!(
            role.contains("master"),
            "{host} is not an independent primary: {role}"
        );
    }
}

#[tokio::test]
async fn sentinels_agree_on_the_primary() {
    let Some(hosts) = hosts("LOCKKIT_TEST_SENTINEL_URL") else {
        return;
    };
    assert_eq!(hosts.len(), 3);
    for host in &hosts {
        let answer = exchange(host, b"SENTINEL get-master-addr-by-name lkprimary\r\n").await;
        assert!(answer.contains("127.0.0.1"), "{host}: {answer}");
    }
}

#[tokio::test]
async fn the_redis_cluster_serves_every_slot() {
    let Some(hosts) = hosts("LOCKKIT_TEST_REDIS_CLUSTER_URL") else {
        return;
    };
    assert_eq!(hosts.len(), 3);
    for host in &hosts {
        let info = exchange(host, b"CLUSTER INFO\r\n").await;
        assert!(info.contains("cluster_state:ok"), "{host}: {info}");
        assert!(info.contains("cluster_slots_ok:16384"), "{host}: {info}");
        assert!(info.contains("cluster_known_nodes:6"), "{host}: {info}");
    }
}

#[tokio::test]
async fn etcd_members_are_healthy() {
    let Some(hosts) = hosts("LOCKKIT_TEST_ETCD_URL") else {
        return;
    };
    assert_eq!(hosts.len(), 3);
    for host in &hosts {
        let request = format!("GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let answer = exchange(host, request.as_bytes()).await;
        assert!(answer.contains("\"health\":\"true\""), "{host}: {answer}");
    }
}

#[tokio::test]
async fn zookeeper_ensemble_has_one_leader() {
    let Some(hosts) = hosts("LOCKKIT_TEST_ZK_URL") else {
        return;
    };
    assert_eq!(hosts.len(), 3);
    let mut leaders = 0;
    for host in &hosts {
        let answer = exchange(host, b"srvr").await;
        assert!(answer.contains("Mode: "), "{host}: {answer}");
        leaders += usize::from(answer.contains("Mode: leader"));
    }
    assert_eq!(leaders, 1, "expected exactly one ZooKeeper leader");
}

#[cfg(feature = "zk")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zk_url_connects_through_the_facade() {
    let Some(url) = endpoint("LOCKKIT_TEST_ZK_URL") else {
        backend_missing("LOCKKIT_TEST_ZK_URL (compose topology)");
        return;
    };
    let mut config = lockkit::LockkitConfig::from_url(&format!("{url}/lockkit-test")).unwrap();
    config.namespace = format!("facade-{:08x}", std::process::id());
    let locks = lockkit::connect(&config).await.unwrap();
    assert_eq!(locks.tier(), lockkit::Tier::Consensus);
    let guard = locks.mutex("facade").unwrap().lock().await.unwrap();
    assert!(guard.fencing_token().get() > 0);
    assert!(guard.release().await.unwrap());
}
