//! Waiting in the etcd backend, for every kind of grant: a waiter watches only what its
//! attempt found it waiting for (the nearest key that keeps it out, or for a semaphore's
//! first waiter the departures ahead of it), so a release wakes exactly the waiters it can
//! grant. The watch machinery here serves the election's observers too.

use std::time::Duration;

use etcd_client::{Event, EventType, GetOptions, Txn, WatchFilterType, WatchOptions, WatchStream};
use lockkit_core::Result;
use lockkit_core::backend::{AcquireRequest, Contention};
use tokio::time::Instant;

use crate::acquire::{Kind, Watch, reads_of};
use crate::backend::EtcdBackend;
use crate::error;
use crate::request::{Resend, txn_of};
use crate::semaphore::{Layout, Rank};

/// A deadline that never comes (tokio's own "far future" is 30 years as well).
pub(crate) const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

impl EtcdBackend {
    /// Waits for what the last attempt found the request's key waiting for (the pending
    /// record's [`Watch`]), or until `max_wait` passes. Ends early, too, when the session of
    /// the request's key is lost: the key went with the lease, so the wait is for nothing,
    /// and the next attempt queues on a new session. When the attempt's answer and the record
    /// disagree (another attempt ran between), it returns at once: the next attempt reads
    /// afresh.
    pub(crate) async fn wait_for(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<()> {
        // A member cut off from the leader cancels the watches that require a leader; without
        // `require_leader` it keeps the watch open, answers the connection's PINGs and never
        // sees the release, so the wait cannot tell: it re-checks once per TTL instead.
        let max_wait = if self.inner.config.require_leader {
            max_wait
        } else {
            max_wait.min(request.ttl)
        };
        // `Duration::MAX` when the waiter has no deadline: the core sets no timer on a queue
        // wait (see `WaitStrategy::Queue`).
        let now = Instant::now();
        let deadline = now.checked_add(max_wait).unwrap_or(now + FAR_FUTURE);
        let pending = self.pending().get(&request.owner).map(|entry| {
            (
                entry.watch.clone(),
                entry.create_revision,
                entry.session.lost.clone(),
            )
        });
        let (Some((Some(watch), Some(own_revision), lost)), Some(revision)) =
            (pending, contention.revision)
        else {
            return Ok(());
        };
        let predecessor = contention.predecessor.as_deref();
        let waiting = async {
            match watch {
                Watch::Deleted(key, created) if predecessor == Some(&key) => {
                    self.wait_for_delete(
                        "watching the key ahead",
                        &key,
                        created,
                        revision,
                        deadline,
                    )
                    .await
                }
                Watch::Changed(key, created) if predecessor == Some(&key) => {
                    self.wait_behind(&key, created, revision, deadline).await
                }
                Watch::Departure if predecessor.is_none() => {
                    let Kind::Permit(layout) = Kind::of(self, &request.key, request.hold)? else {
                        return Ok(());
                    };
                    self.wait_first(&layout, own_revision, revision, deadline)
                        .await
                }
                _ => Ok(()),
            }
        };
        tokio::select! {
            waited = waiting => waited,
            () = lost.cancelled() => Ok(()),
        }
    }

    /// Waits until `key` (created at `created`, seen by a read at `revision`) is deleted,
    /// `deadline` passes, or its watch ends; `what` names the watch in errors.
    pub(crate) async fn wait_for_delete(
        &self,
        what: &str,
        key: &str,
        created: i64,
        revision: i64,
        deadline: Instant,
    ) -> Result<()> {
        // The watch starts now, not at `revision + 1`: a watch from a past revision joins
        // the server's unsynced watchers, which it catches up only every 100 ms
        // (`syncWatchersLoop`), so under steady writes every handoff would wait for that tick.
        // A delete between the attempt and the watch is found by the read below instead.
        let options = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let opened = self.open_watch(what, key, options, deadline).await?;
        let Some((mut watch, watched_from)) = opened else {
            return Ok(());
        };
        // Nothing was written between the attempt's read and the watch: the key was there
        // when the watch started. Otherwise the watch sees the delete only if the key is
        // still there now (a linearizable read, after the watch started), and still the same
        // key: its name may be back by now, created anew behind ours (names are reused), and
        // a delete of that key would never come while we wait.
        if watched_from > revision {
            let reading = self.send(Resend::IfRetryable, |mut client| {
                let key = key.to_owned();
                async move {
                    client
                        .get(key, Some(GetOptions::new().with_keys_only()))
                        .await
                }
            });
            let reading = async { reading.await.map(|sent| sent.answer) };
            match tokio::time::timeout_at(deadline, reading).await {
                Ok(Some(Ok(found)))
                    if found
                        .kvs()
                        .first()
                        .is_some_and(|kv| kv.create_revision() == created) => {}
                Ok(Some(Ok(_))) | Err(_) => return Ok(()),
                Ok(Some(Err(e))) => return Err(error::map(what, e)),
                Ok(None) => {
                    return Err(error::timed_out(what, self.inner.config.request_timeout));
                }
            }
        }
        // A cancelled watch (compacted revision, lost leader) ends the wait too: the next
        // attempt reads the queue afresh.
        let deleted = until_event(&mut watch, deadline, |event| {
            event.event_type() == EventType::Delete
        });
        deleted.await.map_err(|e| error::map(what, e))
    }

    /// Opens a watch of `key` with `options`, within `deadline`: the stream, and the store
    /// revision at which the server started it. `None` when the deadline passed first, or
    /// the server cancelled the watch at once (a compacted start revision, no leader).
    ///
    /// Dropping the stream resets its gRPC stream, and the server drops the watch with it:
    /// a cancelled wait leaves no watch behind.
    pub(crate) async fn open_watch(
        &self,
        what: &str,
        key: &str,
        options: WatchOptions,
        deadline: Instant,
    ) -> Result<Option<(WatchStream, i64)>> {
        let opening = self.send(Resend::IfRetryable, |mut client| {
            let (key, options) = (key.to_owned(), options.clone());
            async move { client.watch(key, Some(options)).await }
        });
        let opening = async { opening.await.map(|sent| sent.answer) };
        let mut watch = match tokio::time::timeout_at(deadline, opening).await {
            Ok(Some(Ok(watch))) => watch,
            Ok(Some(Err(e))) => return Err(error::map(what, e)),
            Ok(None) => return Err(error::timed_out(what, self.inner.config.request_timeout)),
            Err(_) => return Ok(None),
        };
        let created = async {
            while let Some(response) = watch.message().await? {
                if response.canceled() {
                    break;
                }
                if response.created() {
                    return Ok(Some(response.header().map_or(i64::MAX, |h| h.revision())));
                }
            }
            Ok::<_, etcd_client::Error>(None)
        };
        match tokio::time::timeout_at(deadline, created).await {
            Ok(Ok(Some(watched_from))) => Ok(Some((watch, watched_from))),
            Ok(Ok(None)) | Err(_) => Ok(None),
            Ok(Err(e)) => Err(error::map(what, e)),
        }
    }
}

impl EtcdBackend {
    /// The first waiter: until a key created before `own_revision` (or the own key) is
    /// deleted.
    pub(crate) async fn wait_first(
        &self,
        layout: &Layout,
        own_revision: i64,
        revision: i64,
        deadline: Instant,
    ) -> Result<()> {
        let options = WatchOptions::new()
            .with_prefix()
            .with_filters([WatchFilterType::NoPut])
            .with_prev_key();
        let opened = self
            .open_watch("watching the semaphore", &layout.all, options, deadline)
            .await?;
        let Some((mut watch, watched_from)) = opened else {
            return Ok(());
        };
        if watched_from > revision {
            let txn = Txn::new().and_then([layout.ahead_of(own_revision)]);
            let reading = self.read("reading the semaphore", txn_of(&txn));
            match tokio::time::timeout_at(deadline, reading).await {
                Ok(Ok(response)) => {
                    let ahead = reads_of(response).into_iter().next().unwrap_or_default();
                    if Rank::of(&ahead, layout.permits) != Rank::First {
                        return Ok(());
                    }
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(()),
            }
        }
        // A deletion ahead, or of the own key (an operator's delete: queue again). One
        // without its previous version (compacted) may be either: wake.
        let ahead_left = until_event(&mut watch, deadline, |event| {
            event.event_type() == EventType::Delete
                && event
                    .prev_kv()
                    .is_none_or(|kv| kv.create_revision() <= own_revision)
        });
        ahead_left
            .await
            .map_err(|e| error::map("watching the semaphore", e))
    }

    /// A later waiter: until its predecessor's key is deleted or written (its touch).
    pub(crate) async fn wait_behind(
        &self,
        predecessor: &str,
        created: i64,
        revision: i64,
        deadline: Instant,
    ) -> Result<()> {
        let opened = self
            .open_watch(
                "watching the predecessor",
                predecessor,
                WatchOptions::new(),
                deadline,
            )
            .await?;
        let Some((mut watch, watched_from)) = opened else {
            return Ok(());
        };
        if watched_from > revision {
            let reading = self.read("reading the predecessor", |mut client| {
                let predecessor = predecessor.to_owned();
                async move {
                    client
                        .get(predecessor, Some(GetOptions::new().with_keys_only()))
                        .await
                }
            });
            match tokio::time::timeout_at(deadline, reading).await {
                Ok(Ok(found))
                    if found.kvs().first().is_some_and(|kv| {
                        kv.create_revision() == created && kv.mod_revision() <= revision
                    }) => {}
                Ok(Ok(_)) | Err(_) => return Ok(()),
                Ok(Err(e)) => return Err(e),
            }
        }
        until_event(&mut watch, deadline, |_| true)
            .await
            .map_err(|e| error::map("watching the predecessor", e))
    }
}

/// Reads `watch` until an event that `wakes`, the watch's cancellation or end, or
/// `deadline`; only a broken stream is an error.
pub(crate) async fn until_event(
    watch: &mut WatchStream,
    deadline: Instant,
    wakes: impl Fn(&Event) -> bool + Send + Sync,
) -> std::result::Result<(), etcd_client::Error> {
    let woken = async {
        while let Some(response) = watch.message().await? {
            if response.canceled() || response.events().iter().any(&wakes) {
                break;
            }
        }
        Ok(())
    };
    tokio::time::timeout_at(deadline, woken)
        .await
        .unwrap_or(Ok(()))
}
