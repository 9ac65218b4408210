//! Elections on etcd, where the conformance scenarios cannot look: the value goes with the
//! session lease, an observer's watch broken by a reset connection still ends on the
//! current leader, `leader()` never pairs a holder with another grant's value, and a dropped
//! observation leaves no watch on the server.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use lockkit_core::backend::lease_of;
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{FencingToken, Leader, LockClient, LockOptions};
use lockkit_etcd::{EtcdBackend, EtcdConfig};
use support::private::PrivateEtcd;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const PATIENCE: Duration = Duration::from_secs(10);

async fn client(config: &EtcdConfig, namespace: &str, options: LockOptions) -> LockClient {
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    LockClient::with_options(Arc::new(backend), namespace, options).expect("client")
}

fn options() -> LockOptions {
    LockOptions::default().with_ttl(Duration::from_secs(2))
}

/// Observers that hear of a change only by their watch: without a notification they would
/// read again only after a minute.
fn deaf_options() -> LockOptions {
    options().with_backoff(Duration::from_millis(10), Duration::from_secs(60))
}

/// Waits until `election`'s leader is `expected`, failing on any other state but `allowed`.
async fn leader_becomes(
    election: &lockkit_core::Election,
    expected: Option<&Leader>,
    allowed: &[Option<Leader>],
) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = election.leader().await.expect("leader");
        if now.as_ref() == expected {
            return;
        }
        assert!(
            allowed.contains(&now),
            "leader() says {now:?}, expected {expected:?}"
        );
        assert!(
            Instant::now() < deadline,
            "leader() still says {now:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A leader's session ends on the server (its lease revoked, as an operator or a lease
/// expiry does): at once nobody leads and the proclaimed value is gone with the key, the
/// leader hears that it lost, and nothing is left under the namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_value_goes_with_the_session_lease_when_it_is_revoked() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("elect-revoke");
    let leader_client = client(&config, &ns, options()).await;
    let bystander = client(&config, &ns, options()).await;
    let election = leader_client.election("revoked").expect("election");
    let watched = bystander.election("revoked").expect("election");
    let leadership = election
        .campaign_timeout("first", PATIENCE)
        .await
        .expect("campaign");
    leadership.proclaim("second").await.expect("proclaim");
    let shown = Leader::new(leadership.term(), Some("second".into()));
    assert_eq!(watched.leader().await.expect("leader"), Some(shown.clone()));
    let handle = lease_of(leadership.guard())
        .handle()
        .expect("an etcd grant has a handle")
        .to_owned();
    let admin = EtcdBackend::connect(config.clone()).await.expect("admin");
    admin
        .client()
        .lease_revoke(support::lease_of(&handle))
        .await
        .expect("revoke the leader's session lease");
    assert_eq!(
        watched.leader().await.expect("leader"),
        None,
        "the value outlived the session lease"
    );
    support::expect_no_keys(&admin, &ns, Duration::ZERO).await;
    tokio::time::timeout(PATIENCE, leadership.lost())
        .await
        .expect("the leader hears that it lost");
}

/// A leader that proclaimed is renewed like any holder: it still leads three TTLs later,
/// `is_held` says so, and its fenced writes still land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_proclaimed_is_renewed_and_its_fenced_writes_land() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("elect-renewed");
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    let locks =
        LockClient::with_options(Arc::new(backend.clone()), &ns, options()).expect("client");
    let leadership = locks
        .election("renewed")
        .expect("election")
        .campaign_timeout("first", PATIENCE)
        .await
        .expect("campaign");
    leadership.proclaim("second").await.expect("proclaim");
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(!leadership.is_lost(), "the leader lost its renewed lease");
    assert!(
        leadership.guard().is_held().await.expect("is_held"),
        "is_held denies a proclaimed leadership"
    );
    let fenced = format!("{}/{ns}-fenced", support::PREFIX);
    backend
        .txn_if_held(
            leadership.guard(),
            [lockkit_etcd::etcd_client::TxnOp::put(
                fenced.clone(),
                "x",
                None,
            )],
        )
        .await
        .expect("a fenced write of the leader lands");
    backend
        .client()
        .delete(fenced, None)
        .await
        .expect("delete the fenced key");
    assert!(leadership.resign().await.expect("resign"), "resign refused");
}

