//! What the raw floors run on: lockkit-redis's own Lua scripts (the same files in the same
//! order as the crate joins them, with classic publishing), and the servers a target's URL
//! leads to.

use std::sync::LazyLock;

use redis::aio::ConnectionManager;

use crate::floors::BoxError;

pub(crate) static ACQUIRE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("../../lockkit-redis/scripts/publish_classic.lua"),
        include_str!("../../lockkit-redis/scripts/common.lua"),
        include_str!("../../lockkit-redis/scripts/queue.lua"),
        include_str!("../../lockkit-redis/scripts/mutex_prelude.lua"),
        include_str!("../../lockkit-redis/scripts/acquire.lua")
    ))
});
pub(crate) static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("../../lockkit-redis/scripts/publish_classic.lua"),
        include_str!("../../lockkit-redis/scripts/common.lua"),
        include_str!("../../lockkit-redis/scripts/queue.lua"),
        include_str!("../../lockkit-redis/scripts/mutex_prelude.lua"),
        include_str!("../../lockkit-redis/scripts/release.lua")
    ))
});

pub(crate) async fn redis_at(host: &str) -> Result<ConnectionManager, BoxError> {
    Ok(ConnectionManager::new(redis::Client::open(format!("redis://{host}"))?).await?)
}

/// Connects to the ZooKeeper `hosts` (`h1:p,h2:p`) and creates the persistent node `path`
/// holding `data`, open to anyone (the suite's own scratch node).
pub(crate) async fn zk_with_node(
    hosts: &str,
    path: &str,
    data: &[u8],
) -> Result<zookeeper_client::Client, BoxError> {
    let client = zookeeper_client::Client::connect(hosts).await?;
    client
        .create(
            path,
            data,
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await?;
    Ok(client)
}

pub(crate) fn url_hosts(url: &str) -> Result<Vec<String>, BoxError> {
    let parsed = lockkit_core::backend::url::ConnectionUrl::parse(url)?;
    Ok(parsed
        .hosts
        .iter()
        .map(|h| format!("{}:{}", h.host, h.port.unwrap_or(6379)))
        .collect())
}

pub(crate) fn url_host(url: &str) -> Result<String, BoxError> {
    url_hosts(url)?
        .into_iter()
        .next()
        .ok_or_else(|| "the URL names no host".into())
}

/// Where the Sentinels of a `redis+sentinel://s1,s2/master` URL say the primary is.
pub(crate) async fn sentinel_primary(url: &str) -> Result<String, BoxError> {
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
pub(crate) async fn cluster_primary(url: &str, key: &str) -> Result<String, BoxError> {
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

/// Deletes the lock and fence keys of a run's floor (the fence key would stay for an hour).
pub(crate) async fn delete_keys(nodes: &[ConnectionManager], key: &str) {
    for con in nodes {
        let mut con = con.clone();
        let _: redis::RedisResult<i64> = redis::cmd("DEL")
            .arg(key)
            .arg(format!("{key}:fence"))
            .query_async(&mut con)
            .await;
    }
}

pub(crate) fn release_channel(key: &str) -> String {
    format!("lockkit:released:{key}")
}
