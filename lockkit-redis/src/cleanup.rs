//! The end of a grant on one Redis server or a Sentinel primary: its release, the clean-up of
//! an acquisition given up, and an operator's break.
//!
//! Every kind of grant (a mutex, a permit, a read or the write lock) is released by its own
//! script, which also drops the owner's waiting entry of a wait it gives up and publishes what
//! waiters need to hear, through one path, [`RedisBackend::release_on`]: it runs the script on
//! the connection its caller picks and reads its answer (1: the grant was the caller's) as a
//! [`Released`]. A release sent again after its connection dropped cannot tell a grant it
//! released at its first send from one that was gone before, and says so
//! ([`Released::GoneWhenSentAgain`]).

use std::sync::atomic::{AtomicUsize, Ordering};

use lockkit_core::backend::{AcquireRequest, Hold, OwnerToken};
use lockkit_core::{Error, ErrorKind, LockKey, Result};
use redis::Value;

use crate::backend::RedisBackend;
use crate::connection::Epoch;
use crate::error::{BACKEND, unexpected};
use crate::scripts::{Keys, millis};
use crate::semaphore;

/// What a release script found, from [`RedisBackend::release_on`].
enum Released {
    /// The lock was the caller's, and is released.
    Ours,
    /// The lock was not the caller's.
    NotOurs,
    /// Not the caller's at a second send after the connection dropped: the first send may
    /// have released it.
    GoneWhenSentAgain,
}

impl RedisBackend {
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
    fn verdict(released: Released) -> Result<bool> {
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
    async fn release_on(
        &self,
        key: &LockKey,
        hold: Hold,
        owner: &OwnerToken,
        pick: fn(&Epoch) -> redis::aio::ConnectionManager,
    ) -> Result<Released> {
        let publishing = self.publishing();
        let (invocation, what) = match hold {
            Hold::Permit { .. } => (
                semaphore::release_invocation(publishing, key, owner, self.config.fence_ttl),
                "giving a permit back",
            ),
            Hold::Read | Hold::Write => (
                crate::rwlock::release_invocation(publishing, key, owner, self.config.fence_ttl),
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

    /// Cleans up after an acquisition given up: its waiter forgotten, and its grant or
    /// waiting entry, if any, released.
    pub(crate) async fn clean_up(&self, request: &AcquireRequest) -> Result<()> {
        let notifier = &self.primary.epoch().notifier;
        if crate::acquire::queues(request) {
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
}
