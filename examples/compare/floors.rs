//! The raw-protocol floors per backend, so the table can say what lockkit itself costs.
//!
//! W1 ([`Floor`]): the same server work as one lockkit acquire+release, done by hand with the
//! same client crate.
//!
//! W2 ([`ContendedFloor`]): a contended lock written by hand over the same protocol and client
//! crate, doing the same workload, each worker with its own client (connections, session),
//! as each lockkit and rslock worker has. There is no single "same server work" for waiting, so each
//! floor is the best waiting a careful hand-written client does with that protocol, not the
//! simplest one:
//! - Redis (single, the Sentinel primary directly, and the cluster primary that serves the
//!   floor's key directly): lockkit-redis's own `acquire.lua` and
//!   `release.lua` (publishing the classic way, also on the cluster, where lockkit uses
//!   sharded pub/sub). Each worker subscribes once, up front, to the release channel that
//!   `release.lua` publishes on; a contended attempt waits for the next release message, or
//!   for the holder's remaining TTL (the `PTTL` the script returns) if the holder dies
//!   without releasing, and then retries at once, without jitter: Redisson's waiting. It
//!   beats the usual `SET NX PX` loop with a fixed sleep, which hands over one sleep late.
//! - Redlock-5: the same two scripts sent to the five nodes in parallel, granted when a
//!   majority grants, otherwise released (where any node granted) and retried after a pause of
//!   [`REDLOCK_RETRY`]: the retry loop of the Redlock clients (redsync pauses 50-250 ms),
//!   scaled down to a local network. Unlike the W1 floor, which is done when a majority
//!   answered, it waits for the answers of all five nodes, to know where to release. Redlock
//!   clients have no release notification across nodes: they poll.
//! - etcd: etcd's own lock, the `Lock` / `Unlock` RPCs of the v3lock service (the server runs
//!   the `concurrency.Mutex` recipe: a key per waiter on its lease, each waiting for the
//!   deletion of its predecessor), one lease per worker as the RPC requires. The recipe
//!   watches the predecessor from a past revision, which etcd serves from its 100 ms resync
//!   loop rather than at once: lockkit-etcd avoids that, so it can beat this floor.
//! - ZooKeeper: the lock recipe of the zookeeper-client crate (`Client::lock`, a
//!   Curator-style ephemeral sequential node per waiter, each watching its predecessor), used
//!   as its docs show: the lock is released by dropping it, which deletes the node in the
//!   background (the session keeps requests in order, so the next create comes after it).
//! - memory: no floor.

use std::sync::LazyLock;
use std::time::Duration;

use futures_util::{FutureExt as _, StreamExt as _};
use redis::aio::ConnectionManager;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A hand-written acquire+release loop against one backend's servers.
pub(crate) enum Floor {
    /// The two Lua scripts of lockkit-redis (acquire, release) on one Redis server, on a key
    /// of this run's.
    Redis(ConnectionManager, String),
    /// The same two scripts sent to every Redlock node in parallel, each step done when a
    /// majority answered, as lockkit's is.
    Redlock(Vec<ConnectionManager>, String),
    /// `create(EPHEMERAL_SEQUENTIAL)` + `get_children` + `delete` under one parent.
    Zk(zookeeper_client::Client, String),
    /// A `txn` that puts the key on a lease if it is absent, then a `delete`.
    #[cfg(feature = "etcd")]
    Etcd(Box<lockkit::etcd::etcd_client::Client>, String, i64),
}

static ACQUIRE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("../../lockkit-redis/scripts/publish_classic.lua"),
        include_str!("../../lockkit-redis/scripts/common.lua"),
        include_str!("../../lockkit-redis/scripts/mutex_prelude.lua"),
        include_str!("../../lockkit-redis/scripts/acquire.lua")
    ))
});
static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("../../lockkit-redis/scripts/publish_classic.lua"),
        include_str!("../../lockkit-redis/scripts/common.lua"),
        include_str!("../../lockkit-redis/scripts/mutex_prelude.lua"),
        include_str!("../../lockkit-redis/scripts/release.lua")
    ))
});

