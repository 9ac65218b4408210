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
//! Where a contended hand-over's time goes, and what was tried, is measured in
//! `docs/measurements.md`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::{Duration, Instant};

use lockkit_core::backend::Backoff;
use lockkit_core::{LockKey, Result};
use redis::aio::ConnectionManager;
use redis::{ConnectionInfo, PushInfo, PushKind, Value};
use tokio::sync::{Notify, mpsc};

use crate::connection::Dialer;
use crate::scripts::{Keys, PubSub};

/// A channel stays subscribed this long after its last waiter left, so that a waiter that
/// retries and waits again finds it still subscribed.
const LINGER: Duration = Duration::from_secs(2);
/// How often a pub/sub connection that someone listens on is pinged (see `probe`).
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// How long waiters poll instead of subscribing after a server refused a subscription.
const POLL_AFTER_REFUSAL: Duration = Duration::from_secs(30);

/// How long waiters poll after a subscription failed for want of a connection (the server
/// restarting, say): the pub/sub connection is being recovered meanwhile.
const POLL_AFTER_OUTAGE: Duration = Duration::from_secs(1);

/// The pauses between attempts to bring a lost pub/sub connection back.
const RECOVERY_MIN_DELAY: Duration = Duration::from_millis(50);
const RECOVERY_MAX_DELAY: Duration = Duration::from_secs(1);

/// Whether a server lately refused release notifications: then waiters poll for
/// [`POLL_AFTER_REFUSAL`] instead of asking it again on every wait.
#[derive(Debug, Default)]
pub(crate) struct Refusal {
    until: StdMutex<Option<Instant>>,
}

impl Refusal {
    /// Whether subscriptions may be asked for now.
    pub(crate) fn allows(&self) -> bool {
        let mut until = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        if until.is_some_and(|until| Instant::now() >= until) {
            *until = None;
        }
        until.is_none()
    }

    /// Records a failed subscription: polling for [`POLL_AFTER_REFUSAL`] after a refusal,
    /// for [`POLL_AFTER_OUTAGE`] when the server could not be reached. True if it is the
    /// first since notifications last worked.
    pub(crate) fn refused(&self, error: &lockkit_core::Error) -> bool {
        let pause = if error.kind() == lockkit_core::ErrorKind::Unavailable {
            POLL_AFTER_OUTAGE
        } else {
            POLL_AFTER_REFUSAL
        };
        let mut until = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        let first = until.is_none();
        *until = Some(Instant::now() + pause);
        first
    }
}

/// The message the proclaim script publishes on a lock's release channel (a release
/// publishes an empty one).
pub(crate) const PROCLAIMED: &str = "proclaimed";

/// The shared pub/sub connection of one backend (one primary address).
pub(crate) struct Notifier {
    inner: Arc<Inner>,
}

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
    recovering: std::sync::atomic::AtomicBool,
    /// How many disconnections the pub/sub connection had.
    disconnections: AtomicU64,
    /// How many pushes arrived: a connection that delivers them needs no probe.
    heard: AtomicU64,
}

/// The inbox of a backend's waiters: the channel the grants handed over to them are
/// announced on (the same name on every server of a Redlock backend), and the waiters that
/// expect one.
pub(crate) struct Inbox {
    name: String,
    /// How many servers must announce a hand-over for it to count (a majority of Redlock's).
    quorum: usize,
    /// The queued waiters, by owner digest.
    expecting: StdMutex<HashMap<String, Arc<Handover>>>,
}

impl Inbox {
    /// A new inbox, named `lockkit:inbox:` and 128 random bits, for hand-overs that count
    /// once `quorum` servers announced them.
    pub(crate) fn new(quorum: usize) -> Self {
        Inbox {
            name: format!("lockkit:inbox:{:032x}", rand::random::<u128>()),
            quorum,
            expecting: StdMutex::default(),
        }
    }

