//! A critical section as a closure: [`Mutex::with_lock`], [`Semaphore::with_permit`],
//! [`RwLock::with_read`], [`RwLock::with_write`], and how they report an unprotected end.

use std::fmt;

use crate::error::{Error, ErrorKind};
use crate::guard::MutexGuard;
use crate::mutex::Mutex;
use crate::rwlock::{ReadGuard, RwLock, WriteGuard};
use crate::semaphore::{Permit, Semaphore};

impl Mutex {
    /// Takes the lock, runs `f` with the guard while holding it, and releases it.
    ///
    /// `f` borrows the guard: it passes [`fencing_token`](MutexGuard::fencing_token) with its
    /// writes, can check [`is_lost`](MutexGuard::is_lost) just before a commit, and can
    /// [`extend`](MutexGuard::extend) the lease before a long step. It cannot release the lock
    /// or keep the guard: `with_lock` does that when `f` ends.
    ///
    /// If the lock is lost while `f` runs, `f`'s future is dropped at its next await point: the
    /// work was cut short and may be partly done (the fencing token makes partial work
    /// harmless where the resource checks it).
    ///
    /// ```
    /// use lockkit_core::{LockClient, MemoryBackend};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockkit_core::Result<()> {
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let written = locks
    ///     .mutex("invoice-42")?
    ///     .with_lock(async |guard| {
    ///         let token = guard.fencing_token(); // send it with every write
    ///         token.get()
    ///     })
    ///     .await?;
    /// assert!(written >= 1);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// A [`WithLockError`] (which `?` turns into an [`Error`]):
    /// - the errors of [`Mutex::lock`], before `f` ran;
    /// - [`ErrorKind::Lost`] when the lock was lost while `f` ran (no value: `f` was cut short);
    /// - [`ErrorKind::Lost`] with `f`'s value ([`WithLockError::into_value`]) when `f`
    ///   finished but the lock was not ours to its end: its validity had run out, or the
    ///   release found it gone. The caller learns both what `f` produced and that it was not
    ///   protected.
    ///
    /// A release that fails on the network after `f` finished while the lock was still valid
    /// does not turn the result into an error: the section was protected, and the lock
    /// expires with its TTL (logged as a warning).
    pub async fn with_lock<F, T>(&self, f: F) -> std::result::Result<T, WithLockError<T>>
    where
        F: AsyncFnOnce(&MutexGuard) -> T,
    {
        let guard = self.lock().await.map_err(WithLockError::before)?;
        let backend = self.client().backend().name();
        protect(guard, backend, &format!("lock {}", self.key()), f).await
    }
}

impl Semaphore {
    /// Takes a permit, runs `f` with it while holding it, and gives it back: as
    /// [`Mutex::with_lock`] does with the lock (`f` is cut short if the permit is lost, and an
    /// unprotected end is an error carrying `f`'s value).
    ///
    /// ```
    /// use lockkit_core::{LockClient, MemoryBackend};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockkit_core::Result<()> {
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let token = locks
    ///     .semaphore("partner-api", 4)?
    ///     .with_permit(async |permit| permit.fencing_token().get())
    ///     .await?;
    /// assert!(token >= 1);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`Mutex::with_lock`], with the errors of [`Semaphore::acquire`] before `f` ran.
    pub async fn with_permit<F, T>(&self, f: F) -> std::result::Result<T, WithLockError<T>>
    where
        F: AsyncFnOnce(&Permit) -> T,
    {
        let permit = self.acquire().await.map_err(WithLockError::before)?;
        let backend = permit.as_guard().backend().name();
        protect(permit, backend, &format!("a permit of {}", self.key()), f).await
    }
}

impl RwLock {
    /// Takes a read lock, runs `f` with it while holding it, and gives it back: as
    /// [`Mutex::with_lock`] does with the lock.
    ///
    /// ```
    /// use lockkit_core::{LockClient, MemoryBackend};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockkit_core::Result<()> {
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let config = locks.rwlock("config")?;
    /// let read = config.with_read(async |guard| guard.fencing_token()).await?;
    /// let written = config.with_write(async |guard| guard.fencing_token()).await?;
    /// assert!(written > read);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`Mutex::with_lock`], with the errors of [`RwLock::read`] before `f` ran.
    pub async fn with_read<F, T>(&self, f: F) -> std::result::Result<T, WithLockError<T>>
    where
        F: AsyncFnOnce(&ReadGuard) -> T,
    {
        let guard = self.read().await.map_err(WithLockError::before)?;
        let backend = guard.as_guard().backend().name();
        protect(guard, backend, &format!("a read lock of {}", self.key()), f).await
    }

