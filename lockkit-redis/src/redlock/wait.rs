//! The wait of a Redlock waiter: until a majority of the nodes hand the lock over to it.
//!
//! Every node keeps its own queue of the lock's waiters (`scripts/queue.lua`), in the
//! order of each acquisition's *turn*: the wall-clock time it first queued, which every node
//! is told alike, so the nodes' queues agree on who is first however the requests of a
//! fan-out interleave. A holder's release reaches every node, and each node hands its key to
//! the first live waiter of its queue and announces it on that waiter's inbox (the same
//! channel name on every node): the waiter that is first everywhere holds a majority
//! without another request.
//!
//! The waiter listens on a majority of the nodes, the first in configuration order that take
//! its subscription (a node that refuses or does not answer is left alone for 30 s), and
//! counts only the announcements that name its last attempt (each attempt queues it under
//! its digest and attempt number, `Handover::attempting`): such a hand-over followed that
//! attempt on its node, so the key lives at least the TTL from the attempt's send time, and
//! the grant is valid from then as an attempt's grant is (`ttl - node_timeout`, less the
//! drift). It counts them only if a majority announced the same token (the nodes' counters
//! agree when the releaser's proposed token is above them, the usual case). Otherwise, and
//! when the announcements stop short of a majority for a node timeout (the queues
//! disagreed: a waiter that queued on some nodes only, an entry that lapsed on one), it
//! looks at the lock with a new attempt, which finds the keys it holds, writes the token
//! back or rolls a minority back (a rollback keeps the waiter's place, see `attempt.rs`), as
//! for any attempt.
//!
//! What the queue and hand-over gained over retrying on a release notification, and the
//! alternatives tried and not kept, are in docs/measurements.md ("Redlock: queue and
//! hand-over, measured").
//!
//! A non-fair waiter does not queue: it listens on the lock's release channel of one node
//! (the first that takes the subscription; every release is sent to every node, and each
//! publishes it) and attempts again when it hears one, or when the attempt's holders' keys
//! may have expired. A non-fair attempt that won only a minority publishes its rollback too:
//! when votes split, every contender rolls back, and only those rollbacks free the lock
//! (measured: without them, split votes left the waiters asleep until their timers, 3.4 s
//! longest waits in W2 on Redlock-5).

use std::time::Duration;

use futures_util::future::join_all;
use lockkit_core::backend::{AcquireRequest, Contention, Grant};
use lockkit_core::{FencingToken, Result};
use tokio::time::Instant;

use super::{BACKEND, Node, RedlockBackend};
use crate::error::timed_out;
use crate::notify::Subscription;
use crate::scripts::Keys;

impl RedlockBackend {
    /// See the module docs.
    pub(super) async fn wait_for_handover(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        let digest = request.owner.digest_hex();
        let handover = self.inbox.expect(&digest);
        let max_wait = max_wait
            .min(contention.retry_after.unwrap_or(max_wait))
            .min(request.ttl / 3);

        let bound = self.config.node_timeout;
        // A majority of the nodes, the first in configuration order that take the
        // subscription: a waiter needs no more announcements, and each costs its node a
        // write and this process a read. Those that refuse are replaced by the next ones.
        let mut candidates = self.nodes.iter().filter(|node| node.refusal.allows());
        let mut subscriptions = Vec::new();
        loop {
            let missing = self.quorum().saturating_sub(subscriptions.len());
            let batch: Vec<_> = candidates
                .by_ref()
                .take(missing)
                .map(|node| self.subscribe(node, self.inbox.name(), contention.marker))
                .collect();
            if batch.is_empty() {
                break;
            }
            subscriptions.extend(join_all(batch).await.into_iter().flatten());
        }
        // Too few nodes to hear a majority from: look again after the wait, as a poller.
        if subscriptions.len() < self.quorum() {
            tokio::time::sleep(max_wait).await;
            return Ok(None);
        }
        // An inbox subscribed since the attempt was sent may have missed its announcement.
        if subscriptions.iter().any(|s| s.changed_since_marker()) {
            return Ok(None);
        }
        let mut deadline = Instant::now() + max_wait;
        loop {
            let heard = handover.tokens().len();
            if tokio::time::timeout_at(deadline, handover.arrived())
                .await
                .is_err()
            {
                return Ok(None);
            }
            let tokens: Vec<u64> = handover.tokens().iter().map(|(_, token)| *token).collect();
            if tokens.len() >= self.quorum() {
                let token = tokens.iter().copied().max().unwrap_or_default();
                if tokens.iter().filter(|t| **t == token).count() < self.quorum() {
                    return Ok(None);
                }
                self.inbox.forget(&digest);
                return Ok(Some(Grant::new(
                    FencingToken(token),
                    self.validity(request.ttl),
                )));
            }
            // Woken with nothing new: a pub/sub connection dropped, announcements may be lost.
            if handover.tokens().len() == heard {
                return Ok(None);
            }
            // The first announcements: the others come within a node timeout, or the queues
            // disagreed.
            deadline = deadline.min(Instant::now() + bound);
        }
    }

    /// The wait of a non-fair waiter (see the module docs).
    pub(super) async fn wait_for_release(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        let channel = Keys::of(&request.key).channel;
        let max_wait = max_wait.min(contention.retry_after.unwrap_or(max_wait));
        for node in self.nodes.iter().filter(|node| node.refusal.allows()) {
            let Some(mut subscription) = self.subscribe(node, &channel, contention.marker).await
            else {
                continue;
            };
            // A release between the attempt and the subscription may have gone unheard.
            if !subscription.changed_since_marker() {
                let _ = tokio::time::timeout(max_wait, subscription.released()).await;
            }
            return Ok(None);
        }
        // No node takes the subscription: look again after the wait, as a poller.
        tokio::time::sleep(max_wait).await;
        Ok(None)
    }

    /// Subscribes to `channel` on `node`, bounded by the node timeout; a node that refuses
    /// or does not answer is left alone for a while.
    async fn subscribe(
        &self,
        node: &Node,
        channel: &str,
        marker: Option<u64>,
    ) -> Option<Subscription> {
        let bound = self.config.node_timeout;
        let subscribing = node.notifier.subscribe(channel, marker);
        match tokio::time::timeout(bound, subscribing).await {
            Ok(Ok(subscription)) => Some(subscription),
            Ok(Err(e)) => {
                node.refusal.refused(&e);
                None
            }
            Err(_) => {
                node.refusal
                    .refused(&timed_out(BACKEND, "subscribing", bound));
                None
            }
        }
    }
}
