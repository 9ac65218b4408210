//! The permit count holds: churn with cancelled acquisitions never admits more holders than
//! permits, and a request with a disagreeing count is refused without leaving a key.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockkit_core::ErrorKind;
use lockkit_core::backend::{AcquireRequest, Hold, LockBackend, OwnerToken};
use lockkit_etcd::EtcdBackend;

use crate::{PATIENCE, TTL, client, support};

/// Sixteen tasks of four clients take permits of a semaphore of three, many times, with
/// every third acquisition cut short at a point spread over a few round trips (so some are
/// dropped queued, some in flight, some just granted): never more than three holders at
/// once (each holds longer than a grant takes, so the permits are mostly all taken), no token
/// granted twice, and nothing left on the server afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_with_cancelled_acquisitions_never_admits_more_than_the_permits() {
    const CLIENTS: usize = 4;
    const TASKS: usize = 4;
    const ROUNDS: u64 = 15;
    const PERMITS: u32 = 3;
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("sem-churn");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let locks = client(&config, &ns).await;
        for task in 0..TASKS as u64 {
            let pool = locks.semaphore("churn", PERMITS).expect("semaphore");
            let (inside, most) = (inside.clone(), most.clone());
            tasks.spawn(async move {
                let mut tokens = Vec::new();
                for round in 0..ROUNDS {
                    let permit = if (round + task) % 3 == 0 {
                        let cut = Duration::from_micros(1_500 * ((round * 7 + task) % 8));
                        match tokio::time::timeout(cut, pool.acquire()).await {
                            Ok(permit) => permit.expect("acquire"),
                            Err(_) => continue,
                        }
                    } else {
                        pool.acquire_timeout(Duration::from_secs(60))
                            .await
                            .expect("acquire")
                    };
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokens.push(permit.fencing_token().get());
                    tokio::time::sleep(Duration::from_millis(25)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert!(
                        permit.release().await.expect("release"),
                        "a release was refused"
                    );
                }
                tokens
            });
        }
    }
    let mut all = std::collections::HashSet::new();
    while let Some(done) = tasks.join_next().await {
        for token in done.expect("a task panicked") {
            assert!(all.insert(token), "token {token} was granted twice");
        }
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= PERMITS as usize,
        "{most} holders at once of {PERMITS} permits"
    );
    eprintln!("{} grants, at most {most} holders at once", all.len());
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}

/// A request with another count than the semaphore's entries is refused by the attempt
/// itself, before any clean-up runs: its transaction put nothing (the count is part of the
/// key, and the put is guarded by "no entry has another count"), waiting or not. The
/// semaphore keeps its one entry and its second permit.
#[tokio::test]
async fn a_refused_count_puts_nothing() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("sem-refused");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let holder = client(&config, &ns).await;
    let two = holder.semaphore("refused", 2).expect("semaphore");
    let held = two.acquire().await.expect("permit");
    let other = EtcdBackend::connect(config.clone()).await.expect("connect");
    let key = holder.key("refused").expect("key");
    for wait in [true, false] {
        let request = AcquireRequest::new(key.clone(), OwnerToken::generate().unwrap(), TTL, wait)
            .with_hold(Hold::Permit { permits: 3 });
        let refused = other.try_acquire(&request).await;
        assert!(
            matches!(&refused, Err(e) if e.kind() == ErrorKind::InvalidConfig),
            "a request for 3 permits of a semaphore of 2 (wait: {wait}): {refused:?}"
        );
        let keys = support::keys_under(&admin, &ns).await.expect("list keys");
        assert_eq!(keys.len(), 1, "the refused request left a key: {keys:?}");
    }
    let second = two.try_acquire().await.expect("try_acquire");
    assert!(
        second.is_some(),
        "the refused requests took the second permit"
    );
    drop(second);
    assert!(held.release().await.expect("release"));
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}
