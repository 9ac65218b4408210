//! ACLs for the security tests: the commands lockkit needs on each topology, and ACL users
//! created for one test (on a server, on every cluster node, on every Sentinel) and deleted
//! when dropped.

use std::time::Duration;

use lockkit_redis::RedisConfig;

use super::{cluster_nodes, connect};

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
    /// What lockkit asks a Sentinel: the primary's address, and its failover announcements
    /// (a subscription, checked by `PING`).
    pub const COMMANDS: &[&str] = &[
        "+sentinel|get-master-addr-by-name",
        "+subscribe",
        "+ping",
        "&+switch-master",
    ];

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
