//! Leader election, built on the mutex: the leader is the holder of the election's lock, its
//! term is the grant's fencing token, and its value is proclaimed beside the grant.
//!
//! Everything a lock has, a leadership has: renewal by the shared scheduler, the lost signal,
//! background release, cancel safety. What the backend adds is only what cannot be built
//! from a lock: storing a value with the grant ([`LockBackend::proclaim`]), reading the
//! holder and its value at one moment ([`LockBackend::leader`]) and waiting for either to
//! change ([`LockBackend::wait_for_leader_change`]).
//!
//! [`LockBackend::proclaim`]: crate::backend::LockBackend::proclaim
//! [`LockBackend::leader`]: crate::backend::LockBackend::leader
//! [`LockBackend::wait_for_leader_change`]: crate::backend::LockBackend::wait_for_leader_change

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::Stream;

use crate::acquire::Wait;
use crate::backend::SharedBackend;
use crate::backoff::Backoff;
use crate::capabilities::FencingGuarantee;
use crate::capabilities::Support;
use crate::error::{Error, ErrorKind, Result};
use crate::guard::{LostSignal, MutexGuard};
use crate::key::LockKey;
use crate::mutex::Mutex;
use crate::options::LockOptions;
use crate::token::FencingToken;

/// The longest value a leader may proclaim, in bytes: a leader's address or identity, not a
/// payload (ZooKeeper and etcd refuse large requests, and every observer reads the value).
pub const MAX_VALUE_LEN: usize = 16 * 1024;

/// How long [`Election::run_as_leader`] waits after losing the leadership before it
/// campaigns again, unless [`Election::with_retry_pause`] says otherwise.
pub const DEFAULT_RETRY_PAUSE: Duration = Duration::from_secs(1);

/// Who leads an election: the term of its leadership and the value it proclaimed.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Leader {
    /// The term: the fencing token of the leader's grant. Terms of successive leaders
    /// strictly increase, with the strength of the backend's
    /// [`Capabilities::fencing`](crate::Capabilities::fencing): pass it with every write the
    /// leader makes, and let the resource refuse writes of an older term.
    pub term: FencingToken,
    /// What the leader proclaimed. `None` only between a new leader's grant and its first
    /// proclamation (one round trip), or for a holder of the lock that is not a candidate (a
    /// plain mutex on the same name).
    pub value: Option<String>,
}

impl Leader {
    /// A leader of `term` that proclaimed `value`.
    pub fn new(term: FencingToken, value: Option<String>) -> Self {
        Leader { term, value }
    }
}

impl fmt::Display for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(value) => write!(f, "term {} ({value:?})", self.term),
            None => write!(f, "term {} (no value yet)", self.term),
        }
    }
}

/// An election: candidates [`campaign`](Election::campaign), one of them leads at a time, and
/// anyone can ask who leads ([`leader`](Election::leader)) or follow the changes
/// ([`observe`](Election::observe)).
///
/// An election named `N` is the lock `N` of its client's namespace, so `lockkit list` and
/// `force_release` see it, and a plain mutex on `N` excludes its candidates. Leadership is as
/// strong as the backend's tier: on the consensus tiers a leader is linearizably alone until
/// its lease ends; on the Redis tiers, as alone as a lock holder is. Elections need a backend
/// whose [`Capabilities::election`](crate::Capabilities::election) is supported (not Redlock:
/// see its crate docs).
///
/// ```
/// use lockkit_core::{LockClient, MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockkit_core::Result<()> {
/// let locks = LockClient::new(MemoryBackend::new());
/// let election = locks.election("scheduler")?;
/// let leadership = election.campaign("node-a:8080").await?;
/// let leader = election.leader().await?.expect("someone leads");
/// assert_eq!(leader.term, leadership.term());
/// assert_eq!(leader.value.as_deref(), Some("node-a:8080"));
/// leadership.resign().await?;
/// assert!(election.leader().await?.is_none());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Election {
    mutex: Mutex,
    retry_pause: Duration,
}

