//! [`RedisClusterBackend`]: locks on a Redis Cluster, each on the primary that owns its slot.

mod route;
mod slots;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex as StdMutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::future::join_all;
use lockkit_core::backend::{
    AcquireRequest, Attempt, Contention, Grant, Leader, Lease, LockBackend, LockPage, Renewal,
};
use lockkit_core::{Capabilities, Error, ErrorKind, LockInfo, LockKey, Result, Tier};
use tokio::sync::OnceCell;

use crate::backend::RedisBackend;
use crate::config::{RedisConfig, parse_host};
use crate::connection::Dialer;
use crate::error::{BACKEND, timed_out};
use route::Reroute;
use slots::{Addr, SlotMap, slot_of};

/// The pause between two tries of a request that met a slot's migration (`ASK`, `TRYAGAIN`,
/// a second `MOVED`); the tries go on for the request bound at most, then the caller's own
/// retries (a waiting `lock()`'s error budget) take over.
const MIGRATION_PAUSE: Duration = Duration::from_millis(10);

/// Reading the cluster's map more often than this does not find a failover faster.
const REFRESH_INTERVAL: Duration = Duration::from_millis(100);

/// Locks on a Redis Cluster (tier `replicated`).
///
/// Every key of a lock (the lock, its fence counter, its waiters' queue, its election value;
/// a semaphore's and a read-write lock's keys likewise) carries the hash tag
/// `{namespace/name}`, so they share one slot, and each of the scripts that
/// [`RedisBackend`] runs on one server runs unchanged on the slot's primary: the cluster
/// backend is a router over one [`RedisBackend`] per primary, with the same scripts,
/// fencing, queueing, waiting and renewal, and the same guarantees per slot as a
/// Sentinel-managed primary.
///
/// - **Routing**: the slot of the lock's key (CRC16 of the tag, as Redis computes it) and
///   the map of slots to primaries (`CLUSTER SLOTS`, read at connect time from any of the
///   configured nodes, and again after a failover).
/// - **Resharding**: a `MOVED` answer (the request did not run) sends it again to the new
///   primary at once; `ASK` / `TRYAGAIN` (the slot is migrating and the lock's keys are not
///   all on one side yet) are waited out, a few milliseconds at a time, until the keys have
///   moved, within the request bound (`connect_timeout + response_timeout`). A held lock
///   whose slot moved is renewed on its new primary: `MIGRATE` keeps the keys' TTLs.
/// - **Failover**: a primary that does not answer, or `CLUSTERDOWN`, makes the router read
///   the map again (from any node that answers), and the request goes to the slot's new
///   primary (a promoted replica) if there is one; otherwise the error is returned
///   (`Unavailable`, retryable: a waiting `lock()` retries it within its error budget).
///   A lock whose grant had not reached the replica before the failover is gone on the new
///   primary: its next renewal finds it missing, and the guard reports `lost()`. The same
///   asynchronous replication lets another client be granted it meanwhile: `min_replicas`
///   (`WAIT`) narrows that window as it does for Sentinel, and does not close it.
/// - **Waiting**: each primary's [`RedisBackend`] keeps its own notification connection.
///   Releases are published with `PUBLISH`, which a Redis Cluster delivers to subscribers
///   on every node, so a waiter keeps hearing its lock's releases when the slot moves.
#[derive(Clone)]
pub struct RedisClusterBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: Arc<RedisConfig>,
    dialer: Dialer,
    /// The configured nodes, asked for the map when no known primary answers.
    seeds: Vec<Addr>,
    map: RwLock<SlotMap>,
    /// One backend per primary, connected on first use.
    nodes: StdMutex<HashMap<Addr, Arc<OnceCell<RedisBackend>>>>,
    /// When the map was last read; held while it is read, so one read runs at a time.
    refreshed: tokio::sync::Mutex<Option<Instant>>,
}

