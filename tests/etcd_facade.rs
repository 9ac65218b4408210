//! The facade with the `etcd` feature: configuration, overrides and `connect`.
#![cfg(feature = "etcd")]

use std::time::Duration;

use lockkit::{BackendKind, ErrorKind, LockkitConfig, Tier};

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn etcd_table_and_environment_configure_the_backend() {
    let config = LockkitConfig::from_toml(
        r#"
        backend = "etcd"
        [etcd]
        endpoints = ["10.0.0.1:2379", "10.0.0.2:2379"]
        request_timeout = "2s"
        user = "locker"
        password = "hunter2"
        "#,
    )
    .expect("valid");
    assert_eq!(config.backend, BackendKind::Etcd);
    assert_eq!(config.etcd.endpoints.len(), 2);
    assert_eq!(config.etcd.request_timeout, Duration::from_secs(2));
    assert!(!format!("{config:?}").contains("hunter2"));

    let config = LockkitConfig::load_from(vars(&[
        ("LOCKKIT_URL", "etcd://h1,h2/billing"),
        ("LOCKKIT_ETCD_REQUEST_TIMEOUT", "750ms"),
        ("LOCKKIT_ETCD_REQUIRE_LEADER", "false"),
    ]))
    .expect("valid");
    assert_eq!(config.backend, BackendKind::Etcd);
    assert_eq!(config.etcd.request_timeout, Duration::from_millis(750));
    assert!(!config.etcd.require_leader);

    let err = LockkitConfig::load_from(vars(&[
        ("LOCKKIT_BACKEND", "etcd"),
        ("LOCKKIT_ETCD_TIMEOUT", "1s"),
    ]))
    .expect_err("unknown field");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    assert!(err.to_string().contains("request_timeout"), "{err}");
}

#[test]
fn bad_etcd_settings_fail_at_load() {
    for toml in [
        "url = \"etcd://h?tls=1\"",
        "backend = \"etcd\"\n[etcd]\nendpoints = []",
        "backend = \"etcd\"\n[etcd]\ntls = true",
        "backend = \"etcd\"\n[etcd]\nrequest_timeout = \"0s\"",
    ] {
        let err = LockkitConfig::from_toml(toml).expect_err(toml);
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{toml}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_builds_the_etcd_backend_from_the_url() {
    let Some(url) = lockkit_core::testing::endpoint("LOCKKIT_TEST_ETCD_URL") else {
        lockkit_core::testing::backend_missing("etcd (LOCKKIT_TEST_ETCD_URL)");
        return;
    };
    let mut config = LockkitConfig::from_url(&format!("{url}/lockkit-test")).expect("valid");
    config.require_tier = Some(Tier::Consensus);
    config.namespace = format!("facade-{:08x}", rand_suffix());
    let locks = lockkit::connect(&config).await.expect("connect");
    assert_eq!(locks.tier(), Tier::Consensus);
    let guard = locks.mutex("job").expect("key").lock().await.expect("lock");
    assert!(guard.release().await.expect("release"));
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

#[test]
fn every_etcd_field_has_an_environment_override() {
    let mut every_field_set = lockkit::etcd::EtcdConfig::default();
    every_field_set.user = Some("u".into());
    every_field_set.password = Some("p".into());
    every_field_set.ca_file = Some("ca.pem".into());
    every_field_set.cert_file = Some("c.pem".into());
    every_field_set.key_file = Some("k.pem".into());
    every_field_set.tls_domain = Some("etcd.internal".into());
    let table = toml::Table::try_from(every_field_set).expect("serialize");
    for (field, value) in table {
        let var = format!("LOCKKIT_ETCD_{}", field.to_ascii_uppercase());
        let result = LockkitConfig::load_from(vars(&[
            ("LOCKKIT_BACKEND", "etcd"),
            (&var, &value.to_string()),
        ]));
        if let Err(e) = result {
            assert!(!e.to_string().contains("has no field"), "{var}: {e}");
        }
    }
}
