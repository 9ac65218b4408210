//! `EtcdBackend`: session leases, the acquire transaction, waiting on the predecessor,
//! renewal checks and guarded release.

use std::collections::HashMap;
use std::collections::hash_map::Entry as Slot;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    KeyValue, LeaseKeepAliveStream, LeaseKeeper, PutOptions, SortOrder, SortTarget, TlsOptions,
    Txn, TxnOp, TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions,
};
use lockkit_core::{
    AcquireRequest, Attempt, CancellationToken, Capabilities, Contention, Error, ErrorKind,
    FencingGuarantee, FencingToken, Grant, Lease, LockBackend, LockInfo, LockKey, OwnerToken,
    Renewal, Result, Tier, WaitStrategy, runtime,
};
use tokio::sync::Mutex as AsyncMutex;

use crate::config::EtcdConfig;
use crate::error::{self, NAME};

/// etcd raises shorter lease TTLs to this.
const MIN_TTL_SECS: i64 = 2;
/// etcd's default `--max-txn-ops`: the most operations one transaction may carry.
const MAX_TXN_OPS: usize = 128;
/// The pause before retrying a failed keep-alive or clean-up.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// The pause before sending a request again that never reached a member.
const NOT_SENT_PAUSE: Duration = Duration::from_millis(10);

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
///
/// Clones share the connection and the sessions. Dropping the last clone stops the
/// keep-alives, so the session leases expire after their TTL; [`EtcdBackend::close`] revokes
/// them at once instead.
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    config: EtcdConfig,
    sessions: AsyncMutex<HashMap<i64, Arc<Session>>>,
    entries: StdMutex<HashMap<OwnerToken, Entry>>,
    names: Arc<KeyNames>,
    shutdown: CancellationToken,
}

/// The lock key names this backend's acquisitions use. A name is reused once nothing can
/// touch it any more: etcd keeps every key name ever written in its index until the next
/// compaction, so a new name per acquisition would make every read of the lock's range
/// slower (measured: 1.08x instead of 1.2x of the raw floor after a thousand cycles).
#[derive(Debug, Default)]
struct KeyNames {
    claims: StdMutex<HashMap<String, u64>>,
    next_claim: AtomicU64,
}

/// A claimed key name: freeing it with a stale claim does nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Claim {
    key: String,
    id: u64,
}

impl KeyNames {
    /// The lowest free name `<prefix><lease-hex>-<n>`, claimed.
    fn claim(&self, prefix: &str, lease_id: i64) -> Claim {
        let id = self.next_claim.fetch_add(1, Ordering::Relaxed);
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        let mut n = 0u64;
        loop {
            let key = format!("{prefix}{lease_id:016x}-{n:x}");
            if let Slot::Vacant(slot) = claims.entry(key.clone()) {
                slot.insert(id);
                return Claim { key, id };
            }
            n += 1;
        }
    }

