//! Fault tests that kill ensemble members. They run one after another (one lock for the
//! file) and always restart what they killed, even when an assertion fails.

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockkit_core::{LockClient, LockOptions};
use lockkit_zk::ZkBackend;
use support::{TEST_CHROOT, admin, test_config, znodes_under};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn member_sh(args: &[&str]) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../compose/member.sh");
    let out = Command::new(script)
        .args(args)
        .output()
        .expect("compose/member.sh");
    assert!(
        out.status.success(),
        "member.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Restarts a killed member when dropped, and waits until the ensemble has a leader.
struct Restart(String);

impl Drop for Restart {
    fn drop(&mut self) {
        member_sh(&["restart", &self.0]);
        member_sh(&["leader", "zk"]);
    }
}

/// Resumes paused members when dropped, and waits until the ensemble has a leader.
struct Resume(Vec<String>);

impl Drop for Resume {
    fn drop(&mut self) {
        for member in &self.0 {
            member_sh(&["resume", member]);
        }
        member_sh(&["leader", "zk"]);
    }
}

/// A holder connected to a follower that is cut off from the leader and the third server
/// (both paused). The follower goes on answering pings and reads from its stale view for
/// `syncLimit × tickTime` (5 s in compose) while a real leader could expire the session after
/// 4 s: the holder cannot confirm its lock there (the check syncs with the leader first), and
/// its lost signal fires within the session timeout, since nothing renews the short validity.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_cut_off_from_the_leader_cannot_confirm_a_lock() {
    let Some(mut config) = test_config() else {
        return;
    };
    let _serial = ONE_AT_A_TIME.lock().await;
    let admin = admin(&config, TEST_CHROOT).await;
    let leader = member_sh(&["leader", "zk"]);
    let follower = ["zk-1", "zk-2", "zk-3"]
        .into_iter()
        .find(|m| *m != leader)
        .unwrap();
    // "zk-2 up pid 1234 port 20202"
    let status = member_sh(&["status", follower]);
    let port = status.rsplit(' ').next().unwrap().to_owned();
    config.hosts = vec![format!("127.0.0.1:{port}")];
    config.request_timeout = Duration::from_secs(1);
    let ns = format!("lk-zk-{:08x}", rand::random::<u32>());
    let backend = ZkBackend::connect(config.clone()).await.unwrap();
    let session_timeout = backend.session_timeout();
    let client = LockClient::with_options(
        Arc::new(backend),
        &ns,
        LockOptions::default().with_ttl(Duration::from_secs(10)),
    )
    .unwrap();
    let guard = client.mutex("stale").unwrap().lock().await.unwrap();
    assert!(guard.is_held().await.unwrap());

    let others: Vec<String> = ["zk-1", "zk-2", "zk-3"]
        .into_iter()
        .filter(|m| *m != follower)
        .map(str::to_owned)
        .collect();
    let resume = Resume(others.clone());
    for member in &others {
        member_sh(&["pause", member]);
    }
    let cut_at = Instant::now();
    let confirmed = guard.is_held().await;
    assert!(
        !matches!(confirmed, Ok(true)),
        "a follower cut off from the leader confirmed the lock"
    );
    tokio::time::timeout(session_timeout, guard.lost())
        .await
        .expect("the lost signal did not fire within the session timeout");
    let lost_after = cut_at.elapsed();
    drop(resume);
    eprintln!("cut off at 0: is_held answered {confirmed:?}, lost after {lost_after:?}");

    let _ = guard.release().await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left = znodes_under(&admin, &ns).await.unwrap();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "znodes left: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// (2) `kill -9` of the leader while locks are held and contended: no two holders at once,
/// grants keep strictly increasing fencing tokens, and the work goes on under the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_kill_under_contention_keeps_exclusion_and_work_goes_on() {
    const CLIENTS: usize = 3;
    const TASKS_PER_CLIENT: usize = 3;
    const ROUNDS: u64 = 30;
    let Some(config) = test_config() else { return };
    let _serial = ONE_AT_A_TIME.lock().await;
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = format!("lk-zk-{:08x}", rand::random::<u32>());
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let backend = ZkBackend::connect(config.clone()).await.unwrap();
        let client = LockClient::with_options(
            Arc::new(backend),
            &ns,
            LockOptions::default().with_ttl(Duration::from_secs(2)),
        )
        .unwrap();
        for _ in 0..TASKS_PER_CLIENT {
            let (client, counter, inside, overlaps, errors, tokens) = (
                client.clone(),
                counter.clone(),
                inside.clone(),
                overlaps.clone(),
                errors.clone(),
                tokens.clone(),
            );
            tasks.spawn(async move {
                let mutex = client.mutex("counter").unwrap();
                let mut done = 0;
                while done < ROUNDS {
                    let guard = match mutex.lock_timeout(Duration::from_secs(30)).await {
                        Ok(guard) => guard,
                        Err(e) if e.is_retryable() => {
                            errors.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                        Err(e) => panic!("lock failed: {e}"),
                    };
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokens.lock().unwrap().push(guard.fencing_token());
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    inside.fetch_sub(1, Ordering::SeqCst);
                    if let Err(e) = guard.release().await {
                        assert!(e.is_retryable(), "release failed: {e}");
                        errors.fetch_add(1, Ordering::SeqCst);
                    }
                    done += 1;
                }
            });
        }
    }
    let expected = (CLIENTS * TASKS_PER_CLIENT) as u64 * ROUNDS;
    while counter.load(Ordering::SeqCst) < expected / 4 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let leader = member_sh(&["leader", "zk"]);
    member_sh(&["kill", &leader]);
    let restart = Restart(leader.clone());
    let at_kill = counter.load(Ordering::SeqCst);
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    drop(restart);

    let value = counter.load(Ordering::SeqCst);
    let overlaps = overlaps.load(Ordering::SeqCst);
    eprintln!(
        "killed {leader} at {at_kill}/{expected} increments; retryable errors on the way: {}",
        errors.load(Ordering::SeqCst)
    );
    assert_eq!(overlaps, 0, "critical sections overlapped");
    assert_eq!(value, expected, "updates were lost");
    assert!(at_kill < expected, "the work did not go on after the kill");
    let tokens = tokens.lock().unwrap().clone();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not strictly increasing in grant order"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = znodes_under(&admin, &ns).await.unwrap();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "znodes left: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
