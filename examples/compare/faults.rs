//! W3-W5: holder crash, holder pause, server failover, with the child processes they need.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockkit::{LockClient, LockkitConfig};
use serde::Serialize;

use crate::compare_error;

#[derive(Debug, Serialize)]
pub(crate) struct HolderCrash {
    pub(crate) ttl_ms: u64,
    pub(crate) recovery_ms: f64,
}

#[derive(Debug, Serialize)]
pub(crate) struct HolderPause {
    pub(crate) ttl_ms: u64,
    pub(crate) pause_ms: u64,
    pub(crate) overlapping_writes: u64,
    pub(crate) written_after_lost: u64,
    pub(crate) stale_rejected: u64,
    pub(crate) stale_accepted: u64,
}

/// A resource that keeps the highest fencing token it has seen and rejects older ones.
#[derive(Debug, Default)]
pub(crate) struct FencedResource {
    pub(crate) highest: u64,
    pub(crate) rejected: u64,
    pub(crate) accepted_stale: u64,
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
pub(crate) struct Failover {
    pub(crate) killed: String,
    pub(crate) grants: u64,
    pub(crate) overlaps: u64,
    pub(crate) stale_rejected: u64,
    pub(crate) stale_accepted: u64,
    pub(crate) longest_gap_ms: f64,
    pub(crate) errors: u64,
}

/// Runs `compose/member.sh ARGS`; `None` if it fails or is not there.
pub(crate) fn member(args: &[&str]) -> Option<String> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("compose/member.sh");
    let out = std::process::Command::new(script)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The member whose death W5 causes, for a target and the lock `key` W5 contends for (of
/// the default namespace): on the cluster, the primary of the key's slot; on PostgreSQL, its
/// one server (the `postgres` topology has no standby to fail over to).
pub(crate) fn member_to_kill(target: &str, key: &str) -> Option<String> {
    match target {
        "redis" => Some("redis".into()),
        "redis-sentinel" => member(&["leader", "sentinel"]),
        "redis-cluster" => {
            let key = lockkit::LockKey::new(lockkit::LockKey::DEFAULT_NAMESPACE, key).ok()?;
            let slot = lockkit::redis::RedisClusterBackend::slot_of(&key)?.to_string();
            member(&["leader", "redis-cluster", &slot])
        }
        "redlock-5" => Some("redlock-1".into()),
        "etcd-3" => member(&["leader", "etcd"]),
        "zk-3" => member(&["leader", "zk"]),
        "postgres" => Some("postgres".into()),
        _ => None,
    }
}

/// Restarts `name` and waits until its topology is whole again (a restarted Sentinel
/// primary first comes back as a second primary and is demoted only later).
pub(crate) async fn restore(name: &str) {
    if member(&["restart", name]).is_none() {
        eprintln!("warning: could not restart {name}");
        return;
    }
    if !name.starts_with("sentinel-") && !name.starts_with("cluster-") {
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
pub(crate) async fn failover(target: &str, url: &str) -> lockkit::Result<Option<Failover>> {
    let key = format!("w5-failover-{:08x}", rand::random::<u32>());
    let Some(victim) = member_to_kill(target, &key) else {
        return Ok(None);
    };
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
            let mutex = locks.mutex(&key)?.with_ttl(W3_TTL)?;
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
            Ok::<_, lockkit::Error>((grants, overlaps, errors))
        });
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = member(&["kill", &victim]).is_some();
    // A lone server does not come back by itself: restart it during the run (Redis empty, no
    // persistence; PostgreSQL from its data directory, after crash recovery). Clusters fail
    // over on their own; their member is restarted afterwards.
    let lone = matches!(target, "redis" | "postgres");
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
pub(crate) const W4_PAUSE: Duration = Duration::from_secs(4);

/// The lock W3's child process holds.
pub(crate) const W3_TTL: Duration = Duration::from_secs(2);

/// Child mode of W3: take `key` at `url` with `ttl_ms`, say so, and hold it until killed.
pub(crate) async fn hold(url: &str, key: &str, ttl_ms: u64) -> lockkit::Result<()> {
    let locks = lockkit::connect(&LockkitConfig::from_url(url)?).await?;
    let guard = locks
        .mutex(key)?
        .with_ttl(Duration::from_millis(ttl_ms))?
        .lock()
        .await?;
    println!("held {}", guard.fencing_token());
    use std::io::Write;
    let _ = std::io::stdout().flush();
    std::future::pending::<()>().await;
    Ok(())
}

/// Child mode of W4: take `key`, then report a write every 20 ms, naively, whether or not the
/// guard still holds the lock: `write TOKEN LOST`.
pub(crate) async fn hold_and_write(url: &str, key: &str, ttl_ms: u64) -> lockkit::Result<()> {
    use std::io::Write;
    let locks = lockkit::connect(&LockkitConfig::from_url(url)?).await?;
    let guard = locks
        .mutex(key)?
        .with_ttl(Duration::from_millis(ttl_ms))?
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
pub(crate) async fn spawn_holder(
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
pub(crate) fn signal(
    child: &tokio::process::Child,
    signal: nix::sys::signal::Signal,
) -> lockkit::Result<()> {
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| compare_error("the holder has exited".into()))?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
        .map_err(|e| compare_error(format!("cannot signal the holder: {e}")))
}

/// W4: a holder paused past its TTL keeps writing when it wakes up.
pub(crate) async fn holder_pause(url: &str, locks: &LockClient) -> lockkit::Result<HolderPause> {
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

pub(crate) fn parse_write(line: &str) -> Option<(u64, bool)> {
    let mut parts = line.strip_prefix("write ")?.split(' ');
    Some((parts.next()?.parse().ok()?, parts.next()? == "true"))
}

/// W3: a holder process killed with SIGKILL; how long until this process is granted.
pub(crate) async fn holder_crash(url: &str, locks: &LockClient) -> lockkit::Result<HolderCrash> {
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
