//! `EtcdBackend`: the connection, the public API, and the trait implementation (renewal
//! checks, inspection); sessions, naming, attempts, waiting and clean-up have their own
//! files.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, KeyValue,
    SortOrder, TlsOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use lockkit_core::backend::cleanup::{Acquisitions, Sweeps};
use lockkit_core::backend::{
    AcquireRequest, Attempt, CancellationToken, Contention, Grant, Hold, Lease, LockBackend,
    LockPage, OwnerToken, Renewal, lease_of, runtime,
};
use lockkit_core::{
    Capabilities, Error, ErrorKind, FencingGuarantee, Leader, LockInfo, LockKey, MutexGuard,
    Result, Support, Tier, WaitStrategy,
};

use crate::cleanup::Entry;
use crate::config::EtcdConfig;
use crate::error::{self, NAME};
use crate::naming::{KeyNames, SEMAPHORES, by_create, owner_of, token_of};
use crate::session::{Session, Sessions};

/// etcd raises shorter lease TTLs to this.
pub(crate) const MIN_TTL_SECS: i64 = 2;
/// etcd's default `--max-txn-ops`: the most operations one transaction may carry.
const MAX_TXN_OPS: usize = 128;
/// The pause before sending a request again.
const RESEND_PAUSE: Duration = Duration::from_millis(10);

/// Which failures of a request [`EtcdBackend::send`] sends it again after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Only a failure before it reached any member: a request that may not be applied twice.
    IfNeverSent,
    /// Any failure a retry can cure (a broken connection, a member without a leader): a
    /// read, or a write whose guard makes a second application a no-op.
    IfRetryable,
}

impl Resend {
    fn allows(self, error: &etcd_client::Error) -> bool {
        match self {
            Resend::IfNeverSent => error::never_sent(error),
            Resend::IfRetryable => error::kind(error) == ErrorKind::Unavailable,
        }
    }
}

