//! The facade with the `postgres` feature: configuration, overrides and `connect`.
#![cfg(feature = "postgres")]

use std::time::Duration;

use lockkit::{BackendKind, ErrorKind, LockkitConfig, Tier};

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn postgres_table_and_environment_configure_the_backend() {
    let config = LockkitConfig::from_toml(
        r#"
        backend = "postgres"
        [postgres]
        hosts = ["10.0.0.1:5432", "10.0.0.2:5432"]
        dbname = "app"
        request_timeout = "2s"
        user = "locker"
        password = "hunter2"
        "#,
    )
    .expect("valid");
    assert_eq!(config.backend, BackendKind::Postgres);
    assert_eq!(config.postgres.hosts.len(), 2);
    assert_eq!(config.postgres.request_timeout, Duration::from_secs(2));
    assert!(!format!("{config:?}").contains("hunter2"));

    for scheme in ["postgres", "postgresql"] {
        let config = LockkitConfig::load_from(vars(&[
            ("LOCKKIT_URL", &format!("{scheme}://app@h1,h2:6432/billing")),
            ("LOCKKIT_POSTGRES_REQUEST_TIMEOUT", "750ms"),
            ("LOCKKIT_POSTGRES_POOL_SIZE", "4"),
            ("LOCKKIT_POSTGRES_LISTEN", "false"),
        ]))
        .expect("valid");
        assert_eq!(config.backend, BackendKind::Postgres);
        assert_eq!(config.postgres.request_timeout, Duration::from_millis(750));
        assert_eq!(config.postgres.pool_size, 4);
        assert!(!config.postgres.listen);
        let postgres = config.postgres_config().expect("merged");
        assert_eq!(postgres.hosts, ["h1:5432", "h2:6432"]);
        assert_eq!(postgres.user, "app");
        assert_eq!(postgres.dbname, "billing");
    }

    let err = LockkitConfig::load_from(vars(&[
        ("LOCKKIT_BACKEND", "postgres"),
        ("LOCKKIT_POSTGRES_TIMEOUT", "1s"),
    ]))
    .expect_err("unknown field");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    assert!(err.to_string().contains("request_timeout"), "{err}");
}

#[test]
fn bad_postgres_settings_fail_at_load() {
    for toml in [
        "url = \"postgres://h?sslmode=require\"",
        "url = \"postgres://h?sslmode=verify-full\"",
        "backend = \"postgres\"\n[postgres]\nhosts = []",
        "backend = \"postgres\"\n[postgres]\npool_size = 0",
        "backend = \"postgres\"\n[postgres]\nrequest_timeout = \"0s\"",
    ] {
        let err = LockkitConfig::from_toml(toml).expect_err(toml);
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{toml}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_builds_the_postgres_backend_from_the_url() {
    let Some(url) = lockkit_core::testing::endpoint("LOCKKIT_TEST_POSTGRES_URL") else {
        lockkit_core::testing::backend_missing("PostgreSQL (LOCKKIT_TEST_POSTGRES_URL)");
        return;
    };
    let mut config = LockkitConfig::from_url(&url).expect("valid");
    config.require_tier = Some(Tier::Single);
    config.namespace = format!("facade-{:08x}", rand_suffix());
    let locks = lockkit::connect(&config).await.expect("connect");
    assert!(
        matches!(locks.tier(), Tier::Single | Tier::Replicated),
        "{}",
        locks.tier()
    );
    let guard = locks.mutex("job").expect("key").lock().await.expect("lock");
    assert!(guard.release().await.expect("release"));
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

#[test]
fn every_postgres_field_has_an_environment_override() {
    let mut every_field_set = lockkit::postgres::PostgresConfig::default();
    every_field_set.password = Some("p".into());
    let table = toml::Table::try_from(every_field_set).expect("serialize");
    for (field, value) in table {
        let var = format!("LOCKKIT_POSTGRES_{}", field.to_ascii_uppercase());
        let result = LockkitConfig::load_from(vars(&[
            ("LOCKKIT_BACKEND", "postgres"),
            (&var, &value.to_string()),
        ]));
        if let Err(e) = result {
            assert!(!e.to_string().contains("has no field"), "{var}: {e}");
        }
    }
}
