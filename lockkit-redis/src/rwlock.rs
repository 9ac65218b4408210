//! Read-write locks on one Redis server or a Sentinel primary: the holders of a key's rwlock
//! (readers, or one writer) and the writers waiting for it, each operation one script
//! (`scripts/rwlock_*.lua`, after the semaphore's prelude).
//!
//! # Construction
//! - **Holders** are a ZSET of owner digests scored by their expiry (ms, server clock: one
//!   clock decides), beside a HASH of their fencing tokens and the *writer* key, the digest
//!   of the holder that writes. Renewal and `is_held` are the semaphore's scripts on these
//!   keys (the writer key stands where the semaphore's permits count does, and lives as long
//!   as the holders).
//! - **A waiting writer** is a member of the waiting ZSET, scored by `now + TTL`: a write
//!   attempt that is refused and waits (`wait == true`) records or refreshes it, its grant
//!   removes it, an abandoned acquisition's clean-up removes it. `try_write` records nothing.
//! - **The acquire script**, on the server's clock, first drops the expired holders and
//!   records, then grants a reader while no live writer holds and no live record exists,
//!   and a writer while there is no holder at all. A retry of an owner that holds finds its
//!   grant (same token, extended).
//! - **Fencing**: every grant, read or write, takes `max(counter + 1, clock in µs)` from the
//!   rwlock's own counter, as the mutex and the semaphore do: a write grant comes after every
//!   earlier grant of the key, so its token is above all of theirs, also after the counter
//!   expired or was lost (unless the server's clock steps back).
//!
//! # Why it is correct
//! Each script runs atomically on one server and decides on what it sees after pruning, so
//! a writer is granted only when the holders set is empty, and while it holds (it is in the
//! set, marked as the writer) no reader or writer is granted. Readers share because nothing
//! but a writer, holding or waiting, refuses them. A stream of readers cannot starve a
//! writer: once its first attempt recorded it, every new reader is refused, so the readers
//! holding drain within their TTL (sooner when they release) and the writer's next attempt
//! is granted. Writers among themselves race (no order among waiting writers).
//!
//! # What bounds a dead waiting writer
//! A waiting writer whose process died (or that stopped attempting without an abandon) keeps
//! new readers out until its record expires: one TTL after its last attempt, and the first
//! reader attempt after that removes it and wakes the other readers. A live waiting writer
//! refreshes its record in time: its contention hint is at most a third of its TTL, and the
//! core waits no longer than the hint, woken or not (with notifications; when polling, its
//! pause is the hint plus a jitter of at most `backoff_min`, so it keeps the record while
//! `backoff_min` stays below two thirds of the TTL). A retryable error streak that outlasts
//! the TTL lets the record lapse: readers may then go first, never in together with it.
//!
//! # Waking
//! Readers and writers wait on two channels, so that one release wakes a waiter that can
//! use it (a release wakes one waiter per process and channel): a reader's release, an
//! expired holder, wake a writer (`...:rw:writers`); a writer's release or expiry, and a
//! waiting writer's record going (abandoned or expired), wake a reader (`...:rw:readers`).
//! A reader granted after waiting passes the wake-up on to the next waiting reader of its
//! process, since it may share the lock too.

use std::time::Duration;

use lockkit_core::backend::{AcquireRequest, Attempt, Contention, Grant, Hold, Lease, OwnerToken};
use lockkit_core::{FencingToken, LockKey, Result};
use redis::{ScriptInvocation, Value};

use crate::acquire::AcquireScriptReply;
use crate::backend::RedisBackend;
use crate::error::{BACKEND, unexpected};
use crate::scripts::{Publishing, millis};

