//! Semaphores on ZooKeeper: the first `permits` nodes of a queue hold a permit, and each
//! waiter watches only what can change its place.
//!
//! The attempt, the waits and `is_held` are every kind's (`acquire.rs`, `wait.rs`,
//! `renewal.rs`); this file has the semaphore's rules, which `Kind::Permit` applies (the
//! node's data, the refusal of another count, what a waiter watches, when a grant touches),
//! the touch itself, and the argument that they are enough.
//!
//! # Decisions
//! - **Where the queue lives.** The semaphore `{namespace}/{name}` queues under
//!   `{chroot}/{namespace}/{name}/semaphore`, a container node below the mutex's parent of
//!   the same name: no lock node can be named `semaphore` (sequential names end in ten
//!   digits), so the mutex's queue (lockkit's, and Curator's `InterProcessMutex`, which sorts
//!   it after every lock node) never counts it, and no other valid name (names have no `/`)
//!   reaches it. Both are under the namespace node, where the conformance suite looks for
//!   leftovers. The janitor removes the semaphore's parent, then the key's node, once idle.
//! - **The nodes.** Each acquisition creates one `EPHEMERAL_SEQUENTIAL` node
//!   `_c_{uuid}-permits-{n}-lock-{sequence}` (`{uuid}` from the digest of the owner token, as
//!   for the mutex, so a lost reply finds the node again and no name shows the token). Its
//!   data is the owner digest and the count, `{"owner":"…","permits":n}`; the count is in
//!   the name too, so that one listing tells every node's count without reading any data.
//!   The nodes ordered by sequence are the queue; the first `n` hold a permit. The fencing
//!   token is the node's czxid: nodes enter the first `n` in sequence order (a node's place
//!   only drops, by deletions ahead of it, and a new node queues behind every live one),
//!   and sequence order is creation order, which is czxid order; so the tokens increase
//!   with every grant of the semaphore, across leader changes.
//! - **Disagreeing counts.** A request whose count differs from that of any node ahead of its
//!   own is refused with [`Hold::permits_mismatch`] (`InvalidConfig`), after deleting its own
//!   node: it leaves nothing. A try without waiting that finds a node with another count is
//!   refused before it creates one. Why nodes *ahead* suffice: take two grants with other
//!   counts, both live at the later grant; the earlier-created of the two nodes is ahead of
//!   the other and alive at both grants, so the later-created one's grant read a listing with
//!   it ahead, and was refused. (The head's count alone would not do: with the nodes
//!   `W(2) < Z(1) < A(2)`, `A` reading while `W` leads and `Z` reading after `W` left both
//!   pass.) Nodes behind do not matter, so a well-configured client already queued is not
//!   refused because a misconfigured one queued after it.
//! - **Renewal** is the session's, as for the mutex: a permit's node lives while the session
//!   does, and its place can only improve. **`is_held`** asks, after a `sync`, that the node
//!   exist with the lease's czxid on the current session, and be among the first `n`.
//!
//! # Waiting without a herd
//! The core sets no timer on a queue wait ([`WaitStrategy::Queue`]), so a waiter must be
//! woken whenever its status may have changed. A waiter at place `k` (0-based, `k ≥ n`) is
//! the *first waiter* when `k = n`, a *later waiter* when `k > n`; it becomes a holder when
//! `k < n`.
//! - The first waiter watches (a data watch, which also fires on deletion) each of the `n`
//!   holders: exactly the nodes ahead of it, so any departure, the only thing that moves it,
//!   wakes it. No children watch: the nodes that new waiters add would fire it.
//! - A later waiter watches only its predecessor (`k − 1`), with a data watch.
//! - A node that is granted while the listing shows nodes behind it sets its own data again
//!   (the same bytes, guarded by the version it read): a *touch*.
//!
//! Why nothing is missed: places change only by deletions ahead. The first waiter watches
//! everything ahead of it. A later waiter `W`'s status changes only when its place reaches
//! `n`; then either its predecessor `P` was deleted (`W`'s watch fires), or `P` is still just
//! ahead of `W` (nodes are only ever added behind) and now at a place below `n`: `P` went
//! from waiter to holder. `P`, ahead of `W`, was woken by the same argument (by induction
//! from the first waiter backwards), re-read the queue, found itself granted with `W`
//! behind it, and touched its node, which fires `W`'s watch. The watches are set after the
//! listing that chose them, so a change in between is checked when they are set: a watched
//! node already gone answers `NoNode`, and a predecessor that already touched shows a data
//! version other than 0 (a node is created at version 0, and only its grant touches it).
//! The touch depends on the listing of the grant, not on whether the node waited before:
//! a node may be granted at its first look while a node behind it, listing earlier, still
//! saw it as a waiter. A release thus wakes the first waiter and, if it is granted, the
//! waiter behind it (which then watches the holders): two wake-ups, whatever the number of
//! waiters. Session expiry and suspension end a wait as for the mutex; a watch lost with its
//! session fires with the session event.
//!
//! [`WaitStrategy::Queue`]: lockkit_core::WaitStrategy::Queue

