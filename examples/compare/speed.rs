//! W1 and W2: speed, uncontended and contended.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockkit::{LockClient, Mutex};

use crate::floors::{BoxError, ContendedFloor, Contender, Floor};
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
    /// The tier W1 was also run on in the same rounds, to compare tiers without the drift
    /// between their runs (single-node Redis, for the other Redis tiers).
    pub(crate) reference: Option<String>,
    pub(crate) reference_p50_us: Option<f64>,
    /// lockkit's p50 on this tier over its p50 on the reference tier.
    pub(crate) vs_reference: Option<f64>,
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
    /// What the raw floor does, if the backend has one.
    pub(crate) floor: Option<String>,
    /// The floor's shortfall from the expected final value (a broken floor, if not 0).
    pub(crate) floor_lost_updates: Option<u64>,
    pub(crate) floor_increments_per_sec: Option<f64>,
    pub(crate) floor_wait_p50_us: Option<f64>,
    pub(crate) floor_wait_p99_us: Option<f64>,
    /// The floor's increments per second over lockkit's: lockkit's time per increment over
    /// the floor's, so that above 1 lockkit is slower, as for W1.
    pub(crate) vs_floor: Option<f64>,
    /// lockkit's wait p50 over the floor's.
    pub(crate) wait_p50_vs_floor: Option<f64>,
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

/// A tier to run W1 on in the same rounds as another: its name for the table and its client.
pub(crate) struct Reference<'a> {
    pub(crate) name: &'static str,
    pub(crate) locks: &'a LockClient,
}

