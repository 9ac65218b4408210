//! Read-write locks on one Redis server or a Sentinel primary: the holders of a key's rwlock
//! (readers, or one writer) and the writers waiting for it, each operation one script
//! (`scripts/rwlock_*.lua`, after the queue's and the semaphore's preludes).
//!
//! # Construction
//! - **Holders** are a ZSET of owner digests scored by their expiry (ms, server clock: one
//!   clock decides), beside a HASH of their fencing tokens and the *writer* key, the digest
//!   of the holder that writes. Renewal and `is_held` are the semaphore's scripts on these
//!   keys (the writer key stands where the semaphore's permits count does, and lives as long
//!   as the holders).
//! - **Waiting writers** queue as a mutex's waiters do (`scripts/queue.lua`: a ZSET by turn
//!   and each one's entry, one TTL long, refreshed by each of its attempts): a write attempt
//!   that is refused and waits (`wait == true`) queues, its grant takes it out, an abandoned
//!   acquisition's clean-up takes it out. `try_write` queues nothing. Writers queue whatever
//!   [`LockOptions::fair`](lockkit_core::LockOptions::fair) says: the queue is what keeps a
//!   stream of readers from starving them, and it serves them in order.
//! - **The acquire script**, on the server's clock, first drops the expired holders and the
//!   lapsed entries ahead of the first live waiting writer, then grants a reader while no
//!   live writer holds and no writer waits, and a writer while nobody holds and no writer
//!   waits ahead of it. A lock that nobody holds while a writer waits goes to that writer
//!   (handed over, by whichever script finds it so: a release, or any attempt after the
//!   holders expired), announced on its inbox, so the writer holds it without another
//!   request. A retry of an owner that holds finds its grant (same token, extended).
//! - **Fencing**: every grant, read or write, takes `max(counter + 1, clock in µs)` from the
//!   rwlock's own counter, as the mutex and the semaphore do: a write grant comes after every
//!   earlier grant of the key, so its token is above all of theirs, also after the counter
//!   expired or was lost (unless the server's clock steps back).
//!
//! # Why it is correct
//! Each script runs atomically on one server and decides on what it sees after pruning, so
//! a writer is granted (or handed the lock) only when the holders set is empty, and while it
//! holds (it is in the set, marked as the writer) no reader or writer is granted. Readers
//! share because nothing but a writer, holding or waiting, refuses them. A stream of readers
//! cannot starve a writer: once its first attempt queued it, every new reader is refused, so
//! the readers holding drain within their TTL (sooner when they release) and the last one's
//! release hands the lock over. Writers are served in the order they queued: only the first
//! live one is ever granted while others wait.
//!
//! # What bounds a dead waiting writer
//! A waiting writer whose process died (or that stopped attempting without an abandon) keeps
//! new readers out until its entry lapses: one TTL after its last attempt; the first script
//! after that drops it and wakes the readers, and a lock handed to it lapses with its entry.
//! A live waiting writer refreshes its entry in time: it waits at most a third of its TTL
//! between attempts, woken or not (when polling, its pause is that plus a jitter of at most
//! `backoff_min`, so it keeps its entry while `backoff_min` stays below two thirds of the
//! TTL). A retryable error streak that outlasts the TTL lets the entry lapse: readers may
//! then go first, never in together with it.
//!
//! # Waking
//! A waiting writer is woken by its hand-over's announcement on its inbox. Readers wait on
//! the readers' channel (`...:rw:readers`): a writer's release or expiry, and a waiting
//! writer's entry going (abandoned or lapsed), wake one reader per process; a reader granted
//! after waiting passes the wake-up on to the next waiting reader of its process, since it
//! may share the lock too.

use std::time::Duration;

