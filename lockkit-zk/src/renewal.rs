//! Renewal checks on ZooKeeper: a lock node lives as long as the session, so a renewal only
//! reads the lease's node back through the leader (it exists, on the current session); and
//! `is_held`, the same read plus, for a permit or a read-write lock, the node's place in the
//! queue, as the attempt decides it.
//!
//! Many leases renew at once with one `sync` with the leader, then every lease's node read in
//! a few multi-reads (ZooKeeper ≥ 3.6), all sent back to back on the session: one round trip
//! per tick and a request per thousand leases, where a read per lease cost several times the
//! CPU and a `multi` of version checks would be a write through the quorum, all or nothing
//! (the measurements are in `docs/measurements.md`). A missing node is answered for its read
//! alone, so exactly that lease is lost. `getData` needs the READ permission, which the ACL
//! of lockkit's nodes gives their creator.

use futures_util::future::join_all;
use lockkit_core::Result;
use lockkit_core::backend::{Lease, Renewal};
use zookeeper_client as zk;

use crate::acquire::{Kind, Place};
use crate::backend::ZkBackend;
use crate::error::{map, session_expired, timed_out};
use crate::naming::{LockPaths, known_node, node_prefix, queue, sequence_of};
use crate::session::Session;

/// The most reads in one multi-read request.
const MAX_READS: usize = 1000;
/// The most path bytes in one multi-read request: the server refuses a request larger than
/// its `jute.maxbuffer` (1 MiB by default), and a key may be 256 bytes long.
const MAX_READ_BYTES: usize = 256 * 1024;

/// What a tick does with one lease.
enum Check {
    /// Reported lost without asking: its session has ended.
    Lost,
    /// Its node is read in multi-read `batch`, at `index`.
    Read { batch: usize, index: usize },
    /// Its handle names no node: renewed alone, the node found by listing the lock.
    Alone,
}

impl ZkBackend {
    /// Renews `leases` in one round trip on the session (see the module docs for why a tick
    /// is a `sync` and multi-reads).
    ///
    /// A lease is `Extended` only when its node exists and is owned by the current session as
    /// a read sent after a successful `sync` sees it. Its node missing, or owned by another
    /// session, makes it `Lost`; a failed read (or multi-read) fails only the leases it
    /// carried; a failed `sync` fails them all, since nothing read after it is known to be
    /// the leader's view.
    pub(crate) async fn renew_batch(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        let session = self.session().await;
        let mut checks = Vec::with_capacity(leases.len());
        let mut batches: Vec<Vec<String>> = Vec::new();
        let mut batch_bytes = 0;
        for lease in leases {
            if lease.session_alive() == Some(false) {
                checks.push(Check::Lost);
                continue;
            }
            let Some(path) = known_node(lease) else {
                checks.push(Check::Alone);
                continue;
            };
            let full = batches
                .last()
                .is_none_or(|b| b.len() >= MAX_READS || batch_bytes + path.len() > MAX_READ_BYTES);
            if full {
                batches.push(Vec::new());
                batch_bytes = 0;
            }
            batch_bytes += path.len();
            let batch = batches.len() - 1;
            let paths = &mut batches[batch];
            checks.push(Check::Read {
                batch,
                index: paths.len(),
            });
            paths.push(path);
        }
        let alone = join_all(
            leases
                .iter()
                .zip(&checks)
                .filter(|(_, c)| matches!(c, Check::Alone))
                .map(|(lease, _)| self.renew_one(lease)),
        );
        let (read, alone) = tokio::join!(self.read_via_leader(&session, &batches), alone);
        let mut alone = alone.into_iter();
        let what = "read the lock nodes through the leader";
        leases
            .iter()
            .zip(&checks)
            .map(|(lease, check)| match check {
                Check::Lost => Ok(Renewal::Lost),
                Check::Alone => alone.next().unwrap_or(Ok(Renewal::Lost)),
                Check::Read { batch, index } => {
                    let owner = match &read {
                        Err(Failed::TimedOut) => Err(timed_out(what)),
                        Err(Failed::Sync(e)) => Err(map(what, e.clone())),
                        Ok(batches) => match &batches[*batch] {
                            Ok(owners) => owners[*index].clone().map_err(|e| map(what, e)),
                            Err(e) => Err(map(what, e.clone())),
                        },
                    };
                    owner.map(|owner| {
                        if owner == Some(session.id()) {
                            Renewal::Extended(self.trusted_for(lease.ttl()))
                        } else {
                            Renewal::Lost
                        }
                    })
                }
            })
            .collect()
    }

    /// Renews one lease: extended while its node exists on the current session (see
    /// [`Self::owns`]).
    pub(crate) async fn renew_one(&self, lease: &Lease) -> Result<Renewal> {
        Ok(if self.owns(lease).await? {
            Renewal::Extended(self.trusted_for(lease.ttl()))
        } else {
            Renewal::Lost
        })
    }

