//! Release notifications across pub/sub disconnections, against private servers (the tests
//! restart them and kill their connections): waiters are granted after the release when the
//! server restarts while they queue, and when the server kills the pub/sub connection; and
//! the pub/sub connection comes back by itself after the client's own reconnect tries failed,
//! so waiters are woken by the release, not by the cap on a notification-mode sleep. The
//! restart scenario runs on a single server and on five Redlock nodes.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::private::PrivateRedis;
use common::{RedisHarness, Topology};
use lockkit_core::testing::waiters_are_granted_across_a_server_restart;
use lockkit_core::{LockClient, LockOptions};
use lockkit_redis::{RedisBackend, RedisConfig, RedlockConfig};

/// Keeps its data across a kill: the holder's grant survives the restart, so the waiters
/// depend on its release reaching them.
const PERSISTENT: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

/// Longer than the client library's own reconnect tries (two, within ~200 ms).
const DOWN: Duration = Duration::from_millis(700);

fn harness(server: &PrivateRedis) -> RedisHarness {
    RedisHarness {
        topology: Topology::Single(RedisConfig::from_url(&server.url()).unwrap()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_across_a_restart_of_the_server() {
    let Some(mut server) = PrivateRedis::start(PERSISTENT) else {
        return;
    };
    let harness = harness(&server);
    let server = &mut server;
    let restart = move || async move { tokio::task::block_in_place(|| server.restart(DOWN)) };
    waiters_are_granted_across_a_server_restart(&harness, restart)
        .await
        .unwrap();
}

/// Redlock: all five nodes restart (one after the other, each down for `DOWN`) while the
/// waiters queue; the waiters listen on one node's notifications and must hear the release
/// (or poll) after it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_waiters_are_granted_across_a_restart_of_every_node() {
    let mut nodes = Vec::new();
    for _ in 0..5 {
        let Some(node) = PrivateRedis::start(PERSISTENT) else {
            return;
        };
        nodes.push(node);
    }
    let url = format!(
        "redlock://{}",
        nodes
            .iter()
            .map(PrivateRedis::addr)
            .collect::<Vec<_>>()
            .join(",")
    );
    let harness = RedisHarness {
        topology: Topology::Redlock(RedlockConfig::from_url(&url).unwrap()),
    };
    let nodes = &mut nodes;
    let restart = move || async move {
        tokio::task::block_in_place(|| {
            for node in nodes.iter_mut() {
                node.restart(DOWN);
            }
        })
    };
    waiters_are_granted_across_a_server_restart(&harness, restart)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_after_the_server_kills_the_pubsub_connection() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    let harness = harness(&server);
    let kill = || async {
        let mut admin = common::connect(&server.addr()).await.unwrap();
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(
            killed >= 2,
            "the waiters' pub/sub connections were not there"
        );
    };
    waiters_are_granted_across_a_server_restart(&harness, kill)
        .await
        .unwrap();
}

/// How many clients' inboxes (the channels a mutex waiter's hand-over is announced on) have
/// a listener on the server.
async fn listening_inboxes(addr: &str) -> usize {
    let Ok(mut admin) = common::connect(addr).await else {
        return 0;
    };
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("lockkit:inbox:*")
        .query_async(&mut admin)
        .await
        .unwrap_or_default();
    channels.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pubsub_connection_comes_back_after_the_reconnect_tries_failed() {
    let Some(mut server) = PrivateRedis::start(PERSISTENT) else {
        return;
    };
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let config = RedisConfig::from_url(&server.url()).unwrap();
    let ttl = Duration::from_secs(60);
    // A cap far above the handoff: a waiter woken by it was not woken by the release.
    let cap = Duration::from_secs(30);
    let client = |options: LockOptions| {
        let config = config.clone();
        let namespace = namespace.clone();
        async move {
            LockClient::with_options(
                Arc::new(RedisBackend::connect(config).await.unwrap()),
                &namespace,
                options,
            )
            .unwrap()
        }
    };
    let holder = client(LockOptions::default().with_ttl(ttl))
        .await
        .mutex("k")
        .unwrap()
        .lock()
        .await
        .unwrap();
    let waiters = client(
        LockOptions::default()
            .with_ttl(ttl)
            .with_backoff(Duration::from_millis(5), cap),
    )
    .await;
    let mutex = waiters.mutex("k").unwrap();
    let waiter = tokio::spawn(async move {
        let guard = mutex.lock().await.unwrap();
        let granted = Instant::now();
        guard.release().await.unwrap();
        granted
    });
    let by = Instant::now() + Duration::from_secs(10);
    while listening_inboxes(&server.addr()).await < 1 {
        assert!(Instant::now() < by, "the waiter never subscribed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    tokio::task::block_in_place(|| server.restart(DOWN));

    // Nobody but the pub/sub connection's own recovery sends anything on it now: the waiter
    // is subscribed again on the restarted server, well within the cap.
    let by = Instant::now() + Duration::from_secs(10);
    while listening_inboxes(&server.addr()).await < 1 {
        assert!(
            Instant::now() < by,
            "the pub/sub connection did not come back after the restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the waiter settle into its wait on the renewed subscription.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert!(holder.release().await.unwrap(), "the grant did not survive");
    let granted = tokio::time::timeout(cap, waiter).await;
    let granted = granted
        .expect("the waiter slept through the release")
        .unwrap();
    assert!(
        granted.duration_since(released) < cap / 3,
        "the waiter was woken {:?} after the release: by the cap, not the release",
        granted.duration_since(released)
    );
}

/// The waiter's pub/sub connection goes half-open (its server side is gone, and nothing
/// tells the client: the link went dead while the server closed it): no message and no
/// disconnection arrive on it. The connection's periodic ping finds it out within seconds, and
/// the waiter is woken and granted then, not by its timer half a minute later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_lost_on_a_half_open_pubsub_connection_arrives_by_the_probe() {
    use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let config = RedisConfig::from_url(&server.url()).unwrap();
    let proxy = FaultProxy::start(&config.hosts).await.unwrap();
    let mut through = config.clone();
    through.hosts = proxy.hosts();
    through.response_timeout = Duration::from_secs(1);
    let ttl = Duration::from_secs(60);
    // A cap far above the bound below: a waiter woken by it was not woken by the probe.
    let cap = Duration::from_secs(30);
    let holder = LockClient::with_options(
        Arc::new(RedisBackend::connect(config).await.unwrap()),
        &namespace,
        LockOptions::default().with_ttl(ttl),
    )
    .unwrap();
    let held = holder.mutex("k").unwrap().lock().await.unwrap();
    let waiters = LockClient::with_options(
        Arc::new(RedisBackend::connect(through).await.unwrap()),
        &namespace,
        LockOptions::default()
            .with_ttl(ttl)
            .with_backoff(Duration::from_millis(5), cap),
    )
    .unwrap();
    let mutex = waiters.mutex("k").unwrap();
    let waiter = tokio::spawn(async move {
        let guard = mutex.lock().await.unwrap();
        let granted = Instant::now();
        guard.release().await.unwrap();
        granted
    });
    let by = Instant::now() + Duration::from_secs(10);
    while listening_inboxes(&server.addr()).await < 1 {
        assert!(Instant::now() < by, "the waiter never subscribed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The server closes the waiter's pub/sub connection while the link is dead: the proxy
    // keeps the client's side open and tells it nothing. A dead link loses no request bytes of
    // a live connection (TCP sends them again once it is back): requests wait, replies and the
    // server's close are lost. (Dropping a request mid-stream, which TCP never does, would
    // leave the client's pipeline a reply short for good.)
    proxy.set(Direction::Requests, Fault::Pause);
    proxy.set(Direction::Replies, Fault::Blackhole);
    let mut admin = common::connect(&server.addr()).await.unwrap();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(killed, 1, "the waiter's pub/sub connection was not there");
    proxy.heal();
    let released = Instant::now();
    assert!(held.release().await.unwrap());
    let granted = tokio::time::timeout(cap, waiter)
        .await
        .expect("the waiter slept through the release")
        .unwrap();
    assert!(
        granted.duration_since(released) < Duration::from_secs(6),
        "the waiter was granted {:?} after the release: by its timer, not the probe",
        granted.duration_since(released)
    );
}
