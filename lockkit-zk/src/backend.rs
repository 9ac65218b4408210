//! `ZkBackend`: locks as ephemeral sequential znodes, waiters watching their predecessor.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lockkit_core::backend::cleanup::{Acquisitions, Ledger, Sweeps};
use lockkit_core::backend::{
    AcquireRequest, Attempt, Contention, Grant, Leader, Lease, LockBackend, LockPage, OwnerToken,
    Renewal, runtime,
};
use lockkit_core::{
    Capabilities, Error, ErrorKind, FencingGuarantee, FencingToken, LockInfo, LockKey, Result,
    Support, Tier, WaitStrategy,
};
use tokio_util::sync::{CancellationToken, DropGuard};
use zookeeper_client as zk;

use crate::acquire::MAX_ROUNDS;
use crate::cleanup::{Janitor, Pending, sweep};
use crate::config::ZkConfig;
use crate::error::{BACKEND, map, timed_out};
use crate::naming::{LockPaths, queue};
use crate::session::{self, Session, SessionSlot};

/// The shortest TTL the backend honours: a lock asked for with a shorter one gets this.
///
/// A renewal here is a `sync` and a read through the leader (2-10 ms on loopback, tens of
/// milliseconds on a busy machine), sent after a third of the validity: with a 10 ms TTL
/// that is a renewal every few milliseconds per lock, for nothing, since a lock node lives
/// as long as the session anyway (a crashed holder blocks the key for the session timeout,
/// whatever the TTL). One second renews every ~330 ms, many round trips apart. Shorter TTLs
/// are raised rather than refused, as the core does for every backend's minimum
/// ([`Capabilities::min_ttl`]): the lock behaves as asked, only renewed less often.
pub const MIN_TTL: Duration = Duration::from_secs(1);