    /// Whether `lease`'s node still exists and belongs to the current, trusted session, as
    /// the leader sees it: the read follows a `sync`, so a server cut off from the leader
    /// (which keeps serving its stale view until it notices, `syncLimit × tickTime`) makes
    /// the check fail instead of confirming a lock the leader may have given away.
    async fn owns(&self, lease: &Lease) -> Result<bool> {
        if lease.session_alive() == Some(false) {
            return Ok(false);
        }
        let session = self.session().await;
        let Some(path) = self.lease_node(&session, lease).await? else {
            return Ok(false);
        };
        match self.stat_via_leader(&session, &path).await? {
            Ok(Some(stat)) => Ok(stat.ephemeral_owner == session.id()),
            Ok(None) | Err(zk::Error::SessionExpired) => Ok(false),
            Err(e) => Err(map("read the lock node through the leader", e)),
        }
    }

    /// Whether `lease` still holds, as the leader sees it: a mutex while its node exists on
    /// the current session ([`Self::owns`]: nodes only queue behind a holder); a permit or a
    /// read or write lock while its node also has the lease's czxid and holds at its place
    /// in the queue, as [`Kind::place`] decides it for the attempt.
    pub(crate) async fn holds(&self, lease: &Lease) -> Result<bool> {
        let kind = Kind::of(lease.hold())?;
        if kind == Kind::Exclusive {
            return self.owns(lease).await;
        }
        Ok(self
            .place_in_queue(lease)
            .await?
            .is_some_and(|(queue, index)| matches!(kind.place(&queue, index), Place::Holds { .. })))
    }

    /// The queue of `lease`'s node (a semaphore's or a read-write lock's) as the leader sees
    /// it, with the node's index in it: `None` when the node is not on the current session
    /// with the lease's czxid. The other nodes of the lease's owner (strays of lost replies)
    /// are left out, as the attempt leaves them out.
    async fn place_in_queue(&self, lease: &Lease) -> Result<Option<(Vec<String>, usize)>> {
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

    /// A `sync`, then each batch of paths as one multi-read of their data, sent back to back
    /// (a server answers a session's requests in order, so every read waits for the sync).
    /// Per batch, per path: the session owning the node (`None` when it does not exist).
    async fn read_via_leader(
        &self,
        session: &Session,
        batches: &[Vec<String>],
    ) -> Result<Vec<Batch>, Failed> {
        if batches.is_empty() {
            return Ok(Vec::new());
        }
        let synced = session.client.sync("/");
        let reads: Vec<_> = batches
            .iter()
            .map(|paths| {
                let mut reader = session.client.new_multi_reader();
                let added = paths.iter().try_for_each(|path| reader.add_get_data(path));
                let committed = added.map(|()| reader.commit());
                async move { committed?.await }
            })
            .collect();
        let (synced, reads) = tokio::time::timeout(self.timeout(), async {
            tokio::join!(synced, join_all(reads))
        })
        .await
        .map_err(|_| Failed::TimedOut)?;
        let gone = |paths: &Vec<String>| Ok(paths.iter().map(|_| Ok(None)).collect());
        match synced {
            Ok(()) => {}
            // The session's nodes are gone with it.
            Err(zk::Error::SessionExpired) => return Ok(batches.iter().map(gone).collect()),
            Err(e) => return Err(Failed::Sync(e)),
        }
        Ok(reads
            .into_iter()
            .zip(batches)
            .map(|(read, paths)| match read {
                Ok(results) if results.len() == paths.len() => {
                    Ok(results.into_iter().map(owner_of).collect())
                }
                Ok(_) => Err(zk::Error::UnexpectedError(
                    "a multi-read answered a different number of reads".into(),
                )),
                Err(zk::Error::SessionExpired) => gone(paths),
                Err(e) => Err(e),
            })
            .collect())
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
}

/// One multi-read's answer: per path, the session owning the node, `None` if it is missing.
type Batch = std::result::Result<Vec<std::result::Result<Option<i64>, zk::Error>>, zk::Error>;

/// Why no read of a tick can be trusted.
enum Failed {
    TimedOut,
    Sync(zk::Error),
}

fn owner_of(result: zk::MultiReadResult) -> std::result::Result<Option<i64>, zk::Error> {
    match result {
        zk::MultiReadResult::Data { stat, .. } => Ok(Some(stat.ephemeral_owner)),
        zk::MultiReadResult::Error {
            err: zk::Error::NoNode,
        } => Ok(None),
        zk::MultiReadResult::Error { err } => Err(err),
        _ => Err(zk::Error::UnexpectedError(
            "a multi-read answered a data read with children".into(),
        )),
    }
}
