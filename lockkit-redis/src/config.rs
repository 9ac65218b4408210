//! Configuration of the Redis backends: [`RedisConfig`] (single node or Sentinel) and
//! [`RedlockConfig`] (independent nodes).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lockkit_core::backend::url::ConnectionUrl;
use lockkit_core::backend::validate_duration;
use lockkit_core::{Error, Result};
use serde::{Deserialize, Serialize};

const DEFAULT_PORT: u16 = 6379;
const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// How to reach one Redis server or a Sentinel-managed primary, and how to talk to it.
///
/// From a URL ([`RedisConfig::from_url`]):
/// - `redis://[user:password@]host[:port][/db]`: one server (port 6379 by default);
/// - `rediss://...`: the same over TLS (cargo feature `tls`);
/// - `redis+sentinel://[user:password@]s1[:port],s2,s3/master-name[/db]`: the primary that the
///   Sentinels `s1..` (port 26379 by default) know as `master-name`. The user and password are
///   those of the Redis servers; the Sentinels' own are `sentinel_username` and
///   `sentinel_password`, which a URL does not carry.
/// - `redis+cluster://[user:password@]h1[:port],h2,h3`: a Redis Cluster, found through any of
///   the listed nodes (port 6379 by default; a few are enough, the others are discovered).
///
/// In TOML, the `[redis]` table of the `lockkit` configuration. Every field is optional and
/// defaults as documented; unknown fields are errors.
#[non_exhaustive]
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `host:port` of the Redis server; for Sentinel, of the Sentinels. Default: `127.0.0.1:6379`.
    pub hosts: Vec<String>,
    /// When set, `hosts` are Sentinels and the lock server is the primary they know by this
    /// name (tier `replicated`). Default: unset (one server, tier `single`).
    pub sentinel_master: Option<String>,
    /// `hosts` are nodes of a Redis Cluster (tier `replicated`): each lock lives on the
    /// primary that owns its slot, found through any of them. Default: false.
    pub cluster: bool,
    /// The ACL user the Sentinels are asked as (Sentinels with their own ACLs). Default:
    /// unset (the `default` user).
    pub sentinel_username: Option<String>,
    /// The password of the Sentinels themselves (their `requirepass` or the
    /// `sentinel_username`'s), not the Redis servers'. Default: unset (asked without
    /// credentials). Never logged or shown by `Debug`.
    pub sentinel_password: Option<String>,
    /// The logical database. Default: 0.
    pub db: i64,
    /// The ACL user. Default: unset (the `default` user).
    pub username: Option<String>,
    /// The password. Default: unset. Never logged or shown by `Debug`.
    pub password: Option<String>,
    /// Connect with TLS (needs the cargo feature `tls`). Default: false.
    pub tls: bool,
    /// A PEM file with the CA certificate(s) to trust for TLS instead of the system's roots.
    /// Default: unset.
    pub tls_ca_file: Option<PathBuf>,
    /// A PEM file with the client certificate (chain) to present for mutual TLS, with
    /// `tls_key_file`; with Sentinel, to the Sentinels too. Default: unset.
    pub tls_cert_file: Option<PathBuf>,
    /// A PEM file with the private key of `tls_cert_file`. Default: unset. Its contents are
    /// never logged or shown by `Debug`.
    pub tls_key_file: Option<PathBuf>,
    /// How long connecting may take. Default: 1s.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long one request may take before it fails with `Unavailable`. Default: 1s.
    #[serde(with = "humantime_serde")]
    pub response_timeout: Duration,
    /// Waiters learn about releases from pub/sub notifications on one shared connection;
    /// when false they poll with jittered backoff. Default: true.
    pub notifications: bool,
    /// Sentinel and cluster: after a grant (and a renewal), `WAIT` until this many replicas have it;
    /// if fewer acknowledge within `replica_timeout`, the grant is given back and the acquire
    /// fails. This narrows the failover window, it does not close it (see the crate docs).
    /// Default: 0 (do not wait).
    pub min_replicas: u32,
    /// How long `WAIT` waits for `min_replicas`. Default: 100ms.
    #[serde(with = "humantime_serde")]
    pub replica_timeout: Duration,
    /// How long a key's fence counter outlives the lock (its last grant or renewal; renewals
    /// keep the counter alive while the lock is held). Tokens also follow the server's clock,
    /// so this only matters if that clock steps back. Default: 1h.
    #[serde(with = "humantime_serde")]
    pub fence_ttl: Duration,
    /// Accept a server that may evict lock keys: one with a `maxmemory` limit and a
    /// `maxmemory-policy` other than `noeviction` (every lock key has a TTL, so even the
    /// `volatile-*` policies take them). An evicted lock is granted again while its holder
    /// still holds it. When false, `connect` refuses such a server with `InvalidConfig`
    /// (it reads `INFO memory`; a user that may not run `INFO` gets a logged warning
    /// instead). With Sentinel, the primary found at connect time is checked. Default: false.
    pub allow_eviction: bool,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            hosts: vec![format!("127.0.0.1:{DEFAULT_PORT}")],
            sentinel_master: None,
            cluster: false,
            sentinel_username: None,
            sentinel_password: None,
            db: 0,
            username: None,
            password: None,
            tls: false,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            notifications: true,
            min_replicas: 0,
            replica_timeout: Duration::from_millis(100),
            fence_ttl: Duration::from_secs(3600),
            allow_eviction: false,
        }
    }
}

