//! The core conformance suite against the 3-member cluster of `compose/up.sh etcd`.

mod support;

use support::harness::EtcdHarness;

async fn etcd_harness() -> Option<EtcdHarness> {
    let config = support::cluster_config().await?;
    EtcdHarness::connect(config).await.ok()
}

lockkit_core::conformance_tests!(etcd_harness);
