//! `EtcdBackend`: the connection, the public API, and the trait implementation (renewal
//! checks, inspection); sessions, naming, attempts, waiting and clean-up have their own
//! files.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, ConnectOptions, GetOptions, GetResponse, Identity, SortOrder, TlsOptions,
    Txn, TxnOp, TxnResponse,
};
use lockkit_core::backend::cleanup::{Acquisitions, Sweeps};
use lockkit_core::backend::{
    AcquireRequest, Attempt, CancellationToken, Contention, Grant, Lease, LockBackend, LockPage,
    OwnerToken, Renewal, lease_of, runtime,
};
use lockkit_core::{
    Capabilities, Error, ErrorKind, FencingGuarantee, Leader, LockInfo, LockKey, MutexGuard,
    Result, Support, Tier, WaitStrategy,
};

use crate::cleanup::Pending;
use crate::config::EtcdConfig;
use crate::error::{self, BACKEND};
use crate::naming::{KeyNames, RWLOCKS, SEMAPHORES, by_create, token_of};
use crate::request::{held_by, txn_of};
use crate::session::Sessions;

/// etcd raises shorter lease TTLs to this.
pub(crate) const MIN_TTL_SECS: i64 = 2;
/// A lock backend over an etcd cluster (tier [`Tier::Consensus`]).
///
/// # Algorithm
/// - **Sessions**: one etcd lease per distinct TTL (in whole seconds, at least 2 s), granted
///   on first use and kept alive by one keep-alive stream on lockkit's background runtime, at
///   a third of the TTL. All locks of that TTL share it, as in etcd's `concurrency.Session`.
///   When keep-alive cannot renew the lease before its TTL runs out (counted from the last
///   confirmed keep-alive's send time), or the server says the lease is gone, the session
///   ends and every lock on it reports [`lost`](lockkit_core::MutexGuard::lost).
/// - **Acquire**: one transaction puts `<prefix>/<namespace>/<name>/<lease-hex>-<n>` (value:
///   the owner token's [digest](OwnerToken::digest_hex), never the token itself, since
///   whoever may read the prefix sees it; attached to the session lease) if it does not exist, and reads at the
///   same revision who holds the lock: the key with the lowest create revision under
///   `<prefix>/<namespace>/<name>/`. Right after the put, the newest two keys tell it (the
///   own key holds the lock if no key precedes it; otherwise that key is the predecessor); a
///   later attempt reads the own key and its predecessor, without a write. `try_lock` puts
///   only when no key exists, so contention leaves nothing behind. One attempt serves every
///   kind of grant (`acquire.rs`): the mutex, the permit and the read and write locks differ
///   only in where their keys queue and which keys keep them out. `<n>` is the lowest number
///   the client's other acquisitions of the lock do not use, so a client reuses one name
///   (etcd keeps every key name in its index until a compaction).
/// - **Wait**: watch only the immediate predecessor's key for its deletion, from the revision
///   the transaction read, so no event is missed and a release wakes exactly one waiter.
/// - **Grant**: only from a transaction that saw the own key (on the live session lease) as
///   the lowest one: a waiter whose lease expired while it waited is never granted.
/// - **Fencing token**: the own key's create revision (cluster-wide, strictly increasing).
/// - **Renewal**: the session keeps the key alive; the core's renewal checks in one read-only
///   transaction per batch that each key still exists with its create revision and owner.
/// - **Release and abandon**: delete the own key only if its create revision (release) or its
///   owner token's digest (abandon) still match. A delete that fails is retried in the background
///   while the session lives, since the shared lease would otherwise keep the key forever.
/// - **Attempts cancelled in flight**: their put may land after the clean-up (it deletes
///   the key at once, after 50 ms, 500 ms and two request timeouts), held up on a slow link.
///   Every put also compares the session's epoch key (`<prefix>/../sessions/<lease-hex>`);
///   once an attempt of a session went unanswered, the session's clean-up writes that key,
///   so no put sent before can land any more, then deletes the keys on its lease that no
///   acquisition uses (a put that landed before), and stops until the next unanswered
///   attempt. A late key never holds the lock for as long as the process lives, and a session
///   whose attempts are answered costs nothing. (Under RBAC the clean-up needs permission to
///   ask for the lease's keys; without it, it logs a warning and retries.)
/// - **Elections**: the election is the lock; the leader's value lives in its own key after
///   the owner digest, written by a transaction guarded on the key's create revision; the
///   leader is one range read of the lowest key; observers watch the leader's key (see the
///   crate docs, "Elections").
/// - **Semaphores**: the same keys and sessions under [`EtcdBackend::semaphore_prefix`],
///   with the permit count in the key's path; the first `permits` keys by create revision
///   hold a permit; the first waiter watches the range for departures ahead of it, every
///   later one only its predecessor (see the crate docs, "Semaphores").
/// - **Read-write locks**: the same keys and sessions under [`EtcdBackend::rwlock_prefix`],
///   readers under `read/`, writers under `write/`; a reader holds when no write entry was
///   created before it, a writer when no entry was; each waiter watches only the nearest
///   entry that keeps it out (see the crate docs, "Read-write locks").
///
/// Clones share the connection and the sessions. Dropping the last clone stops the
/// keep-alives, so the session leases expire after their TTL; [`EtcdBackend::close`] revokes
/// them at once instead.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) config: EtcdConfig,
    pub(crate) sessions: Sessions,
    pub(crate) pending: Acquisitions<Pending>,
    pub(crate) names: Arc<KeyNames>,
    pub(crate) shutdown: CancellationToken,
    /// The clean-up deletes left running in the background, for `idle`.
    pub(crate) sweeps: Sweeps,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl EtcdBackend {
    /// Connects to the cluster and checks that it answers (a linearizable read, so a cluster
    /// without quorum is refused here rather than at the first lock).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] for an invalid configuration or unreadable TLS files;
    /// [`ErrorKind::Auth`] for refused credentials; [`ErrorKind::Unavailable`] when the
    /// cluster does not answer within `connect_timeout + request_timeout`.
    pub async fn connect(config: EtcdConfig) -> Result<EtcdBackend> {
        config.validate()?;
        let options = connect_options(&config)?;
        let endpoints = config.endpoints.clone();
        let limit = config.connect_timeout + config.request_timeout;
        // Created on lockkit's runtime, so the connection's driver tasks live there.
        let connected = runtime::run(async move {
            tokio::time::timeout(limit, Client::connect(endpoints, Some(options))).await
        })
        .await?;
        let client = match connected {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(error::map("connecting to etcd", e)),
            Err(_) => return Err(error::timed_out("connecting to etcd", limit)),
        };
        let backend = EtcdBackend {
            inner: Arc::new(Inner {
                client,
                config,
                sessions: Sessions::default(),
                pending: Acquisitions::new(),
                names: Arc::default(),
                shutdown: CancellationToken::new(),
                sweeps: Sweeps::new(),
            }),
        };
        backend.ping().await?;
        Ok(backend)
    }

    /// The configuration this backend was connected with.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// The underlying etcd client (cheap to clone), for reading and writing the data the
    /// locks protect. Writes that must happen only while a lock is held go through
    /// [`EtcdBackend::txn_if_held`].
    pub fn client(&self) -> Client {
        self.inner.client.clone()
    }

    /// The etcd key range (`<prefix>/<namespace>/<name>/`) under which the holder and the
    /// waiters of `key` keep their keys.
    pub fn lock_prefix(&self, key: &LockKey) -> String {
        format!(
            "{}/{}/{}/",
            self.inner.config.prefix,
            key.namespace(),
            key.name()
        )
    }

    /// The first key of `key`'s lock range by create revision (its holder) and how many
    /// keys the range holds, in one linearizable read, for `what`.
    pub(crate) async fn read_holder(&self, key: &LockKey, what: &str) -> Result<GetResponse> {
        let prefix = self.lock_prefix(key);
        self.read(what, |mut client| {
            let prefix = prefix.clone();
            async move {
                client
                    .get(prefix, Some(by_create(SortOrder::Ascend, 1)))
                    .await
            }
        })
        .await
    }

    /// The etcd key range (`<prefix>/<namespace>/../semaphore/<name>/`) under which the
    /// holders and the waiters of the semaphore `key` keep their keys, in a part per permit
    /// count (`<permits>/`). It is apart from the mutex of that name: no lock name is `..`.
    pub fn semaphore_prefix(&self, key: &LockKey) -> String {
        format!(
            "{}/{}/{SEMAPHORES}/{}/",
            self.inner.config.prefix,
            key.namespace(),
            key.name()
        )
    }

    /// The etcd key range (`<prefix>/<namespace>/../rwlock/<name>/`) under which the readers
    /// and the writers of the read-write lock `key` keep their keys, in a part per kind
    /// (`read/`, `write/`). It is apart from the mutex and the semaphore of that name: no
    /// lock name is `..`, and the semaphores are under `../semaphore/`.
    pub fn rwlock_prefix(&self, key: &LockKey) -> String {
        format!(
            "{}/{}/{RWLOCKS}/{}/",
            self.inner.config.prefix,
            key.namespace(),
            key.name()
        )
    }

    /// Runs `ops` in one transaction that applies only while `guard` still holds its lock:
    /// it compares the lock key's create revision with the guard's fencing token (which names
    /// the grant: a key put again under the same name has a new one). This is the fenced write
    /// of etcd: a holder that was paused past its session and lost the lock cannot overwrite
    /// what the next holder wrote. An election's leader passes its
    /// [`Leadership::guard`](lockkit_core::Leadership::guard).
    ///
    /// ```no_run
    /// # async fn demo(backend: lockkit_etcd::EtcdBackend, guard: lockkit_core::MutexGuard) -> lockkit_core::Result<()> {
    /// use lockkit_etcd::etcd_client::TxnOp;
    /// backend
    ///     .txn_if_held(&guard, [TxnOp::put("billing/total", "42", None)])
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::Lost`] when the lock is no longer held (nothing was written);
    /// [`ErrorKind::InvalidConfig`] for a guard that this backend did not grant; request
    /// errors as for every call.
    pub async fn txn_if_held(
        &self,
        guard: &MutexGuard,
        ops: impl Into<Vec<TxnOp>>,
    ) -> Result<TxnResponse> {
        let lease = lease_of(guard);
        let Some(key) = lease.handle() else {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                "txn_if_held needs a lock granted by the etcd backend",
            ));
        };
        let txn = Txn::new().when(held_by(key, lease)).and_then(ops);
        let response = self.call("writing under the lock", txn_of(&txn)).await?;
        if !response.succeeded() {
            return Err(Error::new(
                ErrorKind::Lost,
                BACKEND,
                format!(
                    "lock {} is no longer held; nothing was written",
                    lease.key()
                ),
            ));
        }
        Ok(response)
    }

    /// Ends every session of this backend: revokes its leases, which deletes all its lock
    /// keys at once (the guards report the locks lost). Later acquisitions start new sessions.
    ///
    /// # Errors
    /// The first revoke that failed; those leases expire after their TTL.
    pub async fn close(&self) -> Result<()> {
        let sessions = self.inner.sessions.drain().await;
        let mut outcome = Ok(());
        for session in sessions {
            session.lose("the backend was closed");
            let lease_id = session.lease_id;
            let revoked = self
                .call("revoking a session lease", |mut client| async move {
                    client.lease_revoke(lease_id).await
                })
                .await;
            if let Err(e) = revoked
                && outcome.is_ok()
            {
                outcome = Err(e);
            }
        }
        outcome
    }

    pub(crate) fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<OwnerToken, Pending>> {
        self.inner.pending.lock()
    }
}

/// How long a connection may stay silent before it is asked for a sign of life (an HTTP/2
/// PING, answered within the request timeout or the connection is dropped). A queue waiter's
/// watch has no timer of its own: on a connection that went dead without a reset (a host or
/// a link gone silent) it would wait for a release it can no longer hear, while its
/// session's keep-alive may be fine on another member's connection. One PING per silent
/// connection, however many waiters it carries. Not below etcd's `--grpc-keepalive-min-time`
/// (5 s by default): a client that pings more often is sent away (`too_many_pings`).
const PING_AFTER: Duration = Duration::from_secs(10);

fn connect_options(config: &EtcdConfig) -> Result<ConnectOptions> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(config.connect_timeout)
        .with_timeout(config.request_timeout)
        .with_keep_alive(PING_AFTER, config.request_timeout)
        .with_keep_alive_while_idle(false)
        .with_require_leader(config.require_leader);
    if let Some(user) = &config.user {
        options = options
            .with_user(user.clone(), config.password.clone().unwrap_or_default())
            .with_auto_token_refresh(true);
    }
    if config.tls {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| {
                Error::invalid_config(format!("[etcd] cannot read {}: {e}", path.display()))
            })
        };
        let mut tls = TlsOptions::new();
        if let Some(ca) = &config.ca_file {
            tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&config.cert_file, &config.key_file) {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        if let Some(domain) = &config.tls_domain {
            tls = tls.domain_name(domain.clone());
        }
        options = options.with_tls(tls);
    }
    Ok(options)
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn tier(&self) -> Tier {
        Tier::Consensus
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(FencingGuarantee::Monotonic, WaitStrategy::Queue)
            .with_min_ttl(Duration::from_secs(MIN_TTL_SECS.unsigned_abs()))
            .with_election(Support::Supported)
            .with_semaphore(Support::Supported)
            .with_rwlock(Support::Supported)
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        self.attempt(request).await
    }

    /// Ends early, too, when the session of the request's key is lost: the key went with
    /// the lease, so the wait is for nothing, and the next attempt queues on a new session.
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
        self.renew_many(std::slice::from_ref(lease))
            .await
            .pop()
            .unwrap_or(Ok(Renewal::Lost))
    }

    /// One read-only round trip for the whole batch (see `renewal.rs`).
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        self.renew_batch(leases).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        self.release_lease(lease).await
    }

    /// The own key with its create revision and owner, and what its kind reads to tell its
    /// place, in one read-only transaction.
    async fn is_held(&self, lease: &Lease) -> Result<bool> {
        self.holds(lease).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let response = self.read_holder(key, "inspecting").await?;
        let Some(holder) = response.kvs().first() else {
            return Ok(None);
        };
        let waiters = usize::try_from(response.count() - 1).unwrap_or(0);
        let mut info = LockInfo::new(token_of(holder.create_revision())).with_waiters(waiters);
        let lease = holder.lease();
        if lease != 0 {
            let ttl = self
                .read("reading the holder's lease", |mut client| async move {
                    client.lease_time_to_live(lease, None).await
                })
                .await?
                .ttl();
            if ttl > 0 {
                info = info.with_remaining_ttl(Duration::from_secs(ttl.unsigned_abs()));
            }
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

    /// One transaction: the value goes into the own key, beside the owner digest, only while
    /// the key has the grant's create revision (see the crate docs, "Elections").
    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool> {
        self.proclaim_value(lease, value).await
    }

    /// One linearizable range read: the lowest key of the lock and its value.
    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>> {
        Ok(self
            .read_leader(key)
            .await?
            .leader
            .map(|(_, leader)| leader))
    }

    /// A fresh read, then a watch on the leader's key (on the lock's range when nobody
    /// leads) from the revision after that read.
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
        let root = format!("{}/", self.inner.config.prefix);
        self.call("reading from etcd", |mut client| {
            let root = root.clone();
            async move {
                client
                    .get(
                        root,
                        Some(GetOptions::new().with_prefix().with_count_only()),
                    )
                    .await
            }
        })
        .await
        .map(|_| ())
    }
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}