/// What [`EtcdBackend::send`] got.
pub(crate) struct Sent<T> {
    /// The last send's answer.
    pub(crate) answer: Result<T, etcd_client::Error>,
    /// A send before the last failed in a way that may have left it applied.
    pub(crate) resent: bool,
}

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
///   later attempt reads the own key, the lowest key and the predecessor. `try_lock` puts
///   only when no key exists, so contention leaves nothing behind. `<n>` is the lowest number
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
///   the key at once, after 50 ms, 500 ms and two request timeouts). Once an attempt of a
///   session went unanswered, the keys on its lease that no acquisition uses are deleted
///   every session TTL, so such a late key holds the lock **at most one session TTL plus a
///   request timeout** after it lands, never for as long as the process lives. (Under RBAC
///   this needs permission to ask for the lease's keys; without it the sweep logs a warning
///   and the bound is the process's lifetime, as before.)
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
    pub(crate) entries: Acquisitions<Entry>,
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
                entries: Acquisitions::new(),
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
                NAME,
                "txn_if_held needs a lock granted by the etcd backend",
            ));
        };
        let txn = Txn::new().when(held_by(key, lease)).and_then(ops);
        let response = self.call("writing under the lock", txn_of(&txn)).await?;
        if !response.succeeded() {
            return Err(Error::new(
                ErrorKind::Lost,
                NAME,
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

    pub(crate) fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<OwnerToken, Entry>> {
        self.inner.entries.lock()
    }

    /// Sends one request, again within the request timeout after a failure `resend` allows
    /// (the balancer may pick a member that is down and refuses the connection; a
    /// connection may break under the request). `None` when the timeout passed.
    pub(crate) async fn send<T, Fut>(
        &self,
        resend: Resend,
        mut request: impl FnMut(Client) -> Fut,
    ) -> Option<Sent<T>>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + self.inner.config.request_timeout;
        let mut resent = false;
        let answer = async {
            loop {
                match request(self.client()).await {
                    Err(e)
                        if resend.allows(&e)
                            && tokio::time::Instant::now() + RESEND_PAUSE < deadline =>
                    {
                        resent |= !error::never_sent(&e);
                        tokio::time::sleep(RESEND_PAUSE).await;
                    }
                    answer => return answer,
                }
            }
        };
        let answer = tokio::time::timeout_at(deadline, answer).await.ok()?;
        Some(Sent { answer, resent })
    }

    /// [`send`](Self::send) of a request that may not be applied twice, with errors mapped
    /// for `what`.
    pub(crate) async fn call<T, Fut>(
        &self,
        what: &str,
        request: impl FnMut(Client) -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_with(Resend::IfNeverSent, what, request)
            .await
            .map(|sent| sent.0)
    }

    /// [`send`](Self::send) of a read, which may be sent again after any failure a retry can
    /// cure, with errors mapped for `what`.
    pub(crate) async fn read<T, Fut>(
        &self,
        what: &str,
        request: impl FnMut(Client) -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_with(Resend::IfRetryable, what, request)
            .await
            .map(|sent| sent.0)
    }

    /// [`send`](Self::send) with errors mapped for `what`: the answer, and whether a send
    /// before it may have been applied.
    pub(crate) async fn call_with<T, Fut>(
        &self,
        resend: Resend,
        what: &str,
        request: impl FnMut(Client) -> Fut,
    ) -> Result<(T, bool)>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        match self.send(resend, request).await {
            Some(Sent {
                answer: Ok(value),
                resent,
            }) => Ok((value, resent)),
            Some(Sent { answer: Err(e), .. }) => Err(error::map(what, e)),
            None => Err(error::timed_out(what, self.inner.config.request_timeout)),
        }
    }

    pub(crate) fn local_check(&self, lease: &Lease) -> Option<(String, Arc<Session>)> {
        if lease.session_alive() != Some(true) {
            return None;
        }
        let key = lease.handle()?;
        let entries = self.entries();
        let entry = entries.get(lease.owner())?;
        (entry.claim.key == key && !entry.session.lost.is_cancelled())
            .then(|| (entry.claim.key.clone(), entry.session.clone()))
    }
}

impl EtcdBackend {
    /// The key-values of `reads` (get operations), in order: `None` for a missing key.
    async fn read_keys(&self, reads: Vec<TxnOp>) -> Result<Vec<Option<KeyValue>>> {
        if reads.is_empty() {
            return Ok(Vec::new());
        }
        let response = self
            .read("checking held locks", txn_of(&Txn::new().and_then(reads)))
            .await?;
        Ok(response
            .op_responses()
            .into_iter()
            .map(|op| match op {
                TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
                _ => None,
            })
            .collect())
    }
}

/// A request that runs `txn`.
pub(crate) fn txn_of(
    txn: &Txn,
) -> impl FnMut(
    Client,
) -> std::pin::Pin<
    Box<dyn Future<Output = Result<TxnResponse, etcd_client::Error>> + Send>,
> + '_ {
    |mut client| {
        let txn = txn.clone();
        Box::pin(async move { client.txn(txn).await })
    }
}

