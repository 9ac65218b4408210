//! A granted lease while it is held ([`HeldLease`]): the state its guards, the renewal
//! scheduler and the deadline thread share, and one renewal sent now ([`renew_now`]).
//!
//! A lease's deadline only moves forward, and only while it lies ahead: once it has passed,
//! the lease is lost for good (the [`deadline`](crate::deadline) thread fires its signal at
//! that instant), and a renewal answered later cannot revive it, so `is_lost()` never goes
//! back to `false`. Before a grant is first handed out, nobody has seen its deadline, and a
//! renewal may give it a new one ([`issue`](crate::acquire::issue)).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::backend::runtime;
use crate::backend::{Renewal, SharedBackend};
use crate::background::Background;
use crate::error::{Error, ErrorKind, Result};
use crate::lease::{Lease, validity_deadline, validity_floor};
use crate::metrics;
use crate::renewal::{Scheduler, renewal_time};

/// The shortest pause before retrying a failed renewal.
const MIN_RETRY: Duration = Duration::from_millis(5);

/// Who applies a renewal answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// The background scheduler (which marks the lease as being renewed while it waits).
    Scheduler,
    /// A renewal sent now: an explicit `extend`, or the confirmation of a grant that is to
    /// be handed out with less than its floor left.
    Now,
}

/// What a renewal answer did to the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    /// The lease is valid at least until the answer's deadline.
    Extended,
    /// The answer did not extend anything (an error, or no validity left); the lease keeps its
    /// previous deadline.
    Unchanged,
    /// The lease is lost.
    Lost,
}

/// A granted lease while it is held: the state shared by its guards and the scheduler.
#[derive(Debug)]
pub(crate) struct HeldLease {
    /// Unique in the process: the lease's place in the scheduler's table and in the
    /// deadline queue.
    pub(crate) id: u64,
    pub(crate) lease: Lease,
    pub(crate) backend: SharedBackend,
    pub(crate) lost: CancellationToken,
    /// Where the guard's release runs when its caller does not wait for it.
    pub(crate) background: Background,
    drift: Duration,
    /// The least validity a guard of this lease is handed out with.
    floor: Duration,
    auto_renew: bool,
    state: StdMutex<HeldState>,
    /// Whether the hold has ended (released or lost) for the held-locks gauge: once only.
    ended: AtomicBool,
}

#[derive(Debug)]
struct HeldState {
    /// Until when the lease is ours by the local clock; may lie in the past before the
    /// lease is first handed out (a grant that came late).
    valid_until: Instant,
    /// The send time `valid_until` counts from: the grant's attempt, or the renewal that set it.
    valid_from: Instant,
    /// When the scheduler renews next; `None` without auto-renewal or before the lease is
    /// handed out.
    next_renewal: Option<Instant>,
    /// A scheduler renewal is in flight.
    renewing: bool,
    /// Guards handed out and not yet released or dropped (several for reentrant shares).
    holders: usize,
    /// Handed out at least once: from then on its deadline is final once passed.
    issued: bool,
    /// The deadline its entry in the deadline queue is under, while it has one.
    watched: Option<Instant>,
    released: bool,
}

