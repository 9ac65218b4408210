//! The Lua scripts (in `scripts/`), the key layout, and decoding of the scripts' replies.

use std::sync::LazyLock;
use std::time::Duration;

use lockkit_core::backend::{Hold, Leader, Lease, OwnerToken};
use lockkit_core::{FencingToken, LockInfo, LockKey, Result};
use redis::aio::ConnectionManager;
use redis::{Script, Value};

use crate::error::unexpected;

/// A script's source: `scripts/common.lua` (the clock, the owner check, the one way fencing
/// tokens are minted), then the named files of `scripts/` in order.
macro_rules! lua {
    ($($file:literal),+) => {
        concat!(
            include_str!("../scripts/common.lua"),
            $(include_str!(concat!("../scripts/", $file))),+
        )
    };
}

const ACQUIRE_LUA: &str = lua!("queue.lua", "mutex_prelude.lua", "acquire.lua");
const RELEASE_LUA: &str = lua!("queue.lua", "mutex_prelude.lua", "release.lua");
const RENEW_LUA: &str = lua!("renew.lua");
const INSPECT_LUA: &str = include_str!("../scripts/inspect.lua");
const RAISE_FENCE_LUA: &str = lua!("raise_fence.lua");
const FORCE_RELEASE_LUA: &str = lua!("queue.lua", "mutex_prelude.lua", "force_release.lua");
const PROCLAIM_LUA: &str = include_str!("../scripts/proclaim.lua");
const SEMAPHORE_ACQUIRE_LUA: &str = lua!(
    "queue.lua",
    "semaphore_prelude.lua",
    "semaphore_queue.lua",
    "semaphore_acquire.lua"
);
const SEMAPHORE_RELEASE_LUA: &str = lua!(
    "queue.lua",
    "semaphore_prelude.lua",
    "semaphore_queue.lua",
    "semaphore_release.lua"
);
const SEMAPHORE_RENEW_LUA: &str = lua!("semaphore_prelude.lua", "semaphore_renew.lua");
const SEMAPHORE_HOLDS_LUA: &str = lua!("semaphore_prelude.lua", "semaphore_holds.lua");
const RWLOCK_ACQUIRE_LUA: &str = lua!(
    "queue.lua",
    "semaphore_prelude.lua",
    "rwlock_prelude.lua",
    "rwlock_acquire.lua"
);
const RWLOCK_RELEASE_LUA: &str = lua!(
    "queue.lua",
    "semaphore_prelude.lua",
    "rwlock_prelude.lua",
    "rwlock_release.lua"
);

/// Compare-and-`PEXPIRE` of the lock, keeping its fence counter alive.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_LUA));
/// The holder's value and remaining TTL, read atomically.
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT_LUA));
/// Redlock: raise a node's fence counter to the token a majority agreed on.
pub(crate) static RAISE_FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(RAISE_FENCE_LUA));
/// Semaphores: extends a held permit, and the semaphore's keys with it.
pub(crate) static SEMAPHORE_RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(SEMAPHORE_RENEW_LUA));
/// Semaphores: whether a grant still holds its permit (read-write locks use it too).
pub(crate) static SEMAPHORE_HOLDS: LazyLock<Script> =
    LazyLock::new(|| Script::new(SEMAPHORE_HOLDS_LUA));

/// How a server's scripts publish release notifications and hand-overs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PubSub {
    /// `PUBLISH` and `SUBSCRIBE`: one server, a Sentinel-managed primary, Redlock's nodes, and
    /// a Redis Cluster before Redis 7 (where the cluster bus carries every message to every
    /// node).
    Classic,
    /// `SPUBLISH` and `SSUBSCRIBE` (Redis 7 or later): a Redis Cluster's primaries, where a
    /// message reaches only the nodes that serve its channel's slot, the lock's.
    Sharded,
}

