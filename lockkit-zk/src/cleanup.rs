//! Clean-up on the ZooKeeper ensemble: the nodes an acquisition leaves when it ends
//! (released, abandoned, or cancelled with a create in flight), and the lock parents
//! nobody here uses any more.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use lockkit_core::Result;
use lockkit_core::backend::cleanup::{Ledger, Retry, Sweep};
use lockkit_core::backend::{AcquireRequest, Lease, OwnerToken};
use tokio_util::sync::CancellationToken;
use zookeeper_client as zk;

use crate::acquire::Watch;
use crate::backend::{Inner, ZkBackend, within};
use crate::error::{map, timed_out};
use crate::naming::{LockPaths, node_prefix, sequence_of};
use crate::session::{Session, SessionSlot};

/// How soon a background sweep tries again after a clean-up failed.
pub(crate) const SWEEP_RETRY: Duration = Duration::from_millis(100);

/// The lock parents this backend stopped using, and when each may be removed.
///
/// Removing a parent on every release would make the next acquisition create it again:
/// two more writes per cycle. Deleting it once the key has been idle here for a while keeps
/// the tree clean at no cost to a busy key. The server refuses to delete a parent that has
/// children, so the delete never races a contender: one whose create comes right after it
/// gets `NoNode` and creates the parent again.
#[derive(Debug, Default)]
pub(crate) struct Janitor {
    due: StdMutex<HashMap<String, Instant>>,
}

impl Janitor {
    fn due(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.due.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Schedules the removal of every level of `paths` (a semaphore's parent and the key's
    /// node above it).
    pub(crate) fn schedule(&self, paths: &LockPaths, linger: Duration) {
        let at = Instant::now() + linger;
        let mut due = self.due();
        for level in paths.levels() {
            due.insert(level.to_owned(), at);
        }
    }

    /// Keeps every level of `paths`: an acquisition is about to queue there.
    pub(crate) fn keep(&self, paths: &LockPaths) {
        let mut due = self.due();
        for level in paths.levels() {
            due.remove(level);
        }
    }

    pub(crate) fn take_all(&self) -> Vec<String> {
        self.due().drain().map(|(parent, _)| parent).collect()
    }

    pub(crate) fn take_due(&self, now: Instant) -> Vec<String> {
        let mut due = self.due();
        let ready: Vec<String> = due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(parent, _)| parent.clone())
            .collect();
        for parent in &ready {
            due.remove(parent);
        }
        ready
    }
}

/// Deletes idle lock parents; when the backend is dropped, deletes every scheduled one at
/// once (before the session closes) and ends.
pub(crate) async fn sweep(
    janitor: Arc<Janitor>,
    sessions: Arc<SessionSlot>,
    stop: CancellationToken,
    tick: Duration,
    timeout: Duration,
) {
    loop {
        let stopping = tokio::select! {
            () = tokio::time::sleep(tick) => false,
            () = stop.cancelled() => true,
        };
        let idle = if stopping {
            janitor.take_all()
        } else {
            janitor.take_due(Instant::now())
        };
        if !idle.is_empty() {
            // Deepest first: a session's requests are applied in order, so a semaphore's
            // parent is gone by the time the key's node above it is deleted.
            let mut idle = idle;
            idle.sort_by_key(|path| std::cmp::Reverse(path.matches('/').count()));
            let session = sessions.current();
            let deletes: Vec<_> = idle
                .iter()
                .map(|parent| session.client.delete(parent, None))
                .collect();
            // NotEmpty (someone queued meanwhile) and NoNode are the expected refusals.
            let _ = tokio::time::timeout(timeout, futures_util::future::join_all(deletes)).await;
        }
        if stopping {
            return;
        }
    }
}

/// What an acquisition in progress (or granted) has on the server.
#[derive(Clone)]
pub(crate) struct Pending {
    /// The session its node was created on (the node goes with it).
    pub(crate) session_id: i64,
    /// Its node, or a create in flight.
    pub(crate) node: PendingNode,
    /// What the last attempt found the node waiting for (kept here: the
    /// [`Contention`](lockkit_core::backend::Contention) shows only a sequence number).
    pub(crate) watch: Option<Watch>,
}

/// Where an acquisition's node is.
#[derive(Clone)]
pub(crate) enum PendingNode {
    /// A create was sent and its answer not seen: the node may or may not exist.
    InFlight,
    /// The node exists (or existed) under this name; with its stat as its create answered,
    /// when that was valid (its czxid and owner do not change).
    Created {
        name: String,
        stat: Option<zk::Stat>,
    },
}

impl ZkBackend {
    /// Deletes a node; `Ok(true)` if it was there.
    pub(crate) async fn delete_node(
        &self,
        session: &Session,
        path: &str,
        what: &str,
    ) -> Result<bool> {
        match within(self.timeout(), what, session.client.delete(path, None)).await? {
            Ok(()) => Ok(true),
            Err(zk::Error::NoNode) => Ok(false),
            Err(e) => Err(map(what, e)),
        }
    }