impl HeldLease {
    /// A grant, not yet handed out: valid until `valid_until` (`None`: no validity left),
    /// with its floor measured against what `backend` can promise for its TTL.
    pub(crate) fn new(
        lease: Lease,
        backend: SharedBackend,
        background: Background,
        valid_until: Option<Instant>,
        drift: Duration,
        auto_renew: bool,
    ) -> Arc<Self> {
        let lost = match lease.session() {
            Some(session) => session.child_token(),
            None => CancellationToken::new(),
        };
        let floor = validity_floor(backend.max_validity(lease.ttl()));
        let valid_from = lease.acquired_at();
        let valid_until = valid_until.unwrap_or(valid_from);
        static IDS: AtomicU64 = AtomicU64::new(0);
        Arc::new(HeldLease {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            lease,
            backend,
            lost,
            background,
            drift,
            floor,
            auto_renew,
            ended: AtomicBool::new(false),
            state: StdMutex::new(HeldState {
                valid_until,
                valid_from,
                next_renewal: None,
                renewing: false,
                holders: 0,
                issued: false,
                watched: None,
                released: false,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HeldState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// When the scheduler renews it next; `None` without auto-renewal.
    pub(crate) fn next_renewal(&self) -> Option<Instant> {
        self.state().next_renewal
    }

    /// For the scheduler's pass at `now`: `None` once the lease needs no renewal (released,
    /// lost, or past its deadline); else when it is due, or `Some(None)` while a renewal of
    /// the scheduler is in flight.
    pub(crate) fn renewal_by(&self, now: Instant) -> Option<Option<Instant>> {
        let state = self.state();
        if state.released || self.lost.is_cancelled() || now >= state.valid_until {
            return None;
        }
        Some(state.next_renewal.filter(|_| !state.renewing))
    }

    /// A renewal of the scheduler is on its way.
    pub(crate) fn start_renewing(&self) {
        self.state().renewing = true;
    }

    /// The local validity deadline.
    pub(crate) fn valid_until(&self) -> Instant {
        self.state().valid_until
    }

    /// Lost, or past the validity deadline (at that instant, whatever has noticed it yet).
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || Instant::now() >= self.valid_until()
    }

    /// Whether at least the floor of validity is left now.
    pub(crate) fn has_floor(&self) -> bool {
        self.useful_until(self.valid_until()).is_some()
    }

    /// The validity left now before `valid_until`, if the lease is not lost and it is at
    /// least the floor (and more than nothing).
    fn useful_until(&self, valid_until: Instant) -> Option<Duration> {
        let left = valid_until.saturating_duration_since(Instant::now());
        (!self.lost.is_cancelled() && !left.is_zero() && left >= self.floor).then_some(left)
    }

    /// Whether a renewal could still make this lease useful: it is not lost, and it was
    /// never handed out or its deadline lies ahead.
    pub(crate) fn may_confirm(&self) -> bool {
        let state = self.state();
        !self.lost.is_cancelled()
            && !state.released
            && (!state.issued || Instant::now() < state.valid_until)
    }

    /// Adds a holder: the first hand-out starts the lease's renewal and its deadline, a
    /// later one shares it (a reentrant acquisition). `None`, adding nothing, once the
    /// lease is released, lost or short of its floor of validity. `Some(left)`: the validity
    /// it was handed out with, measured under the same lock as the check, so it is what the
    /// holder was given however late its thread reads it.
    pub(crate) fn hand_out(self: &Arc<Self>) -> Option<Duration> {
        let mut state = self.state();
        if state.released {
            return None;
        }
        let left = self.useful_until(state.valid_until)?;
        state.holders += 1;
        if state.issued {
            return Some(left);
        }
        state.issued = true;
        if self.auto_renew {
            state.next_renewal = Some(renewal_time(state.valid_from, state.valid_until));
        }
        state.watched = Some(state.valid_until);
        crate::deadline::watch(self, state.valid_until);
        drop(state);
        metrics::held(self.backend.as_ref());
        Scheduler::global().register(self.clone());
        Some(left)
    }

    /// Drops one holder; returns `true` when it was the last, which marks the lease released.
    pub(crate) fn drop_holder(&self) -> bool {
        let mut state = self.state();
        state.holders = state.holders.saturating_sub(1);
        if state.holders == 0 && !state.released {
            state.released = true;
            drop(state);
            self.end();
            return true;
        }
        false
    }

    /// The hold of a lease handed out ends (first release or loss): its deadline needs no
    /// watching, and the gauge and the hold-duration histogram count it.
    fn end(&self) {
        let watched = {
            let mut state = self.state();
            if !state.issued {
                return;
            }
            state.watched.take()
        };
        if let Some(at) = watched {
            crate::deadline::unwatch(self.id, at);
        }
        if !self.ended.swap(true, Ordering::AcqRel) {
            metrics::no_longer_held(self.backend.as_ref(), self.lease.acquired_at().elapsed());
        }
    }

    pub(crate) fn mark_lost(&self, why: &str) {
        if !self.lost.is_cancelled() {
            if self.state().issued {
                tracing::warn!(key = %self.lease.key(), backend = self.backend.name(), why, "lock lost");
                metrics::lost(self.backend.as_ref());
            }
            self.lost.cancel();
        }
        self.end();
    }

    /// For the deadline thread, whose entry for this lease came due at `now`: fires the lost
    /// signal if the deadline has passed, else queues the entry again under the deadline a
    /// renewal moved it to (nothing once the lease is released or lost).
    pub(crate) fn expire_by(self: &Arc<Self>, now: Instant) {
        let mut state = self.state();
        state.watched = None;
        if state.released || self.lost.is_cancelled() {
            return;
        }
        if now < state.valid_until {
            state.watched = Some(state.valid_until);
            crate::deadline::watch(self, state.valid_until);
            return;
        }
        drop(state);
        self.mark_lost("validity deadline passed without a renewal");
    }

    /// Applies the answer to a renewal sent at `sent_at`. Answers may arrive out of order (a
    /// slow `extend` beside the scheduler): a deadline only ever moves forward, nothing is
    /// applied to a lease that is already lost or released, and an answer that comes after
    /// the deadline of a lease handed out finds it lost.
    pub(crate) fn apply_renewal(
        &self,
        sent_at: Instant,
        answer: &Result<Renewal>,
        origin: Origin,
    ) -> Applied {
        let mut state = self.state();
        if origin == Origin::Scheduler {
            state.renewing = false;
        }
        if self.lost.is_cancelled() {
            return Applied::Lost;
        }
        if state.released {
            return Applied::Unchanged;
        }
        let gone = match answer {
            Ok(Renewal::Lost) => Some("the backend says the lease is no longer ours"),
            Err(e) if e.kind() == ErrorKind::Lost => {
                Some("the backend says the lease is no longer ours")
            }
            _ if state.issued && Instant::now() >= state.valid_until => {
                Some("validity deadline passed before the renewal answered")
            }
            _ => None,
        };
        if let Some(why) = gone {
            drop(state);
            self.mark_lost(why);
            return Applied::Lost;
        }
        let deadline = match answer {
            Ok(Renewal::Extended(valid_for)) => validity_deadline(sent_at, *valid_for, self.drift),
            _ => None,
        };
        match deadline {
            Some(deadline) => {
                if deadline > state.valid_until {
                    state.valid_until = deadline;
                    state.valid_from = sent_at;
                    if state.next_renewal.is_some() {
                        state.next_renewal = Some(renewal_time(sent_at, deadline));
                    }
                }
                Applied::Extended
            }
            None => {
                if let Err(e) = answer {
                    metrics::renew_failed(self.backend.as_ref());
                    tracing::warn!(key = %self.lease.key(), backend = self.backend.name(), error = %e.display_chain(), "renewal failed; retrying before the validity deadline");
                }
                if origin == Origin::Scheduler && state.next_renewal.is_some() {
                    let left = state.valid_until.saturating_duration_since(Instant::now());
                    state.next_renewal = Some(Instant::now() + (left / 4).max(MIN_RETRY));
                }
                Applied::Unchanged
            }
        }
    }
}

impl Drop for HeldLease {
    /// A lease dropped without a release or a loss ends too (once handed out; a grant never
    /// handed out was never counted).
    fn drop(&mut self) {
        self.end();
    }
}

/// Sends one renewal of `held` now and applies its answer; the call runs on lockkit's
/// runtime (where backends keep their renewal connections) and is bounded by `bound` and,
/// once the lease is handed out, by its deadline (a grant not handed out yet, by its TTL:
/// past it, the grant is gone anyway).
pub(crate) async fn renew_now(held: &Arc<HeldLease>, bound: Option<Instant>) -> Result<Applied> {
    let backend = held.backend.name();
    let sent_at = Instant::now();
    let own_bound = {
        let state = held.state();
        if state.issued {
            Some(state.valid_until)
        } else {
            sent_at.checked_add(held.lease.ttl())
        }
    };
    let renewing = {
        let held = held.clone();
        runtime::run(async move { held.backend.renew(&held.lease).await })
    };
    let answer = match own_bound.into_iter().chain(bound).min() {
        Some(limit) => tokio::time::timeout_at(limit.into(), renewing).await,
        None => Ok(renewing.await),
    };
    let answer = match answer {
        Ok(Ok(answer)) => {
            metrics::renewed(held.backend.as_ref(), sent_at.elapsed());
            answer
        }
        Ok(Err(panicked)) => Err(panicked),
        Err(_) => Err(Error::new(
            ErrorKind::Unavailable,
            backend,
            "renewal did not answer before the validity deadline",
        )),
    };
    let applied = held.apply_renewal(sent_at, &answer, Origin::Now);
    Scheduler::global().wake();
    match (applied, answer) {
        (Applied::Lost, _) => Err(Error::new(
            ErrorKind::Lost,
            backend,
            format!("lock {} is no longer held", held.lease.key()),
        )),
        (_, Err(e)) => Err(e),
        (applied, Ok(_)) => Ok(applied),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryBackend;
    use crate::key::LockKey;
    use crate::token::{FencingToken, OwnerToken};

    #[tokio::test(flavor = "current_thread")]
    async fn a_renewal_answered_after_the_deadline_cannot_revive_the_lease() {
        let sent_at = Instant::now();
        let lease = Lease::new(
            LockKey::new("ns", "k").expect("key"),
            OwnerToken::generate().expect("rng"),
            FencingToken(1),
            Duration::from_millis(100),
            sent_at,
        );
        let held = HeldLease::new(
            lease,
            Arc::new(MemoryBackend::new()),
            Background::default(),
            Some(sent_at + Duration::from_millis(20)),
            Duration::ZERO,
            true,
        );
        assert!(
            held.hand_out().is_some(),
            "20 ms of 100: above the floor of 10"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(held.is_lost(), "past its deadline");
        // Sent before the deadline, answered after it: too late to count.
        let applied = held.apply_renewal(
            sent_at,
            &Ok(Renewal::Extended(Duration::from_secs(10))),
            Origin::Scheduler,
        );
        assert_eq!(applied, Applied::Lost);
        assert!(held.is_lost(), "is_lost() went back to false");
        assert!(held.lost.is_cancelled(), "the lost signal did not fire");
    }
}
