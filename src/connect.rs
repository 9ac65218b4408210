//! The runtime switch from a configuration to a backend.

use std::sync::Arc;

use lockkit_core::backend::SharedBackend;
use lockkit_core::{Error, ErrorKind, LockClient, MemoryBackend, Result};

use crate::config::{BackendKind, LockkitConfig};

/// Builds the backend the configuration selects and returns a client over it.
///
/// The client is cheap to clone and shares the backend's connections; build it once per
/// process. When `require_tier` is set and the backend's tier is weaker, this fails before
/// any lock is taken.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockkit::Result<()> {
/// let config = lockkit::LockkitConfig::from_url("memory://")?;
/// let locks = lockkit::connect(&config).await?;
/// assert_eq!(locks.tier(), lockkit::Tier::Local);
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`ErrorKind::InvalidConfig`] for an invalid configuration or a tier below `require_tier`;
/// [`ErrorKind::Unsupported`] for a backend not compiled in; the backend's connection errors
/// ([`ErrorKind::Unavailable`], [`ErrorKind::Auth`]).
pub async fn connect(config: &LockkitConfig) -> Result<LockClient> {
    config.validate()?;
    let backend = build_backend(config).await?;
    let tier = backend.tier();
    if let Some(required) = config.require_tier
        && tier < required
    {
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            "config",
            format!(
                "backend `{}` provides tier `{tier}`, but require_tier = \"{required}\"",
                config.backend
            ),
        ));
    }
    LockClient::with_options(backend, &config.namespace, config.lock.clone())
}

async fn build_backend(config: &LockkitConfig) -> Result<SharedBackend> {
    match config.backend {
        BackendKind::Memory => Ok(Arc::new(MemoryBackend::new())),
        #[cfg(feature = "redis")]
        BackendKind::Redis | BackendKind::RedisSentinel => Ok(Arc::new(
            lockkit_redis::RedisBackend::connect(config.redis_config()?).await?,
        )),
        #[cfg(feature = "redis")]
        BackendKind::RedisCluster => Ok(Arc::new(
            lockkit_redis::RedisClusterBackend::connect(config.redis_config()?).await?,
        )),
        #[cfg(feature = "redis")]
        BackendKind::Redlock => Ok(Arc::new(
            lockkit_redis::RedlockBackend::connect(config.redlock_config()?).await?,
        )),
        #[cfg(feature = "zk")]
        BackendKind::Zk => {
            let zk = config.zk_config()?;
            Ok(Arc::new(lockkit_zk::ZkBackend::connect(zk).await?))
        }
        #[cfg(feature = "etcd")]
        BackendKind::Etcd => Ok(Arc::new(
            lockkit_etcd::EtcdBackend::connect(config.etcd_config()?).await?,
        )),
        #[cfg(feature = "postgres")]
        BackendKind::Postgres => Ok(Arc::new(
            lockkit_postgres::PostgresBackend::connect(config.postgres_config()?).await?,
        )),
        #[allow(unreachable_patterns)]
        other => Err(other.not_compiled_in()),
    }
}
