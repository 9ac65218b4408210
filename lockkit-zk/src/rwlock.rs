//! Read-write locks on ZooKeeper: one queue of readers' and writers' nodes; a reader holds
//! while no writer's node is ahead of its own, a writer while its node is first.
//!
//! The attempt, the waits and `is_held` are every kind's (`acquire.rs`, `wait.rs`,
//! `renewal.rs`); this file has the rule `Kind::Read` and `Kind::Write` apply (what keeps a
//! node out, which is also what it watches) and the argument that it is enough.
//!
//! # Decisions
//! - **Where the queue lives.** The read-write lock `{namespace}/{name}` queues under
//!   `{chroot}/{namespace}/{name}/rwlock`, a container node below the mutex's parent of the
//!   same name, beside the semaphore's `…/semaphore`, for the same reasons (see
//!   `semaphore.rs`): no lock node can be named `rwlock`, so neither the mutex's queue nor
//!   the semaphore's counts it; it is under the namespace node, where the conformance suite
//!   looks for leftovers; the janitor removes it, then the key's node, once idle. Not being
//!   the mutex's queue, it is not inspected, listed or broken as a lock.
//! - **The nodes** are `EPHEMERAL_SEQUENTIAL`, named as Curator's
//!   `InterProcessReadWriteLock` names its own: `_c_{uuid}-__READ__{sequence}` for a reader,
//!   `_c_{uuid}-__WRIT__{sequence}` for a writer (`{uuid}` from the digest of the owner
//!   token, as for the mutex: a lost reply finds the node again by this prefix, and no name
//!   shows the token). Their data is empty. Curator sorts all the children of the lock's
//!   path by what follows the last `__READ__`/`__WRIT__`, the sequence, and tells a writer's
//!   node by `__WRIT__` in its name, as lockkit does: a Curator `InterProcessReadWriteLock`
//!   on `/{namespace}/{name}/rwlock` under lockkit's chroot and lockkit's read-write lock
//!   `name` are one lock (`tests/interop_curator.rs`).
//! - **The grant.** The nodes ordered by sequence are the queue. A reader holds when no
//!   writer's node is ahead of its own; a writer when its node is first. A writer's node
//!   thus blocks every reader queued after it, whether it holds or waits: a stream of
//!   readers cannot starve it. Both conditions, once true, stay true (nodes are only ever
//!   added behind, and a node's place only improves by deletions ahead), so a grant decided
//!   from any listing read after the node's create holds; a node found again (after a wait,
//!   or a lost reply) is read through the leader (a `sync` first) before a grant, as for the
//!   mutex.
//! - **The fencing token** is the node's czxid, as for the mutex and the semaphore. Why a
//!   write's token is above every earlier grant's of the key: let `W` be granted at `t`, and
//!   `G` a grant before `t`. `W`'s node exists from its create until after `t`. Had `G`'s
//!   node been created after `W`'s, it would be behind `W` in the queue from its create on,
//!   with `W` in every listing `G` read (a listing on `G`'s session follows `G`'s create):
//!   a writer `G` would not be first, a reader `G` would have a writer ahead, and neither
//!   would be granted before `t`. So `G`'s node was created before `W`'s (a parent deleted
//!   and created again in between changes nothing: the server deletes a container only once
//!   it is empty, so every node of the old parent was created before the new parent). The
//!   czxid is the zxid of the creating transaction, globally ordered, so `G`'s is lower.
//!   Readers' tokens are in any order among themselves.
//! - **Renewal, release, abandon, lost signal** are the mutex's: a node lives while the
//!   session does, and the acquisition's clean-up deletes what a try, a timeout or a
//!   dropped acquisition left. **`is_held`** asks, after a `sync`, that the node exist with
//!   the lease's czxid on the current session, and still meet its grant condition.
//!
//! # Waiting without a herd
//! The core sets no timer on a queue wait ([`WaitStrategy::Queue`]), so a waiter must be
//! woken whenever its status may have changed. A waiting reader watches the nearest
//! writer's node ahead of its own; a waiting writer its predecessor (either kind). Both
//! watches are on the node's existence, and are set after the listing that chose them, so
//! a node already gone answers at once.
//!
//! Why nothing is missed: a reader's status changes only when the last writer's node ahead
//! of it goes, and that is the nearest one, which it watches; a writer's only when every
//! node ahead of it has gone, the predecessor among them. A deletion that leaves the waiter
//! still blocked (a writer further ahead, an abandoned node) wakes it to watch the next one.
//! A release wakes only the waiters that watch the released node: the writer just behind
//! it, or the readers queued between it and the next writer, who are all granted together
//! (Curator does the same). Session expiry and suspension end a wait as for the mutex; a
//! watch lost with its session fires with the session event.
//!
//! [`WaitStrategy::Queue`]: lockkit_core::WaitStrategy::Queue

