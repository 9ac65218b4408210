//! Several locks taken all or nothing ([`LockClient::lock_all`]), in one canonical order so
//! that callers with overlapping sets cannot deadlock.

use std::fmt;
use std::time::{Duration, Instant};

use crate::acquire::{Wait, acquire};
use crate::backend::Hold;
use crate::client::LockClient;
use crate::error::{Error, ErrorKind, Result};
use crate::guard::MutexGuard;
use crate::key::LockKey;
use crate::token::FencingToken;

/// Several held locks, from [`LockClient::lock_all`]: each part is a [`MutexGuard`], renewed
/// and released as one is; [`lost`](MultiGuard::lost) fires when any part is lost. Dropping
/// it releases every part in the background.
#[must_use = "the locks are released as soon as the guard is dropped"]
pub struct MultiGuard {
    parts: Vec<MutexGuard>,
}

impl MultiGuard {
    /// The guards of the parts, in the canonical order they were taken (sorted by key).
    pub fn parts(&self) -> &[MutexGuard] {
        &self.parts
    }

    /// The fencing token of the part `key`, if it is one.
    pub fn fencing_token(&self, key: &LockKey) -> Option<FencingToken> {
        self.parts
            .iter()
            .find(|part| part.key() == key)
            .map(MutexGuard::fencing_token)
    }

    /// Waits until any part is lost. The future owns what it needs.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let parts: Vec<_> = self
            .parts
            .iter()
            .map(|part| Box::pin(part.lost()))
            .collect();
        async move {
            if !parts.is_empty() {
                futures_util::future::select_all(parts).await;
            }
        }
    }

    /// Whether any part is known to be lost, or its validity has passed.
    pub fn is_lost(&self) -> bool {
        self.parts.iter().any(MutexGuard::is_lost)
    }

    /// Until when every part is known to be ours: the earliest validity deadline.
    pub fn valid_until(&self) -> Option<Instant> {
        self.parts.iter().map(MutexGuard::valid_until).min()
    }

    /// Releases every part at once and says whether all of them were still ours.
    ///
    /// # Errors
    /// The first release that failed (every part's release is still sent; one that failed
    /// expires with its TTL).
    pub async fn release(self) -> Result<bool> {
        let released =
            futures_util::future::join_all(self.parts.into_iter().map(MutexGuard::release)).await;
        let mut all_ours = true;
        for answer in released {
            all_ours &= answer?;
        }
        Ok(all_ours)
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.parts).finish()
    }
}

impl LockClient {
    /// Takes the locks `names` all or nothing, waiting as [`Mutex::lock`] does (for the
    /// options' `wait_timeout` in all, forever by default), with one guard over all of them.
    ///
    /// The locks are taken one after the other in one canonical order (sorted by key, repeats
    /// counted once), whatever the order of `names`, so two callers whose sets overlap never
    /// wait for each other in a cycle. When one part fails (an error, the wait timeout, a
    /// cancelled future), the parts already taken are released in the background: nothing is
    /// held afterwards.
    ///
    /// ```
    /// use lockkit_core::{LockClient, MemoryBackend};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockkit_core::Result<()> {
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let both = locks.lock_all(["account-seller", "account-buyer"]).await?;
    /// // ... move the money, each write fenced with its account's token ...
    /// assert_eq!(both.parts().len(), 2);
    /// assert!(both.release().await?);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`Mutex::lock`]: crate::Mutex::lock
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`] for an invalid name (before anything is taken),
    /// [`ErrorKind::InvalidConfig`] for an empty set, and the first part's error as
    /// [`Mutex::lock`] gives it.
    pub async fn lock_all<I, S>(&self, names: I) -> Result<MultiGuard>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.take_all(names, Wait::per(self.options()))
            .await?
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Timeout,
                    self.backend().name(),
                    "the locks were not all acquired in time",
                )
            })
    }

    /// As [`lock_all`](LockClient::lock_all), waiting at most `timeout` in all.
    ///
    /// # Errors
    /// As [`lock_all`](LockClient::lock_all), with [`ErrorKind::Timeout`] when `timeout`
    /// passes.
    pub async fn lock_all_timeout<I, S>(&self, names: I, timeout: Duration) -> Result<MultiGuard>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.take_all(names, Wait::at_most(timeout))
            .await?
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Timeout,
                    self.backend().name(),
                    format!("the locks were not all acquired within {timeout:?}"),
                )
            })
    }

    /// Takes the locks `names` if every one is free, without waiting; `Ok(None)` (holding
    /// nothing) when one is taken.
    ///
    /// # Errors
    /// As [`lock_all`](LockClient::lock_all).
    pub async fn try_lock_all<I, S>(&self, names: I) -> Result<Option<MultiGuard>>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.take_all(names, Wait::No).await
    }

    /// Takes the parts in order, then makes sure each still has its floor of validity as
    /// the set is handed out: a part taken first can run down (without auto-renewal, or as
    /// its renewals fail) while a later one is waited for. A part that cannot be confirmed
    /// is let go with every part after it, and they are taken again in order, so the set is
    /// only ever waited for in the canonical order.
    async fn take_all<I, S>(&self, names: I, wait: Wait) -> Result<Option<MultiGuard>>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut keys = names
            .into_iter()
            .map(|name| self.key(name.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        if keys.is_empty() {
            return Err(Error::invalid_config(
                "lock_all needs at least one lock name",
            ));
        }
        keys.sort();
        keys.dedup();
        // A part not had drops the parts before it: each releases in the background.
        let mut parts: Vec<MutexGuard> = Vec::with_capacity(keys.len());
        loop {
            for key in &keys[parts.len()..] {
                match acquire(self, key, self.options(), Hold::Exclusive, wait).await? {
                    Some(part) => parts.push(part),
                    None => return Ok(None),
                }
            }
            let mut whole = parts.len();
            for (i, part) in parts.iter().enumerate() {
                if !part.vouch(wait.deadline()).await {
                    whole = i;
                    break;
                }
            }
            if whole == parts.len() {
                return Ok(Some(MultiGuard { parts }));
            }
            parts.truncate(whole);
        }
    }
}
