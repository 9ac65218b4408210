//! The counting semaphore: at most N holders of a key at once, each with a permit that is
//! renewed, fenced, lost and released exactly as a mutex's guard is.

use std::fmt;
use std::time::Duration;

use crate::acquire::{Wait, acquire, timeout_error};
use crate::backend::Hold;
use crate::client::LockClient;
use crate::error::{Error, ErrorKind, Result};
use crate::guard::MutexGuard;
use crate::key::LockKey;
use crate::options::LockOptions;

/// The most permits a semaphore may have: a grant reads the semaphore's live holders, so the
/// count bounds the work of every attempt.
pub const MAX_PERMITS: u32 = 1024;

/// A distributed counting semaphore on one key: at most [`permits`](Semaphore::permits)
/// holders at once, across every process that uses it. Cheap to create; holds no server
/// state until acquired.
///
/// Each [`Permit`] is a lease like a [`MutexGuard`]: renewed in the background, with a lost
/// signal, a fencing token that increases with every grant of the semaphore, and a release
/// in the background when dropped. A holder that crashes frees its permit when its TTL runs
/// out. Waiters are woken by the backend's notification or watch, not by polling, and are
/// served in the order they queued: always on etcd and ZooKeeper, and on Redis and in memory
/// unless [`LockOptions::fair`](crate::LockOptions::fair) is `false` (then a freed permit
/// goes to whoever asks first).
///
/// Every client of a semaphore must use the same `permits`: while the semaphore is in use,
/// an acquisition with another count fails with [`ErrorKind::InvalidConfig`] instead of
/// mixing the two. The semaphore named `jobs` and the mutex named `jobs` are independent.
///
/// Semaphores are not listed by [`LockClient::list_page`] and cannot be broken by
/// [`LockClient::force_release`]; Redlock refuses them (see
/// [`Capabilities::semaphore`](crate::Capabilities::semaphore)).
///
/// ```
/// use lockkit_core::{LockClient, MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockkit_core::Result<()> {
/// let locks = LockClient::new(MemoryBackend::new());
/// let partner_api = locks.semaphore("partner-api", 2)?;
/// let first = partner_api.acquire().await?;
/// let second = partner_api.acquire().await?;
/// assert!(partner_api.try_acquire().await?.is_none());
/// first.release().await?;
/// assert!(partner_api.try_acquire().await?.is_some());
/// # drop(second);
/// # Ok(())
/// # }
/// ```
///
/// # Cancel safety
/// `acquire`, `acquire_timeout` and `try_acquire` are cancel-safe: dropping their future
/// removes whatever the attempt left on the server, in the background.
#[derive(Clone)]
pub struct Semaphore {
    client: LockClient,
    key: LockKey,
    permits: u32,
    options: LockOptions,
}

impl Semaphore {
    pub(crate) fn new(client: LockClient, key: LockKey, permits: u32) -> Result<Self> {
        if let crate::Support::Unsupported(reason) = client.capabilities().semaphore {
            return Err(Error::new(
                ErrorKind::Unsupported,
                client.backend().name(),
                format!("semaphores are not supported: {reason}"),
            ));
        }
        if !(1..=MAX_PERMITS).contains(&permits) {
            return Err(Error::invalid_config(format!(
                "a semaphore needs 1 to {MAX_PERMITS} permits, not {permits}"
            )));
        }
        let options = client.options().clone();
        Ok(Semaphore {
            client,
            key,
            permits,
            options,
        })
    }

    /// The semaphore's key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// How many holders the semaphore admits at once.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Takes a permit, waiting for as long as the options' `wait_timeout` allows (forever by
    /// default).
    ///
    /// # Errors
    /// [`ErrorKind::Timeout`] when `wait_timeout` passes; [`ErrorKind::InvalidConfig`] when
    /// the semaphore is in use with another number of permits; backend errors as for
    /// [`Mutex::lock`](crate::Mutex::lock).
    pub async fn acquire(&self) -> Result<Permit> {
        self.acquire_permit(Wait::per(&self.options)).await
    }

    /// Takes a permit, waiting at most `timeout`.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`], with [`ErrorKind::Timeout`] when `timeout` passes.
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Permit> {
        self.acquire_permit(Wait::at_most(timeout)).await
    }

    /// Takes a permit if one is free, without waiting. All permits taken is `Ok(None)`.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`], without the timeout.
    pub async fn try_acquire(&self) -> Result<Option<Permit>> {
        Ok(self.acquire_hold(Wait::No).await?.map(Permit))
    }

    async fn acquire_permit(&self, wait: Wait) -> Result<Permit> {
        match self.acquire_hold(wait).await? {
            Some(guard) => Ok(Permit(guard)),
            None => Err(timeout_error(&self.client, &self.key)),
        }
    }

    async fn acquire_hold(&self, wait: Wait) -> Result<Option<MutexGuard>> {
        let hold = Hold::Permit {
            permits: self.permits,
        };
        acquire(&self.client, &self.key, &self.options, hold, wait).await
    }
}

crate::methods::option_methods!(Semaphore, "semaphore");

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("key", &self.key)
            .field("permits", &self.permits)
            .field("ttl", &self.options.ttl)
            .finish_non_exhaustive()
    }
}

/// One held permit of a [`Semaphore`]. Renewed in the background while it lives; released
/// when dropped (prefer [`release`](Permit::release), which says whether it was still ours).
///
/// Pass [`fencing_token`](Permit::fencing_token) with every write the permit guards, and
/// watch [`lost`](Permit::lost): once it fires, this holder may no longer count itself among
/// the semaphore's holders.
#[must_use = "a permit is released as soon as it is dropped"]
pub struct Permit(MutexGuard);

crate::methods::grant_methods!(Permit, "the permit");
