//! [`RedisClusterBackend`]: locks on a Redis Cluster, each on the primary that owns its slot
//! (`router.rs` finds it; `route.rs` reads what a redirect says; `slots.rs` holds the map).

mod route;
mod router;
mod slots;

pub(crate) use route::redirected;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex as StdMutex, OnceLock, PoisonError, RwLock};
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
use crate::error::BACKEND;
use crate::scripts::{self, PubSub};
use route::Reroute;
use router::{gone_when_sent_again, unavailable};
use slots::{Addr, SlotMap, slot_of};

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
///   primary at once; `ASK` / `TRYAGAIN` (the slot is migrating and the request's keys are
///   not all on the source) are waited out, 10 ms at a time, within the request bound
///   (`connect_timeout + response_timeout`): `ASKING` is not sent, so a request waits until
///   its keys are back on one side, and one whose keys include some that do not exist (a
///   queue nobody waits in) until the slot's migration is over (`SETSLOT ... NODE`). A held
///   lock whose slot moved is renewed on its new primary (`MIGRATE` keeps the keys' TTLs);
///   a migration that outlasts the bound fails the slot's requests with a retryable
///   `Unavailable` meanwhile, and a lease whose renewals cannot get through before its
///   validity ends is reported lost.
/// - **Failover**: a primary that does not answer, or `CLUSTERDOWN`, makes the router read
///   the map again (from every other node at once, every 100 ms), and the request goes to
///   the slot's new primary (a promoted replica) once there is one, within the request
///   bound; otherwise it fails with `Unavailable` (retryable: a waiting `lock()` retries it
///   within its error budget). A release sent again this way that finds the lock gone is
///   `Unavailable` too: the first send may have released it.
///   A lock whose grant had not reached the replica before the failover is gone on the new
///   primary: its next renewal finds it missing, and the guard reports `lost()`. The same
///   asynchronous replication lets another client be granted it meanwhile: `min_replicas`
///   (`WAIT`) narrows that window as it does for Sentinel, and does not close it.
/// - **Waiting**: each primary's [`RedisBackend`] keeps its own notification connection,
///   with sharded pub/sub (Redis 7 and later): the scripts `SPUBLISH` on channels of the
///   lock's slot (a waiter's inbox is one channel per lock, `inbox:lock`), heard only by the
///   nodes of that slot's shard, and a waiter `SSUBSCRIBE`s on the primary it queued on.
///   When the slot moves, that primary ends the subscription: the notifier wakes its
///   waiters, which attempt again, queue on the slot's new primary and listen there (a
///   subscription answered `MOVED` is not a refusal: the next attempt follows the slot).
///   Sharded pub/sub is chosen at connect time when every primary runs Redis 7 or later;
///   otherwise every primary publishes and subscribes the classic way, which the cluster
///   delivers on every node (a primary that joins later without sharded pub/sub does so
///   too). A refused subscription makes waiters poll, as elsewhere.
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
    /// The primary each queued mutex waiter (by owner digest) last attempted on: the one
    /// that registered it for a hand-over, and the one whose notifier its wait listens to.
    waiters: StdMutex<HashMap<String, RedisBackend>>,
    /// How every primary publishes and its waiters listen, decided at connect time.
    pubsub: OnceLock<PubSub>,
    /// The grants that proclaimed a value, whichever primary their slot is on now.
    proclaimed: Arc<crate::election::Proclaimed>,
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
                waiters: StdMutex::default(),
                pubsub: OnceLock::new(),
                proclaimed: Arc::default(),
            }),
        };
        backend.refresh(None, None).await?;
        if !backend.map().is_complete() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                BACKEND,
                "the cluster does not serve every slot (CLUSTER SLOTS has gaps): is it still being set up?",
            )
            .with_retryable(true));
        }
        let primaries = backend.map().primaries();
        let sharded = join_all(
            primaries
                .iter()
                .map(|addr| backend.has_sharded_pubsub(addr)),
        )
        .await;
        let pubsub = if sharded.iter().all(|sharded| *sharded) {
            PubSub::Sharded
        } else {
            PubSub::Classic
        };
        let _ = backend.inner.pubsub.set(pubsub);
        for connected in join_all(primaries.iter().map(|addr| backend.node(addr))).await {
            connected?;
        }
        Ok(backend)
    }

    /// The hash slot that every key of `key`'s lock lives in (its mutex, semaphore,
    /// read-write lock and election alike): `CLUSTER KEYSLOT` of any of them. The primary
    /// that serves it holds the lock. `None` for a key the cluster backend refuses
    /// (`InvalidKey`): one whose namespace starts with `}`, which leaves its keys without a
    /// common hash tag.
    pub fn slot_of(key: &LockKey) -> Option<u16> {
        slot_of(key)
    }

    /// The configuration this backend was connected with.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
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

    /// Waiters are notified while every connected primary notifies them (one that refused a
    /// subscription lately makes its waiters poll).
    fn capabilities(&self) -> Capabilities {
        let notifies = self.inner.config.notifications
            && self
                .inner
                .nodes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .filter_map(|cell| cell.get())
                .all(RedisBackend::notifies);
        RedisBackend::capabilities_with(notifies)
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let tried = StdMutex::new(Vec::<RedisBackend>::new());
        let outcome = self
            .on_key(&request.key, "acquiring", |node, _| {
                tried
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(node.clone());
                async move { node.try_acquire(request).await }
            })
            .await;
        // A queued waiter stays registered with the primary it queued on; every other one it
        // registered with (this attempt, or an earlier one, before the slot moved) forgets it.
        let digest = request.owner.digest_hex();
        let tried = tried.into_inner().unwrap_or_else(PoisonError::into_inner);
        let queued_on = match (&outcome, tried.last()) {
            (Ok(Attempt::Contended(_)), Some(last)) if request.wait => Some(last.clone()),
            _ => None,
        };
        let before = self.waiters().remove(&digest);
        for node in tried.iter().chain(before.iter()) {
            if !queued_on.as_ref().is_some_and(|q| node.same_node(q)) {
                node.forget_waiter(request);
            }
        }
        if let Some(node) = queued_on {
            self.waiters().insert(digest, node);
        }
        outcome
    }

    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        // A wait listens where the attempt queued: if the slot has moved since (the map says
        // so, or the subscription was answered `MOVED`), the next attempt queues on its new
        // primary first, so that its queue entry names the inbox it listens to there.
        let digest = request.owner.digest_hex();
        let queued_on = self.waiters().get(&digest).cloned();
        let queued_on = &queued_on;
        let waited = self
            .on_key(&request.key, "waiting", |node, _| async move {
                if queued_on.as_ref().is_some_and(|q| !node.same_node(q)) {
                    return Ok(None);
                }
                node.wait_for_change(request, contention, max_wait).await
            })
            .await;
        if matches!(waited, Ok(Some(_))) {
            // Handed over: the waiter holds the lock and is registered nowhere.
            self.waiters().remove(&digest);
        }
        waited
    }

    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        if let Some(queued_on) = self.waiters().remove(&request.owner.digest_hex()) {
            queued_on.forget_waiter(request);
        }
        self.on_key(&request.key, "abandoning", |node, _| async move {
            node.abandon(request).await
        })
        .await
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        self.on_key(lease.key(), "renewing", |node, _| async move {
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
            if let Some(owner) = slot_of(lease.key()).and_then(|slot| map.owner(slot)) {
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
        self.on_key(lease.key(), "releasing", |node, resent| async move {
            gone_when_sent_again(node.release(lease).await, resent)
        })
        .await
    }

    async fn is_held(&self, lease: &Lease) -> Result<bool> {
        self.on_key(lease.key(), "checking a lease", |node, _| async move {
            node.is_held(lease).await
        })
        .await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.on_key(key, "inspecting", |node, _| async move {
            node.inspect(key).await
        })
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
    /// twice or not at all, as a `SCAN` over a server that changes may; a page that meets a
    /// lock whose slot is moving fails with `Unavailable` (retryable: ask for it again).
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
                .await
                .map_err(|e| match Reroute::of(&e) {
                    // A listed lock's slot moved or is migrating (its look failed): this
                    // page again, from the same cursor, finds it where it went.
                    Some(_) => unavailable("listing locks", None, e),
                    None => e,
                })?;
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

    /// The holder is read once, and the break (compare-and-break, see
    /// [`RedisBackend`]'s) carries what was read to whichever primary it is sent to, also
    /// again after a failover.
    async fn force_release(&self, key: &LockKey) -> Result<bool> {
        let holder = self
            .on_key(key, "inspecting", |node, _| async move {
                node.holder(key).await
            })
            .await?;
        let expected = &scripts::Holder::value_of(holder.as_ref());
        self.on_key(key, "breaking the lock", |node, _| async move {
            node.break_lock(key, expected).await
        })
        .await?;
        Ok(holder.is_some())
    }

    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool> {
        self.on_key(lease.key(), "proclaiming", |node, _| async move {
            node.proclaim(lease, value).await
        })
        .await
    }

    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>> {
        self.on_key(key, "reading the leader", |node, _| async move {
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
        self.on_key(key, "waiting for a leader change", |node, _| async move {
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