/// The Redis names of one read-write lock.
///
/// Every key is `{namespace/name}:rw:...`, under the hash tag of the mutex and the semaphore
/// of that name, with suffixes that neither end in `}` nor contain one (the rules of
/// [`PermitKeys`](crate::semaphore::PermitKeys)): so the last `}` of a key ends its name, no
/// rwlock key equals a key of a mutex, a semaphore or another rwlock, and listing never
/// shows one. The fence counter ends in `:fence`, as a counter that outlives its holders.
#[derive(Debug, Clone)]
pub(crate) struct RwKeys {
    /// ZSET: owner digest -> expiry (ms, server clock).
    pub(crate) holders: String,
    /// HASH: owner digest -> fencing token.
    pub(crate) tokens: String,
    /// The owner digest of the holder that writes.
    pub(crate) writer: String,
    /// The counter every grant increments.
    pub(crate) fence: String,
    /// ZSET: waiting writer's owner digest -> expiry of its record (ms, server clock).
    pub(crate) waiting: String,
    /// Where waiting readers listen: a writer (holding or waiting) went.
    pub(crate) readers_channel: String,
    /// Where waiting writers listen: a holder went.
    pub(crate) writers_channel: String,
}

impl RwKeys {
    pub(crate) fn of(key: &LockKey) -> Self {
        let base = format!("{{{}/{}}}:rw", key.namespace(), key.name());
        RwKeys {
            holders: format!("{base}:holders"),
            tokens: format!("{base}:tokens"),
            writer: format!("{base}:writer"),
            fence: format!("{base}:fence"),
            waiting: format!("{base}:waiting"),
            readers_channel: format!("lockkit:released:{base}:readers"),
            writers_channel: format!("lockkit:released:{base}:writers"),
        }
    }

    /// The keys in the order the scripts take them.
    fn all(&self) -> [&str; 5] {
        [
            &self.holders,
            &self.tokens,
            &self.writer,
            &self.fence,
            &self.waiting,
        ]
    }

    /// The channel waiters for `hold` listen on.
    pub(crate) fn channel(&self, hold: Hold) -> &str {
        if hold == Hold::Write {
            &self.writers_channel
        } else {
            &self.readers_channel
        }
    }
}

/// Adds a read or write lock's renewal to a renewal pipeline (see
/// [`renew_pipeline`](crate::scripts::renew_pipeline)): the semaphore's renew script on the
/// rwlock's keys.
pub(crate) fn push_renewal(pipe: &mut redis::Pipeline, lease: &Lease, fence_ttl: Duration) {
    let keys = RwKeys::of(lease.key());
    // A reader leaves the writer's marker out: it exists only while a writer holds. A
    // writer keeps it alive with its grant (readers are kept out while it lives).
    let mut named = vec![keys.holders.as_str(), &keys.tokens, &keys.fence];
    if lease.hold() == Hold::Write {
        named.push(&keys.writer);
    }
    crate::semaphore::push_holder_renewal(pipe, &named, lease, fence_ttl);
}

/// The reply of the rwlock's acquire script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RwReply {
    Granted(FencingToken),
    /// Kept out; the first of what keeps it out expires after this long.
    Blocked(Duration),
}

impl AcquireScriptReply for RwReply {
    const WHAT: &'static str = "acquiring a read-write lock";
    const SCRIPT: &'static str = "the rwlock's acquire script";

    fn parse(value: &Value) -> Result<Self> {
        let unexpected = || unexpected(BACKEND, Self::SCRIPT);
        let Value::Array(items) = value else {
            return Err(unexpected());
        };
        let [Value::Int(code), Value::Int(n)] = items.as_slice() else {
            return Err(unexpected());
        };
        match code {
            1 => u64::try_from(*n)
                .map(|t| RwReply::Granted(FencingToken(t)))
                .map_err(|_| unexpected()),
            0 => Ok(RwReply::Blocked(Duration::from_millis(
                u64::try_from(*n).unwrap_or(0),
            ))),
            _ => Err(unexpected()),
        }
    }

    fn is_grant(&self) -> bool {
        matches!(self, RwReply::Granted(_))
    }
}

/// The acquire script's arguments for `request`.
fn acquire_args(keys: &RwKeys, request: &AcquireRequest, fence_ttl: Duration) -> [String; 7] {
    [
        request.owner.digest_hex(),
        millis(request.ttl).to_string(),
        if request.hold == Hold::Write {
            "write"
        } else {
            "read"
        }
        .to_owned(),
        if request.wait { "1" } else { "0" }.to_owned(),
        millis(fence_ttl).to_string(),
        keys.readers_channel.clone(),
        keys.writers_channel.clone(),
    ]
}

