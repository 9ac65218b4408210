//! The configuration switch: reference.toml, URLs, environment overrides and every bad input.

use std::collections::BTreeSet;
use std::time::Duration;

use lockkit::{BackendKind, ErrorKind, LockkitConfig, Tier};

const REFERENCE_FILE: &str = include_str!("../reference.toml");

/// reference.toml without the tables of backends this build does not contain (a build
/// without a backend's feature refuses its table as an unknown field).
fn reference() -> String {
    let mut table: toml::Table = REFERENCE_FILE.parse().expect("reference.toml is TOML");
    for kind in BackendKind::ALL {
        if !kind.is_compiled_in() {
            table.remove(kind.as_str());
        }
    }
    toml::to_string(&table).expect("serialize")
}

fn keys(prefix: &str, table: &toml::Table, out: &mut BTreeSet<String>) {
    for (k, v) in table {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) => keys(&path, t, out),
            _ => {
                out.insert(path);
            }
        }
    }
}

#[test]
fn reference_toml_parses_to_the_defaults() {
    let parsed = LockkitConfig::from_toml(&reference()).expect("reference.toml parses");
    assert_eq!(parsed, LockkitConfig::default());
}

#[test]
fn reference_toml_lists_every_option() {
    let defaults: toml::Table =
        toml::Table::try_from(LockkitConfig::default()).expect("serialize defaults");
    let mut default_keys = BTreeSet::new();
    keys("", &defaults, &mut default_keys);
    let reference: toml::Table = reference().parse().expect("toml");
    let mut reference_keys = BTreeSet::new();
    keys("", &reference, &mut reference_keys);
    assert_eq!(
        default_keys, reference_keys,
        "set options in reference.toml differ from the defaults"
    );
    // Options without a default value are listed commented out.
    for optional in ["# url = ", "# require_tier = ", "# wait_timeout = "] {
        assert!(
            REFERENCE_FILE.contains(optional),
            "reference.toml does not document {optional}"
        );
    }
}

#[test]
fn toml_with_every_field_set_round_trips() {
    let config = LockkitConfig::from_toml(
        r#"
        backend = "memory"
        url = "memory://"
        namespace = "billing"
        require_tier = "local"
        [lock]
        ttl = "2s"
        wait_timeout = "1m"
        auto_renew = false
        backoff_min = "5ms"
        backoff_max = "1s"
        clock_drift_factor = 0.02
        error_budget = "1s"
        fair = false
        "#,
    )
    .expect("valid");
    assert_eq!(config.namespace, "billing");
    assert_eq!(config.require_tier, Some(Tier::Local));
    assert_eq!(config.lock.ttl, Duration::from_secs(2));
    assert_eq!(config.lock.wait_timeout, Some(Duration::from_secs(60)));
    assert!(!config.lock.auto_renew);
    assert_eq!(config.lock.error_budget, Duration::from_secs(1));
    assert!(!config.lock.fair);
}

fn config_error(toml: &str) -> lockkit::Error {
    LockkitConfig::from_toml(toml).expect_err(toml)
}

