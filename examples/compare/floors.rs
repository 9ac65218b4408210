//! The raw-protocol floor of W1 per backend: the same server work as one lockkit
//! acquire+release, done by hand with the same client crate, so the table can say what
//! lockkit itself costs.

use std::sync::LazyLock;

use redis::aio::ConnectionManager;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A hand-written acquire+release loop against one backend's servers.
pub(crate) enum Floor {
    /// The two Lua scripts of lockkit-redis (acquire, release) on one Redis server.
    Redis(ConnectionManager),
    /// The same two scripts sent to every Redlock node in parallel.
    Redlock(Vec<ConnectionManager>),
    /// `create(EPHEMERAL_SEQUENTIAL)` + `get_children` + `delete` under one parent.
    Zk(zookeeper_client::Client, String),
    /// A `txn` that puts the key on a lease if it is absent, then a `delete`.
    #[cfg(feature = "etcd")]
    Etcd(Box<lockkit::etcd::etcd_client::Client>, String, i64),
}

static ACQUIRE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lockkit-redis/scripts/acquire.lua")));
static RELEASE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lockkit-redis/scripts/release.lua")));

impl Floor {
    /// What the floor does, for the table.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Floor::Redis(_) => "2 Lua calls",
            Floor::Redlock(_) => "2 Lua calls x 5 nodes, parallel",
            Floor::Zk(..) => "create + get_children + delete",
            #[cfg(feature = "etcd")]
            Floor::Etcd(..) => "txn put-if-absent + delete",
        }
    }

    /// The floor for a target of the suite, or `None` where there is none (memory).
    pub(crate) async fn connect(target: &str, url: &str) -> Result<Option<Floor>, BoxError> {
        Ok(match target {
            "redis" => Some(Floor::Redis(redis_at(&url_host(url)?).await?)),
            "redis-sentinel" => Some(Floor::Redis(redis_at(&sentinel_primary(url).await?).await?)),
            "redlock-5" => {
                let mut nodes = Vec::new();
                for host in url_hosts(url)? {
                    nodes.push(redis_at(&host).await?);
                }
                Some(Floor::Redlock(nodes))
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
            Floor::Redis(con) => redis_cycle(con, "{floor/raw}").await,
            Floor::Redlock(nodes) => {
                let owner = lockkit_core::OwnerToken::generate()?.expose_hex();
                let acquired = futures_util::future::join_all(nodes.iter().map(|con| {
                    let mut con = con.clone();
                    let mut invocation = ACQUIRE.key("{floor/fanout}");
                    invocation
                        .key("{floor/fanout}:fence")
                        .arg(&owner)
                        .arg(10_000)
                        .arg(3_600_000);
                    async move { invocation.invoke_async::<(i64, i64)>(&mut con).await }
                }))
                .await;
                for reply in acquired {
                    reply?;
                }
                let released = futures_util::future::join_all(nodes.iter().map(|con| {
                    let mut con = con.clone();
                    let mut invocation = RELEASE.key("{floor/fanout}");
                    invocation
                        .arg(&owner)
                        .arg("lockkit:released:{floor/fanout}");
                    async move { invocation.invoke_async::<i64>(&mut con).await }
                }))
                .await;
                for reply in released {
                    reply?;
                }
                Ok(())
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
            Floor::Zk(client, parent) => {
                let _ = client.delete(&parent, None).await;
            }
            #[cfg(feature = "etcd")]
            Floor::Etcd(mut client, _, lease) => {
                let _ = client.lease_revoke(lease).await;
            }
            _ => {}
        }
    }
}

async fn redis_cycle(con: &mut ConnectionManager, key: &str) -> Result<(), BoxError> {
    let owner = lockkit_core::OwnerToken::generate()?.expose_hex();
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

fn url_hosts(url: &str) -> Result<Vec<String>, BoxError> {
    let parsed = lockkit_core::url::ConnectionUrl::parse(url)?;
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
    let parsed = lockkit_core::url::ConnectionUrl::parse(url)?;
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
