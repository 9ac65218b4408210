//! How the etcd backend names lock keys: `<prefix>/<namespace>/<name>/<lease-hex>-<n>` for
//! a mutex, `<prefix>/<namespace>/../semaphore/<name>/<permits>/<lease-hex>-<n>` for a
//! semaphore ([`SEMAPHORES`]), `<prefix>/<namespace>/../rwlock/<name>/{read,write}/<lease-hex>-<n>`
//! for a read-write lock ([`RWLOCKS`]), reusing names, what a key's value holds, and the reads that order a lock's keys by
//! create revision.

use std::collections::HashMap;
use std::collections::hash_map::Entry as Slot;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex as StdMutex, PoisonError};

use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget};
use lockkit_core::FencingToken;

/// The lock key names this backend's acquisitions use. A name is reused once nothing can
/// touch it any more: etcd keeps every key name ever written in its index until the next
/// compaction, so a new name per acquisition would make every read of the lock's range
/// slower (docs/measurements.md, "Speed and safety, measured").
#[derive(Debug, Default)]
pub(crate) struct KeyNames {
    pub(crate) claims: StdMutex<HashMap<String, u64>>,
    pub(crate) next_claim: AtomicU64,
}

/// A claimed key name: freeing it with a stale claim does nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Claim {
    pub(crate) key: String,
    pub(crate) id: u64,
}

impl KeyNames {
    /// The lowest free name `<prefix><lease-hex>-<n>`, claimed.
    pub(crate) fn claim(&self, prefix: &str, lease_id: i64) -> Claim {
        let id = self.next_claim.fetch_add(1, Ordering::Relaxed);
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        let mut n = 0u64;
        loop {
            let key = format!("{prefix}{lease_id:016x}-{n:x}");
            if let Slot::Vacant(slot) = claims.entry(key.clone()) {
                slot.insert(id);
                return Claim { key, id };
            }
            n += 1;
        }
    }

    /// Whether an acquisition of this backend (or a clean-up of one) uses the name `key`.
    pub(crate) fn is_claimed(&self, key: &str) -> bool {
        self.claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(key)
    }

    pub(crate) fn free(&self, claim: &Claim) {
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        if claims.get(&claim.key) == Some(&claim.id) {
            claims.remove(&claim.key);
        }
    }
}

/// The segment between a namespace and a semaphore's name. A lock name is never `..`, so
/// no mutex's range `<prefix>/<namespace>/<name>/` holds a semaphore's key, and no
/// semaphore's range holds another semaphore's (names have no `/`); the keys stay under the
/// namespace, where clean-up checks look. `list` reads them as the invalid name `..` and
/// leaves them out.
pub(crate) const SEMAPHORES: &str = "../semaphore";

/// The segment between a namespace and a read-write lock's name, for the same reasons as
/// [`SEMAPHORES`]; `../rwlock` and `../semaphore` are apart, so the rwlock, the semaphore and
/// the mutex of one name never share a key.
pub(crate) const RWLOCKS: &str = "../rwlock";

/// The segment between the prefix and a session's epoch key (see
/// [`Session::epoch_key`](crate::session::Session::epoch_key)): no namespace is `..`, so it is
/// in no namespace's range.
pub(crate) const SESSIONS: &str = "../sessions";

/// A range read of the lock's keys in create order, `limit` of them.
pub(crate) fn by_create(order: SortOrder, limit: i64) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, order)
        .with_limit(limit)
}

/// The key created last before `own_revision`.
pub(crate) fn predecessor_of(own_revision: i64) -> GetOptions {
    by_create(SortOrder::Descend, 1).with_max_create_revision(own_revision - 1)
}

/// Separates the owner digest from an election's proclaimed value in a lock key's value. A
/// digest is hex, so the first separator ends it.
const VALUE_SEPARATOR: u8 = b'\n';

/// A lock key's value: the owner token's digest, then, once its grant proclaimed a value as
/// an election's leader, the separator and that value.
pub(crate) fn stored_value(owner_digest: &str, proclaimed: Option<&str>) -> Vec<u8> {
    let mut stored = owner_digest.as_bytes().to_vec();
    if let Some(value) = proclaimed {
        stored.push(VALUE_SEPARATOR);
        stored.extend_from_slice(value.as_bytes());
    }
    stored
}

/// The owner digest in a lock key's value (all of it for a key nobody proclaimed on).
pub(crate) fn owner_of(stored: &[u8]) -> &[u8] {
    stored
        .iter()
        .position(|b| *b == VALUE_SEPARATOR)
        .map_or(stored, |end| &stored[..end])
}

/// The value proclaimed in a lock key's value, if any.
pub(crate) fn proclaimed_of(stored: &[u8]) -> Option<String> {
    let start = stored.iter().position(|b| *b == VALUE_SEPARATOR)? + 1;
    Some(String::from_utf8_lossy(&stored[start..]).into_owned())
}

/// The first key after every key that starts with `prefix` (etcd's range end of a prefix).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // all keys from the start
}

pub(crate) fn key_of(kv: &KeyValue) -> String {
    String::from_utf8_lossy(kv.key()).into_owned()
}

pub(crate) fn token_of(revision: i64) -> FencingToken {
    FencingToken(u64::try_from(revision).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_name_is_reused_only_after_it_is_freed_and_stale_frees_do_nothing() {
        let names = KeyNames::default();
        let first = names.claim("p/ns/k/", 0xab);
        assert_eq!(first.key, "p/ns/k/00000000000000ab-0");
        let second = names.claim("p/ns/k/", 0xab);
        assert_eq!(second.key, "p/ns/k/00000000000000ab-1");
        names.free(&first);
        let again = names.claim("p/ns/k/", 0xab);
        assert_eq!(again.key, first.key, "a freed name is reused");
        names.free(&first);
        let third = names.claim("p/ns/k/", 0xab);
        assert_eq!(
            third.key, "p/ns/k/00000000000000ab-2",
            "a stale claim freed a name in use"
        );
    }

    #[test]
    fn the_range_end_of_a_prefix_follows_every_key_under_it() {
        assert_eq!(prefix_end(b"lk/ns/job"), b"lk/ns/joc");
        assert_eq!(prefix_end(b"a\xff\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), [0]);
    }

    #[test]
    fn a_key_value_holds_the_owner_digest_and_then_the_proclaimed_value() {
        let plain = stored_value("5947d7c3", None);
        assert_eq!(plain, b"5947d7c3");
        assert_eq!(owner_of(&plain), b"5947d7c3");
        assert_eq!(proclaimed_of(&plain), None);
        let leading = stored_value("5947d7c3", Some("node-a\n:8080"));
        assert_eq!(owner_of(&leading), b"5947d7c3");
        assert_eq!(proclaimed_of(&leading).as_deref(), Some("node-a\n:8080"));
        let empty = stored_value("5947d7c3", Some(""));
        assert_eq!(proclaimed_of(&empty).as_deref(), Some(""));
        assert_eq!(owner_of(b""), b"", "an etcdctl lock key has an empty value");
    }
}
