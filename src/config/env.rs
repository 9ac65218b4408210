//! `LOCKKIT_*` environment variables over a configuration table: which tables and fields they
//! reach, and how their values are read.

use lockkit_core::{Error, Result};
use toml::{Table, Value};

/// Tables of the configuration that `LOCKKIT_<SECTION>_<FIELD>` variables can reach, with
/// their fields.
const SECTIONS: &[(&str, &[&str])] = &[
    ("lock", LOCK_FIELDS),
    #[cfg(feature = "redis")]
    ("redis", REDIS_FIELDS),
    #[cfg(feature = "redis")]
    ("redlock", REDLOCK_FIELDS),
    #[cfg(feature = "zk")]
    ("zk", ZK_FIELDS),
    #[cfg(feature = "etcd")]
    ("etcd", ETCD_FIELDS),
    #[cfg(feature = "postgres")]
    ("postgres", POSTGRES_FIELDS),
];
/// Fields that `LOCKKIT_*` variables set to their text as it is, never parsed as TOML.
const VERBATIM_FIELDS: &[&str] = &[
    "dbname",
    "username",
    "user",
    "password",
    "sentinel_username",
    "sentinel_password",
];
/// Top-level fields that `LOCKKIT_<FIELD>` variables can set.
const TOP_LEVEL: &[&str] = &["backend", "url", "namespace", "require_tier"];
/// Fields of the `[zk]` table.
#[cfg(feature = "zk")]
const ZK_FIELDS: &[&str] = &[
    "hosts",
    "chroot",
    "session_timeout",
    "suspended_grace_fraction",
    "connect_timeout",
    "request_timeout",
    "empty_parent_linger",
    "username",
    "password",
    "acl",
    "tls",
    "ca_file",
    "cert_file",
    "key_file",
];
/// Fields of the `[lock]` table.
const LOCK_FIELDS: &[&str] = &[
    "ttl",
    "wait_timeout",
    "auto_renew",
    "backoff_min",
    "backoff_max",
    "clock_drift_factor",
    "error_budget",
    "fair",
];
/// Fields of the `[redis]` table.
#[cfg(feature = "redis")]
const REDIS_FIELDS: &[&str] = &[
    "hosts",
    "sentinel_master",
    "cluster",
    "sentinel_username",
    "sentinel_password",
    "db",
    "username",
    "password",
    "tls",
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
    "connect_timeout",
    "response_timeout",
    "notifications",
    "min_replicas",
    "replica_timeout",
    "fence_ttl",
    "allow_eviction",
];
/// Fields of the `[redlock]` table.
#[cfg(feature = "redis")]
const REDLOCK_FIELDS: &[&str] = &[
    "nodes",
    "username",
    "password",
    "tls",
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
    "connect_timeout",
    "node_timeout",
    "max_hold",
    "fence_ttl",
    "allow_eviction",
];
/// Fields of the `[etcd]` table.
#[cfg(feature = "etcd")]
const ETCD_FIELDS: &[&str] = &[
    "endpoints",
    "prefix",
    "connect_timeout",
    "request_timeout",
    "require_leader",
    "user",
    "password",
    "tls",
    "ca_file",
    "cert_file",
    "key_file",
    "tls_domain",
];
/// Fields of the `[postgres]` table.
#[cfg(feature = "postgres")]
const POSTGRES_FIELDS: &[&str] = &[
    "hosts",
    "dbname",
    "user",
    "password",
    "connect_timeout",
    "request_timeout",
    "pool_size",
    "listen",
    "listen_hosts",
    "create_schema",
    "tls",
    "ca_file",
    "cert_file",
    "key_file",
    "tls_domain",
];

pub(super) fn apply_env_overrides(table: &mut Table, vars: &[(String, String)]) -> Result<()> {
    for (name, raw) in vars {
        let Some(rest) = name.strip_prefix("LOCKKIT_") else {
            continue;
        };
        let rest = rest.to_ascii_lowercase();
        if TOP_LEVEL.contains(&rest.as_str()) {
            table.insert(rest, parse_env_value(raw));
            continue;
        }
        let Some((section, field, known)) = SECTIONS.iter().find_map(|(s, fields)| {
            rest.strip_prefix(s)
                .and_then(|f| f.strip_prefix('_'))
                .map(|f| (*s, f, *fields))
        }) else {
            continue;
        };
        if !known.contains(&field) {
            return Err(Error::invalid_config(format!(
                "{name}: [{section}] has no field `{field}`; known: {}",
                known.join(", ")
            )));
        }
        let entry = table
            .entry(section)
            .or_insert_with(|| Value::Table(Table::new()));
        let Value::Table(section_table) = entry else {
            return Err(Error::invalid_config(format!("{section} must be a table")));
        };
        // A credential is a string whatever it looks like: read as TOML, the password
        // `123456` would be a number, refused with an error that shows it.
        let value = if VERBATIM_FIELDS.contains(&field) {
            Value::String(raw.clone())
        } else {
            parse_env_value(raw)
        };
        section_table.insert(field.to_owned(), value);
    }
    Ok(())
}

fn parse_env_value(raw: &str) -> Value {
    format!("v = {raw}")
        .parse::<Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| Value::String(raw.to_owned()))
}