/// A lock backend on a ZooKeeper ensemble ([`Tier::Consensus`]).
///
/// # Algorithm
/// One ZooKeeper session per backend, shared by all its locks. A lock `namespace/key` is the
/// parent znode `{chroot}/{namespace}/{key}` (a container node); each acquisition creates an
/// `EPHEMERAL_SEQUENTIAL` child `_c_{id}-lock-{sequence}`, where `{id}` is the first 128
/// bits of SHA-256 over the acquisition's secret owner token, in UUID form (never the token
/// itself: node names are visible to whoever may list the lock, and the client logs request
/// paths at debug level). The child with the lowest sequence holds the lock; every other
/// contender watches only the child just before its own (no herd effect) and checks the
/// children again after every event. Because the name is derived from the owner token, an
/// attempt whose reply was lost finds its own node instead of leaving an orphan; a create
/// that commits after the retry looked leaves a second node with the same name, which the
/// next round, the release, the clean-up, or a sweep one session timeout later deletes. An
/// acquisition that ends with a create unanswered is swept for through the leader (a `sync`
/// before the listing) until a listing sent after the create has removed what it left.
///
/// A semaphore of `n` permits is the same queue under `{chroot}/{namespace}/{key}/semaphore`,
/// where the first `n` nodes hold a permit and each waiter watches only the nodes that can
/// change its place (see `semaphore.rs` and the crate docs' "Semaphores").
///
/// A read-write lock is one queue of readers' and writers' nodes under
/// `{chroot}/{namespace}/{key}/rwlock`, named as Curator's `InterProcessReadWriteLock` names
/// them: a reader holds while no writer's node is ahead of its own, a writer while its node
/// is first (see `rwlock.rs` and the crate docs' "Read-write locks").
///
/// Elections are these locks too, as Curator's `LeaderLatch` runs them: the lowest node
/// leads, its czxid is the term, and the leader's value is its own node's data (see
/// `election.rs` and the crate docs' "Elections").
///
/// # Guarantees
/// - The fencing token is the `czxid` of the holder's node: the zxid of the transaction that
///   created it, globally ordered by the ensemble, so successive grants of a key carry
///   strictly increasing tokens, across leader changes and parent re-creation alike.
/// - A lock node lives as long as the session, but a grant or renewal is trusted only for
///   `min(ttl, T × min(0.6 − g, 0.5))` from when its request was sent (`T` the negotiated
///   session timeout, `g` the
///   [`suspended_grace_fraction`](ZkConfig::suspended_grace_fraction); 0.3 `T` by default),
///   and only a request that reached the leader counts: a renewal (and the grant of a node
///   found again) `sync`s before it reads the node, so a server cut off from the leader, which
///   keeps answering pings and reads from its stale view for up to `syncLimit × tickTime`,
///   cannot confirm a lock. The leader cannot expire the session sooner than 0.55 `T` after
///   such a request was sent, as long as the servers' `tickTime` is at most `T`/2: it hears
///   of the session from the client's server every half `tickTime`, and the client sends
///   something at least every 0.2 `T`. So the core's validity deadline passes, and the lost
///   signal fires, before anyone else can be granted the lock.
/// - The lost signal also fires at once when the session expires, and when the session stays
///   disconnected longer than `g × T` (after the 0.4 `T` the client needs to notice a silent
///   connection).
/// - A holder paused longer than the session timeout loses the lock without noticing in time:
///   fence the protected resource with the token.
/// - A TTL shorter than [`MIN_TTL`] (1 s) is raised to it, so a lock is renewed at most about
///   three times a second.
///
/// # Compatibility with Curator
/// Node names follow Curator's protected `InterProcessMutex` naming (`_c_{uuid}-lock-{seq}`)
/// and the parents are container nodes, as Curator creates them: a Java service taking an
/// `InterProcessMutex` on `{chroot}/{namespace}/{key}` and lockkit exclude each other (both
/// order the children by the sequence after the last `lock-`, as Curator's
/// `StandardLockInternalsDriver` does). Tested beside Curator 5.4 (`tests/interop_curator.rs`);
/// the repository's `docs/interop.md` has the mapping of names. A Curator client without the
/// chroot in its connect string creates a missing chroot as a container, which the server
/// deletes once it is empty; the next lock then creates it again, persistent.
#[derive(Clone)]
pub struct ZkBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: ZkConfig,
    pub(crate) sessions: Arc<SessionSlot>,
    /// What each acquisition in progress (or granted) has on the server, by owner token.
    pub(crate) pending: Acquisitions<Pending>,
    /// The books of each acquisition's creates, until it is released or abandoned (kept
    /// apart from `pending`, whose entry an attempt replaces or removes along the way).
    pub(crate) ledgers: Acquisitions<Arc<Ledger>>,
    pub(crate) janitor: Arc<Janitor>,
    pub(crate) watch_events: AtomicU64,
    /// Stops the janitor's sweep (after a last one) when the backend is dropped.
    pub(crate) _sweep: DropGuard,
    /// Cancelled when the backend is dropped (by `_sweep`): ends the clean-ups, whose nodes
    /// go with the session the drop closes.
    pub(crate) dropped: CancellationToken,
    /// The clean-ups left running in the background, for `idle`.
    pub(crate) sweeps: Sweeps,
}

/// Shows the configuration (without the password) and the session, never the owner tokens
/// of the acquisitions in progress.
impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let session = self.inner.sessions.current();
        f.debug_struct("ZkBackend")
            .field("config", &self.inner.config)
            .field("session_id", &format_args!("{:#x}", session.id()))
            .field("session_state", &session.client.state())
            .field("acquisitions", &self.pending().len())
            .field("watch_events", &self.watch_events())
            .finish()
    }
}

/// Runs a request bounded by `timeout`; the outer error is the timeout.
pub(crate) async fn within<T>(
    timeout: Duration,
    what: &str,
    request: impl Future<Output = Result<T, zk::Error>>,
) -> Result<Result<T, zk::Error>> {
    tokio::time::timeout(timeout, request)
        .await
        .map_err(|_| timed_out(what))
}