    /// Takes the write lock, runs `f` with it while holding it, and gives it back: as
    /// [`Mutex::with_lock`] does with the lock.
    ///
    /// # Errors
    /// As [`Mutex::with_lock`], with the errors of [`RwLock::write`] before `f` ran.
    pub async fn with_write<F, T>(&self, f: F) -> std::result::Result<T, WithLockError<T>>
    where
        F: AsyncFnOnce(&WriteGuard) -> T,
    {
        let guard = self.write().await.map_err(WithLockError::before)?;
        let backend = guard.as_guard().backend().name();
        protect(
            guard,
            backend,
            &format!("the write lock of {}", self.key()),
            f,
        )
        .await
    }
}

/// A grant that [`protect`] can run a section under.
trait Protecting {
    fn guard(&self) -> &MutexGuard;
    async fn give_back(self) -> crate::Result<bool>;
}

impl Protecting for MutexGuard {
    fn guard(&self) -> &MutexGuard {
        self
    }
    async fn give_back(self) -> crate::Result<bool> {
        self.release().await
    }
}

/// The grant types that wrap a [`MutexGuard`].
macro_rules! protecting_grant {
    ($($grant:ty),*) => {$(
        impl Protecting for $grant {
            fn guard(&self) -> &MutexGuard {
                self.as_guard()
            }
            async fn give_back(self) -> crate::Result<bool> {
                self.release().await
            }
        }
    )*};
}

protecting_grant!(Permit, ReadGuard, WriteGuard);

/// Runs `f` under `held` (`what` names it in errors), cancels it when `held` is lost, and
/// gives `held` back, saying whether the section was protected to its end.
async fn protect<H: Protecting, T>(
    held: H,
    backend: &'static str,
    what: &str,
    f: impl AsyncFnOnce(&H) -> T,
) -> std::result::Result<T, WithLockError<T>> {
    let lost = held.guard().lost_signal();
    let outcome = tokio::select! {
        biased;
        () = lost.fired() => None,
        value = f(&held) => Some(value),
    };
    let Some(value) = outcome else {
        drop(held);
        return Err(WithLockError::before(Error::new(
            ErrorKind::Lost,
            backend,
            format!("{what} was lost; the critical section was cancelled"),
        )));
    };
    let protected_to_the_end = !held.guard().is_lost();
    match held.give_back().await {
        Ok(true) if protected_to_the_end => Ok(value),
        Err(e) if protected_to_the_end => {
            tracing::warn!(what = %what, error = %e.display_chain(), "release failed after the critical section; it expires with its TTL");
            Ok(value)
        }
        Ok(true) | Err(_) => Err(WithLockError::after(
            Error::new(
                ErrorKind::Lost,
                backend,
                format!("the critical section finished, but {what}'s validity had run out by then"),
            ),
            value,
        )),
        Ok(false) => Err(WithLockError::after(
            Error::new(
                ErrorKind::Lost,
                backend,
                format!("the critical section finished, but {what} was no longer held at release"),
            ),
            value,
        )),
    }
}

/// Why [`Mutex::with_lock`] (or [`LockClient::with_lock`](crate::LockClient::with_lock)) did
/// not return a protected result, with the closure's value when the closure finished.
///
/// `?` converts it into an [`Error`] (dropping the value); match on
/// [`into_parts`](WithLockError::into_parts) to keep the value of a section that finished
/// unprotected, for example to undo or re-check what it wrote.
pub struct WithLockError<T> {
    error: Error,
    value: Option<T>,
}

impl<T> WithLockError<T> {
    /// An error before or during the closure: there is no value.
    pub(crate) fn before(error: Error) -> Self {
        WithLockError { error, value: None }
    }

    /// The closure finished with `value`, but the lock was not confirmed ours to its end.
    fn after(error: Error, value: T) -> Self {
        WithLockError {
            error,
            value: Some(value),
        }
    }

    /// What went wrong.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The kind of what went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.error.kind()
    }

    /// The closure's value, if it finished (only with [`ErrorKind::Lost`]).
    pub fn value(&self) -> Option<&T> {
        self.value.as_ref()
    }

    /// The closure's value, if it finished.
    pub fn into_value(self) -> Option<T> {
        self.value
    }

    /// The error, and the closure's value if it finished.
    pub fn into_parts(self) -> (Error, Option<T>) {
        (self.error, self.value)
    }
}

impl<T> From<WithLockError<T>> for Error {
    fn from(e: WithLockError<T>) -> Self {
        e.error
    }
}

impl<T> fmt::Display for WithLockError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)?;
        if self.value.is_some() {
            f.write_str(" (the critical section had finished)")?;
        }
        Ok(())
    }
}

impl<T> fmt::Debug for WithLockError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WithLockError")
            .field("error", &self.error)
            .field("finished", &self.value.is_some())
            .finish()
    }
}

impl<T> std::error::Error for WithLockError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}
