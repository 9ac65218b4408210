//! W7 semaphore: 16 workers, each with its own client, share a semaphore of 4 permits; each
//! takes a permit, holds it for a fixed time (the work), and gives it back, M times. The
//! ideal is every permit always held: `permits / hold` grants per second. Reported: grants
//! per second and that rate over the ideal, wait p50 and max, and the most holders seen at
//! once (checked in this process; more than 4 fails the workload).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockkit::{LockClient, LockkitConfig};
use serde::Serialize;

use crate::compare_error;

/// The semaphore's permits.
pub(crate) const PERMITS: u32 = 4;
/// How many workers share it.
pub(crate) const WORKERS: usize = 16;
/// How long a worker holds its permit each time.
pub(crate) const HOLD: Duration = Duration::from_millis(5);

#[derive(Debug, Serialize)]
pub(crate) struct PermitThroughput {
    pub(crate) permits: u32,
    pub(crate) workers: usize,
    pub(crate) hold_ms: f64,
    pub(crate) grants: usize,
    pub(crate) grants_per_sec: f64,
    /// `grants_per_sec` over `permits / hold`: 1.0 means no permit was ever idle.
    pub(crate) of_ideal: f64,
    pub(crate) wait_p50_ms: f64,
    pub(crate) wait_max_ms: f64,
    pub(crate) most_holders: usize,
}

/// W7 on one tier; `None` where the backend has no semaphores (Redlock). `url` gives each
/// worker its own client (`None`: the memory tier, one client for all).
pub(crate) async fn permits(
    url: Option<&str>,
    locks: &LockClient,
    iterations: usize,
) -> lockkit::Result<Option<PermitThroughput>> {
    if !locks.capabilities().semaphore.is_supported() {
        return Ok(None);
    }
    let name = crate::run_key("w7-permits");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    let started = Instant::now();
    for _ in 0..WORKERS {
        let client = match url {
            Some(url) => lockkit::connect(&LockkitConfig::from_url(url)?).await?,
            None => locks.clone(),
        };
        let semaphore = client.semaphore(&name, PERMITS)?;
        let (inside, most) = (inside.clone(), most.clone());
        workers.spawn(async move {
            let mut waits = Vec::with_capacity(iterations);
            for _ in 0..iterations {
                let asked = Instant::now();
                let permit = semaphore.acquire_timeout(Duration::from_secs(60)).await?;
                waits.push(asked.elapsed());
                let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now_inside, Ordering::SeqCst);
                tokio::time::sleep(HOLD).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                permit.release().await?;
            }
            client.close().await;
            Ok::<_, lockkit::Error>(waits)
        });
    }
    let mut waits = Vec::with_capacity(WORKERS * iterations);
    while let Some(joined) = workers.join_next().await {
        let worker = joined.map_err(|e| compare_error(format!("a W7 worker panicked: {e}")))?;
        waits.extend(worker?);
    }
    let took = started.elapsed();
    let most_holders = most.load(Ordering::SeqCst);
    if most_holders > PERMITS as usize {
        return Err(compare_error(format!(
            "{most_holders} holders at once of a semaphore of {PERMITS} permits"
        )));
    }
    waits.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let grants_per_sec = waits.len() as f64 / took.as_secs_f64();
    Ok(Some(PermitThroughput {
        permits: PERMITS,
        workers: WORKERS,
        hold_ms: ms(HOLD),
        grants: waits.len(),
        grants_per_sec,
        of_ideal: grants_per_sec * HOLD.as_secs_f64() / f64::from(PERMITS),
        wait_p50_ms: waits.get(waits.len() / 2).copied().map_or(0.0, ms),
        wait_max_ms: waits.last().copied().map_or(0.0, ms),
        most_holders,
    }))
}
