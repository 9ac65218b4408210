//! Waiters and holders that fail, their session revoked, their connections broken, a reply
//! lost or their process killed, neither stall the queue nor free the permits early.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockkit_core::LockClient;
use lockkit_core::backend::lease_of;
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_etcd::{EtcdBackend, EtcdConfig};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::sync::mpsc;

use crate::{CHILD_NAMESPACE, PATIENCE, TTL, client, next_grant, queue_waiter, support};

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
