//! The W2 floors: a contended lock written by hand per backend, each worker with its own
//! client (`floors.rs` says which lock per backend, and why; PostgreSQL has two,
//! `postgres_floors.rs`).

use std::time::Duration;

use futures_util::{FutureExt as _, StreamExt as _};
use redis::aio::ConnectionManager;

use crate::floor_servers::{
    ACQUIRE, RELEASE, cluster_primary, delete_keys, redis_at, release_channel, sentinel_primary,
    url_host, url_hosts, zk_with_node,
};
use crate::floors::BoxError;

/// How long a Redlock floor waiter pauses before it tries again: uniform in this range.
pub(crate) const REDLOCK_RETRY: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_millis(10));

/// The holder's TTL in the contended floors, as lockkit's default.
const CONTENDED_TTL_MS: u64 = 10_000;

/// The W2 floor of one backend: its lock and servers, and a client to set up and clean up
/// with (`floors.rs` says which lock per backend).
pub(crate) enum ContendedFloor {
    /// `acquire.lua` / `release.lua`, waiting on the release channel, on one Redis server.
    Redis {
        con: ConnectionManager,
        host: String,
        key: String,
    },
    /// The same scripts on every Redlock node, retried after a random pause.
    Redlock {
        nodes: Vec<ConnectionManager>,
        hosts: Vec<String>,
        key: String,
    },
    /// zookeeper-client's lock recipe under one parent node.
    Zk {
        client: zookeeper_client::Client,
        hosts: String,
        dir: String,
    },
    /// etcd's `Lock` / `Unlock` RPCs.
    #[cfg(feature = "etcd")]
    Etcd { hosts: Vec<String>, name: String },
    /// `pg_advisory_lock` / `pg_advisory_unlock` on one key, a connection per worker.
    #[cfg(feature = "postgres")]
    PgAdvisory {
        config: Box<lockkit::postgres::tokio_postgres::Config>,
        key: i32,
    },
    /// A lease row per key, taken by polling, a connection per worker.
    #[cfg(feature = "postgres")]
    PgLease {
        config: Box<lockkit::postgres::tokio_postgres::Config>,
        key: String,
    },
}

/// One W2 floor worker: its connections, and the lock it holds.
pub(crate) enum Contender {
    Redis {
        con: ConnectionManager,
        releases: redis::aio::PubSubStream,
        key: String,
        held: Option<String>,
    },
    Redlock {
        nodes: Vec<ConnectionManager>,
        key: String,
        held: Option<String>,
    },
    Zk {
        client: zookeeper_client::Client,
        dir: String,
        held: Option<zookeeper_client::OwnedLockClient>,
    },
    #[cfg(feature = "etcd")]
    Etcd {
        client: Box<lockkit::etcd::etcd_client::Client>,
        name: String,
        lease: i64,
        held: Option<Vec<u8>>,
    },
    #[cfg(feature = "postgres")]
    PgAdvisory(Box<crate::postgres_floors::Advisory>),
    #[cfg(feature = "postgres")]
    PgLease(Box<crate::postgres_floors::Lease>),
}

