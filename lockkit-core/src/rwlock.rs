//! The read-write lock: many readers or one writer of a key, each grant renewed, fenced, lost
//! and released exactly as a mutex's guard is.

use std::fmt;
use std::time::Duration;

use crate::acquire::{Wait, acquire, timeout_error};
use crate::backend::Hold;
use crate::client::LockClient;
use crate::error::{Error, ErrorKind, Result};
use crate::guard::MutexGuard;
use crate::key::LockKey;
use crate::options::LockOptions;

/// A distributed read-write lock on one key: any number of readers at once, or one writer
/// and nobody else, across every process that uses it. Cheap to create; holds no server
/// state until locked.
///
/// Each [`ReadGuard`] and [`WriteGuard`] is a lease like a [`MutexGuard`]: renewed in the
/// background, with a lost signal, a fencing token, and a release in the background when
/// dropped. A holder that crashes frees the lock when its TTL runs out.
///
/// - **Writers are not starved.** A writer that waits blocks new readers: the readers
///   holding the lock finish, the writer goes next, and the readers that came after it
///   follow. On the queueing backends (etcd, ZooKeeper) everyone is served in the order
///   they queued; on Redis and in memory the waiting writers queue (an entry that lapses one
///   TTL after its last attempt if its process dies while waiting) and are served in order,
///   while readers share.
/// - **Fencing.** A write grant's token is above the token of every earlier grant of the
///   key, read or write, so a store that keeps the highest token it has seen refuses a
///   write from an older grant. Readers may get their tokens in any order among themselves.
/// - **No upgrade.** A guard never turns into the other kind: a reader that asks for the
///   write lock waits for its own read lock to go, forever. Release the read lock first.
///
/// The read-write lock named `config` is independent of the mutex and the semaphore of that
/// name. Read-write locks are not listed by [`LockClient::list_page`] and cannot be broken by
/// [`LockClient::force_release`]; Redlock refuses them (see
/// [`Capabilities::rwlock`](crate::Capabilities::rwlock)).
///
/// ```
/// use lockkit_core::{LockClient, MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockkit_core::Result<()> {
/// let locks = LockClient::new(MemoryBackend::new());
/// let config = locks.rwlock("config")?;
/// let first = config.read().await?;
/// let second = config.read().await?;
/// assert!(config.try_write().await?.is_none());
/// let read_token = second.fencing_token();
/// first.release().await?;
/// second.release().await?;
/// let writer = config.write().await?;
/// assert!(writer.fencing_token() > read_token);
/// # Ok(())
/// # }
/// ```
///
/// # Cancel safety
/// Every acquisition is cancel-safe: dropping its future removes whatever the attempt left
/// on the server (a queue entry, a waiting writer's record), in the background.
#[derive(Clone)]
pub struct RwLock {
    client: LockClient,
    key: LockKey,
    options: LockOptions,
}

impl RwLock {
    pub(crate) fn new(client: LockClient, key: LockKey) -> Result<Self> {
        if let crate::Support::Unsupported(reason) = client.capabilities().rwlock {
            return Err(Error::new(
                ErrorKind::Unsupported,
                client.backend().name(),
                format!("read-write locks are not supported: {reason}"),
            ));
        }
        let options = client.options().clone();
        Ok(RwLock {
            client,
            key,
            options,
        })
    }

    /// The lock's key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// Takes a read lock, waiting for as long as the options' `wait_timeout` allows (forever
    /// by default): while a writer holds the lock or waits for it.
    ///
    /// # Errors
    /// [`ErrorKind::Timeout`] when `wait_timeout` passes; backend errors as for
    /// [`Mutex::lock`](crate::Mutex::lock).
    pub async fn read(&self) -> Result<ReadGuard> {
        self.must(Hold::Read, Wait::per(&self.options))
            .await
            .map(ReadGuard)
    }

    /// Takes a read lock, waiting at most `timeout`.
    ///
    /// # Errors
    /// As [`RwLock::read`], with [`ErrorKind::Timeout`] when `timeout` passes.
    pub async fn read_timeout(&self, timeout: Duration) -> Result<ReadGuard> {
        self.must(Hold::Read, Wait::at_most(timeout))
            .await
            .map(ReadGuard)
    }

    /// Takes a read lock if no writer holds the lock or waits for it. `Ok(None)` otherwise.
    ///
    /// # Errors
    /// As [`RwLock::read`], without the timeout.
    pub async fn try_read(&self) -> Result<Option<ReadGuard>> {
        Ok(self.take(Hold::Read, Wait::No).await?.map(ReadGuard))
    }

    /// Takes the write lock, waiting for as long as the options' `wait_timeout` allows
    /// (forever by default): until every reader and writer before it is gone. While it
    /// waits, new readers wait behind it.
    ///
    /// # Errors
    /// As [`RwLock::read`].
    pub async fn write(&self) -> Result<WriteGuard> {
        self.must(Hold::Write, Wait::per(&self.options))
            .await
            .map(WriteGuard)
    }

    /// Takes the write lock, waiting at most `timeout`.
    ///
    /// # Errors
    /// As [`RwLock::write`], with [`ErrorKind::Timeout`] when `timeout` passes.
    pub async fn write_timeout(&self, timeout: Duration) -> Result<WriteGuard> {
        self.must(Hold::Write, Wait::at_most(timeout))
            .await
            .map(WriteGuard)
    }

    /// Takes the write lock if nobody holds the lock. `Ok(None)` otherwise; a failed try
    /// leaves no waiting writer behind.
    ///
    /// # Errors
    /// As [`RwLock::write`], without the timeout.
    pub async fn try_write(&self) -> Result<Option<WriteGuard>> {
        Ok(self.take(Hold::Write, Wait::No).await?.map(WriteGuard))
    }

    async fn must(&self, hold: Hold, wait: Wait) -> Result<MutexGuard> {
        match self.take(hold, wait).await? {
            Some(guard) => Ok(guard),
            None => Err(timeout_error(&self.client, &self.key)),
        }
    }

    async fn take(&self, hold: Hold, wait: Wait) -> Result<Option<MutexGuard>> {
        acquire(&self.client, &self.key, &self.options, hold, wait).await
    }
}

crate::methods::option_methods!(RwLock, "read-write lock");

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("key", &self.key)
            .field("ttl", &self.options.ttl)
            .finish_non_exhaustive()
    }
}

/// A held read lock of an [`RwLock`], shared with other readers. Renewed in the background
/// while it lives; released when dropped (prefer [`release`](ReadGuard::release), which
/// says whether it was still ours).
///
/// Once [`lost`](ReadGuard::lost) fires, a writer may hold the lock: stop reading what it
/// guards.
#[must_use = "a read lock is released as soon as it is dropped"]
pub struct ReadGuard(MutexGuard);

crate::methods::grant_methods!(ReadGuard, "the read lock");

/// The held write lock of an [`RwLock`]: nobody else holds the lock. Renewed in the
/// background while it lives; released when dropped (prefer
/// [`release`](WriteGuard::release), which says whether it was still ours).
///
/// Pass [`fencing_token`](WriteGuard::fencing_token) with every write it guards: it is above
/// every earlier grant's of the lock. Once [`lost`](WriteGuard::lost) fires, others may hold
/// the lock.
#[must_use = "a write lock is released as soon as it is dropped"]
pub struct WriteGuard(MutexGuard);

crate::methods::grant_methods!(WriteGuard, "the write lock");
