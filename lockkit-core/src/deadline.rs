//! The lost signal at the validity deadline: one thread for the process sleeps until the
//! earliest deadline of the leases handed out and fires the lost signal of each lease whose
//! deadline has passed.
//!
//! A thread of its own, not a task: the signal (and `with_lock`'s cancellation) must come at
//! the deadline whatever lockkit's runtime thread is doing (a renewal tick over 10,000
//! leases, a backend parsing a large answer) and whatever the application's runtime is doing.
//! The thread does nothing else, so its lag is the operating system's wake-up latency
//! (measured in `docs/measurements.md`).
//!
//! Each lease has one entry in the queue while it is held. A renewal moves a deadline forward
//! without telling the thread: when it wakes for the old deadline it finds the new one and
//! queues that. An entry is never later than its lease's deadline, since deadlines only move
//! forward. A lease that ends (released, lost) takes its entry out, so the queue holds only
//! the leases held now, whatever their TTLs.
//!
//! A new entry wakes the thread only when it is due before the thread's own wake-up. A
//! taken-out entry leaves that wake-up as it was (the thread then wakes early and finds the
//! next one). So locks taken and released one after the other cost the thread one wake-up
//! per deadline, not one per acquisition: the wake-up of another thread is a system call and
//! a context switch on the acquire path (issue 37, the uncontended cycle).

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Instant;

use crate::held::HeldLease;

/// Queues `held`'s entry under `at`, its deadline.
pub(crate) fn watch(held: &Arc<HeldLease>, at: Instant) {
    let deadlines = deadlines();
    let mut queue = deadlines.queue();
    queue.entries.insert((at, held.id), Arc::downgrade(held));
    let wake = match queue.thread {
        Thread::Awake => false,
        Thread::Until(until) => at < until,
        Thread::Idle => true,
    };
    drop(queue);
    if wake {
        deadlines.wake.notify_one();
    }
}

/// Takes the entry queued under `at` for the lease `id` out.
pub(crate) fn unwatch(id: u64, at: Instant) {
    deadlines().queue().entries.remove(&(at, id));
}

/// The leases' entries, and what the thread does.
struct Deadlines {
    queue: Mutex<Queue>,
    wake: Condvar,
}

/// The entries by deadline (and lease id, for leases with the same deadline).
struct Queue {
    entries: BTreeMap<(Instant, u64), Weak<HeldLease>>,
    thread: Thread,
}

/// What the thread does, set under the queue's lock before it waits and after it wakes.
#[derive(Clone, Copy)]
enum Thread {
    /// It looks at the queue before it waits again: a new entry needs no wake-up.
    Awake,
    /// It waits until this instant.
    Until(Instant),
    /// It waits for an entry.
    Idle,
}

fn deadlines() -> &'static Deadlines {
    static DEADLINES: OnceLock<&'static Deadlines> = OnceLock::new();
    DEADLINES.get_or_init(|| {
        let deadlines: &'static Deadlines = Box::leak(Box::new(Deadlines {
            queue: Mutex::new(Queue {
                entries: BTreeMap::new(),
                thread: Thread::Awake,
            }),
            wake: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("lockkit-deadlines".into())
            .spawn(|| deadlines.run())
            .unwrap_or_else(|e| panic!("lockkit cannot start its deadline thread: {e}"));
        deadlines
    })
}

impl Deadlines {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn run(&self) {
        let mut queue = self.queue();
        loop {
            let now = Instant::now();
            let Some(next) = queue.entries.first_key_value().map(|(key, _)| key.0) else {
                queue.thread = Thread::Idle;
                queue = self
                    .wake
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
                queue.thread = Thread::Awake;
                continue;
            };
            if next > now {
                queue.thread = Thread::Until(next);
                queue = self
                    .wake
                    .wait_timeout(queue, next - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                queue.thread = Thread::Awake;
                continue;
            }
            let due = queue.entries.pop_first();
            // Not under the queue's lock: firing a signal wakes tasks and logs, and a lease
            // that ends takes its entry out of the queue.
            drop(queue);
            if let Some((_, lease)) = due
                && let Some(held) = lease.upgrade()
            {
                expire(&held, now);
            }
            queue = self.queue();
        }
    }
}

/// `HeldLease::expire_by`, proof against a backend whose code panics inside it (reporting
/// a loss asks the backend for its name): the thread must outlive it, and the lease is then
/// reported lost without the backend's help.
fn expire(held: &Arc<HeldLease>, now: Instant) {
    if std::panic::catch_unwind(AssertUnwindSafe(|| held.expire_by(now))).is_err() {
        tracing::error!("a backend panicked while lockkit reported a lease lost; it is lost");
        held.lost.cancel();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::MemoryBackend;
    use crate::background::Background;
    use crate::key::LockKey;
    use crate::lease::Lease;
    use crate::token::{FencingToken, OwnerToken};

    fn queued(id: u64) -> bool {
        deadlines()
            .queue()
            .entries
            .keys()
            .any(|(_, queued)| *queued == id)
    }

    /// A lease of `ttl` handed out now, renewed by nobody.
    fn handed_out(ttl: Duration) -> Arc<HeldLease> {
        let now = Instant::now();
        let lease = Lease::new(
            LockKey::new("ns", "k").expect("key"),
            OwnerToken::generate().expect("rng"),
            FencingToken(1),
            ttl,
            now,
        );
        let held = HeldLease::new(
            lease,
            Arc::new(MemoryBackend::new()),
            Background::default(),
            Some(now + ttl),
            Duration::ZERO,
            false,
        );
        assert!(held.hand_out().is_some());
        held
    }

    #[test]
    fn a_deadline_before_the_threads_wake_up_is_reported_at_its_time() {
        let long = handed_out(Duration::from_secs(3600));
        // The thread now sleeps until the long lease's deadline at the latest.
        std::thread::sleep(Duration::from_millis(50));
        let short = handed_out(Duration::from_millis(200));
        let by = Instant::now() + Duration::from_secs(10);
        while !short.lost.is_cancelled() {
            assert!(
                Instant::now() < by,
                "a deadline 200 ms away was not reported in 10 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!long.lost.is_cancelled());
        assert!(long.drop_holder());
    }

    #[test]
    fn a_released_lease_leaves_nothing_in_the_queue() {
        let held = handed_out(Duration::from_secs(3600));
        assert!(queued(held.id), "a lease handed out is watched");
        assert!(held.drop_holder());
        assert!(!queued(held.id), "a released lease is still queued");
    }
}
