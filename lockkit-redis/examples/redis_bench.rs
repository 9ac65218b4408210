//! Benchmarks of the Redis backends against the compose topologies, printed side by side:
//!
//! 1. uncontended acquire+release through lockkit vs a raw loop of the same two Lua scripts
//!    with the same client crate (target: lockkit <= 1.1x the raw loop), and what a cycle
//!    costs without them: rslock's pair by hand (`SET NX PX`, then its compare-and-delete
//!    script) and two `PING`s (two round trips that do nothing), so that the gap to a bare
//!    `SET NX` splits into the scripts' work and the client's;
//! 2. Redlock over 5 nodes vs the single node, both through lockkit (target <= 1.5x), and
//!    the raw fan-out of the same scripts to all nodes and to a majority; each with the share
//!    of the machine's CPU that was busy meanwhile (from `/proc/stat`, every process);
//! 3. contended: 8 tasks x 250 increments of a shared value under one lock, waiters woken by
//!    release notifications vs polling.
//!
//! Run it in a release build with the servers up:
//! `compose/up.sh redis redlock && cargo run --release -p lockkit-redis --example redis_bench`
//! (`-- --quick` for small counts). Rounds of the uncontended runs alternate, so that noise
//! from the shared machine hits every contestant alike; the figures are medians over rounds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use lockkit_core::backend::OwnerToken;
use lockkit_core::testing::endpoint;
use lockkit_core::{LockClient, LockOptions};
use lockkit_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};
use redis::Script;

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../scripts/publish_classic.lua"),
        include_str!("../scripts/common.lua"),
        include_str!("../scripts/queue.lua"),
        include_str!("../scripts/mutex_prelude.lua"),
        include_str!("../scripts/acquire.lua")
    ))
});
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../scripts/publish_classic.lua"),
        include_str!("../scripts/common.lua"),
        include_str!("../scripts/queue.lua"),
        include_str!("../scripts/mutex_prelude.lua"),
        include_str!("../scripts/release.lua")
    ))
});

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Sample {
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Sample {
    fn percentile(&mut self, p: f64) -> Duration {
        self.latencies.sort();
        let index = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[index]
    }

    fn per_second(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// One contestant's figures, one entry per round.
struct Contestant {
    name: &'static str,
    p50: Vec<f64>,
    p99: Vec<f64>,
    rate: Vec<f64>,
    /// The share of the machine's CPU time that was busy (any process) during each round.
    busy: Vec<f64>,
}

impl Contestant {
    fn new(name: &'static str) -> Self {
        Contestant {
            name,
            p50: Vec::new(),
            p99: Vec::new(),
            rate: Vec::new(),
            busy: Vec::new(),
        }
    }

    fn add(&mut self, mut sample: Sample, busy: Option<f64>) {
        self.p50.push(micros(sample.percentile(0.5)));
        self.p99.push(micros(sample.percentile(0.99)));
        self.rate.push(sample.per_second());
        self.busy.extend(busy);
    }
}

/// The machine's CPU time from `/proc/stat`: (busy, total) in clock ticks; `None` where there
/// is no such file.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    let total: u64 = ticks.iter().sum();
    // idle and iowait are the 4th and 5th fields.
    let idle = ticks.get(3)? + ticks.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// The busy share of the CPU time since `before`.
fn busy_since(before: Option<(u64, u64)>) -> Option<f64> {
    let ((busy0, total0), (busy1, total1)) = (before?, cpu_ticks()?);
    (total1 > total0).then(|| (busy1 - busy0) as f64 / (total1 - total0) as f64)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Acquire+release cycles through lockkit.
async fn lockkit_cycles(locks: &LockClient, cycles: usize) -> Result<Sample, BoxError> {
    let mutex = locks.mutex("bench-uncontended")?;
    let mut latencies = Vec::with_capacity(cycles);
    let started = Instant::now();
    for _ in 0..cycles {
        let t = Instant::now();
        let guard = mutex.lock().await?;
        guard.release().await?;
        latencies.push(t.elapsed());
    }
    Ok(Sample {
        latencies,
        elapsed: started.elapsed(),
    })
}

/// The same two script calls, by hand, on one connection of the same crate.
async fn raw_cycles(
    con: &mut redis::aio::ConnectionManager,
    cycles: usize,
) -> Result<Sample, BoxError> {
    let (acquire, release) = (&*ACQUIRE, &*RELEASE);
    let mut latencies = Vec::with_capacity(cycles);
    let started = Instant::now();
    for _ in 0..cycles {
        let owner = OwnerToken::generate()?.expose_hex();
        let t = Instant::now();
        let granted: (i64, i64) = acquire
            .key("{bench/raw}")
            .key("{bench/raw}:fence")
            .arg(&owner)
            .arg(10_000)
            .arg(3_600_000)
            .invoke_async(con)
            .await?;
        assert_eq!(granted.0, 1, "the raw loop's key was taken");
        let released: i64 = release
            .key("{bench/raw}")
            .arg(&owner)
            .arg("lockkit:released:{bench/raw}")
            .invoke_async(con)
            .await?;
        assert_eq!(released, 1);
        latencies.push(t.elapsed());
    }
    Ok(Sample {
        latencies,
        elapsed: started.elapsed(),
    })
}

/// rslock's compare-and-delete release script.
static UNLOCK_IF_OURS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
    )
});

/// rslock's cycle by hand: `SET key owner NX PX ttl`, then its compare-and-delete script
/// (`pings == false`); or two `PING`s, the two round trips of a cycle with no work in them.
async fn bare_cycles(
    con: &mut redis::aio::ConnectionManager,
    cycles: usize,
    pings: bool,
) -> Result<Sample, BoxError> {
    let mut latencies = Vec::with_capacity(cycles);
    let started = Instant::now();
    for _ in 0..cycles {
        let owner = OwnerToken::generate()?.expose_hex();
        let t = Instant::now();
        if pings {
            let () = redis::cmd("PING").query_async(con).await?;
            let () = redis::cmd("PING").query_async(con).await?;
        } else {
            let set: Option<String> = redis::cmd("SET")
                .arg("{bench/bare}")
                .arg(&owner)
                .arg("NX")
                .arg("PX")
                .arg(10_000)
                .query_async(con)
                .await?;
            assert!(set.is_some(), "the bare loop's key was taken");
            let deleted: i64 = UNLOCK_IF_OURS
                .key("{bench/bare}")
                .arg(&owner)
                .invoke_async(con)
                .await?;
            assert_eq!(deleted, 1);
        }
        latencies.push(t.elapsed());
    }
    Ok(Sample {
        latencies,
        elapsed: started.elapsed(),
    })
}

/// The same two scripts sent to every node in parallel by hand, waiting for all answers
/// (`majority == false`) or, as Redlock does, for a majority (`majority == true`: the other
/// requests were sent and are still carried out).
async fn raw_fanout_cycles(
    nodes: &mut [redis::aio::ConnectionManager],
    cycles: usize,
    majority: bool,
) -> Result<Sample, BoxError> {
    let need = if majority {
        nodes.len() / 2 + 1
    } else {
        nodes.len()
    };
    let (acquire, release) = (&*ACQUIRE, &*RELEASE);
    let mut latencies = Vec::with_capacity(cycles);
    let started = Instant::now();
    for _ in 0..cycles {
        let owner = OwnerToken::generate()?.expose_hex();
        let t = Instant::now();
        let acquired = first_answers(
            need,
            nodes.iter().map(|con| {
                let mut con = con.clone();
                let mut invocation = acquire.key("{bench/fanout}");
                invocation
                    .key("{bench/fanout}:fence")
                    .arg(&owner)
                    .arg(10_000)
                    .arg(3_600_000);
                async move { invocation.invoke_async::<(i64, i64)>(&mut con).await }
            }),
        )
        .await;
        assert!(
            acquired.iter().all(|r| matches!(r, Ok((1, _)))),
            "the raw fan-out key was taken"
        );
        let released = first_answers(
            need,
            nodes.iter().map(|con| {
                let mut con = con.clone();
                let mut invocation = release.key("{bench/fanout}");
                invocation
                    .arg(&owner)
                    .arg("lockkit:released:{bench/fanout}");
                async move { invocation.invoke_async::<i64>(&mut con).await }
            }),
        )
        .await;
        assert!(released.iter().all(|r| matches!(r, Ok(1))));
        latencies.push(t.elapsed());
    }
    Ok(Sample {
        latencies,
        elapsed: started.elapsed(),
    })
}

/// The first `need` answers of `requests`, all sent at once; the others are driven to their
/// end in the background (a redis-rs request future dropped early may never be sent).
async fn first_answers<T: Send + 'static>(
    need: usize,
    requests: impl Iterator<Item = impl std::future::Future<Output = T> + Send + 'static>,
) -> Vec<T> {
    use futures_util::StreamExt;
    let mut pending: futures_util::stream::FuturesUnordered<_> = requests.collect();
    let mut answers = Vec::with_capacity(need);
    while answers.len() < need {
        match pending.next().await {
            Some(answer) => answers.push(answer),
            None => break,
        }
    }
    if !pending.is_empty() {
        tokio::spawn(pending.for_each(|_| std::future::ready(())));
    }
    answers
}

