//! The one attempt of every kind of grant on ZooKeeper (a mutex, a permit, a read or a write
//! lock): creating the own node (and the lock's parent), finding it again after a lost
//! reply, and deciding from the queue; then the grant, or what to wait for.
//!
//! It is Curator's `LockInternals` loop with a small per-recipe driver, as lockkit-etcd's
//! `attempt` is: the attempt and the grant are the same for every kind, and a [`Kind`]
//! decides only the node's data and the place its node has in the queue (the proofs are in
//! `semaphore.rs` and `rwlock.rs`). A mutex is a writer over its own queue: it holds when
//! its node is first. A try queues its node as a wait does and withdraws it if it would
//! wait, so a free lock's try is one round trip (the create and its listing).

use lockkit_core::backend::{AcquireRequest, Attempt, Contention, Grant, Hold, OwnerToken};
use lockkit_core::{Error, ErrorKind, FencingToken, LockKey, Result};
use zookeeper_client as zk;

use crate::backend::{ZkBackend, within};
use crate::cleanup::{Pending, PendingNode};
use crate::error::{BACKEND, map, timed_out};
use crate::naming::{LockPaths, node_prefix, public_name, queue, sequence_of};
use crate::rwlock::blocker;
use crate::semaphore::{disagreeing, must_touch, permit_data, watched};
use crate::session::{Session, is_connected};

/// How many times one call goes again when the queue changed under it (a node or the lock's
/// parent gone between two of its requests) before it reports a retryable error.
pub(crate) const MAX_ROUNDS: usize = 4;

/// What decides a grant for one kind of request (Curator's driver): the own node's data and
/// where the own node stands in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A mutex: holds when its node is first.
    Exclusive,
    /// A reader: holds when no writer's node is ahead of its own.
    Read,
    /// A writer: holds when its node is first.
    Write,
    /// A permit of a semaphore of this many: holds among the first that many nodes.
    Permit(u32),
}

/// Where the own node stands in one listing of the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Place {
    /// It holds; `touch`: a node queued behind it may be watching for the moment it holds.
    Holds { touch: bool },
    /// It waits, for this.
    Waits(Watch),
}

/// What a waiting node waits for (node names, under the queue's parent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Watch {
    /// The deletion of this node: the nearest node that keeps the own one out (a mutex's and
    /// a writer's predecessor, a reader's nearest writer ahead).
    Deleted(String),
    /// The deletion or the touch of this node: a semaphore waiter's predecessor, which may
    /// hold next.
    Changed(String),
    /// A departure among these nodes, every one ahead of the own node: the semaphore's first
    /// waiter watches the holders.
    Departure(Vec<String>),
}

impl Watch {
    /// The node a contention shows: the watched node, or the last holder.
    fn shown(&self) -> &str {
        match self {
            Watch::Deleted(node) | Watch::Changed(node) => node,
            Watch::Departure(holders) => holders.last().map_or("", String::as_str),
        }
    }
}

impl Kind {
    /// The kind of `hold`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] for a semaphore of no permits; `Unsupported` for a hold
    /// this backend does not know.
    pub(crate) fn of(hold: Hold) -> Result<Kind> {
        match hold {
            Hold::Exclusive => Ok(Kind::Exclusive),
            Hold::Read => Ok(Kind::Read),
            Hold::Write => Ok(Kind::Write),
            Hold::Permit { permits: 0 } => {
                Err(Error::invalid_config("a semaphore needs at least 1 permit"))
            }
            Hold::Permit { permits } => Ok(Kind::Permit(permits)),
            other => Err(other.unsupported(BACKEND)),
        }
    }

    /// The data of `owner`'s node: a permit's records its owner's digest and the count, the
    /// others are empty.
    fn data(self, owner: &OwnerToken) -> Vec<u8> {
        match self {
            Kind::Permit(permits) => permit_data(owner, permits),
            _ => Vec::new(),
        }
    }

    /// The refusal of a permit request when a node among `ahead` records another count
    /// (see `semaphore.rs` for why the nodes ahead suffice); `None` for the other kinds.
    fn mismatch(self, key: &LockKey, ahead: &[String]) -> Option<Error> {
        let Kind::Permit(permits) = self else {
            return None;
        };
        disagreeing(ahead, permits)
            .map(|recorded| Hold::permits_mismatch(BACKEND, key, permits, recorded))
    }

    /// Where the node at `index` of `queue` stands.
    pub(crate) fn place(self, queue: &[String], index: usize) -> Place {
        let waits = match self {
            Kind::Exclusive | Kind::Write => {
                blocker(queue, index, Hold::Write).map(|node| Watch::Deleted(node.clone()))
            }
            Kind::Read => {
                blocker(queue, index, Hold::Read).map(|node| Watch::Deleted(node.clone()))
            }
            Kind::Permit(permits) => watched(queue, index, permits as usize),
        };
        match waits {
            Some(watch) => Place::Waits(watch),
            None => Place::Holds {
                touch: matches!(self, Kind::Permit(_)) && must_touch(queue, index),
            },
        }
    }
}

