//! [`BackendKind`]: the backends lockkit knows, compiled in or not, by name and URL scheme.

use std::fmt;
use std::str::FromStr;

use lockkit_core::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};

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
    /// A PostgreSQL database (tier `single` on a server alone, `replicated` with synchronous
    /// standbys).
    Postgres,
}

impl BackendKind {
    /// Every backend, compiled in or not.
    pub const ALL: [BackendKind; 8] = [
        BackendKind::Memory,
        BackendKind::Redis,
        BackendKind::RedisSentinel,
        BackendKind::RedisCluster,
        BackendKind::Redlock,
        BackendKind::Etcd,
        BackendKind::Zk,
        BackendKind::Postgres,
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
            BackendKind::Postgres => "postgres",
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
            BackendKind::Postgres => Some("postgres"),
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
            BackendKind::Postgres => cfg!(feature = "postgres"),
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
            "postgres" | "postgresql" => Ok(BackendKind::Postgres),
            other => Err(Error::invalid_config(format!(
                "unknown URL scheme {other:?}; known: memory://, redis://, rediss://, redis+sentinel://, redis+cluster://, redlock://, etcd://, zk://, zks://, postgres://, postgresql://"
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