    /// Deletes every node among `children` whose name starts with `own_prefix`, except
    /// `keep`. Such strays come from a create whose reply was lost and that committed after
    /// the retry had looked (on another server, or simply later): owned by our long-lived
    /// session, one left behind would become the head of the queue after our release and
    /// block the key for as long as the session lives.
    pub(crate) async fn delete_own_nodes(
        &self,
        session: &Session,
        paths: &LockPaths,
        own_prefix: &str,
        children: &[String],
        keep: Option<&str>,
    ) -> Result<()> {
        for child in children {
            if child.starts_with(own_prefix)
                && sequence_of(child).is_some()
                && Some(child.as_str()) != keep
            {
                self.delete_node(session, &paths.child(child), "delete a stray lock node")
                    .await?;
            }
        }
        Ok(())
    }

    /// Deletes every node of an acquisition that has ended (named `own_prefix…`), and hands
    /// the lock's parent to the janitor.
    pub(crate) async fn delete_all_own(
        &self,
        session: &Session,
        paths: &LockPaths,
        own_prefix: &str,
    ) -> Result<()> {
        let children = self.children(session, &paths.parent).await?;
        let deleted = self
            .delete_own_nodes(session, paths, own_prefix, &children, None)
            .await;
        self.schedule_idle(paths);
        deleted
    }

    /// The books of `owner`'s creates, from its first create until the acquisition ends.
    pub(crate) fn ledger(&self, owner: &OwnerToken) -> Arc<Ledger> {
        self.inner
            .ledgers
            .lock()
            .entry(owner.clone())
            .or_default()
            .clone()
    }

    /// Deletes the nodes named `own_prefix…` except `keep`, from a listing read after a
    /// `sync` with the leader, and settles the creates `ledger` had registered before.
    ///
    /// A create whose reply was lost, or whose future was dropped, may be applied after a
    /// plain listing was served (by a server that has not applied it yet, after a reconnect);
    /// a listing after a `sync` sent later sees it: the `sync` is answered only once the
    /// server has applied what the leader had committed, and a create still on its way is
    /// either ahead of the `sync` on the same connection or refused by the leader once the
    /// session moved to another.
    pub(crate) async fn sweep_own(
        &self,
        session: &Session,
        paths: &LockPaths,
        own_prefix: &str,
        keep: Option<&str>,
        ledger: &Ledger,
    ) -> Result<()> {
        let mark = ledger.mark();
        let synced = session.client.sync(&paths.parent);
        let listed = session.client.list_children(&paths.parent);
        let (synced, listed) =
            tokio::time::timeout(self.timeout(), async { tokio::join!(synced, listed) })
                .await
                .map_err(|_| timed_out("list lock nodes through the leader"))?;
        let children = match synced.and(listed) {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(map("list lock nodes through the leader", e)),
        };
        self.delete_own_nodes(session, paths, own_prefix, &children, keep)
            .await?;
        ledger.settle(mark);
        Ok(())
    }

