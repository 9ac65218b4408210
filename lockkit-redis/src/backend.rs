//! [`RedisBackend`]: locks on one Redis server or on a Sentinel-managed primary.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use async_trait::async_trait;
use lockkit_core::backend::{
    AcquireRequest, Attempt, Contention, Grant, Hold, Leader, Lease, LockBackend, LockPage, Renewal,
};
use lockkit_core::{
    Capabilities, Error, FencingGuarantee, LockInfo, LockKey, Result, Support, Tier, WaitStrategy,
};
use redis::Value;

use crate::config::{RedisConfig, parse_host};
use crate::connection::{Dialer, Primary, Sentinels};
use crate::election::Proclaimed;
use crate::error::{BACKEND, unexpected};
use crate::listing;
use crate::notify::Refusal;
use crate::scripts::{self, Keys, PubSub, Publishing};

/// Locks on one Redis server (tier `single`) or on the primary of a Sentinel group (tier
/// `replicated`).
///
/// - **acquire**: one round trip, the `acquire` Lua script: a free lock is granted (to the
///   first live waiter of its queue, if any) with the fencing token `max(counter + 1, server
///   clock in µs)`, written as `owner:token` with the TTL; on contention it returns the
///   holder's remaining TTL, so a waiter never sleeps past it (`acquire.rs`).
/// - **release**: one round trip, a Lua compare-and-delete, or a hand-over to the first live
///   waiter, that publishes a release notification (`cleanup.rs`).
/// - **renewal**: Lua compare-and-`PEXPIRE`; the leases due at one tick go out as one
///   pipeline (`renewal.rs`).
/// - **waiting**: a mutex waiter queues on the server (first come, first served), in the
///   same script as its attempt; the release script hands the lock to the first live waiter
///   and announces it on that waiter's inbox channel, on the one pub/sub connection every
///   waiter of this backend shares, so the woken waiter holds the lock without another
///   request. Each attempt renews the waiter's entry for one TTL; a waiter that gives up
///   takes its entry with it, and one that vanished loses its turn when its entry lapses
///   (a grant handed to it lapses with the entry). Polling when pub/sub is off
///   ([`RedisConfig::notifications`]) or refused (the queue then hands over to a poller, who
///   finds the lock its own at its next attempt) (`wait.rs`).
/// - **semaphores**: the holders of a key's semaphore are a ZSET of owner digests scored by
///   their expiry (server clock), beside a HASH of their tokens and the agreed permits; one
///   script per operation, as for the mutex (`semaphore.rs`).
/// - **read-write locks**: the semaphore's holders structure with a writer mark, and the
///   waiting writers in a ZSET of records that expire one TTL after their writer's last
///   attempt and keep new readers out (`rwlock.rs`).
///
/// See the crate documentation for what each tier guarantees and what breaks it.
#[derive(Clone)]
pub struct RedisBackend {
    pub(crate) primary: Arc<Primary>,
    pub(crate) config: Arc<RedisConfig>,
    /// Whether the server lately refused a subscription (waiters then poll).
    pub(crate) refusal: Arc<Refusal>,
    /// The grants that proclaimed a value (shared by a cluster's primaries, so that it
    /// follows a lock whose slot moves).
    pub(crate) proclaimed: Arc<Proclaimed>,
}

