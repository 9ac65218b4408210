//! Test support shared by the Redis test files: harnesses over the compose topologies and raw
//! access to the servers behind lockkit's back.
#![allow(dead_code, unreachable_pub)]

pub mod private;

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

/// The primaries of the cluster that `config`'s nodes belong to (see [`cluster_nodes`]).
pub async fn cluster_primaries(config: &RedisConfig) -> redis::RedisResult<Vec<String>> {
    Ok(cluster_nodes(config)
        .await
        .into_iter()
        .filter(|node| node.primary)
        .map(|node| node.addr)
        .collect())
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

/// Puts the named members back when dropped (at the end of a fault test, even by a panic):
/// resumes the paused ones and restarts the ones that are down.
pub struct RestoreMembers(pub &'static [&'static str]);

impl Drop for RestoreMembers {
    fn drop(&mut self) {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../compose/member.sh");
        for name in self.0 {
            let _ = std::process::Command::new(&script)
                .args(["resume", name])
                .output();
            let up = std::process::Command::new(&script)
                .args(["status", name])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(" up "));
            if !up {
                let _ = std::process::Command::new(&script)
                    .args(["restart", name])
                    .output();
            }
        }
    }
}

/// Runs `compose/member.sh ACTION NAME` and fails the test if it fails.
pub fn member(action: &str, name: &str) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../compose/member.sh");
    let output = std::process::Command::new(script)
        .args([action, name])
        .output()
        .expect("run compose/member.sh");
    assert!(
        output.status.success(),
        "compose/member.sh {action} {name} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
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

/// The commands lockkit runs on a Redis server, the ones its scripts call included (Redis
/// checks those against the caller's ACL too). The minimal ACL in the README is made of these.
pub const LOCKKIT_COMMANDS: &[&str] = &[
    "+evalsha",
    "+script|load",
    "+ping",
    "+hello",
    "+get",
    "+set",
    "+incr",
    "+pexpire",
    "+pttl",
    "+time",
    "+del",
    "+publish",
    "+info",
    "+zadd",
    "+zrem",
    "+zcard",
    "+zscore",
    "+zrange",
    "+zrangebyscore",
    "+hget",
    "+hset",
    "+hdel",
];

/// What release notifications need on top of [`LOCKKIT_COMMANDS`].
pub const NOTIFY_COMMANDS: &[&str] = &["+subscribe", "+unsubscribe"];

/// What a Redis Cluster's nodes need, [`LOCKKIT_COMMANDS`] with sharded pub/sub in place of
/// the classic kind: the map of slots, the scripts' `SPUBLISH`, and with `notify`, the
/// waiters' `SSUBSCRIBE` and `SUNSUBSCRIBE`.
pub fn cluster_commands(notify: bool) -> Vec<&'static str> {
    let mut commands: Vec<&str> = LOCKKIT_COMMANDS
        .iter()
        .copied()
        .filter(|c| *c != "+publish")
        .chain(["+cluster|slots", "+spublish"])
        .collect();
    if notify {
        commands.extend(["+ssubscribe", "+sunsubscribe"]);
    }
    commands
}

/// One ACL user, with one name and password, on every node of the cluster (replicas too:
/// ACL users are not replicated), and `config` logging in as it.
pub async fn cluster_users(
    config: &RedisConfig,
    namespace: &str,
    commands: &[&str],
) -> (Vec<AclUser>, RedisConfig) {
    let name = format!("lk-test-{:08x}", rand::random::<u32>());
    let password = format!("pw-{:032x}", rand::random::<u128>());
    let mut users = Vec::new();
    for node in cluster_nodes(config).await {
        users.push(
            AclUser::create_as(
                &node.addr,
                name.clone(),
                password.clone(),
                namespace,
                commands,
            )
            .await,
        );
    }
    let mut config = config.clone();
    config.username = Some(name);
    config.password = Some(password);
    (users, config)
}

/// What a Sentinel-managed primary needs on top: `ROLE` to check it is the primary, `WAIT`
/// for `min_replicas`.
pub const SENTINEL_COMMANDS: &[&str] = &["+role", "+wait"];

/// An ACL user created for one test on the server at `addr`, deleted (with a blocking
/// connection, so also when the test panics) when dropped.
pub struct AclUser {
    pub name: String,
    pub password: String,
    addr: String,
}

