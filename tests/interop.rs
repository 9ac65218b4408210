//! Interop of the `lockkit run` command (docs/interop.md): `lockkit run KEY -- CMD` and a
//! Curator `InterProcessMutex` on ZooKeeper, and `lockkit run` and `etcdctl lock` on etcd,
//! exclude each other, pass the lock back and forth, and hand out one increasing sequence of
//! fencing tokens. The library's side of the same checks is in lockkit-zk's
//! `tests/interop_curator.rs` and lockkit-etcd's `tests/interop_etcdctl.rs`, whose contenders
//! (`CuratorContender.java`, `section.sh`) and checks (`sections.rs`) this file reuses.
//!
//! Each test skips with a notice when its server or tool is missing, and fails then when
//! `LOCKKIT_REQUIRE_BACKENDS=1`.
#![cfg(all(feature = "cli", any(feature = "zk", feature = "etcd")))]
#![allow(dead_code)] // each test uses a part of the shared modules

#[path = "../lockkit-zk/tests/support/curator.rs"]
mod curator;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockkit_core::testing::sections::Sections;
use lockkit_core::testing::{backend_missing, endpoint};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/lockkit-etcd/tests/interop/section.sh"
);
/// How long each critical section holds the lock.
const HOLD: Duration = Duration::from_millis(20);
/// Sections per side.
const SECTIONS: u64 = 20;
/// The chroot (ZooKeeper) and prefix (etcd) the crates' tests use.
const TEST_ROOT: &str = "lockkit-test";

fn namespace(what: &str) -> String {
    format!("lk-run-{what}-{:08x}", rand::random::<u32>())
}

fn hold_seconds() -> String {
    format!("{:.3}", HOLD.as_secs_f64())
}

/// `SECTIONS` runs of `lockkit run KEY -- sh section.sh DIR lockkit HOLD`, one after the other,
/// each its own process with its own session.
fn run_lockkit_sections(url: &str, namespace: &str, key: &str, dir: &Path) {
    for _ in 0..SECTIONS {
        let status = Command::new(env!("CARGO_BIN_EXE_lockkit"))
            .env_remove("LOCKKIT_CONFIG")
            .env("LOCKKIT_URL", url)
            .env("LOCKKIT_NAMESPACE", namespace)
            .args(["run", "--wait", "60s", key, "--", "sh", SCRIPT])
            .arg(dir)
            .args(["lockkit", &hold_seconds()])
            .stdout(Stdio::null())
            .status()
            .expect("run lockkit");
        assert!(status.success(), "lockkit run {key} failed: {status}");
    }
}

fn finish(sections: &Sections, started: Instant, what: &str) {
    let outcome = sections.outcome();
    outcome.assert_exclusive(2 * SECTIONS, 4);
    eprintln!(
        "{what}: {} sections, the lock passed between the sides {} times, {:?} in all",
        outcome.history.len(),
        outcome.handovers_between_sides(),
        started.elapsed()
    );
    if let Some(parent) = sections.dir().parent() {
        let _ = std::fs::remove_dir_all(parent);
    }
}

/// `lockkit run` on `zk://hosts/{chroot}` and Curator connected to `hosts/{chroot}` with an
/// `InterProcessMutex` on `/{namespace}/{key}`: 40 sections, never two at once.
#[cfg(feature = "zk")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockkit_run_and_curator_exclude_each_other() {
    let Some(url) = endpoint("LOCKKIT_TEST_ZK_URL") else {
        backend_missing("the ZooKeeper ensemble (LOCKKIT_TEST_ZK_URL)");
        return;
    };
    let Some(classpath) = curator::curator_classpath() else {
        return;
    };
    let started = Instant::now();
    let config = lockkit::zk::ZkConfig::from_url(&url).expect("LOCKKIT_TEST_ZK_URL");
    let url = format!("zk://{}/{TEST_ROOT}", config.hosts.join(","));
    let (namespace, key) = (namespace("curator"), "shared-job");
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("interop-{namespace}"));
    let classes = tmp.join("classes");
    curator::compile(&classpath, &classes);
    let sections = Sections::new(&tmp, "sections");

    // lockkit creates the chroot should it be missing (Curator would not): check it answers.
    let status = Command::new(env!("CARGO_BIN_EXE_lockkit"))
        .env_remove("LOCKKIT_CONFIG")
        .env("LOCKKIT_URL", &url)
        .env("LOCKKIT_NAMESPACE", &namespace)
        .args(["status", key])
        .stdout(Stdio::null())
        .status()
        .expect("lockkit status");
    assert!(status.success(), "lockkit status {key}: {status}");
    let args = [
        format!("{}/{TEST_ROOT}", config.hosts.join(",")),
        format!("/{namespace}/{key}"),
        SECTIONS.to_string(),
        HOLD.as_millis().to_string(),
        sections.dir().display().to_string(),
        "curator".to_owned(),
    ];
    let mut java = curator::Curator::start(&classpath, &classes, &args);
    java.go();
    let lockkit_side = {
        let dir = sections.dir().to_owned();
        let namespace = namespace.clone();
        tokio::task::spawn_blocking(move || run_lockkit_sections(&url, &namespace, key, &dir))
    };
    lockkit_side.await.expect("the lockkit run contender");
    java.finish(Duration::from_secs(60)).await;
    finish(&sections, started, "lockkit run beside Curator");
}

/// `lockkit run` on `etcd://hosts/{prefix}` and `etcdctl lock {prefix}/{namespace}/{key}`:
/// 40 sections, never two at once.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockkit_run_and_etcdctl_lock_exclude_each_other() {
    let Some(url) = endpoint("LOCKKIT_TEST_ETCD_URL") else {
        backend_missing("etcd (LOCKKIT_TEST_ETCD_URL)");
        return;
    };
    let etcdctl_runs = Command::new("etcdctl")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !etcdctl_runs {
        backend_missing("etcdctl (Debian etcd-client)");
        return;
    }
    let started = Instant::now();
    let config = lockkit::etcd::EtcdConfig::from_url(&url).expect("LOCKKIT_TEST_ETCD_URL");
    let endpoints = config.endpoints.join(",");
    let url = format!("etcd://{endpoints}/{TEST_ROOT}");
    let (namespace, key) = (namespace("etcdctl"), "shared-job");
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("interop-{namespace}"));
    let sections = Sections::new(&tmp, "sections");

    let name = format!("{TEST_ROOT}/{namespace}/{key}");
    let etcdctl_side = {
        let dir = sections.dir().to_owned();
        tokio::task::spawn_blocking(move || {
            for _ in 0..SECTIONS {
                let status = Command::new("etcdctl")
                    .env("ETCDCTL_API", "3")
                    .env("ETCDCTL_ENDPOINTS", &endpoints)
                    .args(["lock", &name, "--", "sh", SCRIPT])
                    .arg(&dir)
                    .args(["etcdctl", &hold_seconds()])
                    .stdout(Stdio::null())
                    .status()
                    .expect("run etcdctl lock");
                assert!(status.success(), "etcdctl lock {name} failed: {status}");
            }
        })
    };
    let lockkit_side = {
        let dir = sections.dir().to_owned();
        let namespace = namespace.clone();
        tokio::task::spawn_blocking(move || run_lockkit_sections(&url, &namespace, key, &dir))
    };
    lockkit_side.await.expect("the lockkit run contender");
    etcdctl_side.await.expect("the etcdctl contender");
    finish(&sections, started, "lockkit run beside etcdctl");
}
