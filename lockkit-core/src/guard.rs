//! The guard of a held lock and its lost signal.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::error::{Error, ErrorKind, Result};
use crate::held::{self, Applied, HeldLease};
use crate::key::LockKey;
use crate::lease::Lease;
use crate::metrics;
use crate::token::FencingToken;

/// Fires when a held lock is lost: it expired, renewal failed past the validity deadline, the
/// backend reported it gone, or the session carrying it ended. Cheap to clone; every clone
/// fires together. It does not fire on a normal release.
///
/// Read-only: holders of the signal can watch it, never fire it (firing it would stop the
/// lock's renewal). For `tokio::select!` or a task, use [`MutexGuard::lost`], an owned future.
#[derive(Clone)]
pub struct LostSignal(CancellationToken);

impl LostSignal {
    /// Waits until the lock is lost (forever if it never is).
    pub async fn fired(&self) {
        self.0.cancelled().await;
    }

    /// Whether the lock has been lost.
    pub fn is_fired(&self) -> bool {
        self.0.is_cancelled()
    }
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostSignal")
            .field("fired", &self.is_fired())
            .finish()
    }
}

/// A held lock. Renewed in the background while it lives; released when dropped.
///
/// Prefer [`release`](MutexGuard::release), which says whether the lock was still ours. When a
/// guard is dropped instead, the release runs in the background on lockkit's runtime, so it
/// happens even when no runtime is current. A process that exits right after the drop may not
/// get it to the server (the lock then stays taken until its TTL runs out) unless it awaits
/// [`LockClient::close`](crate::LockClient::close) first.
///
/// Pass [`fencing_token`](MutexGuard::fencing_token) with every write to the protected
/// resource, and watch [`lost`](MutexGuard::lost): once it fires, stop touching the resource.
#[must_use = "a lock is released as soon as its guard is dropped"]
pub struct MutexGuard {
    held: Option<Arc<HeldLease>>,
    /// The validity left when the core handed this guard out.
    granted_with: Duration,
}

impl MutexGuard {
    pub(crate) fn new(held: Arc<HeldLease>, granted_with: Duration) -> Self {
        MutexGuard {
            held: Some(held),
            granted_with,
        }
    }

    fn held(&self) -> &Arc<HeldLease> {
        match &self.held {
            Some(held) => held,
            None => unreachable!("a guard is only emptied by release or drop, which consume it"),
        }
    }

    pub(crate) fn downgrade(&self) -> std::sync::Weak<HeldLease> {
        Arc::downgrade(self.held())
    }

    /// The lock's key.
    pub fn key(&self) -> &LockKey {
        self.held().lease.key()
    }

    /// The fencing token of this grant.
    pub fn fencing_token(&self) -> FencingToken {
        self.held().lease.fencing_token()
    }

    /// The TTL the lock was taken with: how long a crash of this process keeps it blocked.
    /// It can be above the requested TTL where the backend has a minimum (ZooKeeper's session
    /// timeout, see [`Capabilities::min_ttl`](crate::Capabilities::min_ttl)).
    pub fn ttl(&self) -> Duration {
        self.held().lease.ttl()
    }

    /// The grant with its secret owner token: only for backends, through
    /// [`backend::lease_of`](crate::backend::lease_of).
    pub(crate) fn lease(&self) -> &Lease {
        &self.held().lease
    }

    pub(crate) fn backend(&self) -> &crate::backend::SharedBackend {
        &self.held().backend
    }

    pub(crate) fn mark_lost(&self, why: &str) {
        self.held().mark_lost(why);
    }

    /// Until when the lock is known to be ours, by the local clock. Renewals move it forward.
    pub fn valid_until(&self) -> Instant {
        self.held().valid_until()
    }

    /// How much of the validity is left now (zero once it has passed).
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// How much validity this guard was handed out with, by the local clock: never less than
    /// the backend's validity floor (a tenth of the validity it can promise the TTL). Unlike
    /// [`remaining`](MutexGuard::remaining) it does not depend on when it is read, so a
    /// process descheduled or paused right after the hand-over still learns what it was given.
    pub fn granted_validity(&self) -> Duration {
        self.granted_with
    }

    /// A signal that fires when the lock is lost.
    pub fn lost_signal(&self) -> LostSignal {
        LostSignal(self.held().lost.clone())
    }

