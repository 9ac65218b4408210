//! The shared renewal scheduler: one task on lockkit's runtime renews every held lease at a
//! third of its TTL, batching the leases of one backend into one `renew_many` call, and fires
//! the lost signal of every lease whose validity deadline passes without a renewal.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::backend::{Renewal, SharedBackend};
use crate::error::{ErrorKind, Result};
use crate::lease::{Lease, validity_deadline};
use crate::metrics;
use crate::runtime;

/// The longest the scheduler sleeps when nothing is due (new leases wake it earlier).
const IDLE_TICK: Duration = Duration::from_secs(1);

/// A granted lease while it is held: the state shared by its guards and the scheduler.
#[derive(Debug)]
pub(crate) struct HeldLease {
    pub(crate) lease: Lease,
    pub(crate) backend: SharedBackend,
    pub(crate) lost: CancellationToken,
    drift: Duration,
    state: StdMutex<HeldState>,
}

#[derive(Debug)]
struct HeldState {
    valid_until: Instant,
    next_renewal: Instant,
    renewing: bool,
    /// Guards sharing this lease (more than one only for reentrant acquisitions).
    holders: usize,
    released: bool,
}

impl HeldLease {
    pub(crate) fn new(
        lease: Lease,
        backend: SharedBackend,
        valid_until: Instant,
        drift: Duration,
    ) -> Arc<Self> {
        let lost = match lease.session() {
            Some(session) => session.child_token(),
            None => CancellationToken::new(),
        };
        let next_renewal = lease.acquired_at() + lease.ttl() / 3;
        Arc::new(HeldLease {
            lease,
            backend,
            lost,
            drift,
            state: StdMutex::new(HeldState {
                valid_until,
                next_renewal,
                renewing: false,
                holders: 1,
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

    /// Adds a holder (a reentrant acquisition) if the lease is still held and valid.
    pub(crate) fn try_share(&self) -> bool {
        let mut state = self.state();
        if state.released
            || state.holders == 0
            || self.lost.is_cancelled()
            || Instant::now() >= state.valid_until
        {
            return false;
        }
        state.holders += 1;
        true
    }

    /// Drops one holder; returns `true` when it was the last, which marks the lease released.
    pub(crate) fn drop_holder(&self) -> bool {
        let mut state = self.state();
        state.holders = state.holders.saturating_sub(1);
        if state.holders == 0 && !state.released {
            state.released = true;
            return true;
        }
        false
    }

    pub(crate) fn mark_lost(&self, why: &str) {
        if !self.lost.is_cancelled() {
            tracing::warn!(key = %self.lease.key(), backend = self.backend.name(), why, "lock lost");
            metrics::lost(self.backend.name());
            self.lost.cancel();
        }
    }

    /// Applies the answer to a renewal sent at `sent_at`. Returns whether the lease is still ours.
    pub(crate) fn apply_renewal(&self, sent_at: Instant, answer: &Result<Renewal>) -> bool {
        let backend = self.backend.name();
        let mut state = self.state();
        state.renewing = false;
        match answer {
            Ok(Renewal::Extended(valid_for)) => {
                match validity_deadline(sent_at, *valid_for, self.drift) {
                    Some(deadline) => {
                        state.valid_until = deadline;
                        state.next_renewal = sent_at + (*valid_for / 3);
                        true
                    }
                    None => {
                        drop(state);
                        self.mark_lost("renewal came back with no validity left");
                        false
                    }
                }
            }
            Ok(Renewal::Lost) => {
                drop(state);
                self.mark_lost("the backend says the lease is no longer ours");
                false
            }
            Err(e) if matches!(e.kind(), ErrorKind::Lost | ErrorKind::NotOwner) => {
                drop(state);
                self.mark_lost("the backend says the lease is no longer ours");
                false
            }
            Err(e) => {
                metrics::renew_failed(backend);
                tracing::warn!(key = %self.lease.key(), backend, error = %e, "renewal failed; retrying before the validity deadline");
                let left = state.valid_until.saturating_duration_since(Instant::now());
                state.next_renewal = Instant::now() + (left / 4).max(Duration::from_millis(5));
                true
            }
        }
    }
}

/// The process-wide renewal scheduler.
#[derive(Debug)]
pub(crate) struct Scheduler {
    leases: StdMutex<HashMap<u64, Arc<HeldLease>>>,
    wake: Notify,
    next_id: AtomicU64,
}

impl Scheduler {
    /// The scheduler, starting its task on lockkit's runtime on first use.
    pub(crate) fn global() -> &'static Scheduler {
        static SCHEDULER: OnceLock<&'static Scheduler> = OnceLock::new();
        SCHEDULER.get_or_init(|| {
            let scheduler: &'static Scheduler = Box::leak(Box::new(Scheduler {
                leases: StdMutex::new(HashMap::new()),
                wake: Notify::new(),
                next_id: AtomicU64::new(0),
            }));
            runtime::spawn(scheduler.run());
            scheduler
        })
    }

    /// Starts renewing `held` (or only watching its deadline when `renew` is false).
    pub(crate) fn register(&self, held: Arc<HeldLease>, renew: bool) {
        if !renew {
            held.state().next_renewal = far_future();
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, held);
        self.wake.notify_one();
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

    /// One pass over the held leases: drops finished ones, fires deadlines, starts the renewals
    /// that are due (one batch per backend). Returns when the next pass is needed.
    fn tick(&'static self, now: Instant) -> Instant {
        let mut next_wake = now + IDLE_TICK;
        let mut due: HashMap<*const (), (SharedBackend, Vec<Arc<HeldLease>>)> = HashMap::new();
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        leases.retain(|_, held| {
            let mut state = held.state();
            if state.released || held.lost.is_cancelled() {
                return false;
            }
            if now >= state.valid_until {
                drop(state);
                held.mark_lost("validity deadline passed without a renewal");
                return false;
            }
            next_wake = next_wake.min(state.valid_until);
            if !state.renewing {
                if now >= state.next_renewal {
                    state.renewing = true;
                    let ptr = Arc::as_ptr(&held.backend) as *const ();
                    due.entry(ptr)
                        .or_insert_with(|| (held.backend.clone(), Vec::new()))
                        .1
                        .push(held.clone());
                } else {
                    next_wake = next_wake.min(state.next_renewal);
                }
            }
            true
        });
        drop(leases);
        for (backend, batch) in due.into_values() {
            let span = tracing::debug_span!(
                "lockkit.renew",
                backend = backend.name(),
                leases = batch.len()
            );
            tokio::spawn(self.renew_batch(backend, batch).instrument(span));
        }
        next_wake
    }

    async fn renew_batch(&'static self, backend: SharedBackend, batch: Vec<Arc<HeldLease>>) {
        let leases: Vec<Lease> = batch.iter().map(|h| h.lease.clone()).collect();
        let sent_at = Instant::now();
        let deadline = batch
            .iter()
            .map(|h| h.valid_until())
            .min()
            .unwrap_or(sent_at);
        let answers =
            match tokio::time::timeout_at(deadline.into(), backend.renew_many(&leases)).await {
                Ok(answers) if answers.len() == batch.len() => answers,
                Ok(_) | Err(_) => batch
                    .iter()
                    .map(|_| {
                        Err(crate::Error::new(
                            ErrorKind::Unavailable,
                            backend.name(),
                            "renewal did not answer before the validity deadline",
                        ))
                    })
                    .collect(),
            };
        for (held, answer) in batch.iter().zip(&answers) {
            held.apply_renewal(sent_at, answer);
        }
        self.wake.notify_one();
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}
