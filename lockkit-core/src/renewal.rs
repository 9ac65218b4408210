//! The shared renewal scheduler: one task on lockkit's runtime renews every held lease
//! ([`HeldLease`]) when a third of its validity has passed, batching the leases of one
//! backend into one `renew_many` call.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tracing::Instrument as _;

use crate::backend::SharedBackend;
use crate::backend::runtime;
use crate::error::{Error, ErrorKind};
use crate::held::{HeldLease, Origin};
use crate::lease::Lease;
use crate::metrics;

/// The longest the scheduler sleeps when nothing is due (new leases wake it earlier).
const IDLE_TICK: Duration = Duration::from_secs(1);

/// When to renew a lease valid from `sent_at` until `valid_until`: after a third of it.
pub(crate) fn renewal_time(sent_at: Instant, valid_until: Instant) -> Instant {
    sent_at + valid_until.saturating_duration_since(sent_at) / 3
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

    /// Wakes the scheduler for a pass now (a renewal answered outside it moved a lease's
    /// next renewal).
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    /// Starts renewing `held` (it is only watched when it auto-renews: its lost signal at the
    /// deadline is the [`deadline`](crate::deadline) thread's).
    ///
    /// The scheduler's thread is woken only when the new lease needs it before its next pass,
    /// which keeps a cross-thread wake-up off the acquire path of short-lived locks.
    pub(crate) fn register(&self, held: Arc<HeldLease>) {
        let Some(due) = held.next_renewal() else {
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
        table.leases.retain(|_, held| match held.renewal_by(now) {
            // Released or lost; a lease past its deadline is the deadline thread's to report.
            None => false,
            Some(None) => true,
            Some(Some(next)) => {
                if now >= next {
                    due_backends.insert(backend_id(&held.backend));
                }
                next_wake = next_wake.min(next);
                candidates.push((held.clone(), next));
                true
            }
        });
        table.next_wake = next_wake;
        drop(table);
        let mut batches: HashMap<*const (), (SharedBackend, Vec<Arc<HeldLease>>)> = HashMap::new();
        for (held, next) in candidates {
            let id = backend_id(&held.backend);
            if due_backends.contains(&id) && next <= now + held.lease.ttl() / 6 {
                held.start_renewing();
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
