//! Semaphores on the ensemble: waiters granted in queue order, a release that wakes only
//! the waiters whose place changed, a holder's expired session freeing its permit, a
//! cancelled acquisition that leaves no node, permits kept apart from the lock of the same
//! name, and a count checked against the nodes ahead. None of these disturb the ensemble.

mod support;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::testing::Recording;
use lockkit_core::{LockClient, Permit};
use lockkit_zk::ZkBackend;
use support::{
    TEST_CHROOT, admin, children_via_leader, test_config, watch_only_options, watched_client,
    znodes_under,
};
use tokio::sync::mpsc;
use zookeeper_client as zk;

fn namespace() -> String {
    format!("lk-zk-sem-{:08x}", rand::random::<u32>())
}

/// The permit nodes of the semaphore `name`, in queue order, as the leader sees them (the
/// admin's server may lag behind the clients').
async fn permit_nodes(admin: &zk::Client, ns: &str, name: &str) -> Vec<String> {
    let parent = format!("/{ns}/{name}/semaphore");
    let mut nodes = children_via_leader(admin, &parent).await;
    nodes.retain(|n| n.contains("-permits-"));
    nodes.sort_by_key(|n| n.rsplit('-').next().map(str::to_owned));
    nodes
}

/// Waits until the semaphore `name` has `count` nodes.
async fn until_queued(admin: &zk::Client, ns: &str, name: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let nodes = permit_nodes(admin, ns, name).await;
        if nodes.len() == count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{count} nodes were expected in the queue, not {nodes:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn assert_no_znodes(admin: &zk::Client, ns: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = znodes_under(admin, ns).await.expect("list");
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "znodes left under /{ns}: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

type Grants = mpsc::UnboundedReceiver<(usize, Permit)>;

/// Queues `count` waiters of `client` on the semaphore `name` of `permits` permits, all
/// held, one after the other (each once the one before has its node); they report
/// `(index, permit)` when granted.
async fn queue_waiters(
    admin: &zk::Client,
    client: &LockClient,
    ns: &str,
    name: &str,
    permits: u32,
    count: usize,
) -> Grants {
    let (granted, grants) = mpsc::unbounded_channel();
    let ahead = permits as usize;
    for index in 0..count {
        let semaphore = client.semaphore(name, permits).expect("semaphore");
        let granted = granted.clone();
        tokio::spawn(async move {
            let permit = semaphore
                .acquire_timeout(Duration::from_secs(60))
                .await
                .unwrap_or_else(|e| panic!("waiter {index}: {}", e.display_chain()));
            let _ = granted.send((index, permit));
        });
        until_queued(admin, ns, name, ahead + index + 1).await;
    }
    grants
}

async fn next_grant(grants: &mut Grants) -> (usize, Permit) {
    tokio::time::timeout(Duration::from_secs(20), grants.recv())
        .await
        .expect("no waiter was granted after a release")
        .expect("the waiters' channel closed")
}

/// Two permits held, six waiters queued one after the other: each release (the oldest
/// grant first) grants exactly the next waiter in queue order, with a fencing token above
/// every grant before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_queue_order() {
    const WAITERS: usize = 6;
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, holders) = watched_client(&config, &ns).await;
    let (_, waiters) = watched_client(&config, &ns).await;
    let semaphore = holders.semaphore("order", 2).expect("semaphore");
    let mut held = VecDeque::new();
    for _ in 0..2 {
        held.push_back(
            semaphore
                .acquire_timeout(Duration::from_secs(10))
                .await
                .expect("a free permit"),
        );
    }
    let mut last = held.iter().map(Permit::fencing_token).max();
    let mut grants = queue_waiters(&admin, &waiters, &ns, "order", 2, WAITERS).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        grants.try_recv().is_err(),
        "a waiter of a full semaphore was granted"
    );
    for expected in 0..WAITERS {
        let oldest = held.pop_front().expect("a held permit");
        assert!(oldest.release().await.expect("release"));
        let (index, permit) = next_grant(&mut grants).await;
        assert_eq!(index, expected, "a waiter was granted out of queue order");
        assert!(
            Some(permit.fencing_token()) > last,
            "grant {index}'s token {} is not above the earlier grants' {last:?}",
            permit.fencing_token()
        );
        last = Some(permit.fencing_token());
        held.push_back(permit);
    }
    for permit in held {
        assert!(permit.release().await.expect("release"));
    }
    assert_no_znodes(&admin, &ns).await;
}