    fn free(&self, claim: &Claim) {
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        if claims.get(&claim.key) == Some(&claim.id) {
            claims.remove(&claim.key);
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// One session lease and what is known about its expiry.
#[derive(Debug)]
struct Session {
    lease_id: i64,
    ttl: Duration,
    /// Cancelled when the lease is lost; every grant on the session carries it.
    lost: CancellationToken,
    /// The send time of the last confirmed keep-alive (or of the grant) plus the TTL: the
    /// server cannot expire the lease before then.
    expires_at: StdMutex<Instant>,
}

impl Session {
    fn expires_at(&self) -> Instant {
        *self
            .expires_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn confirm(&self, sent_at: Instant, ttl: Duration) {
        let mut expires_at = self
            .expires_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *expires_at = (*expires_at).max(sent_at + ttl);
    }

    fn is_alive(&self) -> bool {
        !self.lost.is_cancelled() && Instant::now() < self.expires_at()
    }

    /// How long the lease is known to live, counted from `sent_at`.
    fn valid_from(&self, sent_at: Instant) -> Duration {
        self.expires_at().saturating_duration_since(sent_at)
    }

    fn lose(&self, why: &str) {
        if !self.lost.is_cancelled() {
            tracing::warn!(lease = %format_args!("{:016x}", self.lease_id), why, "etcd session lost; its locks are lost");
            self.lost.cancel();
        }
    }
}

/// The key of one acquisition, from its first attempt until it is released or abandoned.
#[derive(Debug)]
struct Entry {
    claim: Claim,
    session: Arc<Session>,
    create_revision: Option<i64>,
    /// A put of the key may have reached the server.
    maybe_on_server: bool,
    /// An attempt was sent and not answered: it may still put the key.
    in_flight: bool,
    /// The key just ahead of ours, as the last attempt read it, and its create revision:
    /// names are reused, so only the revision tells that key from a later one of that name.
    predecessor: Option<(String, i64)>,
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
                sessions: AsyncMutex::new(HashMap::new()),
                entries: StdMutex::new(HashMap::new()),
                names: Arc::default(),
                shutdown: CancellationToken::new(),
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

    /// Runs `ops` in one transaction that applies only while `lease` still holds its lock:
    /// it compares the lock key's create revision with the lease's fencing token and its value
    /// with the owner token's digest. This is the fenced write of etcd: a holder that was paused past
    /// its session and lost the lock cannot overwrite what the next holder wrote.
    ///
    /// ```no_run
    /// # async fn demo(backend: lockkit_etcd::EtcdBackend, guard: lockkit_core::MutexGuard) -> lockkit_core::Result<()> {
    /// use lockkit_etcd::etcd_client::TxnOp;
    /// backend
    ///     .txn_if_held(guard.lease(), [TxnOp::put("billing/total", "42", None)])
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::Lost`] when the lock is no longer held (nothing was written);
    /// [`ErrorKind::InvalidConfig`] for a lease that this backend did not grant; request
    /// errors as for every call.
    pub async fn txn_if_held(
        &self,
        lease: &Lease,
        ops: impl Into<Vec<TxnOp>>,
    ) -> Result<TxnResponse> {
        let Some(key) = lease.handle() else {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                NAME,
                "txn_if_held needs a lease granted by the etcd backend",
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
        let sessions: Vec<Arc<Session>> = self
            .inner
            .sessions
            .lock()
            .await
            .drain()
            .map(|(_, s)| s)
            .collect();
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

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<OwnerToken, Entry>> {
        self.inner
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends one request, again while it fails before reaching any member (the balancer may
    /// pick a member that is down and refuses the connection), all within the request
    /// timeout. `None` when the timeout passed.
    async fn send<T, Fut>(
        &self,
        mut request: impl FnMut(Client) -> Fut,
    ) -> Option<Result<T, etcd_client::Error>>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + self.inner.config.request_timeout;
        let answer = async {
            loop {
                match request(self.client()).await {
                    Err(e)
                        if error::never_sent(&e)
                            && tokio::time::Instant::now() + NOT_SENT_PAUSE < deadline =>
                    {
                        tokio::time::sleep(NOT_SENT_PAUSE).await;
                    }
                    answer => return answer,
                }
            }
        };
        tokio::time::timeout_at(deadline, answer).await.ok()
    }

    /// [`send`](Self::send), with errors mapped for `what`.
    async fn call<T, Fut>(&self, what: &str, request: impl FnMut(Client) -> Fut) -> Result<T>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        match self.send(request).await {
            Some(Ok(value)) => Ok(value),
            Some(Err(e)) => Err(error::map(what, e)),
            None => Err(error::timed_out(what, self.inner.config.request_timeout)),
        }
    }

    /// The live session for `ttl`, starting one if there is none.
    async fn session_for(&self, ttl: Duration) -> Result<Arc<Session>> {
        let whole_secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let secs = i64::try_from(whole_secs)
            .unwrap_or(i64::MAX)
            .max(MIN_TTL_SECS);
        let mut sessions = self.inner.sessions.lock().await;
        if let Some(session) = sessions.get(&secs)
            && session.is_alive()
        {
            return Ok(session.clone());
        }
        let session = self.start_session(secs).await?;
        sessions.insert(secs, session.clone());
        Ok(session)
    }

    async fn start_session(&self, secs: i64) -> Result<Arc<Session>> {
        let sent_at = Instant::now();
        let granted = self
            .call("granting a session lease", |mut client| async move {
                client.lease_grant(secs, None).await
            })
            .await?;
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0));
        let session = Arc::new(Session {
            lease_id: granted.id(),
            ttl,
            lost: CancellationToken::new(),
            expires_at: StdMutex::new(sent_at + ttl),
        });
        runtime::spawn(keep_alive(
            session.clone(),
            self.client(),
            self.inner.config.request_timeout,
            self.inner.shutdown.clone(),
        ));
        tracing::debug!(lease = %format_args!("{:016x}", session.lease_id), ?ttl, "etcd session started");
        Ok(session)
    }

    /// The key of `request` on `session` (the one of an earlier attempt, or a new one) and
    /// its create revision if known; marks an attempt as in flight.
    fn entry_for(
        &self,
        request: &AcquireRequest,
        session: &Arc<Session>,
        prefix: &str,
    ) -> (String, Option<i64>) {
        let mut entries = self.entries();
        let fresh = || {
            let claim = self.inner.names.claim(prefix, session.lease_id);
            Entry {
                claim,
                session: session.clone(),
                create_revision: None,
                maybe_on_server: false,
                in_flight: false,
                predecessor: None,
            }
        };
        let entry = entries.entry(request.owner.clone()).or_insert_with(fresh);
        if !Arc::ptr_eq(&entry.session, session) {
            // The earlier key went with its session's lease: queue again on the new session.
            self.inner.names.free(&entry.claim);
            *entry = fresh();
        }
        entry.maybe_on_server = true;
        entry.in_flight = true;
        (entry.claim.key.clone(), entry.create_revision)
    }

    /// Spawns guarded deletes of `key`, one after each of the `pauses` in turn, each retried
    /// until it succeeds or the session (and the key with it) is gone; then frees `claim`, if
    /// given.
    fn delete_later(
        &self,
        key: String,
        guard: Vec<Compare>,
        session: Arc<Session>,
        pauses: Vec<Duration>,
        claim: Option<Claim>,
    ) {
        let mut client = self.client();
        let limit = self.inner.config.request_timeout;
        let shutdown = self.inner.shutdown.clone();
        let names = self.inner.names.clone();
        runtime::spawn(async move {
            'deletes: for mut pause in pauses {
                loop {
                    tokio::select! {
                        () = shutdown.cancelled() => break 'deletes,
                        () = session.lost.cancelled() => break 'deletes,
                        () = tokio::time::sleep(pause) => {}
                    }
                    let txn = Txn::new()
                        .when(guard.clone())
                        .and_then([TxnOp::delete(key.clone(), None)]);
                    if let Ok(Ok(_)) = tokio::time::timeout(limit, client.txn(txn)).await {
                        break;
                    }
                    pause = RETRY_PAUSE;
                }
            }
            if let Some(claim) = claim {
                names.free(&claim);
            }
        });
    }

    /// The key just ahead of `request`'s own: its name, its create revision and the store
    /// revision of the read.
    async fn find_predecessor(
        &self,
        request: &AcquireRequest,
    ) -> Result<Option<(String, i64, i64)>> {
        let own_revision = self
            .entries()
            .get(&request.owner)
            .and_then(|entry| entry.create_revision);
        let Some(own_revision) = own_revision else {
            return Ok(None);
        };
        let prefix = self.lock_prefix(&request.key);
        let response = self
            .call("finding the predecessor", |mut client| {
                let prefix = prefix.clone();
                async move { client.get(prefix, Some(predecessor_of(own_revision))).await }
            })
            .await?;
        let revision = response.header().map_or(0, |h| h.revision());
        Ok(response
            .kvs()
            .first()
            .map(|kv| (key_of(kv), kv.create_revision(), revision)))
    }

    /// A cancelled acquisition's put landed after its clean-up, at the name `request` reuses:
    /// deletes that key (by its value) and gives `request` a new name.
    fn move_off_stale_key(
        &self,
        request: &AcquireRequest,
        session: &Arc<Session>,
        prefix: &str,
        stale_value: &[u8],
    ) -> Error {
        let stale_claim = self.entries().get_mut(&request.owner).map(|entry| {
            let claim = self.inner.names.claim(prefix, session.lease_id);
            entry.create_revision = None;
            entry.maybe_on_server = false;
            entry.in_flight = false;
            std::mem::replace(&mut entry.claim, claim)
        });
        if let Some(stale) = stale_claim {
            let guard = vec![Compare::value(
                stale.key.clone(),
                CompareOp::Equal,
                stale_value.to_vec(),
            )];
            self.delete_later(
                stale.key.clone(),
                guard,
                session.clone(),
                vec![Duration::ZERO],
                Some(stale),
            );
        }
        Error::new(
            ErrorKind::Unavailable,
            NAME,
            "a stale key of a cancelled acquisition held this acquisition's key name; retrying under another",
        )
    }

    /// Waits until the predecessor of `request`'s key is deleted, or `max_wait` passes.
    async fn wait_on_predecessor(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<()> {
        let deadline = tokio::time::Instant::now() + max_wait;
        let known = self
            .entries()
            .get(&request.owner)
            .and_then(|entry| entry.predecessor.clone());
        let (predecessor, predecessor_created, revision) =
            match (&contention.predecessor, known, contention.revision) {
                (Some(name), Some((known, created)), Some(revision)) if *name == known => {
                    (known, created, revision)
                }
                _ => {
                    match tokio::time::timeout_at(deadline, self.find_predecessor(request)).await {
                        Ok(Ok(Some(found))) => found,
                        Ok(Ok(None)) | Err(_) => return Ok(()),
                        Ok(Err(e)) => return Err(e),
                    }
                }
            };
        // The watch starts now, not at `revision + 1`: a watch from a past revision joins
        // the server's unsynced watchers, which it catches up only every 100 ms
        // (`syncWatchersLoop`), so under steady writes every handoff would wait for that tick.
        // A delete between the attempt and the watch is found by the read below instead.
        let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let opening = self.send(|mut client| {
            let (predecessor, options) = (predecessor.clone(), options.clone());
            async move { client.watch(predecessor, Some(options)).await }
        });
        let mut watch = match tokio::time::timeout_at(deadline, opening).await {
            Ok(Some(Ok(watch))) => watch,
            Ok(Some(Err(e))) => return Err(error::map("watching the predecessor", e)),
            Ok(None) => {
                return Err(error::timed_out(
                    "watching the predecessor",
                    self.inner.config.request_timeout,
                ));
            }
            Err(_) => return Ok(()),
        };
        let created = async {
            while let Some(response) = watch.message().await? {
                if response.canceled() {
                    break;
                }
                if response.created() {
                    return Ok(Some(response.header().map_or(i64::MAX, |h| h.revision())));
                }
            }
            Ok::<_, etcd_client::Error>(None)
        };
        let watched_from = match tokio::time::timeout_at(deadline, created).await {
            Ok(Ok(Some(watched_from))) => watched_from,
            Ok(Ok(None)) | Err(_) => return Ok(()),
            Ok(Err(e)) => return Err(error::map("watching the predecessor", e)),
        };
        // Nothing was written between the attempt's read and the watch: the predecessor was
        // there when the watch started. Otherwise the watch sees the delete only if the
        // predecessor is still there now (a linearizable read, after the watch started),
        // and still the same key: its name may be back by now, created anew behind ours
        // (names are reused), and a delete of that key would never come while we wait.
        if watched_from > revision {
            let reading = self.send(|mut client| {
                let predecessor = predecessor.clone();
                async move {
                    client
                        .get(predecessor, Some(GetOptions::new().with_keys_only()))
                        .await
                }
            });
            match tokio::time::timeout_at(deadline, reading).await {
                Ok(Some(Ok(found)))
                    if found
                        .kvs()
                        .first()
                        .is_some_and(|kv| kv.create_revision() == predecessor_created) => {}
                Ok(Some(Ok(_))) | Err(_) => return Ok(()),
                Ok(Some(Err(e))) => return Err(error::map("reading the predecessor", e)),
                Ok(None) => {
                    return Err(error::timed_out(
                        "reading the predecessor",
                        self.inner.config.request_timeout,
                    ));
                }
            }
        }
        let deleted = async {
            while let Some(response) = watch.message().await? {
                let gone = response
                    .events()
                    .iter()
                    .any(|event| event.event_type() == EventType::Delete);
                // A cancelled watch (compacted revision, lost leader) ends the wait: the next
                // attempt reads the queue afresh.
                if gone || response.canceled() {
                    break;
                }
            }
            Ok::<(), etcd_client::Error>(())
        };
        match tokio::time::timeout_at(deadline, deleted).await {
            Ok(Ok(())) | Err(_) => Ok(()),
            Ok(Err(e)) => Err(error::map("watching the predecessor", e)),
        }
    }

    fn local_check(&self, lease: &Lease) -> Option<(String, Arc<Session>)> {
        if lease.session().is_none_or(CancellationToken::is_cancelled) {
            return None;
        }
        let key = lease.handle()?;
        let entries = self.entries();
        let entry = entries.get(lease.owner())?;
        (entry.claim.key == key && !entry.session.lost.is_cancelled())
            .then(|| (entry.claim.key.clone(), entry.session.clone()))
    }
}

/// A guarded delete of a lock key. If it fails, or its future is dropped before the answer
/// (the core does not retry a dropped release), the delete is finished in the background:
/// the shared session lease would otherwise keep the key for as long as the process lives.
/// Once it is done, the key's name is freed for reuse, if it gives the claim.
struct PendingDelete<'a> {
    backend: &'a EtcdBackend,
    key: String,
    guard: Vec<Compare>,
    session: Arc<Session>,
    claim: Option<Claim>,
    unfinished: bool,
}

impl<'a> PendingDelete<'a> {
    fn new(
        backend: &'a EtcdBackend,
        key: String,
        guard: Vec<Compare>,
        session: Arc<Session>,
        claim: Option<Claim>,
    ) -> Self {
        PendingDelete {
            backend,
            key,
            guard,
            session,
            claim,
            unfinished: true,
        }
    }

    async fn run(mut self, what: &str) -> Result<TxnResponse> {
        let txn = Txn::new()
            .when(self.guard.clone())
            .and_then([TxnOp::delete(self.key.clone(), None)]);
        let answer = self.backend.call(what, txn_of(&txn)).await;
        if answer.is_ok() {
            self.unfinished = false;
            if let Some(claim) = self.claim.take() {
                self.backend.inner.names.free(&claim);
            }
        }
        answer
    }
}

impl Drop for PendingDelete<'_> {
    fn drop(&mut self) {
        if self.unfinished {
            self.backend.delete_later(
                std::mem::take(&mut self.key),
                std::mem::take(&mut self.guard),
                self.session.clone(),
                vec![Duration::ZERO],
                self.claim.take(),
            );
        }
    }
}

/// A request that runs `txn`.
fn txn_of(
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

/// The compares that hold while `lease` holds the lock at `key`.
fn held_by(key: &str, lease: &Lease) -> Vec<Compare> {
    let token = i64::try_from(lease.fencing_token().get()).unwrap_or(-1);
    vec![
        Compare::create_revision(key, CompareOp::Equal, token),
        Compare::value(key, CompareOp::Equal, lease.owner().digest_hex()),
    ]
}

/// A range read of the lock's keys in create order, `limit` of them.
fn by_create(order: SortOrder, limit: i64) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, order)
        .with_limit(limit)
}

/// The key created last before `own_revision`.
fn predecessor_of(own_revision: i64) -> GetOptions {
    by_create(SortOrder::Descend, 1).with_max_create_revision(own_revision - 1)
}

fn key_of(kv: &KeyValue) -> String {
    String::from_utf8_lossy(kv.key()).into_owned()
}

fn token_of(revision: i64) -> FencingToken {
    FencingToken(u64::try_from(revision).unwrap_or(0))
}

fn connect_options(config: &EtcdConfig) -> Result<ConnectOptions> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(config.connect_timeout)
        .with_timeout(config.request_timeout)
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

/// Keeps `session`'s lease alive at a third of its TTL until the backend is dropped; ends the
/// session when the lease cannot be renewed before it runs out or the server says it is gone.
async fn keep_alive(
    session: Arc<Session>,
    mut client: Client,
    request_timeout: Duration,
    shutdown: CancellationToken,
) {
    let interval = session.ttl / 3;
    let mut stream = None;
    let mut next = Instant::now() + interval;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = session.lost.cancelled() => return,
            () = tokio::time::sleep_until(next.min(session.expires_at()).into()) => {}
        }
        if Instant::now() >= session.expires_at() {
            session.lose("keep-alive could not renew the session lease before its TTL ran out");
            let _ =
                tokio::time::timeout(request_timeout, client.lease_revoke(session.lease_id)).await;
            return;
        }
        let sent_at = Instant::now();
        let deadline = (sent_at + request_timeout).min(session.expires_at());
        let round = tokio::time::timeout_at(
            deadline.into(),
            renew_once(&mut client, session.lease_id, &mut stream),
        );
        let outcome = tokio::select! {
            () = shutdown.cancelled() => return,
            outcome = round => outcome,
        };
        match outcome {
            Ok(Ok(ttl)) if ttl > 0 => {
                session.confirm(sent_at, Duration::from_secs(ttl.unsigned_abs()));
                next = sent_at + interval;
            }
            Ok(Ok(_)) => {
                session.lose("the server says the session lease is gone");
                return;
            }
            Ok(Err(e)) if error::is_lease_gone(&e) => {
                session.lose("the server says the session lease is gone");
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "etcd keep-alive failed; reopening the stream");
                stream = None;
                next = Instant::now() + RETRY_PAUSE.min(interval);
            }
            Err(_) => {
                tracing::debug!("etcd keep-alive timed out; reopening the stream");
                stream = None;
                next = Instant::now();
            }
        }
    }
}

/// One keep-alive round on the stream (opening it first if needed); the TTL the server
/// answered, 0 when the lease is gone.
async fn renew_once(
    client: &mut Client,
    lease_id: i64,
    stream: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
) -> Result<i64, etcd_client::Error> {
    let (keeper, responses) = match stream {
        Some(open) => open,
        None => stream.insert(client.lease_keep_alive(lease_id).await?),
    };
    keeper.keep_alive().await?;
    match responses.message().await? {
        Some(response) => Ok(response.ttl()),
        None => Err(etcd_client::Error::LeaseKeepAliveError(
            "the keep-alive stream ended".into(),
        )),
    }
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
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let started = Instant::now();
        let session = self.session_for(request.ttl).await?;
        let prefix = self.lock_prefix(&request.key);
        let (own, own_revision) = self.entry_for(request, &session, &prefix);
        let owner_digest = request.owner.digest_hex();
        let put = TxnOp::put(
            own.clone(),
            owner_digest.clone(),
            Some(PutOptions::new().with_lease(session.lease_id)),
        );
        // Right after the put the own key is the newest: it holds the lock when no key was
        // created before it, and otherwise the one just before it is the predecessor.
        let newest_two = TxnOp::get(prefix.clone(), Some(by_create(SortOrder::Descend, 2)));
        let mut otherwise = vec![
            TxnOp::get(own.clone(), None),
            TxnOp::get(prefix.clone(), Some(by_create(SortOrder::Ascend, 1))),
        ];
        if let Some(revision) = own_revision.filter(|_| request.wait) {
            otherwise.push(TxnOp::get(prefix.clone(), Some(predecessor_of(revision))));
        }
        let put_if = if request.wait {
            Compare::create_revision(own.clone(), CompareOp::Equal, 0)
        } else {
            // try_lock queues only on a free lock, so contention leaves nothing behind.
            Compare::create_revision(prefix.clone(), CompareOp::Equal, 0).with_prefix()
        };
        // After a wait the own key is normally still there, and then only reads decide: a
        // read-only txn of the same reads answers at one revision, linearizably, without the
        // raft write (a disk sync on a majority) that a txn holding a put costs even when the
        // put is not taken. Without the own key, the full txn queues it again.
        let mut read_only = own_revision.is_some() && request.wait;
        let full = Txn::new()
            .when([put_if])
            .and_then([put, newest_two])
            .or_else(otherwise.clone());
        let response = loop {
            let txn = if read_only {
                Txn::new().and_then(otherwise.clone())
            } else {
                full.clone()
            };
            let response = match self.send(txn_of(&txn)).await {
                Some(Ok(response)) => response,
                Some(Err(e)) if error::is_lease_gone(&e) => {
                    session.lose("the server says the session lease is gone");
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        NAME,
                        "the session lease expired; the next attempt starts a new session",
                    )
                    .with_source(e));
                }
                Some(Err(e)) => return Err(error::map("acquiring", e)),
                None => {
                    return Err(error::timed_out(
                        "acquiring",
                        self.inner.config.request_timeout,
                    ));
                }
            };
            let own_missing = || match response.op_responses().into_iter().next() {
                Some(TxnOpResponse::Get(get)) => get.kvs().is_empty(),
                _ => true,
            };
            if read_only && own_missing() {
                read_only = false;
                continue;
            }
            break response;
        };
        let put_taken = !read_only && response.succeeded();
        let revision = response.header().map_or(0, |h| h.revision());
        let mut reads = response.op_responses().into_iter().map(|op| match op {
            TxnOpResponse::Get(mut get) => get.take_kvs(),
            _ => Vec::new(),
        });
        let (own_revision, ours, predecessor) = if put_taken {
            let _put = reads.next();
            let mut newest = reads.next().unwrap_or_default().into_iter();
            let newest_is_own = newest.next().is_some_and(|kv| kv.key() == own.as_bytes());
            let predecessor = newest.next().map(|kv| (key_of(&kv), kv.create_revision()));
            (
                Some(revision),
                newest_is_own && predecessor.is_none(),
                predecessor,
            )
        } else {
            let own_kv = reads.next().and_then(|kvs| kvs.into_iter().next());
            if let Some(stale) = own_kv
                .as_ref()
                .filter(|kv| kv.value() != owner_digest.as_bytes())
            {
                return Err(self.move_off_stale_key(request, &session, &prefix, stale.value()));
            }
            let holder = reads.next().and_then(|kvs| kvs.into_iter().next());
            let predecessor = reads
                .next()
                .and_then(|kvs| kvs.into_iter().next())
                .map(|kv| (key_of(&kv), kv.create_revision()));
            let ours = holder.is_some_and(|kv| kv.key() == own.as_bytes());
            (own_kv.map(|kv| kv.create_revision()), ours, predecessor)
        };
        if let Some(entry) = self.entries().get_mut(&request.owner) {
            entry.in_flight = false;
            entry.maybe_on_server = own_revision.is_some();
            entry.create_revision = own_revision;
            entry.predecessor = predecessor.clone();
        }
        match own_revision {
            Some(own_revision) if ours => {
                // Re-verified: the own key was the lowest at one revision, on this session's
                // lease, and the session is still alive.
                if session.lost.is_cancelled() {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        NAME,
                        "the session was lost while acquiring; the next attempt starts a new one",
                    ));
                }
                Ok(Attempt::Granted(
                    Grant::new(token_of(own_revision), session.valid_from(started))
                        .with_handle(own)
                        .with_session(session.lost.clone()),
                ))
            }
            _ => {
                let mut contention = Contention::new();
                contention.revision = Some(revision);
                if let Some((predecessor, _)) = predecessor {
                    contention = contention.with_predecessor(predecessor, Some(revision));
                }
                Ok(Attempt::Contended(contention))
            }
        }
    }

    /// Ends early, too, when the session of the request's key is lost: the key went with
    /// the lease, so the wait is for nothing, and the next attempt queues on a new session.
    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<()> {
        let session = self
            .entries()
            .get(&request.owner)
            .map(|entry| entry.session.lost.clone());
        let Some(lost) = session else {
            return self
                .wait_on_predecessor(request, contention, max_wait)
                .await;
        };
        tokio::select! {
            waited = self.wait_on_predecessor(request, contention, max_wait) => waited,
            () = lost.cancelled() => Ok(()),
        }
    }

    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        let Some(entry) = self.entries().remove(&request.owner) else {
            return Ok(());
        };
        if !entry.maybe_on_server {
            self.inner.names.free(&entry.claim);
            return Ok(());
        }
        let key = entry.claim.key.clone();
        let guard = vec![Compare::value(
            key.clone(),
            CompareOp::Equal,
            request.owner.digest_hex(),
        )];
        let mut claim = Some(entry.claim);
        if entry.in_flight {
            // The cancelled attempt may still be applied after the delete below (it may even
            // go to another member): delete again soon, and once more when it must have been
            // applied or dropped, and only then reuse the name.
            let pauses = vec![
                Duration::from_millis(50),
                Duration::from_millis(450),
                self.inner.config.request_timeout * 2,
            ];
            self.delete_later(
                key.clone(),
                guard.clone(),
                entry.session.clone(),
                pauses,
                claim.take(),
            );
        }
        PendingDelete::new(self, key, guard, entry.session, claim)
            .run("abandoning an acquisition")
            .await
            .map(|_| ())
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        self.renew_many(std::slice::from_ref(lease))
            .await
            .pop()
            .unwrap_or(Ok(Renewal::Lost))
    }

    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        let sent_at = Instant::now();
        let checks: Vec<Option<(String, Arc<Session>)>> =
            leases.iter().map(|lease| self.local_check(lease)).collect();
        let mut answers: Vec<Result<Renewal>> = Vec::with_capacity(leases.len());
        for (leases, checks) in leases.chunks(MAX_TXN_OPS).zip(checks.chunks(MAX_TXN_OPS)) {
            let reads: Vec<TxnOp> = checks
                .iter()
                .flatten()
                .map(|(key, _)| TxnOp::get(key.clone(), None))
                .collect();
            let found = if reads.is_empty() {
                Ok(Vec::new())
            } else {
                self.call("checking held locks", txn_of(&Txn::new().and_then(reads)))
                    .await
                    .map(|response| {
                        response
                            .op_responses()
                            .into_iter()
                            .map(|op| match op {
                                TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
                                _ => None,
                            })
                            .collect::<Vec<_>>()
                    })
            };
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
                        && kv.value() == lease.owner().digest_hex().as_bytes()
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
        let Some(key) = lease.handle() else {
            return Ok(false);
        };
        let entry = {
            let mut entries = self.entries();
            match entries.get(lease.owner()) {
                Some(entry) if entry.claim.key == key => entries.remove(lease.owner()),
                _ => None,
            }
        };
        let guard = held_by(key, lease);
        let released = match entry {
            Some(entry) => {
                PendingDelete::new(
                    self,
                    entry.claim.key.clone(),
                    guard,
                    entry.session,
                    Some(entry.claim),
                )
                .run("releasing")
                .await
            }
            // Not an acquisition of this backend: nothing to finish in the background.
            None => {
                let txn = Txn::new().when(guard).and_then([TxnOp::delete(key, None)]);
                self.call("releasing", txn_of(&txn)).await
            }
        };
        released.map(|response| response.succeeded())
    }

    /// One read of the own key: once a key is the lowest of its lock it stays the lowest for
    /// as long as it exists, so its existence with the lease's revision and owner is the answer.
    async fn is_held(&self, lease: &Lease) -> Result<bool> {
        let Some(key) = lease.handle() else {
            return Ok(false);
        };
        let response = self
            .call("checking the lock", |mut client| {
                let key = key.to_owned();
                async move { client.get(key, None).await }
            })
            .await?;
        let token = i64::try_from(lease.fencing_token().get()).unwrap_or(-1);
        Ok(response.kvs().first().is_some_and(|kv| {
            kv.create_revision() == token && kv.value() == lease.owner().digest_hex().as_bytes()
        }))
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let prefix = self.lock_prefix(key);
        let response = self
            .call("inspecting", |mut client| {
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
                .call("reading the holder's lease", |mut client| async move {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_name_is_reused_only_after_it_is_freed_and_stale_frees_do_nothing() {
        let names = KeyNames::default();
        let first = names.claim("p/ns/k/", 0xab);
        assert_eq!(first.key, "p/ns/k/00000000000000ab-0");
        let second = names.claim("p/ns/k/", 0xab);
        assert_eq!(second.key, "p/ns/k/00000000000000ab-1");
        names.free(&first);
        let again = names.claim("p/ns/k/", 0xab);
        assert_eq!(again.key, first.key, "a freed name is reused");
        names.free(&first);
        let third = names.claim("p/ns/k/", 0xab);
        assert_eq!(
            third.key, "p/ns/k/00000000000000ab-2",
            "a stale claim freed a name in use"
        );
    }
}
