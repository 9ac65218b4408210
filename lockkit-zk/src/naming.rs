//! How the ZooKeeper backend names things: a lock's parent znode, and each acquisition's
//! node `_c_{uuid}-lock-{sequence}`, as Curator's `InterProcessMutex` does; a semaphore's
//! parent below the lock's, and its nodes `_c_{uuid}-permits-{n}-lock-{sequence}`; a
//! read-write lock's parent below the lock's too, and its nodes `_c_{uuid}-__READ__{sequence}`
//! and `_c_{uuid}-__WRIT__{sequence}`, as Curator's `InterProcessReadWriteLock` names them.

use lockkit_core::LockKey;
use lockkit_core::backend::{Hold, Lease, OwnerToken};

/// The part of a lock node's name between the owner and the sequence number, as Curator's
/// `InterProcessMutex` names it.
pub(crate) const LOCK_NAME: &str = "-lock-";

/// The child of a lock's parent under which the semaphore of the same name queues.
///
/// No lock node can be named so (every sequential node ends in ten digits), so the mutex's
/// queue, which keeps only names with a sequence number, never counts it, and Curator's
/// `InterProcessMutex` sorts it after every lock node (it compares what follows `lock-`, or
/// the whole name). Being below the key's own node, it is the semaphore of that one name:
/// no other valid name (they have no `/`) maps to it.
pub(crate) const SEMAPHORE_DIR: &str = "semaphore";

/// The child of a lock's parent under which the read-write lock of the same name queues,
/// for the reasons given for [`SEMAPHORE_DIR`]: no sequential node is named so, and no other
/// valid name maps to it.
pub(crate) const RWLOCK_DIR: &str = "rwlock";

/// What follows the owner in the name of a reader's node, as Curator's
/// `InterProcessReadWriteLock` names it.
pub(crate) const READ_NAME: &str = "__READ__";

/// What follows the owner in the name of a writer's node, as Curator's
/// `InterProcessReadWriteLock` names it (Curator tells a writer's node by this alone).
pub(crate) const WRITE_NAME: &str = "__WRIT__";

/// The znode paths of one lock (or semaphore, or read-write lock), relative to the chroot.
#[derive(Clone)]
pub(crate) struct LockPaths {
    pub(crate) namespace: String,
    /// The key's own node, `{namespace}/{name}`: the mutex's parent.
    pub(crate) key: String,
    /// The parent of the queue: `key` for a mutex, `{key}/semaphore` for a semaphore,
    /// `{key}/rwlock` for a read-write lock.
    pub(crate) parent: String,
}

impl LockPaths {
    /// The paths of `key`'s mutex (and election).
    pub(crate) fn new(key: &LockKey) -> Self {
        let namespace = format!("/{}", key.namespace());
        let parent = format!("{namespace}/{}", key.name());
        LockPaths {
            namespace,
            key: parent.clone(),
            parent,
        }
    }

    /// The paths of what `hold` queues for on `key`: its mutex, its semaphore, or its
    /// read-write lock.
    pub(crate) fn of(key: &LockKey, hold: Hold) -> Self {
        let mut paths = LockPaths::new(key);
        let dir = match hold {
            Hold::Read | Hold::Write => Some(RWLOCK_DIR),
            Hold::Exclusive => None,
            _ => Some(SEMAPHORE_DIR),
        };
        if let Some(dir) = dir {
            paths.parent = format!("{}/{dir}", paths.key);
        }
        paths
    }

    pub(crate) fn child(&self, name: &str) -> String {
        format!("{}/{name}", self.parent)
    }

    /// The nodes below the namespace that hold the queue, the queue's parent first: what
    /// is created when missing, and removed (deepest first) once idle.
    pub(crate) fn levels(&self) -> Vec<&str> {
        if self.parent == self.key {
            vec![&self.parent]
        } else {
            vec![&self.parent, &self.key]
        }
    }
}

/// `_c_{uuid}-lock-`: the start of the name of `owner`'s node, where `{uuid}` is the
/// [`node_id`] of the owner token.
pub(crate) fn own_prefix(owner: &OwnerToken) -> String {
    format!("_c_{}{LOCK_NAME}", uuid_form(&node_id(owner)))
}

