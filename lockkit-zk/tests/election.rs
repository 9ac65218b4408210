//! Elections on ZooKeeper where the conformance suite cannot look: a partitioned leader and
//! its session, a leader suspended past its grace, a session the server expires, an observer
//! whose own connection breaks, reads racing rapid hand-overs, and the watches a wait leaves
//! behind.
//!
//! Observers here poll at most every 30 s (`backoff_max`), so that what they see in time
//! comes from the watches, not from polling.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use lockkit_core::backend::{LockBackend, lease_of};
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{Election, ErrorKind, Leader, LockClient, LockOptions};
use lockkit_zk::{ZkBackend, ZkConfig};
use support::server::{ZkServer, four_letter_word, installed};
use support::{TEST_CHROOT, admin, test_config, znodes_under};
use zookeeper_client as zk;

/// How long an observer may take to see a change: far less than its 30 s poll.
const SEEN_WITHIN: Duration = Duration::from_secs(15);

fn namespace() -> String {
    format!("lk-zk-el-{:08x}", rand::random::<u32>())
}

/// Options whose TTL is long (only the session bounds a grant's trust) and whose observers
/// rely on the watches (a poll every 30 s at most).
fn options() -> LockOptions {
    LockOptions::default()
        .with_ttl(Duration::from_secs(60))
        .with_backoff(Duration::from_millis(10), Duration::from_secs(30))
}

async fn client(config: &ZkConfig, ns: &str) -> (ZkBackend, LockClient) {
    let backend = ZkBackend::connect(config.clone()).await.expect("connect");
    let client =
        LockClient::with_options(Arc::new(backend.clone()), ns, options()).expect("client");
    (backend, client)
}

