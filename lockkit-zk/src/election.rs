//! Elections on ZooKeeper, as Curator's `LeaderLatch` and kazoo's `Election` run them: the
//! candidates are the lock's `EPHEMERAL_SEQUENTIAL` nodes, the lowest leads, and the leader's
//! value is the data of its own node.
//!
//! # Decisions
//! - **Where the value lives.** In the data of the leader's own lock node, which nothing else
//!   writes or reads for its content (an acquisition creates it empty; renewals read only its
//!   stat, clean-up and `force_release` only delete it). The node is ephemeral, so the value
//!   goes with whatever ends the grant: a release or resign, a `force_release`, the end of the
//!   session; an observer can never see it beside another holder, since another holder is
//!   another node.
//! - **The value names its grant.** The data is `lockkit-leader:{term}\n{value}`, `{term}`
//!   being the czxid of the node the proclamation was meant for, and [`leader`] shows a value
//!   only when that term is the czxid of the node it was read from. A node that was not
//!   proclaimed into (a plain mutex holder; Curator's `InterProcessMutex`, which stores the
//!   client's address) shows no value, and an empty value is told apart from none.
//! - **Proclaiming writes only into the grant's own node.** `proclaim` is one `setData` on the
//!   lease's node, refused up front when the lease's session has been reported lost. A node
//!   exists only while its grant holds the lock: the lowest sequence stays the lowest while
//!   it exists (sequence numbers of a parent only grow, and the parent cannot be deleted while
//!   it has children), an expired session takes its nodes with it, and `setData` never
//!   creates a node, so a proclamation on a later session finds nothing to resurrect
//!   (`NoNode`). What a session suspended past its grace still holds on the server is refused
//!   by the lease's session check, although the node is still the lowest: the grant was
//!   reported lost, and a later grant on the same session carries another session token. (A
//!   lease that only outlived its local validity, its session never reported, still holds
//!   its node on the server, so the backend would write; `Leadership::proclaim` refuses it
//!   first, as the guard knows it is lost.) The `setData` answers the node's stat: a czxid other than
//!   the lease's term means the path names another grant (possible only for an owner token
//!   reused across grants whose parent was re-created in between), which answers `false`,
//!   and the term in the data keeps the stray value from showing.
//! - **Reading the leader.** A `sync` with the leader, the listing and the lowest node's data,
//!   on one session (applied in order, so both reads are at least as recent as the sync): a
//!   linearizable read in the sense of ZooKeeper's `sync` + read. One `getData` answers the
//!   data and the czxid together, so a term is never paired with another node's value. The
//!   first three candidates' nodes are read back to back, and the first that still exists
//!   leads at its read (the ones before it were gone, later candidates sort after it), so a
//!   hand-over between the listing and the read costs no second round trip. Only when all
//!   three are gone is the queue listed again (without another sync: the session's later
//!   reads are at least as recent), for as long as `request_timeout` allows: leaders that
//!   change faster than the reader's round trip delay its answer until they pause, rather
//!   than fail it.
//! - **Waiting for a change.** The watch is set by a fresh read, compared with what the caller
//!   saw last: a difference returns at once, and no change after that read is missed. With a
//!   leader, only its node is watched (a data change is a proclamation, a deletion the end of
//!   its grant; a new candidate queues behind and changes nothing), so observers are not woken
//!   by every campaign; without one, the parent's children (or the parent's creation). The
//!   wait also ends when the connection drops or the session ends (the watch would be re-set
//!   on reconnection, but the core reads again anyway), and after `max_wait`. A dropped wait
//!   drops its one-shot watcher, which `zookeeper-client` removes, on the server too once no
//!   other waiter of the session watches the path: watches do not pile up.
//! - **Cost elsewhere.** Renewals read each lease's node with `getData` (for its owner), so a
//!   leader's renewal carries its value too: bounded by `MAX_VALUE_LEN` (16 KiB) per lease.
//!
//! [`leader`]: lockkit_core::backend::LockBackend::leader

use std::time::Duration;

use lockkit_core::backend::{Leader, Lease};
use lockkit_core::{Error, ErrorKind, FencingToken, LockKey, Result};
use zookeeper_client as zk;

use crate::backend::{ZkBackend, within};
use crate::error::{BACKEND, map, timed_out};
use crate::naming::{LockPaths, queue as queue_of, sequence_of};
use crate::session::{Session, is_connected};

