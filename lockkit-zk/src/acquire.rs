//! One acquisition attempt on the ZooKeeper ensemble: creating the own node (and the lock's
//! parent), finding it again after a lost reply, and deciding from the queue.

use lockkit_core::backend::{AcquireRequest, Attempt, Contention, Grant, Hold, Lease, OwnerToken};
use lockkit_core::{Error, ErrorKind, FencingToken, Result};
use zookeeper_client as zk;

use crate::backend::{MAX_ROUNDS, ZkBackend, within};
use crate::cleanup::{Pending, PendingNode};
use crate::error::{BACKEND, map, timed_out};
use crate::naming::{LockPaths, node_prefix, public_name, queue, sequence_of};
use crate::semaphore::permit_data;
use crate::session::{Session, is_connected};

/// What evaluating the queue decided.
pub(crate) enum Step {
    Done(Attempt),
    /// Our node is gone (deleted by an operator, or the session changed): start over.
    Recreate,
}

/// The path of `lease`'s node (of its mutex or semaphore) from its owner token's prefix and
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

impl ZkBackend {
    /// Creates our node (with `data`) and lists the queue: both requests are sent back to
    /// back, so the step costs about one round trip (the session's requests are applied in
    /// order, so the listing sees the node). A missing parent is created (a container node)
    /// and the step tried again. Answers the node's name, its stat when the create's answer
    /// carried a valid one, and the listing.
    pub(crate) async fn create_node(
        &self,
        session: &Session,
        paths: &LockPaths,
        own_prefix: &str,
        token: &OwnerToken,
        data: &[u8],
    ) -> Result<(String, Option<zk::Stat>, Vec<String>)> {
        self.inner.janitor.keep(paths);
        for _ in 0..MAX_ROUNDS {
            self.pending().insert(
                token.clone(),
                Pending {
                    session_id: session.id(),
                    node: PendingNode::InFlight,
                    predecessor: None,
                    holders: Vec::new(),
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
                            predecessor: None,
                            holders: Vec::new(),
                        },
                    );
                    let children = match listed {
                        Ok(children) => children,
                        Err(_) => self.children(session, &paths.parent).await?,
                    };
                    return Ok((name, stat, children));
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
    pub(crate) async fn create_parents(&self, session: &Session, paths: &LockPaths) -> Result<()> {
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
    pub(crate) async fn find_own(
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

    /// Decides from the queue whether our node `name` holds the lock. Its `stat` is known
    /// when the node was created by this call (the create went through the leader after the
    /// request was sent, and the listing, same session, after it, is at least that recent) or
    /// read after a `sync`. Without it the node was found in a listing that a server cut off
    /// from the leader may have served stale, so a grant first syncs with the leader and
    /// reads the node again.
    pub(crate) async fn evaluate(
        &self,
        session: &Session,
        request: &AcquireRequest,
        paths: &LockPaths,
        name: &str,
        stat: Option<zk::Stat>,
        children: Vec<String>,
    ) -> Result<Step> {
        let token = request.owner.clone();
        let own_prefix = node_prefix(&request.owner, request.hold);
        self.delete_own_nodes(session, paths, &own_prefix, &children, Some(name))
            .await?;
        let mut queue = queue(children);
        queue.retain(|c| c == name || !c.starts_with(&own_prefix));
        let Some(index) = queue.iter().position(|c| c == name) else {
            self.pending().remove(&token);
            return Ok(Step::Recreate);
        };
        if index > 0 {
            let predecessor = &queue[index - 1];
            if let Some(entry) = self.pending().get_mut(&token) {
                entry.predecessor = Some(predecessor.clone());
            }
            let contention = Contention::new().with_predecessor(public_name(predecessor), None);
            if !request.wait {
                self.delete_node(session, &paths.child(name), "withdraw from the queue")
                    .await?;
                self.pending().remove(&token);
            }
            return Ok(Step::Done(Attempt::Contended(contention)));
        }
        // Re-verify before granting: the node is ours on a live session, and its czxid.
        let path = paths.child(name);
        let Some(stat) = self.own_stat(session, &path, stat).await? else {
            self.pending().remove(&token);
            return Ok(Step::Recreate);
        };
        self.grant(session, request, name, stat.czxid)
            .map(Step::Done)
    }

    /// `stat` if known, else our node's stat as the leader sees it; `None` when the node is
    /// not ours on this session (gone, or left by an earlier one).
    pub(crate) async fn own_stat(
        &self,
        session: &Session,
        path: &str,
        stat: Option<zk::Stat>,
    ) -> Result<Option<zk::Stat>> {
        if stat.is_some() {
            return Ok(stat);
        }
        match self.stat_via_leader(session, path).await? {
            Ok(Some(stat)) if stat.ephemeral_owner == session.id() => Ok(Some(stat)),
            Ok(_) => Ok(None),
            Err(e) => Err(map("read the lock node through the leader", e)),
        }
    }

    /// The grant of our node `name` (of czxid `czxid`), unless the session was suspended
    /// meanwhile.
    pub(crate) fn grant(
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

    /// The path of `lease`'s node: from its owner token's prefix and the sequence number in
    /// its handle, or else found by that prefix among the lock's children.
    pub(crate) async fn lease_node(
        &self,
        session: &Session,
        lease: &Lease,
    ) -> Result<Option<String>> {
        if let Some(path) = known_node(lease) {
            return Ok(Some(path));
        }
        let paths = LockPaths::of(lease.key(), lease.hold());
        let own_prefix = node_prefix(lease.owner(), lease.hold());
        let children = self.children(session, &paths.parent).await?;
        Ok(children
            .iter()
            .find(|c| c.starts_with(&own_prefix) && sequence_of(c).is_some())
            .map(|c| paths.child(c)))
    }

    /// One acquisition attempt (see [`LockBackend::try_acquire`](lockkit_core::backend::LockBackend::try_acquire)),
    /// of a mutex, of a semaphore's permit, or of a read or write lock: the same node
    /// machinery, queued under the parent of its kind (see `semaphore.rs` and `rwlock.rs`
    /// for what differs).
    pub(crate) async fn attempt(&self, request: &AcquireRequest) -> Result<Attempt> {
        let permits = match request.hold {
            Hold::Exclusive | Hold::Read | Hold::Write => None,
            Hold::Permit { permits: 0 } => {
                return Err(Error::invalid_config("a semaphore needs at least 1 permit"));
            }
            Hold::Permit { permits } => Some(permits),
            other => return Err(other.unsupported(BACKEND)),
        };
        let session = self.session().await;
        let paths = LockPaths::of(&request.key, request.hold);
        let own = node_prefix(&request.owner, request.hold);
        let token = request.owner.clone();
        for _ in 0..MAX_ROUNDS {
            let known = self
                .pending()
                .get(&token)
                .filter(|p| p.session_id == session.id())
                .map(|p| p.node.clone());
            let (name, stat, children) = match known {
                // Nodes found again, rather than created by this call, are verified through
                // the leader before a grant: the queue is listed after a sync, and a stat is
                // passed on only when read after it, or known from the node's create (its
                // czxid and owner cannot change, and the synced listing shows the node is
                // still there). A semaphore's permit reads it again: its version changes.
                Some(PendingNode::Created { name, stat }) => match stat {
                    Some(stat) if permits.is_none() => {
                        let children = self.queue_after_sync(&session, &paths).await?;
                        (name, Some(stat), children)
                    }
                    _ => {
                        let (children, stat) =
                            self.queue_via_leader(&session, &paths, &name).await?;
                        (name, stat, children)
                    }
                },
                Some(PendingNode::InFlight) => {
                    let children = self.children(&session, &paths.parent).await?;
                    match self.find_own(&session, &paths, &own, &children).await? {
                        Some(name) => (name, None, children),
                        None => {
                            self.pending().remove(&token);
                            continue;
                        }
                    }
                }
                None => {
                    if !request.wait {
                        // try_lock: a held lock answers without queueing a node.
                        let children = self.children(&session, &paths.parent).await?;
                        let full = match (request.hold, permits) {
                            (_, Some(permits)) => {
                                self.all_permits_taken(request, permits, children)?
                            }
                            (Hold::Read | Hold::Write, None) => {
                                Self::rwlock_taken(request.hold, children)
                            }
                            _ => queue(children).into_iter().next().map(|holder| {
                                Contention::new().with_predecessor(public_name(&holder), None)
                            }),
                        };
                        if let Some(contention) = full {
                            return Ok(Attempt::Contended(contention));
                        }
                    }
                    let data = match permits {
                        None => Vec::new(),
                        Some(permits) => permit_data(&request.owner, permits),
                    };
                    self.create_node(&session, &paths, &own, &token, &data)
                        .await?
                }
            };
            let step = match (request.hold, permits) {
                (Hold::Read | Hold::Write, _) => {
                    self.evaluate_rw(&session, request, &paths, &name, stat, children)
                        .await?
                }
                (_, None) => {
                    self.evaluate(&session, request, &paths, &name, stat, children)
                        .await?
                }
                (_, Some(permits)) => {
                    self.evaluate_permit(&session, request, permits, &paths, &name, stat, children)
                        .await?
                }
            };
            match step {
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
}
