//! Security through the facade: no password in the `Debug` of `LockkitConfig` or in any error
//! that loading or connecting produces, whichever way the password came in (TOML table, URL,
//! `LOCKKIT_*` variable); hostile lock names and namespaces refused on every backend.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use lockkit::{ErrorKind, LockkitConfig};
use lockkit_core::testing::{assert_no_secret, backend_missing, endpoint, secret_spellings};

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Every spelling of every password in `passwords`.
fn spellings(passwords: &[&str]) -> Vec<String> {
    passwords.iter().flat_map(|p| secret_spellings(p)).collect()
}

/// The backends of this build with a password-bearing table, and a URL for each.
fn backends() -> Vec<(&'static str, &'static str)> {
    let mut all = Vec::new();
    if cfg!(feature = "redis") {
        all.push(("redis", "redis://app:{pw}@127.0.0.1:1/0"));
        all.push((
            "redlock",
            "redlock://app:{pw}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
        ));
    }
    if cfg!(feature = "etcd") {
        all.push(("etcd", "etcd://app:{pw}@127.0.0.1:1/locks"));
    }
    if cfg!(feature = "zk") {
        all.push(("zk", "zk://app:{pw}@127.0.0.1:1/locks"));
    }
    if cfg!(feature = "postgres") {
        all.push(("postgres", "postgres://app:{pw}@127.0.0.1:1/locks"));
    }
    all
}

fn user_field(table: &str) -> &'static str {
    if matches!(table, "etcd" | "postgres") {
        "user"
    } else {
        "username"
    }
}

/// The hosts field of `table`, on loopback ports where nothing listens: as a TOML line, and
/// as a `LOCKKIT_*` variable.
fn hosts_of(table: &str) -> (String, (String, String)) {
    let (field, value) = match table {
        "redlock" => ("nodes", r#"["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]"#),
        "etcd" => ("endpoints", r#"["127.0.0.1:1"]"#),
        _ => ("hosts", r#"["127.0.0.1:1"]"#),
    };
    let var = format!(
        "LOCKKIT_{}_{}",
        table.to_ascii_uppercase(),
        field.to_ascii_uppercase()
    );
    (format!("{field} = {value}"), (var, value.to_owned()))
}

/// The configuration of `table` from `LOCKKIT_*` variables, with user `app` and `password`.
fn from_env(table: &str, password: &str) -> lockkit::Result<LockkitConfig> {
    let upper = table.to_ascii_uppercase();
    let (_, (hosts_var, hosts)) = hosts_of(table);
    let user_var = format!("LOCKKIT_{upper}_{}", user_field(table).to_ascii_uppercase());
    let password_var = format!("LOCKKIT_{upper}_PASSWORD");
    LockkitConfig::load_from(vars(&[
        ("LOCKKIT_BACKEND", table),
        (&hosts_var, &hosts),
        (&user_var, "app"),
        (&password_var, password),
    ]))
}

/// The password the configuration holds for `table`.
#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "etcd",
        feature = "zk",
        feature = "postgres"
    )),
    allow(unused_variables)
)]
fn password_of(config: &LockkitConfig, table: &str) -> Option<String> {
    match table {
        #[cfg(feature = "redis")]
        "redis" => config.redis.password.clone(),
        #[cfg(feature = "redis")]
        "redlock" => config.redlock.password.clone(),
        #[cfg(feature = "etcd")]
        "etcd" => config.etcd.password.clone(),
        #[cfg(feature = "zk")]
        "zk" => config.zk.password.clone(),
        #[cfg(feature = "postgres")]
        "postgres" => config.postgres.password.clone(),
        _ => None,
    }
}

/// The password of every backend, set in its TOML table, by its URL and by `LOCKKIT_*`
/// variables, never shows in `Debug`.
#[test]
fn config_debug_never_shows_a_password() {
    for (table, url) in backends() {
        let pw = format!("pw-{:032x}", rand::random::<u128>());
        let secrets = spellings(&[&pw]);
        let (hosts, _) = hosts_of(table);
        let toml = format!(
            "backend = \"{table}\"\n[{table}]\n{hosts}\n{} = \"app\"\npassword = \"{pw}\"\n",
            user_field(table)
        );
        let from_toml = LockkitConfig::from_toml(&toml).unwrap();
        let from_url = LockkitConfig::from_url(&url.replace("{pw}", &pw)).unwrap();
        let from_env = from_env(table, &pw).unwrap();
        assert_eq!(password_of(&from_toml, table).as_deref(), Some(pw.as_str()));
        assert_eq!(password_of(&from_env, table).as_deref(), Some(pw.as_str()));
        assert_eq!(
            from_url.url.as_deref(),
            Some(url.replace("{pw}", &pw).as_str())
        );
        for config in [from_toml, from_url, from_env] {
            assert_no_secret(&format!("{table}: Debug"), &format!("{config:?}"), &secrets);
            assert_no_secret(
                &format!("{table}: {{:#?}}"),
                &format!("{config:#?}"),
                &secrets,
            );
        }
    }
}

