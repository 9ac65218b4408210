//! Semaphores on one Redis server or a Sentinel primary: the permits of a key are a ZSET of
//! owner digests scored by their expiry, a HASH of their fencing tokens and the permits count
//! they agreed on, each operation one script (`scripts/semaphore_*.lua`).
//!
//! A fair semaphore (the default, [`LockOptions::fair`](lockkit_core::LockOptions::fair)) is
//! FIFO as the mutex is: its waiters queue in its attempt's script (`scripts/queue.lua`), a
//! permit that frees up (a release, or a holder that expired, found by the next script) goes
//! to the first live waiter and is announced on that waiter's inbox, so the waiter holds it
//! without another request, and no later acquirer takes a permit while one waits. A non-fair
//! attempt runs the same script without the queue: it takes a permit that is free, and its
//! waiter listens on the release channel. Both exclude each other through the one holders set.

use std::time::Duration;

use lockkit_core::backend::{AcquireRequest, Attempt, Grant, Hold, Lease, OwnerToken};
use lockkit_core::{Error, ErrorKind, FencingToken, LockKey, Result};
use redis::{ScriptInvocation, Value};

use crate::acquire::AcquireScriptReply;
use crate::backend::RedisBackend;
use crate::error::{BACKEND, unexpected};
use crate::scripts::{self, Publishing, millis};

/// The Redis names of one semaphore.
///
/// Every key is `{namespace/name}:sem:...`: the semaphore's hash tag (the mutex's of the same
/// name, so both would sit in one Cluster slot), with suffixes that neither end in `}` (which
/// every lock key does) nor contain one. The last `}` of a key therefore ends its name, so no
/// semaphore key equals a key of a mutex or of another semaphore, and listing, which takes
/// only keys ending in `}`, never shows one. The fence counter ends in `:fence` like the
/// mutex's, as counters that outlive their holders by design.
#[derive(Debug, Clone)]
pub(crate) struct PermitKeys {
    /// ZSET: owner digest -> expiry (ms, server clock).
    pub(crate) holders: String,
    /// HASH: owner digest -> fencing token.
    pub(crate) tokens: String,
    /// The permits count the holders agreed on.
    pub(crate) permits: String,
    /// The counter every grant increments.
    pub(crate) fence: String,
    /// A fair semaphore's waiters: ZSET owner digest -> turn (`scripts/queue.lua`).
    pub(crate) queue: String,
    /// HASH owner digest -> the waiter's entry (`scripts/queue.lua`).
    pub(crate) entries: String,
    /// The mutex key of the semaphore's name, which a Cluster's inbox channels carry.
    pub(crate) lock: String,
    /// Where releases (and expiries found by an attempt) are published.
    pub(crate) channel: String,
}

impl PermitKeys {
    pub(crate) fn of(key: &LockKey) -> Self {
        let base = format!("{{{}/{}}}:sem", key.namespace(), key.name());
        PermitKeys {
            holders: format!("{base}:holders"),
            tokens: format!("{base}:tokens"),
            permits: format!("{base}:permits"),
            fence: format!("{base}:fence"),
            queue: format!("{base}:queue"),
            entries: format!("{base}:entries"),
            lock: scripts::Keys::of(key).lock,
            channel: format!("lockkit:released:{base}"),
        }
    }

    /// The keys of the acquire and release scripts, in their order, queue included.
    fn scripts(&self) -> [&str; 6] {
        [
            &self.holders,
            &self.tokens,
            &self.permits,
            &self.fence,
            &self.queue,
            &self.entries,
        ]
    }
}

/// The release channel that waiters for `hold` of `key` that do not queue listen on (a
/// writer always queues: the readers' channel is the rwlock's only one).
pub(crate) fn channel_of(key: &LockKey, hold: Hold) -> String {
    match hold {
        Hold::Permit { .. } => PermitKeys::of(key).channel,
        Hold::Read | Hold::Write => crate::rwlock::RwKeys::of(key).readers_channel,
        _ => scripts::Keys::of(key).channel,
    }
}

/// Adds a permit's renewal to a renewal pipeline (see [`scripts::renew_pipeline`]).
pub(crate) fn push_renewal(pipe: &mut redis::Pipeline, lease: &Lease, fence_ttl: Duration) {
    let keys = PermitKeys::of(lease.key());
    push_holder_renewal(
        pipe,
        &[&keys.holders, &keys.tokens, &keys.fence, &keys.permits],
        lease,
        fence_ttl,
    );
}

/// Adds the semaphore's renew script for `lease` on `keys` (holders, tokens, fence counter,
/// and the key that lives with the holders if the lease keeps one alive) to a renewal
/// pipeline; the read-write locks use it too.
pub(crate) fn push_holder_renewal(
    pipe: &mut redis::Pipeline,
    keys: &[&str],
    lease: &Lease,
    fence_ttl: Duration,
) {
    pipe.cmd("EVALSHA")
        .arg(scripts::SEMAPHORE_RENEW.get_hash())
        .arg(keys.len())
        .arg(keys)
        .arg(lease.owner().digest_hex())
        .arg(millis(lease.ttl()))
        .arg(millis(fence_ttl));
}

/// The reply of the semaphore's acquire script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PermitReply {
    Granted(FencingToken),
    /// Every permit is held; the first holder expires after this long.
    Full(Duration),
    /// The holders agreed on this many permits.
    Mismatch(u32),
}

impl AcquireScriptReply for PermitReply {
    const WHAT: &'static str = "acquiring a permit";
    const SCRIPT: &'static str = "the semaphore's acquire script";