impl RedisClusterBackend {
    /// Reads the cluster's map from the configured nodes, connects to every primary and
    /// loads the scripts there.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] for an invalid configuration (one that is not a cluster's:
    /// `cluster` unset, a `db` other than 0, a Sentinel master); [`ErrorKind::Unavailable`]
    /// when no configured node answers, or the cluster does not serve every slot;
    /// [`ErrorKind::Auth`] for wrong credentials.
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        config.validate()?;
        if !config.cluster {
            return Err(Error::invalid_config(
                "redis.cluster is not set: a Redis Cluster is named by a redis+cluster:// URL or redis.cluster = true (one server or Sentinel: RedisBackend)",
            ));
        }
        let seeds = config
            .hosts
            .iter()
            .map(|h| parse_host(h))
            .collect::<Result<Vec<_>>>()?;
        let backend = RedisClusterBackend {
            inner: Arc::new(Inner {
                dialer: Dialer::of(&config)?,
                config: Arc::new(config),
                seeds,
                map: RwLock::default(),
                nodes: StdMutex::default(),
                refreshed: tokio::sync::Mutex::new(None),
            }),
        };
        backend.refresh(None).await?;
        if !backend.map().is_complete() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                BACKEND,
                "the cluster does not serve every slot (CLUSTER SLOTS has gaps): is it still being set up?",
            )
            .with_retryable(true));
        }
        let primaries = backend.map().primaries();
        for connected in join_all(primaries.iter().map(|addr| backend.node(addr))).await {
            connected?;
        }
        Ok(backend)
    }

    /// The hash slot that every key of `key`'s lock lives in (its mutex, semaphore,
    /// read-write lock and election alike): `CLUSTER KEYSLOT` of any of them. The primary
    /// that serves it holds the lock.
    pub fn slot_of(key: &LockKey) -> u16 {
        slot_of(key)
    }

    /// The configuration this backend was connected with.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    fn map(&self) -> SlotMap {
        self.inner
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The backend of the primary at `addr`, connecting to it first if need be.
    async fn node(&self, addr: &Addr) -> Result<RedisBackend> {
        let cell = self
            .inner
            .nodes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(addr.clone())
            .or_default()
            .clone();
        let node = cell
            .get_or_try_init(|| {
                RedisBackend::cluster_node(
                    self.inner.dialer.clone(),
                    self.inner.config.clone(),
                    addr.clone(),
                )
            })
            .await?;
        Ok(node.clone())
    }

    /// Reads the map again, from the primaries it names and then the configured nodes, the
    /// first that answers. Skipped when it was read after `since` (another request's read
    /// found what this one would) or less than [`REFRESH_INTERVAL`] ago.
    async fn refresh(&self, since: Option<Instant>) -> Result<()> {
        let mut refreshed = self.inner.refreshed.lock().await;
        if let (Some(last), Some(since)) = (*refreshed, since)
            && (last > since || last.elapsed() < REFRESH_INTERVAL)
        {
            return Ok(());
        }
        let mut candidates = self.map().primaries();
        for seed in &self.inner.seeds {
            if !candidates.contains(seed) {
                candidates.push(seed.clone());
            }
        }
        let mut failures = Vec::new();
        for addr in candidates {
            match self.read_map(&addr).await {
                Ok(map) => {
                    *self
                        .inner
                        .map
                        .write()
                        .unwrap_or_else(PoisonError::into_inner) = map;
                    *refreshed = Some(Instant::now());
                    return Ok(());
                }
                Err(e) => failures.push((addr, e)),
            }
        }
        // Every node refusing the same way for a reason retries cannot fix (credentials, a
        // server that is no cluster node) is that error, not an outage.
        let kind = match failures.first() {
            Some((_, first))
                if !first.is_retryable()
                    && failures.iter().all(|(_, e)| e.kind() == first.kind()) =>
            {
                first.kind()
            }
            _ => ErrorKind::Unavailable,
        };
        let details: Vec<String> = failures
            .iter()
            .map(|((host, port), e)| format!("{host}:{port}: {}", e.message()))
            .collect();
        Err(Error::new(
            kind,
            BACKEND,
            format!(
                "no node of the cluster answered CLUSTER SLOTS: {}",
                details.join("; ")
            ),
        )
        .with_retryable(kind == ErrorKind::Unavailable))
    }

    /// `CLUSTER SLOTS` from the node at `addr`, on a connection of its own.
    async fn read_map(&self, addr: &Addr) -> Result<SlotMap> {
        let dialer = &self.inner.dialer;
        let client =
            dialer.client(dialer.info(&addr.0, addr.1, redis::ProtocolVersion::RESP2)?)?;
        let reply: redis::Value = dialer
            .bounded("reading the cluster's slots", async move {
                let mut con = client.get_multiplexed_async_connection().await?;
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut con)
                    .await
            })
            .await
            .map_err(|e| {
                if e.message().contains("cluster support disabled") {
                    Error::new(
                        ErrorKind::InvalidConfig,
                        BACKEND,
                        "not a Redis Cluster node (cluster support disabled): use a redis:// URL",
                    )
                } else {
                    e
                }
            })?;
        SlotMap::parse(&reply, &addr.0)
    }

    /// Runs `request` on the primary of `key`'s slot, following the slot when it moved or
    /// is migrating and the map when a primary failed, within the request bound.
    async fn on_key<T, F, Fut>(&self, key: &LockKey, what: &str, request: F) -> Result<T>
    where
        F: Fn(RedisBackend) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let slot = slot_of(key);
        let bound = self.inner.dialer.request_bound();
        let started = Instant::now();
        let mut refreshed_for_this = false;
        let mut moves = 0u32;
        loop {
            let owner = self.map().owner(slot).cloned();
            let Some(owner) = owner else {
                self.refresh(Some(started)).await?;
                if self.map().owner(slot).is_none() {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        BACKEND,
                        format!("no primary serves slot {slot} (of {key})"),
                    )
                    .with_retryable(true));
                }
                continue;
            };
            let outcome = match self.node(&owner).await {
                Ok(node) => request(node).await,
                Err(e) => Err(e),
            };
            let error = match outcome {
                Ok(value) => return Ok(value),
                Err(e) => e,
            };
            let Some(reroute) = Reroute::of(&error) else {
                return Err(error);
            };
            if started.elapsed() >= bound {
                return Err(match reroute {
                    Reroute::Migrating => timed_out(
                        BACKEND,
                        &format!("{what} (slot {slot} is being migrated)"),
                        bound,
                    ),
                    _ => error,
                });
            }
            match reroute {
                Reroute::Moved(to) => {
                    self.inner
                        .map
                        .write()
                        .unwrap_or_else(PoisonError::into_inner)
                        .moved(slot, to);
                    // Two nodes can send a request back and forth while a migration is being
                    // finalized (each has yet to learn the other's `SETSLOT ... NODE`).
                    moves += 1;
                    if moves > 1 {
                        tokio::time::sleep(MIGRATION_PAUSE).await;
                    }
                }
                Reroute::Migrating => tokio::time::sleep(MIGRATION_PAUSE).await,
                Reroute::Unreachable => {
                    // Once per request: a primary that does not answer while the map still
                    // names it is an outage the caller hears about (and retries).
                    if refreshed_for_this {
                        return Err(error);
                    }
                    refreshed_for_this = true;
                    if self.refresh(Some(started)).await.is_err()
                        || self.map().owner(slot) == Some(&owner)
                    {
                        return Err(error);
                    }
                }
            }
        }
    }
}

