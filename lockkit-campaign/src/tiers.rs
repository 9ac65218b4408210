//! The tiers the campaign runs on (the compose topologies), and the faults it can cause to
//! their servers through `compose/member.sh`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::CampaignError;

/// Which topology a tier is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Topology {
    /// One Redis server.
    Redis,
    /// A Redis primary with one replica and three Sentinels.
    Sentinel,
    /// Five independent Redis servers.
    Redlock,
    /// A Redis Cluster: three primaries, each with a replica.
    Cluster,
    /// A three-member etcd cluster.
    Etcd,
    /// A three-server ZooKeeper ensemble.
    Zk,
}

impl Topology {
    /// Every topology, in the order of the tables (the cluster last: a tier's place here
    /// seeds its random schedule, which must not change under the older tiers).
    pub const ALL: [Topology; 6] = [
        Topology::Redis,
        Topology::Sentinel,
        Topology::Redlock,
        Topology::Etcd,
        Topology::Zk,
        Topology::Cluster,
    ];

    /// Its name in the tables (as in the comparison suite).
    pub fn name(self) -> &'static str {
        match self {
            Topology::Redis => "redis",
            Topology::Sentinel => "redis-sentinel",
            Topology::Redlock => "redlock-5",
            Topology::Cluster => "redis-cluster",
            Topology::Etcd => "etcd-3",
            Topology::Zk => "zk-3",
        }
    }

    /// The variable naming its URL (`compose/up.sh` writes them to its endpoints file).
    pub fn variable(self) -> &'static str {
        match self {
            Topology::Redis => "LOCKKIT_TEST_REDIS_URL",
            Topology::Sentinel => "LOCKKIT_TEST_SENTINEL_URL",
            Topology::Redlock => "LOCKKIT_TEST_REDLOCK_URL",
            Topology::Cluster => "LOCKKIT_TEST_REDIS_CLUSTER_URL",
            Topology::Etcd => "LOCKKIT_TEST_ETCD_URL",
            Topology::Zk => "LOCKKIT_TEST_ZK_URL",
        }
    }

    /// Whether the tier decides by consensus (etcd, ZooKeeper): the tier whose guarantees
    /// hold under every fault of the campaign.
    pub fn is_consensus(self) -> bool {
        matches!(self, Topology::Etcd | Topology::Zk)
    }

    /// Whether a client's traffic can be routed through a fault proxy by rewriting its URL.
    /// Sentinel clients reach the primary at the address the Sentinels announce, and cluster
    /// clients each slot's primary at the address the cluster announces, so a proxy in the
    /// URL would only sit in front of the Sentinels or the first contact.
    pub fn is_proxyable(self) -> bool {
        !self.fails_over()
    }

    /// Whether a replica takes over when the deciding server dies (Sentinel, cluster): the
    /// old primary then comes back as a replica.
    pub fn fails_over(self) -> bool {
        matches!(self, Topology::Sentinel | Topology::Cluster)
    }
}

/// A tier to run scenarios on.
#[derive(Debug, Clone)]
pub struct Tier {
    /// Which topology.
    pub topology: Topology,
    /// Its URL.
    pub url: String,
}

impl Tier {
    /// The tiers whose servers are up (`LOCKKIT_TEST_*_URL` or the endpoints file of
    /// `compose/up.sh`). A missing one is reported, and fails the caller under
    /// `LOCKKIT_REQUIRE_BACKENDS=1`.
    pub fn available() -> Vec<Tier> {
        Topology::ALL.into_iter().filter_map(Tier::of).collect()
    }

    /// The tier of `topology`, if its servers are up; a missing one is reported as in
    /// [`Tier::available`].
    pub fn of(topology: Topology) -> Option<Tier> {
        let url = lockkit_core::testing::endpoint(topology.variable());
        if url.is_none() {
            lockkit_core::testing::backend_missing(&format!(
                "{} ({})",
                topology.name(),
                topology.variable()
            ));
        }
        url.map(|url| Tier { topology, url })
    }

