//! The entry point: a backend plus a namespace and lock options.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex as StdMutex, PoisonError, Weak};

use tokio::sync::Mutex as AsyncMutex;

use crate::backend::{LockBackend, LockInfo, LockPage, SharedBackend};
use crate::background::Background;
use crate::capabilities::{Capabilities, Tier};
use crate::election::Election;
use crate::error::Result;
use crate::guard::MutexGuard;
use crate::held::HeldLease;
use crate::key::{LockKey, validate_segment};
use crate::mutex::Mutex;
use crate::options::LockOptions;
use crate::owner::LockOwner;
use crate::rwlock::RwLock;
use crate::semaphore::Semaphore;
use crate::with_lock::WithLockError;

/// The slot that serialises reentrant acquisitions of one key by one owner.
pub(crate) type ReentrantSlot = Arc<AsyncMutex<Weak<HeldLease>>>;

/// A handle on one backend, with the namespace and the options its locks use.
///
/// Cheap to clone: clones share the backend's connections and the reentrancy table.
///
/// ```
/// use lockkit_core::{LockClient, MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockkit_core::Result<()> {
/// let locks = LockClient::new(MemoryBackend::new());
/// let guard = locks.mutex("nightly-report")?.lock().await?;
/// println!("fencing token {}", guard.fencing_token());
/// assert!(guard.release().await?);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockClient {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    backend: SharedBackend,
    namespace: String,
    options: LockOptions,
    reentrant: StdMutex<HashMap<(LockKey, LockOwner), ReentrantSlot>>,
    background: Background,
}

impl LockClient {
    /// A client over `backend` with the default namespace (`"lockkit"`) and default options.
    pub fn new(backend: impl LockBackend) -> Self {
        LockClient::build(
            Arc::new(backend),
            LockKey::DEFAULT_NAMESPACE.to_owned(),
            LockOptions::default(),
        )
    }