impl Floor {
    /// What the floor does, for the table.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Floor::Redis(..) => "2 Lua calls",
            Floor::Redlock(..) => "2 Lua calls x 5 nodes, parallel, first 3 answers",
            Floor::Zk(..) => "create + get_children + delete",
            #[cfg(feature = "etcd")]
            Floor::Etcd(..) => "txn put-if-absent + delete",
        }
    }

    /// The floor for a target of the suite, or `None` where there is none (memory).
    pub(crate) async fn connect(target: &str, url: &str) -> Result<Option<Floor>, BoxError> {
        // A key of this run's: another run of the suite on the same servers must not hold it.
        let key = format!("{{floor/w1-{:08x}}}", rand::random::<u32>());
        Ok(match target {
            "redis" => Some(Floor::Redis(redis_at(&url_host(url)?).await?, key)),
            "redis-sentinel" => Some(Floor::Redis(
                redis_at(&sentinel_primary(url).await?).await?,
                key,
            )),
            "redis-cluster" => Some(Floor::Redis(
                redis_at(&cluster_primary(url, &key).await?).await?,
                key,
            )),
            "redlock-5" => {
                let mut nodes = Vec::new();
                for host in url_hosts(url)? {
                    nodes.push(redis_at(&host).await?);
                }
                Some(Floor::Redlock(nodes, key))
            }
            "zk-3" => {
                let client = zookeeper_client::Client::connect(&url_hosts(url)?.join(",")).await?;
                let parent = format!("/lockkit-floor-{:08x}", rand::random::<u32>());
                client
                    .create(
                        &parent,
                        &[],
                        &zookeeper_client::CreateMode::Persistent
                            .with_acls(zookeeper_client::Acls::anyone_all()),
                    )
                    .await?;
                Some(Floor::Zk(client, parent))
            }
            #[cfg(feature = "etcd")]
            "etcd-3" => {
                let endpoints: Vec<String> = url_hosts(url)?;
                let mut client =
                    lockkit::etcd::etcd_client::Client::connect(endpoints, None).await?;
                let lease = client.lease_grant(30, None).await?.id();
                let key = format!("lockkit-floor/{:08x}", rand::random::<u32>());
                Some(Floor::Etcd(Box::new(client), key, lease))
            }
            _ => None,
        })
    }

    /// One acquire+release.
    pub(crate) async fn cycle(&mut self) -> Result<(), BoxError> {
        match self {
            Floor::Redis(con, key) => redis_cycle(con, key).await,
            Floor::Redlock(nodes, key) => {
                // A straggler of the previous cycle's release (the rest of a fan-out is
                // driven in the background) can still be on its way to a node: like any
                // Redlock client, the floor gives back a minority grant and tries again.
                for _ in 0..100 {
                    let owner = lockkit_core::backend::OwnerToken::generate()?.expose_hex();
                    let acquired = majority_answers(nodes.iter().map(|con| {
                        let mut con = con.clone();
                        let mut invocation = ACQUIRE.key(key.as_str());
                        invocation
                            .key(format!("{key}:fence"))
                            .arg(&owner)
                            .arg(10_000)
                            .arg(3_600_000);
                        async move { invocation.invoke_async::<(i64, i64)>(&mut con).await }
                    }))
                    .await;
                    let mut granted = true;
                    for reply in acquired {
                        granted &= reply?.0 == 1;
                    }
                    let released = majority_answers(nodes.iter().map(|con| {
                        let mut con = con.clone();
                        let mut invocation = RELEASE.key(key.as_str());
                        invocation.arg(&owner).arg(release_channel(key));
                        async move { invocation.invoke_async::<i64>(&mut con).await }
                    }))
                    .await;
                    for reply in released {
                        reply?;
                    }
                    if granted {
                        return Ok(());
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                Err("the floor's key stayed taken for 100 attempts".into())
            }
            Floor::Zk(client, parent) => {
                let prefix = format!("{parent}/lock-");
                let (_, sequence) = client
                    .create(
                        &prefix,
                        &[],
                        &zookeeper_client::CreateMode::EphemeralSequential
                            .with_acls(zookeeper_client::Acls::anyone_all()),
                    )
                    .await?;
                client.list_children(parent).await?;
                client.delete(&format!("{prefix}{sequence}"), None).await?;
                Ok(())
            }
            #[cfg(feature = "etcd")]
            Floor::Etcd(client, key, lease) => {
                use lockkit::etcd::etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
                let put = Txn::new()
                    .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key.as_str(),
                        "owner",
                        Some(PutOptions::new().with_lease(*lease)),
                    )]);
                client.txn(put).await?;
                client.delete(key.as_str(), None).await?;
                Ok(())
            }
        }
    }

    /// Removes what the floor created.
    pub(crate) async fn clean_up(self) {
        match self {
            Floor::Redis(con, key) => delete_keys(&[con], &key).await,
            Floor::Redlock(nodes, key) => delete_keys(&nodes, &key).await,
            Floor::Zk(client, parent) => {
                let _ = client.delete(&parent, None).await;
            }
            #[cfg(feature = "etcd")]
            Floor::Etcd(mut client, _, lease) => {
                let _ = client.lease_revoke(lease).await;
            }
        }
    }
}