/// The scripts that publish, written for one [`PubSub`]: each is its body with that kind's
/// `publish` and `announce` functions prepended (`scripts/publish_*.lua`).
pub(crate) struct Publishing {
    /// Takes a free lock and returns its fencing token, or queues the waiter and returns the
    /// holder's remaining TTL.
    pub(crate) acquire: Script,
    /// Compare-and-delete, or a hand-over to the first waiter in the queue, plus a release
    /// notification.
    pub(crate) release: Script,
    /// Delete the lock whoever holds it, plus a release notification (an operator's break).
    pub(crate) force_release: Script,
    /// Elections: the holder's compare-and-`SET` of its value beside the lock, plus a
    /// notification.
    pub(crate) proclaim: Script,
    /// Semaphores: takes a permit if one is free and (fair) nobody waits for it, handing
    /// free permits to the first fair waiters, or queues the caller and says when the first
    /// holder expires, or that the holders agreed on another count.
    pub(crate) semaphore_acquire: Script,
    /// Semaphores: gives a permit back (or a fair waiter's place) and hands free permits to
    /// the first fair waiters, plus a release notification.
    pub(crate) semaphore_release: Script,
    /// Read-write locks: takes a read or the write lock if the holders and waiting writers
    /// let it (expired ones removed first), or queues a waiting writer and says when the
    /// first of what keeps it out expires. Renewal and `is_held` are the semaphore's scripts.
    pub(crate) rwlock_acquire: Script,
    /// Read-write locks: gives a grant back or a waiting writer's place, hands a lock nobody
    /// holds to the first waiting writer, else tells the readers.
    pub(crate) rwlock_release: Script,
}

/// The bodies of the publishing scripts, in [`Publishing`]'s order.
const PUBLISHING_LUA: [&str; 8] = [
    ACQUIRE_LUA,
    RELEASE_LUA,
    FORCE_RELEASE_LUA,
    PROCLAIM_LUA,
    SEMAPHORE_ACQUIRE_LUA,
    SEMAPHORE_RELEASE_LUA,
    RWLOCK_ACQUIRE_LUA,
    RWLOCK_RELEASE_LUA,
];

impl Publishing {
    /// The publishing scripts' sources for `pubsub`, in [`Publishing`]'s order.
    fn sources(pubsub: PubSub) -> [String; 8] {
        let prelude = match pubsub {
            PubSub::Classic => include_str!("../scripts/publish_classic.lua"),
            PubSub::Sharded => include_str!("../scripts/publish_sharded.lua"),
        };
        PUBLISHING_LUA.map(|body| format!("{prelude}{body}"))
    }

    fn new(pubsub: PubSub) -> Self {
        let [
            acquire,
            release,
            force_release,
            proclaim,
            semaphore_acquire,
            semaphore_release,
            rwlock_acquire,
            rwlock_release,
        ] = Publishing::sources(pubsub).map(|source| Script::new(&source));
        Publishing {
            acquire,
            release,
            force_release,
            proclaim,
            semaphore_acquire,
            semaphore_release,
            rwlock_acquire,
            rwlock_release,
        }
    }

    /// The scripts that publish as `pubsub` says.
    pub(crate) fn of(pubsub: PubSub) -> &'static Publishing {
        static CLASSIC: LazyLock<Publishing> = LazyLock::new(|| Publishing::new(PubSub::Classic));
        static SHARDED: LazyLock<Publishing> = LazyLock::new(|| Publishing::new(PubSub::Sharded));
        match pubsub {
            PubSub::Classic => &CLASSIC,
            PubSub::Sharded => &SHARDED,
        }
    }
}

/// The scripts that publish with `PUBLISH` (Redlock's nodes).
pub(crate) fn classic() -> &'static Publishing {
    Publishing::of(PubSub::Classic)
}