    /// Its name in the tables.
    pub fn name(&self) -> &'static str {
        self.topology.name()
    }

    /// The `host:port` list of the URL.
    pub fn hosts(&self) -> Vec<String> {
        let (_, rest) = self.url.split_once("://").unwrap_or(("", &self.url));
        let hosts = rest.split(['/', '?']).next().unwrap_or_default();
        hosts.split(',').map(str::to_owned).collect()
    }

    /// The URL with its hosts replaced by `hosts` (those of a fault proxy).
    pub fn url_through(&self, hosts: &[String]) -> String {
        let (scheme, rest) = self.url.split_once("://").unwrap_or(("", &self.url));
        let tail = rest.find(['/', '?']).map_or("", |i| &rest[i..]);
        format!("{scheme}://{}{tail}", hosts.join(","))
    }

    /// The members whose loss takes the decisions on lock `key` (of the default namespace,
    /// the workers') away: the Redis server, the Sentinel primary, a majority of the Redlock
    /// nodes, the primary of the key's slot in the cluster, the etcd or ZooKeeper leader.
    ///
    /// # Errors
    /// When `compose/member.sh` cannot tell the leader.
    pub fn deciders(&self, key: &str) -> Result<Vec<String>, CampaignError> {
        Ok(match self.topology {
            Topology::Redis => vec!["redis".into()],
            Topology::Sentinel => vec![member(&["leader", "sentinel"])?],
            Topology::Redlock => (1..=3).map(|i| format!("redlock-{i}")).collect(),
            Topology::Cluster => {
                let key = lockkit::LockKey::new(lockkit::LockKey::DEFAULT_NAMESPACE, key)?;
                let slot = lockkit::redis::RedisClusterBackend::slot_of(&key)
                    .ok_or_else(|| CampaignError(format!("{key} has no hash slot of its own")))?;
                vec![member(&["leader", "redis-cluster", &slot.to_string()])?]
            }
            Topology::Etcd => vec![member(&["leader", "etcd"])?],
            Topology::Zk => vec![member(&["leader", "zk"])?],
        })
    }

    /// The etcd or ZooKeeper members other than the leader.
    ///
    /// # Errors
    /// On the other tiers, or when the leader cannot be told.
    pub fn followers(&self) -> Result<Vec<String>, CampaignError> {
        let prefix = match self.topology {
            Topology::Etcd => "etcd",
            Topology::Zk => "zk",
            _ => return Err(CampaignError(format!("{} has no followers", self.name()))),
        };
        let leader = member(&["leader", prefix])?;
        Ok((1..=3)
            .map(|i| format!("{prefix}-{i}"))
            .filter(|m| *m != leader)
            .collect())
    }

    /// The client port of a member.
    ///
    /// # Errors
    /// When `compose/member.sh` does not know it.
    pub fn port_of(member_name: &str) -> Result<String, CampaignError> {
        let status = member(&["status", member_name])?;
        status
            .split_whitespace()
            .last()
            .map(str::to_owned)
            .ok_or_else(|| CampaignError(format!("no port in {status:?}")))
    }
}

/// The repository's `compose/` directory.
fn compose_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../compose")
}

/// Runs `compose/member.sh ARGS` and returns what it printed.
///
/// # Errors
/// When it fails.
pub fn member(args: &[&str]) -> Result<String, CampaignError> {
    let out = Command::new(compose_dir().join("member.sh"))
        .args(args)
        .output()
        .map_err(|e| CampaignError(format!("compose/member.sh: {e}")))?;
    if !out.status.success() {
        return Err(CampaignError(format!(
            "compose/member.sh {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Restarts `name` and, for a Sentinel or cluster member, waits until it has rejoined (a
/// restarted Sentinel primary comes back as a second primary and is demoted only later; a
/// cluster primary comes back as a replica of the one promoted in its place).
///
/// # Errors
/// When it does not come back within 40 s.
pub async fn restore(name: &str) -> Result<(), CampaignError> {
    member(&["restart", name])?;
    if name.starts_with("cluster-") || name.starts_with("sentinel-") {
        return restore_if_replaced(name).await;
    }
    Ok(())
}

/// Waits until a Sentinel member that was paused or restarted has settled: the primary if
/// the Sentinels say so, else a replica whose link to the primary is up.
///
/// # Errors
/// When it has not within 40 s.
pub async fn restore_if_replaced(name: &str) -> Result<(), CampaignError> {
    if name.starts_with("cluster-") {
        return cluster_settled(name).await;
    }
    let port = Tier::port_of(name)?;
    let by = std::time::Instant::now() + Duration::from_secs(40);
    while std::time::Instant::now() < by {
        let info = Command::new("redis-cli")
            .args(["-p", &port, "info", "replication"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let leader = member(&["leader", "sentinel"]).unwrap_or_default();
        if (leader == name && info.contains("role:master"))
            || (leader != name && info.contains("master_link_status:up"))
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(CampaignError(format!("{name} did not settle within 40 s")))
}

/// Waits until the cluster member `name` sees a cluster that serves every slot, and is
/// either a primary or a replica whose link to its primary is up.
async fn cluster_settled(name: &str) -> Result<(), CampaignError> {
    let port = Tier::port_of(name)?;
    let by = std::time::Instant::now() + Duration::from_secs(40);
    let cli = |args: &[&str]| {
        Command::new("redis-cli")
            .args(["-p", &port])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    while std::time::Instant::now() < by {
        let replication = cli(&["info", "replication"]);
        let linked =
            replication.contains("role:master") || replication.contains("master_link_status:up");
        if linked && cli(&["cluster", "info"]).contains("cluster_state:ok") {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(CampaignError(format!(
        "{name} did not rejoin the cluster within 40 s"
    )))
}