impl Election {
    pub(crate) fn new(mutex: Mutex) -> Result<Self> {
        let backend = mutex.client().backend();
        if let Support::Unsupported(why) = backend.capabilities().election {
            return Err(Error::new(
                ErrorKind::Unsupported,
                backend.name(),
                format!("elections are not supported: {why}"),
            ));
        }
        Ok(Election {
            mutex,
            retry_pause: DEFAULT_RETRY_PAUSE,
        })
    }

    /// The key of the election's lock.
    pub fn key(&self) -> &LockKey {
        self.mutex.key()
    }

    /// Uses a different TTL for this election's leaderships: how long a crashed leader keeps
    /// the others waiting.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] for a TTL outside what [`LockOptions::validate`] accepts.
    pub fn with_ttl(mut self, ttl: Duration) -> Result<Self> {
        self.mutex = self.mutex.with_ttl(ttl)?;
        Ok(self)
    }

    /// Uses different options for this election (TTL, wait timeout of
    /// [`campaign`](Election::campaign), backoff, renewal).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] saying which option is wrong.
    pub fn with_options(mut self, options: LockOptions) -> Result<Self> {
        self.mutex = self.mutex.with_options(options)?;
        Ok(self)
    }

    /// Sets how long [`run_as_leader`](Election::run_as_leader) waits after losing the
    /// leadership before it campaigns again ([`DEFAULT_RETRY_PAUSE`] by default): a leader
    /// that lost its lease to a pause or a partition steps back long enough for a healthier
    /// candidate to take over.
    #[must_use]
    pub fn with_retry_pause(mut self, pause: Duration) -> Self {
        self.retry_pause = pause;
        self
    }

    /// The options this election's campaigns use.
    pub fn options(&self) -> &LockOptions {
        self.mutex.options()
    }

    fn backend(&self) -> &SharedBackend {
        self.mutex.client().backend()
    }

    /// Waits to become the leader (for as long as the options' `wait_timeout` allows, forever
    /// by default) and proclaims `value`. Candidates are served as the backend serves lock
    /// waiters: in arrival order on etcd and ZooKeeper.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] for a value over [`MAX_VALUE_LEN`];
    /// [`ErrorKind::Timeout`] when `wait_timeout` passes; backend errors as for
    /// [`Mutex::lock`], and those of the proclamation (the lock is then released).
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped campaign leaves no candidate and no leadership behind.
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership> {
        let value = checked(value.into())?;
        let deadline = self
            .options()
            .wait_timeout
            .and_then(|timeout| Instant::now().checked_add(timeout));
        self.campaign_until(value, deadline).await
    }

    /// As [`campaign`](Election::campaign), waiting at most `timeout`.
    ///
    /// # Errors
    /// As [`campaign`](Election::campaign), with [`ErrorKind::Timeout`] when `timeout`
    /// passes.
    pub async fn campaign_timeout(
        &self,
        value: impl Into<String>,
        timeout: Duration,
    ) -> Result<Leadership> {
        let value = checked(value.into())?;
        self.campaign_until(value, Instant::now().checked_add(timeout))
            .await
    }

    /// Takes the lock and proclaims `value` until both succeed or `deadline` passes. A
    /// leadership that ends before it is proclaimed (or confirmed), or a retryable error of
    /// the proclamation (the grant is then given back), is campaigned for again after a
    /// backoff, as `lock()` retries one of its attempts: while the streak of such failures
    /// is younger than the options' `error_budget`.
    async fn campaign_until(&self, value: String, deadline: Option<Instant>) -> Result<Leadership> {
        let wait = Wait::Until(deadline);
        let options = self.options();
        let mut backoff = Backoff::new(options.backoff_min, options.backoff_max);
        let mut failing_since = None;
        loop {
            let guard = self.mutex.lock_timeout(left(deadline)).await?;
            let failure = match self.proclaim_first(guard, &value, wait).await {
                Ok(Some(leadership)) => return Ok(leadership),
                Ok(None) => Error::new(
                    ErrorKind::Unavailable,
                    self.backend().name(),
                    format!(
                        "each leadership of {} ended before its value was proclaimed with useful validity left",
                        self.key()
                    ),
                ),
                Err(e) if e.is_retryable() => e,
                Err(e) => return Err(e),
            };
            let failing_for = failing_since.get_or_insert_with(Instant::now).elapsed();
            if failing_for >= options.error_budget || left(deadline).is_zero() {
                return Err(failure);
            }
            tracing::debug!(key = %self.key(), error = %failure.display_chain(), "the leadership could not be proclaimed; campaigning again");
            tokio::time::sleep(backoff.next_delay().min(left(deadline))).await;
        }
    }

