//! The backend-agnostic mutex: waiting, backoff, reentrancy and cancel safety live here once.

use std::fmt;
use std::time::{Duration, Instant};

use tracing::Instrument as _;

use crate::backend::{AcquireRequest, Attempt, Contention, Grant, Hold, Renewal, SharedBackend};
use crate::background::Background;
use crate::backoff::{Backoff, jitter};
use crate::capabilities::WaitStrategy;
use crate::client::LockClient;
use crate::error::{Error, ErrorKind, Result};
use crate::guard::MutexGuard;
use crate::key::LockKey;
use crate::lease::{Lease, clock_drift, validity_deadline};
use crate::metrics;
use crate::options::LockOptions;
use crate::owner::LockOwner;
use crate::renewal::{HeldLease, Scheduler};
use crate::token::OwnerToken;

/// A distributed mutex on one key. Cheap to create; holds no server state until locked.
///
/// Without an owner ([`Mutex::reentrant`]) every acquisition is independent: two tasks of the
/// same process exclude each other exactly as two processes do.
///
/// Its options are checked when it is built ([`LockClient::mutex`](crate::LockClient::mutex),
/// [`Mutex::with_ttl`], [`Mutex::with_options`]), so `lock()` never fails on them.
///
/// # Cancel safety
/// `lock`, `lock_timeout` and `try_lock` are cancel-safe: dropping their future (a
/// `select!`, a timeout) removes whatever the attempt left on the server, in the background,
/// including a grant whose reply had not arrived yet.
#[derive(Clone)]
pub struct Mutex {
    client: LockClient,
    key: LockKey,
    owner: Option<LockOwner>,
    options: LockOptions,
}

/// How long an acquisition waits on contention.
#[derive(Clone, Copy)]
pub(crate) enum Wait {
    /// Not at all (`try_lock`).
    No,
    /// Until the deadline, or forever without one.
    Until(Option<Instant>),
}

impl Wait {
    /// Waits for at most `timeout` (forever when that is past what an [`Instant`] holds).
    pub(crate) fn at_most(timeout: Duration) -> Self {
        Wait::Until(deadline_after(timeout))
    }

    /// Waits for as long as `options.wait_timeout` allows.
    pub(crate) fn per(options: &LockOptions) -> Self {
        Wait::Until(options.wait_timeout.and_then(deadline_after))
    }
}

impl Mutex {
    pub(crate) fn new(client: LockClient, key: LockKey) -> Self {
        let options = client.options().clone();
        Mutex {
            client,
            key,
            owner: None,
            options,
        }
    }