/// A leader cut off from the cluster (a crash, a partition) keeps leading, with its value,
/// until its session lease expires on the server; then nobody leads, its value is gone, and
/// no other value was ever shown with its term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_value_goes_with_the_session_lease_when_it_expires() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("elect-expire");
    let proxy = FaultProxy::start(&config.endpoints)
        .await
        .expect("a fault proxy");
    let mut through_proxy = config.clone();
    through_proxy.endpoints = proxy.hosts();
    through_proxy.request_timeout = Duration::from_secs(1);
    let leader_client = client(&through_proxy, &ns, options()).await;
    let bystander = client(&config, &ns, options()).await;
    let leadership = leader_client
        .election("expired")
        .expect("election")
        .campaign_timeout("cut off", PATIENCE)
        .await
        .expect("campaign");
    let shown = Some(Leader::new(leadership.term(), Some("cut off".into())));
    let watched = bystander.election("expired").expect("election");
    assert_eq!(watched.leader().await.expect("leader"), shown);
    proxy.set(Direction::Both, Fault::Blackhole);
    let cut_at = Instant::now();
    leader_becomes(&watched, None, std::slice::from_ref(&shown)).await;
    assert!(
        cut_at.elapsed() >= Duration::from_secs(1),
        "the leader was gone {:?} after it was cut off, before its 2 s lease could expire",
        cut_at.elapsed()
    );
    let admin = EtcdBackend::connect(config.clone()).await.expect("admin");
    support::expect_no_keys(&admin, &ns, Duration::ZERO).await;
    tokio::time::timeout(PATIENCE, leadership.lost())
        .await
        .expect("the cut-off leader hears that it lost");
}

/// An observer whose connection is reset while the leader changes (the watch's events are
/// lost on the way) still ends on the new leader, by the watch's break, not by its minute
/// of backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_whose_connection_is_reset_ends_on_the_current_leader() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("elect-reset");
    let proxy = FaultProxy::start(&config.endpoints)
        .await
        .expect("a fault proxy");
    let mut through_proxy = config.clone();
    through_proxy.endpoints = proxy.hosts();
    through_proxy.request_timeout = Duration::from_secs(1);
    let observer = client(&through_proxy, &ns, deaf_options()).await;
    let candidates = [
        client(&config, &ns, options()).await,
        client(&config, &ns, options()).await,
    ];
    let first = candidates[0]
        .election("reset")
        .expect("election")
        .campaign_timeout("first", PATIENCE)
        .await
        .expect("campaign");
    let mut changes = observer.election("reset").expect("election").observe();
    let (states, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let following = tokio::spawn(async move {
        while let Some(state) = changes.next().await {
            if states.send(state).is_err() {
                return;
            }
        }
    });
    let state = seen.recv().await.expect("a state").expect("no error");
    assert_eq!(state, Some(Leader::new(first.term(), Some("first".into()))));
    // The observer is now waiting on its watch.
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set(Direction::Both, Fault::Blackhole);
    assert!(first.resign().await.expect("resign"), "resign refused");
    let second = candidates[1]
        .election("reset")
        .expect("election")
        .campaign_timeout("second", PATIENCE)
        .await
        .expect("campaign");
    let current = Some(Leader::new(second.term(), Some("second".into())));
    proxy.reset();
    proxy.heal();
    let ended = tokio::time::timeout(PATIENCE, async {
        while let Some(state) = seen.recv().await {
            if state.as_ref().ok() == Some(&current) {
                return;
            }
        }
    })
    .await;
    following.abort();
    assert!(
        ended.is_ok(),
        "the observer did not end on the current leader {current:?} after its connection was reset"
    );
    assert!(second.resign().await.expect("resign"), "resign refused");
}

/// An observer that hears of changes only by its watch (its backoff is a minute) follows
/// rapid hand-overs between candidates that never come back (a new key name each time, so a
/// missed delete is never followed by another event on that key), and ends on the leader
/// that stays: no change between its read and its watch's start is missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deaf_observer_misses_no_change_between_its_read_and_its_watch() {
    const CHANGES: usize = 40;
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("elect-window");
    let observer = client(&config, &ns, deaf_options()).await;
    let mut elections = Vec::new();
    for _ in 0..=CHANGES {
        let candidate = client(&config, &ns, options()).await;
        elections.push(candidate.election("window").expect("election"));
    }
    let mut changes = observer.election("window").expect("election").observe();
    let (states, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let following = tokio::spawn(async move {
        while let Some(state) = changes.next().await {
            if states.send(state).is_err() {
                return;
            }
        }
    });
    assert_eq!(seen.recv().await.expect("a state").expect("no error"), None);
    let last = elections.pop().expect("the last candidate");
    for (n, election) in elections.iter().enumerate() {
        let leadership = election
            .campaign_timeout(format!("change-{n}"), PATIENCE)
            .await
            .expect("campaign");
        assert!(leadership.resign().await.expect("resign"), "resign refused");
    }
    let stays = last
        .campaign_timeout("stays", PATIENCE)
        .await
        .expect("campaign");
    let current = Some(Leader::new(stays.term(), Some("stays".into())));
    let mut latest = None;
    let ended = tokio::time::timeout(PATIENCE, async {
        while let Some(state) = seen.recv().await {
            latest = Some(state);
            if latest.as_ref().and_then(|s| s.as_ref().ok()) == Some(&current) {
                return;
            }
        }
    })
    .await;
    following.abort();
    assert!(
        ended.is_ok(),
        "the observer did not end on {current:?}: it last saw {latest:?}"
    );
    assert!(stays.resign().await.expect("resign"), "resign refused");
}