#[async_trait]
impl LockBackend for RedisClusterBackend {
    fn name(&self) -> &'static str {
        "redis-cluster"
    }

    fn tier(&self) -> Tier {
        Tier::Replicated
    }

    fn capabilities(&self) -> Capabilities {
        RedisBackend::capabilities_with(self.inner.config.notifications)
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let tried = StdMutex::new(Vec::<RedisBackend>::new());
        let outcome = self
            .on_key(&request.key, "acquiring", |node| {
                tried
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(node.clone());
                async move { node.try_acquire(request).await }
            })
            .await;
        // A primary the attempt left (the slot moved on) forgets the waiter it registered.
        let tried = tried.into_inner().unwrap_or_else(PoisonError::into_inner);
        if let Some((last, earlier)) = tried.split_last() {
            for node in earlier.iter().filter(|node| !node.same_node(last)) {
                node.forget_waiter(request);
            }
        }
        outcome
    }

    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        self.on_key(&request.key, "waiting", |node| async move {
            node.wait_for_change(request, contention, max_wait).await
        })
        .await
    }

    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        self.on_key(&request.key, "abandoning", |node| async move {
            node.abandon(request).await
        })
        .await
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        self.on_key(lease.key(), "renewing", |node| async move {
            node.renew(lease).await
        })
        .await
    }

    /// One pipeline per primary for the leases its slots hold, as the map says; a lease
    /// whose answer says its slot moved, is migrating or lost its primary goes again alone,
    /// following its slot.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        let map = self.map();
        let mut by_owner: HashMap<Addr, Vec<usize>> = HashMap::new();
        for (i, lease) in leases.iter().enumerate() {
            if let Some(owner) = map.owner(slot_of(lease.key())) {
                by_owner.entry(owner.clone()).or_default().push(i);
            }
        }
        let mut results: Vec<Option<Result<Renewal>>> = leases.iter().map(|_| None).collect();
        let batches = join_all(by_owner.into_iter().map(|(owner, indices)| async move {
            let batch: Vec<Lease> = indices.iter().map(|&i| leases[i].clone()).collect();
            let renewed = match self.node(&owner).await {
                Ok(node) => node.renew_many(&batch).await,
                Err(e) => batch
                    .iter()
                    .map(|_| Err(crate::error::repeat(&e)))
                    .collect(),
            };
            (indices, renewed)
        }))
        .await;
        for (indices, renewed) in batches {
            for (i, result) in indices.into_iter().zip(renewed) {
                results[i] = Some(result);
            }
        }
        let again = results.iter().enumerate().filter_map(|(i, r)| match r {
            None => Some(i),
            Some(Err(e)) if Reroute::of(e).is_some() => Some(i),
            Some(_) => None,
        });
        let again: Vec<usize> = again.collect();
        let retried = join_all(again.iter().map(|&i| self.renew(&leases[i]))).await;
        for (i, result) in again.into_iter().zip(retried) {
            results[i] = Some(result);
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(Error::new(
                        ErrorKind::Backend,
                        BACKEND,
                        "a renewal got no answer",
                    ))
                })
            })
            .collect()
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        self.on_key(lease.key(), "releasing", |node| async move {
            node.release(lease).await
        })
        .await
    }

    async fn is_held(&self, lease: &Lease) -> Result<bool> {
        self.on_key(lease.key(), "checking a lease", |node| async move {
            node.is_held(lease).await
        })
        .await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.on_key(
            key,
            "inspecting",
            |node| async move { node.inspect(key).await },
        )
        .await
    }

    /// Every primary answers.
    async fn ping(&self) -> Result<()> {
        let primaries = self.map().primaries();
        for addr in primaries {
            self.node(&addr).await?.ping().await?;
        }
        Ok(())
    }

    /// The locks of each primary in turn (sorted by address); the cursor names the primary
    /// and its own cursor. A lock whose slot moves while the listing runs may be listed
    /// twice or not at all, as a `SCAN` over a server that changes may.
    async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        let primaries = self.map().primaries();
        let (mut index, mut inner) = match cursor {
            None => (0, None),
            Some(cursor) => {
                let (addr, inner) = cursor.split_once('|').ok_or_else(|| {
                    Error::invalid_config(format!("not a redis-cluster listing cursor: {cursor}"))
                })?;
                let addr = parse_host(addr)?;
                let index = primaries.partition_point(|p| *p < addr);
                let same = primaries.get(index) == Some(&addr);
                // A primary gone since the last page: go on with the next one.
                (index, (same && !inner.is_empty()).then(|| inner.to_owned()))
            }
        };
        while let Some(addr) = primaries.get(index) {
            let page = self
                .node(addr)
                .await?
                .list(namespace, prefix, inner.as_deref(), limit)
                .await?;
            if let Some(next) = page.next {
                return Ok(LockPage::new(
                    page.locks,
                    Some(format!("{}:{}|{next}", addr.0, addr.1)),
                ));
            }
            // This primary is done: the next one's first page follows.
            let next = primaries
                .get(index + 1)
                .map(|p| format!("{}:{}|", p.0, p.1));
            if !page.locks.is_empty() || next.is_none() {
                return Ok(LockPage::new(page.locks, next));
            }
            index += 1;
            inner = None;
        }
        Ok(LockPage::new(Vec::new(), None))
    }

    async fn force_release(&self, key: &LockKey) -> Result<bool> {
        self.on_key(key, "breaking the lock", |node| async move {
            node.force_release(key).await
        })
        .await
    }

    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool> {
        self.on_key(lease.key(), "proclaiming", |node| async move {
            node.proclaim(lease, value).await
        })
        .await
    }

    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>> {
        self.on_key(key, "reading the leader", |node| async move {
            node.leader(key).await
        })
        .await
    }

    async fn wait_for_leader_change(
        &self,
        key: &LockKey,
        seen: Option<&Leader>,
        max_wait: Duration,
    ) -> Result<()> {
        self.on_key(key, "waiting for a leader change", |node| async move {
            node.wait_for_leader_change(key, seen, max_wait).await
        })
        .await
    }
}

impl fmt::Debug for RedisClusterBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisClusterBackend")
            .field("tier", &Tier::Replicated)
            .field("config", &self.inner.config)
            .field("primaries", &self.map().primaries())
            .finish_non_exhaustive()
    }
}
