//! The types a backend and the core exchange: what an acquisition asks to hold, one
//! attempt and what it produced, a renewal's answer, and what a backend tells of a lock.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::key::LockKey;
use crate::token::{FencingToken, OwnerToken};

/// What an acquisition asks to hold.
///
/// A backend keeps the holders of each kind apart: the semaphore named `jobs` and the mutex
/// named `jobs` are two independent things (one does not block the other), each under the
/// key's namespace, where the conformance suite looks for leftovers.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hold {
    /// The key's only holder: a [`Mutex`](crate::Mutex) (or an election's leader).
    Exclusive,
    /// One of `permits` holders of a [`Semaphore`](crate::Semaphore): a grant while fewer
    /// than `permits` grants of the key are live. The backend records `permits` with the
    /// semaphore while it has holders (and, on a queueing backend, waiters) and refuses a
    /// request with another count with [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig).
    Permit {
        /// How many holders the semaphore admits at once, `1..=`[`MAX_PERMITS`](crate::MAX_PERMITS).
        permits: u32,
    },
    /// A reader of an [`RwLock`](crate::RwLock): a grant while no writer holds the key and
    /// none waits for it. Readers share; a writer that waits blocks new readers, so a stream
    /// of readers cannot starve it.
    Read,
    /// The writer of an [`RwLock`](crate::RwLock): a grant while nobody else (reader or
    /// writer) holds the key. Its fencing token is above every earlier grant's of the key,
    /// read or write.
    Write,
}

impl Hold {
    /// The error a backend returns for a permit request whose count disagrees with the one
    /// the semaphore's current holders (or waiters) recorded.
    pub fn permits_mismatch(
        backend: &'static str,
        key: &LockKey,
        asked: u32,
        recorded: u32,
    ) -> crate::Error {
        crate::Error::new(
            crate::ErrorKind::InvalidConfig,
            backend,
            format!(
                "semaphore {key} has {recorded} permits while it is in use, and this client asked for {asked}: every client of a semaphore must agree on its permits"
            ),
        )
    }

    /// The error a backend returns for a kind of hold it does not implement (the core
    /// refuses those first, by [`Capabilities`](crate::Capabilities); this covers a backend called directly).
    pub fn unsupported(self, backend: &'static str) -> crate::Error {
        crate::Error::new(
            crate::ErrorKind::Unsupported,
            backend,
            format!("this backend does not implement {self:?} holds"),
        )
    }
}

/// One attempt to take a lock, as passed to [`LockBackend::try_acquire`](super::LockBackend::try_acquire).
///
/// The owner token is fresh for every acquisition and stays the same across the attempts of
/// one acquisition, so a backend can find what an earlier attempt left on the server (a queue
/// entry, or a grant whose reply was lost).
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// The lock to take.
    pub key: LockKey,
    /// The secret token that will prove ownership of the grant.
    pub owner: OwnerToken,
    /// How long the grant lives without renewal.
    pub ttl: Duration,
    /// Whether the caller will wait on contention. When `false` (`try_lock`), a queueing
    /// backend should not leave a queue entry behind.
    pub wait: bool,
    /// What the acquisition holds once granted.
    pub hold: Hold,
    /// Whether a waiter queues for its turn (`true`) or tries again when the lock is freed,
    /// taking it if nobody was faster (`false`; see
    /// [`LockOptions::fair`](crate::LockOptions::fair)). A backend whose locks are queues by
    /// construction may treat every request as fair.
    pub fair: bool,
}

impl AcquireRequest {
    /// A request for `key`'s mutex, owned by `owner`, living `ttl` without renewal.
    pub fn new(key: LockKey, owner: OwnerToken, ttl: Duration, wait: bool) -> Self {
        AcquireRequest {
            key,
            owner,
            ttl,
            wait,
            hold: Hold::Exclusive,
            fair: true,
        }
    }

    /// The same request, fair or not (see [`AcquireRequest::fair`]).
    #[must_use]
    pub fn with_fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// The same request for another kind of hold.
    #[must_use]
    pub fn with_hold(mut self, hold: Hold) -> Self {
        self.hold = hold;
        self
    }
}

/// What one acquisition attempt produced.
#[derive(Debug)]
pub enum Attempt {
    /// The lock is ours.
    Granted(Grant),
    /// Someone else holds the lock (or is ahead in the queue).
    Contended(Contention),
}

/// A successful grant, before the core turns it into a [`Lease`](super::Lease).
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct Grant {
    /// The fencing token of this grant.
    pub fencing_token: FencingToken,
    /// How long the grant is valid, counted from when the request was sent. The core takes
    /// clock drift off this; a quorum backend also takes off the time its fan-out took.
    pub valid_for: Duration,
    /// The backend's identifier of the server-side record, if it needs one later.
    pub handle: Option<Arc<str>>,
    /// A token the backend cancels when the session holding the grant is gone.
    pub session: Option<CancellationToken>,
}

impl Grant {
    /// A grant with a fencing token, valid for `valid_for` from the send time.
    pub fn new(fencing_token: FencingToken, valid_for: Duration) -> Self {
        Grant {
            fencing_token,
            valid_for,
            handle: None,
            session: None,
        }
    }

