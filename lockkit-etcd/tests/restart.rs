//! Waiters across a restart of the server: the conformance scenario
//! [`waiters_are_granted_across_a_server_restart`] against a private one-member etcd (on
//! 127.0.0.1, ports 21600-21649, stopped by its PID), restarted on the same data dir and
//! ports while eight waiters queue. Its leases, and with them the holder's and the waiters'
//! keys, survive the restart; every waiter's watch breaks with it and must be opened again.

mod support;

use std::time::Duration;

use lockkit_core::testing::waiters_are_granted_across_a_server_restart;
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