/// One pipeline of `SCRIPT LOAD`s of every script (both kinds of the publishing ones: a
/// script is only compiled when loaded, so a server without `SPUBLISH` loads them too), so
/// that the first calls need no `NOSCRIPT` round trip.
pub(crate) fn load_all() -> redis::Pipeline {
    let mut pipe = redis::pipe();
    let plain = [
        RENEW_LUA,
        INSPECT_LUA,
        RAISE_FENCE_LUA,
        SEMAPHORE_RENEW_LUA,
        SEMAPHORE_HOLDS_LUA,
    ];
    let publishing = [PubSub::Classic, PubSub::Sharded]
        .into_iter()
        .flat_map(Publishing::sources);
    for source in plain.into_iter().map(str::to_owned).chain(publishing) {
        pipe.cmd("SCRIPT").arg("LOAD").arg(source);
    }
    pipe
}

/// One pipeline of compare-and-`PEXPIRE` calls, one per lease, each also keeping the lock's
/// fence counter alive for at least `fence_ttl` (and the election value of a grant in
/// `proclaimed` with the lock); a permit's lease gets the semaphore's renewal in its place, a
/// read or write lock's the same script on the rwlock's keys. Each names only keys that exist
/// while its grant does (a Cluster refuses a script naming a missing key while its slot
/// migrates). A failed call gives an error reply in its place instead of failing the
/// pipeline (see [`primary_moved`] for the replies that fail it).
pub(crate) fn renew_pipeline(
    leases: &[Lease],
    fence_ttl: Duration,
    proclaimed: Option<&crate::election::Proclaimed>,
) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for lease in leases {
        match lease.hold() {
            Hold::Permit { .. } => {
                crate::semaphore::push_renewal(&mut pipe, lease, fence_ttl);
                continue;
            }
            Hold::Read | Hold::Write => {
                crate::rwlock::push_renewal(&mut pipe, lease, fence_ttl);
                continue;
            }
            _ => {}
        }
        let keys = Keys::of(lease.key());
        let with_value = proclaimed.is_some_and(|p| p.contains(lease));
        pipe.cmd("EVALSHA")
            .arg(RENEW.get_hash())
            .arg(if with_value { 3 } else { 2 })
            .arg(keys.lock)
            .arg(keys.fence);
        if with_value {
            pipe.arg(keys.value);
        }
        pipe.arg(lease.owner().expose_hex())
            .arg(millis(lease.ttl()))
            .arg(millis(fence_ttl));
    }
    pipe
}

/// Sends `pipe`; if the server lost its scripts (a restart, `SCRIPT FLUSH`), loads them and
/// sends it once more.
pub(crate) async fn query_reloading(
    pipe: &redis::Pipeline,
    con: &mut ConnectionManager,
) -> redis::RedisResult<Vec<Value>> {
    let replies: Vec<Value> = pipe.query_async(con).await?;
    if !replies.iter().any(is_noscript) {
        return Ok(replies);
    }
    load_all().query_async::<Vec<String>>(con).await?;
    pipe.query_async(con).await
}

/// The answer of one compare-and-`PEXPIRE`: `Some(true)` extended, `Some(false)` not ours,
/// `None` for an error or an unexpected reply.
pub(crate) fn renewed(reply: &Value) -> Option<bool> {
    match reply {
        Value::Int(1) => Some(true),
        Value::Int(0) => Some(false),
        _ => None,
    }
}

/// The Redis names of one lock.
///
/// The lock key is `{namespace/name}`, the fence key `{namespace/name}:fence` and an
/// election's value key `{namespace/name}:value`: all carry the same hash tag (the first
/// `{...}`; a `}` in the name only ends the tag earlier, in all), so they live in one Redis
/// Cluster slot and one script may touch them together. `/` cannot occur in a namespace or
/// name, so no two locks share keys. The mutex's waiters queue in `{namespace/name}:queue`
/// (their turns) and `{namespace/name}:queue:entries` (when each entry lapses, and where its
/// grant is announced): see `scripts/queue.lua`.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) lock: String,
    pub(crate) fence: String,
    pub(crate) value: String,
    pub(crate) queue: String,
    pub(crate) entries: String,
    pub(crate) channel: String,
}

impl Keys {
    /// The keys of the acquire script, in its order, queue included.
    pub(crate) fn acquire(&self) -> [&str; 4] {
        [&self.lock, &self.fence, &self.queue, &self.entries]
    }