struct Contended {
    throughput: f64,
    wait_p50: Duration,
    wait_p99: Duration,
    final_value: u64,
}

/// 8 tasks x `rounds` increments of a shared value (read, yield, write) under one lock, each
/// task with its own backend (its own connections), as 8 processes would, and 1 ms of work
/// outside the lock between increments.
async fn contended(
    make: impl Fn() -> Result<LockClient, BoxError>,
    rounds: usize,
) -> Result<Contended, BoxError> {
    let value = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let locks = make()?;
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let mutex = locks.mutex("bench-contended")?;
            let mut waits = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let t = Instant::now();
                let guard = mutex.lock().await?;
                waits.push(t.elapsed());
                let read = value.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                value.store(read + 1, Ordering::SeqCst);
                guard.release().await?;
                // Work outside the lock, so that the others are waiting when it is released.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Ok::<_, BoxError>(waits)
        }));
    }
    let mut waits = Vec::new();
    for task in tasks {
        waits.extend(task.await??);
    }
    let elapsed = started.elapsed();
    let mut sample = Sample {
        latencies: waits,
        elapsed,
    };
    Ok(Contended {
        throughput: sample.per_second(),
        wait_p50: sample.percentile(0.5),
        wait_p99: sample.percentile(0.99),
        final_value: value.load(Ordering::SeqCst),
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let quick = std::env::args().any(|a| a == "--quick");
    let (rounds, cycles, increments) = if quick { (3, 200, 50) } else { (7, 1000, 250) };
    let (Some(redis_url), Some(redlock_url)) = (
        endpoint("LOCKKIT_TEST_REDIS_URL"),
        endpoint("LOCKKIT_TEST_REDLOCK_URL"),
    ) else {
        return Err("start the servers first: compose/up.sh redis redlock".into());
    };
    let namespace = format!("bench-{:08x}", rand::random::<u32>());
    let options = LockOptions::default();
    let single_config = RedisConfig::from_url(&redis_url)?;
    let single = LockClient::with_options(
        Arc::new(RedisBackend::connect(single_config.clone()).await?),
        &namespace,
        options.clone(),
    )?;
    let redlock = LockClient::with_options(
        Arc::new(RedlockBackend::connect(RedlockConfig::from_url(&redlock_url)?).await?),
        &namespace,
        options.clone(),
    )?;
    let raw_client = redis::Client::open(redis_url.as_str())?;
    let mut raw = redis::aio::ConnectionManager::new(raw_client).await?;
    let mut raw_nodes = Vec::new();
    for node in RedlockConfig::from_url(&redlock_url)?.nodes {
        raw_nodes.push(
            redis::aio::ConnectionManager::new(redis::Client::open(format!("redis://{node}"))?)
                .await?,
        );
    }

    // Warm-up: connections, scripts, allocator.
    lockkit_cycles(&single, 100).await?;
    lockkit_cycles(&redlock, 100).await?;
    raw_cycles(&mut raw, 100).await?;
    raw_fanout_cycles(&mut raw_nodes, 100, false).await?;
    bare_cycles(&mut raw, 100, false).await?;
    bare_cycles(&mut raw, 100, true).await?;

    let mut runs = [
        Contestant::new("raw Lua loop (single node)"),
        Contestant::new("lockkit single node"),
        Contestant::new("raw parallel fan-out of the same scripts, 5 nodes, all answers"),
        Contestant::new("raw parallel fan-out of the same scripts, 5 nodes, first 3 answers"),
        Contestant::new("lockkit Redlock, 5 nodes"),
        Contestant::new("rslock's pair by hand: SET NX PX, compare-and-delete script"),
        Contestant::new("two PINGs (the round trips alone)"),
    ];
    for _ in 0..rounds {
        for (i, run) in runs.iter_mut().enumerate() {
            let before = cpu_ticks();
            let sample = match i {
                0 => raw_cycles(&mut raw, cycles).await?,
                1 => lockkit_cycles(&single, cycles).await?,
                2 => raw_fanout_cycles(&mut raw_nodes, cycles, false).await?,
                3 => raw_fanout_cycles(&mut raw_nodes, cycles, true).await?,
                4 => lockkit_cycles(&redlock, cycles).await?,
                5 => bare_cycles(&mut raw, cycles, false).await?,
                _ => bare_cycles(&mut raw, cycles, true).await?,
            };
            run.add(sample, busy_since(before));
        }
    }
    println!(
        "## Uncontended acquire+release ({rounds} alternating rounds of {cycles} cycles, medians over rounds)\n"
    );
    println!("| contestant | p50 µs | p99 µs | cycles/s | machine CPU busy |");
    println!("|---|---:|---:|---:|---:|");
    let p50: Vec<f64> = runs.iter().map(|run| median(run.p50.clone())).collect();
    for (run, p50) in runs.iter().zip(&p50) {
        let busy = if run.busy.is_empty() {
            "n/a".to_owned()
        } else {
            format!("{:.0}%", 100.0 * median(run.busy.clone()))
        };
        println!(
            "| {} | {p50:.1} | {:.1} | {:.0} | {busy} |",
            run.name,
            median(run.p99.clone()),
            median(run.rate.clone())
        );
    }
    println!();
    println!(
        "lockkit single / raw loop, p50: {:.2}x (target <= 1.1x)",
        p50[1] / p50[0]
    );
    println!(
        "Redlock 5 nodes / lockkit single, p50: {:.2}x (target <= 1.5x)",
        p50[4] / p50[1]
    );
    println!(
        "Redlock 5 nodes / raw 5-node fan-out to a majority, p50: {:.2}x (what lockkit adds to the protocol)",
        p50[4] / p50[3]
    );
    println!(
        "raw 5-node fan-out to a majority / raw single node, p50: {:.2}x (this machine's cost of 5 servers)",
        p50[3] / p50[0]
    );
    println!(
        "raw 5-node fan-out to all / raw single node, p50: {:.2}x",
        p50[2] / p50[0]
    );
    println!(
        "single node, p50 µs: lockkit {:.1} = two round trips {:.1} + rslock's commands {:+.1} + lockkit's scripts {:+.1} + lockkit's client {:+.1}",
        p50[1],
        p50[6],
        p50[5] - p50[6],
        p50[0] - p50[5],
        p50[1] - p50[0]
    );

    println!(
        "\n## Contended: 8 tasks x {increments} increments under one lock, 1 ms of work outside it\n"
    );
    println!("| waiting | increments/s | wait p50 ms | wait p99 ms | final value |");
    println!("|---|---:|---:|---:|---:|");
    for (name, notifications) in [("release notifications", true), ("polling", false)] {
        let mut config = single_config.clone();
        config.notifications = notifications;
        let backends = {
            let mut v = Vec::new();
            for _ in 0..8 {
                v.push(Arc::new(RedisBackend::connect(config.clone()).await?));
            }
            std::sync::Mutex::new(v)
        };
        let namespace = namespace.clone();
        let options = options.clone();
        let result = contended(
            || {
                let backend = backends
                    .lock()
                    .map_err(|_| "poisoned")?
                    .pop()
                    .ok_or("out of backends")?;
                Ok(LockClient::with_options(
                    backend,
                    &namespace,
                    options.clone(),
                )?)
            },
            increments,
        )
        .await?;
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} | {} of {} |",
            result.throughput,
            result.wait_p50.as_secs_f64() * 1e3,
            result.wait_p99.as_secs_f64() * 1e3,
            result.final_value,
            8 * increments
        );
    }
    Ok(())
}