/// Candidates hand the leadership over as fast as they can, proclaiming on the way, while
/// readers ask `leader()` all along: every value read is one that the grant of the term read
/// with it proclaimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_never_pairs_a_holder_with_another_grants_value() {
    const CANDIDATES: usize = 3;
    const ROUNDS: usize = 60;
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("elect-pairs");
    let proclaimed: Arc<StdMutex<HashMap<FencingToken, HashSet<String>>>> = Arc::default();
    let mut candidates = tokio::task::JoinSet::new();
    for c in 0..CANDIDATES {
        let election = client(&config, &ns, options())
            .await
            .election("paired")
            .expect("election");
        let proclaimed = proclaimed.clone();
        candidates.spawn(async move {
            for round in 0..ROUNDS {
                let first = format!("c{c}-r{round}");
                let again = format!("{first}-again");
                let leadership = election
                    .campaign_timeout(first.as_str(), PATIENCE)
                    .await
                    .expect("campaign");
                // Recorded before the proclamation: a reader may see it at once.
                proclaimed
                    .lock()
                    .expect("record")
                    .entry(leadership.term())
                    .or_default()
                    .extend([first, again.clone()]);
                leadership.proclaim(again).await.expect("proclaim");
                assert!(leadership.resign().await.expect("resign"), "resign refused");
            }
        });
    }
    let mut readers = tokio::task::JoinSet::new();
    let done = Arc::new(tokio::sync::Notify::new());
    for _ in 0..2 {
        let election = client(&config, &ns, options())
            .await
            .election("paired")
            .expect("election");
        let done = done.clone();
        readers.spawn(async move {
            let mut seen = Vec::new();
            let finished = done.notified();
            tokio::pin!(finished);
            loop {
                tokio::select! {
                    () = &mut finished => return seen,
                    read = election.leader() => seen.push(read.expect("leader")),
                }
            }
        });
    }
    while let Some(joined) = candidates.join_next().await {
        joined.expect("a candidate panicked");
    }
    done.notify_waiters();
    let proclaimed = proclaimed.lock().expect("records").clone();
    let mut with_value = 0;
    while let Some(joined) = readers.join_next().await {
        for leader in joined.expect("a reader panicked").into_iter().flatten() {
            let Some(value) = &leader.value else { continue };
            with_value += 1;
            assert!(
                proclaimed
                    .get(&leader.term)
                    .is_some_and(|values| values.contains(value)),
                "leader() paired term {} with {value:?}, which that grant never proclaimed",
                leader.term
            );
        }
    }
    assert!(with_value > 100, "only {with_value} reads saw a leader");
}

/// The member's number of watchers (`/metrics`).
async fn watchers(port: u16) -> u64 {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to the member");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
        .await
        .expect("ask for the metrics");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("metrics");
    text.lines()
        .find(|l| l.starts_with("etcd_debugging_mvcc_watcher_total "))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .expect("the watcher gauge") as u64
}

/// Observations dropped while they wait on their watch (a `select!`, a timeout) leave no
/// watch behind on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_observation_leaves_no_watch_on_the_server() {
    let Some(etcd) = PrivateEtcd::start("lk-elect", 22000..22020, None) else {
        return;
    };
    let config = etcd.config();
    etcd.ready(&config).await;
    let leader = client(&config, "watch", options()).await;
    let observer = client(&config, "watch", deaf_options()).await;
    let leadership = leader
        .election("watched")
        .expect("election")
        .campaign_timeout("leader", PATIENCE)
        .await
        .expect("campaign");
    let before = watchers(etcd.client_port).await;
    let election = observer.election("watched").expect("election");
    let mut most_open = 0;
    for _ in 0..10 {
        let mut changes = election.observe();
        changes.next().await.expect("a state").expect("no error");
        let waiting = changes.next();
        tokio::pin!(waiting);
        tokio::select! {
            _ = &mut waiting => panic!("a change while nothing changed"),
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        // Still waiting (not polled meanwhile): its watch is open on the server.
        most_open = most_open.max(watchers(etcd.client_port).await.saturating_sub(before));
    }
    assert!(most_open >= 1, "the observations never watched");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = watchers(etcd.client_port).await;
        if now <= before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} watches left on the server by dropped observations",
            now - before
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(leadership.resign().await.expect("resign"), "resign refused");
}
