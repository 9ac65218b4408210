//! The etcd backend's sessions: one lease per distinct TTL, kept alive in the background,
//! and the token every grant on it carries, cancelled when the lease is lost.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::{Duration, Instant};

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use lockkit_core::Result;
use lockkit_core::backend::cleanup::Ledger;
use lockkit_core::backend::{Backoff, CancellationToken, runtime};
use tokio::sync::Mutex as AsyncMutex;

use crate::backend::{EtcdBackend, MIN_TTL_SECS};
use crate::error;
use crate::naming::SESSIONS;

/// The pause before retrying a failed keep-alive.
const KEEP_ALIVE_RETRY: Duration = Duration::from_millis(200);
/// The first pause before revoking a lost session's lease again after a failure (the
/// pauses grow, with jitter, up to [`REVOKE_PAUSE_MAX`]).
const REVOKE_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between two revokes of a lost session's lease.
const REVOKE_PAUSE_MAX: Duration = Duration::from_millis(250);
/// How long one send of a lost session's revoke may go unanswered before it is sent again.
const REVOKE_ATTEMPT: Duration = Duration::from_secs(1);

/// One session lease and what is known about its expiry.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) lease_id: i64,
    pub(crate) ttl: Duration,
    /// Cancelled when the lease is lost; every grant on the session carries it.
    pub(crate) lost: CancellationToken,
    /// The send time of the last confirmed keep-alive (or of the grant) plus the TTL: the
    /// server cannot expire the lease before then.
    pub(crate) expires_at: StdMutex<Instant>,
    /// The attempts sent on the session: one left unanswered may still put its key, at any
    /// later time, on this lease, until the session's clean-up settles it (see
    /// [`settle_orphans`](crate::cleanup::settle_orphans)).
    pub(crate) ledger: Arc<Ledger>,
    /// The session's epoch key, on its lease: every put of an attempt compares its mod
    /// revision with [`Session::epoch`], and the clean-up writes it, so a put sent before that
    /// write can no longer land (`<prefix>/../sessions/<lease-hex>`: under the prefix, never
    /// in a namespace).
    pub(crate) epoch_key: String,
    /// The epoch key's mod revision as last seen (0: not written yet).
    epoch: AtomicI64,
}

impl Session {
    pub(crate) fn expires_at(&self) -> Instant {
        *self
            .expires_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn confirm(&self, sent_at: Instant, ttl: Duration) {
        let mut expires_at = self
            .expires_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *expires_at = (*expires_at).max(sent_at + ttl);
    }

    pub(crate) fn is_alive(&self) -> bool {
        !self.lost.is_cancelled() && Instant::now() < self.expires_at()
    }

    /// The epoch the next put compares with.
    pub(crate) fn epoch(&self) -> i64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// The epoch key was seen with `mod_revision` (epochs only go up).
    pub(crate) fn saw_epoch(&self, mod_revision: i64) {
        self.epoch.fetch_max(mod_revision, Ordering::SeqCst);
    }

    /// How long the lease is known to live, counted from `sent_at`.
    pub(crate) fn valid_from(&self, sent_at: Instant) -> Duration {
        self.expires_at().saturating_duration_since(sent_at)
    }

    pub(crate) fn lose(&self, why: &str) {
        if !self.lost.is_cancelled() {
            tracing::warn!(lease = %format_args!("{:016x}", self.lease_id), why, "etcd session lost; its locks are lost");
            self.lost.cancel();
        }
    }
}

/// Keeps `session`'s lease alive at a third of its TTL until the backend is dropped; ends the
/// session when the lease cannot be renewed before it runs out or the server says it is gone.
pub(crate) async fn keep_alive(
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
            revoke_lost(
                &mut client,
                session.lease_id,
                request_timeout.saturating_add(session.ttl),
            )
            .await;
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
                next = Instant::now() + KEEP_ALIVE_RETRY.min(interval);
            }
            Err(_) => {
                tracing::debug!("etcd keep-alive timed out; reopening the stream");
                stream = None;
                next = Instant::now();
            }
        }
    }
}