/// How long a refused request may wait before its next attempt: until the first of what
/// keeps it out expires, and a waiting writer no longer than a third of its TTL, so that it
/// refreshes its record (one TTL long) in time.
fn retry_after(request: &AcquireRequest, blocked_for: Duration) -> Duration {
    if request.hold == Hold::Write && request.wait {
        blocked_for.min(request.ttl / 3)
    } else {
        blocked_for
    }
}

/// The rwlock's release script for `owner`'s read or write lock of `key`, which drops its
/// waiting writer record too (see [`RedisBackend::release_on`]).
pub(crate) fn release_invocation(
    publishing: &'static Publishing,
    key: &LockKey,
    owner: &OwnerToken,
) -> ScriptInvocation<'static> {
    let keys = RwKeys::of(key);
    let mut invocation = publishing.rwlock_release.prepare_invoke();
    invocation
        .key(&keys.all()[..])
        .arg(owner.digest_hex())
        .arg(&keys.readers_channel)
        .arg(&keys.writers_channel);
    invocation
}

impl RedisBackend {
    /// One attempt at a read or the write lock of `request.key`'s rwlock.
    pub(crate) async fn try_acquire_rw(&self, request: &AcquireRequest) -> Result<Attempt> {
        if !matches!(request.hold, Hold::Read | Hold::Write) {
            return Err(request.hold.unsupported(BACKEND));
        }
        let keys = RwKeys::of(&request.key);
        let marker = request
            .wait
            .then(|| {
                self.primary
                    .epoch()
                    .notifier
                    .marker(keys.channel(request.hold))
            })
            .flatten();
        let args = acquire_args(&keys, request, self.config.fence_ttl);
        let reply: RwReply = self
            .acquire_with(
                request,
                &self.publishing().rwlock_acquire,
                &keys.all(),
                &args,
            )
            .await?;
        match reply {
            RwReply::Granted(token) => {
                if request.hold == Hold::Read && request.wait {
                    // Woken by a writer's going, this reader may not be the only one that can
                    // read now: the next waiting reader of this process tries too.
                    self.primary.epoch().notifier.pass_on(&keys.readers_channel);
                }
                Ok(Attempt::Granted(Grant::new(token, request.ttl)))
            }
            RwReply::Blocked(blocked_for) => {
                let mut contention =
                    Contention::new().with_retry_after(retry_after(request, blocked_for));
                // Only a writer that waits leaves something when refused: its record.
                if !(request.hold == Hold::Write && request.wait) {
                    contention = contention.with_nothing_left();
                }
                Ok(Attempt::Contended(match marker {
                    Some(marker) => contention.with_marker(marker),
                    None => contention,
                }))
            }
        }
    }

