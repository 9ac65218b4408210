//! In-flight clean-up, once for every backend that keeps records on the server per
//! acquisition (a queue key, a lock node): the table of acquisitions in progress, the
//! ledger of requests whose effect is not known yet, and the background sweeps that remove
//! what a cancelled or failed acquisition left, retried until its requests are settled or
//! the session that owns the records is gone.
//!
//! The core's [`abandon`](crate::backend::LockBackend::abandon) contract says a backend removes
//! everything a request left, "even one whose attempt was still in flight". A request
//! whose future was dropped, or that timed out, may still take effect on the server after
//! the clean-up looked: the clean-up is over only once every request of the acquisition is
//! *settled*, meaning its reply arrived, or a later sweep could see all it may have done.
//! What makes a sweep conclusive is the backend's knowledge (a ZooKeeper `sync` before the
//! listing); this module keeps the books and runs the retries on lockkit's runtime.
//!
//! Backend authors find it as `lockkit_core::backend::cleanup`.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::background::Background;
use crate::error::Result;
use crate::token::OwnerToken;

/// What a backend keeps for each acquisition from its first attempt until it is released
/// or abandoned, by owner token (the token is the same across the attempts of one
/// acquisition, see [`AcquireRequest`](crate::backend::AcquireRequest)).
///
/// `Debug` shows how many acquisitions there are, never their tokens.
pub struct Acquisitions<E> {
    entries: Mutex<HashMap<OwnerToken, E>>,
}

impl<E> Acquisitions<E> {
    /// An empty table.
    pub fn new() -> Self {
        Acquisitions {
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The table, locked. A panic while it was held does not poison it: every entry is
    /// valid on its own. Hold it only between awaits.
    pub fn lock(&self) -> MutexGuard<'_, HashMap<OwnerToken, E>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many acquisitions are in progress or held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

impl<E> Default for Acquisitions<E> {
    fn default() -> Self {
        Acquisitions::new()
    }
}

impl<E> fmt::Debug for Acquisitions<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acquisitions")
            .field("len", &self.len())
            .finish()
    }
}

/// The books of the requests sent for one acquisition (or one session): which were sent,
/// and which of them may still take effect on the server because no reply came.
///
/// A request is registered with [`Ledger::send`] before it goes out; its [`InFlight`] is
/// [`answered`](InFlight::answered) when the reply (or an error that proves it was not
/// applied) arrives. An `InFlight` dropped unanswered (its future was cancelled, it timed
/// out, the connection broke) leaves the request *unsettled*. A sweep that can see
/// everything sent before a [`mark`](Ledger::mark) settles those requests with
/// [`Ledger::settle`].
#[derive(Debug, Default)]
pub struct Ledger {
    next: AtomicU64,
    unsettled: Mutex<BTreeSet<u64>>,
    changed: watch::Sender<u64>,
}

impl Ledger {
    /// A ledger with nothing sent.
    pub fn new() -> Self {
        Ledger::default()
    }

    /// Registers a request about to be sent.
    pub fn send(self: &Arc<Self>) -> InFlight {
        InFlight {
            ledger: self.clone(),
            seq: self.next.fetch_add(1, Ordering::SeqCst),
            answered: false,
        }
    }

    /// The position in the ledger now: every request registered so far is before it. A
    /// sweep that starts after taking the mark and can see all those requests did settles
    /// them with [`Ledger::settle`].
    pub fn mark(&self) -> u64 {
        self.next.load(Ordering::SeqCst)
    }

    /// Whether some request may still take effect.
    pub fn has_unsettled(&self) -> bool {
        !self.unsettled().is_empty()
    }

    /// Whether some request registered before `mark` may still take effect.
    pub fn unsettled_before(&self, mark: u64) -> bool {
        self.unsettled().range(..mark).next().is_some()
    }

    /// Records that a sweep which started after `mark` was taken saw everything the
    /// requests before it may have done: they are settled.
    pub fn settle(&self, mark: u64) {
        let mut unsettled = self.unsettled();
        *unsettled = unsettled.split_off(&mark);
    }

    /// Waits until some request is unsettled (at once if one is).
    pub async fn unsettled_request(&self) {
        let mut changed = self.changed.subscribe();
        while !self.has_unsettled() {
            if changed.changed().await.is_err() {
                return;
            }
        }
    }