    /// Sets the backend's identifier of the server-side record.
    #[must_use]
    pub fn with_handle(mut self, handle: impl Into<Arc<str>>) -> Self {
        self.handle = Some(handle.into());
        self
    }

    /// Sets the session token: the backend cancels it when the session holding the grant is
    /// gone, which fires the lost signal of every lock of the session.
    #[must_use]
    pub fn with_session(mut self, session: CancellationToken) -> Self {
        self.session = Some(session);
        self
    }
}

/// What a contended attempt learned, handed back to [`LockBackend::wait_for_change`](super::LockBackend::wait_for_change).
#[non_exhaustive]
#[derive(Debug, Clone, Default)]
pub struct Contention {
    /// The longest the current holder can keep the lock without renewing: a waiter never
    /// sleeps past it.
    pub retry_after: Option<Duration>,
    /// The queue entry just ahead of ours, for queueing backends (etcd key, znode name).
    pub predecessor: Option<String>,
    /// The store revision the attempt observed, so a watch can start there and miss nothing.
    pub revision: Option<i64>,
    /// The number of the acquisition's own queue entry, for backends whose releases grant
    /// the next entry themselves (a hand-over): the wait takes a hand-over for this entry
    /// only, never for one an earlier attempt had and lost.
    pub entry: Option<i64>,
    /// A marker the backend took just before sending the attempt (for example how many
    /// notifications it had received), so its wait can tell whether a change came in since.
    pub marker: Option<u64>,
    /// The server's answer says that this attempt left nothing of the acquisition there (no
    /// grant, no queue entry, no waiting record). A `try_lock` (one attempt; an error ends it,
    /// with a clean-up) that gets such an answer sends no clean-up ([`LockBackend::abandon`](super::LockBackend::abandon)).
    /// Set it only when the answer proves it: a queueing backend that removed its entry in
    /// the attempt may, and a Redis script that writes only when it grants does.
    pub nothing_left: bool,
}

impl Contention {
    /// Contention with nothing known about the holder.
    pub fn new() -> Self {
        Contention::default()
    }

    /// Sets how long the holder can keep the lock without renewing.
    #[must_use]
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = Some(retry_after);
        self
    }

    /// Sets the predecessor to watch and the revision the attempt observed.
    #[must_use]
    pub fn with_predecessor(
        mut self,
        predecessor: impl Into<String>,
        revision: Option<i64>,
    ) -> Self {
        self.predecessor = Some(predecessor.into());
        self.revision = revision;
        self
    }
    /// Sets the number of the acquisition's own queue entry.
    #[must_use]
    pub fn with_entry(mut self, entry: i64) -> Self {
        self.entry = Some(entry);
        self
    }

    /// Says that the attempt left nothing on the server (see [`Contention::nothing_left`]).
    #[must_use]
    pub fn with_nothing_left(mut self) -> Self {
        self.nothing_left = true;
        self
    }

    /// Sets the marker taken before the attempt.
    #[must_use]
    pub fn with_marker(mut self, marker: u64) -> Self {
        self.marker = Some(marker);
        self
    }
}

/// The answer to a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The lease is ours and valid for this long from when the renewal was sent.
    Extended(Duration),
    /// The lease is not ours any more: it expired or was taken away.
    Lost,
}

/// What a backend can tell about a lock, without its secrets.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    /// The current holder's fencing token.
    pub fencing_token: FencingToken,
    /// How long the holder keeps the lock without renewing, if the backend knows.
    pub remaining_ttl: Option<Duration>,
    /// How many contenders are queued behind the holder, for queueing backends.
    pub waiters: Option<usize>,
}

impl LockInfo {
    /// Information about a held lock.
    pub fn new(fencing_token: FencingToken) -> Self {
        LockInfo {
            fencing_token,
            remaining_ttl: None,
            waiters: None,
        }
    }

    /// Sets the holder's remaining TTL.
    #[must_use]
    pub fn with_remaining_ttl(mut self, remaining: Duration) -> Self {
        self.remaining_ttl = Some(remaining);
        self
    }

    /// Sets the number of queued contenders.
    #[must_use]
    pub fn with_waiters(mut self, waiters: usize) -> Self {
        self.waiters = Some(waiters);
        self
    }
}

/// One page of held locks, from [`LockBackend::list`](super::LockBackend::list) (or
/// [`LockClient::list_page`](crate::LockClient::list_page)).
#[non_exhaustive]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockPage {
    /// The held locks of this page, with what the backend knows about each.
    pub locks: Vec<(LockKey, LockInfo)>,
    /// Where the next page starts (pass it back as the cursor); `None` after the last page.
    /// A page may be short, or even empty, while more follow.
    pub next: Option<String>,
}

impl LockPage {
    /// A page of `locks`, followed by the page at `next`.
    pub fn new(locks: Vec<(LockKey, LockInfo)>, next: Option<String>) -> Self {
        LockPage { locks, next }
    }
}