/// W1, in rounds that alternate with the backend's raw floor (when it has one) and with the
/// reference tier (when given), so that noise on a shared machine hits them all alike.
pub(crate) async fn uncontended(
    locks: &LockClient,
    mut floor: Option<&mut Floor>,
    reference: Option<Reference<'_>>,
    cycles: usize,
) -> lockkit::Result<Uncontended> {
    // Short rounds, so that drift (a disk's fsync latency, a neighbour's load) hits the
    // contestants alike.
    const ROUNDS: usize = 20;
    let mutex = locks.mutex("w1-uncontended")?;
    let reference_mutex = match &reference {
        Some(reference) => Some(reference.locks.mutex("w1-reference")?),
        None => None,
    };
    let mut samples = Vec::with_capacity(cycles);
    let mut floor_samples = Vec::with_capacity(cycles);
    let mut reference_samples = Vec::with_capacity(cycles);
    let mut busy = Duration::ZERO;
    for round in 0..ROUNDS {
        let chunk = cycles / ROUNDS + usize::from(round < cycles % ROUNDS);
        let started = Instant::now();
        timed_cycles(&mutex, chunk, &mut samples).await?;
        busy += started.elapsed();
        if let Some(reference_mutex) = &reference_mutex {
            timed_cycles(reference_mutex, chunk, &mut reference_samples).await?;
        }
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
    reference_samples.sort();
    let p50_us = percentile(&samples, 0.50);
    let floor_p50_us = floor.is_some().then(|| percentile(&floor_samples, 0.50));
    let reference_p50_us = reference
        .is_some()
        .then(|| percentile(&reference_samples, 0.50));
    Ok(Uncontended {
        cycles,
        cycles_per_sec: cycles as f64 / busy.as_secs_f64(),
        p50_us,
        p99_us: percentile(&samples, 0.99),
        floor: floor.map(|f| f.describe().to_owned()),
        floor_p50_us,
        vs_floor: floor_p50_us.map(|f| p50_us / f),
        reference: reference.map(|r| r.name.to_owned()),
        reference_p50_us,
        vs_reference: reference_p50_us.map(|r| p50_us / r),
    })
}

/// `n` acquire+release cycles of `mutex`, each one's time added to `samples`.
async fn timed_cycles(mutex: &Mutex, n: usize, samples: &mut Vec<Duration>) -> lockkit::Result<()> {
    for _ in 0..n {
        let t = Instant::now();
        let guard = mutex.lock().await?;
        guard.release().await?;
        samples.push(t.elapsed());
    }
    Ok(())
}

/// W2, in rounds that alternate with the backend's raw floor (when it has one), as W1 does.
/// Each side keeps its own shared value across its rounds.
pub(crate) async fn contended(
    locks: &LockClient,
    floor: Option<&ContendedFloor>,
    workers: usize,
    iterations: usize,
) -> lockkit::Result<Contended> {
    const ROUNDS: usize = 4;
    let floor_error = |e| crate::compare_error(format!("floor: {e}"));
    let mut contenders = Vec::new();
    if let Some(floor) = floor {
        for _ in 0..workers {
            contenders.push(floor.contender().await.map_err(floor_error)?);
        }
    }
    let (mut ours, mut theirs) = (Side::default(), Side::default());
    for round in 0..ROUNDS {
        let chunk = iterations / ROUNDS + usize::from(round < iterations % ROUNDS);
        lockkit_round(locks, workers, chunk, &mut ours).await?;
        if floor.is_some() {
            contenders = floor_round(contenders, chunk, &mut theirs)
                .await
                .map_err(floor_error)?;
        }
    }
    for contender in contenders {
        contender.clean_up().await;
    }
    let expected = (workers * iterations) as u64;
    let ours = ours.summary();
    let floor = floor.map(|floor| (floor.describe(), theirs.summary()));
    Ok(Contended {
        workers,
        iterations,
        final_value: ours.final_value,
        lost_updates: expected.saturating_sub(ours.final_value),
        increments_per_sec: ours.increments_per_sec,
        wait_p50_us: ours.wait_p50_us,
        wait_p99_us: ours.wait_p99_us,
        floor: floor.map(|(what, _)| what.to_owned()),
        floor_lost_updates: floor.map(|(_, f)| expected.saturating_sub(f.final_value)),
        floor_increments_per_sec: floor.map(|(_, f)| f.increments_per_sec),
        floor_wait_p50_us: floor.map(|(_, f)| f.wait_p50_us),
        floor_wait_p99_us: floor.map(|(_, f)| f.wait_p99_us),
        vs_floor: floor.map(|(_, f)| f.increments_per_sec / ours.increments_per_sec),
        wait_p50_vs_floor: floor.map(|(_, f)| ours.wait_p50_us / f.wait_p50_us),
    })
}

/// One side of W2 (lockkit or its floor) over the rounds.
#[derive(Default)]
struct Side {
    shared: Arc<AtomicU64>,
    waits: Vec<Duration>,
    busy: Duration,
}

#[derive(Clone, Copy)]
struct Summary {
    final_value: u64,
    increments_per_sec: f64,
    wait_p50_us: f64,
    wait_p99_us: f64,
}

impl Side {
    fn summary(mut self) -> Summary {
        self.waits.sort();
        let final_value = self.shared.load(Ordering::SeqCst);
        Summary {
            final_value,
            increments_per_sec: final_value as f64 / self.busy.as_secs_f64(),
            wait_p50_us: percentile(&self.waits, 0.50),
            wait_p99_us: percentile(&self.waits, 0.99),
        }
    }
}

/// The critical section: read the shared value, yield, write it plus one.
async fn increment(shared: &AtomicU64) {
    let seen = shared.load(Ordering::SeqCst);
    tokio::task::yield_now().await;
    shared.store(seen + 1, Ordering::SeqCst);
}

async fn lockkit_round(
    locks: &LockClient,
    workers: usize,
    iterations: usize,
    side: &mut Side,
) -> lockkit::Result<()> {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let (locks, shared) = (locks.clone(), side.shared.clone());
        tasks.spawn(async move {
            let mutex = locks.mutex("w2-counter")?;
            let mut waits = Vec::with_capacity(iterations);
            for _ in 0..iterations {
                let t = Instant::now();
                let guard = mutex.lock().await?;
                waits.push(t.elapsed());
                increment(&shared).await;
                guard.release().await?;
            }
            Ok::<_, lockkit::Error>(waits)
        });
    }
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(worker) => side.waits.extend(worker?),
            Err(e) => panic!("a worker panicked: {e}"),
        }
    }
    side.busy += started.elapsed();
    Ok(())
}

/// A round of the floor; gives the workers back for the next one.
async fn floor_round(
    contenders: Vec<Contender>,
    iterations: usize,
    side: &mut Side,
) -> Result<Vec<Contender>, BoxError> {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for mut contender in contenders {
        let shared = side.shared.clone();
        tasks.spawn(async move {
            let mut waits = Vec::with_capacity(iterations);
            for _ in 0..iterations {
                let t = Instant::now();
                contender.lock().await?;
                waits.push(t.elapsed());
                increment(&shared).await;
                contender.unlock().await?;
            }
            Ok::<_, BoxError>((contender, waits))
        });
    }
    let mut contenders = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(worker) => {
                let (contender, waits) = worker?;
                contenders.push(contender);
                side.waits.extend(waits);
            }
            Err(e) => panic!("a floor worker panicked: {e}"),
        }
    }
    side.busy += started.elapsed();
    Ok(contenders)
}