    fn unsettled(&self) -> MutexGuard<'_, BTreeSet<u64>> {
        self.unsettled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// One request registered in a [`Ledger`]: unsettled unless [`answered`](InFlight::answered)
/// before it is dropped.
#[derive(Debug)]
#[must_use = "an InFlight dropped at once leaves its request unsettled"]
pub struct InFlight {
    ledger: Arc<Ledger>,
    seq: u64,
    answered: bool,
}

impl InFlight {
    /// The reply arrived (or an error that proves the request was not applied): what the
    /// request did is known.
    pub fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.answered {
            self.ledger.unsettled().insert(self.seq);
            self.ledger.changed.send_modify(|n| *n += 1);
        }
    }
}

/// What one round of a background sweep found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// Everything is cleaned up: the sweep ends.
    Done,
    /// Not yet (a request is still unsettled, or the round is one of a series): the next
    /// round comes after this pause.
    Again(Duration),
}

/// How a background sweep retries a round that failed: doubling pauses, from `first` up to
/// `max`, for as long as the streak of failures is younger than its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// The pause after the first failure.
    pub first: Duration,
    /// The longest pause between two failed rounds.
    pub max: Duration,
    /// How long a streak of failed rounds may last before the sweep gives up (and logs
    /// that the records go with their session or TTL).
    pub budget: Duration,
}

impl Retry {
    /// How long a streak of failed rounds lasts before a sweep gives up, unless
    /// [`Retry::with_budget`] says otherwise: far longer than a failover or a reconnect, short
    /// enough that [`LockClient::close`](crate::LockClient::close) ends.
    pub const DEFAULT_BUDGET: Duration = Duration::from_secs(60);

    /// Doubling pauses from `first` to `max`, for [`Retry::DEFAULT_BUDGET`].
    pub fn new(first: Duration, max: Duration) -> Self {
        Retry {
            first,
            max,
            budget: Self::DEFAULT_BUDGET,
        }
    }

    /// The same pauses, giving up after a streak of failures of `budget`.
    #[must_use]
    pub fn with_budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }
}

/// The clean-up sweeps one backend runs in the background, counted so that its
/// [`LockBackend::idle`](crate::backend::LockBackend::idle), and through it
/// [`LockClient::close`](crate::LockClient::close), can wait for them to end. Cheap to clone:
/// clones count together.
#[derive(Debug, Clone, Default)]
pub struct Sweeps(Background);

impl Sweeps {
    /// No sweeps yet.
    pub fn new() -> Self {
        Sweeps::default()
    }

    /// Runs `round` on lockkit's runtime after `delay`, and again while it answers
    /// [`Sweep::Again`] (after the pause it gives) or fails with a retryable error (after the
    /// `retry` pauses, within its budget), until it answers [`Sweep::Done`], fails for good,
    /// runs out of its retry budget, or `session` is cancelled: the records it would remove
    /// belong to that session and went with it. A failure that ends it is logged (never with
    /// secrets: `what` names the work). The sweep is counted until it ends.
    pub fn spawn<F, Fut>(
        &self,
        what: &'static str,
        session: CancellationToken,
        delay: Duration,
        retry: Retry,
        round: F,
    ) where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Sweep>> + Send + 'static,
    {
        self.0.spawn(sweep(what, session, delay, retry, round));
    }

    /// Waits until no sweep is running.
    pub async fn idle(&self) {
        self.0.idle().await;
    }

    /// How many sweeps are running.
    pub fn running(&self) -> usize {
        self.0.running()
    }
}

