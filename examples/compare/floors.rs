//! The raw-protocol floors per backend, so the table can say what lockkit itself costs.
//!
//! W1 ([`Floor`]): the same server work as one lockkit acquire+release, done by hand with the
//! same client crate.
//!
//! W2 ([`ContendedFloor`](crate::contended_floors::ContendedFloor)): a contended lock written by hand over the same protocol and client
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
//!   [`REDLOCK_RETRY`](crate::contended_floors::REDLOCK_RETRY): the retry loop of the Redlock clients (redsync pauses 50-250 ms),
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
//! - PostgreSQL, two floors (`postgres_floors.rs`), each in W1 and W2: session-level
//!   advisory locks (`pg_try_advisory_lock` in W1; `pg_advisory_lock`, waiting in the server,
//!   in W2; then `pg_advisory_unlock`), what most PostgreSQL lock libraries do and the
//!   cheapest lock the server has (no write at all); and a lease table (an `INSERT ... ON
//!   CONFLICT DO UPDATE` that takes a free or expired key, a `DELETE` that gives it back),
//!   polling after a random 1-10 ms pause while the key is held, as the Redlock floor does.
//!   The second is the closest to what lockkit-postgres keeps (a lease row on the server's
//!   clock), without its queue, fencing sequence or notifications.
//! - memory: no floor.
//!
//! Both use `floor_servers.rs` for lockkit-redis's scripts and for finding the servers.

use futures_util::StreamExt as _;
use redis::aio::ConnectionManager;

use crate::floor_servers::{
    ACQUIRE, RELEASE, cluster_primary, delete_keys, redis_at, release_channel, sentinel_primary,
    url_host, url_hosts, zk_with_node,
};

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
    /// `pg_try_advisory_lock` + `pg_advisory_unlock` on one connection.
    #[cfg(feature = "postgres")]
    PgAdvisory(Box<crate::postgres_floors::Advisory>),
    /// A lease row's `INSERT ... ON CONFLICT` + `DELETE` on one connection.
    #[cfg(feature = "postgres")]
    PgLease(Box<crate::postgres_floors::Lease>),
}

impl Floor {
    /// What the floor does, for the table.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Floor::Redis(..) => "2 Lua calls",
            Floor::Redlock(..) => "2 Lua calls x 5 nodes, parallel, first 3 answers",
            Floor::Zk(..) => "create + get_children + delete",
            #[cfg(feature = "etcd")]
            Floor::Etcd(..) => "txn put-if-absent + delete",
            #[cfg(feature = "postgres")]
            Floor::PgAdvisory(..) => "pg_try_advisory_lock + pg_advisory_unlock",
            #[cfg(feature = "postgres")]
            Floor::PgLease(..) => "lease row: INSERT ON CONFLICT + DELETE",
        }
    }

    /// The floors of a target of the suite: none (memory), one, or two (PostgreSQL: the
    /// advisory-lock floor, then the lease table).
    pub(crate) async fn connect(target: &str, url: &str) -> Result<Vec<Floor>, BoxError> {
        #[cfg(feature = "postgres")]
        if target == "postgres" {
            use crate::postgres_floors::{Advisory, Lease, advisory_key, config};
            let config = config(url)?;
            let key = format!("floor/w1-{:08x}", rand::random::<u32>());
            return Ok(vec![
                Floor::PgAdvisory(Box::new(Advisory::connect(&config, advisory_key()).await?)),
                Floor::PgLease(Box::new(Lease::connect(&config, &key).await?)),
            ]);
        }
        Ok(Floor::connect_one(target, url).await?.into_iter().collect())
    }

    /// The one floor of a target other than PostgreSQL, or `None` where there is none.
    async fn connect_one(target: &str, url: &str) -> Result<Option<Floor>, BoxError> {
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
                let parent = format!("/lockkit-floor-{:08x}", rand::random::<u32>());
                let client = zk_with_node(&url_hosts(url)?.join(","), &parent, &[]).await?;
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
            #[cfg(feature = "postgres")]
            Floor::PgAdvisory(floor) => floor.cycle().await,
            #[cfg(feature = "postgres")]
            Floor::PgLease(floor) => floor.cycle().await,
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
            // Its session's advisory locks go with its connection.
            #[cfg(feature = "postgres")]
            Floor::PgAdvisory(_) => {}
            #[cfg(feature = "postgres")]
            Floor::PgLease(floor) => floor.clean_up().await,
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
