//! How the ZooKeeper backend names things: a lock's parent znode, and each acquisition's
//! node `_c_{uuid}-lock-{sequence}`, as Curator's `InterProcessMutex` does.

use lockkit_core::LockKey;
use lockkit_core::backend::OwnerToken;

/// The part of a lock node's name between the owner and the sequence number, as Curator's
/// `InterProcessMutex` names it.
pub(crate) const LOCK_NAME: &str = "-lock-";

/// The znode paths of one lock, relative to the chroot.
#[derive(Clone)]
pub(crate) struct LockPaths {
    pub(crate) namespace: String,
    pub(crate) parent: String,
}

impl LockPaths {
    pub(crate) fn new(key: &LockKey) -> Self {
        let namespace = format!("/{}", key.namespace());
        let parent = format!("{namespace}/{}", key.name());
        LockPaths { namespace, parent }
    }

    pub(crate) fn child(&self, name: &str) -> String {
        format!("{}/{name}", self.parent)
    }
}

/// `_c_{uuid}-lock-`: the start of the name of `owner`'s node, where `{uuid}` is the
/// [`node_id`] of the owner token.
pub(crate) fn own_prefix(owner: &OwnerToken) -> String {
    format!("_c_{}{LOCK_NAME}", uuid_form(&node_id(owner)))
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

/// The sequence number of a lock node name (the digits after the last `-lock-`, or after
/// `lock-` at the start for Curator's unprotected names).
pub(crate) fn sequence_of(name: &str) -> Option<i64> {
    let digits = match name.rfind(LOCK_NAME) {
        Some(i) => &name[i + LOCK_NAME.len()..],
        None => name.strip_prefix(&LOCK_NAME[1..])?,
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// What is shown of a node name (in a lease's handle, a contention, `Debug` output): its
/// sequence number, which is all a reader needs.
pub(crate) fn public_name(name: &str) -> String {
    let start = name.rfind(LOCK_NAME).map_or(0, |i| i + LOCK_NAME.len());
    name[start..].trim_start_matches("lock-").to_owned()
}

/// The lock nodes among `children`, lowest sequence first.
pub(crate) fn queue(mut children: Vec<String>) -> Vec<String> {
    children.retain(|c| sequence_of(c).is_some());
    children.sort_by_key(|c| sequence_of(c));
    children
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
    fn public_names_keep_only_the_sequence() {
        assert_eq!(
            public_name("_c_00112233-4455-6677-8899-aabbccddeeff-lock-0000000007"),
            "0000000007"
        );
        assert_eq!(public_name("lock-0000000002"), "0000000002");
    }
}