use lockkit_core::Result;
use lockkit_core::backend::OwnerToken;
use zookeeper_client as zk;

use crate::acquire::Watch;
use crate::backend::{ZkBackend, within};
use crate::error::map;
use crate::naming::{node_id, permits_of};
use crate::session::Session;

/// The data of a permit node: the owner's digest (never the token) and the count.
pub(crate) fn permit_data(owner: &OwnerToken, permits: u32) -> Vec<u8> {
    format!(r#"{{"owner":"{}","permits":{permits}}}"#, node_id(owner)).into_bytes()
}

/// The count of the first node among `nodes` that records another count than `permits`.
pub(crate) fn disagreeing(nodes: &[String], permits: u32) -> Option<u32> {
    nodes
        .iter()
        .filter_map(|node| permits_of(node))
        .find(|&recorded| recorded != permits)
}

/// What a waiter at `index` of `queue` watches: the holders for the first waiter, its
/// predecessor for a later one. `None` for a holder.
pub(crate) fn watched(queue: &[String], index: usize, permits: usize) -> Option<Watch> {
    if index < permits {
        None
    } else if index == permits {
        Some(Watch::Departure(queue[..permits].to_vec()))
    } else {
        Some(Watch::Changed(queue[index - 1].clone()))
    }
}

/// Whether a node granted at `index` of `queue` touches its node: someone behind it may
/// watch it as its predecessor.
pub(crate) fn must_touch(queue: &[String], index: usize) -> bool {
    queue.len() > index + 1
}

impl ZkBackend {
    /// Touches our permit node `path` (sets its `data` again, guarded by the `version` the
    /// grant read), which fires the data watch of the waiter behind it. `false` when the
    /// node is gone.
    pub(crate) async fn touch(
        &self,
        session: &Session,
        path: &str,
        data: &[u8],
        version: i32,
    ) -> Result<bool> {
        match within(
            self.timeout(),
            "touch the permit node",
            session.client.set_data(path, data, Some(version)),
        )
        .await?
        {
            // Another version: it was touched since, which fired the watches already.
            Ok(_) | Err(zk::Error::BadVersion) => Ok(true),
            Err(zk::Error::NoNode) => Ok(false),
            Err(e) => Err(map("touch the permit node", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(count: usize) -> Vec<String> {
        (0..count)
            .map(|i| format!("_c_{i}-permits-2-lock-{i:010}"))
            .collect()
    }

    #[test]
    fn the_first_waiter_watches_the_holders_and_later_ones_their_predecessor() {
        let queue = names(5);
        assert_eq!(watched(&queue, 0, 2), None);
        assert_eq!(watched(&queue, 1, 2), None);
        assert_eq!(
            watched(&queue, 2, 2),
            Some(Watch::Departure(queue[..2].to_vec()))
        );
        assert_eq!(
            watched(&queue, 3, 2),
            Some(Watch::Changed(queue[2].clone()))
        );
        assert_eq!(
            watched(&queue, 4, 2),
            Some(Watch::Changed(queue[3].clone()))
        );
    }

    /// A holder with anyone behind it touches, even granted at its first look: a node
    /// behind may have listed while it was still a waiter.
    #[test]
    fn a_grant_touches_its_node_when_anyone_queues_behind_it() {
        let queue = names(3);
        assert!(must_touch(&queue, 0));
        assert!(must_touch(&queue, 1));
        assert!(!must_touch(&queue, 2));
    }

    #[test]
    fn only_another_count_disagrees() {
        let mut queue = names(3);
        assert_eq!(disagreeing(&queue, 2), None);
        assert_eq!(disagreeing(&queue, 3), Some(2));
        queue.push("lock-0000000009".into());
        assert_eq!(disagreeing(&queue, 2), None, "a node without a count");
    }

    #[test]
    fn permit_data_carries_the_digest_and_the_count_not_the_token() {
        let owner = OwnerToken::from_hex("00112233445566778899aabbccddeeff").expect("hex");
        let data = String::from_utf8(permit_data(&owner, 3)).expect("utf-8");
        assert_eq!(
            data,
            format!(r#"{{"owner":"{}","permits":3}}"#, node_id(&owner))
        );
        assert!(!data.contains(&owner.expose_hex()));
    }
}