/// The own node as an attempt found it, and the queue's listing.
struct Found {
    /// The node's name.
    name: String,
    /// Its stat, when known to be the leader's (see `evaluate`).
    stat: Option<zk::Stat>,
    /// The children of the queue's parent.
    children: Vec<String>,
}

/// What evaluating the queue decided.
enum Step {
    Done(Attempt),
    /// Our node is gone (deleted by an operator, or the session changed): start over.
    Recreate,
}

impl ZkBackend {
    /// One acquisition attempt of any kind (see the module docs and
    /// [`LockBackend::try_acquire`](lockkit_core::backend::LockBackend::try_acquire)).
    pub(crate) async fn attempt(&self, request: &AcquireRequest) -> Result<Attempt> {
        let kind = Kind::of(request.hold)?;
        let session = self.session().await;
        let paths = LockPaths::of(&request.key, request.hold);
        let own = node_prefix(&request.owner, request.hold);
        let token = &request.owner;
        for _ in 0..MAX_ROUNDS {
            let known = self
                .pending()
                .get(token)
                .filter(|p| p.session_id == session.id())
                .map(|p| p.node.clone());
            let found = match known {
                // Nodes found again, rather than created by this call, are verified through
                // the leader before a grant: the queue is listed after a sync, and a stat is
                // passed on only when read after it, or known from the node's create (its
                // czxid and owner cannot change, and the synced listing shows the node is
                // still there). A semaphore's permit reads it again: its version changes.
                Some(PendingNode::Created { name, stat }) => match stat {
                    Some(stat) if !matches!(kind, Kind::Permit(_)) => Found {
                        children: self.queue_after_sync(&session, &paths).await?,
                        name,
                        stat: Some(stat),
                    },
                    _ => {
                        let (children, stat) =
                            self.queue_via_leader(&session, &paths, &name).await?;
                        Found {
                            name,
                            stat,
                            children,
                        }
                    }
                },
                Some(PendingNode::InFlight) => {
                    let children = self.children(&session, &paths.parent).await?;
                    match self.find_own(&session, &paths, &own, &children).await? {
                        Some(name) => Found {
                            name,
                            stat: None,
                            children,
                        },
                        None => {
                            self.pending().remove(token);
                            continue;
                        }
                    }
                }
                // A try queues its node as a wait does, and withdraws it if it would wait
                // (as Curator's `acquire(0)` does): a free lock's try costs the create and
                // its listing, one round trip, and a held one's a delete more.
                None => {
                    self.create_node(&session, &paths, &own, token, &kind.data(token))
                        .await?
                }
            };
            match self
                .evaluate(&session, request, kind, &paths, found)
                .await?
            {
                Step::Done(attempt) => return Ok(attempt),
                Step::Recreate => continue,
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            BACKEND,
            "the lock node kept disappearing while acquiring",
        )
        .with_retryable(true))
    }

