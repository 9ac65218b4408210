//! Tests that kill members of the compose cluster. They run one after another (a static lock)
//! and always leave the cluster whole: killed members are restarted by a drop guard, even
//! when an assertion fails.

mod support;

use std::process::Command;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::{Duration, Instant};

use lockkit_core::{ErrorKind, LockClient, LockOptions};
use lockkit_etcd::{EtcdBackend, EtcdConfig};

static ONE_AT_A_TIME: StdMutex<()> = StdMutex::new(());

const MEMBER_SH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../compose/member.sh");

fn member(args: &[&str]) -> String {
    let out = Command::new(MEMBER_SH)
        .args(args)
        .output()
        .expect("run compose/member.sh");
    assert!(
        out.status.success(),
        "member.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Restarts the members it names when dropped, then waits for a leader.
struct Restore(Vec<String>);

impl Drop for Restore {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = Command::new(MEMBER_SH).args(["restart", name]).status();
        }
        let _ = Command::new(MEMBER_SH).args(["leader", "etcd"]).status();
    }
}

/// Runs `test` on a fresh runtime while holding the one-at-a-time lock.
fn serially<F: Future<Output = ()>>(test: impl FnOnce() -> F) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(test());
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

#[test]
fn leader_killed_under_contention_never_grants_twice_and_work_goes_on() {
    serially(|| async {
        let Some(config) = support::cluster_config().await else {
            return;
        };
        leader_kill(config).await;
    });
}

async fn leader_kill(mut config: EtcdConfig) {
    const CLIENTS: usize = 3;
    const TASKS: usize = 3;
    config.request_timeout = Duration::from_secs(2);
    let ns = support::namespace("leader-kill");
    // Acquisitions ride out the election instead of failing on its first error.
    let options = LockOptions::default()
        .with_ttl(Duration::from_secs(5))
        .with_backoff(Duration::from_millis(5), Duration::from_millis(200))
        .with_error_budget(Duration::from_secs(60));
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let lost = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(StdMutex::new(Vec::new()));
    let stop_at = Arc::new(StdMutex::new(None::<Instant>));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
        let client =
            LockClient::with_options(Arc::new(backend), &ns, options.clone()).expect("client");
        for _ in 0..TASKS {
            let (client, counter, inside, overlaps, lost, tokens, stop_at) = (
                client.clone(),
                counter.clone(),
                inside.clone(),
                overlaps.clone(),
                lost.clone(),
                tokens.clone(),
                stop_at.clone(),
            );
            tasks.spawn(async move {
                let mutex = client.mutex("counter").expect("key");
                loop {
                    if stop_at
                        .lock()
                        .expect("stop")
                        .is_some_and(|at| Instant::now() >= at)
                    {
                        return;
                    }
                    let guard = mutex
                        .lock_timeout(Duration::from_secs(30))
                        .await
                        .expect("acquisitions succeed across the election");
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokens.lock().expect("tokens").push(guard.fencing_token());
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    inside.fetch_sub(1, Ordering::SeqCst);
                    if guard.is_lost() {
                        lost.fetch_add(1, Ordering::SeqCst);
                    }
                    // A release refused by a member that just died is retried in the
                    // background; the next holder waits for it.
                    let _ = guard.release().await;
                }
            });
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let leader = blocking(|| member(&["leader", "etcd"])).await;
    let _restore = Restore(vec![leader.clone()]);
    let before_kill = counter.load(Ordering::SeqCst);
    blocking({
        let leader = leader.clone();
        move || member(&["kill", &leader])
    })
    .await;
    let killed_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after_election = counter.load(Ordering::SeqCst);
    blocking({
        let leader = leader.clone();
        move || member(&["restart", &leader])
    })
    .await;
    *stop_at.lock().expect("stop") = Some(Instant::now() + Duration::from_secs(1));
    while let Some(done) = tasks.join_next().await {
        done.expect("worker panicked");
    }
    let total = counter.load(Ordering::SeqCst);
    let tokens = tokens.lock().expect("tokens").clone();
    eprintln!(
        "killed leader {leader}: {before_kill} increments before, {} in the 4 s after the kill, {total} in all; {} grants",
        after_election - before_kill,
        tokens.len()
    );
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert_eq!(
        lost.load(Ordering::SeqCst),
        0,
        "a lock was lost across the election"
    );
    assert_eq!(total as usize, tokens.len(), "increments were lost");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not increasing in grant order"
    );
    assert!(
        after_election > before_kill,
        "no lock was granted in the {:?} after the leader was killed",
        killed_at.elapsed()
    );
    let admin = EtcdBackend::connect(config).await.expect("connect");
    support::expect_no_keys(&admin, &ns, Duration::from_secs(10)).await;
}

#[test]
fn two_of_three_members_down_fail_with_unavailable_within_the_timeout() {
    serially(|| async {
        let Some(config) = support::cluster_config().await else {
            return;
        };
        no_quorum(config).await;
    });
}

async fn no_quorum(mut config: EtcdConfig) {
    config.request_timeout = Duration::from_secs(2);
    let ns = support::namespace("no-quorum");
    let options = LockOptions::default()
        .with_ttl(Duration::from_secs(5))
        .with_error_budget(Duration::from_secs(4));
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    let locks = LockClient::with_options(Arc::new(backend), &ns, options.clone()).expect("client");
    let warm = locks
        .mutex("warm")
        .expect("key")
        .lock()
        .await
        .expect("lock");
    assert!(warm.release().await.expect("release"));

    let leader = blocking(|| member(&["leader", "etcd"])).await;
    let follower = ["etcd-1", "etcd-2", "etcd-3"]
        .into_iter()
        .find(|name| *name != leader)
        .expect("a follower")
        .to_owned();
    let _restore = Restore(vec![leader.clone(), follower.clone()]);
    for name in [leader, follower] {
        blocking(move || member(&["kill", &name])).await;
    }

    let started = Instant::now();
    let err = locks
        .mutex("job")
        .expect("key")
        .try_lock()
        .await
        .expect_err("no quorum, no lock");
    let try_took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        try_took <= config.request_timeout + Duration::from_secs(1),
        "try_lock took {try_took:?}"
    );

    let started = Instant::now();
    let err = locks
        .mutex("job")
        .expect("key")
        .lock_timeout(Duration::from_secs(120))
        .await
        .expect_err("no quorum, no lock");
    let lock_took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    // The error budget, the request in flight when it runs out, and a backoff.
    let bound = options.error_budget + config.request_timeout + Duration::from_secs(3);
    assert!(
        lock_took <= bound,
        "lock_timeout took {lock_took:?}, bound {bound:?}"
    );

    let started = Instant::now();
    let err = EtcdBackend::connect(config.clone())
        .await
        .expect_err("connect needs a quorum");
    let connect_took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        connect_took <= config.connect_timeout + config.request_timeout + Duration::from_secs(1)
    );
    eprintln!(
        "without quorum: try_lock failed after {try_took:?}, lock_timeout after {lock_took:?}, connect after {connect_took:?}: {err}"
    );
    drop(_restore);
    let admin = EtcdBackend::connect(config)
        .await
        .expect("connect after the restore");
    support::expect_no_keys(&admin, &ns, Duration::from_secs(10)).await;
}
