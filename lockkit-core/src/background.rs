//! The background work of one client, so that [`LockClient::close`](crate::LockClient::close)
//! can wait for it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

use crate::backend::runtime;

/// Counts the tasks a client (and its clones, mutexes and guards) runs in the background on
/// lockkit's runtime: releases of dropped guards, releases whose caller stopped waiting, the
/// clean-up of cancelled acquisitions.
#[derive(Clone, Default)]
pub(crate) struct Background(Arc<Tasks>);

#[derive(Default)]
struct Tasks {
    running: AtomicUsize,
    idle: Notify,
}

impl Background {
    /// Runs `task` on lockkit's runtime, counted until it ends (or is dropped unfinished,
    /// when that runtime shuts down).
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let ticket = Ticket::new(self.clone());
        runtime::spawn(async move {
            task.await;
            drop(ticket);
        });
    }

    /// Waits until no counted task is running.
    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.0.idle.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the count is read, so a task ending in between still wakes us.
            notified.as_mut().enable();
            if self.0.running.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// How many counted tasks are running.
    pub(crate) fn running(&self) -> usize {
        self.0.running.load(Ordering::Acquire)
    }
}

impl fmt::Debug for Background {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Background")
            .field("running", &self.running())
            .finish()
    }
}

/// One running task's share of the count.
struct Ticket(Background);

impl Ticket {
    fn new(background: Background) -> Self {
        background.0.running.fetch_add(1, Ordering::AcqRel);
        Ticket(background)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.0.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.0.idle.notify_waiters();
        }
    }
}
