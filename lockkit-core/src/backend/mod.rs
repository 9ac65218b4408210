//! The backend-author API: the contract between the core and a backend ([`LockBackend`], a
//! few primitive operations and the types they exchange), and what backend authors share
//! beyond it: [`cleanup`] (in-flight clean-up), [`runtime`] (lockkit's background runtime),
//! [`url`] (connection URLs), the lease arithmetic ([`clock_drift`], [`validity_deadline`]).
//!
//! Users of locks never need this module: the crate root has everything they touch. It is
//! separate so that the secret part of a grant ([`OwnerToken`], [`Lease::owner`]) is
//! reachable only by code that asks for it here, as a backend must. The session token a
//! backend attaches to its grants ([`Grant::with_session`]) is not reachable at all: a
//! lease only says whether its session is alive ([`Lease::session_alive`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::capabilities::{Capabilities, Tier};
use crate::error::Result;
use crate::key::LockKey;

pub use crate::backoff::Backoff;
pub use crate::election::Leader;
pub use crate::error::BoxError;
pub use crate::key::validate_segment;
pub use crate::lease::{Lease, clock_drift, validity_deadline, validity_floor};
pub use crate::token::OwnerToken;
/// Re-exported so backends implement [`LockBackend`] with the same macro version.
pub use async_trait::async_trait;
/// Re-exported for backends that attach session tokens to grants.
pub use tokio_util::sync::CancellationToken;

/// The lease of a held lock: what a backend's own extensions need (an etcd transaction that
/// commits only while the lock is held, for example) and what backend tests inspect. It
/// carries the grant's secret owner token, which is why it is here and not on the guard.
pub fn lease_of(guard: &crate::MutexGuard) -> &Lease {
    guard.lease()
}

pub mod cleanup;
pub mod runtime;
mod types;
pub mod url;

pub use types::{AcquireRequest, Attempt, Contention, Grant, Hold, LockInfo, LockPage, Renewal};

/// The longest timeout or lifetime a backend's configuration accepts: far beyond any useful
/// value, and far enough below what a deadline (`Instant` + duration), a sum of two of them
/// or a server's millisecond argument can hold that none of them overflows.
pub const MAX_CONFIG_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Checks a configured duration (a timeout, a TTL) named `name`: above zero and at most
/// [`MAX_CONFIG_DURATION`].
///
/// # Errors
/// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) naming the value.
pub fn validate_duration(name: &str, value: Duration) -> Result<()> {
    if value.is_zero() {
        return Err(crate::Error::invalid_config(format!(
            "{name} must be above zero"
        )));
    }
    if value > MAX_CONFIG_DURATION {
        return Err(crate::Error::invalid_config(format!(
            "{name} must be at most {}, got {}",
            humantime::format_duration(MAX_CONFIG_DURATION),
            humantime::format_duration(value)
        )));
    }
    Ok(())
}

/// A backend shared between clients and tasks.
pub type SharedBackend = Arc<dyn LockBackend>;

/// The page of a backend that lists lock *names* and learns each holder by
/// [`LockBackend::inspect`]: `names` (of locks in `namespace`) are inspected concurrently, a
/// name no longer held (or not a valid name) is left out, and the page goes on at `next`.
///
/// # Errors
/// The first inspection that failed.
pub async fn inspect_names<B: LockBackend + ?Sized>(
    backend: &B,
    namespace: &str,
    names: &[String],
    next: Option<String>,
) -> Result<LockPage> {
    let keys: Vec<LockKey> = names
        .iter()
        .filter_map(|name| LockKey::new(namespace, name).ok())
        .collect();
    let infos = futures_util::future::join_all(keys.iter().map(|key| backend.inspect(key))).await;
    let mut locks = Vec::with_capacity(keys.len());
    for (key, info) in keys.into_iter().zip(infos) {
        if let Some(info) = info? {
            locks.push((key, info));
        }
    }
    Ok(LockPage::new(locks, next))
}

/// Checks the arguments of [`LockBackend::list`]: a valid namespace, a prefix that could start
/// a lock name (or is empty), a limit of at least 1.
///
/// # Errors
/// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) for the namespace or prefix,
/// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) for a zero limit.
pub fn validate_listing(namespace: &str, prefix: &str, limit: usize) -> Result<()> {
    validate_segment("namespace", namespace)?;
    if !prefix.is_empty() && prefix != "." && prefix != ".." {
        validate_segment("name prefix", prefix)?;
    }
    if limit == 0 {
        return Err(crate::Error::invalid_config(
            "a page of locks needs a limit of at least 1",
        ));
    }
    Ok(())
}

