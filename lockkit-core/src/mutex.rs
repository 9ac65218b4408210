//! The mutex: a lock of one key, with reentrancy for an explicit owner. Waiting, backoff and
//! cancel safety are the acquisition engine's ([`acquire`](crate::acquire)).

use std::fmt;
use std::time::Duration;

use crate::acquire::{Wait, acquire, issue, timeout_error};
use crate::backend::Hold;
use crate::client::LockClient;
use crate::error::{Error, Result};
use crate::guard::MutexGuard;
use crate::key::LockKey;
use crate::options::LockOptions;
use crate::owner::LockOwner;

/// A distributed mutex on one key. Cheap to create; holds no server state until locked.
///
/// Without an owner ([`Mutex::reentrant`]) every acquisition is independent: two tasks of the
/// same process exclude each other exactly as two processes do.
///
/// Its options are checked when it is built ([`LockClient::mutex`](crate::LockClient::mutex),
/// [`Mutex::with_ttl`], [`Mutex::with_options`]), so `lock()` never fails on them.
///
/// # Cancel safety
/// `lock`, `lock_timeout` and `try_lock` are cancel-safe: dropping their future (a
/// `select!`, a timeout) removes whatever the attempt left on the server, in the background,
/// including a grant whose reply had not arrived yet.
#[derive(Clone)]
pub struct Mutex {
    client: LockClient,
    key: LockKey,
    owner: Option<LockOwner>,
    options: LockOptions,
}

impl Mutex {
    pub(crate) fn new(client: LockClient, key: LockKey) -> Self {
        let options = client.options().clone();
        Mutex {
            client,
            key,
            owner: None,
            options,
        }
    }

    /// The key this mutex locks.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    pub(crate) fn client(&self) -> &LockClient {
        &self.client
    }

    /// Takes this mutex's locks for `owner`, reentrantly: while a guard taken for `owner`
    /// holds the lock (through this client or its clones), another acquisition for the same
    /// owner succeeds at once with the same grant (same fencing token), and the lock is
    /// released on the server when the last of those guards is released.
    ///
    /// Only code handed `owner` can re-enter: a [`LockOwner`] cannot be made from a name, so
    /// unrelated tasks never share one by accident. Acquisitions for one owner are serialised
    /// locally (a second one waits while the first is in flight), and reentrancy is local to
    /// the client: another process is always a different contender.
    #[must_use]
    pub fn reentrant(mut self, owner: &LockOwner) -> Self {
        self.owner = Some(owner.clone());
        self
    }

    /// Takes the lock, waiting for as long as the options' `wait_timeout` allows (forever by
    /// default).
    ///
    /// # Errors
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) when `wait_timeout` passes; backend errors that are not
    /// retryable, or retryable ones that keep coming for longer than the options'
    /// `error_budget`.
    pub async fn lock(&self) -> Result<MutexGuard> {
        self.acquire_guard(Wait::per(&self.options)).await
    }

    /// Takes the lock, waiting at most `timeout` (a timeout too large to be a deadline, such
    /// as `Duration::MAX`, waits for as long as it takes).
    ///
    /// # Errors
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) when `timeout` passes; backend errors as for [`Mutex::lock`].
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        self.acquire_guard(Wait::at_most(timeout)).await
    }

    /// Takes the lock if it is free, without waiting. Contention is `Ok(None)`, not an error.
    ///
    /// # Errors
    /// Backend errors.
    pub async fn try_lock(&self) -> Result<Option<MutexGuard>> {
        self.acquire(Wait::No).await
    }

    async fn acquire_guard(&self, wait: Wait) -> Result<MutexGuard> {
        match self.acquire(wait).await? {
            Some(guard) => Ok(guard),
            None => Err(self.timeout_error()),
        }
    }

    fn timeout_error(&self) -> Error {
        timeout_error(&self.client, &self.key)
    }

    async fn acquire(&self, wait: Wait) -> Result<Option<MutexGuard>> {
        let Some(owner) = &self.owner else {
            return self.acquire_fresh(wait).await;
        };
        let slot = self.client.reentrant_slot(&self.key, owner);
        let mut current = match wait {
            Wait::No => match slot.try_lock() {
                Ok(current) => current,
                Err(_) => return Ok(None),
            },
            Wait::Until(None) => slot.lock().await,
            Wait::Until(Some(deadline)) => tokio::time::timeout_at(deadline.into(), slot.lock())
                .await
                .map_err(|_| self.timeout_error())?,
        };
        if let Some(held) = current.upgrade()
            && let Some(shared) = issue(held, wait.deadline()).await
        {
            return Ok(Some(shared));
        }
        let guard = self.acquire_fresh(wait).await?;
        if let Some(guard) = &guard {
            *current = guard.downgrade();
        }
        Ok(guard)
    }

    async fn acquire_fresh(&self, wait: Wait) -> Result<Option<MutexGuard>> {
        acquire(
            &self.client,
            &self.key,
            &self.options,
            Hold::Exclusive,
            wait,
        )
        .await
    }
}

crate::methods::option_methods!(Mutex, "mutex");

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("ttl", &self.options.ttl)
            .finish_non_exhaustive()
    }
}
