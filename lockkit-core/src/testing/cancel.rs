//! The conformance scenarios of cancel safety and background work: acquisitions and
//! releases dropped in flight, waiters that give up, guards dropped without a release, and
//! `LockClient::close` waiting for what they left running.

use std::time::{Duration, Instant};

use super::scenarios::{LONG_TTL, clients, expect_no_leftovers, namespace, options, patience};
use super::{Failure, Harness, Outcome};
use crate::capabilities::WaitStrategy;

/// An acquisition whose future is dropped while its request is in flight (a queue entry
/// being created behind a holder, or the grant of a free lock on its way back) leaves
/// nothing once its clean-up has run, however late the request takes effect: the queue
/// shows the holder alone, and the next acquirer gets the lock promptly. The dropped
/// acquisitions ask for a 60 s TTL, so a leftover would block the key far longer.
pub(super) async fn an_acquisition_dropped_in_flight_leaves_nothing_behind(
    h: &dyn Harness,
) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 3).await?;
    let holder = clients[0]
        .mutex("in-flight")?
        .lock_timeout(patience(h))
        .await?;
    // Cut at points spread over a round trip, so some requests are on their way.
    for round in 0..20u64 {
        let contender = clients[1].mutex("in-flight")?.with_ttl(LONG_TTL)?;
        let _ = tokio::time::timeout(Duration::from_micros(round * 500), contender.lock()).await;
    }
    let deadline = Instant::now() + patience(h);
    loop {
        let Some(info) = clients[2].inspect("in-flight").await? else {
            return Err(Failure("the holder's lock vanished".into()));
        };
        if info.waiters.unwrap_or(0) == 0 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "dropped acquisitions left {:?} queue entries behind the holder",
            info.waiters
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    holder.release().await?;
    for round in 0..20u64 {
        let racer = clients[1].mutex("in-flight")?.with_ttl(LONG_TTL)?;
        if let Ok(won) =
            tokio::time::timeout(Duration::from_micros(round * 500), racer.lock()).await
        {
            drop(won?);
        }
    }
    let next = clients[2]
        .mutex("in-flight")?
        .lock_timeout(Duration::from_secs(15))
        .await
        .map_err(|e| {
            Failure(format!(
                "the key stayed blocked after acquisitions dropped in flight: {e}"
            ))
        })?;
    // The racers' clean-ups run in the background: once they are done, nothing of theirs
    // may be left, however late their requests landed.
    clients[1].close().await;
    let deadline = Instant::now() + patience(h);
    loop {
        let queued = clients[2]
            .inspect("in-flight")
            .await?
            .and_then(|i| i.waiters);
        if queued.unwrap_or(0) == 0 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "queue entries left behind the next holder: {queued:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    next.release().await?;
    expect_no_leftovers(h, &ns).await
}

/// Acquisitions cancelled at any point (while waiting, while giving up, or racing the grant)
/// leave nothing that could block the key: with a 60 s TTL on the cancelled side, a leftover
/// would block.
pub(super) async fn cancelled_acquire_leaves_nothing_behind(h: &dyn Harness) -> Outcome {
    cancelled_acquires_leave_nothing_behind(h, true).await
}

/// [`cancelled_acquire_leaves_nothing_behind`], with fair or non-fair mutexes.
pub(super) async fn cancelled_acquires_leave_nothing_behind(
    h: &dyn Harness,
    fair: bool,
) -> Outcome {
    let ns = namespace();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(h.client(&ns, options(h).with_fair(fair)).await?);
    }
    let holder = clients[0]
        .mutex("cancel")?
        .lock_timeout(patience(h))
        .await?;
    let waiter = clients[1].mutex("cancel")?.with_ttl(LONG_TTL)?;
    ensure!(
        tokio::time::timeout(Duration::from_millis(200), waiter.lock())
            .await
            .is_err(),
        "a waiter got a held lock"
    );
    for round in 0..10u64 {
        let cut_after = Duration::from_micros(round * 700);
        let contender = clients[1].mutex("cancel")?.with_ttl(LONG_TTL)?;
        let _ = tokio::time::timeout(cut_after, contender.try_lock()).await;
        let _ =
            tokio::time::timeout(cut_after, contender.lock_timeout(Duration::from_millis(5))).await;
    }
    holder.release().await?;
    for round in 0..10u64 {
        let racer = clients[1].mutex("cancel")?.with_ttl(LONG_TTL)?;
        let cut_after = Duration::from_micros(round * 700);
        if let Ok(won) = tokio::time::timeout(cut_after, racer.lock()).await {
            drop(won?);
        }
    }
    let next = clients[2]
        .mutex("cancel")?
        .lock_timeout(Duration::from_secs(15))
        .await;
    let next = next.map_err(|e| {
        Failure(format!(
            "the key stayed blocked after cancelled acquisitions: {e}"
        ))
    })?;
    next.release().await?;
    expect_no_leftovers(h, &ns).await
}

