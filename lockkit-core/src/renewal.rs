//! Held leases and their renewal: the state a grant's guards and the scheduler share
//! ([`HeldLease`]), one renewal sent now ([`renew_now`]), and the shared scheduler: one task
//! on lockkit's runtime renews every held lease when a third of its validity has passed,
//! batching the leases of one backend into one `renew_many` call.
//!
//! A lease's deadline only moves forward, and only while it lies ahead: once it has passed,
//! the lease is lost for good (the [`deadline`](crate::deadline) thread fires its signal at
//! that instant), and a renewal answered later cannot revive it, so `is_lost()` never goes
//! back to `false`. Before a grant is first handed out, nobody has seen its deadline, and a
//! renewal may give it a new one ([`issue`](crate::acquire::issue)).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::backend::runtime;
use crate::backend::{Renewal, SharedBackend};
use crate::background::Background;
use crate::error::{Error, ErrorKind, Result};
use crate::lease::{Lease, validity_deadline, validity_floor};
use crate::metrics;

/// The longest the scheduler sleeps when nothing is due (new leases wake it earlier).
const IDLE_TICK: Duration = Duration::from_secs(1);
/// The shortest pause before retrying a failed renewal.
const MIN_RETRY: Duration = Duration::from_millis(5);

/// When to renew a lease valid from `sent_at` until `valid_until`: after a third of it.
fn renewal_time(sent_at: Instant, valid_until: Instant) -> Instant {
    sent_at + valid_until.saturating_duration_since(sent_at) / 3
}

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
        !self.lost.is_cancelled()
            && self.valid_until().saturating_duration_since(Instant::now()) >= self.floor
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
    /// later one shares it (a reentrant acquisition). `false`, adding nothing, once the
    /// lease is released, lost or past its deadline.
    pub(crate) fn hand_out(self: &Arc<Self>) -> bool {
        let mut state = self.state();
        if state.released || self.lost.is_cancelled() || Instant::now() >= state.valid_until {
            return false;
        }
        state.holders += 1;
        if state.issued {
            return true;
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
        true
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
    Scheduler::global().wake.notify_one();
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

/// The process-wide renewal scheduler.
#[derive(Debug)]
pub(crate) struct Scheduler {
    table: StdMutex<Table>,
    wake: Notify,
}

/// The leases the scheduler watches, and when it will look at them next. Both live under one
/// lock, so a registration either is seen by the pass that sets `next_wake` or sees its result.
#[derive(Debug)]
struct Table {
    leases: HashMap<u64, Arc<HeldLease>>,
    next_wake: Instant,
}

impl Scheduler {
    /// The scheduler, starting its task on lockkit's runtime on first use.
    ///
    /// A supervisor keeps it running: if a pass panics (a bug, or a backend whose code panics
    /// inside it), every lease it watched fires its lost signal, since nobody renewed it for a
    /// while and it may have expired, and a new pass loop takes over for the leases that come
    /// after.
    pub(crate) fn global() -> &'static Scheduler {
        static SCHEDULER: OnceLock<&'static Scheduler> = OnceLock::new();
        SCHEDULER.get_or_init(|| {
            let scheduler: &'static Scheduler = Box::leak(Box::new(Scheduler {
                table: StdMutex::new(Table {
                    leases: HashMap::new(),
                    next_wake: Instant::now(),
                }),
                wake: Notify::new(),
            }));
            runtime::spawn(scheduler.supervise());
            scheduler
        })
    }

    /// Starts renewing `held` (it is only watched when it auto-renews: its lost signal at the
    /// deadline is the [`deadline`](crate::deadline) thread's).
    ///
    /// The scheduler's thread is woken only when the new lease needs it before its next pass,
    /// which keeps a cross-thread wake-up off the acquire path of short-lived locks.
    pub(crate) fn register(&self, held: Arc<HeldLease>) {
        let Some(due) = held.state().next_renewal else {
            return;
        };
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        table.leases.insert(held.id, held);
        let wake = due < table.next_wake;
        drop(table);
        if wake {
            self.wake.notify_one();
        }
    }

    async fn supervise(&'static self) {
        loop {
            let Err(failure) = runtime::spawn(self.run()).await else {
                return;
            };
            if !failure.is_panic() {
                return;
            }
            let orphans: Vec<Arc<HeldLease>> = {
                let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
                table.next_wake = Instant::now();
                table.leases.drain().map(|(_, held)| held).collect()
            };
            tracing::error!(
                leases = orphans.len(),
                "lockkit's renewal scheduler panicked; every lease it renewed is reported lost, and a new scheduler takes over"
            );
            for held in orphans {
                // Not `mark_lost`: it asks the backend for its name, and the panic may have come
                // from the backend.
                held.lost.cancel();
            }
        }
    }

    async fn run(&'static self) {
        loop {
            let next_wake = self.tick(Instant::now());
            tokio::select! {
                () = tokio::time::sleep_until(next_wake.into()) => {}
                () = self.wake.notified() => {}
            }
        }
    }

    /// One pass over the held leases: drops finished ones and starts one
    /// renewal batch per backend that has a lease due, taking along that backend's leases due
    /// within the next sixth of their TTL (renewing a little early costs nothing and keeps
    /// batches full). Returns when the next pass is needed.
    fn tick(&'static self, now: Instant) -> Instant {
        let mut next_wake = now + IDLE_TICK;
        let mut due_backends = HashSet::new();
        let mut candidates = Vec::new();
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        table.leases.retain(|_, held| {
            let state = held.state();
            // A lease past its deadline is the deadline thread's to report lost.
            if state.released || held.lost.is_cancelled() || now >= state.valid_until {
                return false;
            }
            if let (false, Some(next)) = (state.renewing, state.next_renewal) {
                if now >= next {
                    due_backends.insert(backend_id(&held.backend));
                }
                next_wake = next_wake.min(next);
                candidates.push((held.clone(), next));
            }
            true
        });
        table.next_wake = next_wake;
        drop(table);
        let mut batches: HashMap<*const (), (SharedBackend, Vec<Arc<HeldLease>>)> = HashMap::new();
        for (held, next) in candidates {
            let id = backend_id(&held.backend);
            if due_backends.contains(&id) && next <= now + held.lease.ttl() / 6 {
                held.state().renewing = true;
                batches
                    .entry(id)
                    .or_insert_with(|| (held.backend.clone(), Vec::new()))
                    .1
                    .push(held);
            }
        }
        for (backend, batch) in batches.into_values() {
            let span = tracing::debug_span!(
                "lockkit.renew",
                backend = backend.name(),
                leases = batch.len()
            );
            tokio::spawn(self.renew_batch(backend, batch).instrument(span));
        }
        next_wake
    }

    /// Renews a batch and applies each answer. The call is bounded by the latest deadline in
    /// the batch; a lease whose own deadline passes meanwhile is lost, and a late answer
    /// cannot revive it.
    async fn renew_batch(&'static self, backend: SharedBackend, batch: Vec<Arc<HeldLease>>) {
        let leases: Vec<Lease> = batch.iter().map(|h| h.lease.clone()).collect();
        let sent_at = Instant::now();
        let deadline = batch
            .iter()
            .map(|h| h.valid_until())
            .max()
            .unwrap_or(sent_at);
        // In a task of its own, so that a backend that panics fails this batch's renewals (they
        // are retried) instead of the scheduler.
        let renewing = tokio::spawn({
            let backend = backend.clone();
            async move { backend.renew_many(&leases).await }
        });
        let abort = renewing.abort_handle();
        let answers = match tokio::time::timeout_at(deadline.into(), renewing).await {
            Ok(Ok(answers)) if answers.len() == batch.len() => {
                metrics::renewed(backend.as_ref(), sent_at.elapsed());
                answers
            }
            outcome => {
                let why = match outcome {
                    Ok(Ok(_)) => "renew_many returned the wrong number of answers",
                    Ok(Err(_)) => "renew_many panicked",
                    Err(_) => {
                        abort.abort();
                        "renewal did not answer before the validity deadline"
                    }
                };
                batch
                    .iter()
                    .map(|_| Err(Error::new(ErrorKind::Unavailable, backend.name(), why)))
                    .collect()
            }
        };
        for (held, answer) in batch.iter().zip(&answers) {
            held.apply_renewal(sent_at, answer, Origin::Scheduler);
        }
        self.wake.notify_one();
    }
}

fn backend_id(backend: &SharedBackend) -> *const () {
    Arc::as_ptr(backend) as *const ()
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
            Duration::from_secs(10),
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
        assert!(held.hand_out());
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
