//! Semaphores on ZooKeeper: the first `permits` nodes of a queue hold a permit, and each
//! waiter watches only what can change its place.
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

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::future::{join_all, select_all};
use lockkit_core::backend::{AcquireRequest, Attempt, Contention, Hold, Lease, OwnerToken};
use lockkit_core::{Error, Result};
use zookeeper_client as zk;

use crate::acquire::Step;
use crate::backend::{ZkBackend, within};
use crate::error::{BACKEND, map, timed_out};
use crate::naming::{LockPaths, node_id, node_prefix, permits_of, public_name, queue};
use crate::session::Session;

/// The data of a permit node: the owner's digest (never the token) and the count.
pub(crate) fn permit_data(owner: &OwnerToken, permits: u32) -> Vec<u8> {
    format!(r#"{{"owner":"{}","permits":{permits}}}"#, node_id(owner)).into_bytes()
}

/// The count of the first node among `nodes` that records another count than `permits`.
fn disagreeing(nodes: &[String], permits: u32) -> Option<u32> {
    nodes
        .iter()
        .filter_map(|node| permits_of(node))
        .find(|&recorded| recorded != permits)
}

/// The nodes a waiter at `index` of `queue` watches, and whether they are the holders (the
/// first waiter) rather than its predecessor. `None` for a holder.
fn watched(queue: &[String], index: usize, permits: usize) -> Option<(Vec<String>, bool)> {
    if index < permits {
        None
    } else if index == permits {
        Some((queue[..permits].to_vec(), true))
    } else {
        Some((vec![queue[index - 1].clone()], false))
    }
}

/// Whether a node granted at `index` of `queue` touches its node: someone behind it may
/// watch it as its predecessor.
fn must_touch(queue: &[String], index: usize) -> bool {
    queue.len() > index + 1
}

impl ZkBackend {
    /// A try without waiting, before it creates a node: contention when every permit is
    /// taken (or queued for), the mismatch when a node records another count.
    pub(crate) fn all_permits_taken(
        &self,
        request: &AcquireRequest,
        permits: u32,
        children: Vec<String>,
    ) -> Result<Option<Contention>> {
        let queue = queue(children);
        if let Some(recorded) = disagreeing(&queue, permits) {
            return Err(Hold::permits_mismatch(
                BACKEND,
                &request.key,
                permits,
                recorded,
            ));
        }
        // The last holder, as a waiter queued now would see its predecessor.
        Ok(queue
            .get((permits as usize).saturating_sub(1))
            .map(|last| Contention::new().with_predecessor(public_name(last), None)))
    }

    /// Decides from the queue whether our node `name` holds a permit (see the module docs):
    /// refuses a disagreeing count, records what a waiter watches, touches a grant's node
    /// when someone queues behind it. `stat` as for the mutex's
    /// [`evaluate`](ZkBackend::evaluate).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn evaluate_permit(
        &self,
        session: &Session,
        request: &AcquireRequest,
        permits: u32,
        paths: &LockPaths,
        name: &str,
        stat: Option<zk::Stat>,
        children: Vec<String>,
    ) -> Result<Step> {
        let token = &request.owner;
        let own_prefix = node_prefix(token, request.hold);
        self.delete_own_nodes(session, paths, &own_prefix, &children, Some(name))
            .await?;
        let mut queue = queue(children);
        queue.retain(|c| c == name || !c.starts_with(&own_prefix));
        let Some(index) = queue.iter().position(|c| c == name) else {
            self.pending().remove(token);
            return Ok(Step::Recreate);
        };
        let path = paths.child(name);
        if let Some(recorded) = disagreeing(&queue[..index], permits) {
            // Left in place if the delete fails: the core's abandon, which follows the
            // error, deletes it then.
            if self
                .delete_node(session, &path, "withdraw the permit request")
                .await
                .is_ok()
            {
                self.pending().remove(token);
            }
            return Err(Hold::permits_mismatch(
                BACKEND,
                &request.key,
                permits,
                recorded,
            ));
        }
        if let Some((nodes, first)) = watched(&queue, index, permits as usize) {
            let predecessor = queue[index - 1].clone();
            if let Some(entry) = self.pending().get_mut(token) {
                entry.predecessor = Some(predecessor.clone());
                entry.holders = if first { nodes } else { Vec::new() };
            }
            if !request.wait {
                self.delete_node(session, &path, "withdraw from the queue")
                    .await?;
                self.pending().remove(token);
            }
            let contention = Contention::new().with_predecessor(public_name(&predecessor), None);
            return Ok(Step::Done(Attempt::Contended(contention)));
        }
        let Some(stat) = self.own_stat(session, &path, stat).await? else {
            self.pending().remove(token);
            return Ok(Step::Recreate);
        };
        if must_touch(&queue, index) {
            let data = permit_data(token, permits);
            match within(
                self.timeout(),
                "touch the permit node",
                session.client.set_data(&path, &data, Some(stat.version)),
            )
            .await?
            {
                // Another version: it was touched since, which fired the watches already.
                Ok(_) | Err(zk::Error::BadVersion) => {}
                Err(zk::Error::NoNode) => {
                    self.pending().remove(token);
                    return Ok(Step::Recreate);
                }
                Err(e) => return Err(map("touch the permit node", e)),
            }
        }
        self.grant(session, request, name, stat.czxid)
            .map(Step::Done)
    }

    /// Waits until a node that can change our place changes (see the module docs),
    /// `max_wait` passes, or the session is lost.
    pub(crate) async fn wait_for_permit(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<()> {
        let session = self.session().await;
        // As for the mutex: without what to watch on the session holding our node, the next
        // attempt reads the queue afresh.
        let known = self
            .pending()
            .get(&request.owner)
            .filter(|p| p.session_id == session.id())
            .and_then(|p| Some((p.predecessor.clone()?, p.holders.clone())));
        let (Some((predecessor, holders)), Some(_)) = (known, &contention.predecessor) else {
            return Ok(());
        };
        let first = !holders.is_empty();
        let nodes = if first { holders } else { vec![predecessor] };
        let paths = LockPaths::of(&request.key, request.hold);
        let what = "watch the permit holders";
        let watches = join_all(
            nodes
                .iter()
                .map(|node| session.client.get_and_watch_data(&paths.child(node))),
        );
        let answers = tokio::time::timeout(self.timeout(), watches)
            .await
            .map_err(|_| timed_out(what))?;
        let mut watchers = Vec::with_capacity(answers.len());
        for answer in answers {
            match answer {
                Ok((_, stat, watcher)) => {
                    if !first && stat.version != 0 {
                        // The predecessor touched its node: it holds a permit now.
                        return Ok(());
                    }
                    watchers.push(Box::pin(watcher.changed()));
                }
                Err(zk::Error::NoNode) => return Ok(()),
                Err(e) => return Err(map(what, e)),
            }
        }
        tokio::select! {
            _ = select_all(watchers) => {
                self.inner.watch_events.fetch_add(1, Ordering::Relaxed);
            }
            () = tokio::time::sleep(max_wait) => {}
            () = session.lost.cancelled() => {}
        }
        Ok(())
    }

    /// Whether `lease` holds a permit, as the leader sees it: its node exists on the current
    /// session with the lease's czxid, among the first `permits` of the queue.
    pub(crate) async fn holds_permit(&self, lease: &Lease, permits: u32) -> Result<bool> {
        Ok(self
            .place_in_queue(lease)
            .await?
            .is_some_and(|(_, index)| index < permits as usize))
    }

    /// The queue of `lease`'s node (a semaphore's or a read-write lock's) as the leader sees
    /// it, with the node's index in it: `None` when the node is not on the current session
    /// with the lease's czxid. The other nodes of the lease's owner (strays of lost replies)
    /// are left out, as the grant leaves them out.
    pub(crate) async fn place_in_queue(
        &self,
        lease: &Lease,
    ) -> Result<Option<(Vec<String>, usize)>> {
        if lease.session_alive() == Some(false) {
            return Ok(None);
        }
        let session = self.session().await;
        let Some(path) = self.lease_node(&session, lease).await? else {
            return Ok(None);
        };
        let Some(name) = path.rsplit('/').next() else {
            return Ok(None);
        };
        let paths = LockPaths::of(lease.key(), lease.hold());
        let (children, stat) = match self.queue_via_leader(&session, &paths, name).await {
            Ok(read) => read,
            Err(e) if session_expired(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(stat) = stat else {
            return Ok(None);
        };
        if u64::try_from(stat.czxid).ok() != Some(lease.fencing_token().get()) {
            return Ok(None);
        }
        let own_prefix = node_prefix(lease.owner(), lease.hold());
        let mut queue = queue(children);
        queue.retain(|c| c == name || !c.starts_with(&own_prefix));
        Ok(queue
            .iter()
            .position(|c| c == name)
            .map(|index| (queue, index)))
    }
}

/// Whether `error` reports the session expired (its nodes are gone with it).
pub(crate) fn session_expired(error: &Error) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<zk::Error>())
        .is_some_and(|e| matches!(e, zk::Error::SessionExpired))
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
        assert_eq!(watched(&queue, 2, 2), Some((queue[..2].to_vec(), true)));
        assert_eq!(watched(&queue, 3, 2), Some((vec![queue[2].clone()], false)));
        assert_eq!(watched(&queue, 4, 2), Some((vec![queue[3].clone()], false)));
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
