//! The conformance scenarios of fair and non-fair mutexes ([`LockOptions::fair`]): fair
//! waiters are granted in the order they came, a non-fair waiter is woken by a release, and
//! fair and non-fair acquirers of one key exclude each other and leave nothing behind when
//! cancelled. A backend whose locks are queues by construction treats every request as fair,
//! and passes them all the same.
//!
//! [`LockOptions::fair`]: crate::LockOptions::fair

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cancel::cancelled_acquires_leave_nothing_behind;
use super::mutex::exclusion_under_contention;
use super::scenarios::{LONG_TTL, expect_no_leftovers, namespace, options, patience};
use super::{Failure, Harness, Outcome, Recording};
use crate::capabilities::WaitStrategy;
use crate::client::LockClient;

/// Three fair waiters, each queued after the one before it (its first attempt answered),
/// are granted in that order once the holder releases.
pub(super) async fn fair_waiters_are_granted_in_the_order_they_came(h: &dyn Harness) -> Outcome {
    const WAITERS: usize = 3;
    let ns = namespace();
    let holder_client = h.client(&ns, options(h)).await?;
    let holder = holder_client
        .mutex("turns")?
        .lock_timeout(patience(h))
        .await?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut clients = Vec::new();
    let mut waiters = Vec::new();
    for turn in 0..WAITERS {
        let plain = h.client(&ns, options(h)).await?;
        let recording = Arc::new(Recording::new(plain.backend().clone()));
        let client = LockClient::with_options(recording.clone(), &ns, options(h))?;
        let mutex = client.mutex("turns")?;
        let order = order.clone();
        let wait = patience(h) * 2;
        waiters.push(tokio::spawn(async move {
            let guard = mutex.lock_timeout(wait).await?;
            order
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(turn);
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await?;
            Ok::<_, crate::Error>(())
        }));
        // Queued once its first attempt was answered: it then waits, or attempts again.
        let by = Instant::now() + patience(h);
        while recording.count("wait_for_change") == 0 && recording.count("try_acquire") < 2 {
            ensure!(
                Instant::now() < by,
                "waiter {turn} made no attempt within {:?}",
                patience(h)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        clients.push((plain, client));
    }
    holder.release().await?;
    for waiter in waiters {
        tokio::time::timeout(patience(h) * 3, waiter)
            .await
            .map_err(|_| Failure("a fair waiter was never granted".into()))?
            .map_err(|e| Failure(format!("a waiter panicked: {e}")))??;
    }
    let order = order
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    ensure!(
        order == (0..WAITERS).collect::<Vec<_>>(),
        "fair waiters were granted in the order {order:?}, not the order they came"
    );
    for (plain, client) in clients {
        client.close().await;
        plain.close().await;
    }
    holder_client.close().await;
    expect_no_leftovers(h, &ns).await
}

/// A non-fair waiter that would poll too slowly to see the release in time is woken by it.
pub(super) async fn a_non_fair_waiter_is_woken_by_a_release(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let holder_client = h.client(&ns, options(h)).await?;
    if holder_client.capabilities().wait == WaitStrategy::Poll {
        eprintln!("a_non_fair_waiter_is_woken_by_a_release: not applicable, the backend polls");
        return Ok(());
    }
    let waiter_client = h.client(&ns, options(h).with_fair(false)).await?;
    let holder = holder_client
        .mutex("barge")?
        .with_ttl(LONG_TTL)?
        .lock_timeout(patience(h))
        .await?;
    let waiter = waiter_client.mutex("barge")?.with_options(
        options(h)
            .with_fair(false)
            .with_backoff(Duration::from_millis(5), LONG_TTL),
    )?;
    let waiting = tokio::spawn(async move { waiter.lock_timeout(Duration::from_secs(20)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.release().await?;
    let granted = waiting
        .await
        .map_err(|e| Failure(format!("waiter panicked: {e}")))?
        .map_err(|e| {
            Failure(format!(
                "the non-fair waiter was not woken by the release: {e}"
            ))
        })?;
    granted.release().await?;
    expect_no_leftovers(h, &ns).await
}

/// Fair and non-fair acquirers contend for one key: no two critical sections overlap, no
/// update is lost, and tokens increase in grant order.
pub(super) async fn fair_and_non_fair_acquirers_exclude_each_other(h: &dyn Harness) -> Outcome {
    exclusion_under_contention(h, |client| client % 2 == 0).await
}

/// Non-fair acquisitions cut off at every stage leave nothing on the server and do not
/// block the key.
pub(super) async fn cancelled_non_fair_acquisitions_leave_nothing_behind(
    h: &dyn Harness,
) -> Outcome {
    cancelled_acquires_leave_nothing_behind(h, false).await
}
