//! `ZkBackend`: locks as ephemeral sequential znodes, waiters watching their predecessor.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lockkit_core::{
    AcquireRequest, Attempt, Capabilities, Contention, Error, ErrorKind, FencingGuarantee,
    FencingToken, Grant, Lease, LockBackend, LockInfo, LockKey, OwnerToken, Renewal, Result, Tier,
    WaitStrategy, runtime,
};
use tokio_util::sync::{CancellationToken, DropGuard};
use zookeeper_client as zk;

use crate::config::ZkConfig;
use crate::error::{BACKEND, map, timed_out};
use crate::session::{self, Session, SessionSlot};

/// The part of a lock node's name between the owner and the sequence number, as Curator's
/// `InterProcessMutex` names it.
const LOCK_NAME: &str = "-lock-";

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

/// How often a lost reply or a race is retried inside one call before the core sees an error.
const MAX_ROUNDS: usize = 4;

/// How soon a background sweep tries again after a clean-up failed.
const SWEEP_RETRY: Duration = Duration::from_millis(100);

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
/// next round, the release, the clean-up, or a sweep one session timeout later deletes.
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
/// `StandardLockInternalsDriver` does; derived from Curator's source, not run against it).
#[derive(Clone)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: ZkConfig,
    sessions: Arc<SessionSlot>,
    /// What each acquisition in progress (or granted) has on the server, by owner token.
    pending: StdMutex<HashMap<String, Pending>>,
    janitor: Arc<Janitor>,
    watch_events: AtomicU64,
    /// Stops the janitor's sweep (after a last one) when the backend is dropped.
    _sweep: DropGuard,
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

/// The lock parents this backend stopped using, and when each may be removed.
///
/// Removing a parent on every release would make the next acquisition create it again:
/// two more writes per cycle. Deleting it once the key has been idle here for a while keeps
/// the tree clean at no cost to a busy key. The server refuses to delete a parent that has
/// children, so the delete never races a contender: one whose create comes right after it
/// gets `NoNode` and creates the parent again.
#[derive(Debug, Default)]
struct Janitor {
    due: StdMutex<HashMap<String, Instant>>,
}

impl Janitor {
    fn due(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.due.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn schedule(&self, parent: &str, linger: Duration) {
        self.due()
            .insert(parent.to_owned(), Instant::now() + linger);
    }

    fn keep(&self, parent: &str) {
        self.due().remove(parent);
    }

    fn take_all(&self) -> Vec<String> {
        self.due().drain().map(|(parent, _)| parent).collect()
    }

    fn take_due(&self, now: Instant) -> Vec<String> {
        let mut due = self.due();
        let ready: Vec<String> = due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(parent, _)| parent.clone())
            .collect();
        for parent in &ready {
            due.remove(parent);
        }
        ready
    }
}

/// Deletes idle lock parents; when the backend is dropped, deletes every scheduled one at
/// once (before the session closes) and ends.
async fn sweep(
    janitor: Arc<Janitor>,
    sessions: Arc<SessionSlot>,
    stop: CancellationToken,
    tick: Duration,
    timeout: Duration,
) {
    loop {
        let stopping = tokio::select! {
            () = tokio::time::sleep(tick) => false,
            () = stop.cancelled() => true,
        };
        let idle = if stopping {
            janitor.take_all()
        } else {
            janitor.take_due(Instant::now())
        };
        if !idle.is_empty() {
            let session = sessions.current();
            let deletes: Vec<_> = idle
                .iter()
                .map(|parent| session.client.delete(parent, None))
                .collect();
            // NotEmpty (someone queued meanwhile) and NoNode are the expected refusals.
            let _ = tokio::time::timeout(timeout, futures_util::future::join_all(deletes)).await;
        }
        if stopping {
            return;
        }
    }
}

#[derive(Clone)]
struct Pending {
    session_id: i64,
    node: PendingNode,
    /// The node just ahead of ours, to watch (kept here; the [`Contention`] shows only its
    /// sequence number).
    predecessor: Option<String>,
}

#[derive(Clone)]
enum PendingNode {
    /// A create was sent and its answer not seen: the node may or may not exist.
    InFlight,
    /// The node exists (or existed) under this name.
    Created { name: String },
}

/// The znode paths of one lock, relative to the chroot.
#[derive(Clone)]
struct LockPaths {
    namespace: String,
    parent: String,
}

impl LockPaths {
    fn new(key: &LockKey) -> Self {
        let namespace = format!("/{}", key.namespace());
        let parent = format!("{namespace}/{}", key.name());
        LockPaths { namespace, parent }
    }