/// How many of the first candidates' nodes a read of the leader reads at once: the leader
/// may resign between the listing and the read, and its successor with it.
const HEAD_READS: usize = 3;

/// The start of the data of a node that was proclaimed into.
const VALUE_HEADER: &str = "lockkit-leader:";

/// The data that proclaims `value` for the grant of term `term`.
fn encode(term: FencingToken, value: &str) -> Vec<u8> {
    format!("{VALUE_HEADER}{}\n{value}", term.0).into_bytes()
}

/// The value in a node's `data`, if it was proclaimed for the node created in `czxid`.
fn decode(data: &[u8], czxid: i64) -> Option<String> {
    let rest = data.strip_prefix(VALUE_HEADER.as_bytes())?;
    let newline = rest.iter().position(|b| *b == b'\n')?;
    let term: i64 = std::str::from_utf8(&rest[..newline]).ok()?.parse().ok()?;
    if term != czxid {
        return None;
    }
    String::from_utf8(rest[newline + 1..].to_vec()).ok()
}

/// The leader a node's data and stat show.
fn leader_of(data: &[u8], stat: &zk::Stat) -> Result<Leader> {
    let term = u64::try_from(stat.czxid).map_err(|_| {
        Error::new(
            ErrorKind::Backend,
            BACKEND,
            format!("the leader's node has an invalid czxid {}", stat.czxid),
        )
    })?;
    Ok(Leader::new(FencingToken(term), decode(data, stat.czxid)))
}

/// What a wait watches, set by the read it compares.
enum Watched {
    /// The state already differs from what the caller saw.
    Changed,
    /// Nothing differs yet: this fires on the next change.
    Until(zk::OneshotWatcher),
}

impl ZkBackend {
    /// Stores `value` in the data of `lease`'s node (see the module docs).
    pub(crate) async fn proclaim_value(&self, lease: &Lease, value: &str) -> Result<bool> {
        if lease.session_alive() == Some(false) {
            return Ok(false);
        }
        let session = self.session().await;
        let Some(path) = self.lease_node(&session, lease).await? else {
            return Ok(false);
        };
        let data = encode(lease.fencing_token(), value);
        match within(
            self.timeout(),
            "proclaim the leader's value",
            session.client.set_data(&path, &data, None),
        )
        .await?
        {
            Ok(stat) => Ok(u64::try_from(stat.czxid).ok() == Some(lease.fencing_token().0)),
            Err(zk::Error::NoNode | zk::Error::SessionExpired) => Ok(false),
            Err(e) => Err(map("proclaim the leader's value", e)),
        }
    }

    /// The holder of `key` and its value, read through the leader (see the module docs).
    pub(crate) async fn read_leader(&self, key: &LockKey) -> Result<Option<Leader>> {
        let session = self.session().await;
        let paths = LockPaths::new(key);
        let what = "read the leader's node";
        let rounds = async {
            let mut queue = self.synced_queue(&session, &paths).await?;
            loop {
                if queue.is_empty() {
                    return Ok(None);
                }
                // The first few candidates' nodes, read back to back, so applied in order:
                // the first that still exists is the lowest at its read, since every node
                // before it was already gone and any node created after the listing sorts
                // after it.
                let reads = queue
                    .iter()
                    .take(HEAD_READS)
                    .map(|name| session.client.get_data(&paths.child(name)));
                for result in futures_util::future::join_all(reads).await {
                    match result {
                        Ok((data, stat)) => return leader_of(&data, &stat).map(Some),
                        Err(zk::Error::NoNode) => continue,
                        Err(e) => return Err(map(what, e)),
                    }
                }
                // Leaders came and went faster than a round trip: list again until the
                // churn pauses. The session's later reads are at least as recent as its
                // sync, so the answer stays linearizable without another one.
                queue = match session.client.list_children(&paths.parent).await {
                    Ok(children) => queue_of(children),
                    Err(zk::Error::NoNode) => Vec::new(),
                    Err(e) => return Err(map(what, e)),
                };
            }
        };
        tokio::time::timeout(self.timeout(), rounds)
            .await
            .map_err(|_| {
                Error::new(
                    ErrorKind::Unavailable,
                    BACKEND,
                    "no answer within request_timeout: the ensemble is slow, or the leader kept changing faster than a round trip",
                )
                .with_retryable(true)
            })?
    }

