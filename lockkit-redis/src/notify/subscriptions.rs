//! The release channels' subscriptions: which channels this notifier is subscribed to, who
//! waits on each, and how a release wakes them.
//!
//! A waiter joins a channel whose subscription the server confirmed on the connection that
//! is up ([`Inner::join`], no request), or registers it and subscribes (under
//! [`Inner::changes`], so that an unsubscribe of an idle channel cannot overtake it). The
//! channel is registered before SUBSCRIBE is sent, so a release published right after the
//! confirmation finds it. A channel whose last waiter left stays subscribed for [`LINGER`],
//! then is unsubscribed if it is still idle. Sharded channels (a Redis Cluster's primary)
//! are (un)subscribed by a request whose reply is the server's confirmation ([`confirms`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use lockkit_core::Result;
use redis::{PushKind, Value};
use tokio::sync::Notify;

use super::recovery::recover;
use super::{Inner, Subscription};
use crate::scripts::PubSub;

/// A channel stays subscribed this long after its last waiter left, so that a waiter that
/// retries and waits again finds it still subscribed.
const LINGER: Duration = Duration::from_secs(2);

/// One subscribed (or being subscribed) channel.
pub(super) struct Channel {
    /// Wakes one waiter per release (or the next one to wait, when none does).
    releases: Arc<Notify>,
    /// Election observers: every one is woken by a release or a proclamation.
    observers: Arc<Notify>,
    /// The [`Inner::sequence`] value of the channel's last change.
    changed_at: u64,
    /// How many [`Subscription`]s hold the channel.
    waiters: usize,
    /// Since when the channel has had no waiter, and whether a task is waiting to
    /// unsubscribe it [`LINGER`] after that (one per channel, however often it goes idle).
    idle_since: Instant,
    lingering: bool,
    /// The server confirmed the subscription, on the pub/sub connection that is up now
    /// (false again from a disconnection until the subscription is renewed).
    confirmed: bool,
}

