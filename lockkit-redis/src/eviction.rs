//! The check at connect time that a server cannot evict lock keys.
//!
//! Under `maxmemory`, every policy but `noeviction` may delete keys with a TTL, and every
//! lock key has one (`volatile-ttl` even picks the shortest-lived first): an evicted lock is
//! granted again while its holder still holds it. So `connect` reads the server's limit and
//! policy (`INFO memory`, which managed services that forbid `CONFIG` usually allow, and which
//! shows no secrets to the lock user) and refuses an evicting setup unless the configuration
//! accepts it.

use lockkit_core::{Error, ErrorKind, Result};

/// What `INFO memory` says of eviction: the limit in bytes and the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Eviction {
    maxmemory: u64,
    policy: String,
}

impl Eviction {
    /// Reads the limit and policy from the text of `INFO memory`; `None` if either is missing.
    pub(crate) fn parse(info: &str) -> Option<Self> {
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        Some(Eviction {
            maxmemory: field("maxmemory")?.parse().ok()?,
            policy: field("maxmemory_policy")?.to_owned(),
        })
    }

    /// Whether the server may evict lock keys.
    pub(crate) fn may_evict_locks(&self) -> bool {
        self.maxmemory > 0 && self.policy != "noeviction"
    }
}

/// The outcome of the check on the server at `addr`, given what `INFO memory` answered:
/// `Ok` for a server that cannot evict, or when `allowed` (the configuration's
/// `allow_eviction`, named by `setting`); a warning when the answer could not be had or
/// read; [`ErrorKind::InvalidConfig`] for an evicting server otherwise. Connection failures
/// are returned for the caller to decide.
pub(crate) fn judge(
    backend: &'static str,
    addr: &str,
    answer: Result<String>,
    allowed: bool,
    setting: &str,
) -> Result<()> {
    let info = match answer {
        Ok(info) => info,
        Err(e) if e.kind() == ErrorKind::Unavailable => return Err(e),
        Err(e) => {
            tracing::warn!(server = %addr, error = %e, "cannot check whether the server may evict lock keys (INFO memory refused); make sure maxmemory-policy is noeviction");
            return Ok(());
        }
    };
    let Some(eviction) = Eviction::parse(&info) else {
        tracing::warn!(server = %addr, "cannot check whether the server may evict lock keys (INFO memory has no maxmemory_policy); make sure maxmemory-policy is noeviction");
        return Ok(());
    };
    if !eviction.may_evict_locks() {
        return Ok(());
    }
    if allowed {
        tracing::warn!(server = %addr, maxmemory = eviction.maxmemory, policy = %eviction.policy, "the server may evict lock keys (a lock evicted is granted twice); accepted by {setting} = true");
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::InvalidConfig,
        backend,
        format!(
            "the Redis server at {addr} may evict lock keys: maxmemory is {} bytes with maxmemory-policy {}, and an evicted lock is granted twice. Set maxmemory-policy noeviction (or maxmemory 0) on the server, or accept the risk with {setting} = true",
            eviction.maxmemory, eviction.policy
        ),
    ))
}

/// The `INFO memory` request.
pub(crate) fn info_memory() -> redis::Cmd {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("memory");
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_memory_limit_with_an_evicting_policy_may_evict_locks() {
        let info = |maxmemory: u64, policy: &str| {
            format!(
                "# Memory\r\nused_memory:1\r\nmaxmemory:{maxmemory}\r\nmaxmemory_human:x\r\nmaxmemory_policy:{policy}\r\n"
            )
        };
        let evicts = |text: String| Eviction::parse(&text).map(|e| e.may_evict_locks());
        assert_eq!(evicts(info(104_857_600, "volatile-ttl")), Some(true));
        assert_eq!(evicts(info(104_857_600, "allkeys-lru")), Some(true));
        assert_eq!(evicts(info(104_857_600, "noeviction")), Some(false));
        assert_eq!(evicts(info(0, "volatile-ttl")), Some(false));
        assert_eq!(Eviction::parse("# Memory\r\nmaxmemory:0\r\n"), None);
    }
}
