//! Listing held locks a page at a time with `SCAN ... MATCH ... COUNT`, shared by the single
//! Redis (and Sentinel) backend and Redlock: the pattern, the cursor, and which of the keys
//! found are lock keys.

use lockkit_core::{Error, LockKey, Result};
use redis::aio::ConnectionManager;

/// `SCAN` calls one page makes at most while they find nothing: bounded work per page, and
/// fewer empty pages on a big keyspace.
const SCANS_PER_PAGE: usize = 8;

/// The `SCAN` pattern of the lock keys `{namespace/prefix...}`, glob characters escaped.
pub(crate) fn pattern(namespace: &str, prefix: &str) -> String {
    format!("{{{}/{}*", escape(namespace), escape(prefix))
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The lock whose lock key is `redis_key`, if it is one of `namespace`: lock keys are
/// `{namespace/name}` and end with `}`; the fence and election value keys
/// (`{namespace/name}:fence`, `:value`) do not.
pub(crate) fn lock_of(namespace: &str, redis_key: &str) -> Option<LockKey> {
    let name = redis_key
        .strip_prefix('{')?
        .strip_prefix(namespace)?
        .strip_prefix('/')?
        .strip_suffix('}')?;
    LockKey::new(namespace, name).ok()
}

/// A `SCAN` cursor from a page's cursor string (`None`: the start).
pub(crate) fn scan_cursor(backend: &'static str, cursor: Option<&str>) -> Result<u64> {
    match cursor {
        None => Ok(0),
        Some(text) => text.parse().map_err(|_| {
            Error::invalid_config(format!("{text:?} is not a {backend} listing cursor"))
        }),
    }
}

/// `SCAN`s from `cursor` until it finds locks of `namespace` under `prefix`, the scan ends
/// (cursor 0) or [`SCANS_PER_PAGE`] calls were made. Returns the locks found (possibly some
/// twice, as `SCAN` may) and the cursor to go on from.
pub(crate) async fn scan(
    con: &mut ConnectionManager,
    namespace: &str,
    prefix: &str,
    mut cursor: u64,
    count: usize,
) -> redis::RedisResult<(Vec<LockKey>, u64)> {
    let pattern = pattern(namespace, prefix);
    let mut found = Vec::new();
    for _ in 0..SCANS_PER_PAGE {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(count)
            .query_async(con)
            .await?;
        cursor = next;
        found.extend(keys.iter().filter_map(|key| lock_of(namespace, key)));
        if cursor == 0 || !found.is_empty() {
            break;
        }
    }
    found.sort_by(|a, b| a.name().cmp(b.name()));
    found.dedup();
    Ok((found, cursor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_in_names_match_only_themselves() {
        assert_eq!(pattern("ns", "a*b?[c]\\"), "{ns/a\\*b\\?\\[c\\]\\\\*");
        assert_eq!(pattern("n*s", ""), "{n\\*s/*");
    }

    #[test]
    fn only_the_lock_keys_of_the_namespace_are_locks() {
        let lock = lock_of("ns", "{ns/job}").map(|k| k.name().to_owned());
        assert_eq!(lock.as_deref(), Some("job"));
        assert!(lock_of("ns", "{ns/job}:fence").is_none());
        assert!(lock_of("ns", "{nsx/job}").is_none());
        let odd = lock_of("ns", "{ns/a}:fence}").map(|k| k.name().to_owned());
        assert_eq!(odd.as_deref(), Some("a}:fence"), "a name may hold a '}}'");
    }
}
