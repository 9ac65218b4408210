//! The pub/sub connection's life: opening it, dispatching its pushes, and bringing it back.
//!
//! A disconnection leaves no subscription standing ([`Inner::disconnected`] unconfirms every
//! channel and wakes every waiter to look at its lock), and the client library reconnects
//! only when a request fails, which a waiter that only listens never sends: [`recover`] pings
//! until the connection answers, then subscribes again to every channel that still has
//! waiters. A connection that stopped answering (found by [`probe`]), whose replies are out
//! of step, or whose sharded subscription the server ended unasked is dropped and replaced
//! ([`Inner::start_over`]); each connection has its generation, and the pushes of an earlier
//! one are ignored.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use lockkit_core::Result;
use lockkit_core::backend::Backoff;
use redis::aio::ConnectionManager;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc;

use super::{Inner, PROCLAIMED};

/// How often a pub/sub connection that someone listens on is pinged (see [`probe`]).
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The pauses between attempts to bring a lost pub/sub connection back.
const RECOVERY_MIN_DELAY: Duration = Duration::from_millis(50);
const RECOVERY_MAX_DELAY: Duration = Duration::from_secs(1);

impl Inner {
    /// The pub/sub connection, opened on first use with a task that dispatches its pushes.
    pub(super) fn connection(self: &Arc<Self>) -> Result<ConnectionManager> {
        let mut current = self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(connection) = &*current {
            return Ok(connection.clone());
        }
        let (pushes, received) = mpsc::unbounded_channel();
        let connection = self.dialer.pubsub(self.info.clone(), pushes)?;
        let generation = self.generation.load(Ordering::SeqCst);
        lockkit_core::backend::runtime::spawn(dispatch(Arc::downgrade(self), received, generation));
        lockkit_core::backend::runtime::spawn(probe(Arc::downgrade(self), generation));
        *current = Some(connection.clone());
        Ok(connection)
    }

    /// Drops the pub/sub connection and starts over as after a disconnection (every waiter
    /// retries, and finds where its lock is now), on a new connection. Called when the
    /// server ended a sharded subscription we did not end (its slot moved to another node),
    /// or a reply was out of step (see [`Inner::sharded`]).
    pub(super) fn start_over(self: &Arc<Self>) {
        {
            let mut current = self
                .connection
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.generation.fetch_add(1, Ordering::SeqCst);
            *current = None;
        }
        self.disconnected();
    }

    /// Whether the pub/sub connection answers a PING (a failure makes it reconnect).
    /// A reply other than `PONG` was meant for an earlier request (see [`Inner::sharded`]):
    /// the connection starts over.
    async fn reconnected(self: &Arc<Self>) -> bool {
        let Ok(mut connection) = self.connection() else {
            return false;
        };
        let pong = self
            .dialer
            .bounded("pinging the pub/sub connection", async move {
                redis::cmd("PING")
                    .query_async::<Value>(&mut connection)
                    .await
            })
            .await;
        match pong {
            Ok(Value::SimpleString(pong)) if pong == "PONG" => true,
            Ok(_) => {
                self.start_over();
                false
            }
            Err(_) => false,
        }
    }
}

/// The channel a push names first (a message's, a confirmation's).
fn channel_of(push: &PushInfo) -> Option<&str> {
    match push.data.first() {
        Some(Value::BulkString(channel)) => std::str::from_utf8(channel).ok(),
        _ => None,
    }
}

/// Hands the pushes of the pub/sub connection of `generation` to the notifier, until the
/// notifier is gone or has another connection.
async fn dispatch(
    inner: Weak<Inner>,
    mut received: mpsc::UnboundedReceiver<PushInfo>,
    generation: u64,
) {
    while let Some(push) = received.recv().await {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.generation.load(Ordering::SeqCst) != generation {
            return;
        }
        inner.heard.fetch_add(1, Ordering::Relaxed);
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                if let Some(channel) = channel_of(&push) {
                    // A proclamation changes no holder: it is for observers only.
                    match push.data.get(1) {
                        Some(Value::BulkString(m)) if inner.is_inbox(channel) => {
                            inner.inbox.announced(inner.node, m);
                        }
                        Some(Value::BulkString(m)) if m == PROCLAIMED.as_bytes() => {
                            inner.proclaimed(channel);
                        }
                        _ => inner.wake(Some(channel)),
                    }
                }
            }
            PushKind::Subscribe | PushKind::SSubscribe => {
                if let Some(channel) = channel_of(&push) {
                    inner.confirmed(channel);
                }
            }
            PushKind::SUnsubscribe => {
                if let Some(channel) = channel_of(&push)
                    && inner.unasked_unsubscribe(channel)
                {
                    tracing::debug!(
                        channel,
                        "a shard channel's slot moved: renewing the pub/sub connection"
                    );
                    inner.start_over();
                }
            }
            PushKind::Disconnection => inner.disconnected(),
            _ => {}
        }
    }
}

/// Brings the pub/sub connection back after a disconnection: the client library reconnects
/// once or twice by itself and then only when a request fails, which a waiter that only
/// listens never sends. So this pings until the connection answers (each failure starts a
/// reconnect), then subscribes again to every channel that still has waiters.
pub(super) async fn recover(inner: Weak<Inner>) {
    let mut delay = Backoff::new(RECOVERY_MIN_DELAY, RECOVERY_MAX_DELAY);
    loop {
        let Some(this) = inner.upgrade() else {
            return;
        };
        if this.reconnected().await {
            let mut renewed = true;
            for channel in this.unconfirmed() {
                let _changes = this.changes.lock().await;
                match this.send_subscribe(&channel).await {
                    // Its slot moved to another node: its waiters, woken, follow it there.
                    Err(e) if crate::cluster::redirected(&e) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "could not renew a release subscription");
                        renewed = false;
                        break;
                    }
                    Ok(()) => {}
                }
            }
            if renewed {
                this.recovering.store(false, Ordering::SeqCst);
                // A disconnection between the last check and the flag is recovered by us.
                if this.unconfirmed().is_empty() || this.recovering.swap(true, Ordering::SeqCst) {
                    return;
                }
            }
        }
        drop(this);
        tokio::time::sleep(delay.next_delay()).await;
    }
}

/// Pings the pub/sub connection of `generation` every [`PROBE_EVERY`] while anyone listens
/// on it, and starts over (as after a disconnection: every waiter retries, and the waiters
/// subscribe again on a new connection) when a ping is not answered within the response
/// timeout. A half-open connection (a peer gone without a reset, a dead link) delivers no
/// message and no disconnection: without the probe every hand-over would fall back to its
/// waiter's timer. An idle connection is not probed, nor one that delivered a push since the
/// last look (it is alive).
async fn probe(inner: Weak<Inner>, generation: u64) {
    let mut heard = 0;
    loop {
        tokio::time::sleep(PROBE_EVERY).await;
        let Some(this) = inner.upgrade() else {
            return;
        };
        if this.generation.load(Ordering::SeqCst) != generation {
            return;
        }
        let now_heard = this.heard.load(Ordering::Relaxed);
        let alive = std::mem::replace(&mut heard, now_heard) != now_heard;
        if alive || !this.listened_to() || this.reconnected().await {
            continue;
        }
        if this.generation.load(Ordering::SeqCst) == generation {
            tracing::debug!("the pub/sub connection did not answer a ping: starting over");
            this.start_over();
        }
        return;
    }
}
