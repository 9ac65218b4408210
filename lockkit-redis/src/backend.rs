//! [`RedisBackend`]: locks on one Redis server or on a Sentinel-managed primary.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lockkit_core::backend::{
    AcquireRequest, Attempt, Contention, Grant, Hold, Leader, Lease, LockBackend, LockPage,
    OwnerToken, Renewal,
};
use lockkit_core::{
    Capabilities, Error, ErrorKind, FencingGuarantee, FencingToken, LockInfo, LockKey, Result,
    Support, Tier, WaitStrategy,
};
use redis::{Script, Value};

use crate::config::{RedisConfig, parse_host};
use crate::connection::{Dialer, Epoch, Primary, Sentinels};
use crate::election::Proclaimed;
use crate::error::{BACKEND, refused_in_pipeline, unexpected};
use crate::listing;
use crate::notify::Refusal;
use crate::scripts::{self, AcquireReply, Keys, PubSub, Publishing, millis};
use crate::semaphore;

/// Locks on one Redis server (tier `single`) or on the primary of a Sentinel group (tier
/// `replicated`).
///
/// - **acquire**: one round trip, a Lua script that does `SET key owner:token NX PX ttl` and,
///   on success, increments the key's fence counter (the fencing token); on contention it
///   returns the holder's remaining TTL, so a waiter never sleeps past it.
/// - **release**: one round trip, a Lua compare-and-delete that publishes a release
///   notification.
/// - **renewal**: Lua compare-and-`PEXPIRE`; the leases due at one tick go out as one
///   pipeline.
/// - **waiting**: a mutex waiter queues on the server (first come, first served), in the
///   same script as its attempt; the release script hands the lock to the first live waiter
///   and announces it on that waiter's inbox channel, on the one pub/sub connection every
///   waiter of this backend shares, so the woken waiter holds the lock without another
///   request. Each attempt renews the waiter's entry for one TTL; a waiter that gives up
///   takes its entry with it, and one that vanished loses its turn when its entry lapses
///   (a grant handed to it lapses with the entry). Polling when pub/sub is off
///   ([`RedisConfig::notifications`]) or refused (the queue then hands over to a poller, who
///   finds the lock its own at its next attempt).
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
    refusal: Arc<Refusal>,
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
        primary: Primary,
        config: Arc<RedisConfig>,
        proclaimed: Arc<Proclaimed>,
    ) -> Result<Self> {
        let backend = RedisBackend {
            primary: Arc::new(primary),
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

    /// Runs a kind's acquire `script` with `keys` and `args` for `request`. With
    /// `min_replicas`, the script and `WAIT min_replicas replica_timeout` go in one pipeline
    /// on the connection reserved for it, and a grant fewer replicas acknowledged is given
    /// back (the kind's release, [`RedisBackend::release_on`]) and is an error.
    pub(crate) async fn acquire_with<R: AcquireScriptReply>(
        &self,
        request: &AcquireRequest,
        script: &Script,
        keys: &[&str],
        args: &[String],
    ) -> Result<R> {
        if self.config.min_replicas == 0 {
            let mut invocation = script.prepare_invoke();
            invocation.key(keys).arg(args);
            let invocation = &invocation;
            let reply = self
                .primary
                .request(R::WHAT, |mut con| async move {
                    invocation.invoke_async::<Value>(&mut con).await
                })
                .await?;
            return R::parse(&reply);
        }
        let mut invocation = redis::cmd("EVALSHA");
        invocation
            .arg(script.get_hash())
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        let (reply, acked) = self.invoke_replicated(&invocation, R::SCRIPT).await?;
        let reply = R::parse(&reply)?;
        if !reply.is_grant() || acked >= self.config.min_replicas as usize {
            return Ok(reply);
        }
        if let Err(e) = self
            .release_hold(&request.key, request.hold, &request.owner)
            .await
        {
            tracing::warn!(error = %e, hold = ?request.hold, "could not give back an unreplicated grant; it expires with its TTL");
        }
        Err(self.unreplicated(acked))
    }

    /// The arguments of the acquire script for `request` (its keys are [`Keys::acquire`]): a
    /// request that will wait queues under the name `queued_as` (see
    /// `Handover::attempting`), its hand-over announced on this epoch's inbox (unless its
    /// waiters poll).
    fn acquire_args(&self, request: &AcquireRequest, queued_as: Option<&str>) -> [String; 8] {
        let (queue, name, inbox) = match queued_as {
            Some(name) => {
                let inbox = if self.notifies() {
                    self.primary.epoch().notifier.inbox().name().to_owned()
                } else {
                    String::new()
                };
                ("1".to_owned(), name.to_owned(), inbox)
            }
            None => (String::new(), String::new(), String::new()),
        };
        [
            request.owner.expose_hex(),
            millis(request.ttl).to_string(),
            millis(self.config.fence_ttl).to_string(),
            String::new(),
            queue,
            name,
            inbox,
            String::new(),
        ]
    }

    /// A script's `invocation` and `WAIT min_replicas replica_timeout` in one pipeline, on
    /// the connection reserved for it (`WAIT` counts that connection's writes and blocks it).
    /// Returns the script's reply and how many replicas acknowledged it.
    async fn invoke_replicated(
        &self,
        invocation: &redis::Cmd,
        script: &str,
    ) -> Result<(Value, usize)> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.add_command(invocation.clone());
        pipe.cmd("WAIT")
            .arg(self.config.min_replicas)
            .arg(millis(self.config.replica_timeout));
        let pipe = &pipe;
        let replies = self
            .primary
            .request_on(
                "acquiring",
                |epoch| epoch.replication.clone(),
                |mut con| async move {
                    let replies = scripts::query_reloading(pipe, &mut con).await?;
                    scripts::primary_moved(&replies).map_or(Ok(replies), Err)
                },
            )
            .await?;
        match replies.as_slice() {
            [Value::ServerError(e), _] => Err(refused_in_pipeline(script, e)),
            [reply, Value::Int(acked)] => Ok((reply.clone(), usize::try_from(*acked).unwrap_or(0))),
            _ => Err(unexpected(BACKEND, &format!("{script} and WAIT"))),
        }
    }

    /// The error of a grant that `acked` replicas acknowledged, fewer than `min_replicas`,
    /// and that was given back.
    fn unreplicated(&self, acked: usize) -> Error {
        let need = self.config.min_replicas as usize;
        Error::new(
            ErrorKind::QuorumNotReached { got: acked, need },
            BACKEND,
            format!(
                "the grant reached {acked} replica(s) within {:?}, min_replicas = {need}: it was given back",
                self.config.replica_timeout
            ),
        )
        .with_retryable(true)
    }

    /// Releases `owner`'s `hold` of `key` on the caller's connection, and says whether it
    /// was held.
    ///
    /// A release sent again after its connection dropped (see `Primary::request_on`) that
    /// finds the grant gone cannot tell whether its first send released it (the reply was
    /// lost) or the grant was gone before: that is an error saying so, not "not ours", which
    /// would report a lock lost that was released.
    pub(crate) async fn release_hold(
        &self,
        key: &LockKey,
        hold: Hold,
        owner: &OwnerToken,
    ) -> Result<bool> {
        let released = self.release_on(key, hold, owner, Epoch::for_caller).await?;
        RedisBackend::verdict(released)
    }

    /// What a release answers for what its script found.
    pub(crate) fn verdict(released: Released) -> Result<bool> {
        match released {
            Released::Ours => Ok(true),
            Released::NotOurs => Ok(false),
            Released::GoneWhenSentAgain => Err(Error::new(
                ErrorKind::Unavailable,
                BACKEND,
                "the release was sent again after its connection dropped and found the grant gone: the first send may have released it, or it was lost before",
            )),
        }
    }

    /// The release script of `hold` (a mutex, a permit, a read or the write lock) for
    /// `owner`'s grant of `key`, and its own waiting entry of a wait it gives up, on the
    /// connection `pick` chooses. Every kind's script answers 1 for a grant it released.
    pub(crate) async fn release_on(
        &self,
        key: &LockKey,
        hold: Hold,
        owner: &OwnerToken,
        pick: fn(&Epoch) -> redis::aio::ConnectionManager,
    ) -> Result<Released> {
        let publishing = self.publishing();
        let (invocation, what) = match hold {
            Hold::Permit { .. } => (
                semaphore::release_invocation(publishing, key, owner),
                "giving a permit back",
            ),
            Hold::Read | Hold::Write => (
                crate::rwlock::release_invocation(publishing, key, owner),
                "releasing a read-write lock",
            ),
            _ => (self.mutex_release_invocation(key, owner), "releasing"),
        };
        let invocation = &invocation;
        let sends = &AtomicUsize::new(0);
        let released: i64 = self
            .primary
            .request_on(what, pick, |mut con| async move {
                sends.fetch_add(1, Ordering::SeqCst);
                invocation.invoke_async(&mut con).await
            })
            .await?;
        Ok(match released {
            1 => Released::Ours,
            _ if sends.load(Ordering::SeqCst) > 1 => Released::GoneWhenSentAgain,
            _ => Released::NotOurs,
        })
    }

    /// The mutex's release script for `owner`: its lock (handed over to the next waiter if
    /// one is queued), and its own queue entry.
    fn mutex_release_invocation(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
    ) -> redis::ScriptInvocation<'static> {
        let keys = Keys::of(key);
        let mut invocation = self.publishing().release.prepare_invoke();
        invocation
            .key(&keys.release()[..])
            .arg(owner.expose_hex())
            .arg(&keys.channel)
            .arg(millis(self.config.fence_ttl));
        invocation
    }

    /// Runs the force-release script for a lock read holding `expected` (`""`: free).
    pub(crate) async fn break_lock(&self, key: &LockKey, expected: &str) -> Result<()> {
        let keys = &Keys::of(key);
        let fence_ttl = millis(self.config.fence_ttl);
        let publishing = self.publishing();
        let reply: Value = self
            .primary
            .request("breaking the lock", |mut con| async move {
                publishing
                    .force_release
                    .key(&keys.release()[..])
                    .arg(&keys.channel)
                    .arg(fence_ttl)
                    .arg("")
                    .arg(expected)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        match reply {
            Value::Int(_) => Ok(()),
            _ => Err(unexpected(BACKEND, "the force-release script")),
        }
    }

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

    /// One pipelined round trip of compare-and-`PEXPIRE`s (plus `WAIT` with `min_replicas`).
    async fn renew_batch(&self, leases: &[Lease]) -> Result<Vec<Renewal>> {
        let mut pipe =
            scripts::renew_pipeline(leases, self.config.fence_ttl, Some(&self.proclaimed));
        if self.config.min_replicas > 0 {
            pipe.cmd("WAIT")
                .arg(self.config.min_replicas)
                .arg(millis(self.config.replica_timeout));
        }
        let pipe = &pipe;
        let mut replies = self
            .primary
            .request_on(
                "renewing",
                |epoch| epoch.renewals.clone(),
                |mut con| async move {
                    let replies = scripts::query_reloading(pipe, &mut con).await?;
                    scripts::primary_moved(&replies).map_or(Ok(replies), Err)
                },
            )
            .await?;
        if self.config.min_replicas > 0 {
            let acked = match replies.pop() {
                Some(Value::Int(n)) => usize::try_from(n).unwrap_or(0),
                _ => return Err(unexpected(BACKEND, "WAIT")),
            };
            let need = self.config.min_replicas as usize;
            if acked < need {
                return Err(Error::new(
                    ErrorKind::QuorumNotReached { got: acked, need },
                    BACKEND,
                    format!("a renewal reached {acked} replica(s), min_replicas = {need}"),
                )
                .with_retryable(true));
            }
        }
        if replies.len() != leases.len() {
            return Err(unexpected(BACKEND, "a renewal pipeline"));
        }
        replies
            .iter()
            .zip(leases)
            .map(|(reply, lease)| match (scripts::renewed(reply), reply) {
                (Some(true), _) => Ok(Renewal::Extended(lease.ttl())),
                (Some(false), _) => {
                    self.proclaimed.forget(lease);
                    Ok(Renewal::Lost)
                }
                (None, Value::ServerError(e)) => Err(refused_in_pipeline("renewal", e)),
                (None, _) => Err(Error::new(
                    ErrorKind::Backend,
                    BACKEND,
                    format!("renewal failed: {reply:?}"),
                )
                .with_retryable(true)),
            })
            .collect()
    }

    /// The wait of a queued mutex waiter: until the lock is handed over to it (announced on
    /// the inbox), or `max_wait`, or the holder's remaining TTL (a holder that expires hands
    /// over at the next attempt of any waiter), at most a third of the waiter's TTL so that
    /// its attempts keep its queue entry alive.
    async fn wait_for_handover(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        let notifier = &self.primary.epoch().notifier;
        let handover = notifier.inbox().expect(&request.owner.digest_hex());
        let subscription = match notifier
            .subscribe(&notifier.inbox_channel(&request.key), contention.marker)
            .await
        {
            Ok(subscription) => subscription,
            Err(e) if crate::cluster::redirected(&e) => return Err(e),
            Err(e) => {
                self.poll_for_a_while(&e);
                return Ok(None);
            }
        };
        // The inbox was not subscribed when the attempt was sent (or lost its subscription
        // since): the lock may have been handed over unannounced. Look at once.
        if subscription.changed_since_marker() {
            return Ok(None);
        }
        let max_wait = max_wait
            .min(contention.retry_after.unwrap_or(max_wait))
            .min(request.ttl / 3);
        let _ = tokio::time::timeout(max_wait, handover.arrived()).await;
        drop(subscription);
        let token = handover.tokens().first().map(|(_, token)| *token);
        match token {
            // With min_replicas, a grant counts once replicas acknowledged it: the next
            // attempt finds the lock ours and waits for them.
            Some(token) if self.config.min_replicas == 0 => {
                notifier.inbox().forget(&request.owner.digest_hex());
                Ok(Some(Grant::new(FencingToken(token), request.ttl)))
            }
            _ => Ok(None),
        }
    }

    /// Whether waiters are woken by release notifications now (configured, and the server
    /// did not refuse them lately).
    pub(crate) fn notifies(&self) -> bool {
        self.config.notifications && self.refusal.allows()
    }

    /// Falls back to polling for a while after the server refused a subscription. (A
    /// subscription a cluster answered `MOVED` is no refusal: the waits return that error, and
    /// the cluster's router follows the slot.)
    pub(crate) fn poll_for_a_while(&self, error: &Error) {
        if self.refusal.refused(error) {
            tracing::warn!(error = %error, "release notifications unavailable; waiters poll with backoff");
        }
    }
}

/// The reply of a kind's acquire script, as [`RedisBackend::acquire_with`] reads it.
pub(crate) trait AcquireScriptReply: Sized {
    /// The request, as a timeout names it.
    const WHAT: &'static str;
    /// The script, as an error names it.
    const SCRIPT: &'static str;
    /// Reads the script's reply.
    fn parse(value: &Value) -> Result<Self>;
    /// Whether the reply grants the request.
    fn is_grant(&self) -> bool;
}

impl AcquireScriptReply for AcquireReply {
    const WHAT: &'static str = "acquiring";
    const SCRIPT: &'static str = "the acquire script";

    fn parse(value: &Value) -> Result<Self> {
        scripts::acquire_reply(BACKEND, value)
    }

    fn is_grant(&self) -> bool {
        matches!(self, AcquireReply::Granted(_))
    }
}

/// What a release script found, from [`RedisBackend::release_on`].
pub(crate) enum Released {
    /// The lock was the caller's, and is released.
    Ours,
    /// The lock was not the caller's.
    NotOurs,
    /// Not the caller's at a second send after the connection dropped: the first send may
    /// have released it.
    GoneWhenSentAgain,
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
            Hold::Exclusive => {}
            Hold::Permit { permits } => return self.try_acquire_permit(request, permits).await,
            Hold::Read | Hold::Write => return self.try_acquire_rw(request).await,
            other => return Err(other.unsupported(BACKEND)),
        }
        let keys = Keys::of(&request.key);
        // Registered before the attempt that may queue it, so that no hand-over announced
        // from then on is missed; the marker tells the wait whether the inbox was subscribed.
        let epoch = request.wait.then(|| self.primary.epoch());
        let notifier = epoch.as_ref().map(|epoch| &epoch.notifier);
        let (marker, digest, queued_as) = match notifier {
            Some(notifier) => {
                let digest = request.owner.digest_hex();
                let queued_as = notifier.inbox().expect(&digest).attempting(&digest);
                let marker = notifier.marker(&notifier.inbox_channel(&request.key));
                (marker, Some(digest), Some(queued_as))
            }
            None => (None, None, None),
        };
        let args = self.acquire_args(request, queued_as.as_deref());
        let reply = self
            .acquire_with(request, &self.publishing().acquire, &keys.acquire(), &args)
            .await?;
        match reply {
            AcquireReply::Granted(token) => {
                if let (Some(notifier), Some(digest)) = (notifier, &digest) {
                    notifier.inbox().forget(digest);
                }
                Ok(Attempt::Granted(Grant::new(token, request.ttl)))
            }
            AcquireReply::Contended(remaining) => {
                let contention = match marker {
                    Some(marker) => Contention::new().with_marker(marker),
                    None => Contention::new(),
                };
                // The script writes nothing for a try that does not get the lock; a waiter's
                // attempt queued it.
                let contention = if request.wait {
                    contention
                } else {
                    contention.with_nothing_left()
                };
                Ok(Attempt::Contended(match remaining {
                    Some(remaining) => contention.with_retry_after(remaining),
                    None => contention,
                }))
            }
        }
    }

    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        if request.hold == Hold::Exclusive {
            return self.wait_for_handover(request, contention, max_wait).await;
        }
        let channel = semaphore::channel_of(&request.key, request.hold);
        let epoch = self.primary.epoch();
        let mut subscription = match epoch.notifier.subscribe(&channel, contention.marker).await {
            Ok(subscription) => subscription,
            Err(e) if crate::cluster::redirected(&e) => return Err(e),
            Err(e) => {
                self.poll_for_a_while(&e);
                return Ok(None);
            }
        };
        // A release between the attempt and the subscription published nothing we saw: try
        // again at once (the attempt costs what a look at the holder would, and may win).
        // Subscribed since before the attempt with nothing received since, the holder the
        // attempt saw still holds, and its release will be seen.
        if subscription.changed_since_marker() {
            return Ok(None);
        }
        let remaining = contention.retry_after.unwrap_or(max_wait);
        let _ = tokio::time::timeout(max_wait.min(remaining), subscription.released()).await;
        Ok(None)
    }

    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        let notifier = &self.primary.epoch().notifier;
        if request.hold == Hold::Exclusive {
            notifier.inbox().forget(&request.owner.digest_hex());
        } else {
            // This acquisition may have taken the wake-up of a release: another waiter retries.
            notifier.pass_on(&semaphore::channel_of(&request.key, request.hold));
        }
        // The clean-up follows the attempts on their connection, so the server runs it after
        // them, never before (a grant nobody holds, for a TTL): with min_replicas the
        // replication connection, where an attempt may still wait behind other tasks' WAITs;
        // otherwise the application runtime's (the clean-up of a dropped acquisition runs on
        // lockkit's runtime).
        let pick: fn(&Epoch) -> redis::aio::ConnectionManager = if self.config.min_replicas > 0 {
            |epoch| epoch.replication.clone()
        } else {
            Epoch::after_attempts
        };
        // Whatever the clean-up found, nothing of the request is left.
        self.release_on(&request.key, request.hold, &request.owner, pick)
            .await
            .map(drop)
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