/// The primitive operations a lock backend implements. Everything else (waiting, backoff,
/// renewal scheduling, reentrancy, the lost signal, cancel safety) lives once in the core's
/// [`Mutex`](crate::Mutex) and [`LockClient`](crate::LockClient).
///
/// # Contract
/// - **Exclusion**: while a grant is within its validity, no other acquisition of the same key
///   is granted, as far as the backend's [`Tier`] can promise.
/// - **Fencing**: fencing tokens of successive grants of a key strictly increase, with the
///   strength given by [`Capabilities::fencing`].
/// - **Ownership**: `renew` and `release` act only on the grant whose owner token they carry;
///   for anyone else they are a no-op that reports [`Renewal::Lost`] / `false`.
/// - **Expiry**: a grant that is not renewed disappears after its TTL, so a crashed holder
///   cannot block a key forever.
/// - **Idempotent attempts**: `try_acquire` called again with the same request finds what an
///   earlier attempt left (its queue entry, or a grant whose reply was lost) instead of
///   creating another.
/// - **Abandon**: `abandon` removes everything a request left on the server: its queue entry,
///   and a grant it may have received, even one whose attempt was still in flight.
/// - **Bounded**: every operation returns within the backend's configured timeouts;
///   unreachable servers give [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable).
///
/// # Cancel safety
/// The core may drop any of these futures at an await point; it then calls `abandon` (for an
/// acquisition) or `release` (for a grant) in the background. Implementations must not leave a
/// connection in a broken state when dropped.
#[async_trait]
pub trait LockBackend: Send + Sync + fmt::Debug + 'static {
    /// A short name for errors, logs and metrics (`"memory"`, `"redis"`, `"etcd"`, `"zk"`).
    fn name(&self) -> &'static str;

    /// The reliability tier of this backend as configured.
    fn tier(&self) -> Tier;

    /// What this backend can do.
    fn capabilities(&self) -> Capabilities;

    /// The longest validity a grant or a renewal of `ttl` comes with on this backend: `ttl`
    /// itself by default; less where the backend trusts a grant for less than its TTL
    /// (ZooKeeper, a share of its session timeout). The core hands a guard out only with at
    /// least a tenth of it left (see [`validity_floor`]), whatever the grant's own answer
    /// says.
    fn max_validity(&self, ttl: Duration) -> Duration {
        ttl
    }

    /// One acquisition attempt. It never waits for the holder.
    ///
    /// # Errors
    /// Backend failures; contention is not an error ([`Attempt::Contended`]).
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt>;

    /// Waits until the lock may have changed hands (a release notification, the predecessor's
    /// deletion), or `max_wait` has passed. Returning early is always allowed: the core simply
    /// tries again. The core does not call it while [`LockBackend::capabilities`] says
    /// [`WaitStrategy::Poll`](crate::WaitStrategy::Poll): it sleeps its own backoff instead.
    /// The default sleeps for `max_wait`.
    ///
    /// `Ok(Some(grant))` says the wait ended with the lock handed to `request` (a backend
    /// whose release grants the lock to the next waiter in its queue): the core then holds it
    /// without another attempt. Its validity is counted from the send time of the attempt
    /// before this wait, so the backend must only hand over what it granted after that
    /// attempt reached the server (a queue entry that attempt made or refreshed, say), for a
    /// time that starts no earlier.
    ///
    /// # Errors
    /// Backend failures while setting up the wait.
    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        let _ = (request, contention);
        tokio::time::sleep(max_wait).await;
        Ok(None)
    }

    /// Removes everything `request` left on the server (see the contract above).
    ///
    /// # Errors
    /// Backend failures; the leftovers then expire with their TTL or session.
    async fn abandon(&self, request: &AcquireRequest) -> Result<()>;

    /// Extends the lease to its TTL if it is still ours.
    ///
    /// # Errors
    /// Backend failures (the core retries them until the lease's validity deadline).
    async fn renew(&self, lease: &Lease) -> Result<Renewal>;

    /// Renews several leases at once; the answers are in the same order. Backends that can
    /// batch (one pipeline, one keep-alive) override it; the default renews them concurrently.
    ///
    /// The core calls `renew` and `renew_many` on lockkit's own runtime
    /// ([`runtime`]), never on the application's: connections a backend uses
    /// only for renewals have their drivers there.
    async fn renew_many(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        futures_util::future::join_all(leases.iter().map(|lease| self.renew(lease))).await
    }

    /// Releases the lease if it is still ours. Returns whether it was.
    ///
    /// # Errors
    /// Backend failures; the lock then expires with its TTL.
    async fn release(&self, lease: &Lease) -> Result<bool>;

    /// Whether `lease` still holds its lock, asked of the server. The default compares the
    /// mutex holder's fencing token; backends whose tokens can repeat (after a failover)
    /// override it to compare the owner token, and backends with semaphores override it for
    /// permits, which the default refuses.
    ///
    /// # Errors
    /// Backend failures.
    async fn is_held(&self, lease: &Lease) -> Result<bool> {
        if lease.hold() != Hold::Exclusive {
            return Err(lease.hold().unsupported(self.name()));
        }
        let info = self.inspect(lease.key()).await?;
        Ok(info.is_some_and(|info| info.fencing_token == lease.fencing_token()))
    }

    /// Tells who holds `key`, if anyone.
    ///
    /// # Errors
    /// Backend failures.
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>>;

    /// Checks that the backend answers.
    ///
    /// # Errors
    /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable), [`ErrorKind::Auth`](crate::ErrorKind::Auth), ...
    async fn ping(&self) -> Result<()>;

    /// Waits until the clean-up this backend started in the background on its own (its
    /// [`cleanup::Sweeps`]) has ended: [`LockClient::close`](crate::LockClient::close) awaits
    /// it, after the client's own background work. A sweep ends when its work is done, its
    /// session is gone, or its [retry budget](cleanup::Retry) runs out. The default has
    /// nothing to wait for.
    async fn idle(&self) {}

    /// One page of the locks held in `namespace` whose names start with `prefix` (all of them
    /// for `""`), at most `limit` of them, starting at `cursor` (`None` for the first page;
    /// then the [`LockPage::next`] of the page before).
    ///
    /// An operator's view, not a snapshot: a lock taken or released while the pages are read
    /// may or may not be listed, and a lock may be listed in two pages (Redis `SCAN` promises
    /// no more), so a caller that needs each once drops repeats. Each page is bounded work on
    /// the server: implementations read the keyspace a page at a time (Redis `SCAN` with
    /// `COUNT`, an etcd range with a limit) and never load it whole; ZooKeeper, which cannot
    /// page, reads the namespace's children (lock names, not their queues) in one call.
    /// [`validate_listing`] checks the arguments. The default says
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported).
    ///
    /// # Errors
    /// Invalid arguments, backend failures.
    async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        let _ = (namespace, prefix, cursor, limit);
        Err(crate::Error::new(
            crate::ErrorKind::Unsupported,
            self.name(),
            "this backend cannot list locks",
        ))
    }

    /// Breaks the lock `key` whoever holds it, as an operator who knows the holder is stale
    /// does: removes the current holder's grant (not the queued waiters, not the fencing
    /// counter, so tokens keep increasing) and wakes the waiters. Returns whether the lock
    /// was held. The old holder is not told: its next renewal reports
    /// [`Renewal::Lost`], so its guard's lost signal fires then.
    ///
    /// The default says [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported).
    ///
    /// # Errors
    /// Backend failures.
    async fn force_release(&self, key: &LockKey) -> Result<bool> {
        let _ = key;
        Err(crate::Error::new(
            crate::ErrorKind::Unsupported,
            self.name(),
            "this backend cannot break locks",
        ))
    }

    /// Elections: stores `value` as what the grant of `lease` proclaims, in one step with the
    /// check that `lease` still holds its lock, replacing what it proclaimed before. Returns
    /// `false`, writing nothing, when the lease no longer holds its lock.
    ///
    /// The value lives with the grant: whatever ends the grant (a release, an expiry, a
    /// forced release, the end of its session) removes it or makes it invisible, and
    /// [`LockBackend::leader`] shows a value only with the grant that proclaimed it. A
    /// proclamation notifies [`LockBackend::wait_for_leader_change`] like a release does.
    /// Backends declare elections with [`Capabilities::election`]; the default says
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported).
    ///
    /// # Errors
    /// Backend failures: the value may then have been written or not.
    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool> {
        let _ = (lease, value);
        Err(crate::Error::new(
            crate::ErrorKind::Unsupported,
            self.name(),
            "this backend does not implement elections",
        ))
    }

    /// Elections: the current holder of `key` (its fencing token is the term) and the value
    /// its grant proclaimed (`None` if it has not), read at one moment: never a holder with
    /// another grant's value. On the consensus tiers the read is linearizable.
    ///
    /// # Errors
    /// Backend failures; [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) by default.
    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>> {
        let _ = key;
        Err(crate::Error::new(
            crate::ErrorKind::Unsupported,
            self.name(),
            "this backend does not implement elections",
        ))
    }

    /// Elections: waits until the leader of `key` may differ from `seen` (another holder, a
    /// vacancy, a new proclamation), or `max_wait` has passed. Returning early is always
    /// allowed: the core reads the leader again. The default sleeps for `max_wait`.
    ///
    /// # Errors
    /// Backend failures while setting up the wait.
    async fn wait_for_leader_change(
        &self,
        key: &LockKey,
        seen: Option<&Leader>,
        max_wait: Duration,
    ) -> Result<()> {
        let _ = (key, seen);
        tokio::time::sleep(max_wait).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_duration_is_above_zero_and_at_most_a_year() {
        assert!(validate_duration("t", Duration::from_millis(1)).is_ok());
        assert!(validate_duration("t", MAX_CONFIG_DURATION).is_ok());
        for bad in [
            Duration::ZERO,
            MAX_CONFIG_DURATION + Duration::from_nanos(1),
            Duration::MAX,
        ] {
            let error = validate_duration("redis.node_timeout", bad).unwrap_err();
            assert_eq!(error.kind(), crate::ErrorKind::InvalidConfig, "{bad:?}");
            assert!(error.message().contains("redis.node_timeout"), "{error}");
        }
    }
}