#[test]
fn bad_configurations_are_typed_errors_that_say_what_is_wrong() {
    let cases: &[(&str, ErrorKind, &str)] = &[
        (
            "backend = \"mongo\"",
            ErrorKind::InvalidConfig,
            "known backends: memory, redis",
        ),
        (
            "backend = \"memory\"\ncolour = \"red\"",
            ErrorKind::InvalidConfig,
            "unknown field `colour`",
        ),
        (
            "backend = \"memory\"\n[lock]\nttll = \"1s\"",
            ErrorKind::InvalidConfig,
            "unknown field `ttll`",
        ),
        (
            "backend = \"memory\"\n[lock]\nttl = \"soon\"",
            ErrorKind::InvalidConfig,
            "ttl",
        ),
        (
            "backend = \"memory\"\n[lock]\nttl = \"1ms\"",
            ErrorKind::InvalidConfig,
            "at least 10ms",
        ),
        (
            "backend = \"memory\"\nrequire_tier = \"strong\"",
            ErrorKind::InvalidConfig,
            "unknown variant `strong`",
        ),
        (
            "backend = \"memory\"\nnamespace = \"a/b\"",
            ErrorKind::InvalidKey,
            "namespace",
        ),
        (
            "backend = \"memory\"\nnamespace = \"\"",
            ErrorKind::InvalidKey,
            "empty",
        ),
        (
            "namespace = \"x\"",
            ErrorKind::InvalidConfig,
            "missing field `backend`",
        ),
        ("backend = 3", ErrorKind::InvalidConfig, "must be a string"),
        ("backend = [", ErrorKind::InvalidConfig, "malformed TOML"),
        (
            "url = \"mongodb://h\"",
            ErrorKind::InvalidConfig,
            "unknown URL scheme",
        ),
        (
            "url = \"redis://h:notaport\"",
            ErrorKind::InvalidConfig,
            "invalid port",
        ),
        (
            "backend = \"memory\"\nurl = \"memory://somehost\"",
            ErrorKind::InvalidConfig,
            "takes no hosts",
        ),
    ];
    for (toml, kind, needle) in cases {
        let err = config_error(toml);
        assert_eq!(err.kind(), *kind, "{toml}: {err}");
        assert!(
            err.to_string().contains(needle),
            "{toml}: {err} lacks {needle:?}"
        );
    }
}

#[test]
fn a_backend_that_is_not_compiled_in_names_its_feature() {
    for (toml, feature) in [
        ("backend = \"etcd\"", "`etcd`"),
        ("backend = \"redlock\"", "`redis`"),
        ("url = \"zk://127.0.0.1:2181\"", "`zk`"),
        ("url = \"redis+sentinel://h:26379/mymaster\"", "`redis`"),
        ("backend = \"postgres\"", "`postgres`"),
        ("url = \"postgresql://app@h:5432/locks\"", "`postgres`"),
    ] {
        if BackendKind::ALL.iter().any(|k| {
            k.is_compiled_in()
                && Some(k.feature().unwrap_or_default())
                    == feature.strip_prefix('`').and_then(|f| f.strip_suffix('`'))
        }) {
            continue;
        }
        let err = config_error(toml);
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{toml}: {err}");
        assert!(err.to_string().contains(feature), "{toml}: {err}");
        assert!(
            err.to_string().contains("compiled in: memory"),
            "{toml}: {err}"
        );
        assert_eq!(err.kind(), ErrorKind::Unsupported);
    }
}

#[test]
fn backend_and_url_must_agree() {
    let err = config_error("backend = \"memory\"\nurl = \"etcd://h\"");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    assert!(err.to_string().contains("url selects"), "{err}");
}

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn environment_overrides_top_level_and_table_fields() {
    let config = LockkitConfig::load_from(vars(&[
        ("LOCKKIT_URL", "memory://"),
        ("LOCKKIT_NAMESPACE", "from-env"),
        ("LOCKKIT_LOCK_TTL", "3s"),
        ("LOCKKIT_LOCK_AUTO_RENEW", "false"),
        ("LOCKKIT_LOCK_ERROR_BUDGET", "7s"),
        ("LOCKKIT_LOCK_FAIR", "false"),
        ("LOCKKIT_REQUIRE_BACKENDS", "1"),
        ("LOCKKIT_TEST_REDIS_URL", "redis://127.0.0.1:20000"),
        ("PATH", "/usr/bin"),
    ]))
    .expect("valid");
    assert_eq!(config.backend, BackendKind::Memory);
    assert_eq!(config.namespace, "from-env");
    assert_eq!(config.lock.ttl, Duration::from_secs(3));
    assert!(!config.lock.auto_renew);
    assert_eq!(config.lock.error_budget, Duration::from_secs(7));
    assert!(!config.lock.fair, "LOCKKIT_LOCK_FAIR=false");
}

