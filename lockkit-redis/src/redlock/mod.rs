//! [`RedlockBackend`]: Redlock over N independent Redis servers.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use async_trait::async_trait;
use lockkit_core::backend::{
    AcquireRequest, Attempt, Contention, Grant, Hold, Lease, LockBackend, LockPage, OwnerToken,
    Renewal,
};
use lockkit_core::{
    Capabilities, Error, ErrorKind, FencingGuarantee, FencingToken, LockInfo, LockKey, Result,
    Support, Tier, WaitStrategy,
};
use redis::aio::ConnectionManager;
use redis::{ProtocolVersion, Value};

use crate::config::{RedlockConfig, parse_host};
use crate::connection::Dialer;
use crate::error::unexpected;
use crate::lanes::Lanes;
use crate::notify::{Inbox, Notifier, Refusal};
use crate::scripts::{self, Holder, Keys, millis};
use fanout::NodeResult;

mod attempt;
mod fanout;
mod operator;
mod renewal;
mod wait;

const BACKEND: &str = "redlock";

/// Why Redlock refuses elections ([`Capabilities::election`]).
///
/// A Redlock leader would be whoever holds a majority of independent nodes. But the nodes
/// share no order of their changes: during a hand-over, or after a node restarted without
/// persistence, two observers reading different majorities can each see a different holder,
/// and one observer can see a term and then its predecessor. So neither `leader()` ("who
/// leads now?") nor `observe()` (changes in term order, ending on the current leader) could
/// keep its promise.
const NO_ELECTIONS: &str = "Redlock's nodes are independent and share no order of changes, so observers reading different majorities can disagree on who leads and see terms go back; elections need one ordered history: use single Redis, Sentinel, etcd or ZooKeeper";

/// Why Redlock refuses semaphores ([`Capabilities::semaphore`]).
///
/// A permit granted by a majority of nodes, each of which admits at most `permits` holders,
/// does not bound the holders: with 3 nodes and 2 permits, A granted on nodes 1 and 2, B on
/// 2 and 3 and C on 1 and 3 each hold a majority, while no node has more than 2 holders. A
/// correct construction would need the nodes to agree on one set of holders, which is what
/// a consensus backend does.
const NO_SEMAPHORES: &str = "a majority per node does not bound the holders: with 3 nodes and 2 permits, A granted on nodes 1+2, B on 2+3 and C on 1+3 each hold a majority while no node has more than 2 holders; use single Redis, Sentinel, etcd or ZooKeeper for semaphores";

/// Why Redlock refuses read-write locks ([`Capabilities::rwlock`]).
///
/// Exclusion alone could hold: a reader's majority and a writer's majority share a node,
/// which would refuse one of them. What lockkit does not do is keep the rest consistent
/// across N independent nodes: the waiting-writer records that keep new readers out (a
/// writer recorded on a minority does not stop a reader granted by another majority) and
/// the fencing counters (a write token above every earlier grant's needs one order of the
/// grants, which independent nodes do not have).
const NO_RWLOCKS: &str = "Redlock does not keep the waiting-writer records and the fencing counters of N independent nodes consistent (a reader's and a writer's majorities do intersect, but a writer recorded on some nodes need not stop readers on others, and a write token above every earlier grant's needs one order of grants); use single Redis, Sentinel, etcd or ZooKeeper for read-write locks";

