//! The core conformance suite against the ZooKeeper ensemble of `compose/up.sh zk`.

mod support;

use support::harness::ZkHarness;
use support::{TEST_CHROOT, admin, test_config};

async fn zk_harness() -> Option<ZkHarness> {
    let config = test_config()?;
    let admin = admin(&config, TEST_CHROOT).await;
    Some(ZkHarness::new(config, admin))
}

lockkit_core::conformance_tests!(zk_harness);