/// The first answers of a majority of `requests`, all sent at once, as a Redlock client
/// waits. The others are driven to their end in the background: a redis request future
/// dropped early may never have been sent, which would leave its key on that node.
async fn majority_answers<T: Send + 'static>(
    requests: impl Iterator<Item = impl Future<Output = T> + Send + 'static>,
) -> Vec<T> {
    let mut pending: futures_util::stream::FuturesUnordered<_> = requests.collect();
    let majority = pending.len() / 2 + 1;
    let mut answers = Vec::with_capacity(majority);
    while answers.len() < majority {
        match pending.next().await {
            Some(answer) => answers.push(answer),
            None => break,
        }
    }
    if !pending.is_empty() {
        tokio::spawn(pending.for_each(|_| std::future::ready(())));
    }
    answers
}

async fn redis_cycle(con: &mut ConnectionManager, key: &str) -> Result<(), BoxError> {
    let owner = lockkit_core::backend::OwnerToken::generate()?.expose_hex();
    let (granted, _): (i64, i64) = ACQUIRE
        .key(key)
        .key(format!("{key}:fence"))
        .arg(&owner)
        .arg(10_000)
        .arg(3_600_000)
        .invoke_async(con)
        .await?;
    if granted != 1 {
        return Err("the floor's key was taken".into());
    }
    let _: i64 = RELEASE
        .key(key)
        .arg(&owner)
        .arg(format!("lockkit:released:{key}"))
        .invoke_async(con)
        .await?;
    Ok(())
}

async fn redis_at(host: &str) -> Result<ConnectionManager, BoxError> {
    Ok(ConnectionManager::new(redis::Client::open(format!("redis://{host}"))?).await?)
}

pub(crate) fn url_hosts(url: &str) -> Result<Vec<String>, BoxError> {
    let parsed = lockkit_core::backend::url::ConnectionUrl::parse(url)?;
    Ok(parsed
        .hosts
        .iter()
        .map(|h| format!("{}:{}", h.host, h.port.unwrap_or(6379)))
        .collect())
}

fn url_host(url: &str) -> Result<String, BoxError> {
    url_hosts(url)?
        .into_iter()
        .next()
        .ok_or_else(|| "the URL names no host".into())
}

/// Where the Sentinels of a `redis+sentinel://s1,s2/master` URL say the primary is.
async fn sentinel_primary(url: &str) -> Result<String, BoxError> {
    let parsed = lockkit_core::backend::url::ConnectionUrl::parse(url)?;
    let master = parsed
        .path
        .trim_matches('/')
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    for host in url_hosts(url)? {
        let Ok(client) = redis::Client::open(format!("redis://{host}")) else {
            continue;
        };
        let Ok(mut con) = client.get_multiplexed_async_connection().await else {
            continue;
        };
        let reply: redis::RedisResult<Option<(String, String)>> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&master)
            .query_async(&mut con)
            .await;
        if let Ok(Some((host, port))) = reply {
            return Ok(format!("{host}:{port}"));
        }
    }
    Err(format!("no Sentinel knows the primary {master:?}").into())
}

/// The cluster primary that serves `key`: the node a `MOVED` answer names, or the first node
/// of the `redis+cluster://` URL if it serves the key itself.
async fn cluster_primary(url: &str, key: &str) -> Result<String, BoxError> {
    let seed = url_host(url)?;
    let mut con = redis::Client::open(format!("redis://{seed}"))?
        .get_multiplexed_async_connection()
        .await?;
    match redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(&mut con)
        .await
    {
        Ok(_) => Ok(seed),
        Err(e) => match e.redirect_node() {
            Some((addr, _slot)) => Ok(addr.to_owned()),
            None => Err(e.into()),
        },
    }
}

/// How long a Redlock floor waiter pauses before it tries again: uniform in this range.
pub(crate) const REDLOCK_RETRY: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_millis(10));

/// The holder's TTL in the contended floors, as lockkit's default.
const CONTENDED_TTL_MS: u64 = 10_000;

/// The W2 floor of one backend: its lock and servers, and a client to set up and clean up
/// with (see the module docs for the choice of lock per backend).
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
        }
    }

    /// The floor for a target of the suite, or `None` where there is none (memory).
    pub(crate) async fn connect(target: &str, url: &str) -> Result<Option<Self>, BoxError> {
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
                let client = zookeeper_client::Client::connect(&hosts).await?;
                let dir = format!("/lockkit-floor-w2-{run}");
                client
                    .create(
                        &dir,
                        &[],
                        &zookeeper_client::CreateMode::Persistent
                            .with_acls(zookeeper_client::Acls::anyone_all()),
                    )
                    .await?;
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

/// Deletes the lock and fence keys of a run's floor (the fence key would stay for an hour).
async fn delete_keys(nodes: &[ConnectionManager], key: &str) {
    for con in nodes {
        let mut con = con.clone();
        let _: redis::RedisResult<i64> = redis::cmd("DEL")
            .arg(key)
            .arg(format!("{key}:fence"))
            .query_async(&mut con)
            .await;
    }
}

fn release_channel(key: &str) -> String {
    format!("lockkit:released:{key}")
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