    /// Comes back after `delay` to delete the nodes named `own_prefix…` that the acquisition
    /// of `owner` no longer uses (all of them once it has ended), through the leader, until
    /// its creates are settled or the session is gone. While a create of the acquisition is
    /// in flight it waits again, so as not to delete a node that is being granted.
    pub(crate) fn sweep_later(
        &self,
        session_id: i64,
        paths: &LockPaths,
        own_prefix: &str,
        owner: &OwnerToken,
        ledger: Arc<Ledger>,
        delay: Duration,
    ) {
        let backend = self.weak();
        let paths = paths.clone();
        let (own_prefix, owner) = (own_prefix.to_owned(), owner.clone());
        // ZooKeeper nodes live as long as their session (which a suspension does not end),
        // so the rounds check the session's id rather than its lost token.
        self.inner.sweeps.spawn(
            "sweeping stray lock nodes",
            self.inner.dropped.clone(),
            delay,
            Retry::new(SWEEP_RETRY, Duration::from_secs(2)),
            move || {
                let (backend, paths, own_prefix, owner, ledger) = (
                    backend.clone(),
                    paths.clone(),
                    own_prefix.clone(),
                    owner.clone(),
                    ledger.clone(),
                );
                async move {
                    let Some((backend, session)) =
                        ZkBackend::in_session(&backend, session_id).await
                    else {
                        return Ok(Sweep::Done);
                    };
                    let in_use = backend
                        .pending()
                        .get(&owner)
                        .filter(|p| p.session_id == session_id)
                        .map(|p| p.node.clone());
                    let keep = match in_use {
                        Some(PendingNode::InFlight) => return Ok(Sweep::Again(SWEEP_RETRY)),
                        Some(PendingNode::Created { name, .. }) => Some(name),
                        None => None,
                    };
                    backend
                        .sweep_own(&session, &paths, &own_prefix, keep.as_deref(), &ledger)
                        .await?;
                    if keep.is_none() {
                        backend.schedule_idle(&paths);
                    }
                    Ok(if ledger.has_unsettled() {
                        Sweep::Again(SWEEP_RETRY)
                    } else {
                        Sweep::Done
                    })
                }
            },
        );
    }

    /// The backend without keeping it alive: a clean-up in the background must not keep a
    /// dropped backend's session open (closing it removes every node the clean-up is for).
    fn weak(&self) -> Weak<Inner> {
        Arc::downgrade(&self.inner)
    }

    /// The backend of `weak` and its session, while the backend is in use and its session
    /// is still `session_id`, the one a clean-up was scheduled in.
    async fn in_session(weak: &Weak<Inner>, session_id: i64) -> Option<(ZkBackend, Arc<Session>)> {
        let backend = ZkBackend {
            inner: weak.upgrade()?,
        };
        let session = backend.session().await;
        (session.id() == session_id).then_some((backend, session))
    }

    /// Hands the nodes that hold `paths`' queue to the janitor, which removes them once
    /// nobody here has used them for `empty_parent_linger`.
    pub(crate) fn schedule_idle(&self, paths: &LockPaths) {
        self.inner
            .janitor
            .schedule(paths, self.inner.config.empty_parent_linger);
    }

    /// Deletes our node `path`, and hands the lock's parent to the janitor, which removes
    /// it once nobody here has used it for `empty_parent_linger`.
    pub(crate) async fn delete_own(
        &self,
        session: &Session,
        path: &str,
        paths: &LockPaths,
    ) -> Result<bool> {
        let deleted = within(
            self.timeout(),
            "delete the lock node",
            session.client.delete(path, None),
        )
        .await;
        self.schedule_idle(paths);
        let deleted = match deleted {
            Ok(deleted) => deleted,
            Err(timeout) => {
                // The delete may not have been applied: the node would hold the lock for
                // as long as the session lives.
                self.reap(session.id(), path.to_owned());
                return Err(timeout);
            }
        };
        match deleted {
            Ok(()) => Ok(true),
            // An expired session takes its ephemeral nodes with it, and sessions are only
            // replaced when they expire: the node is gone whichever session made it.
            Err(zk::Error::NoNode | zk::Error::SessionExpired) => Ok(false),
            Err(e) => {
                let error = map("delete the lock node", e);
                if error.is_retryable() {
                    self.reap(session.id(), path.to_owned());
                }
                Err(error)
            }
        }
    }