    /// Waits until the lock is lost. The future owns what it needs, so it can be moved into a
    /// task or a `select!`.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.held().lost.clone().cancelled_owned()
    }

    /// Whether the lock is known to be lost, or its validity deadline has passed (no server
    /// round trip).
    pub fn is_lost(&self) -> bool {
        self.held().is_lost()
    }

    /// Asks the backend whether this grant still holds the lock.
    ///
    /// # Errors
    /// Backend failures; the answer is then unknown.
    pub async fn is_held(&self) -> Result<bool> {
        let held = self.held();
        held.backend.is_held(&held.lease).await
    }

    /// Renews the lease now, instead of waiting for the background renewal. Bounded by the
    /// lease's validity deadline.
    ///
    /// # Errors
    /// [`ErrorKind::Lost`](crate::ErrorKind::Lost) if the lease is no longer ours (the lost
    /// signal fires too), or its deadline passed before the renewal answered; backend
    /// failures otherwise (the lease keeps its previous deadline).
    pub async fn extend(&self) -> Result<()> {
        let held = self.held();
        let lost = || {
            Error::new(
                ErrorKind::Lost,
                held.backend.name(),
                format!("lock {} is no longer held", held.lease.key()),
            )
        };
        if held.is_lost() {
            return Err(lost());
        }
        match held::renew_now(held, None).await? {
            Applied::Extended => Ok(()),
            Applied::Lost => Err(lost()),
            Applied::Unchanged => Err(Error::new(
                ErrorKind::Unavailable,
                held.backend.name(),
                "the renewal answered with no validity left; the lease keeps its previous deadline",
            )),
        }
    }

    /// Whether the lease has its floor of validity left, after a renewal sent now (bounded by
    /// `bound`) if not: for guards handed out again (each part of a `lock_all`, a leadership
    /// after its proclamation).
    pub(crate) async fn vouch(&self, bound: Option<Instant>) -> bool {
        crate::acquire::vouch(self.held(), bound).await
    }

    /// Releases the lock and says whether it was still ours when the backend got the request
    /// (`false` means it had expired or been taken: the critical section was not protected to
    /// its end).
    ///
    /// With reentrant acquisitions, only the last guard releases on the server; the others
    /// return `Ok(true)` as long as the lock is still held.
    ///
    /// # Errors
    /// Backend failures; the lock then expires with its TTL.
    ///
    /// # Cancel safety
    /// The release runs in the caller's task, on the connections the caller's runtime drives
    /// (no hop to another thread on the hand-over path of a contended lock). If this future
    /// is dropped before the backend answered (a timeout around it or around
    /// [`Mutex::with_lock`](crate::Mutex::with_lock)), the release is sent again in the
    /// background on lockkit's runtime, as when the guard is dropped: a release is
    /// compare-and-delete by owner, so a second one finds nothing of a first that landed.
    pub async fn release(mut self) -> Result<bool> {
        let Some(held) = self.held.take() else {
            return Ok(false);
        };
        if !held.drop_holder() {
            return Ok(!held.is_lost());
        }
        let mut unfinished = UnfinishedRelease(Some(held));
        let Some(held) = &unfinished.0 else {
            return Ok(false);
        };
        let answer = release_now(held).await;
        unfinished.0 = None;
        answer
    }
}

/// A release in the caller's task: dropped before its answer, it is finished in the
/// background.
struct UnfinishedRelease(Option<Arc<HeldLease>>);

impl Drop for UnfinishedRelease {
    fn drop(&mut self) {
        if let Some(held) = self.0.take() {
            release_in_background(held, "release failed after its caller stopped waiting");
        }
    }
}

/// Releases `held` on lockkit's runtime, counted by its client's background work; a failure
/// is logged with `context` (the lock then expires with its TTL).
fn release_in_background(held: Arc<HeldLease>, context: &'static str) {
    let background = held.background.clone();
    background.spawn(async move {
        if let Err(e) = release_now(&held).await {
            tracing::warn!(key = %held.lease.key(), error = %e.display_chain(), "{context}; the lock expires with its TTL");
        }
    });
}

async fn release_now(held: &HeldLease) -> Result<bool> {
    let span = tracing::debug_span!("lockkit.release", key = %held.lease.key(), backend = held.backend.name());
    let sent_at = Instant::now();
    let answer = held.backend.release(&held.lease).instrument(span).await;
    metrics::released(held.backend.as_ref(), sent_at.elapsed());
    let was_ours = answer?;
    if !was_ours {
        held.mark_lost("released after the lock had been lost");
    }
    Ok(was_ours)
}

impl Drop for MutexGuard {
    fn drop(&mut self) {
        if let Some(held) = self.held.take()
            && held.drop_holder()
        {
            release_in_background(held, "background release failed");
        }
    }
}

impl fmt::Debug for MutexGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.held {
            Some(held) => f
                .debug_struct("MutexGuard")
                .field("key", held.lease.key())
                .field("fencing_token", &held.lease.fencing_token())
                .field("lost", &held.lost.is_cancelled())
                .finish(),
            None => f.write_str("MutexGuard(released)"),
        }
    }
}