impl AclUser {
    /// Creates a user limited to `namespace`'s keys (`~{namespace/*`), release channels
    /// (`&lockkit:released:{namespace/*`) and the clients' inboxes (`&lockkit:inbox:*`), with
    /// `commands` and nothing else.
    pub async fn create(addr: &str, namespace: &str, commands: &[&str]) -> AclUser {
        let name = format!("lk-test-{:08x}", rand::random::<u32>());
        let password = format!("pw-{:032x}", rand::random::<u128>());
        AclUser::create_as(addr, name, password, namespace, commands).await
    }

    /// As [`AclUser::create`], with a given name and password (one user on several servers).
    pub async fn create_as(
        addr: &str,
        name: String,
        password: String,
        namespace: &str,
        commands: &[&str],
    ) -> AclUser {
        let mut admin = connect(addr).await.expect("admin connection");
        let mut setuser = redis::cmd("ACL");
        setuser
            .arg("SETUSER")
            .arg(&name)
            .arg("reset")
            .arg("on")
            .arg(format!(">{password}"))
            .arg(format!("~{{{namespace}/*"))
            .arg(format!("&lockkit:released:{{{namespace}/*"))
            .arg("&lockkit:inbox:*")
            .arg("-@all");
        for command in commands {
            setuser.arg(*command);
        }
        let () = setuser.query_async(&mut admin).await.expect("ACL SETUSER");
        AclUser {
            name,
            password,
            addr: addr.to_owned(),
        }
    }

    /// The ACL denials the server logged for this user: `(reason, object)`, such as
    /// `("key", "{ns/job}")` or `("command", "subscribe")`.
    pub async fn denials(&self) -> Vec<(String, String)> {
        let mut admin = connect(&self.addr).await.expect("admin connection");
        let log: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("ACL")
            .arg("LOG")
            .query_async(&mut admin)
            .await
            .expect("ACL LOG");
        let text = |v: Option<&redis::Value>| match v {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(redis::Value::SimpleString(s)) => s.clone(),
            other => format!("{other:?}"),
        };
        log.iter()
            .filter(|entry| text(entry.get("username")) == self.name)
            .map(|entry| (text(entry.get("reason")), text(entry.get("object"))))
            .collect()
    }
}

impl Drop for AclUser {
    fn drop(&mut self) {
        let deleted = redis::Client::open(format!("redis://{}", self.addr))
            .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(2)))
            .and_then(|mut con| {
                redis::cmd("ACL")
                    .arg("DELUSER")
                    .arg(&self.name)
                    .query::<i64>(&mut con)
            });
        if let Err(e) = deleted {
            eprintln!("could not delete the test ACL user {}: {e}", self.name);
        }
    }
}

/// An ACL user created on every Sentinel of a group for one test, with only what lockkit asks
/// a Sentinel; deleted from each (with a blocking connection, so also when the test panics)
/// when dropped.
pub struct SentinelUser {
    name: String,
    sentinels: Vec<String>,
}

impl SentinelUser {
    /// The one command lockkit sends a Sentinel: the primary's address.
    pub const COMMANDS: &[&str] = &["+sentinel|get-master-addr-by-name"];

    pub async fn create(sentinels: &[String], name: &str, password: &str) -> SentinelUser {
        for sentinel in sentinels {
            let mut admin = connect(sentinel).await.expect("admin connection");
            let mut setuser = redis::cmd("ACL");
            setuser
                .arg("SETUSER")
                .arg(name)
                .arg("reset")
                .arg("on")
                .arg(format!(">{password}"))
                .arg("-@all");
            for command in Self::COMMANDS {
                setuser.arg(*command);
            }
            let () = setuser
                .query_async(&mut admin)
                .await
                .expect("ACL SETUSER on a Sentinel");
        }
        SentinelUser {
            name: name.to_owned(),
            sentinels: sentinels.to_vec(),
        }
    }
}

impl Drop for SentinelUser {
    fn drop(&mut self) {
        for sentinel in &self.sentinels {
            let deleted = redis::Client::open(format!("redis://{sentinel}"))
                .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(2)))
                .and_then(|mut con| {
                    redis::cmd("ACL")
                        .arg("DELUSER")
                        .arg(&self.name)
                        .query::<i64>(&mut con)
                });
            if let Err(e) = deleted {
                eprintln!("could not delete the test Sentinel user {}: {e}", self.name);
            }
        }
    }
}