    fn child(&self, name: &str) -> String {
        format!("{}/{name}", self.parent)
    }
}

/// `_c_{uuid}-lock-`: the start of the name of `owner`'s node, where `{uuid}` is the
/// [`node_id`] of the owner token.
fn own_prefix(owner: &OwnerToken) -> String {
    format!("_c_{}{LOCK_NAME}", uuid_form(&node_id(owner)))
}

/// What a node's name carries in place of the owner token: its
/// [`digest_hex`](OwnerToken::digest_hex). Anyone who can list a lock, and every log line
/// that shows a request path (the client logs them at debug level), sees this, never the
/// token. It is as good as the token for finding our own node again after a lost reply, and
/// it still ties the node to the owner: a lease with another token names another node.
fn node_id(owner: &OwnerToken) -> String {
    owner.digest_hex()
}

/// 32 hex digits as a UUID (8-4-4-4-12), the shape Curator's protected names use.
fn uuid_form(hex: &str) -> String {
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The sequence number of a lock node name (the digits after the last `-lock-`, or after
/// `lock-` at the start for Curator's unprotected names).
fn sequence_of(name: &str) -> Option<i64> {
    let digits = match name.rfind(LOCK_NAME) {
        Some(i) => &name[i + LOCK_NAME.len()..],
        None => name.strip_prefix(&LOCK_NAME[1..])?,
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// What is shown of a node name (in a lease's handle, a contention, `Debug` output): its
/// sequence number, which is all a reader needs.
fn public_name(name: &str) -> String {
    let start = name.rfind(LOCK_NAME).map_or(0, |i| i + LOCK_NAME.len());
    name[start..].trim_start_matches("lock-").to_owned()
}

/// The lock nodes among `children`, lowest sequence first.
fn queue(mut children: Vec<String>) -> Vec<String> {
    children.retain(|c| sequence_of(c).is_some());
    children.sort_by_key(|c| sequence_of(c));
    children
}

/// Runs a request bounded by `timeout`; the outer error is the timeout.
async fn within<T>(
    timeout: Duration,
    what: &str,
    request: impl Future<Output = Result<T, zk::Error>>,
) -> Result<Result<T, zk::Error>> {
    tokio::time::timeout(timeout, request)
        .await
        .map_err(|_| timed_out(what))
}

/// What evaluating the queue decided.
enum Step {
    Done(Attempt),
    /// Our node is gone (deleted by an operator, or the session changed): start over.
    Recreate,
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
                pending: StdMutex::new(HashMap::new()),
                janitor,
                watch_events: AtomicU64::new(0),
                _sweep: stop.drop_guard(),
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

    /// How many watch events have woken this backend's waiters so far. With waiters queued
    /// on their predecessors, each release wakes exactly one of them: this counter shows it.
    pub fn watch_events(&self) -> u64 {
        self.inner.watch_events.load(Ordering::Relaxed)
    }

    /// Expires this backend's session from the server side, as a partition or a pause longer
    /// than the session timeout would: a second client attaches to the session and closes
    /// it. The backend's grants are reported lost and a new session is opened (feature
    /// `testing`, for fault tests).
    ///
    /// # Errors
    /// [`ErrorKind::Unavailable`] if the ensemble cannot be reached.
    #[cfg(feature = "testing")]
    pub async fn expire_session(&self) -> Result<()> {
        let session = self.inner.sessions.current().client.session().clone();
        let config = self.inner.config.clone();
        runtime::run(async move {
            let connector = zk::Client::connector()
                .with_session(session)
                .with_session_timeout(config.session_timeout);
            let twin = session::connect(connector, &config, "attach to the session").await?;
            drop(twin);
            Ok(())
        })
        .await?
    }

    /// The session to send requests on; while an expired one is being replaced, waits for
    /// the new one up to `connect_timeout`.
    async fn session(&self) -> Arc<Session> {
        self.inner
            .sessions
            .usable(self.inner.config.connect_timeout)
            .await
    }

    fn timeout(&self) -> Duration {
        self.inner.config.request_timeout
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.inner
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn container_options(&self) -> zk::CreateOptions<'static> {
        zk::CreateMode::Container.with_acls(session::acls(&self.inner.config))
    }

    fn node_options(&self) -> zk::CreateOptions<'static> {
        zk::CreateMode::EphemeralSequential.with_acls(session::acls(&self.inner.config))
    }

    /// The children of the lock's parent; none when the parent does not exist.
    async fn children(&self, session: &Session, parent: &str) -> Result<Vec<String>> {
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

    /// Creates our node and lists the queue: both requests are sent back to back, so the
    /// step costs about one round trip (the session's requests are applied in order, so the
    /// listing sees the node). A missing parent is created (a container node) and the step
    /// tried again.
    async fn create_node(
        &self,
        session: &Session,
        paths: &LockPaths,
        own_prefix: &str,
        token: &str,
    ) -> Result<(String, Option<i64>, Vec<String>)> {
        self.inner.janitor.keep(&paths.parent);
        for _ in 0..MAX_ROUNDS {
            self.pending().insert(
                token.to_owned(),
                Pending {
                    session_id: session.id(),
                    node: PendingNode::InFlight,
                    predecessor: None,
                },
            );
            let node = self.node_options();
            let prefix = paths.child(own_prefix);
            let created = session.client.create(&prefix, &[], &node);
            let listed = session.client.list_children(&paths.parent);
            let Ok((created, listed)) =
                tokio::time::timeout(self.timeout(), async { tokio::join!(created, listed) }).await
            else {
                self.sweep_later(
                    session.id(),
                    paths,
                    own_prefix,
                    token,
                    self.session_timeout(),
                );
                return Err(timed_out("create the lock node"));
            };
            match created {
                Ok((stat, sequence)) => {
                    let name = format!("{own_prefix}{sequence}");
                    // ZOOKEEPER-4026 (servers before 3.8.2) answers a create inside a multi
                    // with an invalid Stat; a plain create is fine, but should the Stat be
                    // invalid the czxid is read separately before a grant.
                    let czxid = (!stat.is_invalid() && stat.czxid > 0).then_some(stat.czxid);
                    self.pending().insert(
                        token.to_owned(),
                        Pending {
                            session_id: session.id(),
                            node: PendingNode::Created { name: name.clone() },
                            predecessor: None,
                        },
                    );
                    let children = match listed {
                        Ok(children) => children,
                        Err(_) => self.children(session, &paths.parent).await?,
                    };
                    return Ok((name, czxid, children));
                }
                Err(zk::Error::NoNode) => {
                    // Nothing was created: make the parent and go again.
                    self.pending().remove(token);
                    self.create_parents(session, paths).await?;
                }
                Err(
                    e @ (zk::Error::NoAuth
                    | zk::Error::InvalidAcl
                    | zk::Error::NoChildrenForEphemerals
                    | zk::Error::BadArguments(_)),
                ) => {
                    self.pending().remove(token);
                    return Err(map("create the lock node", e));
                }
                // A lost reply: the node may exist. The entry stays in flight, so the next
                // attempt (or abandon) looks for it by name; and since the create may still
                // commit after they looked, a sweep comes back for it later.
                Err(e) => {
                    self.sweep_later(
                        session.id(),
                        paths,
                        own_prefix,
                        token,
                        self.session_timeout(),
                    );
                    return Err(map("create the lock node", e));
                }
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            BACKEND,
            "the lock's parent kept disappearing while creating the lock node",
        )
        .with_retryable(true))
    }

    /// Creates the lock's parent, and the namespace node above it when that is missing
    /// too (first use, or removed by the server as an empty container).
    async fn create_parents(&self, session: &Session, paths: &LockPaths) -> Result<()> {
        let container = self.container_options();
        for path in [&paths.parent, &paths.namespace, &paths.parent] {
            match within(
                self.timeout(),
                "create the lock's parent",
                session.client.create(path, &[], &container),
            )
            .await?
            {
                Ok(_) | Err(zk::Error::NodeExists) if path == &paths.parent => return Ok(()),
                Ok(_) | Err(zk::Error::NodeExists | zk::Error::NoNode) => {}
                Err(e) => return Err(map("create the lock's parent", e)),
            }
        }
        Ok(())
    }

    /// Finds the nodes named `own_prefix…` an earlier attempt left: the lowest is kept,
    /// duplicates (from a create retried after a lost reply) are deleted.
    async fn find_own(
        &self,
        session: &Session,
        paths: &LockPaths,
        own_prefix: &str,
        children: &[String],
    ) -> Result<Option<String>> {
        let Some(first) = children
            .iter()
            .filter(|c| c.starts_with(own_prefix) && sequence_of(c).is_some())
            .min_by_key(|c| sequence_of(c))
            .cloned()
        else {
            return Ok(None);
        };
        self.delete_own_nodes(session, paths, own_prefix, children, Some(&first))
            .await?;
        Ok(Some(first))
    }

    /// Deletes a node; `Ok(true)` if it was there.
    async fn delete_node(&self, session: &Session, path: &str, what: &str) -> Result<bool> {
        match within(self.timeout(), what, session.client.delete(path, None)).await? {
            Ok(()) => Ok(true),
            Err(zk::Error::NoNode) => Ok(false),
            Err(e) => Err(map(what, e)),
        }
    }

    /// Deletes every node among `children` whose name starts with `own_prefix`, except
    /// `keep`. Such strays come from a create whose reply was lost and that committed after
    /// the retry had looked (on another server, or simply later): owned by our long-lived
    /// session, one left behind would become the head of the queue after our release and
    /// block the key for as long as the session lives.
    async fn delete_own_nodes(
        &self,
        session: &Session,
        paths: &LockPaths,
        own_prefix: &str,
        children: &[String],
        keep: Option<&str>,
    ) -> Result<()> {
        for child in children {
            if child.starts_with(own_prefix)
                && sequence_of(child).is_some()
                && Some(child.as_str()) != keep
            {
                self.delete_node(session, &paths.child(child), "delete a stray lock node")
                    .await?;
            }
        }
        Ok(())
    }

    /// Deletes every node of an acquisition that has ended (named `own_prefix…`), and hands
    /// the lock's parent to the janitor.
    async fn delete_all_own(
        &self,
        session: &Session,
        paths: &LockPaths,
        own_prefix: &str,
    ) -> Result<()> {
        let children = self.children(session, &paths.parent).await?;
        let deleted = self
            .delete_own_nodes(session, paths, own_prefix, &children, None)
            .await;
        self.inner
            .janitor
            .schedule(&paths.parent, self.inner.config.empty_parent_linger);
        deleted
    }

    /// Comes back after `delay` to delete the nodes named `own_prefix…` that the acquisition
    /// `token` no longer uses (all of them once it has ended), retrying until that works or
    /// the session is gone. While a create of the acquisition is in flight it waits again,
    /// so as not to delete a node that is being granted.
    fn sweep_later(
        &self,
        session_id: i64,
        paths: &LockPaths,
        own_prefix: &str,
        token: &str,
        delay: Duration,
    ) {
        let backend = self.clone();
        let paths = paths.clone();
        let (own_prefix, token) = (own_prefix.to_owned(), token.to_owned());
        runtime::spawn(async move {
            let mut delay = delay;
            let mut retry = SWEEP_RETRY;
            loop {
                tokio::time::sleep(delay).await;
                delay = retry;
                retry = (retry * 2).min(Duration::from_secs(2));
                let session = backend.session().await;
                if session.id() != session_id {
                    return;
                }
                let in_use = backend
                    .pending()
                    .get(&token)
                    .filter(|p| p.session_id == session_id)
                    .map(|p| p.node.clone());
                let keep = match in_use {
                    Some(PendingNode::InFlight) => continue,
                    Some(PendingNode::Created { name }) => Some(name),
                    None => None,
                };
                let swept = match backend.children(&session, &paths.parent).await {
                    Ok(children) => {
                        backend
                            .delete_own_nodes(
                                &session,
                                &paths,
                                &own_prefix,
                                &children,
                                keep.as_deref(),
                            )
                            .await
                    }
                    Err(e) => Err(e),
                };
                match swept {
                    Ok(()) => {
                        if keep.is_none() {
                            backend
                                .inner
                                .janitor
                                .schedule(&paths.parent, backend.inner.config.empty_parent_linger);
                        }
                        return;
                    }
                    Err(e) if e.is_retryable() => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot delete a stray lock node; it goes with the session");
                        return;
                    }
                }
            }
        });
    }

    /// Decides from the queue whether our node `name` holds the lock. `czxid` is known when
    /// the node was created by this call: the create went through the leader after the
    /// request was sent, and the listing (same session, after it) is at least that recent.
    /// Without it the node was found in a listing that a server cut off from the leader may
    /// have served stale, so a grant first syncs with the leader and reads the node again.
    async fn evaluate(
        &self,
        session: &Session,
        request: &AcquireRequest,
        paths: &LockPaths,
        name: &str,
        czxid: Option<i64>,
        children: Vec<String>,
    ) -> Result<Step> {
        let token = request.owner.expose_hex();
        let own_prefix = own_prefix(&request.owner);
        self.delete_own_nodes(session, paths, &own_prefix, &children, Some(name))
            .await?;
        let mut queue = queue(children);
        queue.retain(|c| c == name || !c.starts_with(&own_prefix));
        let Some(index) = queue.iter().position(|c| c == name) else {
            self.pending().remove(&token);
            return Ok(Step::Recreate);
        };
        if index > 0 {
            let predecessor = &queue[index - 1];
            if let Some(entry) = self.pending().get_mut(&token) {
                entry.predecessor = Some(predecessor.clone());
            }
            let contention = Contention::new().with_predecessor(public_name(predecessor), None);
            if !request.wait {
                self.delete_node(session, &paths.child(name), "withdraw from the queue")
                    .await?;
                self.pending().remove(&token);
            }
            return Ok(Step::Done(Attempt::Contended(contention)));
        }
        // Re-verify before granting: the node is ours on a live session, and its czxid.
        let path = paths.child(name);
        let czxid = match czxid {
            Some(czxid) => czxid,
            None => match self.stat_via_leader(session, &path).await? {
                Ok(Some(stat)) if stat.ephemeral_owner == session.id() => stat.czxid,
                Ok(_) => {
                    self.pending().remove(&token);
                    return Ok(Step::Recreate);
                }
                Err(e) => return Err(map("read the lock node through the leader", e)),
            },
        };
        if session.lost.is_cancelled() || !is_connected(&session.client) {
            return Err(Error::new(
                ErrorKind::Unavailable,
                BACKEND,
                "the session was suspended while granting; trying again",
            ));
        }
        if let Some(entry) = self.pending().get_mut(&token) {
            entry.node = PendingNode::Created {
                name: name.to_owned(),
            };
        }
        let fencing = u64::try_from(czxid).map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                BACKEND,
                format!("the lock node has an invalid czxid {czxid}"),
            )
        })?;
        let grant = Grant::new(FencingToken(fencing), self.trusted_for(request.ttl))
            .with_handle(public_name(name))
            .with_session(session.lost.clone());
        Ok(Step::Done(Attempt::Granted(grant)))
    }

    /// The path of `lease`'s node: from its owner token's prefix and the sequence number in
    /// its handle, or else found by that prefix among the lock's children.
    async fn lease_node(&self, session: &Session, lease: &Lease) -> Result<Option<String>> {
        let paths = LockPaths::new(lease.key());
        let own_prefix = own_prefix(lease.owner());
        if let Some(sequence) = lease.handle()
            && !sequence.is_empty()
            && sequence.bytes().all(|b| b.is_ascii_digit())
        {
            return Ok(Some(paths.child(&format!("{own_prefix}{sequence}"))));
        }
        let children = self.children(session, &paths.parent).await?;
        Ok(children
            .iter()
            .find(|c| c.starts_with(&own_prefix) && sequence_of(c).is_some())
            .map(|c| paths.child(c)))
    }

    /// Deletes our node `path`, and hands the lock's parent to the janitor, which removes
    /// it once nobody here has used it for `empty_parent_linger`.
    async fn delete_own(
        &self,
        session: &Session,
        path: &str,
        parent: &str,
        version: Option<i32>,
    ) -> Result<bool> {
        let deleted = within(
            self.timeout(),
            "delete the lock node",
            session.client.delete(path, version),
        )
        .await;
        self.inner
            .janitor
            .schedule(parent, self.inner.config.empty_parent_linger);
        let deleted = match deleted {
            Ok(deleted) => deleted,
            Err(timeout) => {
                // The delete may not have been applied: the node would hold the lock for
                // as long as the session lives.
                self.reap(session.id(), path.to_owned());
                return Err(timeout);
            }
        };
        match deleted {
            Ok(()) => Ok(true),
            // An expired session takes its ephemeral nodes with it, and sessions are only
            // replaced when they expire: the node is gone whichever session made it.
            Err(zk::Error::NoNode | zk::Error::BadVersion | zk::Error::SessionExpired) => Ok(false),
            Err(e) => {
                let error = map("delete the lock node", e);
                if error.is_retryable() {
                    self.reap(session.id(), path.to_owned());
                }
                Err(error)
            }
        }
    }

    /// Keeps deleting `path` in the background until it is gone or its session is: a node
    /// whose delete failed would otherwise hold the lock for as long as the session lives.
    fn reap(&self, session_id: i64, path: String) {
        let backend = self.clone();
        runtime::spawn(async move {
            let mut delay = Duration::from_millis(100);
            loop {
                tokio::time::sleep(delay).await;
                let session = backend.session().await;
                if session.id() != session_id {
                    return;
                }
                match backend
                    .delete_node(&session, &path, "delete the lock node")
                    .await
                {
                    Ok(_) => return,
                    Err(e) if e.is_retryable() => {
                        delay = (delay * 2).min(Duration::from_secs(2));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot delete a lock node; it goes with the session");
                        return;
                    }
                }
            }
        });
    }

    /// The stat of `path` as the leader sees it: a `sync` and the read, sent back to back
    /// (a server answers a session's requests in order, so the read waits for the sync).
    /// `sync` is answered through the leader, so it fails (or times out) on a server cut off
    /// from it, and its success shows the session was alive on the leader after it was sent.
    async fn stat_via_leader(
        &self,
        session: &Session,
        path: &str,
    ) -> Result<std::result::Result<Option<zk::Stat>, zk::Error>> {
        let synced = session.client.sync(path);
        let read = session.client.check_stat(path);
        let (synced, read) =
            tokio::time::timeout(self.timeout(), async { tokio::join!(synced, read) })
                .await
                .map_err(|_| timed_out("read the lock node through the leader"))?;
        Ok(synced.and(read))
    }

    /// The queue and our node `name`'s czxid, both read after a `sync` with the leader, in
    /// one round trip (the three requests are sent back to back and applied in order). This
    /// is the check [`Self::evaluate`] would otherwise make through the leader after a plain
    /// listing, one round trip later, when our node comes first: the listing is now at least
    /// as recent as that check. The czxid is `None` when the node is not ours on this
    /// session, which leaves the decision to `evaluate`.
    async fn queue_via_leader(
        &self,
        session: &Session,
        paths: &LockPaths,
        name: &str,
    ) -> Result<(Vec<String>, Option<i64>)> {
        let path = paths.child(name);
        let synced = session.client.sync(&paths.parent);
        let listed = session.client.list_children(&paths.parent);
        let read = session.client.check_stat(&path);
        let (synced, listed, read) =
            tokio::time::timeout(self.timeout(), async { tokio::join!(synced, listed, read) })
                .await
                .map_err(|_| timed_out("read the lock queue through the leader"))?;
        let children = match synced.and(listed) {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(map("read the lock queue through the leader", e)),
        };
        let czxid = match read {
            Ok(Some(stat)) if stat.ephemeral_owner == session.id() => Some(stat.czxid),
            Ok(_) => None,
            Err(e) => return Err(map("read the lock node through the leader", e)),
        };
        Ok((children, czxid))
    }

    /// How long a grant or renewal is trusted: see [`trusted_for`].
    fn trusted_for(&self, ttl: Duration) -> Duration {
        trusted_for(
            ttl,
            self.session_timeout(),
            self.inner.config.suspended_grace_fraction,
        )
    }

    /// Whether `lease`'s node still exists and belongs to the current, trusted session, as
    /// the leader sees it: the read follows a `sync`, so a server cut off from the leader
    /// (which keeps serving its stale view until it notices, `syncLimit × tickTime`) makes
    /// the check fail instead of confirming a lock the leader may have given away.
    async fn owns(&self, lease: &Lease) -> Result<bool> {
        if lease.session().is_some_and(|s| s.is_cancelled()) {
            return Ok(false);
        }
        let session = self.session().await;
        let Some(path) = self.lease_node(&session, lease).await? else {
            return Ok(false);
        };
        match self.stat_via_leader(&session, &path).await? {
            Ok(Some(stat)) => Ok(stat.ephemeral_owner == session.id()),
            Ok(None) | Err(zk::Error::SessionExpired) => Ok(false),
            Err(e) => Err(map("read the lock node through the leader", e)),
        }
    }
}

