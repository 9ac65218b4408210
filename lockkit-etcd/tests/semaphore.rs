//! Semaphores on the compose cluster: waiters served in queue order, a release that wakes
//! only the waiters whose place changed, waiters whose connections break, a waiter that
//! queues again when its session is revoked, a disagreeing count refused without a trace, and the permits of a holder process
//! killed with SIGKILL freed after its TTL.
//! None of these disturb the cluster.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockkit_core::backend::{AcquireRequest, Hold, LockBackend, OwnerToken, lease_of};
use lockkit_core::testing::Recording;
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{ErrorKind, LockClient, LockOptions, Permit, Semaphore};
use lockkit_etcd::{EtcdBackend, EtcdConfig};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::sync::mpsc;

/// The TTL of the killed holder, whose expiry is that test's subject.
const TTL: Duration = Duration::from_secs(2);
/// The TTL of every other client. The tests of queue order and wake-ups assume that no
/// session ends while they run: one that does (its keep-alive starved past the TTL on a
/// loaded machine, as 2 s sessions were, seen as both keys of a holder's lease gone at
/// once) rightly takes its keys out of the queue, which changes the order they check.
const QUEUE_TTL: Duration = Duration::from_secs(10);
/// How long a grant that is due may take on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(20);
/// Set in the environment of the holder process that
/// `a_killed_holders_permits_are_free_after_its_ttl` starts: the namespace to hold in.
const CHILD_NAMESPACE: &str = "LOCKKIT_TEST_SEMAPHORE_HOLDER_NAMESPACE";

async fn client_of(backend: Arc<dyn LockBackend>, ns: &str, ttl: Duration) -> LockClient {
    let options = LockOptions::default().with_ttl(ttl);
    LockClient::with_options(backend, ns, options).expect("client")
}

/// A client with its own connection and sessions, as another process has.
async fn client(config: &EtcdConfig, ns: &str) -> LockClient {
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    client_of(Arc::new(backend), ns, QUEUE_TTL).await
}

/// A client like [`client`] whose calls are recorded.
async fn recorded_client(config: &EtcdConfig, ns: &str) -> (LockClient, Arc<Recording>) {
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    let recording = Arc::new(Recording::new(Arc::new(backend)));
    (client_of(recording.clone(), ns, QUEUE_TTL).await, recording)
}

/// Queues waiter `index` on `semaphore` (after the ones before it: its key is the
/// `keys`-th under the namespace) and sends its permit on `granted` once it has one.
async fn queue_waiter(
    admin: &EtcdBackend,
    ns: &str,
    keys: usize,
    index: usize,
    semaphore: Semaphore,
    granted: &mpsc::UnboundedSender<(usize, Permit)>,
) {
    let granted = granted.clone();
    tokio::spawn(async move {
        let permit = semaphore
            .acquire_timeout(Duration::from_secs(120))
            .await
            .unwrap_or_else(|e| panic!("waiter {index}: {}", e.display_chain()));
        let _ = granted.send((index, permit));
    });
    support::until_keys(admin, ns, keys, PATIENCE).await;
}

/// The next grant, which must be waiter `expected`'s.
async fn next_grant(
    granted: &mut mpsc::UnboundedReceiver<(usize, Permit)>,
    expected: usize,
) -> Permit {
    match tokio::time::timeout(PATIENCE, granted.recv()).await {
        Ok(Some((index, permit))) => {
            assert_eq!(
                index, expected,
                "waiter {index} was granted where waiter {expected} was next in the queue"
            );
            permit
        }
        Ok(None) => panic!("the waiters are gone"),
        Err(_) => panic!("waiter {expected} was not granted after a permit was freed for it"),
    }
}

