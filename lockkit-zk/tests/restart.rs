//! Waiters across a restart of the server: the conformance scenario
//! [`waiters_are_granted_across_a_server_restart`] against a private standalone ZooKeeper
//! (on 127.0.0.1, ports 21650-21699, stopped by its PID), restarted on the same data while
//! eight waiters queue, well within the session timeout: the server keeps its sessions
//! (and their ephemeral lock nodes) across the restart, and every client must reconnect
//! to it and find its watch again.
//!
//! The restart hook returns once the server serves *and* every client of the harness has
//! reconnected, so the scenario's bound (one missed notification, 300 ms, plus 1 s of
//! slack after the release) measures what the backend does after the reconnect: the
//! waiters' watches come back (`zookeeper-client` sends them again with `SetWatches`, so
//! a waiter sees its predecessor's `NodeDeleted`, not a session event) and the grants
//! follow one another. The reconnect itself is the client library's: it retries a server
//! with an exponential backoff (about 100 ms × 2^k plus up to 100 ms of jitter per round
//! for one host, `IterableEndpoints::timeout` in zookeeper-client 0.11), not configurable,
//! so a client reconnects up to about as long after the server is back as the server was
//! away (measured with both cores busy: 0.6-1.35 s after 1.1-3.9 s away). A bound counted
//! from the server's return would test that backoff, not lockkit.

#[allow(dead_code)] // the helpers the other test files need too
mod support;

use std::path::PathBuf;
use std::time::Duration;

use lockkit_core::testing::waiters_are_granted_across_a_server_restart;
use lockkit_zk::ZkConfig;
use nix::sys::signal::Signal;
use support::harness::ZkHarness;
use support::server::{ZkServer, installed};
use support::{TEST_CHROOT, admin};

/// How long the server stays down (its JVM takes about as long again to start).
const DOWN: Duration = Duration::from_millis(700);
/// Far more than a reconnect needs (see the file's doc).
const RECONNECT_WITHIN: Duration = Duration::from_secs(30);

async fn waiters_are_granted_across(signal: Signal, name: &str, ports: std::ops::Range<u16>) {
    if !installed() {
        return;
    }
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (mut server, port) = tokio::task::block_in_place(|| ZkServer::standalone(&dir, ports));
    let mut config = ZkConfig::from_url(&format!("zk://127.0.0.1:{port}")).expect("url");
    config.chroot = TEST_CHROOT.to_owned();
    let harness = ZkHarness::new(config.clone(), admin(&config, TEST_CHROOT).await);
    let restarted = &mut server;
    let clients = &harness;
    let restart = move || async move {
        tokio::task::block_in_place(|| restarted.stop(signal));
        tokio::time::sleep(DOWN).await;
        tokio::task::block_in_place(|| {
            restarted.launch();
            restarted.serving(port);
        });
        clients.reconnected(RECONNECT_WITHIN).await;
    };
    let outcome = waiters_are_granted_across_a_server_restart(&harness, restart).await;
    let log = server.log();
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(failure) = outcome {
        panic!("{failure}; ZooKeeper log:\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_across_a_crash_and_restart_of_the_server() {
    waiters_are_granted_across(Signal::SIGKILL, "lk-zk-restart-kill", 21650..21670).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_across_a_clean_restart_of_the_server() {
    waiters_are_granted_across(Signal::SIGTERM, "lk-zk-restart-term", 21670..21690).await;
}
