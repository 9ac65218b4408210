//! W1 and W2: speed, uncontended and contended.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockkit::LockClient;

use crate::floors::Floor;
use serde::Serialize;

#[derive(Debug, Serialize)]
pub(crate) struct Uncontended {
    pub(crate) cycles: usize,
    pub(crate) cycles_per_sec: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    /// What the raw floor does, if the backend has one.
    pub(crate) floor: Option<String>,
    pub(crate) floor_p50_us: Option<f64>,
    /// lockkit's p50 over the floor's.
    pub(crate) vs_floor: Option<f64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Contended {
    pub(crate) workers: usize,
    pub(crate) iterations: usize,
    pub(crate) final_value: u64,
    pub(crate) lost_updates: u64,
    pub(crate) increments_per_sec: f64,
    pub(crate) wait_p50_us: f64,
    pub(crate) wait_p99_us: f64,
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

/// W1, in rounds that alternate with the backend's raw floor (when it has one), so that noise
/// on a shared machine hits both alike.
pub(crate) async fn uncontended(
    locks: &LockClient,
    mut floor: Option<&mut Floor>,
    cycles: usize,
) -> lockkit::Result<Uncontended> {
    const ROUNDS: usize = 4;
    let mutex = locks.mutex("w1-uncontended")?;
    let mut samples = Vec::with_capacity(cycles);
    let mut floor_samples = Vec::with_capacity(cycles);
    let mut busy = Duration::ZERO;
    for round in 0..ROUNDS {
        let chunk = cycles / ROUNDS + usize::from(round < cycles % ROUNDS);
        let started = Instant::now();
        for _ in 0..chunk {
            let t = Instant::now();
            let guard = mutex.lock().await?;
            guard.release().await?;
            samples.push(t.elapsed());
        }
        busy += started.elapsed();
        if let Some(floor) = floor.as_deref_mut() {
            for _ in 0..chunk {
                let t = Instant::now();
                floor
                    .cycle()
                    .await
                    .map_err(|e| crate::compare_error(format!("floor: {e}")))?;
                floor_samples.push(t.elapsed());
            }
        }
    }
    samples.sort();
    floor_samples.sort();
    let p50_us = percentile(&samples, 0.50);
    let floor_p50_us = floor.is_some().then(|| percentile(&floor_samples, 0.50));
    Ok(Uncontended {
        cycles,
        cycles_per_sec: cycles as f64 / busy.as_secs_f64(),
        p50_us,
        p99_us: percentile(&samples, 0.99),
        floor: floor.map(|f| f.describe().to_owned()),
        floor_p50_us,
        vs_floor: floor_p50_us.map(|f| p50_us / f),
    })
}

pub(crate) async fn contended(
    locks: &LockClient,
    workers: usize,
    iterations: usize,
) -> lockkit::Result<Contended> {
    let shared = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (locks, shared) = (locks.clone(), shared.clone());
        tasks.spawn(async move {
            let mutex = locks.mutex("w2-counter")?;
            let mut waits = Vec::with_capacity(iterations);
            for _ in 0..iterations {
                let t = Instant::now();
                let guard = mutex.lock().await?;
                waits.push(t.elapsed());
                let seen = shared.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                shared.store(seen + 1, Ordering::SeqCst);
                guard.release().await?;
            }
            lockkit::Result::Ok(waits)
        });
    }
    let mut waits = Vec::with_capacity(workers * iterations);
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(worker) => waits.extend(worker?),
            Err(e) => panic!("a worker panicked: {e}"),
        }
    }
    let total = started.elapsed();
    waits.sort();
    let expected = (workers * iterations) as u64;
    let final_value = shared.load(Ordering::SeqCst);
    Ok(Contended {
        workers,
        iterations,
        final_value,
        lost_updates: expected.saturating_sub(final_value),
        increments_per_sec: final_value as f64 / total.as_secs_f64(),
        wait_p50_us: percentile(&waits, 0.50),
        wait_p99_us: percentile(&waits, 0.99),
    })
}
