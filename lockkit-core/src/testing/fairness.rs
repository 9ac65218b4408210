//! The conformance scenarios of fair and non-fair mutexes and semaphores
//! ([`LockOptions::fair`]) and of waiting writers: fair waiters and writers are granted in the
//! order they came, a non-fair waiter is woken by a release, and fair and non-fair acquirers
//! of one key exclude each other and leave nothing behind when cancelled. A backend whose
//! locks are queues by construction treats every request as fair, and passes them all the
//! same.
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
    granted_in_the_order_they_came(h, Queued::Mutex).await
}

/// Three fair waiters of a semaphore of two permits, one held throughout and one cycling
/// between them, each queued after the one before it, are granted in that order: a permit
/// that frees up goes to the first, never to a later one.
pub(super) async fn fair_permit_waiters_are_granted_in_the_order_they_came(
    h: &dyn Harness,
) -> Outcome {
    granted_in_the_order_they_came(h, Queued::Permit).await
}

/// Three writers, each queued after the one before it while a reader holds, are granted in
/// that order once the reader leaves (whatever `fair` says: writers queue).
pub(super) async fn waiting_writers_are_granted_in_the_order_they_came(h: &dyn Harness) -> Outcome {
    granted_in_the_order_they_came(h, Queued::Write).await
}

/// What the waiters of [`granted_in_the_order_they_came`] queue for.
#[derive(Debug, Clone, Copy)]
enum Queued {
    Mutex,
    /// A permit of a semaphore of two, the other held throughout.
    Permit,
    /// A read-write lock's write lock (its first holder reads).
    Write,
}

/// A mutex guard, a permit or a read-write lock's guard.
enum Held {
    Lock(crate::MutexGuard),
    Permit(crate::semaphore::Permit),
    Read(crate::rwlock::ReadGuard),
    Write(crate::rwlock::WriteGuard),
}

impl Queued {
    const NAME: &'static str = "turns";

    /// Whether `client`'s backend has what is queued for.
    fn supported(self, client: &LockClient) -> bool {
        match self {
            Queued::Mutex => true,
            Queued::Permit => client.capabilities().semaphore.is_supported(),
            Queued::Write => client.capabilities().rwlock.is_supported(),
        }
    }

    /// Takes what the first holder takes with `client` within `wait`: a read lock where the
    /// waiters write, else what they queue for.
    async fn take_first(self, client: &LockClient, wait: Duration) -> crate::Result<Held> {
        match self {
            Queued::Write => Ok(Held::Read(
                client.rwlock(Self::NAME)?.read_timeout(wait).await?,
            )),
            _ => self.take(client, wait).await,
        }
    }

    /// Takes what is queued for with `client` within `wait`.
    async fn take(self, client: &LockClient, wait: Duration) -> crate::Result<Held> {
        Ok(match self {
            Queued::Write => Held::Write(client.rwlock(Self::NAME)?.write_timeout(wait).await?),
            Queued::Mutex => Held::Lock(client.mutex(Self::NAME)?.lock_timeout(wait).await?),
            Queued::Permit => Held::Permit(
                client
                    .semaphore(Self::NAME, 2)?
                    .acquire_timeout(wait)
                    .await?,
            ),
        })
    }
}

impl Held {
    async fn release(self) -> crate::Result<bool> {
        match self {
            Held::Lock(guard) => guard.release().await,
            Held::Permit(permit) => permit.release().await,
            Held::Read(guard) => guard.release().await,
            Held::Write(guard) => guard.release().await,
        }
    }
}

/// The scenario of [`fair_waiters_are_granted_in_the_order_they_came`] for `queued`: each
/// waiter holds for 20 ms, so the next is granted only after it.
async fn granted_in_the_order_they_came(h: &dyn Harness, queued: Queued) -> Outcome {
    const WAITERS: usize = 3;
    let ns = namespace();
    let holder_client = h.client(&ns, options(h)).await?;
    if !queued.supported(&holder_client) {
        return Ok(());
    }
    let holder = queued.take_first(&holder_client, patience(h)).await?;
    // A semaphore's second permit, held throughout: one permit cycles between the waiters.
    let steady = match queued {
        Queued::Permit => Some(queued.take(&holder_client, patience(h)).await?),
        Queued::Mutex | Queued::Write => None,
    };
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut clients = Vec::new();
    let mut waiters = Vec::new();
    for turn in 0..WAITERS {
        let plain = h.client(&ns, options(h)).await?;
        let recording = Arc::new(Recording::new(plain.backend().clone()));
        let client = LockClient::with_options(recording.clone(), &ns, options(h))?;
        let order = order.clone();
        let wait = patience(h) * 2;
        let waiter_client = client.clone();
        waiters.push(tokio::spawn(async move {
            let held = queued.take(&waiter_client, wait).await?;
            order
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(turn);
            tokio::time::sleep(Duration::from_millis(20)).await;
            held.release().await?;
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
    if let Some(steady) = steady {
        steady.release().await?;
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