    /// The keys of the release and force-release scripts, in their order, queue included,
    /// and the election value last (Redlock, which has no elections, leaves it out).
    pub(crate) fn release(&self) -> [&str; 5] {
        [
            &self.lock,
            &self.fence,
            &self.queue,
            &self.entries,
            &self.value,
        ]
    }

    pub(crate) fn of(key: &LockKey) -> Self {
        let lock = format!("{{{}/{}}}", key.namespace(), key.name());
        Keys {
            fence: format!("{lock}:fence"),
            value: format!("{lock}:value"),
            queue: format!("{lock}:queue"),
            entries: format!("{lock}:queue:entries"),
            channel: format!("lockkit:released:{lock}"),
            lock,
        }
    }
}

/// Milliseconds for a script argument, at least 1.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// The reply of the acquire script ([`Publishing::acquire`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    Granted(FencingToken),
    /// The holder's remaining TTL; `None` if the key has no TTL (never written by lockkit).
    Contended(Option<Duration>),
}

pub(crate) fn acquire_reply(backend: &'static str, value: &Value) -> Result<AcquireReply> {
    match value {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(1), Value::Int(token)] => u64::try_from(*token)
                .map(|t| AcquireReply::Granted(FencingToken(t)))
                .map_err(|_| unexpected(backend, "the acquire script")),
            [Value::Int(0), Value::Int(pttl)] => Ok(AcquireReply::Contended(
                u64::try_from(*pttl).ok().map(Duration::from_millis),
            )),
            _ => Err(unexpected(backend, "the acquire script")),
        },
        _ => Err(unexpected(backend, "the acquire script")),
    }
}

/// A lock's holder as stored: `owner-hex:token`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    pub(crate) owner_hex: String,
    pub(crate) info: LockInfo,
}

impl Holder {
    pub(crate) fn is(&self, owner: &OwnerToken) -> bool {
        self.owner_hex == owner.expose_hex()
    }

    /// The lock key's value for `holder`, `""` for none (what the force-release script
    /// compares).
    pub(crate) fn value_of(holder: Option<&Holder>) -> String {
        holder.map_or_else(String::new, |h| {
            format!("{}:{}", h.owner_hex, h.info.fencing_token.get())
        })
    }
}

/// The reply of [`INSPECT`]: the holder, if the key exists and was written by lockkit.
pub(crate) fn inspect_reply(backend: &'static str, value: &Value) -> Result<Option<Holder>> {
    let Value::Array(items) = value else {
        return Err(unexpected(backend, "the inspect script"));
    };
    // Anything but a value (or none) and a PTTL is an error, never "not held": a client
    // that cannot read the holder does not know it.
    let (stored, pttl) = match items.as_slice() {
        [Value::BulkString(stored), Value::Int(pttl)] => (stored, *pttl),
        [Value::Nil, Value::Int(_)] => return Ok(None),
        _ => return Err(unexpected(backend, "the inspect script")),
    };
    let Some((owner_hex, token)) = holder_of(stored) else {
        return Err(unexpected(
            backend,
            "the inspect script (a lock key lockkit did not write)",
        ));
    };
    let mut info = LockInfo::new(FencingToken(token));
    if let Ok(ms) = u64::try_from(pttl) {
        info = info.with_remaining_ttl(Duration::from_millis(ms));
    }
    Ok(Some(Holder { owner_hex, info }))
}

/// The owner and fencing token of a lock key's value (`owner-hex:token`).
fn holder_of(stored: &[u8]) -> Option<(String, u64)> {
    let (owner, token) = std::str::from_utf8(stored).ok()?.split_once(':')?;
    Some((owner.to_owned(), token.parse().ok()?))
}

