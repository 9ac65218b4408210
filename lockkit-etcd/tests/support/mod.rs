//! What the etcd test files share: finding the test cluster, reading its keys, and a private
//! one-member etcd ([`private::PrivateEtcd`]) for tests that must not touch the shared one.

#![allow(dead_code, unreachable_pub)]

pub mod harness;
pub mod private;

use lockkit_core::testing;
use lockkit_etcd::etcd_client::GetOptions;
use lockkit_etcd::{EtcdBackend, EtcdConfig};

/// The key prefix every etcd test works under.
pub const PREFIX: &str = "lockkit-test";

/// The configuration of the `compose/up.sh etcd` cluster, or `None` (after
/// [`testing::backend_missing`]) when it is not up.
pub async fn cluster_config() -> Option<EtcdConfig> {
    let Some(url) = testing::endpoint("LOCKKIT_TEST_ETCD_URL") else {
        testing::backend_missing("etcd (LOCKKIT_TEST_ETCD_URL)");
        return None;
    };
    let mut config = EtcdConfig::from_url(&url).expect("LOCKKIT_TEST_ETCD_URL is a valid etcd URL");
    config.prefix = PREFIX.to_owned();
    match EtcdBackend::connect(config.clone()).await {
        Ok(_) => Some(config),
        Err(e) => {
            testing::backend_missing(&format!("etcd at {url} ({e})"));
            None
        }
    }
}

/// The keys left under `<PREFIX>/<namespace>/`.
pub async fn keys_under(
    backend: &EtcdBackend,
    namespace: &str,
) -> lockkit_core::Result<Vec<String>> {
    let mut client = backend.client();
    let response = client
        .get(
            format!("{PREFIX}/{namespace}/"),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .map_err(|e| {
            lockkit_core::Error::new(lockkit_core::ErrorKind::Backend, "etcd", "listing keys")
                .with_source(e)
        })?;
    Ok(response
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect())
}

/// The lease id in a lock key `.../<lease-hex>-<n>` (the handle of an etcd grant).
pub fn lease_of(handle: &str) -> i64 {
    let last = handle.rsplit('/').next().expect("key segment");
    let hex = last.split('-').next().expect("lease part");
    u64::from_str_radix(hex, 16).expect("lease hex") as i64
}

/// Waits (up to `patience`) until nothing is left under `<PREFIX>/<namespace>/`.
pub async fn expect_no_keys(backend: &EtcdBackend, namespace: &str, patience: std::time::Duration) {
    let deadline = std::time::Instant::now() + patience;
    loop {
        let left = keys_under(backend, namespace).await.expect("list keys");
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "keys left under {namespace}: {left:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A fresh random namespace.
pub fn namespace(what: &str) -> String {
    format!("{what}-{:08x}", rand::random::<u32>())
}

/// Waits until exactly `count` keys are under `namespace` (holders and waiters of a queue),
/// for at most `patience`.
pub async fn until_keys(
    admin: &EtcdBackend,
    namespace: &str,
    count: usize,
    patience: std::time::Duration,
) {
    let deadline = std::time::Instant::now() + patience;
    loop {
        let keys = keys_under(admin, namespace).await.expect("list keys");
        if keys.len() == count {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "expected {count} keys under {namespace}, found {keys:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