use lockkit_core::backend::{AcquireRequest, Attempt, Grant, Hold, Lease, OwnerToken};
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
    /// The waiting writers' queue: ZSET owner digest -> turn (`scripts/queue.lua`).
    pub(crate) waiting: String,
    /// HASH owner digest -> the waiting writer's entry (`scripts/queue.lua`).
    pub(crate) entries: String,
    /// The mutex key of the rwlock's name, which a Cluster's inbox channels carry.
    pub(crate) lock: String,
    /// Where waiting readers listen: a writer (holding or waiting) went.
    pub(crate) readers_channel: String,
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
            entries: format!("{base}:waiting:entries"),
            lock: crate::scripts::Keys::of(key).lock,
            readers_channel: format!("lockkit:released:{base}:readers"),
        }
    }

    /// The keys in the order the scripts take them.
    fn all(&self) -> [&str; 6] {
        [
            &self.holders,
            &self.tokens,
            &self.writer,
            &self.fence,
            &self.waiting,
            &self.entries,
        ]
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
        match Self::code_and_number(value)? {
            (1, n) => u64::try_from(n)
                .map(|t| RwReply::Granted(FencingToken(t)))
                .map_err(|_| unexpected()),
            (0, n) => Ok(RwReply::Blocked(Duration::from_millis(
                u64::try_from(n).unwrap_or(0),
            ))),
            _ => Err(unexpected()),
        }
    }

    fn is_grant(&self) -> bool {
        matches!(self, RwReply::Granted(_))
    }
}

/// How long a refused request may wait before its next attempt: until the first of what
/// keeps it out expires, and a waiting writer no longer than a third of its TTL, so that it
/// refreshes its entry (one TTL long) in time.
fn retry_after(request: &AcquireRequest, blocked_for: Duration) -> Duration {
    if request.hold == Hold::Write && request.wait {
        blocked_for.min(request.ttl / 3)
    } else {
        blocked_for
    }
}

/// The rwlock's release script for `owner`'s read or write lock of `key`, which takes its
/// waiting writer out of the queue too (see [`RedisBackend::release_on`]).
pub(crate) fn release_invocation(
    publishing: &'static Publishing,
    key: &LockKey,
    owner: &OwnerToken,
    fence_ttl: Duration,
) -> ScriptInvocation<'static> {
    let keys = RwKeys::of(key);
    let mut invocation = publishing.rwlock_release.prepare_invoke();
    invocation
        .key(&keys.all()[..])
        .arg(owner.digest_hex())
        .arg(&keys.readers_channel)
        .arg(millis(fence_ttl))
        .arg(&keys.lock);
    invocation
}

impl RedisBackend {
    /// One attempt at a read or the write lock of `request.key`'s rwlock.
    pub(crate) async fn try_acquire_rw(&self, request: &AcquireRequest) -> Result<Attempt> {
        if !matches!(request.hold, Hold::Read | Hold::Write) {
            return Err(request.hold.unsupported(BACKEND));
        }
        let keys = RwKeys::of(&request.key);
        let waiter = self.register(request, &keys.readers_channel);
        let [queue, name, inbox] = self.queue_args(&waiter);
        let writes = request.hold == Hold::Write;
        let args = [
            request.owner.digest_hex(),
            millis(request.ttl).to_string(),
            if writes { "write" } else { "read" }.to_owned(),
            queue,
            millis(self.config.fence_ttl).to_string(),
            keys.readers_channel.clone(),
            name,
            inbox,
            keys.lock.clone(),
        ];
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
                if !writes && request.wait {
                    // Woken by a writer's going, this reader may not be the only one that can
                    // read now: the next waiting reader of this process tries too.
                    self.primary.epoch().notifier.pass_on(&keys.readers_channel);
                }
                Ok(waiter.granted(Grant::new(token, request.ttl)))
            }
            RwReply::Blocked(blocked_for) => {
                Ok(waiter.contended(request, Some(retry_after(request, blocked_for))))
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
            &permits.queue,
            &permits.entries,
        ];
        for k in keys.all() {
            assert!(
                crate::listing::lock_of("ns", k).is_none(),
                "{k} lists as a lock"
            );
            assert_eq!(k.rfind('}'), Some("{ns/config".len()), "{k}");
            assert!(!others.iter().any(|other| other.as_str() == k), "{k}");
        }
        assert_ne!(keys.readers_channel, mutex.channel);
        assert_ne!(keys.readers_channel, permits.channel);
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
