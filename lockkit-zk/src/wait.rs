//! Waiting in the ZooKeeper backend: a contender watches only the node just ahead of its
//! own, so a release wakes exactly one waiter (a read-write lock's reader watches the
//! nearest writer's node ahead instead, see `rwlock.rs`).
//!
//! # Where a contended hand-over's time goes (measured 2026-12-04)
//!
//! W2 of `examples/compare` (8 clients × 250 increments, the three servers of `compose/` and
//! the client on one 2-core machine; `docs/measurements.md` has the runs):
//! - **The path**: the holder's delete commits through the leader, the waiter's server sends
//!   the watch event, and the waiter sends `sync` and the listing back to back (one round
//!   trip, see `ZkBackend::queue_after_sync`) and is granted. An increment costs 7 requests
//!   (create and listing, the predecessor's watch, `sync` and listing, delete and the
//!   release's listing for strays); zookeeper-client's lock recipe makes 5: it does not sync.
//! - **The servers are the bottleneck**: they spent 1.6-2.1 ms of CPU per increment (the
//!   recipe 1.5-1.7 ms), with the machine 80% busy (`srvr` packet counts, interleaved
//!   probes); the client 380-465 µs against the recipe's 205-235 µs.
//! - **The `sync`** costs no round trip of its own, but a follower's waits for the leader:
//!   without it the same code made 0.90× the recipe in two runs, with it 0.75-0.93× over
//!   the day's runs.
//! - **Tried, not kept**: the release without its listing when every create was answered
//!   (6 requests): 584-753/s against the recipe's 739-822/s in alternating runs, no change.

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