impl Inner {
    /// Subscribes to `channel` or joins its subscription: see [`Notifier::subscribe`].
    ///
    /// [`Notifier::subscribe`]: super::Notifier::subscribe
    pub(super) async fn subscribe(
        self: &Arc<Self>,
        channel: &str,
        marker: Option<u64>,
    ) -> Result<Subscription> {
        if let Some(subscription) = self.join(channel, marker) {
            return Ok(subscription);
        }
        let _changes = self.changes.lock().await;
        if let Some(subscription) = self.join(channel, marker) {
            return Ok(subscription);
        }
        // The channel is registered before SUBSCRIBE is sent: a release published right after
        // the confirmation must find it when its push is dispatched. A channel that lost its
        // subscription with a disconnection keeps its entry (its waiters hold its `releases`)
        // and is subscribed again.
        let (releases, observers) = {
            let mut channels = self.channels();
            let changed_at = self.next();
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    releases: Arc::new(Notify::new()),
                    observers: Arc::new(Notify::new()),
                    changed_at,
                    waiters: 0,
                    idle_since: Instant::now(),
                    lingering: false,
                    confirmed: false,
                });
            entry.waiters += 1;
            (entry.releases.clone(), entry.observers.clone())
        };
        let mut subscription = Subscription {
            inner: self.clone(),
            channel: channel.to_owned(),
            releases,
            observers,
            changed_since: true,
            joined: true,
        };
        match self.send_subscribe(channel).await {
            Ok(()) => Ok(subscription),
            Err(e) => {
                let mut channels = self.channels();
                if let Some(entry) = channels.get_mut(channel) {
                    entry.waiters -= 1;
                    if entry.waiters == 0 && !entry.confirmed {
                        channels.remove(channel);
                    }
                }
                subscription.joined = false;
                Err(e)
            }
        }
    }

    /// See [`Notifier::marker`](super::Notifier::marker).
    pub(super) fn marker(&self, channel: &str) -> Option<u64> {
        let channels = self.channels();
        let entry = channels.get(channel).filter(|entry| entry.confirmed)?;
        Some(entry.changed_at.max(self.sequence.load(Ordering::SeqCst)))
    }

    /// See [`Notifier::pass_on`](super::Notifier::pass_on).
    pub(super) fn pass_on(&self, channel: &str) {
        if let Some(entry) = self.channels().get(channel) {
            entry.releases.notify_one();
        }
    }

    /// Wakes the election observers of `channel`.
    pub(super) fn proclaimed(&self, channel: &str) {
        if let Some(entry) = self.channels().get(channel) {
            entry.observers.notify_waiters();
        }
    }

    /// Subscribes on lockkit's runtime, where the pub/sub connection's driver lives.
    pub(super) async fn send_subscribe(self: &Arc<Self>, channel: &str) -> Result<()> {
        let inner = self.clone();
        let channel = channel.to_owned();
        lockkit_core::backend::runtime::run(async move {
            let disconnections = inner.disconnections.load(Ordering::SeqCst);
            match inner.pubsub {
                PubSub::Classic => {
                    let mut connection = inner.connection()?;
                    let name = channel.clone();
                    inner
                        .dialer
                        .bounded("subscribing to release notifications", async move {
                            connection.subscribe(&name).await
                        })
                        .await?;
                }
                PubSub::Sharded => inner.sharded("SSUBSCRIBE", &channel).await?,
            }
            // Confirmed here, not by the waiter: it may have been cancelled meanwhile. Not if
            // the connection it was confirmed on went down since (the recovery renews it).
            let mut channels = inner.channels();
            if inner.disconnections.load(Ordering::SeqCst) == disconnections
                && let Some(entry) = channels.get_mut(&channel)
            {
                entry.confirmed = true;
            }
            Ok(())
        })
        .await?
    }

    /// The channels, by name.
    pub(super) fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next value of the sequence.
    fn next(&self) -> u64 {
        self.sequence.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Joins `channel` without a request if its subscription is confirmed.
    fn join(self: &Arc<Self>, channel: &str, marker: Option<u64>) -> Option<Subscription> {
        let mut channels = self.channels();
        let entry = channels.get_mut(channel).filter(|entry| entry.confirmed)?;
        entry.waiters += 1;
        Some(Subscription {
            inner: self.clone(),
            channel: channel.to_owned(),
            releases: entry.releases.clone(),
            observers: entry.observers.clone(),
            changed_since: marker.is_none_or(|marker| entry.changed_at > marker),
            joined: true,
        })
    }

    /// Whether anyone listens: a channel with waiters, or a queued waiter expecting a
    /// hand-over on the inbox.
    pub(super) fn listened_to(&self) -> bool {
        self.channels().values().any(|entry| entry.waiters > 0)
            || !self.inbox.expecting().is_empty()
    }

    /// `SSUBSCRIBE` or `SUNSUBSCRIBE` of one shard channel, whose confirmation is the
    /// command's reply. A reply that confirms something else was meant for an earlier
    /// request: the client library takes a `sunsubscribe` the server sends unasked (a slot
    /// moved away) for the reply of the request in flight, and every later reply for the one
    /// before. The connection then starts over ([`Inner::start_over`]), and this fails.
    async fn sharded(self: &Arc<Self>, command: &'static str, channel: &str) -> Result<()> {
        let mut connection = self.connection()?;
        let name = channel.to_owned();
        let reply = self
            .dialer
            .bounded("changing a shard channel subscription", async move {
                redis::cmd(command)
                    .arg(&name)
                    .query_async::<Value>(&mut connection)
                    .await
            })
            .await?;
        let kind = match command {
            "SSUBSCRIBE" => PushKind::SSubscribe,
            _ => PushKind::SUnsubscribe,
        };
        if confirms(&reply, &kind, channel) {
            return Ok(());
        }
        self.start_over();
        Err(lockkit_core::Error::new(
            lockkit_core::ErrorKind::Unavailable,
            crate::error::BACKEND,
            "the pub/sub connection's replies were out of step (a push the server sent unasked): reconnecting",
        )
        .with_retryable(true))
    }

    /// Whether `channel` is one of this notifier's inbox channels.
    pub(super) fn is_inbox(&self, channel: &str) -> bool {
        channel
            .strip_prefix(self.inbox.name())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(':'))
    }

    /// Whether the server ended the subscription to `channel` unasked: we still take it for
    /// subscribed (an unsubscribe of ours unconfirms the channel first).
    pub(super) fn unasked_unsubscribe(&self, channel: &str) -> bool {
        self.channels()
            .get(channel)
            .is_some_and(|entry| entry.confirmed)
    }

    /// A waiter's [`Subscription`] was dropped: a channel left without waiters lingers.
    pub(super) fn leave(self: &Arc<Self>, channel: &str) {
        let linger = {
            let mut channels = self.channels();
            match channels.get_mut(channel) {
                Some(entry) => {
                    entry.waiters -= 1;
                    if entry.waiters == 0 {
                        entry.idle_since = Instant::now();
                    }
                    let linger = entry.waiters == 0 && !entry.lingering;
                    entry.lingering |= linger;
                    linger
                }
                None => false,
            }
        };
        if linger {
            let inner = self.clone();
            let channel = channel.to_owned();
            lockkit_core::backend::runtime::spawn(async move {
                inner.linger(&channel).await;
            });
        }
    }

    /// Unsubscribes `channel` once it has had no waiter for [`LINGER`]; stops watching as
    /// soon as it has one.
    async fn linger(self: &Arc<Self>, channel: &str) {
        loop {
            let until = {
                let mut channels = self.channels();
                let Some(entry) = channels.get_mut(channel) else {
                    return;
                };
                if entry.waiters > 0 {
                    entry.lingering = false;
                    return;
                }
                let until = entry.idle_since + LINGER;
                if Instant::now() >= until {
                    entry.lingering = false;
                    None
                } else {
                    Some(until)
                }
            };
            match until {
                Some(until) => tokio::time::sleep_until(until.into()).await,
                None => break,
            }
        }
        self.unsubscribe_if_idle(channel).await;
    }

    /// Unsubscribes `channel` if it still has no waiter.
    async fn unsubscribe_if_idle(self: &Arc<Self>, channel: &str) {
        let _changes = self.changes.lock().await;
        {
            // Unconfirmed while it goes: a new waiter takes the slow path and waits for us.
            let mut channels = self.channels();
            match channels.get_mut(channel) {
                Some(entry) if entry.waiters == 0 => entry.confirmed = false,
                _ => return,
            }
        }
        let connection = self
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let unsubscribed = match (connection, self.pubsub) {
            (Some(mut connection), PubSub::Classic) => {
                let name = channel.to_owned();
                self.dialer
                    .bounded("unsubscribing", async move {
                        connection.unsubscribe(&name).await
                    })
                    .await
            }
            (Some(_), PubSub::Sharded) => self.sharded("SUNSUBSCRIBE", channel).await,
            (None, _) => Ok(()),
        };
        let mut channels = self.channels();
        match unsubscribed {
            Ok(()) => {
                channels.remove(channel);
            }
            Err(e) => {
                // Perhaps still subscribed, perhaps not (a disconnection): the next waiter
                // subscribes again, which is harmless either way.
                tracing::debug!(error = %e, "could not unsubscribe from a release channel");
                if let Some(entry) = channels.get_mut(channel)
                    && entry.waiters == 0
                {
                    channels.remove(channel);
                }
            }
        }
    }

    /// After a disconnection: no subscription holds any more (a release published until it
    /// is renewed reaches nobody), so every channel is unconfirmed (waiters subscribe again,
    /// and retry before they sleep), every waiter retries now, and a task brings the
    /// connection back even if no waiter asks for it.
    pub(super) fn disconnected(self: &Arc<Self>) {
        {
            let mut channels = self.channels();
            self.disconnections.fetch_add(1, Ordering::SeqCst);
            for entry in channels.values_mut() {
                entry.confirmed = false;
            }
        }
        self.wake(None);
        if !self.recovering.swap(true, Ordering::SeqCst) {
            lockkit_core::backend::runtime::spawn(recover(Arc::downgrade(self)));
        }
    }

    /// The server confirmed a subscription to `channel` (a waiter's, or the client's own
    /// resubscription after a reconnect): releases published from now on are seen.
    pub(super) fn confirmed(&self, channel: &str) {
        let mut channels = self.channels();
        if let Some(entry) = channels.get_mut(channel)
            && !entry.confirmed
        {
            entry.confirmed = true;
            entry.changed_at = self.next();
        }
    }

    /// The channels that have waiters but no confirmed subscription.
    pub(super) fn unconfirmed(&self) -> Vec<String> {
        self.channels()
            .iter()
            .filter(|(_, entry)| !entry.confirmed && entry.waiters > 0)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Wakes one waiter of `channel` after a release, or every waiter of every channel and
    /// every queued waiter (after a disconnection, when messages may have been missed); and
    /// every election observer of them.
    pub(super) fn wake(&self, channel: Option<&str>) {
        let mut channels = self.channels();
        let changed_at = self.next();
        match channel {
            Some(channel) => {
                if let Some(entry) = channels.get_mut(channel) {
                    entry.changed_at = changed_at;
                    entry.releases.notify_one();
                    entry.observers.notify_waiters();
                }
            }
            None => {
                for entry in channels.values_mut() {
                    entry.changed_at = changed_at;
                    entry.observers.notify_waiters();
                    entry.releases.notify_waiters();
                    // And one for a waiter that is between its attempt and its wait.
                    entry.releases.notify_one();
                }
                drop(channels);
                self.inbox.wake_all();
            }
        }
    }
}

