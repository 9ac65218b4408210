//! Scenarios of the queue backends ([`WaitStrategy::Queue`]): a waiter costs the servers
//! nothing while the lock stays held, and every fault that could hide the predecessor's
//! departure from it (a cut connection, an expired session) still ends its wait.
//!
//! They take hooks or clients from the backend's own test, so they are not in
//! [`SCENARIOS`](super::SCENARIOS).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::proxy::{Direction, Fault, FaultProxy};
use super::scenarios::{namespace, options, patience};
use super::{Failure, Harness, Outcome, Recording};
use crate::capabilities::WaitStrategy;
use crate::client::LockClient;
use crate::guard::MutexGuard;

/// A queue waiter asks its backend for one attempt and one wait, and nothing more, while
/// the lock stays held for three TTLs: its wait ends on the predecessor's release, not on a
/// timer, so the servers' load does not grow with the time or the number of waiters. After
/// the release it is granted with its second attempt.
///
/// # Errors
/// A [`Failure`] with the calls the waiter made, or when it was not granted.
pub async fn a_queue_waiter_sends_nothing_while_the_lock_is_held(h: &dyn Harness) -> Outcome {
    let ns = namespace();
    let holder_client = h.client(&ns, options(h)).await?;
    if holder_client.capabilities().wait != WaitStrategy::Queue {
        return Ok(());
    }
    let plain = h.client(&ns, options(h)).await?;
    let recording = Arc::new(Recording::new(plain.backend().clone()));
    let waiter_client = LockClient::with_options(recording.clone(), &ns, options(h))?;
    let holder = holder_client
        .mutex("quiet")?
        .lock_timeout(patience(h))
        .await?;
    let mutex = waiter_client.mutex("quiet")?;
    let wait = patience(h) + h.ttl() * 3;
    let waiter = tokio::spawn(async move { mutex.lock_timeout(wait).await });
    tokio::time::sleep(h.ttl() * 3).await;
    let attempts = recording.count("try_acquire");
    let waits = recording.count("wait_for_change");
    if (attempts, waits) != (1, 1) {
        return Err(Failure(format!(
            "the waiter made {attempts} attempts and {waits} waits in three TTLs while the lock was held (1 and 1 expected): {:?}",
            recording.calls()
        )));
    }
    holder.release().await?;
    let granted = tokio::time::timeout(patience(h), waiter)
        .await
        .map_err(|_| Failure("the release did not wake the waiter".into()))?
        .map_err(|e| Failure(format!("the waiter panicked: {e}")))??;
    granted.release().await?;
    waiter_client.close().await;
    plain.close().await;
    holder_client.close().await;
    Ok(())
}

/// How long a queue waiter took to be granted after a fault (see
/// [`a_queue_waiter_is_granted_after`]).
#[derive(Debug, Clone, Copy)]
pub struct AfterFault {
    /// From the end of `fault` to the grant.
    pub granted_after: Duration,
}

/// `holder` takes the key `"after-fault"`, `waiter` queues behind it, then `fault` runs with
/// the holder's guard: it does something to the waiter (cuts its connection, expires its
/// session, hides the release from it) and releases the guard at a moment of its choosing.
/// The waiter must then be granted, with a fencing token above the holder's, within the
/// waiter's patience (`4 × TTL + 10 s`, the TTL of `waiter`'s options): a fault that left its
/// wait hanging makes it time out instead.
///
/// # Errors
/// A [`Failure`] when the waiter was not granted, or granted out of order.
pub async fn a_queue_waiter_is_granted_after<F, Fut>(
    holder: &LockClient,
    waiter: &LockClient,
    fault: F,
) -> Result<AfterFault, Failure>
where
    F: FnOnce(MutexGuard) -> Fut,
    Fut: Future<Output = ()>,
{
    let ttl = waiter.options().ttl;
    let patience = ttl * 4 + Duration::from_secs(10);
    let held = holder.mutex("after-fault")?.lock_timeout(patience).await?;
    let held_token = held.fencing_token();
    let mutex = waiter.mutex("after-fault")?;
    let waiting = tokio::spawn(async move { mutex.lock_timeout(patience).await });
    // Queueing is a round trip or two; a waiter still queueing when the fault starts only
    // makes the fault hit its attempt instead of its wait.
    tokio::time::sleep(Duration::from_millis(500)).await;
    if waiting.is_finished() {
        return Err(Failure("the waiter did not wait for the holder".into()));
    }
    fault(held).await;
    let fault_over = Instant::now();
    let granted = waiting
        .await
        .map_err(|e| Failure(format!("the waiter panicked: {e}")))?
        .map_err(|e| {
            Failure(format!(
                "the waiter was not granted after the fault: {}",
                e.display_chain()
            ))
        })?;
    let granted_after = fault_over.elapsed();
    if granted.fencing_token() <= held_token {
        return Err(Failure(format!(
            "the waiter's token {} is not above the holder's {held_token}",
            granted.fencing_token()
        )));
    }
    granted.release().await?;
    Ok(AfterFault { granted_after })
}

/// [`a_queue_waiter_is_granted_after`] with the waiter's connection (through `proxy`) reset
/// while it waits, and the release 200 ms later: the client reconnects within its session and
/// sets its watch again.
///
/// # Errors
/// As [`a_queue_waiter_is_granted_after`].
pub async fn a_waiter_whose_connection_is_reset_is_granted(
    holder: &LockClient,
    waiter: &LockClient,
    proxy: &FaultProxy,
) -> Result<AfterFault, Failure> {
    a_queue_waiter_is_granted_after(holder, waiter, |held| async move {
        proxy.reset();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let released = held.release().await;
        assert!(
            matches!(released, Ok(true)),
            "the holder's release: {released:?}"
        );
    })
    .await
}

/// [`a_queue_waiter_is_granted_after`] with the waiter's link (through `proxy`) dead across
/// the release, so the predecessor's departure never reaches it there; `down` after the
/// release the link heals with its connections reset, as a host coming back does.
///
/// # Errors
/// As [`a_queue_waiter_is_granted_after`].
pub async fn a_waiter_cut_off_across_the_release_is_granted(
    holder: &LockClient,
    waiter: &LockClient,
    proxy: &FaultProxy,
    down: Duration,
) -> Result<AfterFault, Failure> {
    a_queue_waiter_is_granted_after(holder, waiter, |held| async move {
        proxy.set(Direction::Both, Fault::Blackhole);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = held.release().await;
        assert!(
            matches!(released, Ok(true)),
            "the holder's release: {released:?}"
        );
        tokio::time::sleep(down).await;
        proxy.heal();
        proxy.reset();
    })
    .await
}