    /// Creates our node (with `data`) and lists the queue: both requests are sent back to
    /// back, so the step costs about one round trip (the session's requests are applied in
    /// order, so the listing sees the node). A missing parent is created (a container node)
    /// and the step tried again. Answers the node's name, its stat when the create's answer
    /// carried a valid one, and the listing.
    async fn create_node(
        &self,
        session: &Session,
        paths: &LockPaths,
        own_prefix: &str,
        token: &OwnerToken,
        data: &[u8],
    ) -> Result<Found> {
        self.inner.janitor.keep(paths);
        for _ in 0..MAX_ROUNDS {
            self.pending().insert(
                token.clone(),
                Pending {
                    session_id: session.id(),
                    node: PendingNode::InFlight,
                    watch: None,
                },
            );
            let node = self.node_options();
            let prefix = paths.child(own_prefix);
            // Unanswered, the create may still be applied: the acquisition's clean-up then
            // sweeps through the leader until it is settled.
            let sending = self.ledger(token).send();
            let created = session.client.create(&prefix, data, &node);
            let listed = session.client.list_children(&paths.parent);
            let Ok((created, listed)) =
                tokio::time::timeout(self.timeout(), async { tokio::join!(created, listed) }).await
            else {
                self.sweep_later(
                    session.id(),
                    paths,
                    own_prefix,
                    token,
                    self.ledger(token),
                    self.session_timeout(),
                );
                return Err(timed_out("create the lock node"));
            };
            if let Ok(_)
            | Err(
                zk::Error::NoNode
                | zk::Error::NodeExists
                | zk::Error::NoAuth
                | zk::Error::InvalidAcl
                | zk::Error::NoChildrenForEphemerals
                | zk::Error::BadArguments(_),
            ) = &created
            {
                sending.answered();
            }
            match created {
                Ok((stat, sequence)) => {
                    let name = format!("{own_prefix}{sequence}");
                    // ZOOKEEPER-4026 (servers before 3.8.2) answers a create inside a multi
                    // with an invalid Stat; a plain create is fine, but should the Stat be
                    // invalid the czxid is read separately before a grant.
                    let stat = (!stat.is_invalid() && stat.czxid > 0).then_some(stat);
                    self.pending().insert(
                        token.clone(),
                        Pending {
                            session_id: session.id(),
                            node: PendingNode::Created {
                                name: name.clone(),
                                stat,
                            },
                            watch: None,
                        },
                    );
                    let children = match listed {
                        Ok(children) => children,
                        Err(_) => self.children(session, &paths.parent).await?,
                    };
                    return Ok(Found {
                        name,
                        stat,
                        children,
                    });
                }
                Err(zk::Error::NoNode) => {
                    // Nothing was created: make the parent and go again.
                    self.pending().remove(token);
                    self.create_parents(session, paths).await?;
                }
                Err(
                    e @ (zk::Error::NoAuth
                    | zk::Error::InvalidAcl
                    | zk::Error::NoChildrenForEphemerals
                    | zk::Error::BadArguments(_)),
                ) => {
                    self.pending().remove(token);
                    return Err(map("create the lock node", e));
                }
                // A lost reply: the node may exist. The entry stays in flight, so the next
                // attempt (or abandon) looks for it by name; and since the create may still
                // commit after they looked, a sweep comes back for it later.
                Err(e) => {
                    self.sweep_later(
                        session.id(),
                        paths,
                        own_prefix,
                        token,
                        self.ledger(token),
                        self.session_timeout(),
                    );
                    return Err(map("create the lock node", e));
                }
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            BACKEND,
            "the lock's parent kept disappearing while creating the lock node",
        )
        .with_retryable(true))
    }

    /// Creates the lock's parent, and what is missing above it: the key's node (above a
    /// semaphore's parent), the namespace node (first use, or deleted by the server as an
    /// empty container) and the chroot (deleted by the server when another client created it
    /// as a container, see [`Self::recreate_chroot`]). A level that vanishes again meanwhile
    /// is left to the caller's next round.
    async fn create_parents(&self, session: &Session, paths: &LockPaths) -> Result<()> {
        let mut levels = paths.levels();
        levels.push(&paths.namespace);
        let mut missing = 0;
        while missing < levels.len() && !self.create_container(session, levels[missing]).await? {
            missing += 1;
        }
        if missing == levels.len() {
            // Only the chroot is above the namespace node.
            self.recreate_chroot(session).await?;
        }
        for level in levels[..missing].iter().rev() {
            self.create_container(session, level).await?;
        }
        Ok(())
    }

    /// Creates the container node `path` unless it exists; `false` when its parent is missing.
    async fn create_container(&self, session: &Session, path: &str) -> Result<bool> {
        match within(
            self.timeout(),
            "create the lock's parent",
            session.client.create(path, &[], &self.container_options()),
        )
        .await?
        {
            Ok(_) | Err(zk::Error::NodeExists) => Ok(true),
            Err(zk::Error::NoNode) => Ok(false),
            Err(e) => Err(map("create the lock's parent", e)),
        }
    }

    /// Finds the nodes named `own_prefix…` an earlier attempt left: the lowest is kept,
    /// duplicates (from a create retried after a lost reply) are deleted.
    async fn find_own(
        &self,
        session: &Session,
        paths: &LockPaths,
        own_prefix: &str,
        children: &[String],
    ) -> Result<Option<String>> {
        let Some(first) = children
            .iter()
            .filter(|c| c.starts_with(own_prefix) && sequence_of(c).is_some())
            .min_by_key(|c| sequence_of(c))
            .cloned()
        else {
            return Ok(None);
        };
        self.delete_own_nodes(session, paths, own_prefix, children, Some(&first))
            .await?;
        Ok(Some(first))
    }