/// Passwords that look like other TOML values (numbers, booleans, dates, arrays) are still
/// passwords, verbatim, when they come from a `LOCKKIT_*_PASSWORD` variable.
#[test]
fn a_password_from_the_environment_is_taken_verbatim() {
    for (table, _) in backends() {
        for pw in [
            "123456",
            "true",
            "1979-05-27",
            "[1, 2]",
            "3.14",
            "{a=1}",
            "\"quoted\"",
            "inf",
        ] {
            let config = from_env(table, pw)
                .unwrap_or_else(|e| panic!("{table}: the password {pw:?} was refused: {e}"));
            assert_eq!(password_of(&config, table).as_deref(), Some(pw), "{table}");
        }
    }
}

/// Malformed configurations that carry a password (a TOML syntax error on its line, a value
/// of the wrong type, an unknown field next to it, a malformed URL whose password holds an
/// unencoded `/`) fail with errors that do not repeat it.
#[test]
fn configuration_errors_never_show_a_password() {
    for (table, url) in backends() {
        let pw = format!("pw{:032x}", rand::random::<u128>());
        let number = format!("123456{}", rand::random::<u32>());
        let secrets = spellings(&[&pw, &number]);
        let head = format!("backend = \"{table}\"\n[{table}]\n");
        let bad_tomls = [
            format!("{head}password = \"{pw}\n"),
            format!("{head}password = {pw}\n"),
            format!("{head}password = [\"{pw}\"]\n"),
            format!("{head}password = {number}\n"),
            format!("{head}password = {{ value = \"{pw}\" }}\n"),
            format!("{head}pasword = \"{pw}\"\n"),
            format!("{head}password = \"{pw}\"\nhosts = 7\nnodes = 7\nendpoints = 7\n"),
        ];
        for toml in &bad_tomls {
            let err = LockkitConfig::from_toml(toml).expect_err(toml);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
            assert_no_secret(
                &format!("{table}: TOML error"),
                &format!("{err} {err:?}"),
                &secrets,
            );
        }
        let err = from_env(table, &format!("[{number}")).map(|_| ());
        if let Err(err) = err {
            assert_no_secret(
                &format!("{table}: env error"),
                &format!("{err} {err:?}"),
                &secrets,
            );
        }
        let slashed = format!("{pw}/{pw}?x");
        for bad_url in [
            url.replace("{pw}", &slashed),
            url.replace("{pw}", &pw)
                .replace("127.0.0.1:1", "127.0.0.1:notaport"),
        ] {
            let secrets = spellings(&[&pw, &slashed]);
            let err = LockkitConfig::from_url(&bad_url).expect_err(&bad_url);
            assert_no_secret(
                &format!("{table}: URL error"),
                &format!("{err} {err:?}"),
                &secrets,
            );
            let err =
                LockkitConfig::load_from(vars(&[("LOCKKIT_URL", &bad_url)])).expect_err(&bad_url);
            assert_no_secret(
                &format!("{table}: LOCKKIT_URL error"),
                &format!("{err} {err:?}"),
                &secrets,
            );
        }
    }
}

/// Connecting to nothing with a password fails without showing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_errors_never_show_a_password() {
    for (table, url) in backends() {
        let pw = format!("pw-{:032x}", rand::random::<u128>());
        let config = LockkitConfig::from_url(&url.replace("{pw}", &pw)).unwrap();
        let err = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            lockkit::connect(&config),
        )
        .await
        .unwrap_or_else(|_| panic!("{table}: connect hung"))
        .map(|_| ())
        .expect_err("nothing listens");
        assert_no_secret(
            &format!("{table}: connect error"),
            &format!("{err} {err:?}"),
            &spellings(&[&pw]),
        );
    }
}

