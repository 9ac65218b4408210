//! The conformance harness of the etcd backend, for any cluster: the shared one
//! (`tests/conformance.rs`) or a private one (`tests/restart.rs`).

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::backend::async_trait;
use lockkit_core::testing::Harness;
use lockkit_core::{Error, ErrorKind, LockClient, LockKey, LockOptions, Result};
use lockkit_etcd::etcd_client::{GetOptions, SortOrder, SortTarget};
use lockkit_etcd::{EtcdBackend, EtcdConfig};

/// Every client gets its own backend (its own connection and session leases), as separate
/// processes would; `admin` plays the operator.
pub struct EtcdHarness {
    config: EtcdConfig,
    admin: EtcdBackend,
}

impl EtcdHarness {
    /// A harness over the cluster of `config`, whose prefix must be [`super::PREFIX`] (the
    /// harness lists leftovers there).
    pub async fn connect(config: EtcdConfig) -> Result<EtcdHarness> {
        let admin = EtcdBackend::connect(config.clone()).await?;
        Ok(EtcdHarness { config, admin })
    }
}

#[async_trait]
impl Harness for EtcdHarness {
    async fn client(&self, namespace: &str, options: LockOptions) -> Result<LockClient> {
        let backend = EtcdBackend::connect(self.config.clone()).await?;
        LockClient::with_options(Arc::new(backend), namespace, options)
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