/// Two permits, six waiters queued one after the other. Permits are freed by holders at
/// either end of the holding pair (not always the key just ahead of the next waiter), and each
/// free permit goes to the next waiter in queue order: a waiter that became the first waiter
/// when the one ahead of it was granted learns so (from its touch) and is woken by the
/// departure of any holder.
#[tokio::test]
async fn waiters_are_granted_in_queue_order() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("sem-order");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let holder = client(&config, &ns).await;
    let pool = holder.semaphore("order", 2).expect("semaphore");
    let first = pool.acquire().await.expect("first permit");
    let second = pool.acquire().await.expect("second permit");
    let (sender, mut granted) = mpsc::unbounded_channel();
    for index in 0..6 {
        let waiter = client(&config, &ns).await;
        let semaphore = waiter.semaphore("order", 2).expect("semaphore");
        queue_waiter(&admin, &ns, 3 + index, index, semaphore, &sender).await;
    }
    // Holding [first, second]; the newest holder leaves.
    assert!(second.release().await.expect("release"));
    let w0 = next_grant(&mut granted, 0).await;
    // Holding [first, w0]; the oldest leaves: w1 was behind w0 and must have moved up.
    assert!(first.release().await.expect("release"));
    let w1 = next_grant(&mut granted, 1).await;
    // Holding [w0, w1]; the newest leaves.
    assert!(w1.release().await.expect("release"));
    let w2 = next_grant(&mut granted, 2).await;
    // Holding [w0, w2]; the oldest leaves.
    assert!(w0.release().await.expect("release"));
    let w3 = next_grant(&mut granted, 3).await;
    // Holding [w2, w3]; both leave at once, as a session's end takes several keys.
    let (a, b) = tokio::join!(w2.release(), w3.release());
    assert!(a.expect("release") && b.expect("release"));
    let w4 = next_grant(&mut granted, 4).await;
    let w5 = next_grant(&mut granted, 5).await;
    assert!(w4.fencing_token() < w5.fencing_token());
    for permit in [w4, w5] {
        assert!(permit.release().await.expect("release"));
    }
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}