/// The hostile names, as in `lockkit-core/tests/security.rs`.
fn hostile_names() -> Vec<String> {
    let mut names: Vec<String> = [
        "",
        "/",
        "a/b",
        ".",
        "..",
        "nul\0",
        "line\nbreak",
        "\u{1b}[31m",
        "\u{202e}",
        "\u{1f512}",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    names.push("k".repeat(10 * 1024));
    names
}

/// A hostile namespace is refused when the configuration is loaded, from TOML and from a
/// `LOCKKIT_NAMESPACE` variable.
#[test]
fn hostile_namespaces_are_refused_by_the_configuration() {
    for ns in hostile_names() {
        let toml = format!(
            "backend = \"memory\"\nnamespace = {}\n",
            toml::Value::String(ns.clone())
        );
        let err = LockkitConfig::from_toml(&toml)
            .map(|_| ())
            .expect_err(&ns.escape_debug().to_string());
        assert!(
            matches!(err.kind(), ErrorKind::InvalidKey | ErrorKind::InvalidConfig),
            "{err}"
        );
        if ns.contains('\0') {
            continue; // not representable in an environment variable
        }
        let err = LockkitConfig::load_from(vars(&[
            ("LOCKKIT_BACKEND", "memory"),
            ("LOCKKIT_NAMESPACE", &ns),
        ]))
        .map(|_| ())
        .expect_err(&ns.escape_debug().to_string());
        assert!(
            matches!(err.kind(), ErrorKind::InvalidKey | ErrorKind::InvalidConfig),
            "{err}"
        );
    }
}

/// Every backend of this build refuses hostile names with `InvalidKey` through the facade: the
/// memory backend always, the others against the test servers (`compose/up.sh`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_backend_refuses_hostile_names() {
    let mut urls = vec![("memory".to_owned(), Some("memory://".to_owned()))];
    for (var, compiled) in [
        ("LOCKKIT_TEST_REDIS_URL", cfg!(feature = "redis")),
        ("LOCKKIT_TEST_REDLOCK_URL", cfg!(feature = "redis")),
        ("LOCKKIT_TEST_ETCD_URL", cfg!(feature = "etcd")),
        ("LOCKKIT_TEST_ZK_URL", cfg!(feature = "zk")),
        ("LOCKKIT_TEST_POSTGRES_URL", cfg!(feature = "postgres")),
    ] {
        if compiled {
            urls.push((var.to_owned(), endpoint(var)));
        }
    }
    for (what, url) in urls {
        let Some(url) = url else {
            backend_missing(&what);
            continue;
        };
        let config = LockkitConfig::from_url(&url).unwrap();
        let locks = match lockkit::connect(&config).await {
            Ok(locks) => locks,
            Err(e) => {
                backend_missing(&format!("{what} = {url} ({e})"));
                continue;
            }
        };
        for name in hostile_names() {
            let shown = name.escape_debug().to_string();
            let err = locks.mutex(&name).map(|_| ()).expect_err(&shown);
            assert_eq!(err.kind(), ErrorKind::InvalidKey, "{what} {shown}: {err}");
            let err = locks.inspect(&name).await.map(|_| ()).expect_err(&shown);
            assert_eq!(err.kind(), ErrorKind::InvalidKey, "{what} {shown}: {err}");
        }
    }
}

/// The TLS tests make their CA and keys at run time (`lockkit_core::testing::tls_certificates`):
/// no private key is ever committed.
#[test]
fn no_private_key_is_committed() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let Ok(listed) = std::process::Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root)
        .output()
    else {
        backend_missing("the git command");
        return;
    };
    assert!(listed.status.success(), "git ls-files failed");
    let marker = ["-----BEGIN", " PRIVATE KEY-----"];
    let files: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .split('\0')
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(files.iter().any(|f| f == "Cargo.toml"), "{files:?}");
    for file in files {
        let lower = file.to_ascii_lowercase();
        assert!(
            ![".pem", ".key", ".p12", ".pfx"]
                .iter()
                .any(|ext| lower.ends_with(ext)),
            "{file} looks like key material"
        );
        let Ok(bytes) = std::fs::read(root.join(&file)) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.lines().any(|line| line.starts_with(marker[0])
                && line.ends_with(marker[1].trim_start())
                && line.contains("PRIVATE KEY")),
            "{file} holds a private key"
        );
    }
}