impl ContendedFloor {
    /// What the floor does, for the table.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            ContendedFloor::Redis { .. } => "Lua scripts, retry on the release message",
            ContendedFloor::Redlock { .. } => "Lua scripts x 5 nodes, retry after 1-10 ms",
            ContendedFloor::Zk { .. } => "zookeeper-client lock recipe",
            #[cfg(feature = "etcd")]
            ContendedFloor::Etcd { .. } => "etcd Lock/Unlock RPCs",
            #[cfg(feature = "postgres")]
            ContendedFloor::PgAdvisory { .. } => "pg_advisory_lock/unlock, waiting in the server",
            #[cfg(feature = "postgres")]
            ContendedFloor::PgLease { .. } => "lease row, retry after 1-10 ms",
        }
    }

    /// The floors of a target of the suite: none (memory), one, or two (PostgreSQL: the
    /// advisory-lock floor, then the lease table).
    pub(crate) async fn connect(target: &str, url: &str) -> Result<Vec<Self>, BoxError> {
        #[cfg(feature = "postgres")]
        if target == "postgres" {
            let config = Box::new(crate::postgres_floors::config(url)?);
            return Ok(vec![
                ContendedFloor::PgAdvisory {
                    config: config.clone(),
                    key: crate::postgres_floors::advisory_key(),
                },
                ContendedFloor::PgLease {
                    config,
                    key: format!("floor/w2-{:08x}", rand::random::<u32>()),
                },
            ]);
        }
        Ok(ContendedFloor::connect_one(target, url)
            .await?
            .into_iter()
            .collect())
    }

    /// The one floor of a target other than PostgreSQL, or `None` where there is none.
    async fn connect_one(target: &str, url: &str) -> Result<Option<Self>, BoxError> {
        let run = format!("{:08x}", rand::random::<u32>());
        Ok(match target {
            "redis" | "redis-sentinel" | "redis-cluster" => {
                let key = format!("{{floor/w2-{run}}}");
                let host = match target {
                    "redis" => url_host(url)?,
                    "redis-sentinel" => sentinel_primary(url).await?,
                    _ => cluster_primary(url, &key).await?,
                };
                Some(ContendedFloor::Redis {
                    con: redis_at(&host).await?,
                    host,
                    key,
                })
            }
            "redlock-5" => {
                let hosts = url_hosts(url)?;
                let mut nodes = Vec::new();
                for host in &hosts {
                    nodes.push(redis_at(host).await?);
                }
                Some(ContendedFloor::Redlock {
                    nodes,
                    hosts,
                    key: format!("{{floor/w2-{run}}}"),
                })
            }
            "zk-3" => {
                let hosts = url_hosts(url)?.join(",");
                let dir = format!("/lockkit-floor-w2-{run}");
                let client = zk_with_node(&hosts, &dir, &[]).await?;
                Some(ContendedFloor::Zk { client, hosts, dir })
            }
            #[cfg(feature = "etcd")]
            "etcd-3" => Some(ContendedFloor::Etcd {
                hosts: url_hosts(url)?,
                name: format!("lockkit-floor/w2-{run}"),
            }),
            _ => None,
        })
    }

    /// A worker with its own client, and what it needs set up before it is timed (a
    /// subscription, a lease).
    pub(crate) async fn contender(&self) -> Result<Contender, BoxError> {
        Ok(match self {
            ContendedFloor::Redis { host, key, .. } => {
                let mut pubsub = redis::Client::open(format!("redis://{host}"))?
                    .get_async_pubsub()
                    .await?;
                pubsub.subscribe(release_channel(key)).await?;
                Contender::Redis {
                    con: redis_at(host).await?,
                    releases: pubsub.into_on_message(),
                    key: key.clone(),
                    held: None,
                }
            }
            ContendedFloor::Redlock { hosts, key, .. } => {
                let mut nodes = Vec::new();
                for host in hosts {
                    nodes.push(redis_at(host).await?);
                }
                Contender::Redlock {
                    nodes,
                    key: key.clone(),
                    held: None,
                }
            }
            ContendedFloor::Zk { hosts, dir, .. } => Contender::Zk {
                client: zookeeper_client::Client::connect(hosts).await?,
                dir: dir.clone(),
                held: None,
            },
            #[cfg(feature = "etcd")]
            ContendedFloor::Etcd { hosts, name } => {
                let mut client =
                    lockkit::etcd::etcd_client::Client::connect(hosts.clone(), None).await?;
                // Long enough for the whole run without keep-alives; revoked at the end.
                let lease = client.lease_grant(300, None).await?.id();
                Contender::Etcd {
                    client: Box::new(client),
                    name: name.clone(),
                    lease,
                    held: None,
                }
            }
            #[cfg(feature = "postgres")]
            ContendedFloor::PgAdvisory { config, key } => Contender::PgAdvisory(Box::new(
                crate::postgres_floors::Advisory::connect(config, *key).await?,
            )),
            #[cfg(feature = "postgres")]
            ContendedFloor::PgLease { config, key } => Contender::PgLease(Box::new(
                crate::postgres_floors::Lease::connect(config, key).await?,
            )),
        })
    }

    /// Removes what the floor created.
    pub(crate) async fn clean_up(self) {
        match self {
            ContendedFloor::Redis { con, key, .. } => delete_keys(&[con], &key).await,
            ContendedFloor::Redlock { nodes, key, .. } => delete_keys(&nodes, &key).await,
            ContendedFloor::Zk { client, dir, .. } => {
                // The last releases are deletes in the background: wait for them a little.
                for _ in 0..20 {
                    match client.delete(&dir, None).await {
                        Err(zookeeper_client::Error::NotEmpty) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        _ => return,
                    }
                }
            }
            #[cfg(feature = "etcd")]
            ContendedFloor::Etcd { .. } => {}
            // Its sessions' advisory locks went with their connections.
            #[cfg(feature = "postgres")]
            ContendedFloor::PgAdvisory { .. } => {}
            #[cfg(feature = "postgres")]
            ContendedFloor::PgLease { config, key } => {
                crate::postgres_floors::delete_leases(&config, &key).await;
            }
        }
    }
}

