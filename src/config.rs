//! `LockkitConfig`: which backend, in which namespace, with which lock options; loaded from
//! TOML, a URL or `LOCKKIT_*` environment variables.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use lockkit_core::backend::url::{ConnectionUrl, redact};
use lockkit_core::{Error, ErrorKind, LockKey, LockOptions, Result, Tier};
use serde::{Deserialize, Serialize};
use toml::{Table, Value};

/// The backends lockkit knows, compiled in or not.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// In-process locks ([`MemoryBackend`](lockkit_core::MemoryBackend)); always compiled in.
    /// Each [`connect`](crate::connect) creates its own lock table: share the returned client
    /// (it is cheap to clone) rather than connecting twice.
    Memory,
    /// One Redis server (tier `single`).
    Redis,
    /// A Redis primary watched by Sentinels (tier `replicated`).
    RedisSentinel,
    /// A Redis Cluster, each lock on its slot's primary (tier `replicated`).
    RedisCluster,
    /// Redlock over independent Redis servers (tier `quorum`).
    Redlock,
    /// An etcd cluster (tier `consensus`).
    Etcd,
    /// A ZooKeeper ensemble (tier `consensus`).
    Zk,
}

impl BackendKind {
    /// Every backend, compiled in or not.
    pub const ALL: [BackendKind; 7] = [
        BackendKind::Memory,
        BackendKind::Redis,
        BackendKind::RedisSentinel,
        BackendKind::RedisCluster,
        BackendKind::Redlock,
        BackendKind::Etcd,
        BackendKind::Zk,
    ];

    /// The name used in configuration (`backend = "..."`).
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Memory => "memory",
            BackendKind::Redis => "redis",
            BackendKind::RedisSentinel => "redis-sentinel",
            BackendKind::RedisCluster => "redis-cluster",
            BackendKind::Redlock => "redlock",
            BackendKind::Etcd => "etcd",
            BackendKind::Zk => "zk",
        }
    }

    /// The cargo feature of the `lockkit` crate that compiles this backend in (`None` for
    /// the memory backend, which is always there).
    pub fn feature(self) -> Option<&'static str> {
        match self {
            BackendKind::Memory => None,
            BackendKind::Redis
            | BackendKind::RedisSentinel
            | BackendKind::RedisCluster
            | BackendKind::Redlock => Some("redis"),
            BackendKind::Etcd => Some("etcd"),
            BackendKind::Zk => Some("zk"),
        }
    }

    /// Whether this build of lockkit contains the backend.
    pub fn is_compiled_in(self) -> bool {
        match self {
            BackendKind::Memory => true,
            BackendKind::Redis
            | BackendKind::RedisSentinel
            | BackendKind::RedisCluster
            | BackendKind::Redlock => cfg!(feature = "redis"),
            BackendKind::Etcd => cfg!(feature = "etcd"),
            BackendKind::Zk => cfg!(feature = "zk"),
        }
    }

    /// The backends this build contains.
    pub fn compiled_in() -> Vec<BackendKind> {
        BackendKind::ALL
            .into_iter()
            .filter(|k| k.is_compiled_in())
            .collect()
    }

    /// The backend a URL scheme selects.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] for an unknown scheme, listing the known ones.
    pub fn from_scheme(scheme: &str) -> Result<Self> {
        match scheme {
            "memory" => Ok(BackendKind::Memory),
            "redis" | "rediss" => Ok(BackendKind::Redis),
            "redis+sentinel" => Ok(BackendKind::RedisSentinel),
            "redis+cluster" => Ok(BackendKind::RedisCluster),
            "redlock" => Ok(BackendKind::Redlock),
            "etcd" => Ok(BackendKind::Etcd),
            "zk" | "zks" => Ok(BackendKind::Zk),
            other => Err(Error::invalid_config(format!(
                "unknown URL scheme {other:?}; known: memory://, redis://, rediss://, redis+sentinel://, redis+cluster://, redlock://, etcd://, zk://, zks://"
            ))),
        }
    }

    /// The error for selecting a backend this build does not contain.
    pub(crate) fn not_compiled_in(self) -> Error {
        let available: Vec<&str> = BackendKind::compiled_in()
            .iter()
            .map(|k| k.as_str())
            .collect();
        Error::new(
            ErrorKind::Unsupported,
            "config",
            format!(
                "backend `{}` is not compiled into this build of lockkit: enable the cargo feature `{}` of the lockkit crate (compiled in: {})",
                self.as_str(),
                self.feature().unwrap_or("?"),
                available.join(", ")
            ),
        )
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BackendKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        BackendKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = BackendKind::ALL.iter().map(|k| k.as_str()).collect();
                Error::invalid_config(format!(
                    "unknown backend {s:?}; known backends: {}",
                    known.join(", ")
                ))
            })
    }
}

