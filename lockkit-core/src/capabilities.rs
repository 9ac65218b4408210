//! Reliability tiers and what each backend can do.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind};

/// How much a backend's mutual exclusion survives, weakest first.
///
/// The order is the one `require_tier` compares with: a configuration that requires
/// `quorum` refuses `single` and `replicated` backends at start-up.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// Inside one process only (the memory backend): nothing outside the process is excluded.
    Local,
    /// One server (a single Redis): the lock is gone, and may be granted twice, if that server
    /// restarts without durable persistence.
    Single,
    /// A primary with asynchronous replicas (Redis + Sentinel): a failover can lose a granted
    /// lock and grant it again.
    Replicated,
    /// A majority of independent servers (Redlock): survives a minority of crashed servers,
    /// but relies on bounded pauses and clock drift.
    Quorum,
    /// A consensus system (etcd, ZooKeeper): a grant is linearizable; only a holder paused past
    /// its lease can still act after losing the lock, which fencing tokens catch.
    Consensus,
}

impl Tier {
    /// All tiers, weakest first.
    pub const ALL: [Tier; 5] = [
        Tier::Local,
        Tier::Single,
        Tier::Replicated,
        Tier::Quorum,
        Tier::Consensus,
    ];

    /// The lowercase name used in configuration (`"single"`, `"consensus"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Local => "local",
            Tier::Single => "single",
            Tier::Replicated => "replicated",
            Tier::Quorum => "quorum",
            Tier::Consensus => "consensus",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Tier {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        Tier::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidConfig,
                    "config",
                    format!("unknown tier {s:?}; expected one of local, single, replicated, quorum, consensus"),
                )
            })
    }
}

/// How strong a backend's fencing tokens are.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FencingGuarantee {
    /// Strictly increasing across all grants of a key, under every fault the tier tolerates
    /// (etcd revisions, ZooKeeper zxids, the memory backend's counter).
    Monotonic,
    /// Strictly increasing while the servers keep their data; a failover with asynchronous
    /// replication or a restart without persistence can make a token repeat or go back.
    BestEffort,
}

/// How a waiter learns that a lock may have become free.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WaitStrategy {
    /// The backend cannot notify: waiters poll with jittered backoff.
    Poll,
    /// The backend notifies releases and wakes a waiter of the key, which retries at once;
    /// waiters poll when a notification could have been missed.
    Notify,
    /// Waiters queue in order and each watches only its predecessor: a release wakes exactly
    /// one waiter. The backend's wait must end by itself whenever the predecessor may have
    /// gone without the watch saying so: the watch, its connection or the session breaks.
    /// The core sets no timer of its own on such a wait (`max_wait` is the wait deadline, or
    /// [`Duration::MAX`](std::time::Duration::MAX) without one), so a missed wake-up is a
    /// waiter stuck until its deadline.
    Queue,
}

/// What a backend can do, declared by [`LockBackend::capabilities`](crate::backend::LockBackend::capabilities).
///
/// The conformance suite runs only the scenarios a backend claims.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Capabilities {
    /// How strong the fencing tokens are.
    pub fencing: FencingGuarantee,
    /// How waiters are woken.
    pub wait: WaitStrategy,
    /// The shortest TTL the backend honours (etcd rounds leases up to 2 s).
    pub min_ttl: Duration,
    /// Whether [`Election`](crate::Election)s work on this backend, and if not, why.
    pub election: Support,
    /// Whether [`Semaphore`](crate::Semaphore)s work on this backend, and if not, why.
    pub semaphore: Support,
    /// Whether [`RwLock`](crate::RwLock)s work on this backend, and if not, why.
    pub rwlock: Support,
}

/// Whether a backend supports a primitive beyond the mutex, and if not, why.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Support {
    /// The primitive works on this backend, with the backend's tier.
    Supported,
    /// The primitive is refused at creation with
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) and this reason.
    Unsupported(&'static str),
}

impl Support {
    /// Whether the primitive works on this backend.
    pub fn is_supported(self) -> bool {
        matches!(self, Support::Supported)
    }
}

impl Capabilities {
    /// Capabilities with the given fencing guarantee and wait strategy and no minimum TTL.
    pub fn new(fencing: FencingGuarantee, wait: WaitStrategy) -> Self {
        Capabilities {
            fencing,
            wait,
            min_ttl: Duration::ZERO,
            election: Support::Unsupported("this backend does not implement elections"),
            semaphore: Support::Unsupported("this backend does not implement semaphores"),
            rwlock: Support::Unsupported("this backend does not implement read-write locks"),
        }
    }

    /// Sets whether semaphores work on this backend.
    #[must_use]
    pub fn with_semaphore(mut self, semaphore: Support) -> Self {
        self.semaphore = semaphore;
        self
    }

    /// Sets whether read-write locks work on this backend.
    #[must_use]
    pub fn with_rwlock(mut self, rwlock: Support) -> Self {
        self.rwlock = rwlock;
        self
    }

    /// Sets whether elections work on this backend.
    #[must_use]
    pub fn with_election(mut self, election: Support) -> Self {
        self.election = election;
        self
    }

    /// Sets the shortest TTL the backend honours.
    #[must_use]
    pub fn with_min_ttl(mut self, min_ttl: Duration) -> Self {
        self.min_ttl = min_ttl;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_order_weakest_first_and_parse_their_names() {
        assert!(Tier::Local < Tier::Single && Tier::Quorum < Tier::Consensus);
        for t in Tier::ALL {
            assert_eq!(t.as_str().parse::<Tier>().expect("parse"), t);
        }
        let err = "strong".parse::<Tier>().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
        assert!(err.to_string().contains("consensus"));
    }
}