/// Two permits held, six waiters: one release wakes exactly two waiters, the first waiter
/// (granted) and the one behind it (now the first waiter, which watches the holders), and
/// costs exactly two attempts and one new wait. A herd would wake all six; a queue without
/// the granted waiter's touch would wake only one and leave the next blind to the holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_the_waiters_whose_place_changed() {
    const WAITERS: usize = 6;
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, holder) = watched_client(&config, &ns).await;
    let backend = ZkBackend::connect(config.clone()).await.expect("connect");
    let recording = Arc::new(Recording::new(Arc::new(backend.clone())));
    let waiters =
        LockClient::with_options(recording.clone(), &ns, watch_only_options()).expect("client");
    let semaphore = holder.semaphore("herd", 2).expect("semaphore");
    let first = semaphore.acquire_timeout(Duration::from_secs(10)).await;
    let second = semaphore.acquire_timeout(Duration::from_secs(10)).await;
    let (first, second) = (first.expect("a permit"), second.expect("a permit"));
    let mut grants = queue_waiters(&admin, &waiters, &ns, "herd", 2, WAITERS).await;
    // Let every waiter set its watches.
    let deadline = Instant::now() + Duration::from_secs(20);
    while recording.count("wait_for_change") < WAITERS {
        assert!(Instant::now() < deadline, "the waiters did not all wait");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        backend.watch_events(),
        0,
        "a waiter woke while nothing changed"
    );
    let attempts = recording.count("try_acquire");
    let waits = recording.count("wait_for_change");

    assert!(first.release().await.expect("release"));
    let (index, granted) = next_grant(&mut grants).await;
    assert_eq!(index, 0, "the first waiter was not the one granted");
    let deadline = Instant::now() + Duration::from_secs(20);
    while recording.count("wait_for_change") < waits + 1 {
        assert!(
            Instant::now() < deadline,
            "the waiter behind the granted one did not wait again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Anything more that one release could set off has happened by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(backend.watch_events(), 2, "waiters woken by one release");
    assert_eq!(
        recording.count("try_acquire") - attempts,
        2,
        "attempts after one release"
    );
    assert_eq!(
        recording.count("wait_for_change") - waits,
        1,
        "new waits after one release"
    );
    assert!(grants.try_recv().is_err(), "a second waiter was granted");

    // The waiter now first is woken by the other holder's release, too.
    assert!(second.release().await.expect("release"));
    let (index, next) = next_grant(&mut grants).await;
    assert_eq!(index, 1);
    let mut held = vec![granted, next];
    for _ in 2..WAITERS {
        let permit = held.remove(0);
        assert!(permit.release().await.expect("release"));
        held.push(next_grant(&mut grants).await.1);
    }
    for permit in held {
        assert!(permit.release().await.expect("release"));
    }
    assert_no_znodes(&admin, &ns).await;
}

/// Of two holders, the first's session is expired by the server: its permit's lost signal
/// fires, and the waiter, which watches both holders, is granted while the second still
/// holds. The stale permit is not held any more, and its release claims nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_session_expires_frees_its_permit() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (expiring_backend, expiring) = watched_client(&config, &ns).await;
    let (_, steady) = watched_client(&config, &ns).await;
    let (_, waiter) = watched_client(&config, &ns).await;
    let patience = Duration::from_secs(15);
    let old = expiring.semaphore("expiry", 2).expect("semaphore");
    let old = old.acquire_timeout(patience).await.expect("a free permit");
    let kept = steady.semaphore("expiry", 2).expect("semaphore");
    let kept = kept.acquire_timeout(patience).await.expect("a free permit");
    let waiting = waiter.semaphore("expiry", 2).expect("semaphore");
    let waiting = tokio::spawn(async move { waiting.acquire_timeout(patience).await });
    until_queued(&admin, &ns, "expiry", 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the waiter got a permit of a full semaphore"
    );

    expiring_backend
        .expire_session()
        .await
        .expect("expire the session");
    tokio::time::timeout(Duration::from_secs(5), old.lost())
        .await
        .expect("the expired holder's lost signal did not fire");
    let new = waiting
        .await
        .expect("the waiter panicked")
        .unwrap_or_else(|e| panic!("the waiter was not granted: {}", e.display_chain()));
    assert!(new.fencing_token() > kept.fencing_token());
    assert!(kept.is_held().await.expect("is_held"));
    assert!(new.is_held().await.expect("is_held"));
    assert!(
        !old.is_held().await.expect("is_held"),
        "the expired permit is held"
    );
    assert!(
        !old.release().await.expect("release"),
        "the expired permit's release claimed a permit"
    );
    assert_eq!(permit_nodes(&admin, &ns, "expiry").await.len(), 2);
    assert!(kept.release().await.expect("release"));
    assert!(new.release().await.expect("release"));
    assert_no_znodes(&admin, &ns).await;
}

