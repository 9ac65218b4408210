//! Release notifications and hand-overs: every waiter of a backend listens through ONE shared
//! pub/sub connection.
//!
//! - **Hand-overs** (mutex waiters of Redis, Sentinel, a Redis Cluster's primaries and
//!   Redlock): a waiter queues on the server, and the release that ends the holder's grant
//!   gives the lock to the first live waiter in the queue and announces it on that waiter's
//!   *inbox*, a channel of its notifier's own (`lockkit:inbox:` and 128 random bits; with
//!   sharded pub/sub, that and the lock key), as `digest/attempt:token`. The notifier hands
//!   the token to the waiter registered under that owner digest ([`Inbox::expect`]), which
//!   then holds the lock without another request. One message per hand-over, to one
//!   connection, however many processes wait. Redlock's nodes share one inbox name, and its
//!   waiter counts a grant once a majority announced it (`redlock/wait.rs`).
//! - **Release channels** (semaphores, read-write locks and election observers, which
//!   Redlock does not support; its releases publish nothing): a notifier subscribes to the
//!   release channel of each key that has waiters. A release wakes ONE waiter of the key in
//!   this process (it retries at once; the others would only lose the race to it), or
//!   stores a wake-up for the next waiter when none is waiting at that moment; observers are
//!   all woken.
//!
//! Every channel records when it last changed on a notifier-wide sequence (a release; for
//! the inbox, only a (re)subscription or a disconnection), so a waiter that took a
//! [`Notifier::marker`] before its attempt knows without asking the server whether something
//! may have come in unseen since.
//!
//! One concern a file: `refusal.rs`, when waiters poll instead of subscribing; `inbox.rs`,
//! the hand-overs; `subscriptions.rs`, the release channels and who waits on each;
//! `recovery.rs`, the pub/sub connection's pushes, its loss and its return. Where a contended
//! hand-over's time goes, and what was tried, is measured in `docs/measurements.md`.

mod inbox;
mod recovery;
mod refusal;
mod subscriptions;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex as StdMutex};

use lockkit_core::{LockKey, Result};
use redis::ConnectionInfo;
use redis::aio::ConnectionManager;
use tokio::sync::Notify;

pub(crate) use self::inbox::Inbox;
pub(crate) use self::refusal::Refusal;
use self::subscriptions::Channel;
use crate::connection::Dialer;
use crate::scripts::{Keys, PubSub};

/// The message the proclaim script publishes on a lock's release channel (a release
/// publishes an empty one).
pub(crate) const PROCLAIMED: &str = "proclaimed";

/// The shared pub/sub connection of one backend (one primary address).
pub(crate) struct Notifier {
    inner: Arc<Inner>,
}

/// What a notifier shares with its background tasks (the dispatch of pushes, the probe,
/// the recovery, the lingering unsubscriptions) and its waiters' [`Subscription`]s.
struct Inner {
    dialer: Dialer,
    info: ConnectionInfo,
    /// Where the hand-overs to this notifier's waiters are announced (shared by the
    /// notifiers of one Redlock backend), and this notifier's server among those.
    inbox: Arc<Inbox>,
    node: usize,
    /// Classic or sharded channels (a Redis Cluster's primary, Redis 7 or later).
    pubsub: PubSub,
    /// The pub/sub connection, opened on first use, and dropped when the server dropped one
    /// of its sharded subscriptions (see [`Inner::start_over`]).
    connection: StdMutex<Option<ConnectionManager>>,
    /// Counts the pub/sub connections opened: the pushes of an earlier one are ignored.
    generation: AtomicU64,
    channels: StdMutex<HashMap<String, Channel>>,
    /// Counts changes of any channel: releases, (re)subscriptions, disconnections (shared
    /// by the notifiers of one Redlock backend, so that one marker speaks for all nodes).
    sequence: Arc<AtomicU64>,
    /// Serializes SUBSCRIBE and UNSUBSCRIBE, so an unsubscribe of an idle channel cannot
    /// overtake a new waiter's subscribe.
    changes: tokio::sync::Mutex<()>,
    /// A task is bringing the pub/sub connection back after a disconnection.
    recovering: AtomicBool,
    /// How many disconnections the pub/sub connection had.
    disconnections: AtomicU64,
    /// How many pushes arrived: a connection that delivers them needs no probe.
    heard: AtomicU64,
}

/// One waiter's interest in a channel; dropping it may unsubscribe (after the channel's
/// linger, see `subscriptions.rs`).
pub(crate) struct Subscription {
    inner: Arc<Inner>,
    channel: String,
    releases: Arc<Notify>,
    observers: Arc<Notify>,
    /// Whether the channel changed after the marker the caller passed, when it joined.
    changed_since: bool,
    /// Counted among the channel's waiters (false after a failed subscribe).
    joined: bool,
}