impl RedisBackend {
    /// Connects to the server (or asks the Sentinels for the primary and connects to it) and
    /// loads the scripts.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] for an invalid configuration; [`ErrorKind::Unavailable`]
    /// when the server does not answer within `connect_timeout + response_timeout`;
    /// [`ErrorKind::Auth`] for wrong credentials.
    ///
    /// [`ErrorKind::InvalidConfig`]: lockkit_core::ErrorKind::InvalidConfig
    /// [`ErrorKind::Unavailable`]: lockkit_core::ErrorKind::Unavailable
    /// [`ErrorKind::Auth`]: lockkit_core::ErrorKind::Auth
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        config.validate()?;
        if config.cluster {
            return Err(Error::invalid_config(
                "redis.cluster is set (a redis+cluster:// URL): connect with RedisClusterBackend",
            ));
        }
        let dialer = Dialer::of(&config)?;
        let hosts = config
            .hosts
            .iter()
            .map(|h| parse_host(h))
            .collect::<Result<Vec<_>>>()?;
        let sentinels = config.sentinel_master.clone().map(|master| Sentinels {
            hosts: hosts.clone(),
            master,
            username: config.sentinel_username.clone(),
            password: config.sentinel_password.clone(),
            next: AtomicUsize::new(0),
        });
        let primary = lockkit_core::backend::runtime::run(async move {
            match sentinels {
                Some(sentinels) => Primary::sentinel(dialer, sentinels).await,
                None => {
                    let addr = hosts
                        .into_iter()
                        .next()
                        .ok_or_else(|| Error::invalid_config("redis.hosts is empty"))?;
                    Primary::fixed(dialer, addr, PubSub::Classic).await
                }
            }
        })
        .await??;
        RedisBackend::on(primary, Arc::new(config), Arc::default()).await
    }

    /// The backend of one primary of a Redis Cluster, at `addr`, publishing as `pubsub` says
    /// (classic if the server has no sharded pub/sub).
    pub(crate) async fn cluster_node(
        dialer: Dialer,
        config: Arc<RedisConfig>,
        addr: (String, u16),
        pubsub: PubSub,
        proclaimed: Arc<Proclaimed>,
    ) -> Result<Self> {
        let primary = lockkit_core::backend::runtime::run(async move {
            Primary::fixed(dialer, addr, pubsub).await
        })
        .await??;
        RedisBackend::on(primary, config, proclaimed).await
    }

    /// The backend on `primary`, once its scripts are loaded and its eviction policy checked.
    async fn on(
        primary: Arc<Primary>,
        config: Arc<RedisConfig>,
        proclaimed: Arc<Proclaimed>,
    ) -> Result<Self> {
        let backend = RedisBackend {
            primary,
            config,
            refusal: Arc::default(),
            proclaimed,
        };
        backend.load_scripts().await?;
        backend.check_eviction().await?;
        Ok(backend)
    }

    /// Forgets the waiter of `request` that an attempt registered with this backend's
    /// notifier: a cluster's router calls it when the lock's slot moved to another primary.
    pub(crate) fn forget_waiter(&self, request: &AcquireRequest) {
        if request.hold == Hold::Exclusive {
            self.primary
                .epoch()
                .notifier
                .inbox()
                .forget(&request.owner.digest_hex());
        }
    }

    /// The scripts that publish, as the primary's notifications are heard.
    pub(crate) fn publishing(&self) -> &'static Publishing {
        Publishing::of(self.primary.epoch().notifier.pubsub())
    }

    /// Whether `other` talks to the same primary through the same connections.
    pub(crate) fn same_node(&self, other: &RedisBackend) -> bool {
        Arc::ptr_eq(&self.primary, &other.primary)
    }

    /// What a Redis backend offers, with waiters notified or polling.
    pub(crate) fn capabilities_with(notifies: bool) -> Capabilities {
        let wait = if notifies {
            WaitStrategy::Notify
        } else {
            WaitStrategy::Poll
        };
        Capabilities::new(FencingGuarantee::BestEffort, wait)
            .with_election(Support::Supported)
            .with_semaphore(Support::Supported)
            .with_rwlock(Support::Supported)
    }

    /// Refuses a server that may evict lock keys, unless the configuration accepts it.
    async fn check_eviction(&self) -> Result<()> {
        let (host, port) = self.primary.epoch().addr.clone();
        let answer = self
            .primary
            .request("reading the eviction policy", |mut con| async move {
                crate::eviction::info_memory()
                    .query_async::<String>(&mut con)
                    .await
            })
            .await;
        crate::eviction::judge(
            BACKEND,
            &format!("{host}:{port}"),
            answer,
            self.config.allow_eviction,
            "redis.allow_eviction",
        )
    }

    /// The configuration this backend was built with.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// Loads every script into the server's script cache.
    async fn load_scripts(&self) -> Result<()> {
        self.primary
            .request("loading the scripts", |mut con| async move {
                scripts::load_all()
                    .query_async::<Vec<String>>(&mut con)
                    .await
            })
            .await
            .map(drop)
    }

    /// Who holds the mutex of `key`, as the inspect script reads it.
    pub(crate) async fn holder(&self, key: &LockKey) -> Result<Option<scripts::Holder>> {
        let lock = &Keys::of(key).lock;
        let reply: Value = self
            .primary
            .request("inspecting", |mut con| async move {
                scripts::INSPECT.key(lock).invoke_async(&mut con).await
            })
            .await?;
        scripts::inspect_reply(BACKEND, &reply)
    }
}