    /// The channel name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Registers the queued waiter `digest` (an owner digest), before the attempt that may
    /// queue it: a grant announced from then on is kept for it. Registering again returns
    /// the same [`Handover`].
    pub(crate) fn expect(&self, digest: &str) -> Arc<Handover> {
        let mut expecting = self.expecting();
        if let Some(handover) = expecting.get(digest) {
            return handover.clone();
        }
        let handover = Arc::new(Handover::default());
        expecting.insert(digest.to_owned(), handover.clone());
        handover
    }

    /// Unregisters the waiter `digest`: it holds the lock, or gave up.
    pub(crate) fn forget(&self, digest: &str) {
        self.expecting().remove(digest);
    }

    fn expecting(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Handover>>> {
        self.expecting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A grant announced by server `node` (`digest/attempt:token`, the name its waiter's
    /// attempt queued under, see [`Handover::attempting`]): handed to the waiter `digest` if
    /// it is still registered (one that gave up released the lock on the server, or will)
    /// and that attempt is its last.
    fn announced(&self, node: usize, message: &[u8]) {
        let Some((digest, attempt, token)) = std::str::from_utf8(message)
            .ok()
            .and_then(|m| m.split_once(':'))
            .and_then(|(name, token)| {
                let (digest, attempt) = name.split_once('/')?;
                Some((
                    digest,
                    attempt.parse::<u64>().ok()?,
                    token.parse::<u64>().ok()?,
                ))
            })
        else {
            tracing::debug!("ignoring a malformed hand-over announcement");
            return;
        };
        if let Some(handover) = self.expecting().get(digest) {
            let mut tokens = handover.tokens();
            if handover.attempt.load(Ordering::SeqCst) != attempt
                || tokens.iter().any(|(from, _)| *from == node)
            {
                return;
            }
            tokens.push((node, token));
            // The waiter looks at the first announcement (the others should follow within
            // a node timeout) and at those from a quorum on, not at each one below it: each
            // wake-up is a thread switch on a contended lock's hand-over path.
            let wake = tokens.len() == 1 || tokens.len() >= self.quorum;
            drop(tokens);
            if wake {
                handover.arrived.notify_one();
            }
        }
    }

    /// Wakes every registered waiter: announcements may have been lost.
    fn wake_all(&self) {
        for handover in self.expecting().values() {
            handover.arrived.notify_one();
        }
    }
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("expecting", &self.expecting().len())
            .finish_non_exhaustive()
    }
}

/// Where a queued waiter learns that the lock was handed over to it.
pub(crate) struct Handover {
    arrived: Notify,
    /// The servers that announced the grant, with its fencing token on each.
    tokens: StdMutex<Vec<(usize, u64)>>,
    /// When the waiter registered, in µs of the wall clock: its turn in Redlock's queues,
    /// the same on every node.
    turn: u64,
    /// How many attempts the waiter made: each queues it under its digest and this number,
    /// which the hand-over's announcement repeats.
    attempt: AtomicU64,
    /// The waiter's last attempt reached too few nodes for a majority: until one does, its
    /// attempts do not queue (see Redlock's `attempt.rs`).
    cut_off: AtomicBool,
}

impl Default for Handover {
    fn default() -> Self {
        let turn = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
            });
        Handover {
            arrived: Notify::new(),
            tokens: StdMutex::default(),
            turn,
            attempt: AtomicU64::new(0),
            cut_off: AtomicBool::new(false),
        }
    }
}

impl Handover {
    /// The waiter's turn in the queues of Redlock's nodes.
    pub(crate) fn turn(&self) -> u64 {
        self.turn
    }

    /// Whether the waiter's last attempt reached too few nodes for a majority.
    pub(crate) fn is_cut_off(&self) -> bool {
        self.cut_off.load(Ordering::SeqCst)
    }

    /// Records whether the waiter's last attempt reached too few nodes for a majority.
    pub(crate) fn set_cut_off(&self, cut_off: bool) {
        self.cut_off.store(cut_off, Ordering::SeqCst);
    }

