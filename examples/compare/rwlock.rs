//! W8 read-write lock: 16 workers, each with its own client, share one read-write lock; each
//! takes it M times, one time in ten as a writer and otherwise as a reader, holds it for a
//! fixed time (the work) and gives it back. Reported: grants per second, read and write
//! waits (p50, max), the most readers seen at once, and how often a writer was granted ahead
//! of one that had asked at least a hold earlier (writers served out of order; the margin
//! leaves out writers that asked within a few ms of each other, whose requests may reach the
//! server in either order); a writer seen inside with anyone (checked in this process) fails
//! the workload.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockkit::{LockClient, LockkitConfig};
use serde::Serialize;

use crate::compare_error;

/// How many workers share the lock.
pub(crate) const WORKERS: usize = 16;
/// One grant in this many is a write.
pub(crate) const WRITE_EVERY: usize = 10;
/// How long a worker holds its grant each time.
pub(crate) const HOLD: Duration = Duration::from_millis(5);

#[derive(Debug, Serialize)]
pub(crate) struct ReadWriteThroughput {
    pub(crate) workers: usize,
    pub(crate) hold_ms: f64,
    pub(crate) reads: usize,
    pub(crate) writes: usize,
    pub(crate) grants_per_sec: f64,
    pub(crate) read_wait_p50_ms: f64,
    pub(crate) read_wait_max_ms: f64,
    pub(crate) write_wait_p50_ms: f64,
    pub(crate) write_wait_max_ms: f64,
    pub(crate) most_readers: usize,
    /// Pairs of writes where the later one (by at least [`HOLD`]) was granted first.
    pub(crate) writes_overtaken: usize,
}

/// Who is inside, as the workers count themselves.
#[derive(Default)]
struct Inside {
    readers: AtomicUsize,
    writers: AtomicUsize,
    most_readers: AtomicUsize,
}

/// W8 on one tier; `None` where the backend has no read-write locks (Redlock). `url` gives
/// each worker its own client (`None`: the memory tier, one client for all).
pub(crate) async fn read_write(
    url: Option<&str>,
    locks: &LockClient,
    iterations: usize,
) -> lockkit::Result<Option<ReadWriteThroughput>> {
    if !locks.capabilities().rwlock.is_supported() {
        return Ok(None);
    }
    let name = crate::run_key("w8-rwlock");
    let inside = Arc::new(Inside::default());
    // Each write's (asked, granted).
    let written = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut workers = tokio::task::JoinSet::new();
    let started = Instant::now();
    for worker in 0..WORKERS {
        let client = match url {
            Some(url) => lockkit::connect(&LockkitConfig::from_url(url)?).await?,
            None => locks.clone(),
        };
        let rwlock = client.rwlock(&name)?;
        let (inside, written) = (inside.clone(), written.clone());
        workers.spawn(async move {
            let mut reads = Vec::new();
            for i in 0..iterations {
                let asked = Instant::now();
                if (worker * iterations + i).is_multiple_of(WRITE_EVERY) {
                    let guard = rwlock.write_timeout(Duration::from_secs(60)).await?;
                    written
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push((asked, Instant::now()));
                    let writers = inside.writers.fetch_add(1, Ordering::SeqCst) + 1;
                    let readers = inside.readers.load(Ordering::SeqCst);
                    if writers > 1 || readers > 0 {
                        return Err(compare_error(format!(
                            "a writer was inside with {} writers and {readers} readers",
                            writers - 1
                        )));
                    }
                    tokio::time::sleep(HOLD).await;
                    inside.writers.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await?;
                } else {
                    let guard = rwlock.read_timeout(Duration::from_secs(60)).await?;
                    reads.push(asked.elapsed());
                    let readers = inside.readers.fetch_add(1, Ordering::SeqCst) + 1;
                    inside.most_readers.fetch_max(readers, Ordering::SeqCst);
                    if inside.writers.load(Ordering::SeqCst) > 0 {
                        return Err(compare_error("a reader was inside with a writer".into()));
                    }
                    tokio::time::sleep(HOLD).await;
                    inside.readers.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await?;
                }
            }
            client.close().await;
            Ok::<_, lockkit::Error>(reads)
        });
    }
    let mut reads = Vec::new();
    while let Some(joined) = workers.join_next().await {
        let worker = joined.map_err(|e| compare_error(format!("a W8 worker panicked: {e}")))?;
        reads.extend(worker?);
    }
    let took = started.elapsed();
    let written = written
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let mut writes: Vec<Duration> = written
        .iter()
        .map(|(asked, granted)| *granted - *asked)
        .collect();
    reads.sort();
    writes.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let p50 = |waits: &[Duration]| waits.get(waits.len() / 2).copied().map_or(0.0, ms);
    let max = |waits: &[Duration]| waits.last().copied().map_or(0.0, ms);
    Ok(Some(ReadWriteThroughput {
        workers: WORKERS,
        hold_ms: ms(HOLD),
        reads: reads.len(),
        writes: writes.len(),
        grants_per_sec: (reads.len() + writes.len()) as f64 / took.as_secs_f64(),
        read_wait_p50_ms: p50(&reads),
        read_wait_max_ms: max(&reads),
        write_wait_p50_ms: p50(&writes),
        write_wait_max_ms: max(&writes),
        most_readers: inside.most_readers.load(Ordering::SeqCst),
        writes_overtaken: overtaken(&written),
    }))
}

/// How many pairs of `writes` ((asked, granted) each) were granted in the other order than
/// they asked, the later one having asked at least [`HOLD`] after the earlier.
fn overtaken(writes: &[(Instant, Instant)]) -> usize {
    writes
        .iter()
        .map(|&(asked, granted)| {
            writes
                .iter()
                .filter(|&&(later, before)| later >= asked + HOLD && before < granted)
                .count()
        })
        .sum()
}