/// A client reaching the ensemble through its own fault proxy.
async fn proxied(config: &ZkConfig, ns: &str) -> (ZkBackend, LockClient, FaultProxy) {
    let proxy = FaultProxy::start(&config.hosts)
        .await
        .expect("a fault proxy");
    let mut through = config.clone();
    through.hosts = proxy.hosts();
    let (backend, client) = client(&through, ns).await;
    (backend, client, proxy)
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

/// Every state `election`'s observer reports, with when it arrived, while it runs.
type Seen = Arc<StdMutex<Vec<(Instant, Option<Leader>)>>>;

fn observe(election: &Election) -> (Seen, tokio::task::JoinHandle<()>) {
    let seen: Seen = Arc::default();
    let mut changes = election.observe();
    let log = seen.clone();
    let task = tokio::spawn(async move {
        while let Some(state) = changes.next().await {
            if let Ok(state) = state {
                log.lock()
                    .expect("the observer's log")
                    .push((Instant::now(), state));
            }
        }
    });
    (seen, task)
}

/// Waits until the last state `seen` is `want`.
async fn ends_on(seen: &Seen, want: &Option<Leader>, what: &str) {
    let deadline = Instant::now() + SEEN_WITHIN;
    loop {
        if seen
            .lock()
            .expect("the observer's log")
            .last()
            .map(|(_, s)| s)
            == Some(want)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the observer did not end on {want:?} within {SEEN_WITHIN:?}: {:?}",
            seen.lock().expect("the observer's log")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn terms_never_go_back(seen: &Seen) {
    let terms: Vec<_> = seen
        .lock()
        .expect("the observer's log")
        .iter()
        .filter_map(|(_, s)| s.as_ref().map(|l| l.term))
        .collect();
    assert!(
        terms.windows(2).all(|w| w[0] <= w[1]),
        "the observer saw terms go back: {terms:?}"
    );
}

/// A leader cut off from the ensemble past its session timeout: its lost signal fires
/// before the next candidate is elected, the server's expiry of its session takes its node
/// and value, and an observer never sees the new term with the old value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_is_lost_before_the_next_is_elected_and_its_value_goes_with_its_session()
 {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, cut_off, proxy) = proxied(&config, &ns).await;
    let (_, next) = client(&config, &ns).await;
    let (_, watching) = client(&config, &ns).await;
    let old = cut_off
        .election("partitioned")
        .unwrap()
        .campaign("old")
        .await
        .unwrap();
    let watched = watching.election("partitioned").unwrap();
    let (seen, observer) = observe(&watched);
    ends_on(
        &seen,
        &Some(Leader::new(old.term(), Some("old".into()))),
        "before the partition",
    )
    .await;
    let elected_at = Arc::new(StdMutex::new(None));
    let campaign = {
        let (election, elected_at) = (next.election("partitioned").unwrap(), elected_at.clone());
        tokio::spawn(async move {
            let leadership = election
                .campaign_timeout("new", Duration::from_secs(30))
                .await;
            *elected_at.lock().unwrap() = Some(Instant::now());
            leadership
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!campaign.is_finished(), "elected while the leader led");

    let cut_at = Instant::now();
    proxy.set(Direction::Both, Fault::Blackhole);
    tokio::time::timeout(Duration::from_secs(20), old.lost())
        .await
        .expect("the partitioned leader's lost signal did not fire");
    let lost_at = Instant::now();
    assert!(
        elected_at.lock().unwrap().is_none(),
        "a new leader was elected before the partitioned one knew it had lost"
    );
    let new = campaign
        .await
        .unwrap()
        .expect("the next candidate was elected");
    let elected_at = elected_at.lock().unwrap().expect("elected");
    assert!(lost_at < elected_at);
    eprintln!(
        "cut off at 0: the leader lost after {:?}, the next elected after {:?}",
        lost_at - cut_at,
        elected_at - cut_at
    );
    assert!(new.term() > old.term());
    let current = Some(Leader::new(new.term(), Some("new".into())));
    assert_eq!(watched.leader().await.unwrap(), current);
    ends_on(&seen, &current, "after the expiry").await;
    for state in seen.lock().unwrap().iter().filter_map(|(_, s)| s.as_ref()) {
        let allowed: &[Option<&str>] = if state.term == old.term() {
            &[Some("old")]
        } else {
            &[None, Some("new")]
        };
        assert!(
            allowed.contains(&state.value.as_deref()),
            "the observer saw {state:?} (old term {}, new term {})",
            old.term(),
            new.term()
        );
    }
    terms_never_go_back(&seen);

    proxy.heal();
    proxy.reset();
    assert!(
        !old.resign().await.unwrap_or(false),
        "the old leader's resign claimed the lock"
    );
    assert_eq!(watched.leader().await.unwrap(), current);
    assert!(new.resign().await.unwrap());
    ends_on(&seen, &None, "after the resign").await;
    observer.abort();
    assert_no_znodes(&admin, &ns).await;
}

/// A leader whose connection stayed away past the session watcher's grace is told it lost,
/// although its session survives and its node, with its value, is still on the server: the
/// backend refuses its proclamation instead of writing into that node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_suspended_past_its_grace_cannot_proclaim_though_its_node_remains() {
    let Some(mut config) = test_config() else {
        return;
    };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, watching) = client(&config, &ns).await;
    // Lost after 0.45 of a 10 s session, expired by the server after 10 s: time to heal.
    config.session_timeout = Duration::from_secs(10);
    config.suspended_grace_fraction = 0.05;
    let (backend, suspended, proxy) = proxied(&config, &ns).await;
    let session = backend.session_id();
    let leadership = suspended
        .election("suspended")
        .unwrap()
        .campaign("before")
        .await
        .unwrap();
    proxy.set(Direction::Both, Fault::Blackhole);
    tokio::time::timeout(Duration::from_secs(9), leadership.lost())
        .await
        .expect("the suspended leader's lost signal did not fire");
    // The validity may run out first; the session watcher's verdict is what is tested.
    let deadline = Instant::now() + Duration::from_secs(9);
    while lease_of(leadership.guard()).session_alive() != Some(false) {
        assert!(
            Instant::now() < deadline,
            "the session watcher did not report the suspension"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.heal();
    proxy.reset();
    let deadline = Instant::now() + Duration::from_secs(5);
    while backend.ping().await.is_err() {
        assert!(Instant::now() < deadline, "the leader did not reconnect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        backend.session_id(),
        session,
        "the session expired: too slow to heal"
    );
    let stale = Some(Leader::new(leadership.term(), Some("before".into())));
    let watched = watching.election("suspended").unwrap();
    assert_eq!(
        watched.leader().await.unwrap(),
        stale,
        "the node is still there"
    );

    let proclaimed = backend
        .proclaim(lease_of(leadership.guard()), "after")
        .await
        .unwrap();
    assert!(!proclaimed, "a lost lease's proclamation was accepted");
    assert_eq!(
        watched.leader().await.unwrap(),
        stale,
        "a lost lease wrote its value"
    );
    let refused = leadership.proclaim("after").await;
    assert!(refused.is_err_and(|e| e.kind() == ErrorKind::Lost));
    drop(leadership);
    assert_no_znodes(&admin, &ns).await;
}

/// A leader whose session the server expires: the leader and its value vanish with the
/// session, the old leadership's proclamation (on the backend's new session) is refused and
/// brings nothing back, and the backend leads again on its new session in a higher term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_takes_the_leader_and_its_value_and_nothing_comes_back() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (backend, expiring) = client(&config, &ns).await;
    let (_, watching) = client(&config, &ns).await;
    let election = expiring.election("expiring").unwrap();
    let watched = watching.election("expiring").unwrap();
    let old = election.campaign("old").await.unwrap();
    let session = backend.session_id();
    backend.expire_session().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), old.lost())
        .await
        .expect("the expired leader's lost signal did not fire");
    assert_eq!(
        watched.leader().await.unwrap(),
        None,
        "the leader outlived its session"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while backend.session_id() == session || backend.ping().await.is_err() {
        assert!(Instant::now() < deadline, "no new session");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let proclaimed = backend
        .proclaim(lease_of(old.guard()), "old again")
        .await
        .unwrap();
    assert!(
        !proclaimed,
        "the expired leadership's proclamation was accepted"
    );
    assert_eq!(
        watched.leader().await.unwrap(),
        None,
        "a proclamation brought the old leadership back"
    );
    let new = election.campaign("new").await.unwrap();
    assert!(new.term() > old.term());
    assert_eq!(
        watched.leader().await.unwrap(),
        Some(Leader::new(new.term(), Some("new".into())))
    );
    assert!(!old.resign().await.unwrap_or(false));
    assert!(new.resign().await.unwrap());
    assert_no_znodes(&admin, &ns).await;
}

/// An observer whose own connection breaks, once briefly and once past its session timeout
/// (its session expires and the backend opens another), ends each time on the leader and
/// value of the moment, and then on the vacancy, by watches rather than by its 30 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_across_a_connection_loss_ends_on_the_current_leader() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, candidates) = client(&config, &ns).await;
    let (observer_backend, watching, proxy) = proxied(&config, &ns).await;
    let election = candidates.election("observed").unwrap();
    let watched = watching.election("observed").unwrap();
    let (seen, observer) = observe(&watched);
    ends_on(&seen, &None, "at the start").await;

    let mut leader = election.campaign("first").await.unwrap();
    ends_on(
        &seen,
        &Some(Leader::new(leader.term(), Some("first".into()))),
        "before the losses",
    )
    .await;
    let session = observer_backend.session_id();
    for (loss, cut_for) in [
        ("a brief loss", Duration::from_millis(800)),
        ("a loss past the session timeout", Duration::from_secs(6)),
    ] {
        proxy.set(Direction::Both, Fault::Blackhole);
        tokio::time::sleep(cut_for / 4).await;
        assert!(leader.resign().await.unwrap());
        leader = election.campaign(format!("after {loss}")).await.unwrap();
        leader
            .proclaim(format!("proclaimed after {loss}"))
            .await
            .unwrap();
        tokio::time::sleep(cut_for * 3 / 4).await;
        proxy.heal();
        proxy.reset();
        let current = Some(Leader::new(
            leader.term(),
            Some(format!("proclaimed after {loss}")),
        ));
        ends_on(&seen, &current, loss).await;
    }
    assert_ne!(
        observer_backend.session_id(),
        session,
        "the observer's session outlived a loss past its timeout"
    );
    assert!(leader.resign().await.unwrap());
    ends_on(&seen, &None, "after the last resign").await;
    terms_never_go_back(&seen);
    observer.abort();
    assert_no_znodes(&admin, &ns).await;
}

/// Three clients' candidates campaign all at once, each leader proclaiming twice and
/// resigning at once, while another client reads `leader()` in a loop: every read answers
/// (however fast the leaders change), and pairs a term with a value of that term's leader, or
/// with none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_never_pairs_a_holder_with_the_previous_holders_value() {
    const CANDIDATES: usize = 3;
    const TERMS_EACH: usize = 25;
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, reading) = client(&config, &ns).await;
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (election, stop) = (reading.election("racing").unwrap(), stop.clone());
        tokio::spawn(async move {
            let mut reads = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                reads.push(election.leader().await);
            }
            reads
        })
    };
    let mut candidates = tokio::task::JoinSet::new();
    for c in 0..CANDIDATES {
        let (_, candidate) = client(&config, &ns).await;
        let election = candidate.election("racing").unwrap();
        candidates.spawn(async move {
            let mut led = Vec::new();
            for n in 0..TERMS_EACH {
                let id = format!("candidate-{c}-term-{n}");
                let leadership = election.campaign(id.as_str()).await.unwrap();
                leadership.proclaim(format!("{id} again")).await.unwrap();
                led.push((leadership.term(), id));
                assert!(leadership.resign().await.unwrap());
            }
            drop(candidate);
            led
        });
    }
    let mut values_of = HashMap::new();
    while let Some(led) = candidates.join_next().await {
        values_of.extend(led.unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    let reads = reader.await.unwrap();
    let failed: Vec<_> = reads.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} reads failed: {failed:?}",
        failed.len()
    );
    let leaders: Vec<_> = reads.iter().flatten().flatten().collect();
    for leader in &leaders {
        let id = values_of
            .get(&leader.term)
            .unwrap_or_else(|| panic!("a read shows term {} nobody led", leader.term));
        assert!(
            leader
                .value
                .as_ref()
                .is_none_or(|v| v == id || *v == format!("{id} again")),
            "term {} ({id}) read with the value {:?}",
            leader.term,
            leader.value
        );
    }
    eprintln!(
        "{} reads, {} of them during a leadership",
        reads.len(),
        leaders.len()
    );
    assert!(
        leaders.len() > TERMS_EACH,
        "too few reads saw a leader to tell: {}",
        leaders.len()
    );
    assert_no_znodes(&admin, &ns).await;
}