/// Revokes the lease of a session lost because its keep-alives went unanswered, so that its
/// keys leave the lock queues now rather than a TTL after the cluster answers again (the
/// server may still hold the lease: a new leader, or a restarted member, restarts every
/// lease's TTL). Sent again after a failure a retry can cure, for up to `within` (the caller
/// gives a request timeout plus the TTL): a session is lost this way when a member or the
/// leader is down, and the balancer's first pick may be the member that is down, or one
/// still without a leader. W5 on etcd (the leader killed under contention, `examples/compare`):
/// with a single try, the lost sessions' keys stayed for their TTL, and grants stopped for
/// 4.2-5.3 s in most runs of a probe of it; with the retries, 1.5-2.6 s in five runs.
async fn revoke_lost(client: &mut Client, lease_id: i64, within: Duration) {
    let revoking = async {
        let mut pause = Backoff::new(REVOKE_PAUSE, REVOKE_PAUSE_MAX);
        loop {
            // A member that took the request as its leader died may hold it unanswered:
            // each send gets a second, then the request goes again (a lease revoked twice
            // is simply gone).
            match tokio::time::timeout(REVOKE_ATTEMPT, client.lease_revoke(lease_id)).await {
                Err(_) => {}
                Ok(Err(e))
                    if !error::is_lease_gone(&e)
                        && error::kind(&e) == lockkit_core::ErrorKind::Unavailable =>
                {
                    tokio::time::sleep(pause.next_delay()).await;
                }
                Ok(_) => return,
            }
        }
    };
    // `timeout`, not `Instant + within`: a configured timeout too large for an instant
    // means no bound here, not a panic.
    let _ = tokio::time::timeout(within, revoking).await;
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

/// The backend's sessions, one per TTL in whole seconds. The table is locked only to look a
/// TTL's slot up; a slot is locked across the grant of its session, so a grant that hangs (a
/// partitioned member, up to the request timeout) holds up only the acquisitions of its TTL.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    slots: StdMutex<HashMap<i64, Slot>>,
}

/// One TTL's session, if it has one.
type Slot = Arc<AsyncMutex<Option<Arc<Session>>>>;

impl Sessions {
    fn slot(&self, secs: i64) -> Slot {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(secs)
            .or_default()
            .clone()
    }

    /// The live session of `secs`, started by `start` if there is none.
    pub(crate) async fn get_or_start<F, Fut>(&self, secs: i64, start: F) -> Result<Arc<Session>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Arc<Session>>>,
    {
        let slot = self.slot(secs);
        let mut current = slot.lock().await;
        if let Some(session) = current.as_ref()
            && session.is_alive()
        {
            return Ok(session.clone());
        }
        let session = start().await?;
        *current = Some(session.clone());
        Ok(session)
    }

    /// Takes every session out, waiting for a grant in flight (bounded by its request
    /// timeout), so that none is left out.
    pub(crate) async fn drain(&self) -> Vec<Arc<Session>> {
        let slots: Vec<Slot> = self
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, slot)| slot)
            .collect();
        let mut sessions = Vec::with_capacity(slots.len());
        for slot in slots {
            sessions.extend(slot.lock().await.take());
        }
        sessions
    }
}

impl EtcdBackend {
    /// The live session for `ttl`, starting one if there is none.
    pub(crate) async fn session_for(&self, ttl: Duration) -> Result<Arc<Session>> {
        let whole_secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let secs = i64::try_from(whole_secs)
            .unwrap_or(i64::MAX)
            .max(MIN_TTL_SECS);
        self.inner
            .sessions
            .get_or_start(secs, || self.start_session(secs))
            .await
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
            ledger: Arc::new(Ledger::new()),
            epoch_key: format!(
                "{}/{SESSIONS}/{:016x}",
                self.inner.config.prefix,
                granted.id()
            ),
            epoch: AtomicI64::new(0),
        });
        runtime::spawn(keep_alive(
            session.clone(),
            self.client(),
            self.inner.config.request_timeout,
            self.inner.shutdown.clone(),
        ));
        crate::cleanup::settle_orphans(
            session.clone(),
            self.client(),
            self.inner.names.clone(),
            self.inner.shutdown.clone(),
            self.inner.config.request_timeout,
        );
        tracing::debug!(lease = %format_args!("{:016x}", session.lease_id), ?ttl, "etcd session started");
        Ok(session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(lease_id: i64) -> Arc<Session> {
        Arc::new(Session {
            lease_id,
            ttl: Duration::from_secs(5),
            lost: CancellationToken::new(),
            expires_at: StdMutex::new(Instant::now() + Duration::from_secs(5)),
            ledger: Arc::new(Ledger::new()),
            epoch_key: format!("p/../sessions/{lease_id:016x}"),
            epoch: AtomicI64::new(0),
        })
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_grant_that_hangs_holds_up_only_its_own_ttl() {
        let sessions = Arc::new(Sessions::default());
        let hanging = {
            let sessions = sessions.clone();
            tokio::spawn(async move {
                sessions
                    .get_or_start(7, std::future::pending::<Result<Arc<Session>>>)
                    .await
            })
        };
        tokio::task::yield_now().await;
        let other = tokio::time::timeout(
            Duration::from_millis(500),
            sessions.get_or_start(5, || async { Ok(session(5)) }),
        )
        .await
        .expect("a session of another TTL waited for the hanging grant")
        .expect("granted");
        assert_eq!(other.lease_id, 5);
        let again = sessions
            .get_or_start(5, || async { Ok(session(6)) })
            .await
            .expect("the live session");
        assert_eq!(again.lease_id, 5, "a live session is kept");
        hanging.abort();
    }
}
