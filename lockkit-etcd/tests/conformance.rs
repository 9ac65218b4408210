//! The core conformance suite against the 3-member cluster of `compose/up.sh etcd`.

mod support;

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::testing::Harness;
use lockkit_core::{Error, ErrorKind, LockClient, LockKey, LockOptions, Result, async_trait};
use lockkit_etcd::etcd_client::GetOptions;
use lockkit_etcd::{EtcdBackend, EtcdConfig};

/// Every client gets its own backend (its own connection and session leases), as separate
/// processes would; `admin` plays the operator.
struct EtcdHarness {
    config: EtcdConfig,
    admin: EtcdBackend,
}

async fn etcd_harness() -> Option<EtcdHarness> {
    let config = support::cluster_config().await?;
    let admin = EtcdBackend::connect(config.clone()).await.ok()?;
    Some(EtcdHarness { config, admin })
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
                        .with_sort(
                            lockkit_etcd::etcd_client::SortTarget::Create,
                            lockkit_etcd::etcd_client::SortOrder::Ascend,
                        )
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
        support::keys_under(&self.admin, namespace).await
    }
}

lockkit_core::conformance_tests!(etcd_harness);