impl RedisConfig {
    /// A configuration from a `redis://`, `rediss://`, `redis+sentinel://` or
    /// `redis+cluster://` URL, with the
    /// other fields at their defaults.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockkit_core::ErrorKind::InvalidConfig) for a malformed URL
    /// or another scheme.
    pub fn from_url(url: &str) -> Result<Self> {
        let mut config = RedisConfig::default();
        config.apply_url(&ConnectionUrl::parse(url)?)?;
        Ok(config)
    }

    /// Takes the hosts, credentials, database, Sentinel master name and cluster mode from
    /// `url`; the other fields keep their values.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockkit_core::ErrorKind::InvalidConfig) for another scheme,
    /// a bad path or query parameters (none are accepted).
    pub fn apply_url(&mut self, url: &ConnectionUrl) -> Result<()> {
        reject_query(url)?;
        let (sentinel, cluster) = match url.scheme.as_str() {
            "redis" => (false, false),
            "rediss" => {
                self.tls = true;
                (false, false)
            }
            "redis+sentinel" => (true, false),
            "redis+cluster" => (false, true),
            other => {
                return Err(Error::invalid_config(format!(
                    "a Redis URL starts with redis://, rediss://, redis+sentinel:// or redis+cluster://, not {other}://"
                )));
            }
        };
        self.cluster = cluster;
        let segments: Vec<&str> = url.path.split('/').filter(|s| !s.is_empty()).collect();
        let db = if sentinel {
            let Some((master, rest)) = segments.split_first() else {
                return Err(Error::invalid_config(
                    "a redis+sentinel:// URL names the master: redis+sentinel://s1,s2,s3/master-name",
                ));
            };
            self.sentinel_master = Some((*master).to_owned());
            rest
        } else {
            self.sentinel_master = None;
            &segments[..]
        };
        self.db = match db {
            [] => 0,
            [db] => db.parse().map_err(|_| {
                Error::invalid_config(format!(
                    "the database in a Redis URL is a number, not {db:?}"
                ))
            })?,
            _ => {
                return Err(Error::invalid_config(format!(
                    "unexpected path {:?} in a Redis URL",
                    url.path
                )));
            }
        };
        let port = if sentinel {
            DEFAULT_SENTINEL_PORT
        } else {
            DEFAULT_PORT
        };
        take_hosts_and_credentials(
            url,
            port,
            &mut self.hosts,
            &mut self.username,
            &mut self.password,
        );
        Ok(())
    }