/// The leader from the reply of `MGET lock value`: the lock's holder, with the value only if
/// this very grant proclaimed it (the value key is `token:value`).
pub(crate) fn leader_reply(backend: &'static str, value: &Value) -> Result<Option<Leader>> {
    let unexpected = || unexpected(backend, "MGET of a lock and its election value");
    let Value::Array(items) = value else {
        return Err(unexpected());
    };
    let (stored, proclaimed) = match items.as_slice() {
        [Value::Nil, _] => return Ok(None),
        [Value::BulkString(stored), proclaimed] => (stored, proclaimed),
        _ => return Err(unexpected()),
    };
    let (_, token) = holder_of(stored).ok_or_else(unexpected)?;
    let value = match proclaimed {
        Value::Nil => None,
        Value::BulkString(proclaimed) => {
            let (by, value) = std::str::from_utf8(proclaimed)
                .ok()
                .and_then(|s| s.split_once(':'))
                .ok_or_else(unexpected)?;
            (by.parse::<u64>().ok() == Some(token)).then(|| value.to_owned())
        }
        _ => return Err(unexpected()),
    };
    Ok(Some(Leader::new(FencingToken(token), value)))
}

/// The first reply of a pipeline that says the primary is demoted or cut off from its
/// replicas (`READONLY`, `MASTERDOWN`), as an error. A pipeline sent with `ignore_errors`
/// gets those per command, in its replies; turned into the request's error, they make
/// `Primary::request_on` look for the new primary, which it would not do for a reply.
pub(crate) fn primary_moved(replies: &[Value]) -> Option<redis::RedisError> {
    replies.iter().find_map(|reply| match reply {
        Value::ServerError(e)
            if matches!(
                e.kind(),
                Some(redis::ServerErrorKind::ReadOnly | redis::ServerErrorKind::MasterDown)
            ) =>
        {
            Some(e.clone().into())
        }
        _ => None,
    })
}

/// Whether a reply says `NOSCRIPT` (the server lost its script cache).
pub(crate) fn is_noscript(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unexpected_inspect_reply_is_an_error_not_a_free_lock() {
        for reply in [
            Value::Array(vec![Value::Int(1), Value::Int(100)]),
            Value::Array(vec![Value::Nil, Value::Nil]),
            Value::Array(vec![Value::Okay, Value::Int(100)]),
            Value::Array(vec![]),
            Value::Array(vec![Value::Nil]),
            Value::Nil,
        ] {
            assert!(
                inspect_reply("redis", &reply).is_err(),
                "{reply:?} was taken for an answer"
            );
        }
    }

    #[test]
    fn a_leader_shows_only_the_value_its_own_grant_proclaimed() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let read = |lock: Value, value: Value| {
            leader_reply("redis", &Value::Array(vec![lock, value]))
                .ok()
                .flatten()
        };
        assert_eq!(
            read(bulk("ab12:42"), bulk("42:node-a:8080")),
            Some(Leader::new(FencingToken(42), Some("node-a:8080".into())))
        );
        assert_eq!(
            read(bulk("ab12:43"), bulk("42:node-a:8080")),
            Some(Leader::new(FencingToken(43), None)),
            "a value of the grant before"
        );
        assert_eq!(
            read(bulk("ab12:42"), Value::Nil),
            Some(Leader::new(FencingToken(42), None))
        );
        assert_eq!(read(Value::Nil, bulk("42:x")), None);
        assert!(leader_reply("redis", &Value::Array(vec![bulk("junk"), Value::Nil])).is_err());
    }

    #[test]
    fn an_inspect_reply_names_the_holder_or_none() {
        let free = Value::Array(vec![Value::Nil, Value::Int(-2)]);
        assert_eq!(inspect_reply("redis", &free).ok(), Some(None));
        let held = Value::Array(vec![
            Value::BulkString(b"ab12:42".to_vec()),
            Value::Int(1500),
        ]);
        let holder = inspect_reply("redis", &held).ok().flatten();
        assert_eq!(holder.as_ref().map(|h| h.owner_hex.as_str()), Some("ab12"));
        assert_eq!(holder.map(|h| h.info.fencing_token), Some(FencingToken(42)));
    }
}
