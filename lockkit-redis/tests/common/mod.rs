//! Test support shared by the Redis test files: harnesses over the compose topologies (here),
//! raw access to the servers behind lockkit's back, test ACL users, a cluster's nodes and
//! slots, and the compose members that fault tests stop and restart.
#![allow(dead_code, unreachable_pub)]

mod acl;
mod members;
pub mod private;
mod raw;
mod slots;

// Flat, as the tests name them (`common::connect`); each test binary uses a few.
#[allow(unused_imports)]
pub use acl::{
    AclUser, LOCKKIT_COMMANDS, NOTIFY_COMMANDS, SENTINEL_COMMANDS, SentinelUser, cluster_commands,
    cluster_users,
};
#[allow(unused_imports)]
pub use members::{RestoreMembers, cluster_member, member};
#[allow(unused_imports)]
pub use raw::{command_calls, connect, keys_of, lock_key, primary_addr};
#[allow(unused_imports)]
pub use slots::{
    ClusterNode, cluster_nodes, cluster_owner, cluster_primaries, migrate_slot,
    owner_and_another_primary,
};

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::backend::async_trait;
use lockkit_core::backend::url::ConnectionUrl;
use lockkit_core::testing::{Harness, backend_missing, endpoint};
use lockkit_core::{LockClient, LockKey, LockOptions, Result};
use lockkit_redis::{
    RedisBackend, RedisClusterBackend, RedisConfig, RedlockBackend, RedlockConfig,
};
use redis::aio::MultiplexedConnection;

/// Which topology a harness runs on.
#[derive(Debug, Clone)]
pub enum Topology {
    Single(RedisConfig),
    Sentinel(RedisConfig),
    Redlock(RedlockConfig),
    Cluster(RedisConfig),
}

pub struct RedisHarness {
    pub topology: Topology,
}

/// The harness for `var` (`LOCKKIT_TEST_REDIS_URL`, `..._SENTINEL_URL`, `..._REDLOCK_URL`), or
/// `None` after reporting the topology missing (a failure under LOCKKIT_REQUIRE_BACKENDS=1).
pub async fn harness(var: &str) -> Option<RedisHarness> {
    let Some(url) = endpoint(var) else {
        backend_missing(&format!("{var} (start compose/up.sh)"));
        return None;
    };
    let topology = match ConnectionUrl::parse(&url)
        .expect("a valid test URL")
        .scheme
        .as_str()
    {
        "redlock" => Topology::Redlock(RedlockConfig::from_url(&url).expect("redlock URL")),
        "redis+sentinel" => Topology::Sentinel(RedisConfig::from_url(&url).expect("sentinel URL")),
        "redis+cluster" => Topology::Cluster(RedisConfig::from_url(&url).expect("cluster URL")),
        _ => Topology::Single(RedisConfig::from_url(&url).expect("redis URL")),
    };
    let harness = RedisHarness { topology };
    if let Err(e) = harness.servers().await {
        backend_missing(&format!("{var} = {url} ({e})"));
        return None;
    }
    Some(harness)
}

pub async fn single() -> Option<RedisHarness> {
    harness("LOCKKIT_TEST_REDIS_URL").await
}

pub async fn sentinel() -> Option<RedisHarness> {
    harness("LOCKKIT_TEST_SENTINEL_URL").await
}

pub async fn redlock() -> Option<RedisHarness> {
    harness("LOCKKIT_TEST_REDLOCK_URL").await
}

pub async fn cluster() -> Option<RedisHarness> {
    harness("LOCKKIT_TEST_REDIS_CLUSTER_URL").await
}

impl RedisHarness {
    /// A backend of this topology (its own connections).
    pub async fn backend(&self) -> Result<lockkit_core::backend::SharedBackend> {
        Ok(match &self.topology {
            Topology::Single(c) | Topology::Sentinel(c) => {
                Arc::new(RedisBackend::connect(c.clone()).await?)
            }
            Topology::Redlock(c) => Arc::new(RedlockBackend::connect(c.clone()).await?),
            Topology::Cluster(c) => Arc::new(RedisClusterBackend::connect(c.clone()).await?),
        })
    }

    /// Raw connections to the servers that hold the locks (the primary, or every Redlock node).
    pub async fn servers(&self) -> redis::RedisResult<Vec<MultiplexedConnection>> {
        let addrs = match &self.topology {
            Topology::Single(c) => c.hosts.clone(),
            Topology::Sentinel(c) => vec![primary_addr(c).await?],
            Topology::Redlock(c) => c.nodes.clone(),
            Topology::Cluster(c) => cluster_primaries(c).await?,
        };
        let mut connections = Vec::new();
        for addr in addrs {
            connections.push(connect(&addr).await?);
        }
        Ok(connections)
    }
}

fn to_lockkit(e: redis::RedisError) -> lockkit_core::Error {
    lockkit_core::Error::new(lockkit_core::ErrorKind::Backend, "test", e.to_string())
}

#[async_trait]
impl Harness for RedisHarness {
    async fn client(&self, namespace: &str, options: LockOptions) -> Result<LockClient> {
        LockClient::with_options(self.backend().await?, namespace, options)
    }

    fn ttl(&self) -> Duration {
        match self.topology {
            Topology::Redlock(_) => Duration::from_millis(1000),
            _ => Duration::from_millis(600),
        }
    }

    async fn force_release(&self, key: &LockKey) -> Result<()> {
        let cluster = matches!(self.topology, Topology::Cluster(_));
        for mut con in self.servers().await.map_err(to_lockkit)? {
            let deleted: redis::RedisResult<i64> = redis::cmd("DEL")
                .arg(lock_key(key))
                .query_async(&mut con)
                .await;
            match deleted {
                // The primaries that do not own the key's slot answer MOVED.
                Err(e) if cluster && e.code() == Some("MOVED") => {}
                other => {
                    other.map_err(to_lockkit)?;
                }
            }
        }
        Ok(())
    }

    /// Every key of the namespace (a semaphore's `{ns/name}:sem:*` too) but the fence
    /// counters, which outlive their holders by design (with a TTL of their own).
    async fn leftovers(&self, namespace: &str) -> Result<Vec<String>> {
        let mut left = Vec::new();
        for mut con in self.servers().await.map_err(to_lockkit)? {
            let keys = keys_of(&mut con, namespace).await.map_err(to_lockkit)?;
            left.extend(keys.into_iter().filter(|k| !k.ends_with(":fence")));
        }
        Ok(left)
    }
}