    /// Waits until the leader of `key` may differ from `seen` (see the module docs).
    pub(crate) async fn wait_for_leader(
        &self,
        key: &LockKey,
        seen: Option<&Leader>,
        max_wait: Duration,
    ) -> Result<()> {
        let deadline = tokio::time::Instant::now() + max_wait;
        let session = self.session().await;
        let mut states = session.client.state_watcher();
        if session.lost.is_cancelled() || !is_connected(&session.client) {
            return Ok(());
        }
        let watcher = match self.watch_leader(&session, key, seen).await? {
            Watched::Changed => return Ok(()),
            Watched::Until(watcher) => watcher,
        };
        tokio::select! {
            _ = watcher.changed() => {}
            _ = states.changed() => {}
            () = session.lost.cancelled() => {}
            () = tokio::time::sleep_until(deadline) => {}
        }
        Ok(())
    }

    /// Reads the leader of `key` afresh, setting the watch that fires when it changes.
    async fn watch_leader(
        &self,
        session: &Session,
        key: &LockKey,
        seen: Option<&Leader>,
    ) -> Result<Watched> {
        let paths = LockPaths::new(key);
        if let Some(holder) = self.synced_queue(session, &paths).await?.into_iter().next() {
            let what = "watch the leader's node";
            return match within(
                self.timeout(),
                what,
                session.client.get_and_watch_data(&paths.child(&holder)),
            )
            .await?
            {
                Ok((data, stat, watcher)) if Some(&leader_of(&data, &stat)?) == seen => {
                    Ok(Watched::Until(watcher))
                }
                Ok(_) | Err(zk::Error::NoNode) => Ok(Watched::Changed),
                Err(e) => Err(map(what, e)),
            };
        }
        if seen.is_some() {
            return Ok(Watched::Changed);
        }
        let what = "watch the election's candidates";
        match within(
            self.timeout(),
            what,
            session.client.list_and_watch_children(&paths.parent),
        )
        .await?
        {
            Ok((children, watcher)) if !children.iter().any(|c| sequence_of(c).is_some()) => {
                Ok(Watched::Until(watcher))
            }
            Ok(_) => Ok(Watched::Changed),
            // No parent: nobody campaigns. Its creation comes before the first candidate.
            Err(zk::Error::NoNode) => match within(
                self.timeout(),
                what,
                session.client.check_and_watch_stat(&paths.parent),
            )
            .await?
            {
                Ok((None, watcher)) => Ok(Watched::Until(watcher)),
                Ok((Some(_), _)) => Ok(Watched::Changed),
                Err(e) => Err(map(what, e)),
            },
            Err(e) => Err(map(what, e)),
        }
    }

    /// The lock's queue, lowest first, listed after a `sync` with the leader (both sent back
    /// to back: one round trip); empty when the parent does not exist.
    async fn synced_queue(&self, session: &Session, paths: &LockPaths) -> Result<Vec<String>> {
        let synced = session.client.sync(&paths.parent);
        let listed = session.client.list_children(&paths.parent);
        let what = "list the candidates through the leader";
        let (synced, listed) =
            tokio::time::timeout(self.timeout(), async { tokio::join!(synced, listed) })
                .await
                .map_err(|_| timed_out(what))?;
        match synced.and(listed) {
            Ok(children) => Ok(queue_of(children)),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(map(what, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_shows_only_on_the_node_it_was_proclaimed_for() {
        let data = encode(FencingToken(42), "node-a:8080\nwith a newline");
        assert_eq!(
            decode(&data, 42).as_deref(),
            Some("node-a:8080\nwith a newline")
        );
        assert_eq!(decode(&data, 43), None, "another grant's node");
        assert_eq!(decode(&encode(FencingToken(7), ""), 7).as_deref(), Some(""));
        assert_eq!(decode(b"", 7), None, "a node nobody proclaimed into");
        assert_eq!(
            decode(b"127.0.1.1", 7),
            None,
            "a Curator mutex holder's address"
        );
        assert_eq!(decode(b"lockkit-leader:x\nv", 7), None);
        assert_eq!(decode(b"lockkit-leader:7", 7), None);
    }
}