    /// The key this mutex locks.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    pub(crate) fn client(&self) -> &LockClient {
        &self.client
    }

    /// Takes this mutex's locks for `owner`, reentrantly: while a guard taken for `owner`
    /// holds the lock (through this client or its clones), another acquisition for the same
    /// owner succeeds at once with the same grant (same fencing token), and the lock is
    /// released on the server when the last of those guards is released.
    ///
    /// Only code handed `owner` can re-enter: a [`LockOwner`] cannot be made from a name, so
    /// unrelated tasks never share one by accident. Acquisitions for one owner are serialised
    /// locally (a second one waits while the first is in flight), and reentrancy is local to
    /// the client: another process is always a different contender.
    #[must_use]
    pub fn reentrant(mut self, owner: &LockOwner) -> Self {
        self.owner = Some(owner.clone());
        self
    }

    /// Takes the lock, waiting for as long as the options' `wait_timeout` allows (forever by
    /// default).
    ///
    /// # Errors
    /// [`ErrorKind::Timeout`] when `wait_timeout` passes; backend errors that are not
    /// retryable, or retryable ones that keep coming for longer than the options'
    /// `error_budget`.
    pub async fn lock(&self) -> Result<MutexGuard> {
        self.acquire_guard(Wait::per(&self.options)).await
    }

    /// Takes the lock, waiting at most `timeout` (a timeout too large to be a deadline, such
    /// as `Duration::MAX`, waits for as long as it takes).
    ///
    /// # Errors
    /// [`ErrorKind::Timeout`] when `timeout` passes; backend errors as for [`Mutex::lock`].
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        self.acquire_guard(Wait::at_most(timeout)).await
    }

    /// Takes the lock if it is free, without waiting. Contention is `Ok(None)`, not an error.
    ///
    /// # Errors
    /// Backend errors.
    pub async fn try_lock(&self) -> Result<Option<MutexGuard>> {
        self.acquire(Wait::No).await
    }

    async fn acquire_guard(&self, wait: Wait) -> Result<MutexGuard> {
        match self.acquire(wait).await? {
            Some(guard) => Ok(guard),
            None => Err(self.timeout_error()),
        }
    }

    fn timeout_error(&self) -> Error {
        timeout_error(&self.client, &self.key)
    }

    async fn acquire(&self, wait: Wait) -> Result<Option<MutexGuard>> {
        let Some(owner) = &self.owner else {
            return self.acquire_fresh(wait).await;
        };
        let slot = self.client.reentrant_slot(&self.key, owner);
        let mut current = match wait {
            Wait::No => match slot.try_lock() {
                Ok(current) => current,
                Err(_) => return Ok(None),
            },
            Wait::Until(None) => slot.lock().await,
            Wait::Until(Some(deadline)) => tokio::time::timeout_at(deadline.into(), slot.lock())
                .await
                .map_err(|_| self.timeout_error())?,
        };
        if let Some(held) = current.upgrade()
            && held.try_share()
        {
            return Ok(Some(MutexGuard::new(held)));
        }
        let guard = self.acquire_fresh(wait).await?;
        if let Some(guard) = &guard {
            *current = guard.downgrade();
        }
        Ok(guard)
    }

    async fn acquire_fresh(&self, wait: Wait) -> Result<Option<MutexGuard>> {
        acquire(
            &self.client,
            &self.key,
            &self.options,
            Hold::Exclusive,
            wait,
        )
        .await
    }
}

/// The error of an acquisition of `key` whose wait ran out.
pub(crate) fn timeout_error(client: &LockClient, key: &LockKey) -> Error {
    Error::new(
        ErrorKind::Timeout,
        client.backend().name(),
        format!("lock {key} was not acquired in time"),
    )
}

/// One fresh acquisition of `hold` on `key`, with its own owner token: the attempt loop
/// that every primitive's acquisition runs. `Ok(None)` on contention without waiting, or
/// when the wait ran out.
pub(crate) async fn acquire(
    client: &LockClient,
    key: &LockKey,
    options: &LockOptions,
    hold: Hold,
    wait: Wait,
) -> Result<Option<MutexGuard>> {
    let backend = client.backend().clone();
    let ttl = options.ttl.max(backend.capabilities().min_ttl);
    let request = AcquireRequest::new(
        key.clone(),
        OwnerToken::generate()?,
        ttl,
        !matches!(wait, Wait::No),
    )
    .with_hold(hold);
    let span = tracing::info_span!("lockkit.acquire", key = %key, backend = backend.name());
    let run = Acquisition {
        options,
        pending: PendingAcquire {
            backend,
            background: client.background().clone(),
            request,
            armed: true,
        },
        wait,
        started: Instant::now(),
        waited: Duration::ZERO,
        backoff: Backoff::new(options.backoff_min, options.backoff_max),
        failing_since: None,
        last_error: None,
    };
    run.run().instrument(span).await
}

/// The least validity a grant is handed out with: a tenth of the validity `promised` (the
/// TTL, or less where the backend trusts a grant for less: ZooKeeper, for part of its session
/// timeout), counted from the attempt's send time.
///
/// A grant that arrives with less (its attempt waited behind a failover, or the process was
/// descheduled) is confirmed by a renewal first, and given back if the renewal cannot do
/// better. Handing it out as it came would give the caller a guard whose lost signal fires
/// before the caller's first step under it: a lock it never really had (once seen with 0.3 ms
/// left, granted right after an etcd leader's crash). With a tenth, the renewal scheduler
/// (due after a third of a grant's validity) still has most of that tenth for a renewal.
pub(crate) fn validity_floor(promised: Duration) -> Duration {
    promised / 10
}

