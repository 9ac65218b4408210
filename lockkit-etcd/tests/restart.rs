//! Waiters across a restart of the server: the conformance scenario
//! [`waiters_are_granted_across_a_server_restart`] against a private one-member etcd (on
//! 127.0.0.1, ports 21600-21649, stopped by its PID), restarted on the same data dir and
//! ports while eight waiters queue. Its leases, and with them the holder's and the waiters'
//! keys, survive the restart; every waiter's watch breaks with it and must be opened again.
//! And a holder whose session was lost while the member was down revokes its lease when the
//! member is back.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::testing::waiters_are_granted_across_a_server_restart;
use lockkit_core::{LockClient, LockOptions};
use lockkit_etcd::EtcdBackend;
use nix::sys::signal::Signal;
use support::harness::EtcdHarness;
use support::private::PrivateEtcd;

/// How long the member stays down: longer than a reconnect try of the client.
const DOWN: Duration = Duration::from_millis(700);

async fn waiters_are_granted_across(signal: Signal, name: &str, ports: std::ops::Range<u16>) {
    let Some(mut etcd) = PrivateEtcd::start(name, ports, None) else {
        return;
    };
    let mut config = etcd.config();
    config.prefix = support::PREFIX.to_owned();
    etcd.ready(&config).await;
    let harness = EtcdHarness::connect(config)
        .await
        .expect("a harness over the private etcd");
    let member = &mut etcd;
    let restart = move || async move { member.restart(signal, DOWN).await };
    if let Err(failure) = waiters_are_granted_across_a_server_restart(&harness, restart).await {
        panic!("{failure}; etcd log:\n{}", etcd.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_across_a_crash_and_restart_of_the_member() {
    waiters_are_granted_across(Signal::SIGKILL, "lk-restart-kill", 21600..21620).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_across_a_clean_restart_of_the_member() {
    waiters_are_granted_across(Signal::SIGTERM, "lk-restart-term", 21620..21640).await;
}

/// A holder whose session is lost while the member is down (longer than the TTL) has its
/// lease revoked once the member is back, so its key leaves the queue at once: the restarted
/// member restarts every lease's TTL, and without the revoke the key would hold the lock for
/// that whole TTL more (as a newly elected leader does after the old one died: W5 on etcd).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_lost_while_the_member_is_down_is_revoked_when_it_is_back() {
    let Some(mut etcd) = PrivateEtcd::start("lk-revoke-lost", 21640..21650, None) else {
        return;
    };
    let mut config = etcd.config();
    config.prefix = support::PREFIX.to_owned();
    let ttl = Duration::from_secs(3);
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let client = |backend: EtcdBackend| {
        LockClient::with_options(
            Arc::new(backend),
            &namespace,
            LockOptions::default().with_ttl(ttl),
        )
        .expect("a client")
    };
    let holder = client(etcd.ready(&config).await);
    let guard = holder.mutex("k").unwrap().lock().await.unwrap();

    etcd.restart(Signal::SIGKILL, ttl + Duration::from_millis(500))
        .await;
    assert!(
        guard.is_lost(),
        "the holder did not report its session lost while the member was down"
    );
    let observer = client(etcd.ready(&config).await);
    let back = Instant::now();
    while observer.inspect("k").await.unwrap().is_some() {
        assert!(
            back.elapsed() < ttl / 2,
            "the lost session's key stayed: its lease was not revoked; etcd log:\n{}",
            etcd.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