#[async_trait]
impl LockBackend for RedisBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn tier(&self) -> Tier {
        if self.config.sentinel_master.is_some() {
            Tier::Replicated
        } else {
            Tier::Single
        }
    }

    fn capabilities(&self) -> Capabilities {
        RedisBackend::capabilities_with(self.notifies())
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        match request.hold {
            Hold::Exclusive => self.try_acquire_mutex(request).await,
            Hold::Permit { permits } => self.try_acquire_permit(request, permits).await,
            Hold::Read | Hold::Write => self.try_acquire_rw(request).await,
            other => Err(other.unsupported(BACKEND)),
        }
    }

    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        if crate::acquire::queues(request) {
            return self.wait_for_handover(request, contention, max_wait).await;
        }
        self.wait_for_release(request, contention, max_wait).await
    }

    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        self.clean_up(request).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        self.renew_many(std::slice::from_ref(lease))
            .await
            .pop()
            .unwrap_or_else(|| Err(unexpected(BACKEND, "the renew script")))
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        match self.renew_batch(leases).await {
            Ok(renewals) => renewals.into_iter().map(Ok).collect(),
            Err(e) => leases
                .iter()
                .map(|_| Err(crate::error::repeat(&e)))
                .collect(),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        if !matches!(lease.hold(), Hold::Permit { .. } | Hold::Read | Hold::Write) {
            self.proclaimed.forget(lease);
        }
        self.release_hold(lease.key(), lease.hold(), lease.owner())
            .await
    }

    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool> {
        self.proclaim_value(lease, value).await
    }

    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>> {
        self.read_leader(key).await
    }

    async fn wait_for_leader_change(
        &self,
        key: &LockKey,
        seen: Option<&Leader>,
        max_wait: Duration,
    ) -> Result<()> {
        self.wait_for_leader(key, seen, max_wait).await
    }

    async fn is_held(&self, lease: &Lease) -> Result<bool> {
        match lease.hold() {
            Hold::Permit { .. } => return self.holds_permit(lease).await,
            Hold::Read | Hold::Write => return self.holds_rw(lease).await,
            _ => {}
        }
        Ok(self
            .holder(lease.key())
            .await?
            .is_some_and(|holder| holder.is(lease.owner())))
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        Ok(self.holder(key).await?.map(|holder| holder.info))
    }

    /// One `SCAN ... MATCH {namespace/prefix* COUNT limit` (a few when they find nothing;
    /// `COUNT` is a hint to Redis, so a page may hold a few more than `limit`), then each
    /// lock's holder, read concurrently. The cursor is Redis' own.
    async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        lockkit_core::backend::validate_listing(namespace, prefix, limit)?;
        let cursor = listing::scan_cursor(BACKEND, cursor)?;
        let (keys, next) = self
            .primary
            .request("listing locks", |mut con| async move {
                listing::scan(&mut con, namespace, prefix, cursor, limit).await
            })
            .await?;
        let holders = futures_util::future::join_all(keys.iter().map(|key| self.holder(key))).await;
        let mut locks = Vec::with_capacity(keys.len());
        for (key, holder) in keys.into_iter().zip(holders) {
            if let Some(holder) = holder? {
                locks.push((key, holder.info));
            }
        }
        Ok(LockPage::new(locks, (next != 0).then(|| next.to_string())))
    }

    /// Reads the holder, then breaks the lock only while it still holds what was read: a
    /// break sent again after a dropped connection cannot break the grant the first one
    /// handed to the next waiter. Says whether the lock was held when read.
    async fn force_release(&self, key: &LockKey) -> Result<bool> {
        let holder = self.holder(key).await?;
        self.break_lock(key, &scripts::Holder::value_of(holder.as_ref()))
            .await?;
        Ok(holder.is_some())
    }

    async fn ping(&self) -> Result<()> {
        let pong: String = self
            .primary
            .request("ping", |mut con| async move {
                redis::cmd("PING").query_async(&mut con).await
            })
            .await?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(unexpected(BACKEND, "PING"))
        }
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("tier", &self.tier())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