/// Whether `reply` is the server's confirmation `kind` (`ssubscribe`, `sunsubscribe`) of
/// `channel`.
fn confirms(reply: &Value, kind: &PushKind, channel: &str) -> bool {
    matches!(
        reply,
        Value::Push { kind: confirmed, data }
            if confirmed == kind
                && matches!(data.first(), Some(Value::BulkString(c)) if c == channel.as_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard subscription's reply is its own only if it confirms that command for that
    /// channel: an unasked `sunsubscribe` of another channel, or of the same one when a
    /// subscription was asked, is an earlier reply.
    #[test]
    fn only_its_own_confirmation_answers_a_shard_subscription() {
        let push = |kind: PushKind, channel: &str| Value::Push {
            kind,
            data: vec![Value::BulkString(channel.into()), Value::Int(1)],
        };
        assert!(confirms(
            &push(PushKind::SSubscribe, "a"),
            &PushKind::SSubscribe,
            "a"
        ));
        assert!(!confirms(
            &push(PushKind::SSubscribe, "b"),
            &PushKind::SSubscribe,
            "a"
        ));
        assert!(!confirms(
            &push(PushKind::SUnsubscribe, "a"),
            &PushKind::SSubscribe,
            "a"
        ));
        assert!(confirms(
            &push(PushKind::SUnsubscribe, "a"),
            &PushKind::SUnsubscribe,
            "a"
        ));
        assert!(!confirms(
            &Value::SimpleString("PONG".into()),
            &PushKind::SSubscribe,
            "a"
        ));
    }
}