    /// Starts a new attempt, and returns the name it queues under, `digest/attempt`: only a
    /// hand-over announced under that name counts from now on. One announced under an
    /// earlier attempt's name may predate this attempt, and be gone by now (the waiter
    /// paused past the grant's life, say): had it not, this attempt finds the lock its own.
    /// What was announced before no longer counts either.
    pub(crate) fn attempting(&self, digest: &str) -> String {
        // Under the tokens' lock, as the announcements are checked and recorded.
        let mut tokens = self.tokens();
        let attempt = self.attempt.fetch_add(1, Ordering::SeqCst) + 1;
        tokens.clear();
        format!("{digest}/{attempt}")
    }

    /// Waits until a server announces the grant, or a disconnection of a pub/sub connection
    /// may have lost an announcement (then [`Handover::tokens`] may have nothing new: look at
    /// the lock).
    pub(crate) async fn arrived(&self) {
        self.arrived.notified().await;
    }

    /// The servers that announced the grant to the current attempt (their index), with its
    /// token on each.
    pub(crate) fn tokens(&self) -> std::sync::MutexGuard<'_, Vec<(usize, u64)>> {
        self.tokens.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct Channel {
    releases: Arc<Notify>,
    /// Election observers: every one is woken by a release or a proclamation.
    observers: Arc<Notify>,
    /// The [`Inner::sequence`] value of the channel's last change.
    changed_at: u64,
    waiters: usize,
    /// Since when the channel has had no waiter, and whether a task is waiting to
    /// unsubscribe it [`LINGER`] after that (one per channel, however often it goes idle).
    idle_since: Instant,
    lingering: bool,
    /// The server confirmed the subscription, on the pub/sub connection that is up now
    /// (false again from a disconnection until the subscription is renewed).
    confirmed: bool,
}

/// One waiter's interest in a channel; dropping it may unsubscribe (after [`LINGER`]).
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
                recovering: std::sync::atomic::AtomicBool::new(false),
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
            PubSub::Classic => self.inner.inbox.name.clone(),
            PubSub::Sharded => format!("{}:{}", self.inner.inbox.name, Keys::of(key).lock),
        }
    }

    /// Hands a wake-up to another waiter of `channel`: called when an acquisition ends
    /// without the lock, since it may have been the waiter a release woke.
    pub(crate) fn pass_on(&self, channel: &str) {
        if let Some(entry) = self.inner.channels().get(channel) {
            entry.releases.notify_one();
        }
    }

    /// A marker of what this notifier has seen on `channel`, if the channel is subscribed
    /// now: taken before an attempt, it lets [`Notifier::subscribe`] tell whether a release
    /// (or anything that may have hidden one) came in after the attempt.
    pub(crate) fn marker(&self, channel: &str) -> Option<u64> {
        let channels = self.inner.channels();
        let entry = channels.get(channel).filter(|entry| entry.confirmed)?;
        Some(
            entry
                .changed_at
                .max(self.inner.sequence.load(Ordering::SeqCst)),
        )
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
        if let Some(subscription) = self.inner.join(channel, marker) {
            return Ok(subscription);
        }
        let _changes = self.inner.changes.lock().await;
        if let Some(subscription) = self.inner.join(channel, marker) {
            return Ok(subscription);
        }
        // The channel is registered before SUBSCRIBE is sent: a release published right after
        // the confirmation must find it when its push is dispatched. A channel that lost its
        // subscription with a disconnection keeps its entry (its waiters hold its `releases`)
        // and is subscribed again.
        let (releases, observers) = {
            let mut channels = self.inner.channels();
            let changed_at = self.inner.next();
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
            inner: self.inner.clone(),
            channel: channel.to_owned(),
            releases,
            observers,
            changed_since: true,
            joined: true,
        };
        match self.inner.send_subscribe(channel).await {
            Ok(()) => Ok(subscription),
            Err(e) => {
                let mut channels = self.inner.channels();
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
}

impl Inner {
    /// Wakes the election observers of `channel`.
    fn proclaimed(&self, channel: &str) {
        if let Some(entry) = self.channels().get(channel) {
            entry.observers.notify_waiters();
        }
    }

    /// Subscribes on lockkit's runtime, where the pub/sub connection's driver lives.
    async fn send_subscribe(self: &Arc<Self>, channel: &str) -> Result<()> {
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

    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next value of the sequence.
    fn next(&self) -> u64 {
        self.sequence.fetch_add(1, Ordering::SeqCst) + 1
    }

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

    /// The pub/sub connection, opened on first use with a task that dispatches its pushes.
    fn connection(self: &Arc<Self>) -> Result<ConnectionManager> {
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

    /// Whether anyone listens: a channel with waiters, or a queued waiter expecting a
    /// hand-over on the inbox.
    fn listened_to(&self) -> bool {
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

    /// Drops the pub/sub connection and starts over as after a disconnection (every waiter
    /// retries, and finds where its lock is now), on a new connection. Called when the
    /// server ended a sharded subscription we did not end (its slot moved to another node),
    /// or a reply was out of step (see [`Inner::sharded`]).
    fn start_over(self: &Arc<Self>) {
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

    /// Whether `channel` is one of this notifier's inbox channels.
    fn is_inbox(&self, channel: &str) -> bool {
        channel
            .strip_prefix(self.inbox.name.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(':'))
    }

    /// Whether the server ended the subscription to `channel` unasked: we still take it for
    /// subscribed (an unsubscribe of ours unconfirms the channel first).
    fn unasked_unsubscribe(&self, channel: &str) -> bool {
        self.channels()
            .get(channel)
            .is_some_and(|entry| entry.confirmed)
    }

    fn leave(self: &Arc<Self>, channel: &str) {
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
    fn disconnected(self: &Arc<Self>) {
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
    fn confirmed(&self, channel: &str) {
        let mut channels = self.channels();
        if let Some(entry) = channels.get_mut(channel)
            && !entry.confirmed
        {
            entry.confirmed = true;
            entry.changed_at = self.next();
        }
    }

    /// The channels that have waiters but no confirmed subscription.
    fn unconfirmed(&self) -> Vec<String> {
        self.channels()
            .iter()
            .filter(|(_, entry)| !entry.confirmed && entry.waiters > 0)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Wakes one waiter of `channel` after a release, or every waiter of every channel and
    /// every queued waiter (after a disconnection, when messages may have been missed); and
    /// every election observer of them.
    fn wake(&self, channel: Option<&str>) {
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
    inner: std::sync::Weak<Inner>,
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
async fn recover(inner: std::sync::Weak<Inner>) {
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
async fn probe(inner: std::sync::Weak<Inner>, generation: u64) {
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

impl Inner {
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

    /// A waiter paused past the life of a grant handed to it (SIGSTOP in the fault campaign)
    /// reads that grant's announcement only after it has attempted again and queued behind
    /// the next holder: the late announcement must not count for the new attempt.
    #[test]
    fn an_announcement_counts_only_for_the_attempt_it_names() {
        let inbox = Inbox::new(1);
        let handover = inbox.expect("d");
        let first = handover.attempting("d");
        assert_eq!(first, "d/1");
        inbox.announced(0, format!("{first}:5").as_bytes());
        assert_eq!(handover.tokens().as_slice(), &[(0, 5)]);

        let second = handover.attempting("d");
        assert!(
            handover.tokens().is_empty(),
            "an earlier attempt's grant is gone"
        );
        inbox.announced(0, format!("{first}:7").as_bytes());
        assert!(
            handover.tokens().is_empty(),
            "a late announcement was taken"
        );
        inbox.announced(0, format!("{second}:9").as_bytes());
        assert_eq!(handover.tokens().as_slice(), &[(0, 9)]);

        inbox.announced(0, b"not an announcement");
        inbox.forget("d");
        inbox.announced(1, format!("{second}:11").as_bytes());
        assert_eq!(
            handover.tokens().as_slice(),
            &[(0, 9)],
            "a forgotten waiter"
        );
    }
}