/// A reader whose link is slower than the hand-overs (50 ms round trips, while leaders come
/// and go within milliseconds) never finds the leader it listed still there: its `leader()`
/// keeps reading until the churn pauses, and answers, rather than giving up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_slower_than_the_hand_overs_still_gets_an_answer() {
    const CANDIDATES: usize = 3;
    const TERMS_EACH: usize = 100;
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, reading, proxy) = proxied(&config, &ns).await;
    let delay = Fault::Delay {
        base: Duration::from_millis(25),
        jitter: Duration::from_millis(5),
    };
    proxy.set(Direction::Both, delay);
    let mut candidates = tokio::task::JoinSet::new();
    for c in 0..CANDIDATES {
        let (_, candidate) = client(&config, &ns).await;
        let election = candidate.election("churning").unwrap();
        candidates.spawn(async move {
            for n in 0..TERMS_EACH {
                let leadership = election.campaign(format!("{c}-{n}")).await.unwrap();
                assert!(leadership.resign().await.unwrap());
            }
            drop(candidate);
        });
    }
    let election = reading.election("churning").unwrap();
    let mut reads = 0;
    while !candidates.is_empty() {
        let read = election.leader().await;
        assert!(read.is_ok(), "read {reads} during the churn: {read:?}");
        reads += 1;
        while let Some(joined) = candidates.try_join_next() {
            joined.unwrap();
        }
    }
    eprintln!("{reads} reads during the churn");
    proxy.heal();
    assert_eq!(election.leader().await.unwrap(), None);
    assert_no_znodes(&admin, &ns).await;
}