    /// A client over a shared backend with the given namespace and options.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) for a bad namespace,
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) for bad options.
    pub fn with_options(
        backend: SharedBackend,
        namespace: &str,
        options: LockOptions,
    ) -> Result<Self> {
        validate_segment("namespace", namespace)?;
        options.validate()?;
        Ok(LockClient::build(backend, namespace.to_owned(), options))
    }

    fn build(backend: SharedBackend, namespace: String, options: LockOptions) -> Self {
        crate::metrics::describe();
        crate::metrics::register(backend.as_ref());
        LockClient {
            inner: Arc::new(ClientInner {
                backend,
                namespace,
                options,
                reentrant: StdMutex::new(HashMap::new()),
                background: Background::default(),
            }),
        }
    }

    /// The backend.
    pub fn backend(&self) -> &SharedBackend {
        &self.inner.backend
    }

    /// The backend's tier.
    pub fn tier(&self) -> Tier {
        self.inner.backend.tier()
    }

    /// The backend's capabilities.
    pub fn capabilities(&self) -> Capabilities {
        self.inner.backend.capabilities()
    }

    /// The namespace every key of this client lives in.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The options new mutexes start with.
    pub fn options(&self) -> &LockOptions {
        &self.inner.options
    }

    /// Validates `name` and joins it with the namespace.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey).
    pub fn key(&self, name: &str) -> Result<LockKey> {
        LockKey::new(&self.inner.namespace, name)
    }

    /// A mutex on the lock `name`, with this client's options.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey).
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        Ok(Mutex::new(self.clone(), self.key(name)?))
    }

    /// An election on the lock `name`, with this client's options (see [`Election`]).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey);
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported), with the reason, on a
    /// backend without elections ([`Capabilities::election`]).
    pub fn election(&self, name: &str) -> Result<Election> {
        Election::new(self.mutex(name)?)
    }

    /// A semaphore of `permits` holders on the key `name`, with this client's options (see
    /// [`Semaphore`]).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey);
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) for `permits` outside
    /// `1..=`[`MAX_PERMITS`](crate::MAX_PERMITS);
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported), with the reason, on a
    /// backend without semaphores ([`Capabilities::semaphore`]).
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        Semaphore::new(self.clone(), self.key(name)?, permits)
    }

    /// A read-write lock on the key `name`, with this client's options (see [`RwLock`]).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey);
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported), with the reason, on a
    /// backend without read-write locks ([`Capabilities::rwlock`]).
    pub fn rwlock(&self, name: &str) -> Result<RwLock> {
        RwLock::new(self.clone(), self.key(name)?)
    }

    /// Takes the lock `name`, runs `f` with the guard while holding it, and releases it. See
    /// [`Mutex::with_lock`].
    ///
    /// # Errors
    /// As [`Mutex::with_lock`]; an invalid `name` before anything runs.
    pub async fn with_lock<F, T>(
        &self,
        name: &str,
        f: F,
    ) -> std::result::Result<T, WithLockError<T>>
    where
        F: AsyncFnOnce(&MutexGuard) -> T,
    {
        let mutex = self.mutex(name).map_err(WithLockError::before)?;
        mutex.with_lock(f).await
    }

    /// Waits until the work this client (with its clones, mutexes and guards) left running in
    /// the background has finished: the releases of dropped guards, releases whose caller
    /// stopped waiting, the clean-up of cancelled acquisitions, and the clean-up sweeps its
    /// backend runs for them ([`LockBackend::idle`](crate::backend::LockBackend::idle)). Await it before the
    /// process exits, or those locks stay taken until their TTL runs out.
    ///
    /// It does not release guards that are still held: release or drop them first (a guard
    /// dropped before `close` is waited for). A background release that cannot reach its
    /// server keeps trying within its backend's timeouts, so bound the wait if shutdown must
    /// be quick: `tokio::time::timeout(Duration::from_secs(5), locks.close())`; dropping the
    /// future only stops the waiting. The client stays usable; work started after `close`
    /// returns is not covered.
    ///
    /// ```
    /// use lockkit_core::{LockClient, MemoryBackend};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockkit_core::Result<()> {
    /// let locks = LockClient::new(MemoryBackend::new());
    /// drop(locks.mutex("job")?.lock().await?); // released in the background
    /// locks.close().await;                      // ... and now done
    /// assert!(locks.inspect("job").await?.is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn close(&self) {
        self.inner.background.idle().await;
        self.inner.backend.idle().await;
    }

    pub(crate) fn background(&self) -> &Background {
        &self.inner.background
    }

    /// Who holds the lock `name`, if anyone.
    ///
    /// # Errors
    /// Invalid name, backend failures.
    pub async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        self.inner.backend.inspect(&self.key(name)?).await
    }

    /// One page of the locks held in this client's namespace whose names start with
    /// `prefix`: at most `limit`, from `cursor` (`None` first, then the page's
    /// [`next`](LockPage::next) until it is `None`). Operators' tooling (`lockkit list`);
    /// see [`LockBackend::list`](crate::backend::LockBackend::list) for what a listing
    /// promises.
    ///
    /// ```
    /// use lockkit_core::{LockClient, MemoryBackend};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockkit_core::Result<()> {
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let _a = locks.mutex("job-a")?.lock().await?;
    /// let _b = locks.mutex("job-b")?.lock().await?;
    /// let mut names = Vec::new();
    /// let mut cursor = None;
    /// loop {
    ///     let page = locks.list_page("job-", cursor.as_deref(), 1).await?;
    ///     names.extend(page.locks.into_iter().map(|(key, _info)| key.name().to_owned()));
    ///     match page.next {
    ///         Some(next) => cursor = Some(next),
    ///         None => break,
    ///     }
    /// }
    /// names.sort();
    /// names.dedup(); // a listing may repeat a lock
    /// assert_eq!(names, ["job-a", "job-b"]);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// An invalid prefix or a zero limit, backend failures
    /// ([`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) for a backend that cannot list).
    pub async fn list_page(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        crate::backend::validate_listing(&self.inner.namespace, prefix, limit)?;
        self.inner
            .backend
            .list(&self.inner.namespace, prefix, cursor, limit)
            .await
    }

    /// Breaks the lock `name` whoever holds it, and returns whether it was held: for an
    /// operator who knows the holder is stale (its process is gone, or hung). The holder is
    /// not asked: its guard reports [`lost`](crate::MutexGuard::lost) at its next renewal,
    /// and until then it may still act. A fencing token keeps it harmless only where the
    /// protected resource checks tokens.
    ///
    /// # Errors
    /// Invalid name, backend failures.
    pub async fn force_release(&self, name: &str) -> Result<bool> {
        self.inner.backend.force_release(&self.key(name)?).await
    }

    /// Checks that the backend answers.
    ///
    /// # Errors
    /// Backend failures.
    pub async fn ping(&self) -> Result<()> {
        self.inner.backend.ping().await
    }

    pub(crate) fn reentrant_slot(&self, key: &LockKey, owner: &LockOwner) -> ReentrantSlot {
        let mut slots = self
            .inner
            .reentrant
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        slots.retain(|_, slot| {
            Arc::strong_count(slot) > 1
                || slot.try_lock().map_or(true, |held| held.strong_count() > 0)
        });
        slots
            .entry((key.clone(), owner.clone()))
            .or_default()
            .clone()
    }
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.inner.backend)
            .field("namespace", &self.inner.namespace)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}