/// A node of a Redis Cluster, as `CLUSTER NODES` describes it.
#[derive(Debug, Clone)]
pub struct ClusterNode {
    pub id: String,
    /// `host:port`.
    pub addr: String,
    pub primary: bool,
    /// A replica's primary (its id).
    pub of: Option<String>,
    /// The slot ranges a primary serves.
    pub slots: Vec<(u16, u16)>,
}

/// The nodes of the cluster that `config`'s nodes belong to, failed ones left out, from the
/// first configured node that answers.
pub async fn cluster_nodes(config: &RedisConfig) -> Vec<ClusterNode> {
    for node in &config.hosts {
        let Ok(mut con) = connect(node).await else {
            continue;
        };
        let Ok(nodes) = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async::<String>(&mut con)
            .await
        else {
            continue;
        };
        return nodes
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let flags = *fields.get(2)?;
                if flags.contains("fail") {
                    return None;
                }
                Some(ClusterNode {
                    id: (*fields.first()?).to_owned(),
                    addr: fields.get(1)?.split('@').next()?.to_owned(),
                    primary: flags.contains("master"),
                    of: fields
                        .get(3)
                        .filter(|id| **id != "-")
                        .map(|id| (*id).to_owned()),
                    // "0-5460", "5461", and "[slot->-id]" for a slot being migrated.
                    slots: fields
                        .iter()
                        .skip(8)
                        .filter(|f| !f.starts_with('['))
                        .filter_map(|f| match f.split_once('-') {
                            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                            None => f.parse().ok().map(|n| (n, n)),
                        })
                        .collect(),
                })
            })
            .collect();
    }
    panic!("no node of the cluster answered CLUSTER NODES");
}

/// The node that serves `slot` now, as the first node that answers sees it; `None` while
/// none does (its primary failed and no replica took over yet).
pub async fn cluster_owner(config: &RedisConfig, slot: u16) -> Option<ClusterNode> {
    cluster_nodes(config)
        .await
        .into_iter()
        .find(|node| node.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
}

/// The primary that serves `slot`, and another primary to move it to.
pub async fn owner_and_another_primary(
    config: &RedisConfig,
    slot: u16,
) -> (ClusterNode, ClusterNode) {
    let owner = cluster_owner(config, slot)
        .await
        .expect("the slot's primary");
    let another = cluster_nodes(config)
        .await
        .into_iter()
        .find(|n| n.primary && n.id != owner.id)
        .expect("another primary");
    (owner, another)
}

/// The compose member name (`cluster-N`) of the cluster node at `addr`.
pub fn cluster_member(addr: &str) -> &'static str {
    const MEMBERS: [&str; 6] = [
        "cluster-1",
        "cluster-2",
        "cluster-3",
        "cluster-4",
        "cluster-5",
        "cluster-6",
    ];
    let offset: u16 = std::env::var("LOCKKIT_COMPOSE_PORT_OFFSET")
        .ok()
        .and_then(|o| o.parse().ok())
        .unwrap_or(0);
    let port: u16 = addr
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("host:port");
    MEMBERS[usize::from(port - offset - 20041)]
}

/// Moves `slot` from the node `from` to the node `to`, keys and all, as `redis-cli --cluster
/// reshard` does (`SETSLOT ... IMPORTING / MIGRATING`, `MIGRATE` in batches, `SETSLOT ... NODE`).
pub async fn migrate_slot(slot: u16, from: &ClusterNode, to: &ClusterNode) {
    let mut source = connect(&from.addr).await.unwrap();
    let mut target = connect(&to.addr).await.unwrap();
    let setslot = |state: &str, id: &str| {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SETSLOT").arg(slot).arg(state).arg(id);
        cmd
    };
    let () = setslot("IMPORTING", &from.id)
        .query_async(&mut target)
        .await
        .unwrap();
    let () = setslot("MIGRATING", &to.id)
        .query_async(&mut source)
        .await
        .unwrap();
    let (host, port) = to.addr.rsplit_once(':').unwrap();
    loop {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(10)
            .query_async(&mut source)
            .await
            .unwrap();
        if keys.is_empty() {
            break;
        }
        // A few keys at a time, with pauses between batches, so that clients meet the
        // migration half done (ASK, TRYAGAIN).
        let () = redis::cmd("MIGRATE")
            .arg(host)
            .arg(port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query_async(&mut source)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let () = setslot("NODE", &to.id)
        .query_async(&mut target)
        .await
        .unwrap();
    let () = setslot("NODE", &to.id)
        .query_async(&mut source)
        .await
        .unwrap();
}