    /// Decides from the queue where our node stands, as `kind` places it: a request whose
    /// count disagrees is refused (its node withdrawn), a waiter records what it watches (a
    /// try withdraws its node), a holder touches its node when `kind` asks, and is granted.
    ///
    /// The node's stat is known when the node was created by this call (the create went
    /// through the leader after the request was sent, and the listing, same session, after
    /// it, is at least that recent) or read after a `sync`. Without it the node was found in
    /// a listing that a server cut off from the leader may have served stale, so a grant
    /// first syncs with the leader and reads the node again.
    async fn evaluate(
        &self,
        session: &Session,
        request: &AcquireRequest,
        kind: Kind,
        paths: &LockPaths,
        found: Found,
    ) -> Result<Step> {
        let Found {
            name,
            stat,
            children,
        } = found;
        let token = &request.owner;
        let own_prefix = node_prefix(token, request.hold);
        self.delete_own_nodes(session, paths, &own_prefix, &children, Some(&name))
            .await?;
        let mut queue = queue(children);
        queue.retain(|c| *c == name || !c.starts_with(&own_prefix));
        let Some(index) = queue.iter().position(|c| *c == name) else {
            self.pending().remove(token);
            return Ok(Step::Recreate);
        };
        let path = paths.child(&name);
        if let Some(refused) = kind.mismatch(&request.key, &queue[..index]) {
            // Left in place if the delete fails: the core's abandon, which follows the
            // error, deletes it then.
            if self
                .delete_node(session, &path, "withdraw the permit request")
                .await
                .is_ok()
            {
                self.pending().remove(token);
            }
            return Err(refused);
        }
        let touch = match kind.place(&queue, index) {
            Place::Holds { touch } => touch,
            Place::Waits(watch) => {
                let contention =
                    Contention::new().with_predecessor(public_name(watch.shown()), None);
                if let Some(entry) = self.pending().get_mut(token) {
                    entry.watch = Some(watch);
                }
                if !request.wait {
                    self.delete_node(session, &path, "withdraw from the queue")
                        .await?;
                    self.pending().remove(token);
                }
                return Ok(Step::Done(Attempt::Contended(contention)));
            }
        };
        // Re-verify before granting: the node is ours on a live session, and its czxid.
        let Some(stat) = self.own_stat(session, &path, stat).await? else {
            self.pending().remove(token);
            return Ok(Step::Recreate);
        };
        if touch
            && !self
                .touch(session, &path, &kind.data(token), stat.version)
                .await?
        {
            self.pending().remove(token);
            return Ok(Step::Recreate);
        }
        self.grant(session, request, &name, stat.czxid)
            .map(Step::Done)
    }

    /// The grant of our node `name` (of czxid `czxid`), unless the session was suspended
    /// meanwhile.
    fn grant(
        &self,
        session: &Session,
        request: &AcquireRequest,
        name: &str,
        czxid: i64,
    ) -> Result<Attempt> {
        if session.lost.is_cancelled() || !is_connected(&session.client) {
            return Err(Error::new(
                ErrorKind::Unavailable,
                BACKEND,
                "the session was suspended while granting; trying again",
            ));
        }
        if let Some(entry) = self.pending().get_mut(&request.owner)
            && !matches!(&entry.node, PendingNode::Created { name: known, .. } if known == name)
        {
            entry.node = PendingNode::Created {
                name: name.to_owned(),
                stat: None,
            };
        }
        let fencing = u64::try_from(czxid).map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                BACKEND,
                format!("the lock node has an invalid czxid {czxid}"),
            )
        })?;
        let grant = Grant::new(FencingToken(fencing), self.trusted_for(request.ttl))
            .with_handle(public_name(name))
            .with_session(session.lost.clone());
        Ok(Attempt::Granted(grant))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(kind: &str, sequence: usize) -> String {
        format!("_c_{sequence}-{kind}{sequence:010}")
    }

    /// A mutex is a writer over its own queue, and only a permit's grant touches its node.
    #[test]
    fn each_kind_waits_for_what_keeps_it_out_and_only_a_permit_touches() {
        let locks: Vec<String> = (1..=3).map(|i| node("lock-", i)).collect();
        assert_eq!(
            Kind::Exclusive.place(&locks, 0),
            Place::Holds { touch: false }
        );
        assert_eq!(
            Kind::Exclusive.place(&locks, 2),
            Place::Waits(Watch::Deleted(locks[1].clone()))
        );
        let rw = vec![
            node("__WRIT__", 1),
            node("__READ__", 2),
            node("__READ__", 3),
        ];
        assert_eq!(
            Kind::Read.place(&rw, 2),
            Place::Waits(Watch::Deleted(rw[0].clone()))
        );
        assert_eq!(Kind::Read.place(&rw[1..], 1), Place::Holds { touch: false });
        let permits: Vec<String> = (1..=3).map(|i| node("permits-2-lock-", i)).collect();
        assert_eq!(
            Kind::Permit(2).place(&permits, 1),
            Place::Holds { touch: true }
        );
        assert_eq!(
            Kind::Permit(2).place(&permits, 2),
            Place::Waits(Watch::Departure(permits[..2].to_vec()))
        );
        assert_eq!(
            Kind::Permit(3).place(&permits, 2),
            Place::Holds { touch: false }
        );
    }
}