impl ZkBackend {
    /// Connects to the ensemble: opens the session (bounded by `connect_timeout`), creates the
    /// chroot with the configured ACL when missing, and checks that the credentials may read it.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] for an invalid configuration; [`ErrorKind::Unavailable`]
    /// when no server answers in time; [`ErrorKind::Auth`] when the credentials do not admit
    /// this client to the chroot.
    pub async fn connect(config: ZkConfig) -> Result<ZkBackend> {
        config.validate()?;
        let client = session::open(&config).await?;
        let sessions = session::start(&config, client);
        let janitor = Arc::new(Janitor::default());
        let stop = CancellationToken::new();
        let tick = (config.empty_parent_linger / 2).max(Duration::from_millis(10));
        runtime::spawn(sweep(
            janitor.clone(),
            sessions.clone(),
            stop.clone(),
            tick,
            config.request_timeout,
        ));
        let backend = ZkBackend {
            inner: Arc::new(Inner {
                config,
                sessions,
                pending: Acquisitions::new(),
                ledgers: Acquisitions::new(),
                janitor,
                watch_events: AtomicU64::new(0),
                dropped: stop.clone(),
                _sweep: stop.drop_guard(),
                sweeps: Sweeps::new(),
            }),
        };
        Ok(backend)
    }

    /// The configuration this backend was connected with.
    pub fn config(&self) -> &ZkConfig {
        &self.inner.config
    }

    /// The session timeout the servers granted (they clamp the configured one).
    pub fn session_timeout(&self) -> Duration {
        self.inner.sessions.current().client.session_timeout()
    }

    /// The id of the current session, as the servers' `cons` and `dump` commands show it
    /// (`sid=0x…`): for measuring what this backend sends (the benchmark
    /// `examples/held_locks` counts a session's requests with it).
    pub fn session_id(&self) -> i64 {
        self.inner.sessions.current().id()
    }

    /// How many watch events have woken this backend's waiters so far. With waiters queued
    /// on their predecessors, each release wakes exactly one of them: this counter shows it.
    pub fn watch_events(&self) -> u64 {
        self.inner.watch_events.load(Ordering::Relaxed)
    }

    /// Expires this backend's session from the server side, as a partition or a pause longer
    /// than the session timeout would: a second client attaches to the session and closes
    /// it. Returns once the session has ended; the backend's grants are reported lost and a
    /// new session is opened (feature `testing`, for fault tests).
    ///
    /// The second client goes to one server at a time, each in turn. On a server other than
    /// the one the session's own client uses, it wins without a race: that client keeps its
    /// connection, which moves nothing back, until the close ends the session everywhere. On
    /// the same server, attaching drops the session's own connection, the client reconnects
    /// at once to another server, and when it is back before the close, the session moves
    /// with it and lives on (seen with tests running side by side); the next server is then
    /// tried.
    ///
    /// # Errors
    /// [`ErrorKind::Unavailable`] if no server could be reached, or the session has not
    /// ended after three rounds over the servers.
    #[cfg(feature = "testing")]
    pub async fn expire_session(&self) -> Result<()> {
        let ending = self.inner.sessions.current();
        let hosts = &self.inner.config.hosts;
        let mut attached = false;
        let mut last = None;
        for host in hosts.iter().cycle().take(3 * hosts.len()) {
            let session = ending.client.session().clone();
            let mut config = self.inner.config.clone();
            config.hosts = vec![host.clone()];
            let closed = runtime::run(async move {
                let connector = zk::Client::connector()
                    .with_session(session)
                    .with_session_timeout(config.session_timeout);
                let twin = session::connect(connector, &config, "attach to the session").await?;
                drop(twin);
                Ok::<_, Error>(())
            })
            .await?;
            match closed {
                Ok(()) => attached = true,
                Err(e) => last = Some(e),
            }
            // A twin that cannot attach may have found the session ended already.
            let by = tokio::time::Instant::now() + Duration::from_secs(1);
            while tokio::time::Instant::now() < by {
                if ending.client.state().is_terminated() {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        match last {
            Some(e) if !attached => Err(e),
            _ => Err(Error::new(
                ErrorKind::Unavailable,
                BACKEND,
                "the session did not end after three rounds of closing it from each server",
            )),
        }
    }

    /// The session to send requests on; while an expired one is being replaced, waits for
    /// the new one up to `connect_timeout`.
    pub(crate) async fn session(&self) -> Arc<Session> {
        self.inner
            .sessions
            .usable(self.inner.config.connect_timeout)
            .await
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.inner.config.request_timeout
    }

    pub(crate) fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<OwnerToken, Pending>> {
        self.inner.pending.lock()
    }

    pub(crate) fn container_options(&self) -> zk::CreateOptions<'static> {
        zk::CreateMode::Container.with_acls(session::acls(&self.inner.config))
    }

    pub(crate) fn node_options(&self) -> zk::CreateOptions<'static> {
        zk::CreateMode::EphemeralSequential.with_acls(session::acls(&self.inner.config))
    }

    /// The children of the lock's parent; none when the parent does not exist.
    pub(crate) async fn children(&self, session: &Session, parent: &str) -> Result<Vec<String>> {
        match within(
            self.timeout(),
            "list lock nodes",
            session.client.list_children(parent),
        )
        .await?
        {
            Ok(children) => Ok(children),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(map("list lock nodes", e)),
        }
    }
}

#[async_trait]
impl LockBackend for ZkBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn tier(&self) -> Tier {
        Tier::Consensus
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(FencingGuarantee::Monotonic, WaitStrategy::Queue)
            .with_min_ttl(MIN_TTL)
            .with_election(Support::Supported)
            .with_semaphore(Support::Supported)
            .with_rwlock(Support::Supported)
    }