    /// Becomes the leader if nobody leads (and, on the queueing backends, no candidate waits
    /// ahead), without waiting. `Ok(None)` when someone else leads.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidConfig`] for a value over [`MAX_VALUE_LEN`]; backend errors.
    pub async fn try_campaign(&self, value: impl Into<String>) -> Result<Option<Leadership>> {
        let value = checked(value.into())?;
        match self.mutex.try_lock().await? {
            Some(guard) => self.proclaim_first(guard, &value, Wait::No).await,
            None => Ok(None),
        }
    }

    /// Proclaims the first value of a fresh grant. `None` when the grant was already gone, or
    /// when its validity ran down under the floor while the proclamation was on its way (a
    /// consensus cluster electing its own leader meanwhile) and a renewal could not restore
    /// it: a leadership is handed out with the floor its grant promised, as a guard is.
    async fn proclaim_first(
        &self,
        guard: MutexGuard,
        value: &str,
        wait: Wait,
    ) -> Result<Option<Leadership>> {
        // A failed or dropped proclamation drops the guard, which releases the grant in the
        // background (and the value with it, wherever it landed).
        if !self.backend().proclaim(guard.lease(), value).await? {
            guard.mark_lost("the leadership ended before its value was proclaimed");
            return Ok(None);
        }
        if !guard.vouch(wait.deadline()).await {
            return Ok(None);
        }
        Ok(Some(Leadership {
            guard,
            value: StdMutex::new(value.to_owned()),
        }))
    }