/// The part of the session timeout after which `zookeeper-client` declares a silent
/// connection dead (8 of its ticks of 1/20 of the timeout).
const DEAD_CONNECTION_FRACTION: f64 = 0.4;

/// The largest part of the session timeout a grant or renewal is trusted for, whatever the
/// grace (see [`trusted_for`]).
const MAX_TRUSTED_FRACTION: f64 = 0.5;

/// How long a grant or a renewal is trusted, counted (by the core) from when its request was
/// sent: `min(ttl, T × min(1 − 0.4 − suspended_grace_fraction, 0.5))`, `T` being the
/// negotiated session timeout; 0.3 `T` with the default grace.
///
/// A lock node lives as long as its session, and the leader expires a session `T` after it
/// last heard of it; it may then grant the lock to someone else. The request behind a grant or
/// renewal reached the leader, with the session alive, after it was sent: a create is a write,
/// and a renewal (or the grant of a node found again) issues a `sync` first; both fail on a
/// server cut off from the leader. The leader hears of a session from the server the client
/// is connected to, which reports the sessions it saw whenever the leader pings it (every half
/// `tickTime`), and the client sends something at least every 0.2 `T` (`zookeeper-client`
/// pings after 3/20 `T` of silence, checked every 1/20 `T`). So the leader's last news of the
/// session is at most 0.2 `T` + `tickTime`/2 older than the send time, and it cannot expire
/// the session before 0.8 `T` − `tickTime`/2 after that send: at least 0.55 `T` as long as
/// `tickTime` ≤ `T`/2 (the servers' default `minSessionTimeout` is 2 `tickTime`). 0.5 `T`
/// leaves the rest for network delay; the core takes clock drift off as well.
///
/// What this rests on besides: `sync` is not a quorum operation. A leader that has just lost
/// its quorum still answers it until it notices (within `syncLimit × tickTime`); its
/// followers notice the loss within the same limit before they elect a new leader, and a new
/// leader starts every session's timeout afresh, so this is covered as long as the servers
/// agree on the limit (they share one configuration).
///
/// The `1 − 0.4 − grace` term is the tighter one for a grace above 0.1. With it, the time a
/// verified contact is trusted and the longest disconnection the session watcher rides out
/// (`(0.4 + grace) × T`, see [`ZkConfig::suspended_grace_fraction`]) add up to the session
/// timeout: a longer grace buys tolerance of disconnections with more frequent renewals.
fn trusted_for(ttl: Duration, session_timeout: Duration, grace_fraction: f64) -> Duration {
    let fraction = (1.0 - DEAD_CONNECTION_FRACTION - grace_fraction).min(MAX_TRUSTED_FRACTION);
    ttl.min(session_timeout.mul_f64(fraction.max(0.0)))
}