/// The start of the name of the node of `owner`'s acquisition of `hold`: [`own_prefix`] for
/// a mutex; `_c_{uuid}-permits-{n}-lock-` for a permit of a semaphore of `n` permits, so
/// that a listing tells every node's count (see `semaphore.rs`) and the mutex's helpers,
/// which find a node's sequence after the last `-lock-`, apply unchanged;
/// `_c_{uuid}-__READ__` and `_c_{uuid}-__WRIT__` for a reader and a writer of a read-write
/// lock (see `rwlock.rs`).
pub(crate) fn node_prefix(owner: &OwnerToken, hold: Hold) -> String {
    match hold {
        Hold::Permit { permits } => format!(
            "_c_{}-permits-{permits}{LOCK_NAME}",
            uuid_form(&node_id(owner))
        ),
        Hold::Read => format!("_c_{}-{READ_NAME}", uuid_form(&node_id(owner))),
        Hold::Write => format!("_c_{}-{WRITE_NAME}", uuid_form(&node_id(owner))),
        _ => own_prefix(owner),
    }
}

/// Whether a read-write lock's node is a writer's: its name has [`WRITE_NAME`] in it, the
/// test Curator's `InterProcessReadWriteLock` makes.
pub(crate) fn is_write_node(name: &str) -> bool {
    name.contains(WRITE_NAME)
}

/// The permits count a semaphore node's name records (`None` for a name that is not one).
pub(crate) fn permits_of(name: &str) -> Option<u32> {
    let head = &name[..name.rfind(LOCK_NAME)?];
    let (rest, count) = head.rsplit_once('-')?;
    if !rest.ends_with("-permits") || count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    count.parse().ok()
}

/// What a node's name carries in place of the owner token: its
/// [`digest_hex`](OwnerToken::digest_hex). Anyone who can list a lock, and every log line
/// that shows a request path (the client logs them at debug level), sees this, never the
/// token. It is as good as the token for finding our own node again after a lost reply, and
/// it still ties the node to the owner: a lease with another token names another node.
pub(crate) fn node_id(owner: &OwnerToken) -> String {
    owner.digest_hex()
}