/// Redlock over N independent Redis servers (tier `quorum`).
///
/// # Algorithm
/// - **acquire**: the acquire script (as [`RedisBackend`](crate::RedisBackend)'s) runs on all
///   nodes in parallel, each bounded by [`RedlockConfig::node_timeout`]. The lock is granted
///   when a majority (N/2+1) said yes. The answer is taken as soon as the answers decide:
///   a majority said yes (the slower nodes' keys are ours too and go with the release,
///   which is sent to every node), or too many said no for a majority (the attempt is
///   contended without waiting for the rest). A failed attempt's keys are rolled back on
///   every node that may hold them, without the waiter awaiting it (see `attempt.rs`). Each
///   node gets an acquisition's acquire, write-back and release in the order they were made, each
///   pursued for the lock's TTL whether or not anyone still waits for its answer (one lane
///   per acquisition and node, see `lanes.rs`), so a rollback or release never overtakes its
///   acquire and is never dropped unsent.
/// - **fencing token**: each node sets its key's counter to `max(counter + 1, proposal)`,
///   where the proposal is this client's clock in microseconds, and answers with it. The
///   grant's token T is the maximum over the nodes that said yes. Unless a majority already
///   answered exactly T (the usual case: all counters were below the proposal), T is written
///   back to every node (`counter = max(counter, T)`) before the grant is returned, and the
///   grant is refused unless a majority took it and still holds the lock.
/// - **validity**: the grant is valid for `ttl - node_timeout` from when the acquire was sent,
///   less the core's drift allowance; the core refuses a grant that arrives with no validity
///   left. Renewals need a majority too; the holder's `lost()` fires when the validity passes
///   without one, or as soon as more than N - majority nodes say the lock is not ours. Other
///   clients can be granted only once the keys expire, at least `node_timeout` later.
///
/// # Why tokens strictly increase, and what that needs
/// Let grant G1 get token T1 and a later grant G2 token T2. When G1's guard is returned, a
/// majority W1 of nodes has a counter of at least T1 (they answered T1, or took the
/// write-back), at least `node_timeout` before G1's validity ends (the `- node_timeout`
/// above). G2's majority M2 meets W1 in some node n. G2 can only be granted after G1's keys
/// expired or were deleted on enough nodes, which is after G1's validity ended; G2's requests
/// reached all its nodes within one `node_timeout` of each other, so its request reached n
/// after n's counter was at least T1. So n answered at least T1 + 1, and T2 >= T1 + 1,
/// whatever the clocks said. This needs:
/// - no node loses data: a node restarted without persistence forgets both the lock and its
///   counter (run with `appendonly yes`, `appendfsync always`, or keep a restarted node out
///   for longer than the TTL, as the Redlock paper says);
/// - bounded clock drift between the nodes and this client (the core's drift allowance) and
///   pauses of this process shorter than the validity it checks;
/// - the counters not expiring: they live [`RedlockConfig::fence_ttl`] past the lock's last
///   grant or renewal (renewals keep them alive while the lock is held). After that, tokens restart from the acquiring client's clock, which keeps them
///   increasing unless the clients' clocks disagree by more than the time since that grant.
///
/// Tokens can still be out of order with exclusion broken (a holder paused past its
/// validity): that is what they are for, a fenced resource rejects the stale holder.
#[derive(Clone)]
pub struct RedlockBackend {
    nodes: Arc<[Node]>,
    config: Arc<RedlockConfig>,
    /// The change count all nodes' notifiers share (see `notify/`).
    notifications: Arc<AtomicU64>,
    /// Where hand-overs to this backend's waiters are announced, on every node.
    inbox: Arc<Inbox>,
}

struct Node {
    addr: String,
    /// For acquire, release and inspect, called from the user's tasks. It has no response
    /// timeout of its own: each caller bounds its wait, and a lock's requests are pursued
    /// for the lock's TTL (see `lanes.rs`).
    connection: ConnectionManager,
    /// The order of each lock's acquire, write-back and release requests to this node.
    lanes: Arc<Lanes>,
    /// For renewals only, used on lockkit's runtime (see `RedisBackend`).
    renewals: ConnectionManager,
    /// Release notifications from this node.
    notifier: Notifier,
    /// Whether this node lately refused (or did not answer) a subscription.
    refusal: Refusal,
}