    /// A lock is trusted for at most its share of the session timeout (the session module
    /// says why).
    fn max_validity(&self, ttl: Duration) -> Duration {
        self.trusted_for(ttl)
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        self.attempt(request).await
    }

    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        self.wait_for(request, contention, max_wait)
            .await
            .map(|()| None)
    }

    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        self.abandon_request(request).await
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        self.renew_one(lease).await
    }

    /// One tick costs one round trip on the session: a `sync`, then every lease's node read
    /// in multi-reads of up to 1,000 nodes, all sent back to back (ZooKeeper answers one
    /// session's requests in order, so the reads see at least the leader's state at the sync,
    /// as a single renewal's `sync` + `exists` does); `renewal.rs` says why.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        self.renew_batch(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        self.release_lease(lease).await
    }

    /// For a permit, also that the node is among the first `permits` (see `semaphore.rs`);
    /// for a read or write lock, that nothing ahead blocks it (see `rwlock.rs`).
    async fn is_held(&self, lease: &Lease) -> Result<bool> {
        self.holds(lease).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let session = self.session().await;
        let paths = LockPaths::new(key);
        for _ in 0..MAX_ROUNDS {
            let queue = queue(self.children(&session, &paths.parent).await?);
            let Some(holder) = queue.first() else {
                return Ok(None);
            };
            match within(
                self.timeout(),
                "read the holder's node",
                session.client.check_stat(&paths.child(holder)),
            )
            .await?
            {
                Ok(Some(stat)) => {
                    let token = u64::try_from(stat.czxid).unwrap_or_default();
                    return Ok(Some(
                        LockInfo::new(FencingToken(token)).with_waiters(queue.len() - 1),
                    ));
                }
                Ok(None) => continue,
                Err(e) => return Err(map("read the holder's node", e)),
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            BACKEND,
            "the holder kept changing while inspecting the lock",
        )
        .with_retryable(true))
    }

    async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        self.list_page(namespace, prefix, cursor, limit).await
    }

    async fn force_release(&self, key: &LockKey) -> Result<bool> {
        self.break_lock(key).await
    }

    /// One `setData` on the lease's own node (see `election.rs` for why that is enough).
    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool> {
        self.proclaim_value(lease, value).await
    }

    /// A `sync` and the listing, then the lowest node's data: two round trips.
    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>> {
        self.read_leader(key).await
    }

    /// Watches the leader's node (or, in a vacancy, the candidates), set by a fresh read.
    async fn wait_for_leader_change(
        &self,
        key: &LockKey,
        seen: Option<&Leader>,
        max_wait: Duration,
    ) -> Result<()> {
        self.wait_for_leader(key, seen, max_wait).await
    }

    async fn idle(&self) {
        self.inner.sweeps.idle().await;
    }

    async fn ping(&self) -> Result<()> {
        let session = self.session().await;
        match within(self.timeout(), "ping", session.client.list_children("/")).await? {
            Ok(_) => Ok(()),
            Err(e) => Err(map("ping", e)),
        }
    }
}
