//! W6 leader election: how long an election has no leader when its leader crashes, and when
//! it resigns, with a standby candidate already waiting each time.

use std::time::{Duration, Instant};

use lockkit::{LockClient, LockkitConfig};
use serde::Serialize;

use crate::compare_error;
use crate::faults::{W3_TTL, spawn_holder};

#[derive(Debug, Serialize)]
pub(crate) struct ElectionTimes {
    pub(crate) ttl_ms: u64,
    /// From the leader's SIGKILL (another process) to the standby leading; `None` on the
    /// memory tier, which cannot be shared between processes.
    pub(crate) crash_to_leader_ms: Option<f64>,
    /// How many resigns were timed.
    pub(crate) resigns: usize,
    /// From `resign()` being called to the standby (another client) leading.
    pub(crate) resign_to_leader_p50_ms: f64,
    pub(crate) resign_to_leader_max_ms: f64,
}

/// Child mode of W6: lead the election `key`, say so (`held TERM`), and stay until killed.
pub(crate) async fn lead(url: &str, key: &str, ttl_ms: u64) -> lockkit::Result<()> {
    use std::io::Write;
    let locks = lockkit::connect(&LockkitConfig::from_url(url)?).await?;
    let leadership = locks
        .election(key)?
        .with_ttl(Duration::from_millis(ttl_ms))?
        .campaign("the crashing leader")
        .await?;
    println!("held {}", leadership.term());
    let _ = std::io::stdout().flush();
    std::future::pending::<()>().await;
    Ok(())
}

/// W6 on one tier; `None` where the backend has no elections (Redlock).
pub(crate) async fn election(
    url: Option<&str>,
    locks: &LockClient,
    resigns: usize,
) -> lockkit::Result<Option<ElectionTimes>> {
    if !locks.capabilities().election.is_supported() {
        return Ok(None);
    }
    let crash_to_leader_ms = match url {
        Some(url) => Some(crash_to_leader(url, locks).await?.as_secs_f64() * 1e3),
        None => None,
    };
    let other = match url {
        Some(url) => lockkit::connect(&LockkitConfig::from_url(url)?).await?,
        None => locks.clone(),
    };
    let mut took = resign_to_leader([locks, &other], resigns).await?;
    took.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(Some(ElectionTimes {
        ttl_ms: W3_TTL.as_millis() as u64,
        crash_to_leader_ms,
        resigns: took.len(),
        resign_to_leader_p50_ms: took.get(took.len() / 2).copied().map_or(0.0, ms),
        resign_to_leader_max_ms: took.last().copied().map_or(0.0, ms),
    }))
}

/// A standby campaigning here while another process leads; the leader is killed.
async fn crash_to_leader(url: &str, locks: &LockClient) -> lockkit::Result<Duration> {
    let key = format!("w6-crash-{:08x}", rand::random::<u32>());
    let (mut child, _lines, _) = spawn_holder("--lead", url, &key, W3_TTL).await?;
    let standby = locks.election(&key)?.with_ttl(W3_TTL)?;
    let waiting = tokio::spawn(async move {
        let leadership = standby.campaign("standby").await;
        (leadership, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    child
        .start_kill()
        .map_err(|e| compare_error(format!("cannot kill the leader: {e}")))?;
    let killed_at = Instant::now();
    let _ = child.wait().await;
    let (leadership, led_at) = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .map_err(|_| compare_error("no new leader within 60 s of the crash".into()))?
        .map_err(|e| compare_error(format!("the standby panicked: {e}")))?;
    leadership?.resign().await?;
    Ok(led_at.saturating_duration_since(killed_at))
}

/// `rounds` hand-overs between two clients: each time the leader resigns while the other
/// client's candidate waits.
async fn resign_to_leader(
    clients: [&LockClient; 2],
    rounds: usize,
) -> lockkit::Result<Vec<Duration>> {
    let key = format!("w6-resign-{:08x}", rand::random::<u32>());
    let elections = [
        clients[0].election(&key)?.with_ttl(W3_TTL)?,
        clients[1].election(&key)?.with_ttl(W3_TTL)?,
    ];
    let mut leader = elections[0].campaign("leader-0").await?;
    let mut took = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        let standby = elections[round % 2].clone();
        let waiting = tokio::spawn(async move {
            let leadership = standby.campaign(format!("leader-{round}")).await;
            (leadership, Instant::now())
        });
        // The standby is waiting, not still sending its first attempt.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let resigned_at = Instant::now();
        leader.resign().await?;
        let (next, led_at) = tokio::time::timeout(Duration::from_secs(60), waiting)
            .await
            .map_err(|_| compare_error("no new leader within 60 s of a resign".into()))?
            .map_err(|e| compare_error(format!("the standby panicked: {e}")))?;
        took.push(led_at.saturating_duration_since(resigned_at));
        leader = next?;
    }
    leader.resign().await?;
    Ok(took)
}