    /// Checks what serde cannot.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockkit_core::ErrorKind::InvalidConfig) saying what is wrong.
    pub fn validate(&self) -> Result<()> {
        if self.hosts.is_empty() {
            return Err(Error::invalid_config("redis.hosts is empty"));
        }
        if self.cluster && self.sentinel_master.is_some() {
            return Err(Error::invalid_config(
                "redis.cluster and redis.sentinel_master exclude each other: a Redis Cluster fails over without Sentinels",
            ));
        }
        if self.cluster && self.db != 0 {
            return Err(Error::invalid_config(format!(
                "redis.db is {}: a Redis Cluster has database 0 only",
                self.db
            )));
        }
        if self.sentinel_master.is_none() && !self.cluster && self.hosts.len() > 1 {
            return Err(Error::invalid_config(format!(
                "redis.hosts lists {} servers but neither sentinel_master nor cluster is set: a single-node lock uses one server (for several independent servers use the redlock backend)",
                self.hosts.len()
            )));
        }
        if self.sentinel_master.is_none() && !self.cluster && self.min_replicas > 0 {
            return Err(Error::invalid_config(
                "redis.min_replicas needs replicas: a Sentinel-managed primary (sentinel_master) or a Redis Cluster (cluster)",
            ));
        }
        if self.db < 0 {
            return Err(Error::invalid_config(format!(
                "redis.db is {}: databases are numbered from 0",
                self.db
            )));
        }
        if self.min_replicas > 0 && self.replica_timeout >= self.response_timeout {
            return Err(Error::invalid_config(format!(
                "redis.replica_timeout ({:?}) must be shorter than redis.response_timeout ({:?}): the WAIT for replicas is part of one request",
                self.replica_timeout, self.response_timeout
            )));
        }
        if self.sentinel_master.as_deref() == Some("") {
            return Err(Error::invalid_config("redis.sentinel_master is empty"));
        }
        for host in &self.hosts {
            parse_host(host)?;
        }
        validate_duration("redis.connect_timeout", self.connect_timeout)?;
        validate_duration("redis.response_timeout", self.response_timeout)?;
        validate_duration("redis.replica_timeout", self.replica_timeout)?;
        validate_duration("redis.fence_ttl", self.fence_ttl)?;
        if self.tls && !cfg!(feature = "tls") {
            return Err(Error::invalid_config(
                "redis.tls (or rediss://) needs the cargo feature `tls` of lockkit-redis",
            ));
        }
        validate_client_identity("redis", self.tls, &self.tls_cert_file, &self.tls_key_file)?;
        if self.sentinel_master.is_none()
            && (self.sentinel_username.is_some() || self.sentinel_password.is_some())
        {
            return Err(Error::invalid_config(
                "redis.sentinel_username and redis.sentinel_password are for Sentinels: set sentinel_master (or use a redis+sentinel:// URL)",
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("hosts", &self.hosts)
            .field("sentinel_master", &self.sentinel_master)
            .field("cluster", &self.cluster)
            .field("sentinel_username", &self.sentinel_username)
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "<redacted>"),
            )
            .field("db", &self.db)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("notifications", &self.notifications)
            .field("min_replicas", &self.min_replicas)
            .field("replica_timeout", &self.replica_timeout)
            .field("fence_ttl", &self.fence_ttl)
            .field("allow_eviction", &self.allow_eviction)
            .finish()
    }
}

/// How to reach the independent Redis servers of a Redlock quorum.
///
/// From a URL: `redlock://[user:password@]h1[:port],h2,h3,h4,h5` (port 6379 by default). In
/// TOML, the `[redlock]` table of the `lockkit` configuration. Every field is optional and
/// defaults as documented; unknown fields are errors.
#[non_exhaustive]
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedlockConfig {
    /// `host:port` of each independent server; a majority (N/2+1) must agree. Use an odd
    /// number, 3 or more. Default: empty (must be set).
    pub nodes: Vec<String>,
    /// The ACL user on every node. Default: unset.
    pub username: Option<String>,
    /// The password on every node. Default: unset. Never logged or shown by `Debug`.
    pub password: Option<String>,
    /// Connect with TLS (needs the cargo feature `tls`). Default: false.
    pub tls: bool,
    /// A PEM file with the CA certificate(s) to trust for TLS instead of the system's roots.
    /// Default: unset.
    pub tls_ca_file: Option<PathBuf>,
    /// A PEM file with the client certificate (chain) to present to every node for mutual
    /// TLS, with `tls_key_file`. Default: unset.
    pub tls_cert_file: Option<PathBuf>,
    /// A PEM file with the private key of `tls_cert_file`. Default: unset. Its contents are
    /// never logged or shown by `Debug`.
    pub tls_key_file: Option<PathBuf>,
    /// How long connecting to one node may take. Default: 1s.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long one node may take to answer; a slower node counts as failed for that round,
    /// so a dead node costs at most this much. Keep it a small share of the TTL. Default: 100ms.
    #[serde(with = "humantime_serde")]
    pub node_timeout: Duration,
    /// Keep a lock at most this long: the first renewal after it reports the lock lost (the
    /// guard's `lost()` fires, before the keys expire) and stops renewing it. Default: unset
    /// (renew as long as the guard lives).
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_hold: Option<Duration>,
    /// How long a key's fence counters outlive the lock, its last grant or renewal (see
    /// [`RedisConfig::fence_ttl`]). Default: 1h.
    #[serde(with = "humantime_serde")]
    pub fence_ttl: Duration,
    /// Accept nodes that may evict lock keys (see [`RedisConfig::allow_eviction`]); when
    /// false, `connect` refuses if any node that answers has a memory limit with an evicting
    /// policy. Default: false.
    pub allow_eviction: bool,
}

impl Default for RedlockConfig {
    fn default() -> Self {
        RedlockConfig {
            nodes: Vec::new(),
            username: None,
            password: None,
            tls: false,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            connect_timeout: Duration::from_secs(1),
            node_timeout: Duration::from_millis(100),
            max_hold: None,
            fence_ttl: Duration::from_secs(3600),
            allow_eviction: false,
        }
    }
}

impl RedlockConfig {
    /// A configuration from a `redlock://h1,h2,h3` URL, with the other fields at their defaults.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockkit_core::ErrorKind::InvalidConfig) for a malformed URL
    /// or another scheme.
    pub fn from_url(url: &str) -> Result<Self> {
        let mut config = RedlockConfig::default();
        config.apply_url(&ConnectionUrl::parse(url)?)?;
        Ok(config)
    }

