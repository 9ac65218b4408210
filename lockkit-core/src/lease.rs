//! One grant of a lock, and the arithmetic of how long it stays valid.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::backend::Hold;
use crate::key::LockKey;
use crate::token::{FencingToken, OwnerToken};

/// The margin taken off a lease's validity for clock drift between client and server:
/// `factor × ttl + 2 ms` (Redlock's rule, with `factor` usually 0.01).
pub fn clock_drift(ttl: Duration, factor: f64) -> Duration {
    Duration::try_from_secs_f64(ttl.as_secs_f64() * factor.clamp(0.0, 1.0))
        .unwrap_or(Duration::MAX)
        .saturating_add(Duration::from_millis(2))
}

/// The local deadline until which a grant may be trusted: measured from the moment the request
/// was *sent* (so network and queueing time count against it), for the validity the server
/// promised, minus drift. `None` when nothing is left. A validity beyond
/// [`LockOptions::MAX_TTL`](crate::LockOptions::MAX_TTL) (a server's answer no grant can
/// have) counts as that maximum, so no answer can overflow the deadline.
///
/// Only [`Instant`] is used, so wall-clock steps on the client cannot stretch a lease.
pub fn validity_deadline(
    sent_at: Instant,
    valid_for: Duration,
    drift: Duration,
) -> Option<Instant> {
    let usable = valid_for.checked_sub(drift)?;
    if usable.is_zero() {
        return None;
    }
    sent_at.checked_add(usable.min(crate::LockOptions::MAX_TTL))
}

/// The least validity a guard is handed out with: a tenth of `promised`, the validity the
/// backend can promise a grant of the requested TTL
/// ([`LockBackend::max_validity`](crate::backend::LockBackend::max_validity)), never a tenth
/// of what one grant's answer says.
///
/// Why a tenth: the scheduler renews a lease after a third of its validity, so a guard
/// handed out with a tenth left still has time for one renewal before its lost signal fires,
/// while a grant that waited most of its TTL behind a failover (and would be lost before the
/// caller's first step) is renewed first. A backend's answer cannot lower the floor: a grant
/// that says it is valid for 3 ms would otherwise be handed out with 0.3 ms.
pub fn validity_floor(promised: Duration) -> Duration {
    promised / 10
}

/// One grant of a lock: key, secret owner token, fencing token and TTL.
///
/// Backends receive leases back in [`renew`](crate::backend::LockBackend::renew) and
/// [`release`](crate::backend::LockBackend::release) and find their server-side record by the owner
/// token or by [`handle`](Lease::handle). `Debug` never shows the owner token.
#[derive(Clone)]
pub struct Lease {
    key: LockKey,
    owner: OwnerToken,
    fencing_token: FencingToken,
    ttl: Duration,
    acquired_at: Instant,
    handle: Option<Arc<str>>,
    session: Option<CancellationToken>,
    hold: Hold,
}

impl Lease {
    /// Builds a lease. Used by the core when a backend grants a lock, and by tests.
    pub fn new(
        key: LockKey,
        owner: OwnerToken,
        fencing_token: FencingToken,
        ttl: Duration,
        acquired_at: Instant,
    ) -> Self {
        Lease {
            key,
            owner,
            fencing_token,
            ttl,
            acquired_at,
            handle: None,
            session: None,
            hold: Hold::Exclusive,
        }
    }

    /// Sets what the grant holds (a mutex's lock unless set).
    #[must_use]
    pub fn with_hold(mut self, hold: Hold) -> Self {
        self.hold = hold;
        self
    }

    /// What the grant holds: the backend renews and releases it where that kind lives.
    pub fn hold(&self) -> Hold {
        self.hold
    }

    /// Attaches the backend's identifier of the server-side record (an etcd key, a znode path).
    #[must_use]
    pub fn with_handle(mut self, handle: impl Into<Arc<str>>) -> Self {
        self.handle = Some(handle.into());
        self
    }

    /// Attaches a token that the backend cancels when the session carrying this lease is gone
    /// (an etcd lease that could not be kept alive, an expired ZooKeeper session).
    #[must_use]
    pub fn with_session(mut self, session: CancellationToken) -> Self {
        self.session = Some(session);
        self
    }

    /// The lock's key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The secret owner token of this grant.
    pub fn owner(&self) -> &OwnerToken {
        &self.owner
    }

    /// The fencing token of this grant.
    pub fn fencing_token(&self) -> FencingToken {
        self.fencing_token
    }

    /// The TTL the lock was requested with.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the acquire request that produced this grant was sent.
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// The backend's identifier of the server-side record, if it needs one.
    pub fn handle(&self) -> Option<&str> {
        self.handle.as_deref()
    }

    /// Whether the session carrying this lease is still alive; `None` when the lease lives
    /// in no session. Read-only on purpose: the session's token is shared by every lock of
    /// the session, and only the backend that made it may end it.
    pub fn session_alive(&self) -> Option<bool> {
        self.session.as_ref().map(|session| !session.is_cancelled())
    }

    /// The session token, for the core's lost signal.
    pub(crate) fn session(&self) -> Option<&CancellationToken> {
        self.session.as_ref()
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("fencing_token", &self.fencing_token)
            .field("ttl", &self.ttl)
            .field("handle", &self.handle)
            .field("hold", &self.hold)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_is_one_percent_plus_two_milliseconds() {
        assert_eq!(
            clock_drift(Duration::from_secs(10), 0.01),
            Duration::from_millis(102)
        );
        assert_eq!(
            clock_drift(Duration::from_secs(10), 5.0),
            Duration::from_millis(10_002)
        );
    }

    #[test]
    fn validity_counts_from_the_send_time_minus_drift() {
        let sent = Instant::now();
        let deadline = validity_deadline(sent, Duration::from_secs(10), Duration::from_millis(102));
        assert_eq!(deadline, Some(sent + Duration::from_millis(9_898)));
    }

    #[test]
    fn no_validity_is_left_when_drift_eats_the_ttl() {
        let sent = Instant::now();
        assert_eq!(
            validity_deadline(sent, Duration::from_millis(2), Duration::from_millis(2)),
            None
        );
        assert_eq!(
            validity_deadline(sent, Duration::from_millis(1), Duration::from_millis(2)),
            None
        );
    }

    #[test]
    fn an_absurd_validity_from_a_server_is_capped_not_a_panic() {
        let sent = Instant::now();
        assert_eq!(
            validity_deadline(sent, Duration::MAX, Duration::from_millis(2)),
            Some(sent + crate::LockOptions::MAX_TTL)
        );
        assert_eq!(
            clock_drift(Duration::MAX, 1.0),
            Duration::MAX,
            "drift saturates"
        );
    }

    #[test]
    fn lease_debug_hides_the_owner_token() {
        let owner = OwnerToken::generate().expect("rng");
        let hex = owner.expose_hex();
        let key = LockKey::new("ns", "k").expect("key");
        let lease = Lease::new(
            key,
            owner,
            FencingToken(7),
            Duration::from_secs(1),
            Instant::now(),
        );
        let debug = format!("{lease:?}");
        assert!(!debug.contains(&hex), "{debug}");
        assert!(
            debug.contains("redacted") && debug.contains("FencingToken(7)"),
            "{debug}"
        );
    }
}