    fn parse(value: &Value) -> Result<Self> {
        let unexpected = || unexpected(BACKEND, Self::SCRIPT);
        match Self::code_and_number(value)? {
            (1, n) => u64::try_from(n)
                .map(|t| PermitReply::Granted(FencingToken(t)))
                .map_err(|_| unexpected()),
            (0, n) => Ok(PermitReply::Full(Duration::from_millis(
                u64::try_from(n).unwrap_or(0),
            ))),
            (2, n) => u32::try_from(n)
                .map(PermitReply::Mismatch)
                .map_err(|_| unexpected()),
            _ => Err(unexpected()),
        }
    }

    fn is_grant(&self) -> bool {
        matches!(self, PermitReply::Granted(_))
    }
}

/// The semaphore's release script for `owner`'s permit of `key`, and its own queue entry of
/// a wait it gives up (see [`RedisBackend::release_on`]); a free permit goes to the first
/// fair waiter queued.
pub(crate) fn release_invocation(
    publishing: &'static Publishing,
    key: &LockKey,
    owner: &OwnerToken,
    fence_ttl: Duration,
) -> ScriptInvocation<'static> {
    let keys = PermitKeys::of(key);
    let mut invocation = publishing.semaphore_release.prepare_invoke();
    invocation
        .key(&keys.scripts()[..])
        .arg(owner.digest_hex())
        .arg(&keys.channel)
        .arg(millis(fence_ttl))
        .arg(&keys.lock);
    invocation
}

impl RedisBackend {
    /// One attempt at a permit of `request.key`'s semaphore of `permits`.
    pub(crate) async fn try_acquire_permit(
        &self,
        request: &AcquireRequest,
        permits: u32,
    ) -> Result<Attempt> {
        // The scripts read every holder: the count bounds their work (and a Lua `unpack`).
        if !(1..=lockkit_core::MAX_PERMITS).contains(&permits) {
            return Err(Error::invalid_config(format!(
                "a semaphore needs 1 to {} permits, not {permits}",
                lockkit_core::MAX_PERMITS
            )));
        }
        let keys = PermitKeys::of(&request.key);
        let waiter = self.register(request, &keys.channel);
        let [queue, name, inbox] = self.queue_args(&waiter);
        let args = [
            request.owner.digest_hex(),
            millis(request.ttl).to_string(),
            permits.to_string(),
            millis(self.config.fence_ttl).to_string(),
            keys.channel.clone(),
            queue,
            name,
            inbox,
            keys.lock.clone(),
        ];
        let all = keys.scripts();
        let script_keys = if request.fair { &all[..] } else { &all[..4] };
        let reply: PermitReply = self
            .acquire_with(
                request,
                &self.publishing().semaphore_acquire,
                script_keys,
                &args,
            )
            .await?;
        match reply {
            PermitReply::Granted(token) => Ok(waiter.granted(Grant::new(token, request.ttl))),
            PermitReply::Full(first_expiry) => Ok(waiter.contended(request, Some(first_expiry))),
            PermitReply::Mismatch(recorded) => Err(Hold::permits_mismatch(
                BACKEND,
                &request.key,
                permits,
                recorded,
            )),
        }
    }

    /// Whether `lease` still holds its permit: its owner is a live holder with its token.
    pub(crate) async fn holds_permit(&self, lease: &Lease) -> Result<bool> {
        let keys = PermitKeys::of(lease.key());
        self.holds_in(&keys.holders, &keys.tokens, lease, "checking a permit")
            .await
    }

    /// The semaphore's holds script on `holders` and `tokens` (a semaphore's, or a
    /// read-write lock's): whether `lease`'s owner is a live holder with its token.
    pub(crate) async fn holds_in(
        &self,
        holders: &str,
        tokens: &str,
        lease: &Lease,
        what: &str,
    ) -> Result<bool> {
        let (owner, token) = (&lease.owner().digest_hex(), lease.fencing_token().get());
        let held: i64 = self
            .primary
            .request(what, |mut con| async move {
                scripts::SEMAPHORE_HOLDS
                    .key(holders)
                    .key(tokens)
                    .arg(owner)
                    .arg(token)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        match held {
            1 => Ok(true),
            0 => Ok(false),
            _ => Err(Error::new(
                ErrorKind::Backend,
                BACKEND,
                "the holds script gave an unexpected reply",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semaphore_keys_are_apart_from_every_lock_key() {
        let key = LockKey::new("ns", "jobs").expect("a valid key");
        let keys = PermitKeys::of(&key);
        assert_eq!(keys.holders, "{ns/jobs}:sem:holders");
        assert_eq!(keys.channel, "lockkit:released:{ns/jobs}:sem");
        for k in keys.scripts() {
            assert!(
                crate::listing::lock_of("ns", k).is_none(),
                "{k} lists as a lock"
            );
        }
        // A name holding '}' ends its hash tag early, but its keys stay its own.
        let odd = LockKey::new("ns", "jobs}:sem:holders").expect("a valid key");
        assert_ne!(scripts::Keys::of(&odd).lock, keys.holders);
        assert_ne!(PermitKeys::of(&odd).holders, keys.holders);
    }

    #[test]
    fn an_unexpected_permit_reply_is_an_error() {
        let reply = |items: Vec<Value>| PermitReply::parse(&Value::Array(items));
        assert_eq!(
            reply(vec![Value::Int(1), Value::Int(7)]).ok(),
            Some(PermitReply::Granted(FencingToken(7)))
        );
        assert_eq!(
            reply(vec![Value::Int(2), Value::Int(3)]).ok(),
            Some(PermitReply::Mismatch(3))
        );
        for bad in [
            vec![Value::Int(1)],
            vec![Value::Int(1), Value::Int(-1)],
            vec![Value::Int(9), Value::Int(1)],
            vec![Value::Nil, Value::Int(1)],
        ] {
            assert!(
                reply(bad.clone()).is_err(),
                "{bad:?} was taken for an answer"
            );
        }
    }
}