/// Two permits held, six waiters queued, each its own client with its calls recorded. One
/// release makes the first waiter a holder and the second the first waiter; the other four
/// keep their places. Bound asserted: the promoted waiter makes exactly one attempt (its
/// grant), the second exactly one (woken by the promoted waiter's touch, it reads its new
/// place), the four behind them none.
#[tokio::test]
async fn a_release_wakes_only_the_waiters_whose_place_changed() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("sem-herd");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let holder = client(&config, &ns).await;
    let pool = holder.semaphore("herd", 2).expect("semaphore");
    let first = pool.acquire().await.expect("first permit");
    let second = pool.acquire().await.expect("second permit");
    let (sender, mut granted) = mpsc::unbounded_channel();
    let mut recordings = Vec::new();
    for index in 0..6 {
        let (waiter, recording) = recorded_client(&config, &ns).await;
        let semaphore = waiter.semaphore("herd", 2).expect("semaphore");
        queue_waiter(&admin, &ns, 3 + index, index, semaphore, &sender).await;
        recordings.push(recording);
    }
    // Every waiter is in its wait (its watch open) before the release.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before: Vec<usize> = recordings.iter().map(|r| r.count("try_acquire")).collect();
    assert!(second.release().await.expect("release"));
    let w0 = next_grant(&mut granted, 0).await;
    let attempts_since = |index: usize| recordings[index].count("try_acquire") - before[index];
    let deadline = Instant::now() + PATIENCE;
    while attempts_since(1) == 0 {
        assert!(
            Instant::now() < deadline,
            "the waiter behind the promoted one was not woken by its touch"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Room for any stray wake to show before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let attempts: Vec<usize> = (0..6).map(attempts_since).collect();
    assert_eq!(
        attempts,
        [1, 1, 0, 0, 0, 0],
        "attempts per waiter after one release"
    );
    // The second waiter did move up: the other holder's release grants it.
    assert!(first.release().await.expect("release"));
    let w1 = next_grant(&mut granted, 1).await;
    assert!(w0.release().await.expect("release"));
    assert!(w1.release().await.expect("release"));
    for index in 2..6 {
        let permit = next_grant(&mut granted, index).await;
        assert!(permit.release().await.expect("release"));
    }
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}

/// The first waiter's session lease is revoked behind its back: its key goes, so the waiter
/// behind it becomes the first waiter, and the revoked one queues again, now last, on a new
/// session. The next two permits go in the new order.
#[tokio::test]
async fn a_waiter_whose_session_is_revoked_queues_again() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("sem-revoked");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let holder = client(&config, &ns).await;
    let pool = holder.semaphore("revoked", 2).expect("semaphore");
    let first = pool.acquire().await.expect("first permit");
    let second = pool.acquire().await.expect("second permit");
    let held = [lease_of(first.as_guard()), lease_of(second.as_guard())].map(|lease| {
        lease
            .handle()
            .expect("an etcd grant names its key")
            .to_owned()
    });
    let (sender, mut granted) = mpsc::unbounded_channel();
    let revoked = client(&config, &ns).await;
    queue_waiter(
        &admin,
        &ns,
        3,
        0,
        revoked.semaphore("revoked", 2).unwrap(),
        &sender,
    )
    .await;
    let keys = support::keys_under(&admin, &ns).await.expect("list keys");
    let queued = keys
        .iter()
        .find(|key| !held.contains(key))
        .unwrap_or_else(|| panic!("no waiter's key besides the holders' in {keys:?}"))
        .clone();
    let behind = client(&config, &ns).await;
    queue_waiter(
        &admin,
        &ns,
        4,
        1,
        behind.semaphore("revoked", 2).unwrap(),
        &sender,
    )
    .await;
    admin
        .client()
        .lease_revoke(support::lease_of(&queued))
        .await
        .expect("revoke the first waiter's session lease");
    // It learns when its key goes (its wait watches it) and queues again.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let keys = support::keys_under(&admin, &ns).await.expect("list keys");
        if keys.len() == 4 && !keys.contains(&queued) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the revoked waiter did not queue again: {keys:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(first.release().await.expect("release"));
    let now_first = next_grant(&mut granted, 1).await;
    assert!(second.release().await.expect("release"));
    let requeued = next_grant(&mut granted, 0).await;
    assert!(now_first.release().await.expect("release"));
    assert!(requeued.release().await.expect("release"));
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}

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

/// A client that reaches the cluster through its own fault proxy.
async fn proxied_client(config: &EtcdConfig, ns: &str) -> (LockClient, FaultProxy) {
    let proxy = FaultProxy::start(&config.endpoints)
        .await
        .expect("a fault proxy");
    let mut through_proxy = config.clone();
    through_proxy.endpoints = proxy.hosts();
    (client(&through_proxy, ns).await, proxy)
}

/// One permit; the first waiter and the one behind it each reach the cluster through their
/// own proxy. Both have their connections reset while they wait (their watches break), then
/// the holder leaves: the first waiter is granted. The second waiter's link goes dead across
/// that waiter's release and heals with its connections reset: it is granted then.
#[tokio::test]
async fn waiters_whose_connections_break_are_granted() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("sem-broken");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let holder = client(&config, &ns).await;
    let held = holder
        .semaphore("broken", 1)
        .unwrap()
        .acquire()
        .await
        .expect("permit");
    let (sender, mut granted) = mpsc::unbounded_channel();
    let (first, first_proxy) = proxied_client(&config, &ns).await;
    queue_waiter(
        &admin,
        &ns,
        2,
        0,
        first.semaphore("broken", 1).unwrap(),
        &sender,
    )
    .await;
    let (second, second_proxy) = proxied_client(&config, &ns).await;
    queue_waiter(
        &admin,
        &ns,
        3,
        1,
        second.semaphore("broken", 1).unwrap(),
        &sender,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    first_proxy.reset();
    second_proxy.reset();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(held.release().await.expect("release"));
    let w0 = next_grant(&mut granted, 0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    second_proxy.set(Direction::Both, Fault::Blackhole);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(w0.release().await.expect("release"));
    tokio::time::sleep(Duration::from_millis(700)).await;
    second_proxy.heal();
    second_proxy.reset();
    let w1 = next_grant(&mut granted, 1).await;
    assert!(w1.release().await.expect("release"));
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

/// A namespace with a held mutex and a semaphore with holders and a waiter: the listing, in
/// pages of one key or in one page, shows the mutex alone, and ends.
#[tokio::test]
async fn the_listing_of_a_namespace_shows_its_mutexes_not_its_semaphores() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("sem-list");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let locks = client(&config, &ns).await;
    let pool = locks.semaphore("jobs", 2).expect("semaphore");
    let permits = [
        pool.acquire().await.expect("permit"),
        pool.acquire().await.expect("permit"),
    ];
    let (sender, mut granted) = mpsc::unbounded_channel();
    let waiter = client(&config, &ns).await;
    queue_waiter(
        &admin,
        &ns,
        3,
        0,
        waiter.semaphore("jobs", 2).unwrap(),
        &sender,
    )
    .await;
    let guard = locks.mutex("jobs").unwrap().lock().await.expect("lock");
    for limit in [1, 100] {
        let mut names = Vec::new();
        let mut cursor = None;
        for _ in 0..10 {
            let page = locks
                .list_page("", cursor.as_deref(), limit)
                .await
                .expect("list");
            names.extend(page.locks.iter().map(|(key, _)| key.name().to_owned()));
            cursor = page.next;
            if cursor.is_none() {
                break;
            }
        }
        assert!(
            cursor.is_none(),
            "the listing did not end in 10 pages of {limit}"
        );
        assert_eq!(names, ["jobs"], "pages of {limit}");
    }
    assert!(guard.release().await.expect("release"));
    for permit in permits {
        assert!(permit.release().await.expect("release"));
    }
    let last = next_grant(&mut granted, 0).await;
    assert!(last.release().await.expect("release"));
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}

/// Both permits of a semaphore are held by another process, which is killed with SIGKILL
/// while a waiter is queued: nothing is released, the keys live until the holder's session
/// lease expires, and then the waiter is granted, about a TTL later, not before.
#[tokio::test]
async fn a_killed_holders_permits_are_free_after_its_ttl() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("sem-killed");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--exact",
            "holder_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_NAMESPACE, &ns)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the holder process");
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    let stdout = child.stdout.take().expect("the holder's stdout");
    let held = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|line| line.ends_with("HELD"))
    });
    let held = tokio::time::timeout(PATIENCE, held).await;
    if !matches!(held, Ok(Ok(true))) {
        let _ = kill(pid, Signal::SIGKILL);
        let _ = child.wait();
        panic!("the holder process did not report its permits");
    }
    let waiter = client(&config, &ns).await;
    let (sender, mut granted) = mpsc::unbounded_channel();
    queue_waiter(
        &admin,
        &ns,
        3,
        0,
        waiter.semaphore("killed", 2).unwrap(),
        &sender,
    )
    .await;
    kill(pid, Signal::SIGKILL).expect("kill the holder process");
    let killed_at = Instant::now();
    let _ = child.wait();
    let permit = next_grant(&mut granted, 0).await;
    let blocked_for = killed_at.elapsed();
    assert!(
        blocked_for >= TTL / 2,
        "the killed holder's permits were free {blocked_for:?} after the kill, before its lease (TTL {TTL:?}) could expire"
    );
    assert!(permit.release().await.expect("release"));
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}

