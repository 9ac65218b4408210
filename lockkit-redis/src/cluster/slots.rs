//! Which primary owns a lock's keys: the hash slot of a [`LockKey`] and the cluster's map of
//! slots to primaries, read with `CLUSTER SLOTS`.

use lockkit_core::{Error, ErrorKind, LockKey, Result};
use redis::Value;

use crate::error::BACKEND;
use crate::scripts::Keys;

/// The number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16384;

/// A primary's address.
pub(crate) type Addr = (String, u16);

/// The slot of every key of `key`'s lock, semaphore and read-write lock: they all start
/// with the lock key `{namespace/name}` (see `Keys::of`), so they share its hash tag, the
/// text between its first `{` and the first `}` after it (`ns/a` for a name `a}b`). `None`
/// when that tag is empty (a namespace that starts with `}`): Redis then hashes each key
/// whole, and a lock's keys would land in different slots.
pub(crate) fn slot_of(key: &LockKey) -> Option<u16> {
    let lock = Keys::of(key).lock;
    let tag = hash_tag(&lock)?;
    Some(crc16(tag.as_bytes()) % SLOTS)
}

/// The part of `redis_key` that Redis Cluster hashes when it has a non-empty hash tag.
fn hash_tag(redis_key: &str) -> Option<&str> {
    let open = redis_key.find('{')?;
    let rest = &redis_key[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
}

/// CRC-16/XMODEM (polynomial 0x1021, initial 0), the checksum Redis Cluster hashes keys with.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The primary of each slot range, sorted by the first slot.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct SlotMap {
    ranges: Vec<(u16, u16, Addr)>,
}

impl SlotMap {
    /// The map in a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id, ...], replicas...]]`.
    /// A node that announces no host (an empty string) is reached at `fallback_host`, the
    /// host the reply came from, as Redis documents.
    pub(crate) fn parse(reply: &Value, fallback_host: &str) -> Result<Self> {
        let malformed = || {
            Error::new(
                ErrorKind::Backend,
                BACKEND,
                "unexpected reply to CLUSTER SLOTS",
            )
        };
        let Value::Array(ranges) = reply else {
            return Err(malformed());
        };
        let mut map = SlotMap::default();
        for range in ranges {
            let Value::Array(fields) = range else {
                return Err(malformed());
            };
            let (Some(start), Some(end), Some(Value::Array(primary))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return Err(malformed());
            };
            let (Some(host), Some(port)) = (primary.first(), primary.get(1)) else {
                return Err(malformed());
            };
            let slot = |v: &Value| match v {
                Value::Int(n) => u16::try_from(*n).ok().filter(|n| *n < SLOTS),
                _ => None,
            };
            let host = match host {
                Value::BulkString(b) => String::from_utf8(b.clone()).map_err(|_| malformed())?,
                Value::SimpleString(s) => s.clone(),
                // An endpoint the node does not know: the host the reply came from.
                Value::Nil => String::new(),
                _ => return Err(malformed()),
            };
            let host = if host.is_empty() || host == "?" {
                fallback_host.to_owned()
            } else {
                host
            };
            let port = match port {
                Value::Int(p) => u16::try_from(*p).map_err(|_| malformed())?,
                _ => return Err(malformed()),
            };
            let (Some(start), Some(end)) = (slot(start), slot(end)) else {
                return Err(malformed());
            };
            map.ranges.push((start, end, (host, port)));
        }
        map.ranges.sort_by_key(|(start, _, _)| *start);
        Ok(map)
    }

    /// The primary that owns `slot`, if the map has one.
    pub(crate) fn owner(&self, slot: u16) -> Option<&Addr> {
        let i = self.ranges.partition_point(|(start, _, _)| *start <= slot);
        let (_, end, addr) = self.ranges.get(i.checked_sub(1)?)?;
        (slot <= *end).then_some(addr)
    }

    /// Records that `slot` moved to `addr` (a `MOVED` reply), until the next full read.
    pub(crate) fn moved(&mut self, slot: u16, addr: Addr) {
        let mut ranges = Vec::with_capacity(self.ranges.len() + 2);
        for (start, end, owner) in self.ranges.drain(..) {
            if slot < start || slot > end {
                ranges.push((start, end, owner));
                continue;
            }
            if start < slot {
                ranges.push((start, slot - 1, owner.clone()));
            }
            if slot < end {
                ranges.push((slot + 1, end, owner));
            }
        }
        ranges.push((slot, slot, addr));
        ranges.sort_by_key(|(start, _, _)| *start);
        self.ranges = ranges;
    }

    /// Every primary in the map, each once, sorted.
    pub(crate) fn primaries(&self) -> Vec<Addr> {
        let mut all: Vec<Addr> = self.ranges.iter().map(|(_, _, a)| a.clone()).collect();
        all.sort();
        all.dedup();
        all
    }

    /// Whether every slot has a primary.
    pub(crate) fn is_complete(&self) -> bool {
        let mut next = 0u32;
        for (start, end, _) in &self.ranges {
            if u32::from(*start) != next {
                return false;
            }
            next = u32::from(*end) + 1;
        }
        next == u32::from(SLOTS)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn slots_are_those_redis_computes() {
        // The check value of CRC-16/XMODEM, and slots that `CLUSTER KEYSLOT` gives.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b"foo") % SLOTS, 12182);
        assert_eq!(crc16(b"bar") % SLOTS, 5061);
        let key = LockKey::new("billing", "invoice-7").unwrap();
        assert_eq!(slot_of(&key), Some(crc16(b"billing/invoice-7") % SLOTS));
        // Redis hashes up to the first '}': "{ns/a}b}" hashes "ns/a", as do all its keys.
        let braced = LockKey::new("ns", "a}b").unwrap();
        assert_eq!(slot_of(&braced), Some(crc16(b"ns/a") % SLOTS));
        let untagged = LockKey::new("}ns", "a").unwrap();
        assert_eq!(slot_of(&untagged), None);
    }

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn a_cluster_slots_reply_maps_every_slot_and_follows_moves() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node("10.0.0.2", 7001),
            ]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("", 7000),
                node("10.0.0.3", 7003),
            ]),
        ]);
        let mut map = SlotMap::parse(&reply, "10.0.0.1").unwrap();
        assert!(map.is_complete());
        assert_eq!(map.owner(0), Some(&("10.0.0.1".to_owned(), 7000)));
        assert_eq!(map.owner(5461), Some(&("10.0.0.2".to_owned(), 7001)));
        assert_eq!(map.owner(16383), Some(&("10.0.0.2".to_owned(), 7001)));
        map.moved(100, ("10.0.0.2".to_owned(), 7001));
        assert!(map.is_complete());
        assert_eq!(map.owner(99), Some(&("10.0.0.1".to_owned(), 7000)));
        assert_eq!(map.owner(100), Some(&("10.0.0.2".to_owned(), 7001)));
        assert_eq!(map.owner(101), Some(&("10.0.0.1".to_owned(), 7000)));
        assert_eq!(map.primaries().len(), 2);
        let partial = SlotMap::parse(&Value::Array(vec![]), "h").unwrap();
        assert!(!partial.is_complete());
        assert_eq!(partial.owner(0), None);
        assert!(SlotMap::parse(&Value::Int(1), "h").is_err());
    }
}
