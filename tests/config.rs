//! The configuration switch: reference.toml, URLs, environment overrides and every bad input.

use std::collections::BTreeSet;
use std::time::Duration;

use lockkit::{BackendKind, ErrorKind, LockkitConfig, Tier};

const REFERENCE: &str = include_str!("../reference.toml");

/// reference.toml without the tables of backends this build does not contain.
fn compiled_in_reference() -> toml::Table {
    let mut reference: toml::Table = REFERENCE.parse().expect("toml");
    for kind in BackendKind::ALL {
        if !kind.is_compiled_in() {
            reference.remove(kind.as_str());
        }
    }
    reference
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
    let parsed = LockkitConfig::from_toml(&compiled_in_reference().to_string())
        .expect("reference.toml parses");
    assert_eq!(parsed, LockkitConfig::default());
}

#[test]
fn reference_toml_lists_every_option() {
    let defaults: toml::Table =
        toml::Table::try_from(LockkitConfig::default()).expect("serialize defaults");
    let mut default_keys = BTreeSet::new();
    keys("", &defaults, &mut default_keys);
    let reference = compiled_in_reference();
    let mut reference_keys = BTreeSet::new();
    keys("", &reference, &mut reference_keys);
    assert_eq!(
        default_keys, reference_keys,
        "set options in reference.toml differ from the defaults"
    );
    // Options without a default value are listed commented out.
    for optional in ["# url = ", "# require_tier = ", "# wait_timeout = "] {
        assert!(
            REFERENCE.contains(optional),
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
        error_retries = 0
        "#,
    )
    .expect("valid");
    assert_eq!(config.namespace, "billing");
    assert_eq!(config.require_tier, Some(Tier::Local));
    assert_eq!(config.lock.ttl, Duration::from_secs(2));
    assert_eq!(config.lock.wait_timeout, Some(Duration::from_secs(60)));
    assert!(!config.lock.auto_renew);
    assert_eq!(config.lock.error_retries, 0);
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
        ("LOCKKIT_LOCK_ERROR_RETRIES", "7"),
        ("LOCKKIT_REQUIRE_BACKENDS", "1"),
        ("LOCKKIT_TEST_REDIS_URL", "redis://127.0.0.1:20000"),
        ("PATH", "/usr/bin"),
    ]))
    .expect("valid");
    assert_eq!(config.backend, BackendKind::Memory);
    assert_eq!(config.namespace, "from-env");
    assert_eq!(config.lock.ttl, Duration::from_secs(3));
    assert!(!config.lock.auto_renew);
    assert_eq!(config.lock.error_retries, 7);
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
    assert_eq!(guard.lease().ttl(), Duration::from_secs(2));
    drop(guard);
}