/// 32 hex digits as a UUID (8-4-4-4-12), the shape Curator's protected names use.
pub(crate) fn uuid_form(hex: &str) -> String {
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Where the sequence number of a node name starts: after the last of `-lock-`,
/// [`READ_NAME`] and [`WRITE_NAME`] (the names of a read-write lock's nodes have no
/// `-lock-`, and the other names no `__READ__` or `__WRIT__`), or after `lock-` at the
/// start for Curator's unprotected mutex names; `None` without either.
fn sequence_start(name: &str) -> Option<usize> {
    [LOCK_NAME, READ_NAME, WRITE_NAME]
        .iter()
        .filter_map(|marker| name.rfind(marker).map(|i| i + marker.len()))
        .max()
        .or_else(|| {
            name.starts_with(&LOCK_NAME[1..])
                .then_some(LOCK_NAME.len() - 1)
        })
}

/// The sequence number of a lock node name (the digits after the last `-lock-`, `__READ__`
/// or `__WRIT__`, or after `lock-` at the start for Curator's unprotected names).
pub(crate) fn sequence_of(name: &str) -> Option<i64> {
    let digits = &name[sequence_start(name)?..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// What is shown of a node name (in a lease's handle, a contention, `Debug` output): its
/// sequence number, which is all a reader needs.
pub(crate) fn public_name(name: &str) -> String {
    name[sequence_start(name).unwrap_or(0)..].to_owned()
}

/// The lock nodes among `children`, lowest sequence first.
pub(crate) fn queue(mut children: Vec<String>) -> Vec<String> {
    children.retain(|c| sequence_of(c).is_some());
    children.sort_by_key(|c| sequence_of(c));
    children
}

/// The path of `lease`'s node (of any kind) from its owner token's prefix and
/// the sequence number in its handle; `None` when the handle holds no sequence number.
pub(crate) fn known_node(lease: &Lease) -> Option<String> {
    let sequence = lease.handle()?;
    if sequence.is_empty() || !sequence.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let paths = LockPaths::of(lease.key(), lease.hold());
    let prefix = node_prefix(lease.owner(), lease.hold());
    Some(paths.child(&format!("{prefix}{sequence}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_curator_and_sort_by_sequence() {
        let owner = OwnerToken::from_hex("00112233445566778899aabbccddeeff").expect("hex");
        let key = LockKey::new("ns", "job").expect("key");
        let paths = LockPaths::new(&key);
        assert_eq!(paths.parent, "/ns/job");
        assert_eq!(
            paths.child(&own_prefix(&owner)),
            "/ns/job/_c_5947d7c3-3d78-3f94-b3b4-c1a96ebc8991-lock-"
        );
        let children = vec![
            "_c_b-lock-0000000010".to_owned(),
            "junk".to_owned(),
            "lock-0000000002".to_owned(),
            "_c_a-lock-0000000003".to_owned(),
            "_c_a-lock-".to_owned(),
        ];
        assert_eq!(
            queue(children),
            [
                "lock-0000000002",
                "_c_a-lock-0000000003",
                "_c_b-lock-0000000010"
            ]
        );
    }

    /// The node name carries SHA-256 of the owner token (`printf %s {hex} | sha256sum`),
    /// not the token: no run of the token's hex digits shows in it.
    #[test]
    fn node_names_carry_a_digest_of_the_owner_token_not_the_token() {
        let owner = OwnerToken::from_hex("00112233445566778899aabbccddeeff").expect("hex");
        let prefix = own_prefix(&owner);
        let hex = owner.expose_hex();
        for window in hex.as_bytes().windows(4) {
            let run = std::str::from_utf8(window).expect("hex");
            assert!(
                !prefix.replace('-', "").contains(run),
                "{prefix} shows {run}"
            );
        }
        let other = OwnerToken::from_hex("00112233445566778899aabbccddeef0").expect("hex");
        assert_ne!(own_prefix(&other), prefix);
        assert_eq!(own_prefix(&owner), prefix, "the name must be found again");
    }

    #[test]
    fn a_semaphore_queues_below_its_key_apart_from_the_mutex() {
        let owner = OwnerToken::from_hex("00112233445566778899aabbccddeeff").expect("hex");
        let key = LockKey::new("ns", "job").expect("key");
        let paths = LockPaths::of(&key, Hold::Permit { permits: 3 });
        assert_eq!(paths.parent, "/ns/job/semaphore");
        assert_eq!(paths.levels(), ["/ns/job/semaphore", "/ns/job"]);
        assert_eq!(LockPaths::of(&key, Hold::Exclusive).levels(), ["/ns/job"]);
        // The mutex's queue never counts the semaphore's parent.
        assert_eq!(sequence_of(SEMAPHORE_DIR), None);
        let prefix = node_prefix(&owner, Hold::Permit { permits: 3 });
        assert_eq!(
            prefix,
            "_c_5947d7c3-3d78-3f94-b3b4-c1a96ebc8991-permits-3-lock-"
        );
        let name = format!("{prefix}0000000042");
        assert_eq!(sequence_of(&name), Some(42));
        assert_eq!(permits_of(&name), Some(3));
        assert_eq!(public_name(&name), "0000000042");
        assert_eq!(node_prefix(&owner, Hold::Exclusive), own_prefix(&owner));
        for other in [
            "_c_5947d7c3-3d78-3f94-b3b4-c1a96ebc8991-lock-0000000001",
            "lock-0000000001",
            "_c_x-permits--lock-0000000001",
            "_c_x-permits-x3-lock-0000000001",
            "_c_x-epermits-3-lock-0000000001",
        ] {
            assert_eq!(permits_of(other), None, "{other}");
        }
    }

    #[test]
    fn an_rwlock_queues_below_its_key_with_curators_names() {
        let owner = OwnerToken::from_hex("00112233445566778899aabbccddeeff").expect("hex");
        let key = LockKey::new("ns", "job").expect("key");
        for hold in [Hold::Read, Hold::Write] {
            let paths = LockPaths::of(&key, hold);
            assert_eq!(paths.parent, "/ns/job/rwlock");
            assert_eq!(paths.levels(), ["/ns/job/rwlock", "/ns/job"]);
        }
        assert_eq!(sequence_of(RWLOCK_DIR), None);
        let read = format!("{}0000000007", node_prefix(&owner, Hold::Read));
        let write = format!("{}0000000008", node_prefix(&owner, Hold::Write));
        assert_eq!(
            read,
            "_c_5947d7c3-3d78-3f94-b3b4-c1a96ebc8991-__READ__0000000007"
        );
        assert_eq!(
            write,
            "_c_5947d7c3-3d78-3f94-b3b4-c1a96ebc8991-__WRIT__0000000008"
        );
        assert_eq!(sequence_of(&read), Some(7));
        assert_eq!(sequence_of(&write), Some(8));
        assert_eq!(public_name(&read), "0000000007");
        assert_eq!(public_name(&write), "0000000008");
        assert!(!is_write_node(&read));
        assert!(is_write_node(&write));
        assert_eq!(permits_of(&read), None);
        // Curator's unprotected names sort in the same queue.
        let children = vec![
            write.clone(),
            "__READ__0000000003".to_owned(),
            read.clone(),
            "__WRIT__".to_owned(),
        ];
        assert_eq!(queue(children), ["__READ__0000000003", &read, &write]);
    }

    #[test]
    fn public_names_keep_only_the_sequence() {
        assert_eq!(
            public_name("_c_00112233-4455-6677-8899-aabbccddeeff-lock-0000000007"),
            "0000000007"
        );
        assert_eq!(public_name("lock-0000000002"), "0000000002");
    }
}
