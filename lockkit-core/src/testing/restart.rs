//! The scenario of a server restart while waiters queue, which a backend runs against a
//! private server of its own.

use std::time::{Duration, Instant};

use super::scenarios::{LONG_TTL, expect_no_leftovers, namespace, options, patience};
use super::{Failure, Harness, Outcome};

/// Eight waiters (in two clients) queue on a held lock while the server restarts; after the
/// holder's release every waiter is granted in turn, each within the cap of one missed
/// notification (`backoff_max`, here 300 ms, plus scheduling slack) after the previous
/// holder began its release, and no two waiters overlap. A backend whose waiters rely on a
/// notification channel must bring it back after the restart (or fall back to polling): a
/// waiter left listening to a dead channel sleeps until the holder's TTL (a minute here).
///
/// `restart` restarts the server (for a cluster, whatever the backend's test calls a
/// restart) and returns once it answers again. The holder's grant may not survive it (a
/// server without persistence forgets it), so the holder's release may find nothing to
/// release; the waiters must be granted either way.
///
/// Call it from the backend's own test (a private server: never restart a shared one):
///
/// ```text
/// lockkit_core::testing::waiters_are_granted_across_a_server_restart(&harness, || async {
///     server.restart().await
/// }).await.unwrap();
/// ```
///
/// # Errors
/// A [`Failure`] saying which waiter was not granted, or granted late, or overlapped.
pub async fn waiters_are_granted_across_a_server_restart<F, Fut>(
    h: &dyn Harness,
    restart: F,
) -> Outcome
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    const WAITERS_PER_CLIENT: usize = 4;
    let cap = Duration::from_millis(300);
    // Scheduling on a loaded machine, a reconnect, an attempt and a release round trip.
    let slack = Duration::from_secs(1);
    let hold = Duration::from_millis(20);
    let ns = namespace();
    let waiting = options(h).with_backoff(Duration::from_millis(5), cap);
    let holder_client = h.client(&ns, options(h)).await?;
    let holder = holder_client
        .mutex("restart")?
        .with_ttl(LONG_TTL)?
        .lock_timeout(patience(h))
        .await?;
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let client = h.client(&ns, waiting.clone()).await?;
        for _ in 0..WAITERS_PER_CLIENT {
            let mutex = client.mutex("restart")?.with_ttl(LONG_TTL)?;
            let wait = patience(h) + LONG_TTL / 2;
            tasks.push(tokio::spawn(async move {
                let guard = mutex.lock_timeout(wait).await?;
                let granted = Instant::now();
                tokio::time::sleep(hold).await;
                let releasing = Instant::now();
                guard.release().await?;
                Ok::<_, crate::error::Error>((granted, releasing))
            }));
        }
    }
    // Let every waiter try once and settle into its wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    restart().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    // Its grant may be gone with the restart: then there is nothing to release.
    let _ = holder.release().await;
    let mut sections = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        let section = task
            .await
            .map_err(|e| Failure(format!("waiter {i} panicked: {e}")))?
            .map_err(|e| Failure(format!("waiter {i} was not granted after the restart: {e}")))?;
        sections.push(section);
    }
    sections.sort();
    let mut previous: Option<Instant> = None;
    for (n, (granted, releasing)) in sections.iter().enumerate() {
        let since = match previous {
            Some(previous) => {
                ensure!(
                    *granted >= previous,
                    "grant {n} came before the previous holder released: two holders"
                );
                previous
            }
            // The first waiter may have been granted before the release (the restart lost
            // the holder's grant).
            None => released.min(*granted),
        };
        let gap = granted.duration_since(since);
        ensure!(
            gap <= cap + slack,
            "grant {n} came {gap:?} after the previous release (cap {cap:?}): a waiter slept through the release"
        );
        previous = Some(*releasing);
    }
    drop(holder_client);
    expect_no_leftovers(h, &ns).await
}
