//! `LockkitConfig`: which backend, in which namespace, with which lock options; loaded from
//! TOML, a URL or `LOCKKIT_*` environment variables.

use std::fmt;
use std::path::Path;

#[cfg(doc)]
use lockkit_core::ErrorKind;
use lockkit_core::backend::url::{ConnectionUrl, redact};
use lockkit_core::{Error, LockKey, LockOptions, Result, Tier};
use serde::{Deserialize, Serialize};
use toml::{Table, Value};

mod env;
mod kind;

pub use kind::BackendKind;

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
#[doc = include_str!("../../reference.toml")]
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
    /// The PostgreSQL backend's connection settings (feature `postgres`); `url` overrides its
    /// hosts, user, password and database.
    #[cfg(feature = "postgres")]
    #[serde(default)]
    pub postgres: lockkit_postgres::PostgresConfig,
}

fn default_namespace() -> String {
    LockKey::DEFAULT_NAMESPACE.to_owned()
}

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
            #[cfg(feature = "postgres")]
            postgres: lockkit_postgres::PostgresConfig::default(),
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
        env::apply_env_overrides(&mut table, &vars)?;
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
            #[cfg(feature = "postgres")]
            BackendKind::Postgres => {
                self.postgres_config()?;
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

#[cfg(feature = "postgres")]
impl LockkitConfig {
    /// The `[postgres]` table with the `url` applied (its hosts, user, password and database
    /// win).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] for a bad URL or table.
    pub fn postgres_config(&self) -> Result<lockkit_postgres::PostgresConfig> {
        let mut postgres = self.postgres.clone();
        if let Some(url) = &self.url {
            postgres.apply_url(&ConnectionUrl::parse(url)?)?;
        }
        postgres.validate()?;
        Ok(postgres)
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
        #[cfg(feature = "postgres")]
        d.field("postgres", &self.postgres);
        d.finish()
    }
}