/// Waits that end (by `max_wait`) or are dropped, while a leader leads and while nobody
/// does, leave no watch on the server: a private server's `wchs` counts none afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_that_end_or_are_dropped_leave_no_watch_behind() {
    if !installed() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("lk-zk-watches-{:08x}", rand::random::<u32>()));
    let (server, port) = ZkServer::standalone(&dir, 22100..22200);
    let config = ZkConfig::from_url(&format!("zk://127.0.0.1:{port}/lockkit")).unwrap();
    let ns = namespace();
    let (backend, locks) = client(&config, &ns).await;
    let key = locks.key("watched").unwrap();
    let watches = || {
        let answer = four_letter_word(&format!("127.0.0.1:{port}"), "wchs");
        answer
            .lines()
            .find_map(|l| l.strip_prefix("Total watches:"))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("wchs answered {answer:?}"))
    };
    let no_watch_left = async |when: &str| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while watches() != 0 {
            assert!(
                Instant::now() < deadline,
                "{when}: {} watches left on the server",
                watches()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let wait_a_little = async |seen: Option<&Leader>| {
        for round in 0..20 {
            let wait = backend.wait_for_leader_change(&key, seen, Duration::from_millis(20));
            if round % 2 == 0 {
                wait.await.unwrap();
            } else {
                let _ = tokio::time::timeout(Duration::from_millis(5), wait).await;
            }
        }
    };
    wait_a_little(None).await;
    no_watch_left("with nobody leading").await;
    let leadership = locks
        .election("watched")
        .unwrap()
        .campaign("here")
        .await
        .unwrap();
    let seen = backend.leader(&key).await.unwrap();
    assert!(seen.is_some());
    wait_a_little(seen.as_ref()).await;
    no_watch_left("with a leader").await;
    assert!(leadership.resign().await.unwrap());
    drop(locks);
    drop(backend);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