impl Notifier {
    /// The notifier of one server, whose scripts publish as `pubsub` says.
    pub(crate) fn new(dialer: Dialer, info: ConnectionInfo, pubsub: PubSub) -> Self {
        Notifier::with(
            dialer,
            info,
            pubsub,
            Arc::default(),
            Arc::new(Inbox::new(1)),
            0,
        )
    }

    /// A notifier whose changes count on `sequence` and whose hand-overs go to `inbox`, both
    /// shared with other notifiers: those of the other servers of a Redlock backend, this
    /// one being server `node` among them.
    pub(crate) fn sharing(
        dialer: Dialer,
        info: ConnectionInfo,
        sequence: Arc<AtomicU64>,
        inbox: Arc<Inbox>,
        node: usize,
    ) -> Self {
        Notifier::with(dialer, info, PubSub::Classic, sequence, inbox, node)
    }

    fn with(
        dialer: Dialer,
        info: ConnectionInfo,
        pubsub: PubSub,
        sequence: Arc<AtomicU64>,
        inbox: Arc<Inbox>,
        node: usize,
    ) -> Self {
        Notifier {
            inner: Arc::new(Inner {
                dialer,
                info,
                inbox,
                node,
                pubsub,
                connection: StdMutex::new(None),
                generation: AtomicU64::new(0),
                channels: StdMutex::new(HashMap::new()),
                sequence,
                changes: tokio::sync::Mutex::new(()),
                recovering: AtomicBool::new(false),
                disconnections: AtomicU64::new(0),
                heard: AtomicU64::new(0),
            }),
        }
    }

    /// Wakes every waiter (this connection stops being the one releases are published on).
    pub(crate) fn wake_all(&self) {
        self.inner.wake(None);
    }

    /// Where the hand-overs to this notifier's waiters are announced.
    pub(crate) fn inbox(&self) -> &Inbox {
        &self.inner.inbox
    }

    /// Classic or sharded pub/sub.
    pub(crate) fn pubsub(&self) -> PubSub {
        self.inner.pubsub
    }

    /// The channel a hand-over of `key`'s lock to one of this notifier's waiters is announced
    /// on: the inbox itself, or with sharded pub/sub, the inbox and the lock key (in the
    /// lock's slot, as the release script must publish there).
    pub(crate) fn inbox_channel(&self, key: &LockKey) -> String {
        match self.inner.pubsub {
            PubSub::Classic => self.inner.inbox.name().to_owned(),
            PubSub::Sharded => format!("{}:{}", self.inner.inbox.name(), Keys::of(key).lock),
        }
    }

    /// Hands a wake-up to another waiter of `channel`: called when an acquisition ends
    /// without the lock, since it may have been the waiter a release woke.
    pub(crate) fn pass_on(&self, channel: &str) {
        self.inner.pass_on(channel);
    }

    /// A marker of what this notifier has seen on `channel`, if the channel is subscribed
    /// now: taken before an attempt, it lets [`Notifier::subscribe`] tell whether a release
    /// (or anything that may have hidden one) came in after the attempt.
    pub(crate) fn marker(&self, channel: &str) -> Option<u64> {
        self.inner.marker(channel)
    }

    /// Subscribes to `channel` (or joins its subscription) and returns once the server has
    /// confirmed it: every message published after this returns is seen.
    /// [`Subscription::changed_since_marker`] says whether the channel changed after `marker`
    /// (always true for a new subscription, or without a marker).
    ///
    /// # Errors
    /// When the pub/sub connection cannot be opened or the server refuses the subscription;
    /// the caller then polls.
    pub(crate) async fn subscribe(
        &self,
        channel: &str,
        marker: Option<u64>,
    ) -> Result<Subscription> {
        self.inner.subscribe(channel, marker).await
    }
}

impl Subscription {
    /// Whether the channel may have changed after the marker passed to
    /// [`Notifier::subscribe`]: then the caller must look at the lock before waiting.
    pub(crate) fn changed_since_marker(&self) -> bool {
        self.changed_since
    }

    /// What wakes election observers: every release and proclamation on the channel, and a
    /// disconnection. Create and enable its `notified()` before reading the leader, so
    /// that nothing published after the read is missed.
    pub(crate) fn leader_changes(&self) -> &Notify {
        &self.observers
    }

    /// Waits until this waiter is the one woken by a release on the channel (or by a
    /// disconnection of the pub/sub connection, after which a release may have been missed).
    pub(crate) async fn released(&mut self) {
        self.releases.notified().await;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if self.joined {
            self.inner.leave(&self.channel);
        }
    }
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("channels", &self.inner.channels().len())
            .finish()
    }
}