fn is_connected(client: &zk::Client) -> bool {
    client.state() == zk::SessionState::SyncConnected
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
        Capabilities::new(FencingGuarantee::Monotonic, WaitStrategy::Queue).with_min_ttl(MIN_TTL)
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let session = self.session().await;
        let paths = LockPaths::new(&request.key);
        let own = own_prefix(&request.owner);
        let token = request.owner.expose_hex();
        for _ in 0..MAX_ROUNDS {
            let known = self
                .pending()
                .get(&token)
                .filter(|p| p.session_id == session.id())
                .map(|p| p.node.clone());
            let (name, czxid, children) = match known {
                // Nodes found again, rather than created by this call, are verified through
                // the leader before a grant: a czxid is passed on only when read after a sync.
                Some(PendingNode::Created { name }) => {
                    let (children, czxid) = self.queue_via_leader(&session, &paths, &name).await?;
                    (name, czxid, children)
                }
                Some(PendingNode::InFlight) => {
                    let children = self.children(&session, &paths.parent).await?;
                    match self.find_own(&session, &paths, &own, &children).await? {
                        Some(name) => (name, None, children),
                        None => {
                            self.pending().remove(&token);
                            continue;
                        }
                    }
                }
                None => {
                    if !request.wait {
                        // try_lock: a held lock answers without queueing a node.
                        let children = self.children(&session, &paths.parent).await?;
                        if let Some(holder) = queue(children).into_iter().next() {
                            return Ok(Attempt::Contended(
                                Contention::new().with_predecessor(public_name(&holder), None),
                            ));
                        }
                    }
                    self.create_node(&session, &paths, &own, &token).await?
                }
            };
            match self
                .evaluate(&session, request, &paths, &name, czxid, children)
                .await?
            {
                Step::Done(attempt) => return Ok(attempt),
                Step::Recreate => continue,
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            BACKEND,
            "the lock node kept disappearing while acquiring",
        )
        .with_retryable(true))
    }

    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<()> {
        let token = request.owner.expose_hex();
        let predecessor = self
            .pending()
            .get(&token)
            .and_then(|p| p.predecessor.clone());
        let (Some(predecessor), Some(_)) = (predecessor, &contention.predecessor) else {
            tokio::time::sleep(max_wait).await;
            return Ok(());
        };
        let session = self.session().await;
        let path = LockPaths::new(&request.key).child(&predecessor);
        let (stat, watcher) = match within(
            self.timeout(),
            "watch the predecessor",
            session.client.check_and_watch_stat(&path),
        )
        .await?
        {
            Ok(watched) => watched,
            Err(e) => return Err(map("watch the predecessor", e)),
        };
        if stat.is_none() {
            return Ok(());
        }
        tokio::select! {
            _ = watcher.changed() => {
                self.inner.watch_events.fetch_add(1, Ordering::Relaxed);
            }
            () = tokio::time::sleep(max_wait) => {}
            () = session.lost.cancelled() => {}
        }
        Ok(())
    }

    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        let token = request.owner.expose_hex();
        // The entry is forgotten only once the clean-up is done (or handed to a sweep): if
        // this future is dropped half-way, the core abandons again and must still find it.
        let Some(pending) = self.pending().get(&token).cloned() else {
            return Ok(());
        };
        let session = self.session().await;
        if pending.session_id != session.id() {
            // Its nodes went with its session.
            self.pending().remove(&token);
            return Ok(());
        }
        let paths = LockPaths::new(&request.key);
        let own_prefix = own_prefix(&request.owner);
        let cleaned = self.delete_all_own(&session, &paths, &own_prefix).await;
        if cleaned.is_err() {
            self.sweep_later(session.id(), &paths, &own_prefix, &token, SWEEP_RETRY);
        }
        self.pending().remove(&token);
        cleaned
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        Ok(if self.owns(lease).await? {
            Renewal::Extended(self.trusted_for(lease.ttl()))
        } else {
            Renewal::Lost
        })
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        let token = lease.owner().expose_hex();
        // The acquisition ends here whatever happens below: a failed release must not leave
        // its entry behind, and what it leaves on the server is swept in the background.
        self.pending().remove(&token);
        let session = self.session().await;
        let paths = LockPaths::new(lease.key());
        let own_prefix = own_prefix(lease.owner());
        let release_node = async {
            match self.lease_node(&session, lease).await? {
                // Lock nodes are never written, so their version stays 0.
                Some(path) => {
                    self.delete_own(&session, &path, &paths.parent, Some(0))
                        .await
                }
                None => Ok(false),
            }
        };
        // Strays of this acquisition go too; the listing is sent right after the delete, so
        // both cost one round trip.
        let (released, strays) = tokio::join!(
            release_node,
            self.delete_all_own(&session, &paths, &own_prefix)
        );
        if released.is_err() || strays.is_err() {
            self.sweep_later(session.id(), &paths, &own_prefix, &token, SWEEP_RETRY);
        }
        released
    }

    async fn is_held(&self, lease: &Lease) -> Result<bool> {
        self.owns(lease).await
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

    async fn ping(&self) -> Result<()> {
        let session = self.session().await;
        match within(self.timeout(), "ping", session.client.list_children("/")).await? {
            Ok(_) => Ok(()),
            Err(e) => Err(map("ping", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_curator_and_sort_by_sequence() {
        let owner = OwnerToken::from_hex("00112233445566778899aabbccddeeff").expect("hex");
        let key = LockKey::new("ns", "job").expect("key");
        let paths = LockPaths::new(&key);
        assert_eq!(paths.parent, "/ns/job");
        assert_eq!(
            paths.child(&own_prefix(&owner)),
            "/ns/job/_c_5947d7c3-3d78-3f94-b3b4-c1a96ebc8991-lock-"
        );
        let children = vec![
            "_c_b-lock-0000000010".to_owned(),
            "junk".to_owned(),
            "lock-0000000002".to_owned(),
            "_c_a-lock-0000000003".to_owned(),
            "_c_a-lock-".to_owned(),
        ];
        assert_eq!(
            queue(children),
            [
                "lock-0000000002",
                "_c_a-lock-0000000003",
                "_c_b-lock-0000000010"
            ]
        );
    }

    /// The node name carries SHA-256 of the owner token (`printf %s {hex} | sha256sum`),
    /// not the token: no run of the token's hex digits shows in it.
    #[test]
    fn node_names_carry_a_digest_of_the_owner_token_not_the_token() {
        let owner = OwnerToken::from_hex("00112233445566778899aabbccddeeff").expect("hex");
        let prefix = own_prefix(&owner);
        let hex = owner.expose_hex();
        for window in hex.as_bytes().windows(4) {
            let run = std::str::from_utf8(window).expect("hex");
            assert!(
                !prefix.replace('-', "").contains(run),
                "{prefix} shows {run}"
            );
        }
        let other = OwnerToken::from_hex("00112233445566778899aabbccddeef0").expect("hex");
        assert_ne!(own_prefix(&other), prefix);
        assert_eq!(own_prefix(&owner), prefix, "the name must be found again");
    }

    #[test]
    fn grants_are_trusted_for_less_than_the_leader_needs_to_expire_the_session() {
        let session = Duration::from_secs(10);
        let ttl = Duration::from_secs(30);
        assert_eq!(trusted_for(ttl, session, 0.3), Duration::from_secs(3));
        assert_eq!(trusted_for(ttl, session, 0.5), Duration::from_secs(1));
        assert_eq!(trusted_for(ttl, session, 0.0), Duration::from_secs(5));
        let short = Duration::from_secs(2);
        assert_eq!(trusted_for(short, session, 0.3), short);
    }

    #[test]
    fn public_names_keep_only_the_sequence() {
        assert_eq!(
            public_name("_c_00112233-4455-6677-8899-aabbccddeeff-lock-0000000007"),
            "0000000007"
        );
        assert_eq!(public_name("lock-0000000002"), "0000000002");
    }
}