/// An acquisition of a full semaphore, dropped once its node is queued, leaves nothing:
/// its node goes while the holder still holds, and once the holder releases, nothing at
/// all is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquisition_leaves_no_node() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, holder) = watched_client(&config, &ns).await;
    let (_, contender) = watched_client(&config, &ns).await;
    let held = holder.semaphore("cancel", 1).expect("semaphore");
    let held = held
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("a free permit");
    let holder_node = permit_nodes(&admin, &ns, "cancel").await;
    let semaphore = contender.semaphore("cancel", 1).expect("semaphore");
    let acquiring = tokio::spawn(async move { semaphore.acquire().await.map(drop) });
    until_queued(&admin, &ns, "cancel", 2).await;
    acquiring.abort();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let nodes = permit_nodes(&admin, &ns, "cancel").await;
        if nodes == holder_node {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cancelled acquisition left {nodes:?} (the holder's is {holder_node:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(held.release().await.expect("release"));
    assert_no_znodes(&admin, &ns).await;
}

/// A semaphore's permits are not the mutex's: while two are held, the lock of the same name
/// is not inspected as held, not listed and not broken, and the permits stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_permits_are_not_inspected_listed_or_broken_as_the_lock() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, client) = watched_client(&config, &ns).await;
    let semaphore = client.semaphore("apart", 2).expect("semaphore");
    let first = semaphore.acquire_timeout(Duration::from_secs(10)).await;
    let second = semaphore.acquire_timeout(Duration::from_secs(10)).await;
    let (first, second) = (first.expect("a permit"), second.expect("a permit"));
    assert_eq!(client.inspect("apart").await.expect("inspect"), None);
    let page = client.list_page("", None, 10).await.expect("list");
    assert!(page.locks.is_empty(), "permits listed as locks: {page:?}");
    assert!(!client.force_release("apart").await.expect("force_release"));
    assert!(first.is_held().await.expect("is_held"));
    assert!(second.is_held().await.expect("is_held"));
    assert_eq!(permit_nodes(&admin, &ns, "apart").await.len(), 2);
    assert!(first.release().await.expect("release"));
    assert!(second.release().await.expect("release"));
    assert_no_znodes(&admin, &ns).await;
}

/// A count is checked against the nodes ahead only: a waiter queued with the right count is
/// granted even though a node with another count (a misconfigured client's, caught between
/// its create and its refusal) queued behind it; while that node is there, a new request is
/// refused, and the misconfigured count itself is refused while the semaphore is in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_is_checked_against_the_nodes_ahead_only() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, holder) = watched_client(&config, &ns).await;
    let (_, other) = watched_client(&config, &ns).await;
    let held = holder.semaphore("ahead", 1).expect("semaphore");
    let held = held
        .acquire_timeout(Duration::from_secs(10))
        .await
        .expect("a free permit");
    let mut grants = queue_waiters(&admin, &other, &ns, "ahead", 1, 1).await;
    let refused = other
        .semaphore("ahead", 2)
        .expect("semaphore")
        .try_acquire()
        .await;
    assert!(
        matches!(&refused, Err(e) if e.kind() == lockkit_core::ErrorKind::InvalidConfig),
        "2 permits asked of a semaphore of 1 in use: {refused:?}"
    );
    let stray = admin
        .create(
            &format!("/{ns}/ahead/semaphore/_c_0-permits-2-lock-"),
            b"",
            &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .map(|(_, sequence)| format!("/{ns}/ahead/semaphore/_c_0-permits-2-lock-{sequence}"))
        .expect("a node with another count");
    until_queued(&admin, &ns, "ahead", 3).await;
    assert!(held.release().await.expect("release"));
    let (_, granted) = next_grant(&mut grants).await;
    let late = holder
        .semaphore("ahead", 1)
        .expect("semaphore")
        .try_acquire()
        .await;
    assert!(
        matches!(&late, Err(e) if e.kind() == lockkit_core::ErrorKind::InvalidConfig),
        "a request behind a node of another count: {late:?}"
    );
    admin.delete(&stray, None).await.expect("delete the node");
    assert!(granted.release().await.expect("release"));
    assert_no_znodes(&admin, &ns).await;
}