/// A dropped guard is released in the background, long before its TTL.
pub(super) async fn dropped_guard_releases_in_background(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let guard = clients[0]
        .mutex("dropped")?
        .with_ttl(LONG_TTL)?
        .lock_timeout(patience(h))
        .await?;
    drop(guard);
    let next = clients[1]
        .mutex("dropped")?
        .lock_timeout(Duration::from_secs(15))
        .await;
    let next = next.map_err(|e| Failure(format!("a dropped guard was not released: {e}")))?;
    next.release().await?;
    expect_no_leftovers(h, &ns).await
}

/// `close` returns only once the release of a dropped guard is done: right after it, another
/// client takes the lock without waiting (the grant asked for a minute's TTL).
pub(super) async fn close_waits_for_the_release_of_a_dropped_guard(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let guard = clients[0]
        .mutex("closing")?
        .with_ttl(LONG_TTL)?
        .lock_timeout(patience(h))
        .await?;
    drop(guard);
    clients[0].close().await;
    let next = clients[1].mutex("closing")?.try_lock().await?;
    let Some(next) = next else {
        return Err(Failure(
            "the lock was still held after close returned: close did not wait for the release"
                .into(),
        ));
    };
    next.release().await?;
    expect_no_leftovers(h, &ns).await
}

/// Two waiters of one client; the holder releases and the first waiter is cancelled at the
/// same moment. Whichever of them the release woke, the second must be granted: a cancelled
/// waiter must not swallow the wake-up (the holder's 60 s TTL cannot rescue it).
pub(super) async fn a_cancelled_waiter_does_not_hold_up_the_next(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    if clients[0].capabilities().wait == WaitStrategy::Poll {
        eprintln!(
            "a_cancelled_waiter_does_not_hold_up_the_next: not applicable, the backend polls"
        );
        return Ok(());
    }
    let holder = clients[0]
        .mutex("handoff")?
        .with_ttl(LONG_TTL)?
        .lock_timeout(patience(h))
        .await?;
    let waiter = || -> std::result::Result<_, Failure> {
        let mutex = clients[1]
            .mutex("handoff")?
            .with_options(options(h).with_backoff(Duration::from_millis(5), LONG_TTL))?;
        Ok(tokio::spawn(async move {
            mutex.lock_timeout(Duration::from_secs(20)).await
        }))
    };
    let first = waiter()?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = waiter()?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.release().await?;
    // Let a woken first waiter run into its retry before it is cancelled.
    tokio::time::sleep(Duration::from_millis(1)).await;
    first.abort();
    // It may have been granted before the cancel arrived: then it hands over by releasing.
    if let Ok(Ok(guard)) = first.await {
        guard.release().await?;
    }
    let granted = second
        .await
        .map_err(|e| Failure(format!("the second waiter panicked: {e}")))?
        .map_err(|e| Failure(format!("the second waiter was not granted: {e}")))?;
    granted.release().await?;
    expect_no_leftovers(h, &ns).await
}

/// A `release()` whose future is dropped before it completes (a timeout around it, or around
/// `with_lock`) still releases in the background: the next acquirer is granted long before the
/// holder's TTL would have freed the key.
pub(super) async fn a_cancelled_release_still_releases(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let clients = clients(h, &ns, 2).await?;
    let guard = clients[0]
        .mutex("cancelled-release")?
        .with_ttl(LONG_TTL)?
        .lock_timeout(patience(h))
        .await?;
    // Polled once, then dropped: the release is on its way but unanswered.
    let _ = tokio::time::timeout(Duration::ZERO, guard.release()).await;
    let next = clients[1]
        .mutex("cancelled-release")?
        .lock_timeout(Duration::from_secs(15))
        .await
        .map_err(|e| {
            Failure(format!(
                "a release whose future was dropped did not happen: {e}"
            ))
        })?;
    next.release().await?;
    expect_no_leftovers(h, &ns).await
}

// Scenarios that take a hook from the backend's test, so they are not in `SCENARIOS`: the
// backend's test calls them with its harness and the hook.
