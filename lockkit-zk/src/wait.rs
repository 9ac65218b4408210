//! Waiting in the ZooKeeper backend, for every kind of grant: a waiter watches only what its
//! attempt found it waiting for (the pending record's [`Watch`]: the node just ahead for a
//! mutex and a writer, the nearest writer's node ahead for a reader, the predecessor or, for
//! a semaphore's first waiter, the holders), so a release wakes only the waiters it can
//! grant.
//!
//! A woken waiter lists the queue after a `sync` (`ZkBackend::queue_after_sync`): the `sync`
//! costs no round trip of its own, and a contended hand-over is bounded by the servers' work,
//! not by the client's (the measurements are in `docs/measurements.md`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::future::{join_all, select_all};
use lockkit_core::Result;
use lockkit_core::backend::{AcquireRequest, Contention};
use zookeeper_client as zk;

use crate::acquire::Watch;
use crate::backend::{ZkBackend, within};
use crate::error::{map, timed_out};
use crate::naming::LockPaths;
use crate::session::Session;

impl ZkBackend {
    /// Waits for what the last attempt found the request's node waiting for (the pending
    /// record's [`Watch`]), until `max_wait` passes, or until the session is lost.
    ///
    /// Without a watch recorded on the session that holds the own node (it went with an
    /// earlier session), there is nothing to watch: it returns at once, and the next attempt
    /// reads the queue afresh. Sleeping instead would be sleeping until the deadline: the core
    /// sets no timer on a queue wait (see `WaitStrategy::Queue`).
    pub(crate) async fn wait_for(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<()> {
        let session = self.session().await;
        let watch = self
            .pending()
            .get(&request.owner)
            .filter(|p| p.session_id == session.id())
            .and_then(|p| p.watch.clone());
        let (Some(watch), Some(_)) = (watch, &contention.predecessor) else {
            return Ok(());
        };
        let paths = LockPaths::of(&request.key, request.hold);
        let watchers = match &watch {
            Watch::Deleted(node) => self.watch_deleted(&session, &paths.child(node)).await?,
            Watch::Changed(node) => {
                self.watch_data(&session, &paths, std::slice::from_ref(node), true)
                    .await?
            }
            Watch::Departure(holders) => self.watch_data(&session, &paths, holders, false).await?,
        };
        let Some(watchers) = watchers.filter(|w| !w.is_empty()) else {
            return Ok(());
        };
        let changed = select_all(watchers.into_iter().map(|w| Box::pin(w.changed())));
        tokio::select! {
            _ = changed => {
                self.inner.watch_events.fetch_add(1, Ordering::Relaxed);
            }
            () = tokio::time::sleep(max_wait) => {}
            () = session.lost.cancelled() => {}
        }
        Ok(())
    }

    /// An existence watch on the node `path`, set after the listing that chose it: `None`
    /// when the node is gone already.
    async fn watch_deleted(
        &self,
        session: &Session,
        path: &str,
    ) -> Result<Option<Vec<zk::OneshotWatcher>>> {
        let what = "watch the predecessor";
        match within(
            self.timeout(),
            what,
            session.client.check_and_watch_stat(path),
        )
        .await?
        {
            Ok((Some(_), watcher)) => Ok(Some(vec![watcher])),
            Ok((None, _)) => Ok(None),
            Err(e) => Err(map(what, e)),
        }
    }

    /// Data watches (which fire on a deletion too) on the semaphore's `nodes`, set after the
    /// listing that chose them: `None` when one is gone already, or, with `touch_ends`, has
    /// been touched (a node is created at data version 0, and only its grant touches it).
    async fn watch_data(
        &self,
        session: &Session,
        paths: &LockPaths,
        nodes: &[String],
        touch_ends: bool,
    ) -> Result<Option<Vec<zk::OneshotWatcher>>> {
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
                Ok((_, stat, _)) if touch_ends && stat.version != 0 => return Ok(None),
                Ok((_, _, watcher)) => watchers.push(watcher),
                Err(zk::Error::NoNode) => return Ok(None),
                Err(e) => return Err(map(what, e)),
            }
        }
        Ok(Some(watchers))
    }
}
