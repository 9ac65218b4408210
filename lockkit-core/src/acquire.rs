//! The acquisition engine: the one attempt loop every primitive runs (a mutex, a permit, a
//! read or write lock, an election's lock, each part of `lock_all`), and the one door from a
//! backend's grant to a guard.
//!
//! # The attempt loop
//! An acquisition sends attempts ([`LockBackend::try_acquire`]) under one owner token until
//! one is granted, waiting between them by the backend's notification or watch, or by
//! polling with backoff ([`LockBackend::wait_for_change`]). Retryable errors are retried
//! for the options' `error_budget`; the wait deadline bounds the attempts as well as the
//! waits. What an acquisition that ends without a guard (a timeout, an error, a dropped
//! future) left on the server is removed ([`LockBackend::abandon`]), in the background if
//! its future was dropped.
//!
//! # The one door: [`issue`]
//! Every guard is handed out by [`issue`]: a fresh grant (on a first attempt, after a wait,
//! by a `try_`), a reentrant share of a held grant, and, through [`vouch`], each part of a
//! `lock_all` as the set is handed out and a leadership after its proclamation. It hands a
//! guard out only with at least the lease's floor of validity left: a tenth of what the
//! backend can promise a grant of the requested TTL
//! ([`validity_floor`](crate::backend::validity_floor) of
//! [`LockBackend::max_validity`]), counted from the attempt's send time minus clock drift.
//! Below the floor, a renewal sent now confirms the grant (its validity then counts from
//! that send); a fresh grant that is still short is given back and asked for again within
//! the wait deadline; a held one is not handed out again.
//!
//! Proof that a confirmed grant was never anyone else's in between: a renewal succeeds only
//! while the server still holds the grant under our owner token, which it does from the
//! grant on, or not at all (a grant, once gone, is never recreated for the same token).
//!
//! [`LockBackend::try_acquire`]: crate::backend::LockBackend::try_acquire
//! [`LockBackend::wait_for_change`]: crate::backend::LockBackend::wait_for_change
//! [`LockBackend::abandon`]: crate::backend::LockBackend::abandon
//! [`LockBackend::max_validity`]: crate::backend::LockBackend::max_validity

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument as _;

use crate::backend::{AcquireRequest, Attempt, Contention, Grant, Hold, SharedBackend};
use crate::background::Background;
use crate::backoff::{Backoff, jitter};
use crate::capabilities::WaitStrategy;
use crate::client::LockClient;
use crate::error::{Error, ErrorKind, Result};
use crate::guard::MutexGuard;
use crate::held::{HeldLease, renew_now};
use crate::key::LockKey;
use crate::lease::{Lease, clock_drift, validity_deadline};
use crate::metrics;
use crate::options::LockOptions;
use crate::token::OwnerToken;

/// How long an acquisition waits on contention.
#[derive(Clone, Copy)]
pub(crate) enum Wait {
    /// Not at all (a `try_`).
    No,
    /// Until the deadline, or forever without one.
    Until(Option<Instant>),
}

impl Wait {
    /// Waits for at most `timeout` (forever when that is past what an [`Instant`] holds).
    pub(crate) fn at_most(timeout: Duration) -> Self {
        Wait::Until(Instant::now().checked_add(timeout))
    }

    /// Waits for as long as `options.wait_timeout` allows.
    pub(crate) fn per(options: &LockOptions) -> Self {
        match options.wait_timeout {
            Some(timeout) => Wait::at_most(timeout),
            None => Wait::Until(None),
        }
    }

    /// The wait deadline, if there is one.
    pub(crate) fn deadline(self) -> Option<Instant> {
        match self {
            Wait::Until(deadline) => deadline,
            Wait::No => None,
        }
    }

