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
    /// One PostgreSQL server (lockkit-postgres's tier `single`): grants are committed to its
    /// disk before they are answered.
    Postgres,
    /// A PostgreSQL primary with one synchronous standby (lockkit-postgres's tier
    /// `replicated`): grants are on the standby's disk before they are answered, and a
    /// failover kills the primary and promotes the standby.
    PostgresHa,
}

impl Topology {
    /// Every topology, in the order of the tables (the newer tiers last: a tier's place here
    /// seeds its random schedule, which must not change under the older tiers).
    pub const ALL: [Topology; 8] = [
        Topology::Redis,
        Topology::Sentinel,
        Topology::Redlock,
        Topology::Etcd,
        Topology::Zk,
        Topology::Cluster,
        Topology::Postgres,
        Topology::PostgresHa,
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
            Topology::Postgres => "postgres",
            Topology::PostgresHa => "postgres-ha",
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
            Topology::Postgres => "LOCKKIT_TEST_POSTGRES_URL",
            Topology::PostgresHa => "LOCKKIT_TEST_POSTGRES_HA_URL",
        }
    }

    /// Whether the tier decides by consensus (etcd, ZooKeeper): a leader cut off from its
    /// majority grants nothing (the leader-isolation row), and its guarantees hold under every
    /// fault of the campaign (see also [`Topology::keeps_grants`]).
    pub fn is_consensus(self) -> bool {
        matches!(self, Topology::Etcd | Topology::Zk)
    }

    /// Whether a grant survives every server fault of the campaign, so that no overlap, no
    /// stale write and no token regression is explained by one: the consensus tiers, one
    /// PostgreSQL server (a grant and its fencing number are on its disk before the client
    /// hears of them) and the synchronous PostgreSQL pair (on the standby's disk too, before
    /// it is promoted). The Redis tiers forget grants in a crash or a failover.
    pub fn keeps_grants(self) -> bool {
        self.is_consensus() || self.is_postgres()
    }

    /// Whether the tier is one of PostgreSQL's.
    pub fn is_postgres(self) -> bool {
        matches!(self, Topology::Postgres | Topology::PostgresHa)
    }

    /// Whether a client's traffic can be routed through a fault proxy by rewriting its URL.
    /// Sentinel clients reach the primary at the address the Sentinels announce, and cluster
    /// clients each slot's primary at the address the cluster announces, so a proxy in the
    /// URL would only sit in front of the Sentinels or the first contact. A PostgreSQL
    /// client connects to the hosts of its URL only (with both of the pair's behind a proxy
    /// each, to whichever takes writes: the promoted standby after a failover).
    pub fn is_proxyable(self) -> bool {
        !matches!(self, Topology::Sentinel | Topology::Cluster)
    }

    /// Whether a replica takes over when the deciding server dies (Sentinel, cluster: the
    /// old primary then comes back as a replica; the PostgreSQL pair: the campaign promotes
    /// the standby, and the old primary stays down until [`restore_pair`] starts a new pair).
    pub fn fails_over(self) -> bool {
        matches!(
            self,
            Topology::Sentinel | Topology::Cluster | Topology::PostgresHa
        )
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

    /// Readies the tier for a run that crashes or stops its servers: the PostgreSQL pair must
    /// be intact (a run before, or `lockkit-postgres`'s failover test, may have left its
    /// standby promoted; see [`restore_pair`]). Nothing to do on the other tiers.
    ///
    /// # Errors
    /// When the pair cannot be brought up.
    pub fn prepare(&self) -> Result<(), CampaignError> {
        if self.topology == Topology::PostgresHa {
            restore_pair()?;
        }
        Ok(())
    }

    /// The URL's scheme, its user information (`user:password@`, or empty), its host list
    /// and the rest (path and query).
    fn url_parts(&self) -> (&str, &str, &str, &str) {
        let (scheme, rest) = self.url.split_once("://").unwrap_or(("", &self.url));
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let at = authority.rfind('@').map_or(0, |i| i + 1);
        (scheme, &authority[..at], &authority[at..], tail)
    }

    /// The `host:port` list of the URL.
    pub fn hosts(&self) -> Vec<String> {
        let (_, _, hosts, _) = self.url_parts();
        hosts.split(',').map(str::to_owned).collect()
    }

    /// The URL with its hosts replaced by `hosts` (those of a fault proxy); the credentials,
    /// path and query stay.
    pub fn url_through(&self, hosts: &[String]) -> String {
        let (scheme, user, _, tail) = self.url_parts();
        format!("{scheme}://{user}{}{tail}", hosts.join(","))
    }

    /// The members whose loss takes the decisions on lock `key` (of the default namespace,
    /// the workers') away: the Redis server, the Sentinel primary, a majority of the Redlock
    /// nodes, the primary of the key's slot in the cluster, the etcd or ZooKeeper leader, the
    /// PostgreSQL server, the primary of the PostgreSQL pair (`pg-standby` once promoted).
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
            Topology::Postgres => vec!["postgres".into()],
            Topology::PostgresHa => vec![pg_primary()?],
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

/// The member of the PostgreSQL pair that takes writes: `pg-primary` while it runs (the
/// campaign never restarts it after a failover: [`restore_pair`] starts a new pair), else
/// `pg-standby`, promoted in its place.
///
/// # Errors
/// When neither runs.
fn pg_primary() -> Result<String, CampaignError> {
    ["pg-primary", "pg-standby"]
        .into_iter()
        .find(|name| member(&["status", name]).is_ok())
        .map(str::to_owned)
        .ok_or_else(|| CampaignError("neither pg-primary nor pg-standby runs".into()))
}

/// Brings the PostgreSQL pair back as `compose/up.sh postgres-ha` does: a pair whose standby
/// was promoted is replaced by a fresh one (an empty database), a killed member of an intact
/// pair is restarted with its data, an intact pair is left alone.
///
/// # Errors
/// When `compose/up.sh` fails.
pub fn restore_pair() -> Result<(), CampaignError> {
    let out = Command::new(compose_dir().join("up.sh"))
        .arg(Topology::PostgresHa.name())
        .output()
        .map_err(|e| CampaignError(format!("compose/up.sh: {e}")))?;
    if !out.status.success() {
        return Err(CampaignError(format!(
            "compose/up.sh postgres-ha: {}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Whether `name` is a PostgreSQL server (a postmaster and the processes it forked).
fn is_postgres_member(name: &str) -> bool {
    matches!(name, "postgres" | "pg-primary" | "pg-standby")
}

/// The processes a PostgreSQL member's postmaster forked (its backends, WAL writer,
/// checkpointer, WAL sender or receiver...).
fn postgres_children(name: &str) -> Result<Vec<nix::unistd::Pid>, CampaignError> {
    let pid = member(&["pid", name])?;
    let path = format!("/proc/{pid}/task/{pid}/children");
    let children = std::fs::read_to_string(&path)
        .map_err(|e| CampaignError(format!("{name}'s processes ({path}): {e}")))?;
    Ok(children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .map(nix::unistd::Pid::from_raw)
        .collect())
}

/// Stops `name` (`SIGSTOP`). `compose/member.sh pause` stops a PostgreSQL postmaster alone,
/// whose backends go on serving the connections they have; the campaign stops them too (the
/// postmaster first, so that it forks no new one), as a whole server stops.
///
/// # Errors
/// When the member is not up.
pub fn pause(name: &str) -> Result<(), CampaignError> {
    member(&["pause", name])?;
    if is_postgres_member(name) {
        for child in postgres_children(name)? {
            // One that exited meanwhile has nothing left to stop.
            let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGSTOP);
        }
    }
    Ok(())
}

/// Resumes what [`pause`] stopped (`SIGCONT`; a PostgreSQL server's children first).
///
/// # Errors
/// When the member is not up.
pub fn resume(name: &str) -> Result<(), CampaignError> {
    if is_postgres_member(name) {
        for child in postgres_children(name)? {
            let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGCONT);
        }
    }
    member(&["resume", name]).map(drop)
}

/// Kills the deciding servers of `topology` (`deciders`, see [`Tier::deciders`]) as a crash
/// does (`SIGKILL`), and, on the PostgreSQL pair, fails over: the killed primary's standby is
/// promoted at once (`compose/member.sh promote pg-standby`), as a failover manager would. A
/// promoted standby that is killed in turn has no standby: it is only killed (restart it).
/// Returns whether it promoted.
///
/// # Errors
/// When a member is not up or the promotion fails.
pub fn crash(topology: Topology, deciders: &[String]) -> Result<bool, CampaignError> {
    for name in deciders {
        member(&["kill", name])?;
    }
    let promote = topology == Topology::PostgresHa && deciders.iter().any(|n| n == "pg-primary");
    if promote {
        member(&["promote", "pg-standby"])?;
    }
    Ok(promote)
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
/// the Sentinels say so, else a replica whose link to the primary is up (a cluster member:
/// see `cluster_settled`; any other member: at once).
///
/// # Errors
/// When it has not within 40 s.
pub async fn restore_if_replaced(name: &str) -> Result<(), CampaignError> {
    if !name.starts_with("sentinel-") && !name.starts_with("cluster-") {
        // A PostgreSQL primary replaced by its standby stays down: the pair is rebuilt.
        return Ok(());
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(url: &str) -> Tier {
        Tier {
            topology: Topology::PostgresHa,
            url: url.to_owned(),
        }
    }

    #[test]
    fn the_hosts_of_a_url_leave_its_credentials_out() {
        let ha = tier("postgres://postgres:pw@127.0.0.1:20301,127.0.0.1:20302/lockkit");
        assert_eq!(ha.hosts(), ["127.0.0.1:20301", "127.0.0.1:20302"]);
        assert_eq!(tier("redis://127.0.0.1:20000").hosts(), ["127.0.0.1:20000"]);
    }

    #[test]
    fn a_url_through_a_proxy_keeps_its_credentials_and_database() {
        let ha = tier("postgres://postgres:pw@127.0.0.1:20301,127.0.0.1:20302/lockkit");
        let proxied = ha.url_through(&["127.0.0.1:1".into(), "127.0.0.1:2".into()]);
        assert_eq!(
            proxied,
            "postgres://postgres:pw@127.0.0.1:1,127.0.0.1:2/lockkit"
        );
        let redis = tier("redis://127.0.0.1:20000?x=1");
        assert_eq!(
            redis.url_through(&["127.0.0.1:1".into()]),
            "redis://127.0.0.1:1?x=1"
        );
    }

    #[test]
    fn the_older_tiers_keep_their_places() {
        // A tier's place seeds its random schedule.
        assert_eq!(
            Topology::ALL[..6],
            [
                Topology::Redis,
                Topology::Sentinel,
                Topology::Redlock,
                Topology::Etcd,
                Topology::Zk,
                Topology::Cluster,
            ]
        );
    }
}
