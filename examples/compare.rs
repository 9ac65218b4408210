//! The comparison suite: the same workloads on every tier this build can reach, side by side.
//!
//! ```sh
//! cargo run --release --example compare -- [--quick] [--json FILE] [--svg FILE]
//! ```
//!
//! Workloads (DESIGN.md §6):
//! - W1 uncontended: one client, N acquire+release cycles on one key: cycles/s, p50, p99.
//! - W2 contended: 8 workers × M iterations of acquire → read a shared value → add 1 → write
//!   → release; the final value must be 8 × M, a shortfall is reported as lost updates.
//! - W3 holder crash: another process (this program, re-run with `--hold`) takes the lock with
//!   a 2 s TTL and is killed with SIGKILL; the time until this process is granted the lock.
//!   Not run on the memory tier, which cannot be shared between processes.
//! - W4 holder pause: another process takes the lock (2 s TTL) and then writes to a fenced
//!   resource every 20 ms, naively, without checking that it still holds the lock. It is
//!   stopped (SIGSTOP) for 4 s; meanwhile this process is granted the lock and writes with its
//!   own token; then the paused one resumes (SIGCONT). The resource keeps the highest token it
//!   has seen and rejects older ones. Reported: the paused holder's writes that arrived while
//!   this process held the lock (overlapping critical sections), how many of those it made
//!   although its guard already reported the lock lost, and how many stale writes the fenced
//!   resource rejected and accepted.
//! - W5 server failover: 4 clients contend for one key (5 ms critical sections); after 1 s the
//!   server that decides is killed with SIGKILL (the single Redis, the Sentinel primary, one
//!   Redlock node, the etcd leader, the ZooKeeper leader) and the run goes on for 6 s more
//!   (the single Redis is restarted, empty, 2 s after its death: nothing else would bring it
//!   back).
//!   Reported: critical sections that overlapped, stale writes the fenced resource rejected and
//!   accepted, the longest time without a grant, and the errors clients saw. The killed member
//!   is restarted afterwards (`compose/member.sh`); without the compose scripts W5 is skipped.
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
    holder_pause: Option<HolderPause>,
    failover: Option<Failover>,
}

#[derive(Debug, Serialize)]
struct HolderPause {
    ttl_ms: u64,
    pause_ms: u64,
    overlapping_writes: u64,
    written_after_lost: u64,
    stale_rejected: u64,
    stale_accepted: u64,
}

/// A resource that keeps the highest fencing token it has seen and rejects older ones.
#[derive(Debug, Default)]
struct FencedResource {
    highest: u64,
    rejected: u64,
    accepted_stale: u64,
}

impl FencedResource {
    /// Applies a write made with `token`; `stale` says whether the writer's lock had passed on.
    fn write(&mut self, token: u64, stale: bool) {
        if token < self.highest {
            self.rejected += 1;
            return;
        }
        self.highest = token;
        if stale {
            self.accepted_stale += 1;
        }
    }
}

#[derive(Debug, Serialize)]
struct Failover {
    killed: String,
    grants: u64,
    overlaps: u64,
    stale_rejected: u64,
    stale_accepted: u64,
    longest_gap_ms: f64,
    errors: u64,
}

/// Runs `compose/member.sh ARGS`; `None` if it fails or is not there.
fn member(args: &[&str]) -> Option<String> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("compose/member.sh");
    let out = std::process::Command::new(script)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The member whose death W5 causes, for a target.
fn member_to_kill(target: &str) -> Option<String> {
    match target {
        "redis" => Some("redis".into()),
        "redis-sentinel" => member(&["leader", "sentinel"]),
        "redlock-5" => Some("redlock-1".into()),
        "etcd-3" => member(&["leader", "etcd"]),
        "zk-3" => member(&["leader", "zk"]),
        _ => None,
    }
}