async fn sweep<F, Fut>(
    what: &'static str,
    session: CancellationToken,
    delay: Duration,
    retry: Retry,
    mut round: F,
) where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<Sweep>> + Send + 'static,
{
    let mut pause = delay;
    let mut failed = crate::backoff::Backoff::new(retry.first, retry.max);
    let mut failing_since: Option<Instant> = None;
    loop {
        tokio::select! {
            () = session.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        let outcome = tokio::select! {
            () = session.cancelled() => return,
            outcome = round() => outcome,
        };
        match outcome {
            Ok(Sweep::Done) => return,
            Ok(Sweep::Again(next)) => {
                pause = next;
                failed.reset();
                failing_since = None;
            }
            Err(e)
                if e.is_retryable()
                    && failing_since.get_or_insert_with(Instant::now).elapsed() < retry.budget =>
            {
                tracing::debug!(error = %e, what, "a background clean-up failed; retrying");
                pause = failed.next_delay();
            }
            Err(e) => {
                tracing::warn!(error = %e, what, "a background clean-up failed for good; the records go with their session or TTL");
                return;
            }
        }
    }
}

/// Work that must finish even if the future doing it is dropped: unless
/// [`Unfinished::done`] is called, dropping it runs `finish` (which typically hands the
/// work to [`Sweeps::spawn`]). The core does not retry a dropped release, so a backend's
/// release that would leave a record behind (on a session that outlives the lease) guards
/// itself with one.
pub struct Unfinished<F: FnOnce()> {
    finish: Option<F>,
}

impl<F: FnOnce()> Unfinished<F> {
    /// Runs `finish` on drop, unless disarmed by [`Unfinished::done`].
    pub fn new(finish: F) -> Self {
        Unfinished {
            finish: Some(finish),
        }
    }

    /// The work finished: nothing runs on drop.
    pub fn done(mut self) {
        self.finish = None;
    }
}

impl<F: FnOnce()> Drop for Unfinished<F> {
    fn drop(&mut self) {
        if let Some(finish) = self.finish.take() {
            finish();
        }
    }
}

impl<F: FnOnce()> fmt::Debug for Unfinished<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Unfinished")
            .field("armed", &self.finish.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Error, ErrorKind};
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_request_dropped_unanswered_stays_unsettled_until_a_later_sweep_settles_it() {
        let ledger = Arc::new(Ledger::new());
        ledger.send().answered();
        assert!(!ledger.has_unsettled());
        let lost = ledger.send();
        let mark_before = ledger.mark();
        drop(lost);
        assert!(ledger.has_unsettled());
        let after_lost = ledger.mark();
        let later = ledger.send();
        drop(later);
        // A sweep that started before the lost request was sent settles nothing of it.
        ledger.settle(mark_before - 1);
        assert!(ledger.unsettled_before(after_lost));
        ledger.settle(after_lost);
        assert!(!ledger.unsettled_before(after_lost));
        assert!(
            ledger.has_unsettled(),
            "the later request is not settled yet"
        );
        ledger.settle(ledger.mark());
        assert!(!ledger.has_unsettled());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn waiting_for_an_unsettled_request_ends_when_one_is_dropped() {
        let ledger = Arc::new(Ledger::new());
        let waiting = {
            let ledger = ledger.clone();
            tokio::spawn(async move { ledger.unsettled_request().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(ledger.send());
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .expect("join");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_sweep_retries_until_done_and_stops_with_its_session() {
        let sweeps = Sweeps::new();
        let rounds = Arc::new(AtomicUsize::new(0));
        let counted = rounds.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut tx = Some(tx);
        sweeps.spawn(
            "test",
            CancellationToken::new(),
            Duration::ZERO,
            Retry::new(Duration::from_millis(1), Duration::from_millis(4)),
            move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                let done = (n == 3).then(|| tx.take()).flatten();
                async move {
                    match n {
                        0 => Err(Error::new(ErrorKind::Unavailable, "test", "down")),
                        1 | 2 => Ok(Sweep::Again(Duration::from_millis(1))),
                        _ => {
                            if let Some(tx) = done {
                                let _ = tx.send(());
                            }
                            Ok(Sweep::Done)
                        }
                    }
                }
            },
        );
        tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .expect("done")
            .expect("sent");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(rounds.load(Ordering::SeqCst), 4);

        let session = CancellationToken::new();
        let after_loss = Arc::new(AtomicUsize::new(0));
        let counted = after_loss.clone();
        session.cancel();
        sweeps.spawn(
            "test",
            session,
            Duration::ZERO,
            Retry::new(Duration::from_millis(1), Duration::from_millis(1)),
            move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Ok(Sweep::Again(Duration::ZERO)) }
            },
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(after_loss.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_sweep_that_keeps_failing_ends_after_its_budget_and_idle_waits_for_it() {
        let sweeps = Sweeps::new();
        let rounds = Arc::new(AtomicUsize::new(0));
        let counted = rounds.clone();
        sweeps.spawn(
            "test",
            CancellationToken::new(),
            Duration::ZERO,
            Retry::new(Duration::from_millis(1), Duration::from_millis(5))
                .with_budget(Duration::from_millis(100)),
            move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Err(Error::new(ErrorKind::Unavailable, "test", "down")) }
            },
        );
        assert_eq!(sweeps.running(), 1);
        tokio::time::timeout(Duration::from_secs(5), sweeps.idle())
            .await
            .expect("the sweep gave up within its budget");
        assert!(rounds.load(Ordering::SeqCst) > 1, "it was retried");
        assert_eq!(sweeps.running(), 0);
    }

    #[test]
    fn unfinished_work_runs_on_drop_unless_done() {
        let ran = Arc::new(AtomicUsize::new(0));
        let count = ran.clone();
        drop(Unfinished::new(move || {
            count.fetch_add(1, Ordering::SeqCst);
        }));
        let count = ran.clone();
        Unfinished::new(move || {
            count.fetch_add(1, Ordering::SeqCst);
        })
        .done();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }
}
