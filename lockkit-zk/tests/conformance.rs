//! The core conformance suite against the ZooKeeper ensemble of `compose/up.sh zk`.

mod support;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use lockkit_core::testing::Harness;
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{LockClient, LockKey, LockOptions, Result, async_trait};
use lockkit_zk::{ZkBackend, ZkConfig};
use support::{TEST_CHROOT, admin, test_config, znodes_under};
use zookeeper_client as zk;

/// Each client reaches the ensemble through its own proxy, so that `crash` can cut it off
/// without closing its session: its nodes then live until the session times out, as after
/// a real crash.
struct ZkHarness {
    config: ZkConfig,
    admin: zk::Client,
    proxies: StdMutex<Vec<(usize, FaultProxy)>>,
}

fn backend_id(client: &LockClient) -> usize {
    Arc::as_ptr(client.backend()).cast::<()>() as usize
}

#[async_trait]
impl Harness for ZkHarness {
    async fn client(&self, namespace: &str, options: LockOptions) -> Result<LockClient> {
        let proxy = FaultProxy::start(&self.config.hosts)
            .await
            .expect("a fault proxy");
        let mut config = self.config.clone();
        config.hosts = proxy.hosts();
        let client = LockClient::with_options(
            Arc::new(ZkBackend::connect(config).await?),
            namespace,
            options,
        )?;
        self.proxies
            .lock()
            .expect("proxies")
            .push((backend_id(&client), proxy));
        Ok(client)
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    async fn force_release(&self, key: &LockKey) -> Result<()> {
        let parent = format!("/{}/{}", key.namespace(), key.name());
        let mut children = self.admin.list_children(&parent).await.expect("list");
        children.sort_by_key(|c| c.rsplit('-').next().map(str::to_owned));
        if let Some(holder) = children.first() {
            self.admin
                .delete(&format!("{parent}/{holder}"), None)
                .await
                .expect("delete holder");
        }
        Ok(())
    }

    async fn crash(&self, client: LockClient) {
        let id = backend_id(&client);
        if let Some((_, proxy)) = self
            .proxies
            .lock()
            .expect("proxies")
            .iter()
            .find(|(p, _)| *p == id)
        {
            proxy.set(Direction::Both, Fault::Blackhole);
        }
        drop(client);
    }

    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>> {
        Ok(znodes_under(&self.admin, namespace).await.expect("list"))
    }
}

async fn zk_harness() -> Option<ZkHarness> {
    let config = test_config()?;
    let admin = admin(&config, TEST_CHROOT).await;
    Some(ZkHarness {
        config,
        admin,
        proxies: StdMutex::new(Vec::new()),
    })
}

lockkit_core::conformance_tests!(zk_harness);
