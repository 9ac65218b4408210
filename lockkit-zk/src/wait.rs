//! Waiting in the ZooKeeper backend: a contender watches only the node just ahead of its
//! own, so a release wakes exactly one waiter (a read-write lock's reader watches the
//! nearest writer's node ahead instead, see `rwlock.rs`).
//!
//! A woken waiter lists the queue after a `sync` (`ZkBackend::queue_after_sync`): the `sync`
//! costs no round trip of its own, and a contended hand-over is bounded by the servers' work,
//! not by the client's (the measurements are in `docs/measurements.md`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use lockkit_core::Result;
use lockkit_core::backend::{AcquireRequest, Contention};

use crate::backend::{ZkBackend, within};
use crate::error::map;
use crate::naming::LockPaths;

impl ZkBackend {
    /// Waits until the node `request`'s own waits for changes (it is deleted, normally),
    /// `max_wait` passes, or the session is lost: the node ahead of its own for a mutex and
    /// a writer, the nearest writer's node ahead for a reader.
    pub(crate) async fn wait_on_predecessor(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<()> {
        let token = request.owner.clone();
        let session = self.session().await;
        // Without a known predecessor on the session that holds the own node (it went with an
        // earlier session), there is nothing to watch: the next attempt reads the queue
        // afresh. Sleeping instead would be sleeping until the deadline: the core sets no
        // timer on a queue wait (see `WaitStrategy::Queue`).
        let predecessor = self
            .pending()
            .get(&token)
            .filter(|p| p.session_id == session.id())
            .and_then(|p| p.predecessor.clone());
        let (Some(predecessor), Some(_)) = (predecessor, &contention.predecessor) else {
            return Ok(());
        };
        let path = LockPaths::of(&request.key, request.hold).child(&predecessor);
        let (stat, watcher) = match within(
            self.timeout(),
            "watch the predecessor",
            session.client.check_and_watch_stat(&path),
        )
        .await?
        {
            Ok(watched) => watched,
            Err(e) => return Err(map("watch the predecessor", e)),
        };
        if stat.is_none() {
            return Ok(());
        }
        tokio::select! {
            _ = watcher.changed() => {
                self.inner.watch_events.fetch_add(1, Ordering::Relaxed);
            }
            () = tokio::time::sleep(max_wait) => {}
            () = session.lost.cancelled() => {}
        }
        Ok(())
    }
}