use lockkit_core::backend::Hold;

use crate::naming::is_write_node;

/// What keeps the node at `index` of `queue` from its grant as `hold`, and what it watches
/// meanwhile: for a reader the nearest writer's node ahead, for a writer (and a mutex) its
/// predecessor. `None` when it holds.
pub(crate) fn blocker(queue: &[String], index: usize, hold: Hold) -> Option<&String> {
    match hold {
        Hold::Read => queue[..index].iter().rev().find(|n| is_write_node(n)),
        _ => index.checked_sub(1).map(|i| &queue[i]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acquire::{Kind, Place};

    fn node(kind: &str, sequence: usize) -> String {
        format!("_c_{sequence}-{kind}{sequence:010}")
    }

    /// W1 R2 R3 W4 R5: the readers ahead of W4 wait for W1 only, W4 for R3 (its
    /// predecessor), R5 for W4.
    #[test]
    fn a_reader_watches_the_nearest_writer_ahead_and_a_writer_its_predecessor() {
        let queue = vec![
            node("__WRIT__", 1),
            node("__READ__", 2),
            node("__READ__", 3),
            node("__WRIT__", 4),
            node("__READ__", 5),
        ];
        assert_eq!(blocker(&queue, 0, Hold::Write), None);
        assert_eq!(blocker(&queue, 1, Hold::Read), Some(&queue[0]));
        assert_eq!(blocker(&queue, 2, Hold::Read), Some(&queue[0]));
        assert_eq!(blocker(&queue, 3, Hold::Write), Some(&queue[2]));
        assert_eq!(blocker(&queue, 4, Hold::Read), Some(&queue[3]));
        // With W1 gone, R2 and R3 hold together; W4 still waits for R3.
        let queue = queue[1..].to_vec();
        assert_eq!(blocker(&queue, 0, Hold::Read), None);
        assert_eq!(blocker(&queue, 1, Hold::Read), None);
        assert_eq!(blocker(&queue, 2, Hold::Write), Some(&queue[1]));
    }

    #[test]
    fn a_try_is_refused_by_a_writer_for_a_reader_and_by_anyone_for_a_writer() {
        // A try's node joins the end of the queue (`own`); it holds, or withdraws.
        let holds = |kind: Kind, mut queue: Vec<String>, own: String| {
            queue.push(own);
            matches!(kind.place(&queue, queue.len() - 1), Place::Holds { .. })
        };
        let readers = vec![node("__READ__", 1), node("__READ__", 2)];
        assert!(holds(Kind::Read, readers.clone(), node("__READ__", 3)));
        assert!(!holds(Kind::Write, readers.clone(), node("__WRIT__", 3)));
        assert!(holds(Kind::Write, Vec::new(), node("__WRIT__", 1)));
        let mut queued = readers;
        queued.push(node("__WRIT__", 3));
        assert!(!holds(Kind::Read, queued, node("__READ__", 4)));
    }
}