/// One acquisition in progress: the attempt loop and its bookkeeping.
struct Acquisition<'a> {
    options: &'a LockOptions,
    pending: PendingAcquire,
    wait: Wait,
    started: Instant,
    waited: Duration,
    backoff: Backoff,
    /// When the current streak of retryable errors began; `None` after any other answer.
    failing_since: Option<Instant>,
    /// The last error of that streak: when the wait deadline cuts it short, the caller
    /// learns why the lock was not had (a missing quorum, say), not only that time ran out.
    last_error: Option<Error>,
}

impl Acquisition<'_> {
    async fn run(mut self) -> Result<Option<MutexGuard>> {
        let backend = self.pending.backend.clone();
        loop {
            let sent_at = Instant::now();
            // The wait deadline bounds the attempt in progress too, not only the waits: a
            // backend's own timeouts (a failover, a reconnect) can be far longer.
            let attempt = backend.try_acquire(&self.pending.request);
            let outcome = match self.deadline() {
                Some(deadline) => match tokio::time::timeout_at(deadline.into(), attempt).await {
                    Ok(outcome) => outcome,
                    Err(_) => return self.time_is_up().await,
                },
                None => attempt.await,
            };
            match outcome {
                Ok(Attempt::Granted(grant)) => {
                    if let Some(guard) = self.accept(grant.clone(), sent_at) {
                        return Ok(Some(guard));
                    }
                    if let Some(guard) = self.confirm(grant).await {
                        return Ok(Some(guard));
                    }
                    // Too late to be of use: give the grant back before trying again.
                    self.pending.abandon().await;
                    self.pending.armed = true;
                    let late = Error::new(
                        ErrorKind::Unavailable,
                        backend.name(),
                        "the grant arrived with no validity left: the backend answers slower than the TTL allows",
                    );
                    self.absorb(late).await?;
                }
                Ok(Attempt::Contended(contention)) => {
                    metrics::contended(backend.as_ref());
                    self.failing_since = None;
                    self.last_error = None;
                    if matches!(self.wait, Wait::No) {
                        // A try makes this one attempt (an error ends it, with a clean-up): an
                        // answer that says it left nothing needs no clean-up round trip.
                        if contention.nothing_left {
                            self.pending.armed = false;
                            self.record("contended");
                        } else {
                            self.give_up("contended").await;
                        }
                        return Ok(None);
                    }
                    if self.remaining() == Some(Duration::ZERO) {
                        self.give_up("timeout").await;
                        return Ok(None);
                    }
                    match self.wait_for_change(&contention).await {
                        // Handed over by the server after the attempt that queued us was
                        // sent: valid from then, as if that attempt had been granted.
                        Ok(Some(grant)) => {
                            if let Some(guard) = self.accept(grant, sent_at) {
                                return Ok(Some(guard));
                            }
                        }
                        Ok(None) => {}
                        Err(e) => self.absorb(e).await?,
                    }
                }
                Err(e) => self.absorb(e).await?,
            }
        }
    }

    /// The wait deadline, if there is one.
    fn deadline(&self) -> Option<Instant> {
        match self.wait {
            Wait::Until(deadline) => deadline,
            Wait::No => None,
        }
    }

    /// Time left before the wait deadline; `None` when there is none.
    fn remaining(&self) -> Option<Duration> {
        self.deadline()
            .map(|deadline| deadline.saturating_duration_since(Instant::now()))
    }

    /// Turns a grant into a guard, unless less than [`validity_floor`] of it is left.
    fn accept(&mut self, grant: Grant, sent_at: Instant) -> Option<MutexGuard> {
        let request = &self.pending.request;
        let drift = clock_drift(request.ttl, self.options.clock_drift_factor);
        let floor = validity_floor(request.ttl.min(grant.valid_for));
        let valid_until = validity_deadline(sent_at, grant.valid_for, drift)
            .filter(|deadline| deadline.saturating_duration_since(Instant::now()) >= floor)?;
        let mut lease = Lease::new(
            request.key.clone(),
            request.owner.clone(),
            grant.fencing_token,
            request.ttl,
            sent_at,
        )
        .with_hold(request.hold);
        if let Some(handle) = grant.handle {
            lease = lease.with_handle(handle);
        }
        if let Some(session) = grant.session {
            lease = lease.with_session(session);
        }
        let backend = self.pending.backend.clone();
        let held = HeldLease::new(
            lease,
            backend,
            self.pending.background.clone(),
            valid_until,
            drift,
            self.options.auto_renew,
        );
        Scheduler::global().register(held.clone());
        self.pending.armed = false;
        metrics::acquired(
            self.pending.backend.as_ref(),
            "granted",
            self.started.elapsed(),
            self.waited,
        );
        tracing::debug!(fencing_token = %grant.fencing_token, "acquired");
        Some(MutexGuard::new(held))
    }

    /// A grant whose validity, counted from its attempt's send time, was (nearly) gone when it
    /// arrived (a backend queueing requests under load, a wait that ended as a server came
    /// back) is still ours on the server: a renewal sent
    /// now gets a validity counted from now. Giving it back instead would send a queueing
    /// waiter to the end of the queue, and under the same load every grantee after it too.
    async fn confirm(&mut self, grant: Grant) -> Option<MutexGuard> {
        let request = &self.pending.request;
        let mut lease = Lease::new(
            request.key.clone(),
            request.owner.clone(),
            grant.fencing_token,
            request.ttl,
            Instant::now(),
        )
        .with_hold(request.hold);
        if let Some(handle) = &grant.handle {
            lease = lease.with_handle(handle.clone());
        }
        if let Some(session) = &grant.session {
            lease = lease.with_session(session.clone());
        }
        let sent_at = Instant::now();
        // Bounded by the TTL too: past it, the grant is gone anyway.
        let bound = deadline_after(request.ttl)
            .into_iter()
            .chain(self.deadline())
            .min();
        let renewing = self.pending.backend.renew(&lease);
        let answer = match bound {
            Some(bound) => tokio::time::timeout_at(bound.into(), renewing).await.ok()?,
            None => renewing.await,
        };
        match answer {
            Ok(Renewal::Extended(valid_for)) => {
                let mut confirmed = grant;
                confirmed.valid_for = valid_for;
                self.accept(confirmed, sent_at)
            }
            _ => None,
        }
    }

    /// Waits until the lock may be free, by the backend's notification or by polling; with
    /// the grant, when the backend handed the lock over during the wait.
    async fn wait_for_change(&mut self, contention: &Contention) -> Result<Option<Grant>> {
        let backend = self.pending.backend.clone();
        let strategy = backend.capabilities().wait;
        let holder_gone_by = contention
            .retry_after
            .map(|d| d + jitter(Duration::from_millis(1), self.options.backoff_min));
        let pause = match strategy {
            WaitStrategy::Poll => {
                let delay = self.backoff.next_delay();
                holder_gone_by.map_or(delay, |gone| delay.min(gone))
            }
            // Notifications wake us; the cap only covers a missed notification (a pub/sub
            // reconnect, say), so one missed message costs at most `backoff_max`.
            WaitStrategy::Notify => holder_gone_by.map_or(self.options.backoff_max, |gone| {
                gone.min(self.options.backoff_max)
            }),
            // A queue waiter's watch on its predecessor is tied to its session and connection:
            // the backend ends the wait itself when the predecessor goes or the watch, the
            // connection or the session breaks (the `WaitStrategy::Queue` contract), so there
            // is no message to miss and no timer: only the wait deadline (below) bounds it. A
            // periodic re-check costs an attempt and a new watch per waiter each period:
            // with 1,000 waiters once per (10 s) TTL, that was 169 RPCs/s to an etcd server
            // and 386 packets/s to a ZooKeeper server while nothing changed, against 0.4 and
            // 2.6 without it, whatever the number of waiters (examples/waiters.rs,
            // docs/measurements.md); every `backoff_max`, it starved a cluster.
            _ => holder_gone_by.unwrap_or(Duration::MAX),
        };
        let pause = self.remaining().map_or(pause, |left| pause.min(left));
        let wait_started = Instant::now();
        let request = &self.pending.request;
        let waiting = async {
            match strategy {
                // Polling is the core's backoff alone: the backend is not asked to wait.
                WaitStrategy::Poll => {
                    tokio::time::sleep(pause).await;
                    Ok(None)
                }
                _ => backend.wait_for_change(request, contention, pause).await,
            }
        }
        .instrument(tracing::debug_span!(
            "lockkit.wait",
            max_ms = pause.as_millis() as u64
        ));
        let outcome = match self.deadline() {
            Some(deadline) => tokio::time::timeout_at(deadline.into(), waiting)
                .await
                .unwrap_or(Ok(None)),
            None => waiting.await,
        };
        self.waited += wait_started.elapsed();
        outcome
    }

    /// Retries after a retryable error (while the streak of errors is younger than
    /// `error_budget`, within the wait deadline), or gives up with it.
    async fn absorb(&mut self, error: Error) -> Result<()> {
        let failing_since = *self.failing_since.get_or_insert_with(Instant::now);
        let give_up = matches!(self.wait, Wait::No)
            || !error.is_retryable()
            || failing_since.elapsed() >= self.options.error_budget
            || self.remaining() == Some(Duration::ZERO);
        if give_up {
            self.give_up("error").await;
            return Err(error);
        }
        tracing::debug!(error = %error.display_chain(), failing_for_ms = failing_since.elapsed().as_millis() as u64, "retryable error while acquiring; retrying");
        self.last_error = Some(error);
        let delay = self.backoff.next_delay();
        tokio::time::sleep(self.remaining().map_or(delay, |left| delay.min(left))).await;
        Ok(())
    }

    /// Ends an acquisition whose wait deadline passed during an attempt: with the error that
    /// kept failing it, if it was in a streak of errors, else as a timeout (`Ok(None)`).
    async fn time_is_up(&mut self) -> Result<Option<MutexGuard>> {
        match self.last_error.take() {
            Some(error) => {
                self.give_up("error").await;
                Err(error)
            }
            None => {
                self.give_up("timeout").await;
                Ok(None)
            }
        }
    }

    /// Removes what the attempts left on the server and records the outcome.
    async fn give_up(&mut self, outcome: &'static str) {
        self.pending.abandon().await;
        self.record(outcome);
    }

    /// Records how the acquisition ended.
    fn record(&self, outcome: &'static str) {
        metrics::acquired(
            self.pending.backend.as_ref(),
            outcome,
            self.started.elapsed(),
            self.waited,
        );
    }
}