/// The whole configuration: which backend, the namespace of its keys, the weakest tier the
/// service accepts, and the lock options.
///
/// Every option and its default is listed in `reference.toml` (shown below); a test parses
/// that file, so the two cannot drift apart. Unknown fields are errors.
///
/// Sources, in order (later ones win):
/// 1. a TOML file ([`LockkitConfig::from_toml_file`], or `LOCKKIT_CONFIG` in [`LockkitConfig::load`]);
/// 2. or a URL ([`LockkitConfig::from_url`], `LOCKKIT_URL`): the scheme selects the backend;
/// 3. `LOCKKIT_*` environment variables: `LOCKKIT_<FIELD>` for a top-level field
///    (`LOCKKIT_BACKEND`, `LOCKKIT_URL`, `LOCKKIT_NAMESPACE`, `LOCKKIT_REQUIRE_TIER`) and
///    `LOCKKIT_<SECTION>_<FIELD>` for a field of a table (`LOCKKIT_LOCK_TTL=5s`). Values are
///    read as TOML values when they parse as one (`false`, `3`, `0.02`), as strings otherwise;
///    user names and passwords are always taken as they are (`LOCKKIT_REDIS_PASSWORD=123456`
///    is the password `123456`, not a number).
///    A variable naming a known table but an unknown field is an error; variables that name no
///    table or field (`LOCKKIT_TEST_*`, `LOCKKIT_REQUIRE_BACKENDS`) are not configuration and
///    are ignored.
///
/// ```toml
#[doc = include_str!("../reference.toml")]
/// ```
#[non_exhaustive]
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockkitConfig {
    /// Which backend to use. May be left out when `url` is given: the scheme decides.
    pub backend: BackendKind,
    /// Where the backend is, as a URL (`redis://host:6379/0`, `etcd://h1,h2,h3`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The namespace all lock keys live in; services that must not contend use different ones.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The weakest tier this service accepts: a weaker backend is refused at start-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_tier: Option<Tier>,
    /// How locks are taken.
    #[serde(default)]
    pub lock: LockOptions,
    /// The `redis`, `redis-sentinel` and `redis-cluster` backends' settings (the `[redis]`
    /// table); the `url`, when given, supplies the hosts, credentials, database, Sentinel
    /// master name and cluster mode.
    #[cfg(feature = "redis")]
    #[serde(default)]
    pub redis: lockkit_redis::RedisConfig,
    /// The `redlock` backend's settings (the `[redlock]` table); the `url`, when given,
    /// supplies the nodes and credentials.
    #[cfg(feature = "redis")]
    #[serde(default)]
    pub redlock: lockkit_redis::RedlockConfig,
    /// The ZooKeeper backend's options (`[zk]`); `url` overrides its hosts, credentials and
    /// chroot, and `zks://` turns on TLS (the CA file comes from this table).
    #[cfg(feature = "zk")]
    #[serde(default)]
    pub zk: lockkit_zk::ZkConfig,
    /// The etcd backend's connection settings (feature `etcd`); `url` overrides its
    /// endpoints, credentials and prefix.
    #[cfg(feature = "etcd")]
    #[serde(default)]
    pub etcd: lockkit_etcd::EtcdConfig,
}

