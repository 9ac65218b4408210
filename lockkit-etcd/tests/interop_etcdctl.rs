//! Interop with etcd's Go concurrency package (docs/interop.md): `etcdctl lock
//! {prefix}/{namespace}/{key} -- CMD`, which takes a `concurrency.Mutex` on that prefix, and
//! lockkit clients locking `key` in `namespace` exclude each other, agree on who is next, and
//! share one sequence of fencing tokens (the create revision of the holder's key).
//!
//! Needs the cluster (`LOCKKIT_TEST_ETCD_URL`) and `etcdctl` (Debian `etcd-client`); without
//! either the test skips with a notice, or fails when `LOCKKIT_REQUIRE_BACKENDS=1`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::testing::backend_missing;
use lockkit_core::testing::sections::Sections;
use lockkit_core::{LockClient, LockOptions};
use lockkit_etcd::{EtcdBackend, EtcdConfig};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/section.sh");

/// How long each critical section holds the lock: long enough that an overlap is all but
/// certain to lose an update.
const HOLD: Duration = Duration::from_millis(20);
const ETCDCTL_SECTIONS: u64 = 20;
const LOCKKIT_CONTENDERS: u64 = 2;
const SECTIONS_EACH: u64 = 10;

/// The name an `etcdctl lock` (or Go `concurrency.NewMutex`) user passes to lock what lockkit
/// calls `key` in `namespace` (docs/interop.md); the Go side adds the trailing `/`.
fn etcd_mutex_prefix(config: &EtcdConfig, namespace: &str, key: &str) -> String {
    format!("{}/{namespace}/{key}", config.prefix)
}

/// Whether `etcdctl` runs; `false` after `backend_missing`.
fn etcdctl_installed() -> bool {
    let runs = Command::new("etcdctl")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !runs {
        backend_missing("etcdctl (Debian etcd-client)");
    }
    runs
}

/// `etcdctl` for the cluster of `config`: endpoints and credentials go by environment (so a
/// password never shows in a process list).
fn etcdctl(config: &EtcdConfig) -> Command {
    let mut command = Command::new("etcdctl");
    command
        .env("ETCDCTL_API", "3")
        .env("ETCDCTL_ENDPOINTS", config.endpoints.join(","));
    if let (Some(user), Some(password)) = (&config.user, &config.password) {
        command.env("ETCDCTL_USER", format!("{user}:{password}"));
    }
    command
}

/// `sections` critical sections one after the other, each in its own `etcdctl lock` process
/// (a new session every time, as a cron job or a shell script would).
fn run_etcdctl_sections(config: &EtcdConfig, name: &str, dir: &Path, sections: u64) {
    for _ in 0..sections {
        let status = etcdctl(config)
            .args(["lock", name, "--", "sh", SCRIPT])
            .arg(dir)
            .args(["etcdctl", &format!("{:.3}", HOLD.as_secs_f64())])
            .stdout(Stdio::null())
            .status()
            .expect("run etcdctl lock");
        assert!(status.success(), "etcdctl lock {name} failed: {status}");
    }
}

async fn lockkit_client(config: &EtcdConfig, namespace: &str) -> LockClient {
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    LockClient::with_options(Arc::new(backend), namespace, LockOptions::default()).expect("client")
}

/// `etcdctl lock {prefix}/{namespace}/{key}` and two lockkit clients on `key` run 40 critical
/// sections between them: never two at once (no section finds another running, no update of
/// the shared counter is lost), the lock passes between etcdctl and lockkit again and again,
/// and the fencing tokens (lockkit's, and the create revision of etcdctl's key) strictly
/// increase in the order the sections ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_and_lockkit_exclude_each_other() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    if !etcdctl_installed() {
        return;
    }
    let started = Instant::now();
    let namespace = support::namespace("lk-etcdctl");
    let key = "shared-job";
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("interop-{namespace}"));
    let sections = Sections::new(&tmp, "sections");

    let name = etcd_mutex_prefix(&config, &namespace, key);
    let etcdctl_side = {
        let (config, dir) = (config.clone(), sections.dir().to_owned());
        tokio::task::spawn_blocking(move || {
            run_etcdctl_sections(&config, &name, &dir, ETCDCTL_SECTIONS);
        })
    };
    let mut tasks = Vec::new();
    for i in 1..=LOCKKIT_CONTENDERS {
        let client = lockkit_client(&config, &namespace).await;
        let sections = sections.clone();
        tasks.push(tokio::spawn(async move {
            let mutex = client.mutex(key).expect("key");
            for _ in 0..SECTIONS_EACH {
                let guard = mutex
                    .lock_timeout(Duration::from_secs(60))
                    .await
                    .expect("lockkit granted");
                sections
                    .run(&format!("lockkit-{i}"), guard.fencing_token().get(), HOLD)
                    .await;
                assert!(guard.release().await.expect("release"), "held to the end");
            }
        }));
    }
    for task in tasks {
        task.await.expect("a lockkit contender");
    }
    etcdctl_side.await.expect("the etcdctl contender");

    let outcome = sections.outcome();
    outcome.assert_exclusive(ETCDCTL_SECTIONS + LOCKKIT_CONTENDERS * SECTIONS_EACH, 4);
    eprintln!(
        "etcdctl interop: {} sections, the lock passed between etcdctl and lockkit {} times, {:?} in all",
        outcome.history.len(),
        outcome.handovers_between_sides(),
        started.elapsed()
    );

    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    support::expect_no_keys(&admin, &namespace, Duration::from_secs(5)).await;
    let _ = std::fs::remove_dir_all(&tmp);
}