    /// Keeps deleting `path` in the background until it is gone or its session is: a node
    /// whose delete failed would otherwise hold the lock for as long as the session lives.
    pub(crate) fn reap(&self, session_id: i64, path: String) {
        let backend = self.weak();
        self.inner.sweeps.spawn(
            "deleting a lock node",
            self.inner.dropped.clone(),
            SWEEP_RETRY,
            Retry::new(SWEEP_RETRY, Duration::from_secs(2)),
            move || {
                let (backend, path) = (backend.clone(), path.clone());
                async move {
                    let Some((backend, session)) =
                        ZkBackend::in_session(&backend, session_id).await
                    else {
                        return Ok(Sweep::Done);
                    };
                    backend
                        .delete_node(&session, &path, "delete the lock node")
                        .await?;
                    Ok(Sweep::Done)
                }
            },
        );
    }

    /// Removes what `request` left (see [`LockBackend::abandon`](lockkit_core::backend::LockBackend::abandon)).
    /// A create still unsettled is swept for through the leader, until it is settled.
    pub(crate) async fn abandon_request(&self, request: &AcquireRequest) -> Result<()> {
        let owner = &request.owner;
        // The entry is forgotten only once the clean-up is done (or handed to a sweep): if
        // this future is dropped half-way, the core abandons again and must still find it.
        let pending = self.pending().get(owner).cloned();
        let ledger = self.inner.ledgers.lock().get(owner).cloned();
        // Between two rounds of an attempt the entry may be gone while a create of an
        // earlier round is still unsettled: that one is swept for too.
        let Some(ledger) = ledger.filter(|l| pending.is_some() || l.has_unsettled()) else {
            self.forget(owner);
            return Ok(());
        };
        let session = self.session().await;
        if pending.is_some_and(|p| p.session_id != session.id()) {
            // Its nodes went with its session.
            self.forget(owner);
            return Ok(());
        }
        let paths = LockPaths::of(&request.key, request.hold);
        let own_prefix = node_prefix(owner, request.hold);
        let cleaned = if ledger.has_unsettled() {
            let swept = self
                .sweep_own(&session, &paths, &own_prefix, None, &ledger)
                .await;
            self.schedule_idle(&paths);
            swept
        } else {
            self.delete_all_own(&session, &paths, &own_prefix).await
        };
        if cleaned.is_err() || ledger.has_unsettled() {
            self.sweep_later(
                session.id(),
                &paths,
                &own_prefix,
                owner,
                ledger,
                SWEEP_RETRY,
            );
        }
        self.forget(owner);
        cleaned
    }

    /// Forgets the acquisition of `owner`: it has ended.
    pub(crate) fn forget(&self, owner: &OwnerToken) {
        self.pending().remove(owner);
        self.inner.ledgers.lock().remove(owner);
    }

    /// Deletes `lease`'s node if it is still ours, and strays of its acquisition.
    pub(crate) async fn release_lease(&self, lease: &Lease) -> Result<bool> {
        let owner = lease.owner();
        let ledger = self.ledger(owner);
        // The acquisition ends here whatever happens below: a failed release must not leave
        // its entry behind, and what it leaves on the server is swept in the background.
        self.forget(owner);
        let session = self.session().await;
        let paths = LockPaths::of(lease.key(), lease.hold());
        let own_prefix = node_prefix(lease.owner(), lease.hold());
        let release_node = async {
            match self.lease_node(&session, lease).await? {
                // Any version: an election's leader writes its value into its node.
                Some(path) => self.delete_own(&session, &path, &paths).await,
                None => Ok(false),
            }
        };
        // Strays of this acquisition go too. A stray is the node of a create whose answer was
        // lost: a create answered before the grant made a node that the granting attempt's
        // listing showed (the session applies its requests in order), and that attempt deleted
        // every own node but the granted one. So with every create answered there is nothing
        // to list, and the release is the recipe's one delete; otherwise the listing goes
        // through the leader, sent right after the delete (one round trip for both).
        let strays = async {
            if ledger.has_unsettled() {
                self.sweep_own(&session, &paths, &own_prefix, None, &ledger)
                    .await
            } else {
                Ok(())
            }
        };
        let (released, strays) = tokio::join!(release_node, strays);
        if released.is_err() || strays.is_err() || ledger.has_unsettled() {
            self.sweep_later(
                session.id(),
                &paths,
                &own_prefix,
                owner,
                ledger,
                SWEEP_RETRY,
            );
        }
        released
    }
}
