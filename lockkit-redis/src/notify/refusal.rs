//! The refusal policy: after a server refused release notifications, or could not be reached
//! to take a subscription, its waiters poll for a while instead of asking again on every wait.

use std::sync::{Mutex as StdMutex, PoisonError};
use std::time::{Duration, Instant};

/// How long waiters poll instead of subscribing after a server refused a subscription.
const POLL_AFTER_REFUSAL: Duration = Duration::from_secs(30);

/// How long waiters poll after a subscription failed for want of a connection (the server
/// restarting, say): the pub/sub connection is being recovered meanwhile.
const POLL_AFTER_OUTAGE: Duration = Duration::from_secs(1);

/// Whether a server lately refused release notifications: then waiters poll for
/// [`POLL_AFTER_REFUSAL`] instead of asking it again on every wait.
#[derive(Debug, Default)]
pub(crate) struct Refusal {
    until: StdMutex<Option<Instant>>,
}

impl Refusal {
    /// Whether subscriptions may be asked for now.
    pub(crate) fn allows(&self) -> bool {
        let mut until = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        if until.is_some_and(|until| Instant::now() >= until) {
            *until = None;
        }
        until.is_none()
    }

    /// Records a failed subscription: polling for [`POLL_AFTER_REFUSAL`] after a refusal,
    /// for [`POLL_AFTER_OUTAGE`] when the server could not be reached. True if it is the
    /// first since notifications last worked.
    pub(crate) fn refused(&self, error: &lockkit_core::Error) -> bool {
        let pause = if error.kind() == lockkit_core::ErrorKind::Unavailable {
            POLL_AFTER_OUTAGE
        } else {
            POLL_AFTER_REFUSAL
        };
        let mut until = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        let first = until.is_none();
        *until = Some(Instant::now() + pause);
        first
    }
}
