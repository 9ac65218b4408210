//! The comparison suite: the same workloads on every tier this build can reach, side by side.
//!
//! ```sh
//! cargo run --release --example compare -- [--quick] [--json FILE]
//! ```
//!
//! Workloads (DESIGN.md §6):
//! - W1 uncontended: one client, N acquire+release cycles on one key: cycles/s, p50, p99.
//! - W2 contended: 8 workers × M iterations of acquire → read a shared value → add 1 → write
//!   → release; the final value must be 8 × M, a shortfall is reported as lost updates.
//! - W3 holder crash: another process (this program, re-run with `--hold`) takes the lock with
//!   a 2 s TTL and is killed with SIGKILL; the time until this process is granted the lock.
//!   Not run on the memory tier, which cannot be shared between processes.
//!
//! Every tier this build contains (cargo features `redis`, `zk`, `etcd`) whose servers are
//! reachable runs: the URLs come from `LOCKKIT_TEST_{REDIS,SENTINEL,REDLOCK,ETCD,ZK}_URL` or
//! the endpoints file of `compose/up.sh` (`compose/compare.sh` starts them). A tier whose
//! servers are missing is skipped with a notice, or fails the run under
//! `LOCKKIT_REQUIRE_BACKENDS=1`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockkit::{BackendKind, LockClient, LockkitConfig};
use serde::Serialize;

#[derive(Debug, Clone, Copy)]
struct Sizes {
    uncontended_cycles: usize,
    workers: usize,
    iterations: usize,
}

#[derive(Debug, Serialize)]
struct Uncontended {
    cycles: usize,
    cycles_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
}

#[derive(Debug, Serialize)]
struct Contended {
    workers: usize,
    iterations: usize,
    final_value: u64,
    lost_updates: u64,
    increments_per_sec: f64,
    wait_p50_us: f64,
    wait_p99_us: f64,
}

#[derive(Debug, Serialize)]
struct HolderCrash {
    ttl_ms: u64,
    recovery_ms: f64,
}

#[derive(Debug, Serialize)]
struct TierReport {
    target: String,
    tier: String,
    uncontended: Uncontended,
    contended: Contended,
    holder_crash: Option<HolderCrash>,
}

/// The lock W3's child process holds.
const W3_TTL: Duration = Duration::from_secs(2);

/// Child mode of W3: take `key` at `url` with `ttl_ms`, say so, and hold it until killed.
async fn hold(url: &str, key: &str, ttl_ms: u64) -> lockkit::Result<()> {
    let locks = lockkit::connect(&LockkitConfig::from_url(url)?).await?;
    let guard = locks
        .mutex(key)?
        .with_ttl(Duration::from_millis(ttl_ms))
        .lock()
        .await?;
    println!("held {}", guard.fencing_token());
    use std::io::Write;
    let _ = std::io::stdout().flush();
    std::future::pending::<()>().await;
    Ok(())
}

fn compare_error(message: String) -> lockkit::Error {
    lockkit::Error::new(lockkit::ErrorKind::Backend, "compare", message)
}

/// W3: a holder process killed with SIGKILL; how long until this process is granted.
async fn holder_crash(url: &str, locks: &LockClient) -> lockkit::Result<HolderCrash> {
    use tokio::io::AsyncBufReadExt;
    let key = format!("w3-crash-{:08x}", rand::random::<u32>());
    let exe = std::env::current_exe().map_err(|e| compare_error(format!("current_exe: {e}")))?;
    let ttl_ms = W3_TTL.as_millis() as u64;
    let mut child = tokio::process::Command::new(exe)
        .args(["--hold", url, &key, &ttl_ms.to_string()])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| compare_error(format!("cannot start the holder process: {e}")))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| compare_error("the holder has no stdout".into()))?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let held = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
    if !matches!(held, Ok(Ok(Some(ref line))) if line.starts_with("held")) {
        return Err(compare_error(format!(
            "the holder process did not take the lock: {held:?}"
        )));
    }
    child
        .start_kill()
        .map_err(|e| compare_error(format!("cannot kill the holder: {e}")))?;
    let killed_at = Instant::now();
    let _ = child.wait().await;
    let guard = locks
        .mutex(&key)?
        .lock_timeout(Duration::from_secs(60))
        .await?;
    let recovery = killed_at.elapsed();
    guard.release().await?;
    Ok(HolderCrash {
        ttl_ms,
        recovery_ms: recovery.as_secs_f64() * 1e3,
    })
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