fn default_namespace() -> String {
    LockKey::DEFAULT_NAMESPACE.to_owned()
}

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
];
/// Fields that `LOCKKIT_*` variables set to their text as it is, never parsed as TOML.
const VERBATIM_FIELDS: &[&str] = &[
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

impl Default for LockkitConfig {
    /// The memory backend with default options.
    fn default() -> Self {
        LockkitConfig {
            backend: BackendKind::Memory,
            url: None,
            namespace: default_namespace(),
            require_tier: None,
            lock: LockOptions::default(),
            #[cfg(feature = "redis")]
            redis: lockkit_redis::RedisConfig::default(),
            #[cfg(feature = "redis")]
            redlock: lockkit_redis::RedlockConfig::default(),
            #[cfg(feature = "zk")]
            zk: lockkit_zk::ZkConfig::default(),
            #[cfg(feature = "etcd")]
            etcd: lockkit_etcd::EtcdConfig::default(),
        }
    }
}

impl LockkitConfig {
    /// Parses a TOML document.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] for malformed TOML, unknown fields or backends, bad values;
    /// [`ErrorKind::Unsupported`] for a backend that is not compiled in.
    pub fn from_toml(text: &str) -> Result<Self> {
        let table: Table = text.parse().map_err(|e: toml::de::Error| {
            Error::invalid_config(format!("malformed TOML: {}", e.message()))
        })?;
        Self::from_table(table)
    }

    /// Reads and parses a TOML file.
    ///
    /// # Errors
    /// As [`LockkitConfig::from_toml`], and [`ErrorKind::InvalidConfig`] if the file cannot be read.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::invalid_config(format!("cannot read {}: {e}", path.display())))?;
        Self::from_toml(&text).map_err(|e| {
            Error::new(
                e.kind(),
                "config",
                format!("{}: {}", path.display(), e.message()),
            )
        })
    }

    /// A configuration for the backend the URL's scheme selects, with default options.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] for a malformed URL or an unknown scheme;
    /// [`ErrorKind::Unsupported`] for a backend that is not compiled in.
    pub fn from_url(url: &str) -> Result<Self> {
        let mut table = Table::new();
        table.insert("url".into(), Value::String(url.to_owned()));
        Self::from_table(table)
    }

    /// Loads the configuration the environment describes: the TOML file named by
    /// `LOCKKIT_CONFIG`, or else the URL in `LOCKKIT_URL`, then `LOCKKIT_*` overrides.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] when nothing selects a backend (there is deliberately no
    /// silent fallback to the in-process backend), plus the errors of the other loaders.
    pub fn load() -> Result<Self> {
        Self::load_from(std::env::vars())
    }

    /// As [`LockkitConfig::load`], from the given variables instead of the process environment.
    ///
    /// # Errors
    /// As [`LockkitConfig::load`].
    pub fn load_from(vars: impl IntoIterator<Item = (String, String)>) -> Result<Self> {
        let vars: Vec<(String, String)> = vars
            .into_iter()
            .filter(|(k, _)| k.starts_with("LOCKKIT_"))
            .collect();
        let get = |name: &str| {
            vars.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let mut table = match get("LOCKKIT_CONFIG") {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    Error::invalid_config(format!("cannot read LOCKKIT_CONFIG={path}: {e}"))
                })?;
                text.parse::<Table>().map_err(|e| {
                    Error::invalid_config(format!("{path}: malformed TOML: {}", e.message()))
                })?
            }
            None => Table::new(),
        };
        apply_env_overrides(&mut table, &vars)?;
        if !table.contains_key("backend") && !table.contains_key("url") {
            return Err(Error::invalid_config(
                "no lock backend configured: set LOCKKIT_CONFIG (a TOML file), LOCKKIT_URL or LOCKKIT_BACKEND",
            ));
        }
        Self::from_table(table)
    }

    fn from_table(mut table: Table) -> Result<Self> {
        let from_url = match table.get("url") {
            Some(Value::String(url)) => Some(BackendKind::from_scheme(
                &ConnectionUrl::parse(url)?.scheme,
            )?),
            Some(_) => return Err(Error::invalid_config("url must be a string")),
            None => None,
        };
        let named = match table.get("backend") {
            Some(Value::String(name)) => Some(name.parse::<BackendKind>()?),
            Some(_) => return Err(Error::invalid_config("backend must be a string")),
            None => None,
        };
        let kind = match (named, from_url) {
            (Some(named), Some(from_url)) if named != from_url => {
                return Err(Error::invalid_config(format!(
                    "backend = {named:?} but the url selects {from_url:?}"
                )));
            }
            (Some(kind), _) | (None, Some(kind)) => kind,
            (None, None) => {
                return Err(Error::invalid_config(
                    "missing field `backend` (or a `url` whose scheme selects the backend)",
                ));
            }
        };
        if !kind.is_compiled_in() {
            return Err(kind.not_compiled_in());
        }
        table.insert("backend".into(), Value::String(kind.as_str().to_owned()));
        let config: LockkitConfig =
            serde_path_to_error::deserialize(Value::Table(table)).map_err(|e| {
                let path = e.path().to_string();
                let inner = e.into_inner();
                match path.as_str() {
                    // serde quotes the offending value ("invalid type: integer `123456`").
                    path if path.ends_with("password") => Error::invalid_config(format!(
                        "{path} must be a string (the value is not shown)"
                    )),
                    "." | "" => Error::invalid_config(inner.message().to_owned()),
                    path => Error::invalid_config(format!("{path}: {}", inner.message())),
                }
            })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks the values that serde cannot.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] or [`ErrorKind::InvalidKey`] saying what is wrong.
    pub fn validate(&self) -> Result<()> {
        lockkit_core::backend::validate_segment("namespace", &self.namespace)?;
        self.lock.validate()?;
        match self.backend {
            #[cfg(feature = "redis")]
            BackendKind::Redis | BackendKind::RedisSentinel | BackendKind::RedisCluster => {
                self.redis_config()?;
            }
            #[cfg(feature = "redis")]
            BackendKind::Redlock => {
                self.redlock_config()?;
            }
            #[cfg(feature = "etcd")]
            BackendKind::Etcd => {
                self.etcd_config()?;
            }
            #[cfg(feature = "zk")]
            BackendKind::Zk => {
                self.zk_config()?;
            }
            _ => {}
        }
        if self.backend == BackendKind::Memory
            && let Some(url) = &self.url
        {
            let url = ConnectionUrl::parse(url)?;
            if !url.hosts.is_empty() || !url.path.is_empty() {
                return Err(Error::invalid_config(format!(
                    "the memory backend takes no hosts or path: use memory://, not {url}"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(feature = "redis")]
impl LockkitConfig {
    /// The `[redis]` table with the `url` applied, checked against the backend kind.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] for a bad URL or table, or a Sentinel master name or
    /// cluster mode that does not match `backend` (`redis-sentinel` needs a master name,
    /// `redis-cluster` needs `cluster`, `redis` has neither).
    pub fn redis_config(&self) -> Result<lockkit_redis::RedisConfig> {
        let mut redis = self.redis.clone();
        if let Some(url) = &self.url {
            redis.apply_url(&ConnectionUrl::parse(url)?)?;
        }
        if self.backend == BackendKind::RedisCluster && self.url.is_none() {
            // The backend names the mode, as a redis+cluster:// URL would.
            redis.cluster = true;
        }
        match (self.backend, redis.sentinel_master.is_some(), redis.cluster) {
            (BackendKind::RedisSentinel, false, _) => Err(Error::invalid_config(
                "backend = \"redis-sentinel\" needs redis.sentinel_master (or a redis+sentinel://s1,s2,s3/master-name URL)",
            )),
            (BackendKind::Redis, true, _) => Err(Error::invalid_config(
                "redis.sentinel_master is set but backend = \"redis\": use backend = \"redis-sentinel\"",
            )),
            (BackendKind::Redis | BackendKind::RedisSentinel, _, true) => {
                Err(Error::invalid_config(
                    "redis.cluster is set but backend is not \"redis-cluster\": use backend = \"redis-cluster\" (or a redis+cluster:// URL)",
                ))
            }
            (BackendKind::RedisCluster, _, false) => Err(Error::invalid_config(
                "backend = \"redis-cluster\" needs a redis+cluster://h1,h2,h3 URL, not another Redis URL",
            )),
            _ => {
                redis.validate()?;
                Ok(redis)
            }
        }
    }

    /// The `[redlock]` table with the `url` applied.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] for a bad URL or table.
    pub fn redlock_config(&self) -> Result<lockkit_redis::RedlockConfig> {
        let mut redlock = self.redlock.clone();
        if let Some(url) = &self.url {
            redlock.apply_url(&ConnectionUrl::parse(url)?)?;
        }
        redlock.validate()?;
        Ok(redlock)
    }
}

#[cfg(feature = "etcd")]
impl LockkitConfig {
    /// The `[etcd]` table with the `url` applied (its endpoints, credentials and prefix win).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] for a bad URL or table.
    pub fn etcd_config(&self) -> Result<lockkit_etcd::EtcdConfig> {
        let mut etcd = self.etcd.clone();
        if let Some(url) = &self.url {
            etcd.apply_url(&ConnectionUrl::parse(url)?)?;
        }
        etcd.validate()?;
        Ok(etcd)
    }
}

#[cfg(feature = "zk")]
impl LockkitConfig {
    /// The `[zk]` options with `url` applied (its hosts, credentials and chroot win).
    pub(crate) fn zk_config(&self) -> Result<lockkit_zk::ZkConfig> {
        let mut zk = self.zk.clone();
        match &self.url {
            Some(url) => zk.apply_url(&ConnectionUrl::parse(url)?)?,
            None => zk.validate()?,
        }
        Ok(zk)
    }
}

fn apply_env_overrides(table: &mut Table, vars: &[(String, String)]) -> Result<()> {
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

impl fmt::Debug for LockkitConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("LockkitConfig");
        d.field("backend", &self.backend)
            .field("url", &self.url.as_deref().map(redact))
            .field("namespace", &self.namespace)
            .field("require_tier", &self.require_tier)
            .field("lock", &self.lock);
        #[cfg(feature = "redis")]
        d.field("redis", &self.redis)
            .field("redlock", &self.redlock);
        #[cfg(feature = "zk")]
        d.field("zk", &self.zk);
        #[cfg(feature = "etcd")]
        d.field("etcd", &self.etcd);
        d.finish()
    }
}