impl RedlockBackend {
    /// Opens connections to every node and loads the scripts where it can.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] for an invalid configuration; [`ErrorKind::Auth`] if any
    /// node refuses the credentials; [`ErrorKind::QuorumNotReached`] if fewer than a majority
    /// of the nodes answer.
    pub async fn connect(config: RedlockConfig) -> Result<Self> {
        config.validate()?;
        let dialer = Dialer {
            backend: BACKEND,
            username: config.username.clone(),
            password: config.password.clone(),
            db: 0,
            tls: config.tls,
            tls_ca: Dialer::read_ca(config.tls_ca_file.as_deref())?,
            tls_identity: Dialer::read_identity(
                config.tls_cert_file.as_deref(),
                config.tls_key_file.as_deref(),
            )?,
            connect_timeout: config.connect_timeout,
            response_timeout: config.node_timeout,
        };
        let addrs = config.nodes.clone();
        let notifications = Arc::new(AtomicU64::new(0));
        let sequence = notifications.clone();
        let inbox = Arc::new(Inbox::new(config.quorum()));
        let inboxes = inbox.clone();
        let nodes = lockkit_core::backend::runtime::run(async move {
            addrs
                .into_iter()
                .enumerate()
                .map(|(node, addr)| {
                    let (host, port) = parse_host(&addr)?;
                    let info = dialer.info(&host, port, ProtocolVersion::RESP2)?;
                    let pushes = dialer.info(&host, port, ProtocolVersion::RESP3)?;
                    Ok(Node {
                        addr,
                        connection: dialer.lazy_without_response_timeout(info.clone())?,
                        lanes: Arc::default(),
                        // Bounded per batch by `renew_on_all`: a tick's pipeline may take
                        // longer than one node timeout.
                        renewals: dialer.lazy_without_response_timeout(info)?,
                        notifier: Notifier::sharing(
                            dialer.clone(),
                            pushes,
                            sequence.clone(),
                            inboxes.clone(),
                            node,
                        ),
                        refusal: Refusal::default(),
                    })
                })
                .collect::<Result<Vec<_>>>()
        })
        .await??;
        let backend = RedlockBackend {
            nodes: nodes.into(),
            config: Arc::new(config),
            notifications,
            inbox,
        };
        let connecting = backend.clone();
        let loaded = lockkit_core::backend::runtime::run(async move {
            let bound = connecting.config.connect_timeout + connecting.config.node_timeout;
            let load = |mut con: ConnectionManager| async move {
                scripts::load_all()
                    .query_async::<Vec<String>>(&mut con)
                    .await
            };
            let (loaded, _) = tokio::join!(
                connecting.on_all(bound, false, load),
                connecting.on_all(bound, true, load)
            );
            loaded
        })
        .await?;
        if let Some(auth) = loaded
            .iter()
            .find_map(|r| r.as_ref().err().filter(|e| e.kind() == ErrorKind::Auth))
        {
            return Err(Error::new(ErrorKind::Auth, BACKEND, auth.message()));
        }
        let answered = loaded.iter().filter(|r| r.is_ok()).count();
        if answered < backend.quorum() {
            return Err(backend.quorum_error("connecting", answered, &loaded));
        }
        backend.check_eviction().await?;
        Ok(backend)
    }

    /// Refuses nodes that may evict lock keys, unless the configuration accepts it. A node
    /// that does not answer now is not checked (the quorum tolerates it down).
    async fn check_eviction(&self) -> Result<()> {
        let answers = self
            .on_all(self.config.node_timeout, false, |mut con| async move {
                crate::eviction::info_memory()
                    .query_async::<String>(&mut con)
                    .await
            })
            .await;
        for (node, answer) in self.nodes.iter().zip(answers) {
            match crate::eviction::judge(
                BACKEND,
                &node.addr,
                answer,
                self.config.allow_eviction,
                "redlock.allow_eviction",
            ) {
                Err(e) if e.kind() == ErrorKind::Unavailable => {
                    tracing::debug!(node = %node.addr, error = %e, "cannot check the eviction policy of a node that does not answer");
                }
                outcome => outcome?,
            }
        }
        Ok(())
    }

    /// The configuration this backend was built with.
    pub fn config(&self) -> &RedlockConfig {
        &self.config
    }

    fn quorum(&self) -> usize {
        self.config.quorum()
    }