async fn uncontended(locks: &LockClient, cycles: usize) -> lockkit::Result<Uncontended> {
    let mutex = locks.mutex("w1-uncontended")?;
    let mut samples = Vec::with_capacity(cycles);
    let started = Instant::now();
    for _ in 0..cycles {
        let t = Instant::now();
        let guard = mutex.lock().await?;
        guard.release().await?;
        samples.push(t.elapsed());
    }
    let total = started.elapsed();
    samples.sort();
    Ok(Uncontended {
        cycles,
        cycles_per_sec: cycles as f64 / total.as_secs_f64(),
        p50_us: percentile(&samples, 0.50),
        p99_us: percentile(&samples, 0.99),
    })
}

async fn contended(
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

fn markdown(reports: &[TierReport]) -> String {
    let mut out = String::from(
        "| target | tier | W1 cycles/s | W1 p50 µs | W1 p99 µs | W2 final | W2 lost updates | W2 incr/s | W2 wait p50 µs | W2 wait p99 µs | W3 crash: granted after ms (TTL 2 s) |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in reports {
        let (u, c) = (&r.uncontended, &r.contended);
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.1} | {:.1} | {} | {} | {:.0} | {:.1} | {:.1} | {} |\n",
            r.target,
            r.tier,
            u.cycles_per_sec,
            u.p50_us,
            u.p99_us,
            c.final_value,
            c.lost_updates,
            c.increments_per_sec,
            c.wait_p50_us,
            c.wait_p99_us,
            r.holder_crash
                .as_ref()
                .map_or("n/a".to_owned(), |w| format!("{:.0}", w.recovery_ms))
        ));
    }
    out
}

#[tokio::main]
async fn main() -> lockkit::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, url, key, ttl_ms] = args.as_slice()
        && flag == "--hold"
    {
        let ttl_ms = ttl_ms
            .parse()
            .map_err(|_| compare_error(format!("bad TTL {ttl_ms}")))?;
        return hold(url, key, ttl_ms).await;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let json_path = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let sizes = if quick {
        Sizes {
            uncontended_cycles: 200,
            workers: 8,
            iterations: 25,
        }
    } else {
        Sizes {
            uncontended_cycles: 2000,
            workers: 8,
            iterations: 250,
        }
    };

    let mut targets = vec![("memory", "memory://".to_owned())];
    for (name, var, kind) in [
        ("redis", "LOCKKIT_TEST_REDIS_URL", BackendKind::Redis),
        (
            "redis-sentinel",
            "LOCKKIT_TEST_SENTINEL_URL",
            BackendKind::RedisSentinel,
        ),
        (
            "redlock-5",
            "LOCKKIT_TEST_REDLOCK_URL",
            BackendKind::Redlock,
        ),
        ("etcd-3", "LOCKKIT_TEST_ETCD_URL", BackendKind::Etcd),
        ("zk-3", "LOCKKIT_TEST_ZK_URL", BackendKind::Zk),
    ] {
        if !kind.is_compiled_in() {
            continue;
        }
        match lockkit_core::testing::endpoint(var) {
            Some(url) => targets.push((name, url)),
            None => lockkit_core::testing::backend_missing(&format!("{name} ({var})")),
        }
    }
    let mut reports = Vec::new();
    for (name, url) in targets {
        let locks = lockkit::connect(&LockkitConfig::from_url(&url)?).await?;
        eprintln!("running {name} ({})...", locks.tier());
        reports.push(TierReport {
            target: name.to_owned(),
            tier: locks.tier().to_string(),
            uncontended: uncontended(&locks, sizes.uncontended_cycles).await?,
            contended: contended(&locks, sizes.workers, sizes.iterations).await?,
            holder_crash: if name == "memory" {
                None
            } else {
                Some(holder_crash(&url, &locks).await?)
            },
        });
    }

    println!("{}", markdown(&reports));
    if let Some(path) = json_path {
        let json = serde_json::to_string_pretty(&reports).map_err(|e| {
            lockkit::Error::new(lockkit::ErrorKind::Backend, "compare", e.to_string())
        })?;
        std::fs::write(&path, json).map_err(|e| {
            lockkit::Error::new(
                lockkit::ErrorKind::Backend,
                "compare",
                format!("{path}: {e}"),
            )
        })?;
        eprintln!("wrote {path}");
    }
    Ok(())
}
