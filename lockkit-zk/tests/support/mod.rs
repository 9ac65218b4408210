//! What the ZooKeeper tests share: the ensemble's address, a raw admin client, the
//! conformance harness ([`harness`]) and private server processes ([`server`]).

pub(crate) mod curator;
pub(crate) mod harness;
pub(crate) mod server;

use std::time::Duration;

use lockkit_core::testing::{backend_missing, endpoint};
use lockkit_zk::ZkConfig;
use zookeeper_client as zk;

/// The chroot every test works under (the auth tests use their own).
pub(crate) const TEST_CHROOT: &str = "/lockkit-test";

/// The ensemble's configuration from `LOCKKIT_TEST_ZK_URL`, with short sessions for quick
/// tests; `None` (after `backend_missing`) when the ensemble is not up.
pub(crate) fn test_config() -> Option<ZkConfig> {
    let Some(url) = endpoint("LOCKKIT_TEST_ZK_URL") else {
        backend_missing("the ZooKeeper ensemble (LOCKKIT_TEST_ZK_URL)");
        return None;
    };
    let mut config = ZkConfig::from_url(&url).expect("LOCKKIT_TEST_ZK_URL");
    config.chroot = TEST_CHROOT.to_owned();
    config.session_timeout = Duration::from_secs(4);
    Some(config)
}

/// A raw client of the ensemble, rooted at `chroot` (created when missing).
pub(crate) async fn admin(config: &ZkConfig, chroot: &str) -> zk::Client {
    let connector = match (&config.username, &config.password) {
        (Some(user), Some(password)) => {
            zk::Client::connector().with_auth("digest", format!("{user}:{password}").as_bytes())
        }
        _ => zk::Client::connector(),
    };
    let client = connector
        .with_session_timeout(Duration::from_secs(10))
        .connect(&config.hosts.join(","))
        .await
        .expect("admin client");
    let acls = if config.username.is_some() {
        zk::Acls::creator_all()
    } else {
        zk::Acls::anyone_all()
    };
    client
        .mkdir(chroot, &zk::CreateMode::Persistent.with_acls(acls))
        .await
        .expect("chroot");
    client.chroot(chroot).expect("chroot path")
}

/// Every znode under `/{namespace}`, at any depth: key parents, lock nodes, semaphore
/// parents (`{key}/semaphore`) and their permit nodes; read after a `sync`, since the
/// admin's server may lag behind the clients'.
pub(crate) async fn znodes_under(
    admin: &zk::Client,
    namespace: &str,
) -> std::result::Result<Vec<String>, zk::Error> {
    match admin.sync(&format!("/{namespace}")).await {
        Ok(()) | Err(zk::Error::NoNode) => {}
        Err(e) => return Err(e),
    }
    let mut found = Vec::new();
    let mut parents = vec![format!("/{namespace}")];
    while let Some(parent) = parents.pop() {
        let children = match admin.list_children(&parent).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => continue,
            Err(e) => return Err(e),
        };
        for child in children {
            let path = format!("{parent}/{child}");
            found.push(path.clone());
            parents.push(path);
        }
    }
    Ok(found)
}

/// Options under which only a watch can wake a waiter: the polling cap is far beyond any
/// test. TTL 2 s.
#[allow(dead_code)] // for the queue tests (semaphore, rwlock) only
pub(crate) fn watch_only_options() -> lockkit_core::LockOptions {
    lockkit_core::LockOptions::default()
        .with_ttl(Duration::from_secs(2))
        .with_backoff(Duration::from_millis(1), Duration::from_secs(600))
}

/// A backend of its own (its own session) and a client on it in `namespace`, with
/// [`watch_only_options`].
#[allow(dead_code)] // for the queue tests (semaphore, rwlock) only
pub(crate) async fn watched_client(
    config: &ZkConfig,
    namespace: &str,
) -> (lockkit_zk::ZkBackend, lockkit_core::LockClient) {
    let backend = lockkit_zk::ZkBackend::connect(config.clone())
        .await
        .expect("connect");
    let client = lockkit_core::LockClient::with_options(
        std::sync::Arc::new(backend.clone()),
        namespace,
        watch_only_options(),
    )
    .expect("client");
    (backend, client)
}

/// The children of `parent` as the leader sees them (the admin's server may lag behind the
/// clients'); none when `parent` does not exist.
#[allow(dead_code)] // for the queue tests (semaphore, rwlock) only
pub(crate) async fn children_via_leader(admin: &zk::Client, parent: &str) -> Vec<String> {
    match admin.sync(parent).await {
        Ok(()) | Err(zk::Error::NoNode) => {}
        Err(e) => panic!("sync {parent}: {e}"),
    }
    match admin.list_children(parent).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(e) => panic!("list {parent}: {e}"),
    }
}
