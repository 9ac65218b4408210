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