impl Contender {
    /// Takes the lock, waiting as long as it takes.
    pub(crate) async fn lock(&mut self) -> Result<(), BoxError> {
        match self {
            Contender::Redis {
                con,
                releases,
                key,
                held,
            } => {
                loop {
                    // Messages that arrived before this attempt is sent are of releases it
                    // will see: dropping them spares a useless retry.
                    while let Some(Some(_)) = releases.next().now_or_never() {}
                    let owner = lockkit_core::backend::OwnerToken::generate()?.expose_hex();
                    let (granted, holder_ttl_ms) = acquire_on(con, key, &owner).await?;
                    if granted == 1 {
                        *held = Some(owner);
                        return Ok(());
                    }
                    let holder_gone = Duration::from_millis(holder_ttl_ms.max(1).unsigned_abs());
                    if let Ok(None) = tokio::time::timeout(holder_gone, releases.next()).await {
                        return Err("the pub/sub connection closed".into());
                    }
                }
            }
            Contender::Redlock { nodes, key, held } => loop {
                let owner = lockkit_core::backend::OwnerToken::generate()?.expose_hex();
                let replies = futures_util::future::join_all(nodes.iter().map(|con| {
                    let (mut con, key, owner) = (con.clone(), key.clone(), owner.clone());
                    async move { acquire_on(&mut con, &key, &owner).await }
                }))
                .await;
                let granted = replies.iter().filter(|r| matches!(r, Ok((1, _)))).count();
                let answered = replies.iter().filter(|r| r.is_ok()).count();
                let quorum = nodes.len() / 2 + 1;
                if granted >= quorum {
                    *held = Some(owner);
                    return Ok(());
                }
                if granted > 0 || answered < nodes.len() {
                    release_on_all(nodes, key, &owner).await;
                }
                if answered < quorum {
                    return Err(format!("only {answered} Redlock nodes answered").into());
                }
                let pause = REDLOCK_RETRY.0
                    + (REDLOCK_RETRY.1 - REDLOCK_RETRY.0).mul_f64(rand::random::<f64>());
                tokio::time::sleep(pause).await;
            },
            Contender::Zk { client, dir, held } => {
                let lock = client
                    .lock(
                        zookeeper_client::LockPrefix::new_curator(dir, "lock-")?,
                        &[],
                        zookeeper_client::Acls::anyone_all(),
                    )
                    .await?;
                *held = Some(lock.into_owned());
                Ok(())
            }
            #[cfg(feature = "etcd")]
            Contender::Etcd {
                client,
                name,
                lease,
                held,
            } => {
                let options = lockkit::etcd::etcd_client::LockOptions::new().with_lease(*lease);
                let granted = client.lock(name.as_str(), Some(options)).await?;
                *held = Some(granted.key().to_vec());
                Ok(())
            }
            #[cfg(feature = "postgres")]
            Contender::PgAdvisory(contender) => contender.lock().await,
            #[cfg(feature = "postgres")]
            Contender::PgLease(contender) => contender.lock().await,
        }
    }

    /// Releases the lock taken by [`Contender::lock`].
    pub(crate) async fn unlock(&mut self) -> Result<(), BoxError> {
        match self {
            Contender::Redis { con, key, held, .. } => {
                let owner = held.take().ok_or("not held")?;
                let released: i64 = RELEASE
                    .key(key.as_str())
                    .arg(&owner)
                    .arg(release_channel(key))
                    .invoke_async(con)
                    .await?;
                if released != 1 {
                    return Err("the floor's lock was gone at release".into());
                }
                Ok(())
            }
            Contender::Redlock { nodes, key, held } => {
                let owner = held.take().ok_or("not held")?;
                let released = release_on_all(nodes, key, &owner).await;
                if released < nodes.len() / 2 + 1 {
                    return Err(format!("only {released} Redlock nodes released").into());
                }
                Ok(())
            }
            Contender::Zk { held, .. } => {
                // Deleted in the background, as the crate releases its locks.
                drop(held.take().ok_or("not held")?);
                Ok(())
            }
            #[cfg(feature = "etcd")]
            Contender::Etcd { client, held, .. } => {
                client.unlock(held.take().ok_or("not held")?).await?;
                Ok(())
            }
            #[cfg(feature = "postgres")]
            Contender::PgAdvisory(contender) => contender.unlock().await,
            #[cfg(feature = "postgres")]
            Contender::PgLease(contender) => contender.unlock().await,
        }
    }

    /// Removes what the worker created.
    pub(crate) async fn clean_up(self) {
        #[cfg(feature = "etcd")]
        if let Contender::Etcd {
            mut client, lease, ..
        } = self
        {
            let _ = client.lease_revoke(lease).await;
        }
    }
}

/// `acquire.lua` for `owner`: `(1, token)` when granted, `(0, holder's PTTL in ms)` otherwise.
async fn acquire_on(
    con: &mut ConnectionManager,
    key: &str,
    owner: &str,
) -> redis::RedisResult<(i64, i64)> {
    ACQUIRE
        .key(key)
        .key(format!("{key}:fence"))
        .arg(owner)
        .arg(CONTENDED_TTL_MS)
        .arg(3_600_000)
        .invoke_async(con)
        .await
}

/// `release.lua` on every node; how many released. A node that fails keeps the key until its
/// TTL.
async fn release_on_all(nodes: &[ConnectionManager], key: &str, owner: &str) -> usize {
    futures_util::future::join_all(nodes.iter().map(|con| {
        let mut con = con.clone();
        let mut invocation = RELEASE.key(key);
        invocation.arg(owner).arg(release_channel(key));
        async move { invocation.invoke_async::<i64>(&mut con).await }
    }))
    .await
    .iter()
    .filter(|reply| matches!(reply, Ok(1)))
    .count()
}