    /// Releases the lock on every node, pursuing each node for `ttl` (see
    /// [`RedlockBackend::fan_out`]).
    async fn release_on_all(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Vec<NodeResult<Value>> {
        let keys = Keys::of(key);
        self.script_on_all(
            owner,
            &scripts::classic().release,
            &keys.release()[..4],
            &self.release_args(owner, Some(&keys.channel)),
            ttl,
        )
        .await
    }

    /// The arguments of the release script (its keys are the first four of [`Keys::release`]): a
    /// release hands the lock over to the first waiter in each node's queue, with a token
    /// proposed from this client's clock (see [`proposed_token`]), and, when it freed or
    /// handed over the lock, publishes on `channel`, which wakes non-fair waiters (a fair
    /// attempt's rollback publishes nothing: its waiters queue, and wait for hand-overs).
    pub(super) fn release_args(&self, owner: &OwnerToken, channel: Option<&str>) -> Vec<String> {
        vec![
            owner.expose_hex(),
            channel.unwrap_or_default().to_owned(),
            millis(self.config.fence_ttl).to_string(),
            proposed_token().to_string(),
        ]
    }

    /// Every node's view of the holder.
    async fn holders(&self, key: &LockKey) -> Vec<NodeResult<Option<Holder>>> {
        let lock = Keys::of(key).lock;
        self.on_all(self.config.node_timeout, false, move |mut con| {
            let lock = lock.clone();
            async move {
                scripts::INSPECT
                    .key(lock)
                    .invoke_async::<Value>(&mut con)
                    .await
            }
        })
        .await
        .into_iter()
        .map(|reply| reply.and_then(|value| scripts::inspect_reply(BACKEND, &value)))
        .collect()
    }

    /// Writes `token` back to every node; succeeds once a majority took it and still has the
    /// lock as ours.
    async fn raise_fences(&self, request: &AcquireRequest, token: FencingToken) -> Result<()> {
        let keys = Keys::of(&request.key);
        let quorum = self.quorum();
        let answers = self
            .fan_out(
                &request.owner,
                &scripts::RAISE_FENCE,
                &[&keys.lock, &keys.fence],
                &[
                    request.owner.expose_hex(),
                    token.get().to_string(),
                    millis(self.config.fence_ttl).to_string(),
                ],
                request.ttl,
                None,
                move |answers| answered_one(answers) >= quorum,
            )
            .await;
        let got = answered_one(&answers);
        if got >= quorum {
            return Ok(());
        }
        let errors: Vec<Option<&Error>> = answers
            .iter()
            .map(|a| a.as_ref().and_then(|r| r.as_ref().err()))
            .collect();
        Err(self.quorum_error_of("writing the fencing token back", got, &errors))
    }

    /// How long a grant or renewal is valid from when it was sent: the TTL less one node
    /// timeout (see the type's docs for why).
    fn validity(&self, ttl: Duration) -> Duration {
        ttl.saturating_sub(self.config.node_timeout)
    }
}

#[async_trait]
impl LockBackend for RedlockBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn tier(&self) -> Tier {
        Tier::Quorum
    }

    fn capabilities(&self) -> Capabilities {
        // With every node refusing notifications, the core's jittered backoff takes over.
        let wait = if self.nodes.iter().any(|node| node.refusal.allows()) {
            WaitStrategy::Notify
        } else {
            WaitStrategy::Poll
        };
        Capabilities::new(FencingGuarantee::BestEffort, wait)
            .with_min_ttl(self.config.node_timeout * 4)
            .with_election(Support::Unsupported(NO_ELECTIONS))
            .with_semaphore(Support::Unsupported(NO_SEMAPHORES))
            .with_rwlock(Support::Unsupported(NO_RWLOCKS))
    }

