//! The conformance harness of the etcd backend, for any cluster: the shared one
//! (`tests/conformance.rs`) or a private one (`tests/restart.rs`).

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use lockkit_core::backend::async_trait;
use lockkit_core::testing::Harness;
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{Error, ErrorKind, LockClient, LockKey, LockOptions, Result};
use lockkit_etcd::etcd_client::{GetOptions, SortOrder, SortTarget};
use lockkit_etcd::{EtcdBackend, EtcdConfig};

/// Every client gets its own backend (its own connection and session leases), as separate
/// processes would; `admin` plays the operator. Each client reaches the cluster through its
/// own proxy, so that `crash` can cut it off without revoking its sessions: its keys then
/// live until the session leases expire, as after a real crash, even when the scenario
/// still holds (forgot) a guard that keeps the backend alive.
pub struct EtcdHarness {
    config: EtcdConfig,
    admin: EtcdBackend,
    proxies: StdMutex<Vec<(usize, FaultProxy)>>,
}

impl EtcdHarness {
    /// A harness over the cluster of `config`, whose prefix must be [`super::PREFIX`] (the
    /// harness lists leftovers there).
    pub async fn connect(config: EtcdConfig) -> Result<EtcdHarness> {
        let admin = EtcdBackend::connect(config.clone()).await?;
        Ok(EtcdHarness {
            config,
            admin,
            proxies: StdMutex::new(Vec::new()),
        })
    }
}

fn backend_id(client: &LockClient) -> usize {
    Arc::as_ptr(client.backend()).cast::<()>() as usize
}

#[async_trait]
impl Harness for EtcdHarness {
    async fn client(&self, namespace: &str, options: LockOptions) -> Result<LockClient> {
        let proxy = FaultProxy::start(&self.config.endpoints)
            .await
            .expect("a fault proxy");
        let mut config = self.config.clone();
        config.endpoints = proxy.hosts();
        let backend = EtcdBackend::connect(config).await?;
        let client = LockClient::with_options(Arc::new(backend), namespace, options)?;
        self.proxies
            .lock()
            .expect("proxies")
            .push((backend_id(&client), proxy));
        Ok(client)
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

    fn ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    async fn force_release(&self, key: &LockKey) -> Result<()> {
        let mut client = self.admin.client();
        let failed = |e| Error::new(ErrorKind::Backend, "etcd", "force release").with_source(e);
        let holder = client
            .get(
                self.admin.lock_prefix(key),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_limit(1),
                ),
            )
            .await
            .map_err(failed)?;
        if let Some(kv) = holder.kvs().first() {
            client.delete(kv.key(), None).await.map_err(failed)?;
        }
        Ok(())
    }

    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>> {
        super::keys_under(&self.admin, namespace).await
    }
}
