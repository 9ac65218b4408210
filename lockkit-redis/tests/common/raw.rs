//! Raw access to the servers behind lockkit's back: plain connections, where the Sentinels
//! say the primary is, the lock keys' layout, a namespace's keys, command counts.

use std::time::Duration;

use lockkit_core::LockKey;
use lockkit_redis::RedisConfig;
use redis::aio::MultiplexedConnection;

/// A plain connection to `host:port`.
pub async fn connect(addr: &str) -> redis::RedisResult<MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://{addr}"))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_response_timeout(Some(Duration::from_secs(2)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// Where the Sentinels say the primary is.
pub async fn primary_addr(config: &RedisConfig) -> redis::RedisResult<String> {
    let master = config.sentinel_master.clone().unwrap_or_default();
    let mut last = None;
    for sentinel in &config.hosts {
        match connect(sentinel).await {
            Ok(mut con) => {
                let reply: redis::RedisResult<Option<(String, String)>> = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&master)
                    .query_async(&mut con)
                    .await;
                match reply {
                    Ok(Some((host, port))) => return Ok(format!("{host}:{port}")),
                    Ok(None) => {}
                    Err(e) => last = Some(e),
                }
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| (redis::ErrorKind::Io, "no Sentinel knows the primary").into()))
}

/// The Redis lock key of `key` (the layout the crate documents).
pub fn lock_key(key: &LockKey) -> String {
    format!("{{{}/{}}}", key.namespace(), key.name())
}

/// Every key of `namespace` on `con`.
pub async fn keys_of(
    con: &mut MultiplexedConnection,
    namespace: &str,
) -> redis::RedisResult<Vec<String>> {
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{{{namespace}/*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(con)
            .await?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Parses `INFO commandstats` into (command, calls).
pub async fn command_calls(
    con: &mut MultiplexedConnection,
) -> std::collections::HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|s| s.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}