    /// Whether `lease` still holds its read or write lock: its owner is a live holder with
    /// its token.
    pub(crate) async fn holds_rw(&self, lease: &Lease) -> Result<bool> {
        let keys = RwKeys::of(lease.key());
        self.holds_in(
            &keys.holders,
            &keys.tokens,
            lease,
            "checking a read-write lock",
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripts;
    use crate::semaphore::PermitKeys;

    #[test]
    fn rwlock_keys_are_apart_from_every_other_key() {
        let key = LockKey::new("ns", "config").expect("a valid key");
        let keys = RwKeys::of(&key);
        assert_eq!(keys.holders, "{ns/config}:rw:holders");
        assert_eq!(keys.waiting, "{ns/config}:rw:waiting");
        assert_eq!(keys.fence, "{ns/config}:rw:fence");
        assert_eq!(
            keys.readers_channel,
            "lockkit:released:{ns/config}:rw:readers"
        );
        assert_eq!(
            keys.writers_channel,
            "lockkit:released:{ns/config}:rw:writers"
        );
        let mutex = scripts::Keys::of(&key);
        let permits = PermitKeys::of(&key);
        let others = [
            &mutex.lock,
            &mutex.fence,
            &mutex.value,
            &permits.holders,
            &permits.tokens,
            &permits.permits,
            &permits.fence,
        ];
        for k in keys.all() {
            assert!(
                crate::listing::lock_of("ns", k).is_none(),
                "{k} lists as a lock"
            );
            assert_eq!(k.rfind('}'), Some("{ns/config".len()), "{k}");
            assert!(!others.iter().any(|other| other.as_str() == k), "{k}");
        }
        for channel in [&keys.readers_channel, &keys.writers_channel] {
            assert_ne!(channel, &mutex.channel);
            assert_ne!(channel, &permits.channel);
        }
        // A name holding '}' ends its hash tag early, but its keys stay its own.
        let odd = LockKey::new("ns", "config}:rw:holders").expect("a valid key");
        assert_ne!(scripts::Keys::of(&odd).lock, keys.holders);
        assert_ne!(PermitKeys::of(&odd).holders, keys.holders);
        assert_ne!(RwKeys::of(&odd).holders, keys.holders);
    }

    #[test]
    fn an_unexpected_rwlock_reply_is_an_error() {
        let reply = |items: Vec<Value>| RwReply::parse(&Value::Array(items));
        assert_eq!(
            reply(vec![Value::Int(1), Value::Int(7)]).ok(),
            Some(RwReply::Granted(FencingToken(7)))
        );
        assert_eq!(
            reply(vec![Value::Int(0), Value::Int(250)]).ok(),
            Some(RwReply::Blocked(Duration::from_millis(250)))
        );
        for bad in [
            vec![Value::Int(1)],
            vec![Value::Int(1), Value::Int(-1)],
            vec![Value::Int(2), Value::Int(3)],
            vec![Value::Nil, Value::Int(1)],
        ] {
            assert!(
                reply(bad.clone()).is_err(),
                "{bad:?} was taken for an answer"
            );
        }
    }

    #[test]
    fn read_and_write_leases_renew_in_the_shared_pipeline_on_the_rwlock_keys() {
        let key = LockKey::new("ns", "config").expect("a valid key");
        let owner = lockkit_core::backend::OwnerToken::generate().expect("an owner token");
        let lease = |hold| {
            Lease::new(
                key.clone(),
                owner.clone(),
                FencingToken(7),
                Duration::from_secs(5),
                std::time::Instant::now(),
            )
            .with_hold(hold)
        };
        let leases = [
            lease(Hold::Read),
            lease(Hold::Write),
            lease(Hold::Exclusive),
        ];
        // The one pipeline `renew_batch` sends on the renewal connection, whose READONLY or
        // MASTERDOWN replies (`scripts::primary_moved`) make it follow a failover.
        let pipe = scripts::renew_pipeline(&leases, Duration::from_secs(3600), None);
        let packed = String::from_utf8_lossy(&pipe.get_packed_pipeline()).into_owned();
        let renewals = packed.matches(scripts::SEMAPHORE_RENEW.get_hash()).count();
        assert_eq!(renewals, 2, "one semaphore-style renewal per rwlock lease");
        let keys = RwKeys::of(&key);
        for k in [&keys.holders, &keys.tokens, &keys.fence] {
            assert_eq!(packed.matches(k.as_str()).count(), 2, "{k}");
        }
        assert_eq!(
            packed.matches(keys.writer.as_str()).count(),
            1,
            "only the write lease names the writer's marker"
        );
        assert!(
            !packed.contains(&scripts::Keys::of(&key).value),
            "a lock that proclaimed nothing names no value key"
        );
        assert!(
            !packed.contains(&keys.waiting),
            "a renewal touches no waiting record"
        );
        assert!(packed.contains(&owner.digest_hex()));
    }

    #[test]
    fn a_waiting_writer_retries_within_a_third_of_its_ttl() {
        let key = LockKey::new("ns", "config").expect("a valid key");
        let owner = lockkit_core::backend::OwnerToken::generate().expect("an owner token");
        let ttl = Duration::from_secs(30);
        let long = Duration::from_secs(60);
        let request =
            |hold, wait| AcquireRequest::new(key.clone(), owner.clone(), ttl, wait).with_hold(hold);
        assert_eq!(retry_after(&request(Hold::Write, true), long), ttl / 3);
        assert_eq!(
            retry_after(&request(Hold::Write, true), Duration::from_secs(1)),
            Duration::from_secs(1)
        );
        assert_eq!(retry_after(&request(Hold::Write, false), long), long);
        assert_eq!(retry_after(&request(Hold::Read, true), long), long);
    }
}