/// Not a test on its own: the holder process of
/// `a_killed_holders_permits_are_free_after_its_ttl`, which runs this test binary with
/// [`CHILD_NAMESPACE`] set. It takes both permits, says `HELD` and waits to be killed.
#[tokio::test]
async fn holder_process() {
    let Ok(ns) = std::env::var(CHILD_NAMESPACE) else {
        return;
    };
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    let holder = client_of(Arc::new(backend), &ns, TTL).await;
    let pool = holder.semaphore("killed", 2).expect("semaphore");
    let permits = [
        pool.acquire().await.expect("permit"),
        pool.acquire().await.expect("permit"),
    ];
    println!("HELD");
    tokio::time::sleep(Duration::from_secs(300)).await;
    drop(permits);
}

/// A waiter whose first put landed but whose reply was lost adopts its key on a later attempt;
/// when that attempt finds it holding, with a waiter queued behind it, it still tells that
/// waiter (touches its key), so the waiter learns it is now first in line and takes the next
/// permit freed, instead of sleeping with a permit free until the adopter releases.
#[tokio::test]
async fn a_waiter_whose_first_reply_was_lost_still_wakes_the_waiter_behind_it() {
    let Some(mut config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("sem-lost-reply");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let holders = client(&config, &ns).await;
    let pool = holders.semaphore("lost", 2).expect("semaphore");
    let h1 = pool.acquire().await.expect("first permit");
    let h2 = pool.acquire().await.expect("second permit");
    config.request_timeout = Duration::from_secs(1);
    let (adopter, proxy) = proxied_client(&config, &ns).await;
    // Its session exists before its replies are lost: only the put's reply is.
    let warm = adopter.mutex("warm").unwrap().lock().await.expect("a lock");
    assert!(warm.release().await.expect("release"));
    proxy.set(Direction::Replies, Fault::Drop);
    let adopting = {
        let semaphore = adopter.semaphore("lost", 2).expect("semaphore");
        tokio::spawn(async move { semaphore.acquire_timeout(PATIENCE).await })
    };
    support::until_keys(&admin, &ns, 3, PATIENCE).await;
    let (sender, mut granted) = mpsc::unbounded_channel();
    let behind = client(&config, &ns).await;
    queue_waiter(
        &admin,
        &ns,
        4,
        0,
        behind.semaphore("lost", 2).unwrap(),
        &sender,
    )
    .await;
    // The adopter holds on the server now; it learns so once its replies come back.
    assert!(h1.release().await.expect("release"));
    proxy.heal();
    proxy.reset();
    let adopted = tokio::time::timeout(PATIENCE, adopting)
        .await
        .expect("the adopter was not granted")
        .expect("the adopter panicked")
        .expect("the adopter's permit");
    assert!(h2.release().await.expect("release"));
    let next = match tokio::time::timeout(Duration::from_secs(3), granted.recv()).await {
        Ok(Some((_, permit))) => permit,
        Ok(None) => panic!("the waiter is gone"),
        Err(_) => panic!(
            "the waiter behind the adopter slept with a permit free: it was not told the adopter holds"
        ),
    };
    assert!(next.release().await.expect("release"));
    assert!(adopted.release().await.expect("release"));
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}