    /// Takes the nodes and credentials from `url`; the other fields keep their values.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockkit_core::ErrorKind::InvalidConfig) for another scheme,
    /// a path or query parameters.
    pub fn apply_url(&mut self, url: &ConnectionUrl) -> Result<()> {
        reject_query(url)?;
        if url.scheme != "redlock" {
            return Err(Error::invalid_config(format!(
                "a Redlock URL starts with redlock://, not {}://",
                url.scheme
            )));
        }
        if !url.path.trim_matches('/').is_empty() {
            return Err(Error::invalid_config(format!(
                "a redlock:// URL has no path (got {:?}); every node uses database 0",
                url.path
            )));
        }
        take_hosts_and_credentials(
            url,
            DEFAULT_PORT,
            &mut self.nodes,
            &mut self.username,
            &mut self.password,
        );
        Ok(())
    }

    /// How many nodes must agree: N/2+1.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// Checks what serde cannot.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`](lockkit_core::ErrorKind::InvalidConfig) saying what is wrong.
    pub fn validate(&self) -> Result<()> {
        if self.nodes.len() < 3 {
            return Err(Error::invalid_config(format!(
                "redlock.nodes lists {} server(s); Redlock needs at least 3 independent servers (use the redis backend for one)",
                self.nodes.len()
            )));
        }
        for node in &self.nodes {
            parse_host(node)?;
        }
        let mut unique = self.nodes.clone();
        unique.sort();
        unique.dedup();
        if unique.len() != self.nodes.len() {
            return Err(Error::invalid_config(
                "redlock.nodes lists a server twice: a quorum needs independent servers",
            ));
        }
        validate_duration("redlock.connect_timeout", self.connect_timeout)?;
        validate_duration("redlock.node_timeout", self.node_timeout)?;
        validate_duration("redlock.fence_ttl", self.fence_ttl)?;
        if let Some(max_hold) = self.max_hold {
            validate_duration("redlock.max_hold", max_hold)?;
        }
        if self.tls && !cfg!(feature = "tls") {
            return Err(Error::invalid_config(
                "redlock.tls needs the cargo feature `tls` of lockkit-redis",
            ));
        }
        validate_client_identity("redlock", self.tls, &self.tls_cert_file, &self.tls_key_file)
    }
}

impl fmt::Debug for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockConfig")
            .field("nodes", &self.nodes)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .field("connect_timeout", &self.connect_timeout)
            .field("node_timeout", &self.node_timeout)
            .field("max_hold", &self.max_hold)
            .field("fence_ttl", &self.fence_ttl)
            .field("allow_eviction", &self.allow_eviction)
            .finish()
    }
}

/// A client certificate needs its key (and the key its certificate), and both need TLS: a
/// half-configured mutual TLS would otherwise connect without it, or not at all, with a
/// less helpful error from the server.
fn validate_client_identity(
    table: &str,
    tls: bool,
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
) -> Result<()> {
    match (cert, key) {
        (None, None) => Ok(()),
        (Some(_), None) | (None, Some(_)) => Err(Error::invalid_config(format!(
            "{table}.tls_cert_file and {table}.tls_key_file go together (mutual TLS needs both)"
        ))),
        (Some(_), Some(_)) if !tls => Err(Error::invalid_config(format!(
            "{table}.tls_cert_file is set but TLS is off: set {table}.tls (or use rediss://)"
        ))),
        (Some(_), Some(_)) => Ok(()),
    }
}

/// Copies what `url` names of the hosts (with `default_port`), user and password.
fn take_hosts_and_credentials(
    url: &ConnectionUrl,
    default_port: u16,
    hosts: &mut Vec<String>,
    username: &mut Option<String>,
    password: &mut Option<String>,
) {
    if !url.hosts.is_empty() {
        *hosts = url.hosts_with_port(default_port);
    }
    if url.username.is_some() {
        username.clone_from(&url.username);
    }
    if url.password.is_some() {
        password.clone_from(&url.password);
    }
}

/// Splits `host:port`.
pub(crate) fn parse_host(host: &str) -> Result<(String, u16)> {
    let bad = || Error::invalid_config(format!("{host:?} is not host:port"));
    let (name, port) = host.rsplit_once(':').ok_or_else(bad)?;
    let name = name.trim_start_matches('[').trim_end_matches(']');
    if name.is_empty() {
        return Err(bad());
    }
    let port = port.parse::<u16>().map_err(|_| bad())?;
    Ok((name.to_owned(), port))
}

fn reject_query(url: &ConnectionUrl) -> Result<()> {
    match url.query.first() {
        Some((name, _)) => Err(Error::invalid_config(format!(
            "unknown URL parameter {name:?}: set options in the configuration's table instead"
        ))),
        None => Ok(()),
    }
}