#[test]
fn environment_overrides_a_config_file() {
    let dir = std::env::temp_dir().join(format!("lockkit-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join("lockkit.toml");
    std::fs::write(
        &path,
        "backend = \"memory\"\nnamespace = \"from-file\"\n[lock]\nttl = \"20s\"\n",
    )
    .expect("write");
    let path_str = path.to_string_lossy().into_owned();
    let config = LockkitConfig::load_from(vars(&[
        ("LOCKKIT_CONFIG", &path_str),
        ("LOCKKIT_LOCK_TTL", "4s"),
    ]))
    .expect("valid");
    assert_eq!(config.namespace, "from-file");
    assert_eq!(config.lock.ttl, Duration::from_secs(4));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn environment_errors_are_explicit() {
    let err = LockkitConfig::load_from(vars(&[("HOME", "/root")])).expect_err("nothing configured");
    assert!(
        err.to_string().contains("no lock backend configured"),
        "{err}"
    );
    let err = LockkitConfig::load_from(vars(&[
        ("LOCKKIT_BACKEND", "memory"),
        ("LOCKKIT_LOCK_TTLL", "1s"),
    ]))
    .expect_err("typo in a field");
    assert!(err.to_string().contains("LOCKKIT_LOCK_TTLL"), "{err}");
    let err = LockkitConfig::load_from(vars(&[("LOCKKIT_CONFIG", "/nonexistent/lockkit.toml")]))
        .expect_err("missing file");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    assert!(
        err.to_string().contains("/nonexistent/lockkit.toml"),
        "{err}"
    );
}

#[test]
fn debug_output_hides_passwords() {
    let mut config = LockkitConfig::default();
    config.url = Some("redis://app:s3cret-pw@10.0.0.1:6379/0".into());
    let debug = format!("{config:?}");
    assert!(!debug.contains("s3cret-pw"), "{debug}");
    assert!(debug.contains("app:***@"), "{debug}");
    let err = LockkitConfig::from_url("redis://app:s3cret-pw@h:bad").expect_err("bad port");
    assert!(!err.to_string().contains("s3cret-pw"), "{err}");
    assert!(!format!("{err:?}").contains("s3cret-pw"), "{err:?}");
}

#[tokio::test]
async fn require_tier_refuses_a_weaker_backend_at_start_up() {
    let config = LockkitConfig::from_toml("backend = \"memory\"\nrequire_tier = \"consensus\"")
        .expect("parses");
    let err = lockkit::connect(&config)
        .await
        .expect_err("memory is weaker than consensus");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    assert!(err.to_string().contains("provides tier `local`"), "{err}");
    let config =
        LockkitConfig::from_toml("backend = \"memory\"\nrequire_tier = \"local\"").expect("parses");
    let locks = lockkit::connect(&config).await.expect("local is enough");
    let guard = locks.mutex("x").expect("key").lock().await.expect("lock");
    assert!(guard.release().await.expect("release"));
}

#[tokio::test]
async fn connect_applies_namespace_and_options() {
    let config =
        LockkitConfig::from_toml("backend = \"memory\"\nnamespace = \"svc\"\n[lock]\nttl = \"2s\"")
            .expect("parses");
    let locks = lockkit::connect(&config).await.expect("connect");
    assert_eq!(locks.namespace(), "svc");
    let guard = locks.mutex("job").expect("key").lock().await.expect("lock");
    assert_eq!(guard.key().to_string(), "svc/job");
    assert_eq!(guard.ttl(), Duration::from_secs(2));
    drop(guard);
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;

    #[test]
    fn redis_tables_urls_and_variables_combine() {
        let config = LockkitConfig::from_toml(
            r#"
            url = "redis+sentinel://:pw@10.0.0.1,[::1]:26380/orders/2"
            [redis]
            min_replicas = 1
            response_timeout = "250ms"
            "#,
        )
        .expect("sentinel config");
        assert_eq!(config.backend, BackendKind::RedisSentinel);
        let redis = config.redis_config().expect("merged");
        assert_eq!(redis.hosts, ["10.0.0.1:26379", "[::1]:26380"]);
        assert_eq!(redis.sentinel_master.as_deref(), Some("orders"));
        assert_eq!(redis.db, 2);
        assert_eq!(redis.min_replicas, 1);
        assert_eq!(redis.response_timeout, Duration::from_millis(250));
        assert!(!format!("{config:?}").contains(":pw@"));

        // The Sentinels' own credentials: from variables, taken as they are.
        let config = LockkitConfig::load_from(vars(&[
            ("LOCKKIT_URL", "redis+sentinel://10.0.0.1/orders"),
            ("LOCKKIT_REDIS_SENTINEL_USERNAME", "sentinel-user"),
            ("LOCKKIT_REDIS_SENTINEL_PASSWORD", "123456"),
        ]))
        .expect("sentinel credentials from variables");
        let redis = config.redis_config().expect("merged");
        assert_eq!(redis.sentinel_username.as_deref(), Some("sentinel-user"));
        assert_eq!(redis.sentinel_password.as_deref(), Some("123456"));
        assert!(!format!("{config:?}").contains("123456"));

        let config = LockkitConfig::load_from(vars(&[
            ("LOCKKIT_BACKEND", "redlock"),
            ("LOCKKIT_REDLOCK_NODES", r#"["a:1", "b:2", "c:3"]"#),
            ("LOCKKIT_REDLOCK_NODE_TIMEOUT", "50ms"),
        ]))
        .expect("redlock from variables");
        let redlock = config.redlock_config().expect("valid");
        assert_eq!(redlock.nodes, ["a:1", "b:2", "c:3"]);
        assert_eq!(redlock.node_timeout, Duration::from_millis(50));
        assert_eq!(redlock.quorum(), 2);
    }

    #[test]
    fn inconsistent_redis_settings_are_refused() {
        for (toml, needle) in [
            ("backend = \"redis-sentinel\"", "sentinel_master"),
            (
                "backend = \"redis\"\n[redis]\nsentinel_master = \"m\"\nhosts = [\"a:1\"]",
                "redis-sentinel",
            ),
            ("backend = \"redlock\"", "at least 3"),
            ("backend = \"redis\"\n[redis]\nbogus = 1", "bogus"),
            (
                "backend = \"redis\"\n[redis]\ncluster = true",
                "redis-cluster",
            ),
            (
                "backend = \"redis-cluster\"\nurl = \"redis://a:1\"",
                "the url selects",
            ),
            ("url = \"redis+cluster://a,b,c/2\"", "database 0"),
            (
                "backend = \"redis-cluster\"\n[redis]\nsentinel_master = \"m\"",
                "exclude each other",
            ),
            (
                "url = \"redlock://a,b,c\"\n[redlock]\nnode_timeout = \"0s\"",
                "node_timeout",
            ),
        ] {
            let err = config_error(toml);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{toml}: {err}");
            assert!(
                err.to_string().contains(needle),
                "{toml}: {err} lacks {needle:?}"
            );
        }
        let err = LockkitConfig::load_from(vars(&[
            ("LOCKKIT_BACKEND", "redis"),
            ("LOCKKIT_REDIS_HOST", "a:1"),
        ]))
        .expect_err("unknown field");
        assert!(err.to_string().contains("hosts"), "{err}");
    }

    #[test]
    fn a_cluster_comes_from_its_url_its_backend_or_the_environment() {
        let config = LockkitConfig::from_url("redis+cluster://app:pw@10.0.0.1,10.0.0.2:7001")
            .expect("cluster url");
        assert_eq!(config.backend, BackendKind::RedisCluster);
        let redis = config.redis_config().expect("merged");
        assert!(redis.cluster);
        assert_eq!(redis.hosts, ["10.0.0.1:6379", "10.0.0.2:7001"]);
        assert_eq!(redis.username.as_deref(), Some("app"));
        let config = LockkitConfig::load_from(vars(&[
            ("LOCKKIT_BACKEND", "redis-cluster"),
            ("LOCKKIT_REDIS_HOSTS", r#"["a:1", "b:2"]"#),
            ("LOCKKIT_REDIS_MIN_REPLICAS", "1"),
        ]))
        .expect("cluster from variables");
        let redis = config.redis_config().expect("merged");
        assert!(redis.cluster, "backend = redis-cluster names the mode");
        assert_eq!(redis.min_replicas, 1);
    }

    #[tokio::test]
    async fn connect_picks_the_redis_tier_from_the_url() {
        let Some(url) = lockkit_core::testing::endpoint("LOCKKIT_TEST_REDIS_URL") else {
            lockkit_core::testing::backend_missing("LOCKKIT_TEST_REDIS_URL");
            return;
        };
        let mut config = LockkitConfig::from_url(&url).expect("url");
        config.require_tier = Some(Tier::Single);
        let locks = lockkit::connect(&config).await.expect("connect");
        assert_eq!(locks.tier(), Tier::Single);
        let guard = locks.mutex("facade").unwrap().lock().await.unwrap();
        assert!(guard.release().await.unwrap());
        config.require_tier = Some(Tier::Quorum);
        let err = lockkit::connect(&config)
            .await
            .expect_err("single < quorum");
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    }
}

#[cfg(feature = "zk")]
#[test]
fn zk_table_takes_env_overrides_and_its_url_is_checked_at_load() {
    let config = LockkitConfig::load_from([
        (
            "LOCKKIT_URL".to_owned(),
            "zk://app:s3cret@a:1,b:2/locks".to_owned(),
        ),
        ("LOCKKIT_ZK_SESSION_TIMEOUT".to_owned(), "4s".to_owned()),
        ("LOCKKIT_ZK_ACL".to_owned(), "creator".to_owned()),
    ])
    .expect("valid");
    assert_eq!(config.backend, BackendKind::Zk);
    assert_eq!(config.zk.session_timeout, Duration::from_secs(4));
    assert!(!format!("{config:?}").contains("s3cret"));
    let err = LockkitConfig::from_url("zk://a:1/zookeeper").expect_err("reserved chroot");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    let err = LockkitConfig::load_from([
        ("LOCKKIT_BACKEND".to_owned(), "zk".to_owned()),
        ("LOCKKIT_ZK_TIMEOUT".to_owned(), "1s".to_owned()),
    ])
    .expect_err("unknown field");
    assert!(err.message().contains("session_timeout"), "{err}");
}

#[cfg(feature = "zk")]
#[test]
fn zks_url_turns_on_zk_tls_with_the_ca_file_from_the_table_or_names_the_missing_feature() {
    let loaded = LockkitConfig::load_from([
        (
            "LOCKKIT_URL".to_owned(),
            "zks://z1:2281,z2:2281/locks".to_owned(),
        ),
        (
            "LOCKKIT_ZK_CA_FILE".to_owned(),
            "/etc/lockkit/zk-ca.pem".to_owned(),
        ),
    ]);
    if cfg!(feature = "tls") {
        let config = loaded.expect("zks:// with a CA file");
        assert_eq!(config.backend, BackendKind::Zk);
        assert_eq!(
            config.zk.ca_file.as_deref(),
            Some(std::path::Path::new("/etc/lockkit/zk-ca.pem"))
        );
        let err = LockkitConfig::from_url("zks://z1:2281").expect_err("no CA file");
        assert!(err.message().contains("ca_file"), "{err}");
    } else {
        let err = loaded.expect_err("TLS without the feature");
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
        assert!(err.message().contains("cargo feature `tls`"), "{err}");
    }
    let err = LockkitConfig::from_toml("backend = \"zk\"\n[zk]\nca_file = \"ca.pem\"")
        .expect_err("a CA file without tls");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
}

#[cfg(feature = "zk")]
#[test]
fn every_zk_field_has_an_environment_override() {
    let mut every_field_set = lockkit::zk::ZkConfig::default();
    every_field_set.username = Some("u".into());
    every_field_set.password = Some("p".into());
    every_field_set.ca_file = Some("ca.pem".into());
    every_field_set.cert_file = Some("c.pem".into());
    every_field_set.key_file = Some("k.pem".into());
    let table = toml::Table::try_from(every_field_set).expect("serialize");
    for (field, value) in table {
        let var = format!("LOCKKIT_ZK_{}", field.to_ascii_uppercase());
        let result = LockkitConfig::load_from([
            ("LOCKKIT_BACKEND".to_owned(), "zk".to_owned()),
            (var.clone(), value.to_string()),
        ]);
        if let Err(e) = result {
            assert!(!e.to_string().contains("has no field"), "{var}: {e}");
        }
    }
}
