//! The ZooKeeper backend's own behaviour against the ensemble: session expiry, a
//! blackholed connection, one wake-up per release, digest auth and ACLs, bounded connects.
//! None of these disturb the ensemble, so they run in parallel.
//! One test binary, its tests in modules by topic; the helpers they share are here.

#[path = "../support/mod.rs"]
mod support;

mod auth_and_connect;
mod cleanup;
mod lost_creates;
mod session_loss;
mod validity;
mod wake_ups;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::backend::{AcquireRequest, Attempt, Lease, LockBackend, OwnerToken};
use lockkit_core::testing::proxy::FaultProxy;
use lockkit_core::{LockClient, LockKey, LockOptions};
use lockkit_zk::{ZkBackend, ZkConfig};
use support::{TEST_CHROOT, admin, test_config, znodes_under};
use zookeeper_client as zk;

fn namespace() -> String {
    format!("lk-zk-{:08x}", rand::random::<u32>())
}

async fn client(config: &ZkConfig, ns: &str) -> (ZkBackend, LockClient) {
    client_with_ttl(config, ns, Duration::from_secs(2)).await
}

async fn client_with_ttl(config: &ZkConfig, ns: &str, ttl: Duration) -> (ZkBackend, LockClient) {
    let backend = ZkBackend::connect(config.clone()).await.expect("connect");
    let client = LockClient::with_options(
        Arc::new(backend.clone()),
        ns,
        LockOptions::default().with_ttl(ttl),
    )
    .expect("client");
    (backend, client)
}

/// The znode of a held lease under `root` (the chroot, or `""` for a client rooted there):
/// the child of `{root}/{ns}/{key}` whose name ends with the lease's handle (the sequence
/// number). Its name must not carry the owner token, in hex or in UUID form.
async fn lock_node(client: &zk::Client, root: &str, lease: &Lease) -> String {
    let parent = format!("{root}/{}/{}", lease.key().namespace(), lease.key().name());
    let sequence = lease.handle().expect("a zk lease has a handle");
    let children = client.list_children(&parent).await.expect("list the lock");
    let name = children
        .iter()
        .find(|c| c.ends_with(&format!("-lock-{sequence}")))
        .unwrap_or_else(|| panic!("no node for sequence {sequence} in {children:?}"));
    let hex = lease.owner().expose_hex();
    assert!(
        !name.replace('-', "").contains(&hex[..8]),
        "the node name shows the owner token"
    );
    format!("{parent}/{name}")
}

async fn assert_no_znodes(admin: &zk::Client, ns: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = znodes_under(admin, ns).await.expect("list");
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "znodes left under /{ns}: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A backend reaching the ensemble through a fault proxy, and a request for a key whose
/// parent exists and is kept (a persistent child), so that a test sees only its own nodes.
struct Queue {
    admin: zk::Client,
    ns: String,
    proxy: FaultProxy,
    backend: ZkBackend,
    request: AcquireRequest,
    parent: String,
}

/// Ends a test of [`key_behind_a_proxy`]: removes the child that kept the lock's parent,
/// closes the backend's session, and checks that nothing of the namespace is left.
async fn let_go(admin: &zk::Client, ns: &str, parent: &str, backend: ZkBackend) {
    admin
        .delete(&format!("{parent}/keep-parent"), None)
        .await
        .expect("delete the kept child");
    drop(backend);
    assert_no_znodes(admin, ns).await;
}

async fn key_behind_a_proxy(name: &str) -> Option<Queue> {
    let mut config = test_config()?;
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let proxy = FaultProxy::start(&config.hosts)
        .await
        .expect("a fault proxy");
    config.hosts = proxy.hosts();
    config.request_timeout = Duration::from_millis(500);
    let backend = ZkBackend::connect(config).await.expect("connect");
    let request = AcquireRequest::new(
        LockKey::new(&ns, name).expect("a valid key"),
        OwnerToken::generate().expect("an owner token"),
        Duration::from_secs(10),
        true,
    );
    // First use of the key: create the parent with an ordinary attempt, then give it back.
    assert!(matches!(
        backend.try_acquire(&request).await.expect("an attempt"),
        Attempt::Granted(_)
    ));
    backend.abandon(&request).await.expect("abandon");
    let parent = format!("/{ns}/{name}");
    admin
        .create(
            &format!("{parent}/keep-parent"),
            &[],
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .expect("the kept child");
    Some(Queue {
        admin,
        ns,
        proxy,
        backend,
        request,
        parent,
    })
}

/// The lock nodes under `parent` whose name starts with `prefix`.
async fn nodes_named(admin: &zk::Client, parent: &str, prefix: &str) -> Vec<String> {
    // The admin's server may be a follower behind the one the backend wrote through.
    admin.sync(parent).await.expect("sync the lock");
    let mut nodes: Vec<String> = admin
        .list_children(parent)
        .await
        .expect("list the lock")
        .into_iter()
        .filter(|c| c.starts_with(prefix))
        .collect();
    nodes.sort();
    nodes
}