    /// Who leads now, if anyone: one read of the holder and its value.
    ///
    /// # Errors
    /// Backend failures.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        self.backend().leader(self.key()).await
    }

    /// The leader, then every change of it: a new leader, a new value, a vacancy (`None`).
    ///
    /// The first item is the state when the stream is first polled. A slow observer may miss
    /// intermediate states, but it always ends on the current one (after a change it reads
    /// the state afresh). Where terms only go up ([`FencingGuarantee::Monotonic`]) it never
    /// sees a term lower than one it has seen: such a read is stale and skipped. Where they
    /// can go back ([`FencingGuarantee::BestEffort`]: a Redis restart without persistence, a
    /// failover), a lower term is reported, as the new leader it is. Changes arrive by the
    /// backend's notifications; the options' `backoff_max` bounds how late a missed notification (a reconnect) or an expiry, which nobody
    /// announces, is seen. An error is an item, and the stream goes on after it (with a
    /// backoff); drop the stream to stop observing.
    pub fn observe(&self) -> LeaderChanges {
        let options = self.options();
        let watch = Watch {
            backend: self.backend().clone(),
            key: self.key().clone(),
            max_wait: options.backoff_max,
            backoff: Backoff::new(options.backoff_min, options.backoff_max),
            seen: None,
            highest: None,
            monotonic: self.backend().capabilities().fencing == FencingGuarantee::Monotonic,
            failed: false,
        };
        LeaderChanges {
            inner: Box::pin(futures_util::stream::unfold(
                watch,
                |mut watch| async move {
                    let item = watch.next().await;
                    Some((item, watch))
                },
            )),
        }
    }

    /// Campaigns with `value`, runs `work` while leading, and returns its output once it
    /// finishes (resigning then). If the leadership is lost first, `work` is cancelled (its
    /// future dropped), and after the retry pause ([`Election::with_retry_pause`]) the
    /// election is campaigned for again and `work` runs anew.
    ///
    /// `work` gets the leadership shared, so that it can read the term and proclaim; the
    /// resign happens when `work` has let go of it (a clone kept elsewhere keeps the
    /// leadership until it is dropped).
    ///
    /// ```
    /// use lockkit_core::{LockClient, MemoryBackend};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockkit_core::Result<()> {
    /// let locks = LockClient::new(MemoryBackend::new());
    /// let election = locks.election("compaction")?;
    /// let term = tokio::spawn(async move {
    ///     election
    ///         .run_as_leader("worker-1", |leadership| async move {
    ///             // ... compact, passing leadership.term() with every write ...
    ///             leadership.term()
    ///         })
    ///         .await
    /// })
    /// .await
    /// .expect("the task ran")?;
    /// println!("compacted in term {term}");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// Those of [`campaign`](Election::campaign): only errors it does not retry itself.
    pub async fn run_as_leader<F, Fut, T>(&self, value: impl Into<String>, mut work: F) -> Result<T>
    where
        F: FnMut(Arc<Leadership>) -> Fut,
        Fut: Future<Output = T>,
    {
        let value = checked(value.into())?;
        loop {
            let leadership = Arc::new(self.campaign(value.clone()).await?);
            let lost = leadership.lost();
            let term = leadership.term();
            let finished = tokio::select! {
                output = work(leadership.clone()) => Some(output),
                () = lost => None,
            };
            if let Some(output) = finished {
                if let Ok(leadership) = Arc::try_unwrap(leadership)
                    && let Err(e) = leadership.resign().await
                {
                    tracing::warn!(key = %self.key(), error = %e.display_chain(), "could not resign after the work finished; the leadership expires with its TTL");
                }
                return Ok(output);
            }
            tracing::warn!(key = %self.key(), %term, "leadership lost: the work was cancelled; campaigning again after the retry pause");
            drop(leadership);
            tokio::time::sleep(self.retry_pause).await;
        }
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("key", self.key())
            .field("ttl", &self.options().ttl)
            .field("retry_pause", &self.retry_pause)
            .finish_non_exhaustive()
    }
}

fn checked(value: String) -> Result<String> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::invalid_config(format!(
            "an election value may be at most {MAX_VALUE_LEN} bytes, not {}",
            value.len()
        )));
    }
    Ok(value)
}

/// The leadership of an election: the guard of its lock, with the term and the proclaimed
/// value. Renewed in the background while it lives; resigned (released) when dropped.
///
/// Watch [`lost`](Leadership::lost), and stop acting as the leader once it fires.
#[must_use = "the leadership is resigned as soon as it is dropped"]
pub struct Leadership {
    guard: MutexGuard,
    value: StdMutex<String>,
}

impl Leadership {
    /// The term: the fencing token of this leadership's grant. Pass it with every write the
    /// leader makes.
    pub fn term(&self) -> FencingToken {
        self.guard.fencing_token()
    }

    /// The value this leader proclaimed last.
    pub fn value(&self) -> String {
        self.value
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The key of the election's lock.
    pub fn key(&self) -> &LockKey {
        self.guard.key()
    }

    /// The guard of the election's lock (its validity, its TTL, [`MutexGuard::extend`]).
    pub fn guard(&self) -> &MutexGuard {
        &self.guard
    }

    /// Replaces the proclaimed value, while this is still the leadership.
    ///
    /// # Errors
    /// [`ErrorKind::Lost`] when the leadership has ended (the lost signal fires too);
    /// [`ErrorKind::InvalidConfig`] for a value over [`MAX_VALUE_LEN`]; backend failures
    /// (the new value may then be stored or not, and [`value`](Leadership::value) keeps the
    /// old one).
    ///
    /// # Cancel safety
    /// A dropped proclamation may or may not have reached the server.
    pub async fn proclaim(&self, value: impl Into<String>) -> Result<()> {
        let value = checked(value.into())?;
        let backend = self.guard.backend();
        if self.guard.is_lost() {
            return Err(self.lost_error(backend.name()));
        }
        if !backend.proclaim(self.guard.lease(), &value).await? {
            self.guard
                .mark_lost("the leadership was gone when a new value was proclaimed");
            return Err(self.lost_error(backend.name()));
        }
        *self.value.lock().unwrap_or_else(PoisonError::into_inner) = value;
        Ok(())
    }

    fn lost_error(&self, backend: &'static str) -> Error {
        Error::new(
            ErrorKind::Lost,
            backend,
            format!(
                "the leadership of {} in term {} is over",
                self.key(),
                self.term()
            ),
        )
    }

    /// Waits until the leadership is lost. The future owns what it needs.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.guard.lost()
    }