/// The compares that hold while `lease` holds the lock at `key`: the key exists with the
/// grant's create revision (its fencing token). That names the grant alone: one transaction
/// created the key at that revision, for one owner, and a key deleted and put again under
/// the same name has a new one. The value is not compared: an election's leader adds its
/// proclaimed value to the owner digest there.
pub(crate) fn held_by(key: &str, lease: &Lease) -> Vec<Compare> {
    let token = i64::try_from(lease.fencing_token().get()).unwrap_or(-1);
    vec![Compare::create_revision(key, CompareOp::Equal, token)]
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
        NAME
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
        match request.hold {
            Hold::Exclusive => self.attempt(request).await,
            Hold::Permit { permits } => self.attempt_permit(request, permits).await,
            Hold::Read | Hold::Write => self.attempt_rw(request).await,
            other => Err(other.unsupported(NAME)),
        }
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

    /// Every lease's key is read back in transactions of up to 128 reads (etcd's default
    /// `--max-txn-ops`), all sent at once: they travel side by side on the client's HTTP/2
    /// connection, so a tick is one round trip however many transactions it takes. Sent one
    /// after the other, 10,000 leases were 79 round trips a tick (measured with
    /// `examples/held_locks`: 96 ms a tick beside a 0.5 ms round trip).
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        let sent_at = Instant::now();
        let checks: Vec<Option<(String, Arc<Session>)>> =
            leases.iter().map(|lease| self.local_check(lease)).collect();
        let reads: Vec<_> = checks
            .chunks(MAX_TXN_OPS)
            .map(|checks| {
                let reads: Vec<TxnOp> = checks
                    .iter()
                    .flatten()
                    .map(|(key, _)| TxnOp::get(key.clone(), None))
                    .collect();
                let backend = self.clone();
                // On lockkit's runtime, so that the transactions are all sent before the
                // first answer is awaited (and a dropped tick leaves only reads behind).
                runtime::spawn(async move { backend.read_keys(reads).await })
            })
            .collect();
        let mut answers: Vec<Result<Renewal>> = Vec::with_capacity(leases.len());
        for ((leases, checks), read) in leases
            .chunks(MAX_TXN_OPS)
            .zip(checks.chunks(MAX_TXN_OPS))
            .zip(reads)
        {
            let found = read.await.unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorKind::Backend,
                    NAME,
                    "checking held locks panicked",
                ))
            });
            let mut found = match found {
                Ok(found) => found.into_iter(),
                Err(e) => {
                    for _ in leases {
                        answers.push(Err(Error::new(e.kind(), NAME, e.message().to_owned())
                            .with_retryable(e.is_retryable())));
                    }
                    continue;
                }
            };
            for (lease, check) in leases.iter().zip(checks) {
                let Some((_, session)) = check else {
                    answers.push(Ok(Renewal::Lost));
                    continue;
                };
                let still_ours = found.next().flatten().is_some_and(|kv| {
                    kv.create_revision() == i64::try_from(lease.fencing_token().get()).unwrap_or(-1)
                        && kv.lease() == session.lease_id
                        && owner_of(kv.value()) == lease.owner().digest_hex().as_bytes()
                });
                answers.push(Ok(if still_ours {
                    Renewal::Extended(session.valid_from(sent_at))
                } else {
                    Renewal::Lost
                }));
            }
        }
        answers
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        self.release_lease(lease).await
    }

    /// One read of the own key: once a key is the lowest of its lock it stays the lowest for
    /// as long as it exists, so its existence with the lease's revision and owner is the answer.
    /// A permit: the same, and fewer than `permits` keys created before it, in one read-only
    /// transaction; a read or write lock: the same, and no entry ahead of it.
    async fn is_held(&self, lease: &Lease) -> Result<bool> {
        match lease.hold() {
            Hold::Exclusive => {}
            Hold::Permit { permits } => return self.holds_permit(lease, permits).await,
            Hold::Read | Hold::Write => return self.holds_rw(lease).await,
            other => return Err(other.unsupported(NAME)),
        }
        let Some(key) = lease.handle() else {
            return Ok(false);
        };
        let response = self
            .read("checking the lock", |mut client| {
                let key = key.to_owned();
                async move { client.get(key, None).await }
            })
            .await?;
        let token = i64::try_from(lease.fencing_token().get()).unwrap_or(-1);
        Ok(response.kvs().first().is_some_and(|kv| {
            kv.create_revision() == token
                && owner_of(kv.value()) == lease.owner().digest_hex().as_bytes()
        }))
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let prefix = self.lock_prefix(key);
        let response = self
            .read("inspecting", |mut client| {
                let prefix = prefix.clone();
                async move {
                    client
                        .get(prefix, Some(by_create(SortOrder::Ascend, 1)))
                        .await
                }
            })
            .await?;
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