/// The instant `timeout` from now, or `None` (no deadline) when that is past what an
/// [`Instant`] can represent.
fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

crate::held::option_methods!(Mutex, "mutex");

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("ttl", &self.options.ttl)
            .finish_non_exhaustive()
    }
}

/// An acquisition in progress. If it is dropped while armed (the acquire future was
/// cancelled), whatever the request left on the server is removed in the background.
struct PendingAcquire {
    backend: SharedBackend,
    background: Background,
    request: AcquireRequest,
    armed: bool,
}

impl PendingAcquire {
    /// Removes what the request left on the server, now, and disarms.
    async fn abandon(&mut self) {
        let outcome = self.backend.abandon(&self.request).await;
        // Disarmed only now: if this future is dropped mid-way, `Drop` cleans up instead.
        self.armed = false;
        if let Err(e) = outcome {
            tracing::warn!(key = %self.request.key, error = %e.display_chain(), "could not clean up after an acquisition; leftovers expire with their TTL");
        }
    }
}

impl Drop for PendingAcquire {
    fn drop(&mut self) {
        if self.armed {
            metrics::cancelled(self.backend.as_ref());
            let backend = self.backend.clone();
            let request = self.request.clone();
            self.background.spawn(async move {
                if let Err(e) = backend.abandon(&request).await {
                    tracing::warn!(key = %request.key, error = %e.display_chain(), "could not clean up after a cancelled acquisition; leftovers expire with their TTL");
                }
            });
        }
    }
}