    /// A signal that fires when the leadership is lost.
    pub fn lost_signal(&self) -> LostSignal {
        self.guard.lost_signal()
    }

    /// Whether the leadership is known to be lost, or its validity has passed.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Steps down at once: releases the lock (the next candidate is woken as a lock waiter
    /// is) and says whether this was still the leadership.
    ///
    /// # Errors
    /// As [`MutexGuard::release`]: the leadership then ends with its TTL.
    pub async fn resign(self) -> Result<bool> {
        self.guard.release().await
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("key", self.key())
            .field("term", &self.term())
            .field("value", &self.value())
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// The stream of an election's leader changes, from [`Election::observe`]: each item is the
/// leader (or `None`, a vacancy) whenever it changed since the item before.
#[must_use = "a stream does nothing unless polled"]
pub struct LeaderChanges {
    inner: Pin<Box<dyn Stream<Item = Result<Option<Leader>>> + Send>>,
}

impl Stream for LeaderChanges {
    type Item = Result<Option<Leader>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl fmt::Debug for LeaderChanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeaderChanges")
    }
}

/// The state of an observation.
struct Watch {
    backend: SharedBackend,
    key: LockKey,
    max_wait: Duration,
    backoff: Backoff,
    /// The state last handed out; `None` before the first.
    seen: Option<Option<Leader>>,
    /// The highest term handed out: a read showing a lower one is stale.
    highest: Option<FencingToken>,
    /// Whether terms only go up on this backend. Where they may go back (the Redis tiers,
    /// after a restart without persistence or a failover), a lower term is a new leader,
    /// not a stale read: skipping it would hide every later leader.
    monotonic: bool,
    failed: bool,
}

impl Watch {
    async fn next(&mut self) -> Result<Option<Leader>> {
        loop {
            let mut woke_early = false;
            if self.failed {
                tokio::time::sleep(self.backoff.next_delay()).await;
            } else if let Some(seen) = &self.seen {
                let started = Instant::now();
                // A failed wait only costs a read: the state is read again either way.
                let waited = self
                    .backend
                    .wait_for_leader_change(&self.key, seen.as_ref(), self.max_wait)
                    .await;
                if let Err(e) = waited {
                    tracing::debug!(key = %self.key, error = %e.display_chain(), "waiting for a leader change failed; reading the leader");
                }
                woke_early = started.elapsed() < self.max_wait;
            }
            let now = match self.backend.leader(&self.key).await {
                Ok(now) => now,
                Err(e) => {
                    self.failed = true;
                    return Err(e);
                }
            };
            self.failed = false;
            let stale = self.monotonic
                && now
                    .as_ref()
                    .zip(self.highest)
                    .is_some_and(|(leader, highest)| leader.term < highest);
            if stale || self.seen.as_ref() == Some(&now) {
                // A wake-up that changed nothing (the contract allows them): a backend that
                // keeps waking at once must not make the observer spin.
                if woke_early {
                    tokio::time::sleep(self.backoff.next_delay()).await;
                }
                continue;
            }
            self.backoff.reset();
            if let Some(leader) = &now {
                self.highest = Some(leader.term);
            }
            self.seen = Some(now.clone());
            return Ok(now);
        }
    }
}

/// Time left before `deadline` (all the time there is without one).
fn left(deadline: Option<Instant>) -> Duration {
    deadline.map_or(Duration::MAX, |d| {
        d.saturating_duration_since(Instant::now())
    })
}
