//! The conformance harness of the ZooKeeper backend, for any ensemble: the shared one
//! (`tests/conformance.rs`) or a private server (`tests/restart.rs`).
#![allow(dead_code, unreachable_pub)] // not every test file runs the harness

use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::{Duration, Instant};

use lockkit_core::backend::{LockBackend, async_trait};
use lockkit_core::testing::Harness;
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{LockClient, LockKey, LockOptions, Result};
use lockkit_zk::{ZkBackend, ZkConfig};
use zookeeper_client as zk;

use super::znodes_under;

/// Each client reaches the ensemble through its own proxy, so that `crash` can cut it off
/// without closing its session: its nodes then live until the session times out, as after
/// a real crash.
pub struct ZkHarness {
    config: ZkConfig,
    admin: zk::Client,
    proxies: StdMutex<Vec<(usize, FaultProxy)>>,
    backends: StdMutex<Vec<Weak<ZkBackend>>>,
}

impl ZkHarness {
    /// A harness whose clients connect with `config`; `admin` is rooted at its chroot.
    pub fn new(config: ZkConfig, admin: zk::Client) -> ZkHarness {
        ZkHarness {
            config,
            admin,
            proxies: StdMutex::new(Vec::new()),
            backends: StdMutex::new(Vec::new()),
        }
    }

    /// Waits (up to `within`) until every client of the harness that is still in use
    /// answers a request: after a server came back, until each has reconnected to it.
    ///
    /// # Panics
    /// When one does not answer within `within`.
    pub async fn reconnected(&self, within: Duration) {
        let backends: Vec<Arc<ZkBackend>> = self
            .backends
            .lock()
            .expect("backends")
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let by = Instant::now() + within;
        for backend in backends {
            while let Err(e) = backend.ping().await {
                assert!(
                    Instant::now() < by,
                    "a client did not reconnect within {within:?}: {e}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
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
        let backend = Arc::new(ZkBackend::connect(config).await?);
        // Weak, so that a client the scenario drops ends its session as before.
        self.backends
            .lock()
            .expect("backends")
            .push(Arc::downgrade(&backend));
        let client = LockClient::with_options(backend, namespace, options)?;
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
        // The admin's server may lag behind the clients': without the sync it can list the
        // lock without its holder and delete nothing.
        match self.admin.sync(&parent).await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => panic!("sync {parent}: {e}"),
        }
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