    /// Time left before the deadline; `None` when there is none.
    fn left(self) -> Option<Duration> {
        self.deadline()
            .map(|deadline| deadline.saturating_duration_since(Instant::now()))
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

/// Hands a guard of `held` out if it has its floor of validity left, confirming it by a
/// renewal (bounded by `bound`) if not: the one door from a grant to a guard. A fresh grant
/// starts its renewal and its deadline here; a held one gains a holder (a reentrant
/// share). `None` when the grant cannot be had with its floor.
pub(crate) async fn issue(held: Arc<HeldLease>, bound: Option<Instant>) -> Option<MutexGuard> {
    if !vouch(&held, bound).await {
        return None;
    }
    let left = held.hand_out()?;
    Some(MutexGuard::new(held, left))
}

/// Whether `held` has at least its floor of validity left, after a renewal sent now if it
/// had less. A lease handed out whose deadline has passed stays lost.
pub(crate) async fn vouch(held: &Arc<HeldLease>, bound: Option<Instant>) -> bool {
    if held.has_floor() {
        return true;
    }
    if !held.may_confirm() {
        return false;
    }
    match renew_now(held, bound).await {
        Ok(_) => held.has_floor(),
        Err(e) => {
            tracing::debug!(key = %held.lease.key(), error = %e.display_chain(), "a grant short of its validity floor could not be confirmed");
            false
        }
    }
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
    .with_hold(hold)
    .with_fair(options.fair);
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
            let outcome = match self.wait.deadline() {
                Some(deadline) => match tokio::time::timeout_at(deadline.into(), attempt).await {
                    Ok(outcome) => outcome,
                    Err(_) => return self.time_is_up().await,
                },
                None => attempt.await,
            };
            let grant = match outcome {
                Ok(Attempt::Granted(grant)) => grant,
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
                    if self.wait.left() == Some(Duration::ZERO) {
                        self.give_up("timeout").await;
                        return Ok(None);
                    }
                    // Handed over by the server after the attempt that queued us was sent:
                    // valid from then, as if that attempt had been granted.
                    match self.wait_for_change(&contention).await {
                        Ok(Some(grant)) => grant,
                        Ok(None) => continue,
                        Err(e) => {
                            self.absorb(e).await?;
                            continue;
                        }
                    }
                }
                Err(e) => {
                    self.absorb(e).await?;
                    continue;
                }
            };
            if let Some(guard) = self.take(grant, sent_at).await {
                return Ok(Some(guard));
            }
            // Too late to be of use: give the grant back before asking again.
            self.pending.abandon().await;
            let late = Error::new(
                ErrorKind::Unavailable,
                backend.name(),
                "the grant came with less than a tenth of its validity left and could not be renewed: the backend answers slower than the TTL allows",
            );
            self.absorb(late).await?;
            self.pending.armed = true;
        }
    }

    /// Hands the grant out through [`issue`], or `None` when it cannot be had with its
    /// floor of validity (the caller gives it back).
    async fn take(&mut self, grant: Grant, sent_at: Instant) -> Option<MutexGuard> {
        let request = &self.pending.request;
        let drift = clock_drift(request.ttl, self.options.clock_drift_factor);
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
        let held = HeldLease::new(
            lease,
            self.pending.backend.clone(),
            self.pending.background.clone(),
            validity_deadline(sent_at, grant.valid_for, drift),
            drift,
            self.options.auto_renew,
        );
        let guard = issue(held, self.wait.deadline()).await?;
        self.pending.armed = false;
        metrics::acquired(
            self.pending.backend.as_ref(),
            "granted",
            self.started.elapsed(),
            self.waited,
        );
        tracing::debug!(fencing_token = %grant.fencing_token, "acquired");
        Some(guard)
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
            // A queue waiter's watch ends by itself whenever the predecessor may have gone
            // (the `WaitStrategy::Queue` contract), so there is no message to miss and no
            // timer: only the wait deadline bounds it. A periodic re-check would cost an
            // attempt and a new watch per waiter each period, whatever changed
            // (docs/measurements.md, "Queue waiters, measured").
            _ => holder_gone_by.unwrap_or(Duration::MAX),
        };
        let pause = self.wait.left().map_or(pause, |left| pause.min(left));
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
        let outcome = match self.wait.deadline() {
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
            || self.wait.left() == Some(Duration::ZERO);
        if give_up {
            self.give_up("error").await;
            return Err(error);
        }
        tracing::debug!(error = %error.display_chain(), failing_for_ms = failing_since.elapsed().as_millis() as u64, "retryable error while acquiring; retrying");
        self.last_error = Some(error);
        let delay = self.backoff.next_delay();
        tokio::time::sleep(self.wait.left().map_or(delay, |left| delay.min(left))).await;
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

/// An acquisition in progress. If it is dropped while armed (the acquire future was
/// cancelled), whatever the request left on the server is removed in the background.
struct PendingAcquire {
    backend: SharedBackend,
    background: Background,
    request: AcquireRequest,
    armed: bool,
}

impl PendingAcquire {
    /// Removes what the request left on the server, now, and disarms (nothing to do once
    /// disarmed).
    async fn abandon(&mut self) {
        if !self.armed {
            return;
        }
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