/// Restarts `name` and waits until its topology is whole again (a restarted Sentinel
/// primary first comes back as a second primary and is demoted only later).
async fn restore(name: &str) {
    if member(&["restart", name]).is_none() {
        eprintln!("warning: could not restart {name}");
        return;
    }
    if !name.starts_with("sentinel-") {
        return;
    }
    let Some(port) =
        member(&["status", name]).and_then(|s| s.split_whitespace().last().map(str::to_owned))
    else {
        return;
    };
    let by = Instant::now() + Duration::from_secs(40);
    while Instant::now() < by {
        let info = std::process::Command::new("redis-cli")
            .args(["-p", &port, "info", "replication"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        if info.contains("role:slave") && info.contains("master_link_status:up") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("warning: {name} did not rejoin as a replica within 40 s");
}

/// W5: the deciding server dies while clients contend.
async fn failover(target: &str, url: &str) -> lockkit::Result<Option<Failover>> {
    let Some(victim) = member_to_kill(target) else {
        return Ok(None);
    };
    let key = format!("w5-failover-{:08x}", rand::random::<u32>());
    let inside = Arc::new(AtomicU64::new(0));
    let resource = Arc::new(std::sync::Mutex::new(FencedResource::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let locks = lockkit::connect(&LockkitConfig::from_url(url)?).await?;
        let (key, inside, resource, stop) =
            (key.clone(), inside.clone(), resource.clone(), stop.clone());
        tasks.spawn(async move {
            let mut grants = Vec::new();
            let (mut overlaps, mut errors) = (0u64, 0u64);
            let mutex = locks.mutex(&key)?.with_ttl(W3_TTL);
            while !stop.load(Ordering::SeqCst) {
                let guard = match mutex.lock_timeout(Duration::from_secs(2)).await {
                    Ok(guard) => guard,
                    Err(_) => {
                        errors += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                grants.push(Instant::now());
                if inside.fetch_add(1, Ordering::SeqCst) > 0 {
                    overlaps += 1;
                }
                let token = guard.fencing_token().get();
                tokio::time::sleep(Duration::from_millis(5)).await;
                let stale = guard.is_lost();
                resource
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .write(token, stale);
                inside.fetch_sub(1, Ordering::SeqCst);
                let _ = guard.release().await;
            }
            lockkit::Result::Ok((grants, overlaps, errors))
        });
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = member(&["kill", &victim]).is_some();
    // A lone server does not come back by itself: restart it (empty, no persistence) during
    // the run. Clusters fail over on their own; their member is restarted afterwards.
    let lone = target == "redis";
    if lone {
        tokio::time::sleep(Duration::from_secs(2)).await;
        restore(&victim).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
    } else {
        tokio::time::sleep(Duration::from_secs(6)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let stopped_at = Instant::now();
    let mut report = Failover {
        killed: if killed {
            victim.clone()
        } else {
            format!("{victim} (kill failed)")
        },
        grants: 0,
        overlaps: 0,
        stale_rejected: 0,
        stale_accepted: 0,
        longest_gap_ms: 0.0,
        errors: 0,
    };
    let mut grants = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (g, overlaps, errors) =
            joined.map_err(|e| compare_error(format!("a W5 worker: {e}")))??;
        grants.extend(g);
        report.overlaps += overlaps;
        report.errors += errors;
    }
    if !lone {
        restore(&victim).await;
    }
    grants.sort();
    report.grants = grants.len() as u64;
    // A service that never came back has its gap run to the end.
    grants.push(stopped_at);
    report.longest_gap_ms = grants
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
        .fold(0.0, f64::max);
    let resource = resource
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    report.stale_rejected = resource.rejected;
    report.stale_accepted = resource.accepted_stale;
    Ok(Some(report))
}

/// How long W4 keeps the holder stopped: longer than its TTL.
const W4_PAUSE: Duration = Duration::from_secs(4);

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

/// Child mode of W4: take `key`, then report a write every 20 ms, naively, whether or not the
/// guard still holds the lock: `write TOKEN LOST`.
async fn hold_and_write(url: &str, key: &str, ttl_ms: u64) -> lockkit::Result<()> {
    use std::io::Write;
    let locks = lockkit::connect(&LockkitConfig::from_url(url)?).await?;
    let guard = locks
        .mutex(key)?
        .with_ttl(Duration::from_millis(ttl_ms))
        .lock()
        .await?;
    let token = guard.fencing_token().get();
    println!("held {token}");
    loop {
        let _ = std::io::stdout().flush();
        tokio::time::sleep(Duration::from_millis(20)).await;
        println!("write {token} {}", guard.is_lost());
    }
}

/// Starts this program in a child mode and waits until it says it holds the lock.
async fn spawn_holder(
    mode: &str,
    url: &str,
    key: &str,
    ttl: Duration,
) -> lockkit::Result<(
    tokio::process::Child,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    u64,
)> {
    use tokio::io::AsyncBufReadExt;
    let exe = std::env::current_exe().map_err(|e| compare_error(format!("current_exe: {e}")))?;
    let mut child = tokio::process::Command::new(exe)
        .args([mode, url, key, &ttl.as_millis().to_string()])
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
    let token = match held {
        Ok(Ok(Some(line))) => line
            .strip_prefix("held ")
            .and_then(|t| t.trim().parse().ok())
            .ok_or_else(|| compare_error(format!("unexpected line from the holder: {line}")))?,
        other => {
            return Err(compare_error(format!(
                "the holder did not take the lock: {other:?}"
            )));
        }
    };
    Ok((child, lines, token))
}

/// Sends `signal` to `child`.
fn signal(child: &tokio::process::Child, signal: nix::sys::signal::Signal) -> lockkit::Result<()> {
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| compare_error("the holder has exited".into()))?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
        .map_err(|e| compare_error(format!("cannot signal the holder: {e}")))
}

/// W4: a holder paused past its TTL keeps writing when it wakes up.
async fn holder_pause(url: &str, locks: &LockClient) -> lockkit::Result<HolderPause> {
    let key = format!("w4-pause-{:08x}", rand::random::<u32>());
    let (child, mut lines, _) = spawn_holder("--hold-and-write", url, &key, W3_TTL).await?;
    signal(&child, nix::sys::signal::Signal::SIGSTOP)?;
    let stopped_at = Instant::now();
    // Drain what it wrote before the stop; it holds the lock then, so those writes are fine.
    let mut resource = FencedResource::default();
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_millis(100), lines.next_line()).await
    {
        if let Some((token, _)) = parse_write(&line) {
            resource.write(token, false);
        }
    }
    let guard = locks
        .mutex(&key)?
        .lock_timeout(Duration::from_secs(60))
        .await?;
    resource.write(guard.fencing_token().get(), false);
    tokio::time::sleep_until((stopped_at + W4_PAUSE).into()).await;
    signal(&child, nix::sys::signal::Signal::SIGCONT)?;
    let mut report = HolderPause {
        ttl_ms: W3_TTL.as_millis() as u64,
        pause_ms: W4_PAUSE.as_millis() as u64,
        overlapping_writes: 0,
        written_after_lost: 0,
        stale_rejected: 0,
        stale_accepted: 0,
    };
    let hold_until = Instant::now() + Duration::from_millis(500);
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout_at(hold_until.into(), lines.next_line()).await
    {
        if let Some((token, lost)) = parse_write(&line) {
            report.overlapping_writes += 1;
            report.written_after_lost += u64::from(lost);
            resource.write(token, true);
        }
    }
    guard.release().await?;
    drop(child);
    report.stale_rejected = resource.rejected;
    report.stale_accepted = resource.accepted_stale;
    Ok(report)
}

fn parse_write(line: &str) -> Option<(u64, bool)> {
    let mut parts = line.strip_prefix("write ")?.split(' ');
    Some((parts.next()?.parse().ok()?, parts.next()? == "true"))
}

/// W3: a holder process killed with SIGKILL; how long until this process is granted.
async fn holder_crash(url: &str, locks: &LockClient) -> lockkit::Result<HolderCrash> {
    let key = format!("w3-crash-{:08x}", rand::random::<u32>());
    let (mut child, _lines, _) = spawn_holder("--hold", url, &key, W3_TTL).await?;
    let ttl_ms = W3_TTL.as_millis() as u64;
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

/// A bar chart per tier, as SVG: W1 p50 latency (log scale) on the left, the W4 and W5 safety
/// counts (stale writes rejected and accepted, overlaps) on the right.
fn svg(reports: &[TierReport]) -> String {
    let row = 34.0;
    let height = 70.0 + row * reports.len() as f64;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"160\" y=\"22\" font-weight=\"bold\">W1 uncontended acquire+release p50 (µs, log scale)</text>\n\
         <text x=\"560\" y=\"22\" font-weight=\"bold\">W4+W5 safety: stale rejected / stale accepted / overlaps</text>\n"
    );
    let max_log = reports
        .iter()
        .map(|r| r.uncontended.p50_us.max(1.0).log10())
        .fold(1.0, f64::max);
    for (i, r) in reports.iter().enumerate() {
        let y = 40.0 + row * i as f64;
        let p50 = r.uncontended.p50_us.max(1.0);
        let width = 340.0 * (p50.log10() + 0.2) / (max_log + 0.2);
        out.push_str(&format!(
            "<text x=\"10\" y=\"{ty}\">{} ({})</text>\n\
             <rect x=\"160\" y=\"{y}\" width=\"{width:.1}\" height=\"20\" fill=\"#4878a8\"/>\n\
             <text x=\"{tx:.1}\" y=\"{ty}\">{p50:.0}</text>\n",
            r.target,
            r.tier,
            ty = y + 14.0,
            tx = 165.0 + width,
        ));
        let (rejected, accepted) = [
            r.holder_pause
                .as_ref()
                .map(|w| (w.stale_rejected, w.stale_accepted)),
            r.failover
                .as_ref()
                .map(|w| (w.stale_rejected, w.stale_accepted)),
        ]
        .into_iter()
        .flatten()
        .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
        let overlaps = r.failover.as_ref().map_or(0, |w| w.overlaps);
        let mut x = 560.0;
        for (count, color) in [
            (rejected, "#59a14f"),
            (accepted, "#e15759"),
            (overlaps, "#f28e2b"),
        ] {
            let width = (count as f64 * 4.0).min(90.0);
            out.push_str(&format!(
                "<rect x=\"{x}\" y=\"{y}\" width=\"{width:.1}\" height=\"20\" fill=\"{color}\"/>\n\
                 <text x=\"{tx:.1}\" y=\"{ty}\">{count}</text>\n",
                tx = x + width + 3.0,
                ty = y + 14.0,
            ));
            x += 110.0;
        }
    }
    out.push_str("</svg>\n");
    out
}

fn markdown(reports: &[TierReport]) -> String {
    let mut out = String::from(
        "| target | tier | W1 cycles/s | W1 p50 µs | W1 p99 µs | W2 final | W2 lost updates | W2 incr/s | W2 wait p50 µs | W2 wait p99 µs | W3 crash: granted after ms (TTL 2 s) | W4 pause: overlapping writes (after lost) | W4 stale writes rejected / accepted | W5 killed | W5 overlaps | W5 stale rejected / accepted | W5 longest gap ms |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|\n",
    );
    for r in reports {
        let (u, c) = (&r.uncontended, &r.contended);
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.1} | {:.1} | {} | {} | {:.0} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {} | {} |\n",
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
                .map_or("n/a".to_owned(), |w| format!("{:.0}", w.recovery_ms)),
            r.holder_pause.as_ref().map_or("n/a".to_owned(), |w| format!(
                "{} ({})",
                w.overlapping_writes, w.written_after_lost
            )),
            r.holder_pause.as_ref().map_or("n/a".to_owned(), |w| format!(
                "{} / {}",
                w.stale_rejected, w.stale_accepted
            )),
            r.failover.as_ref().map_or("n/a", |w| w.killed.as_str()),
            r.failover
                .as_ref()
                .map_or("n/a".to_owned(), |w| w.overlaps.to_string()),
            r.failover.as_ref().map_or("n/a".to_owned(), |w| format!(
                "{} / {}",
                w.stale_rejected, w.stale_accepted
            )),
            r.failover
                .as_ref()
                .map_or("n/a".to_owned(), |w| format!("{:.0}", w.longest_gap_ms)),
        ));
    }
    out
}

#[tokio::main]
async fn main() -> lockkit::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, url, key, ttl_ms] = args.as_slice()
        && (mode == "--hold" || mode == "--hold-and-write")
    {
        let ttl_ms = ttl_ms
            .parse()
            .map_err(|_| compare_error(format!("bad TTL {ttl_ms}")))?;
        return if mode == "--hold" {
            hold(url, key, ttl_ms).await
        } else {
            hold_and_write(url, key, ttl_ms).await
        };
    }
    let quick = args.iter().any(|a| a == "--quick");
    let svg_path = args
        .iter()
        .position(|a| a == "--svg")
        .and_then(|i| args.get(i + 1))
        .cloned();
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
            holder_pause: if name == "memory" {
                None
            } else {
                Some(holder_pause(&url, &locks).await?)
            },
            failover: failover(name, &url).await?,
        });
    }

    println!("{}", markdown(&reports));
    if let Some(path) = json_path {
        let json =
            serde_json::to_string_pretty(&reports).map_err(|e| compare_error(e.to_string()))?;
        std::fs::write(&path, json).map_err(|e| compare_error(format!("{path}: {e}")))?;
        eprintln!("wrote {path}");
    }
    if let Some(path) = svg_path {
        std::fs::write(&path, svg(&reports)).map_err(|e| compare_error(format!("{path}: {e}")))?;
        eprintln!("wrote {path}");
    }
    Ok(())
}
