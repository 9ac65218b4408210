//! Ordered, cancel-proof delivery of the requests that change one lock on one Redlock node.
//!
//! Redlock answers as soon as a majority of nodes decided; the other nodes' requests must
//! still reach them, and in the order they were made: a rollback or release that overtakes
//! its own acquire on a slow node deletes nothing, and the acquire that lands after it keeps
//! the key there until its TTL. Two things can reorder or lose a request on a multiplexed
//! redis-rs connection: a request future dropped (or timed out by the client) before the
//! connection's driver wrote it is never sent at all, and requests waiting for a reconnect
//! are sent in whatever order their futures are polled.
//!
//! So every such request runs in a task of its own on lockkit's runtime, in a *lane* per
//! acquisition (lock key and owner): it starts only when the lane's previous request has
//! finished (answered, failed, or given up at its deadline), and it lives until it is
//! answered or until its deadline, the lock's TTL after it was made; by then whatever it
//! could still do on the server has expired with the TTL anyway. The caller waits for the
//! answer as long as it likes; not waiting changes nothing about what is sent. Requests of
//! different acquisitions need no order between them (the scripts decide by owner), so a
//! holder's release never queues behind the retries of the lock's waiters.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex as StdMutex;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::oneshot;
use tokio::time::Instant;

/// The lanes of one node, one per acquisition that has requests in flight.
#[derive(Debug, Default)]
pub(crate) struct Lanes {
    tails: StdMutex<HashMap<String, Tail>>,
    ids: AtomicU64,
}

/// The last request submitted to a lane: the next one waits for `done`.
#[derive(Debug)]
struct Tail {
    id: u64,
    /// Resolves (with an error) when that request's task ends, however it ends.
    done: oneshot::Receiver<()>,
}

/// Why a laned request has no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Undelivered {
    /// The deadline passed before the request was answered (it may still have been applied).
    Deadline,
    /// The task running the request ended without an answer (lockkit's runtime shut down).
    Gone,
}

impl Lanes {
    /// Runs `request` on lockkit's runtime after every request submitted earlier to `lane`
    /// has finished, and gives up on it at `deadline` (a request not written to its
    /// connection by then is never sent). The answer comes through the returned receiver;
    /// dropping the receiver does not cancel the request.
    ///
    /// `request` must not do anything before it is first polled (an `async` block).
    pub(crate) fn submit<T, Fut>(
        self: &std::sync::Arc<Self>,
        lane: &str,
        deadline: Instant,
        request: Fut,
    ) -> impl Future<Output = Result<T, Undelivered>> + Send + use<T, Fut>
    where
        T: Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let (finished, done) = oneshot::channel();
        let previous = self
            .tails()
            .insert(lane.to_owned(), Tail { id, done })
            .map(|tail| tail.done);
        let (answer, answered) = oneshot::channel();
        let lanes = self.clone();
        let lane = lane.to_owned();
        lockkit_core::backend::runtime::spawn(async move {
            let outcome = tokio::time::timeout_at(deadline, async move {
                if let Some(previous) = previous {
                    // An error only means the previous request's task ended: our turn.
                    let _ = previous.await;
                }
                request.await
            })
            .await
            .map_err(|_| Undelivered::Deadline);
            lanes.finish(&lane, id);
            drop(finished);
            let _ = answer.send(outcome);
        });
        async move { answered.await.unwrap_or(Err(Undelivered::Gone)) }
    }

    /// Forgets the lane if `id` is still its last request, so idle lanes take no memory.
    fn finish(&self, lane: &str, id: u64) {
        let mut tails = self.tails();
        if tails.get(lane).is_some_and(|tail| tail.id == id) {
            tails.remove(lane);
        }
    }

    fn tails(&self) -> std::sync::MutexGuard<'_, HashMap<String, Tail>> {
        self.tails.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many lanes have requests in flight.
    #[cfg(test)]
    fn busy(&self) -> usize {
        self.tails().len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_lane_runs_its_requests_in_order_even_when_nobody_waits() {
        let lanes = Arc::new(Lanes::default());
        let log = Arc::new(Mutex::new(Vec::new()));
        let deadline = Instant::now() + Duration::from_secs(10);
        let slow = {
            let log = log.clone();
            lanes.submit("k", deadline, async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                log.lock().unwrap().push("acquire");
            })
        };
        // Nobody waits for the first answer: it is still delivered, before the second.
        drop(slow);
        let log2 = log.clone();
        lanes
            .submit("k", deadline, async move {
                log2.lock().unwrap().push("release");
            })
            .await
            .unwrap();
        assert_eq!(*log.lock().unwrap(), ["acquire", "release"]);
        assert_eq!(lanes.busy(), 0, "an idle lane is forgotten");
    }

    #[tokio::test]
    async fn other_lanes_do_not_wait() {
        let lanes = Arc::new(Lanes::default());
        let deadline = Instant::now() + Duration::from_secs(10);
        let _stuck = lanes.submit("a", deadline, std::future::pending::<()>());
        let other = lanes.submit("b", deadline, async { 7 });
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(5), other)
                .await
                .unwrap(),
            Ok(7)
        );
    }

    #[tokio::test]
    async fn a_request_is_given_up_at_its_deadline_and_the_lane_moves_on() {
        let lanes = Arc::new(Lanes::default());
        let soon = Instant::now() + Duration::from_millis(50);
        let stuck = lanes.submit("k", soon, std::future::pending::<()>());
        let next = lanes.submit("k", soon + Duration::from_secs(10), async { 1 });
        assert_eq!(stuck.await, Err(Undelivered::Deadline));
        assert_eq!(next.await, Ok(1));
    }
}