    /// One attempt; see `attempt.rs` for what it waits for and what it leaves in flight.
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let refusal = match request.hold {
            Hold::Exclusive => None,
            Hold::Read | Hold::Write => Some(NO_RWLOCKS),
            _ => Some(NO_SEMAPHORES),
        };
        if let Some(reason) = refusal {
            return Err(Error::new(
                ErrorKind::Unsupported,
                BACKEND,
                format!("{:?} holds are not supported: {reason}", request.hold),
            ));
        }
        self.attempt(request).await
    }

    /// A fair waiter waits for the lock to be handed over by a majority of the nodes (see
    /// `attempt.rs`), a non-fair one for a release (see `wait.rs`).
    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        if request.fair {
            self.wait_for_handover(request, contention, max_wait).await
        } else {
            self.wait_for_release(request, contention, max_wait).await
        }
    }

    /// Deletes the request's keys on every node that answers. A node that is down keeps its
    /// key until the TTL, which is only an error (logged by the core) when no majority
    /// answered: with a minority down, that is the expected state of a working quorum.
    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        self.inbox.forget(&request.owner.digest_hex());
        let replies = self
            .release_on_all(&request.key, &request.owner, request.ttl)
            .await;
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        if answered >= self.quorum() {
            Ok(())
        } else {
            Err(self.quorum_error("cleaning up an acquisition", answered, &replies))
        }
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        self.renew_many(std::slice::from_ref(lease))
            .await
            .pop()
            .unwrap_or_else(|| Err(unexpected(BACKEND, "a renewal")))
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        self.renew_leases(leases).await
    }

    /// Answers once a majority deleted the keys: the other nodes got the same request (all
    /// are sent before any answer counts), and a key a minority node still holds cannot stop
    /// a majority from granting; it expires with its TTL.
    async fn release(&self, lease: &Lease) -> Result<bool> {
        let keys = Keys::of(lease.key());
        let quorum = self.quorum();
        let answers = self
            .fan_out(
                lease.owner(),
                &scripts::classic().release,
                &keys.release()[..4],
                &self.release_args(lease.owner(), Some(&keys.channel)),
                lease.ttl(),
                None,
                move |answers| answered_one(answers) >= quorum,
            )
            .await;
        let done = answered_one(&answers);
        if done >= quorum {
            return Ok(true);
        }
        let unknown = answers.iter().filter(|a| !matches!(a, Some(Ok(_)))).count();
        if done + unknown >= quorum {
            let errors: Vec<Option<&Error>> = answers
                .iter()
                .map(|a| a.as_ref().and_then(|r| r.as_ref().err()))
                .collect();
            Err(self.quorum_error_of("releasing", done, &errors))
        } else {
            Ok(false)
        }
    }

    async fn is_held(&self, lease: &Lease) -> Result<bool> {
        let holders = self.holders(lease.key()).await;
        let ours = holders
            .iter()
            .filter(|h| matches!(h, Ok(Some(holder)) if holder.is(lease.owner())))
            .count();
        let unknown = holders.iter().filter(|h| h.is_err()).count();
        if ours >= self.quorum() {
            Ok(true)
        } else if ours + unknown >= self.quorum() {
            Err(self.quorum_error("checking the lock", ours, &holders))
        } else {
            Ok(false)
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let holders = self.holders(key).await;
        let answered = holders.iter().filter(|h| h.is_ok()).count();
        if answered < self.quorum() {
            return Err(self.quorum_error("inspecting", answered, &holders));
        }
        let mut by_owner: HashMap<&str, Vec<&LockInfo>> = HashMap::new();
        for holder in holders.iter().flatten().flatten() {
            by_owner
                .entry(&holder.owner_hex)
                .or_default()
                .push(&holder.info);
        }
        let Some(infos) = by_owner
            .into_values()
            .find(|infos| infos.len() >= self.quorum())
        else {
            return Ok(None);
        };
        let token = infos
            .iter()
            .map(|i| i.fencing_token)
            .max()
            .unwrap_or(FencingToken(0));
        // Held until fewer than a majority of its keys remain.
        let mut ttls: Vec<Duration> = infos.iter().filter_map(|i| i.remaining_ttl).collect();
        ttls.sort_by(|a, b| b.cmp(a));
        let mut info = LockInfo::new(token);
        if let Some(remaining) = ttls.get(self.quorum() - 1) {
            info = info.with_remaining_ttl(*remaining);
        }
        Ok(Some(info))
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

    async fn ping(&self) -> Result<()> {
        let replies = self
            .on_all(self.config.node_timeout, false, |mut con| async move {
                redis::cmd("PING").query_async::<String>(&mut con).await
            })
            .await;
        let up = replies.iter().filter(|r| r.is_ok()).count();
        if up >= self.quorum() {
            Ok(())
        } else {
            Err(self.quorum_error("ping", up, &replies))
        }
    }
}

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("quorum", &self.quorum())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The token this client proposes to every node: its clock in microseconds. Nodes whose
/// counters are below it all answer with it, so a majority agrees and the write-back round
/// trip is skipped; a node whose counter is ahead answers with counter + 1 instead, which is
/// what keeps tokens increasing whatever this clock says.
fn proposed_token() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        })
}

/// How many nodes answered 1 (the script did what was asked: the key is ours, or was deleted).
fn answered_one(answers: &[Option<NodeResult<Value>>]) -> usize {
    answers
        .iter()
        .filter(|a| matches!(a, Some(Ok(Value::Int(1)))))
        .count()
}
