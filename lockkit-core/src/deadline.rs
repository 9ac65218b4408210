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
//! Each lease has one entry in the queue. A renewal moves a deadline forward without telling
//! the thread: when it wakes for the old deadline it finds the new one and queues that. An
//! entry is never later than its lease's deadline, since deadlines only move forward.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError, Weak};
use std::time::Instant;

use crate::renewal::HeldLease;

/// Starts watching `held`'s deadline.
pub(crate) fn watch(held: &Arc<HeldLease>) {
    deadlines().push(held.valid_until(), Arc::downgrade(held));
}

struct Deadlines {
    queue: Mutex<BinaryHeap<Entry>>,
    wake: Condvar,
}

/// One lease's deadline as last seen; ordered so that the heap's top is the earliest.
struct Entry {
    at: Instant,
    lease: Weak<HeldLease>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        other.at.cmp(&self.at)
    }
}

fn deadlines() -> &'static Deadlines {
    static DEADLINES: OnceLock<&'static Deadlines> = OnceLock::new();
    DEADLINES.get_or_init(|| {
        let deadlines: &'static Deadlines = Box::leak(Box::new(Deadlines {
            queue: Mutex::new(BinaryHeap::new()),
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
    fn push(&self, at: Instant, lease: Weak<HeldLease>) {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let earliest = queue.peek().is_none_or(|top| at < top.at);
        queue.push(Entry { at, lease });
        drop(queue);
        if earliest {
            self.wake.notify_one();
        }
    }

    fn run(&self) {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let now = Instant::now();
            let Some(next) = queue.peek().map(|top| top.at) else {
                queue = self
                    .wake
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            if next > now {
                queue = self
                    .wake
                    .wait_timeout(queue, next - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                continue;
            }
            let due = queue.pop();
            // Not under the queue's lock: firing a signal wakes tasks and logs.
            drop(queue);
            let later = due.and_then(|entry| {
                let held = entry.lease.upgrade()?;
                let at = expire(&held, now)?;
                Some(Entry {
                    at,
                    lease: entry.lease,
                })
            });
            queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = later {
                queue.push(entry);
            }
        }
    }
}

/// [`HeldLease::expire_by`], proof against a backend whose code panics inside it (reporting
/// a loss asks the backend for its name): the thread must outlive it, and the lease is then
/// reported lost without the backend's help.
fn expire(held: &HeldLease, now: Instant) -> Option<Instant> {
    std::panic::catch_unwind(AssertUnwindSafe(|| held.expire_by(now))).unwrap_or_else(|_| {
        tracing::error!("a backend panicked while lockkit reported a lease lost; it is lost");
        held.lost.cancel();
        None
    })
}
