//! The owner a reentrant acquisition is taken for.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// The owner of reentrant acquisitions: while a guard taken for an owner holds a lock,
/// another acquisition of that lock for the same owner (through the same [`LockClient`] or
/// its clones) succeeds at once and shares the grant. See [`Mutex::reentrant`].
///
/// An owner is a value, not a name: it can only be made by [`LockOwner::new`], and two calls
/// never make the same owner. So only code that was handed the owner (a clone of it) can
/// re-enter a lock taken for it; two unrelated tasks cannot stop excluding each other by
/// passing the same string, as they could with an owner keyed by a name. Give one owner to
/// the code that should count as one holder (the layers of one request, a recursive job) and
/// nothing else. Owners are local to the process: another process is always a different
/// contender.
///
/// [`LockClient`]: crate::LockClient
/// [`Mutex::reentrant`]: crate::Mutex::reentrant
///
/// ```
/// use lockkit_core::{LockClient, LockOwner, MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockkit_core::Result<()> {
/// let locks = LockClient::new(MemoryBackend::new());
/// let me = LockOwner::new();
/// let outer = locks.mutex("ledger")?.reentrant(&me).lock().await?;
/// // Deeper in the same job: the lock is already ours, so this does not wait.
/// let inner = locks.mutex("ledger")?.reentrant(&me).lock().await?;
/// assert_eq!(inner.fencing_token(), outer.fencing_token());
/// // Anyone else still waits, including another owner in this process.
/// assert!(locks.mutex("ledger")?.reentrant(&LockOwner::new()).try_lock().await?.is_none());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LockOwner(u64);

impl LockOwner {
    /// A new owner, different from every other.
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        LockOwner(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl Default for LockOwner {
    fn default() -> Self {
        LockOwner::new()
    }
}

impl fmt::Debug for LockOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockOwner({})", self.0)
    }
}
