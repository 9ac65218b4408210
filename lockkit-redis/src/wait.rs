//! Waiting on one Redis server or a Sentinel primary.
//!
//! A fair mutex's or semaphore's waiter, and a read-write lock's writer, queues on the
//! server in the same script as its attempt; the script that frees the grant hands it to
//! the first live waiter and announces it on that waiter's inbox channel, so the woken
//! waiter holds it without another request ([`RedisBackend::wait_for_handover`]). A
//! non-fair mutex's or semaphore's waiter, and a reader, listen on the release channel of
//! what they wait for and attempt again when something went
//! ([`RedisBackend::wait_for_release`]): one waiter of this process per release, so a
//! release does not send every waiter of a process at the server at once. Every waiter of a
//! backend shares its one pub/sub connection; when the server refuses a subscription,
//! waiters poll for a while.

use std::time::Duration;

use lockkit_core::backend::{AcquireRequest, Contention, Grant};
use lockkit_core::{FencingToken, Result};

use crate::backend::RedisBackend;
use crate::notify::Subscription;
use crate::semaphore;

impl RedisBackend {
    /// The wait of a queued waiter: until the grant is handed over to it (announced on the
    /// inbox), or `max_wait`, or the first expiry its attempt saw (a holder that expires
    /// hands over at the next attempt of any waiter), at most a third of the waiter's TTL so
    /// that its attempts keep its queue entry alive.
    pub(crate) async fn wait_for_handover(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        let epoch = self.primary.epoch();
        let notifier = &epoch.notifier;
        let handover = notifier.inbox().expect(&request.owner.digest_hex());
        let channel = notifier.inbox_channel(&request.key);
        let Some(subscription) = self.listen(&channel, contention.marker).await? else {
            return Ok(None);
        };
        // The inbox was not subscribed when the attempt was sent (or lost its subscription
        // since): the lock may have been handed over unannounced. Look at once.
        if subscription.changed_since_marker() {
            return Ok(None);
        }
        let max_wait = max_wait
            .min(contention.retry_after.unwrap_or(max_wait))
            .min(request.ttl / 3);
        let _ = tokio::time::timeout(max_wait, handover.arrived()).await;
        drop(subscription);
        let token = handover.tokens().first().map(|(_, token)| *token);
        match token {
            // With min_replicas, a grant counts once replicas acknowledged it: the next
            // attempt finds the lock ours and waits for them. A hand-over announced by a
            // primary the backend has since left is not handed out: the next attempt asks
            // the new one.
            Some(token) if self.config.min_replicas == 0 && self.primary.is_current(&epoch) => {
                notifier.inbox().forget(&request.owner.digest_hex());
                Ok(Some(Grant::new(FencingToken(token), request.ttl)))
            }
            _ => Ok(None),
        }
    }

    /// The wait of a non-fair mutex's or semaphore's waiter, or a reader: until a release is
    /// heard on the channel of what it waits for, or `max_wait`, or the first expiry its
    /// attempt saw.
    pub(crate) async fn wait_for_release(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        let channel = semaphore::channel_of(&request.key, request.hold);
        let Some(mut subscription) = self.listen(&channel, contention.marker).await? else {
            return Ok(None);
        };
        // A release between the attempt and the subscription published nothing we saw: try
        // again at once (the attempt costs what a look at the holder would, and may win).
        // Subscribed since before the attempt with nothing received since, the holder the
        // attempt saw still holds, and its release will be seen.
        if subscription.changed_since_marker() {
            return Ok(None);
        }
        let remaining = contention.retry_after.unwrap_or(max_wait);
        let _ = tokio::time::timeout(max_wait.min(remaining), subscription.released()).await;
        Ok(None)
    }

    /// Whether waiters are woken by release notifications now (configured, and the server
    /// did not refuse them lately).
    pub(crate) fn notifies(&self) -> bool {
        self.config.notifications && self.refusal.allows()
    }

    /// Subscribes to `channel` (see [`Notifier::subscribe`](crate::notify::Notifier::subscribe)), or answers `None` when the
    /// server refused: waiters then poll for a while. A subscription a cluster answered
    /// `MOVED` is no refusal: that error is returned, and the cluster's router follows the
    /// slot.
    pub(crate) async fn listen(
        &self,
        channel: &str,
        marker: Option<u64>,
    ) -> Result<Option<Subscription>> {
        match self
            .primary
            .epoch()
            .notifier
            .subscribe(channel, marker)
            .await
        {
            Ok(subscription) => Ok(Some(subscription)),
            Err(e) if crate::cluster::redirected(&e) => Err(e),
            Err(e) => {
                if self.refusal.refused(&e) {
                    tracing::warn!(error = %e, "release notifications unavailable; waiters poll with backoff");
                }
                Ok(None)
            }
        }
    }
}
