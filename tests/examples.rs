//! The scenario examples end to end, as a user runs them: fencing on every server tier (a
//! writer process stopped past its lease has its stale write refused), cron_dedup's elected
//! scheduler on every tier with elections (each tick runs once, and the next candidate takes
//! over from the killed leader), and a tier or lock call that fails shown in the example's
//! table while the rest of the run goes on, with a non-zero exit status.
//!
//! The examples are run from `target/<profile>/examples/`, where `cargo test` builds them
//! (unless `--test` picks single targets: then `cargo build --all-features --examples` first).
#![cfg(all(feature = "redis", feature = "etcd", feature = "zk"))]
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::testing::{backend_missing, endpoint};
use tokio::io::AsyncBufReadExt;

/// A port in this crate's private range that nothing listens on: a tier that is down.
const DEAD: &str = "127.0.0.1:21599";

/// Every tier variable the examples read.
const TIER_VARIABLES: [&str; 6] = [
    "LOCKKIT_TEST_REDIS_URL",
    "LOCKKIT_TEST_SENTINEL_URL",
    "LOCKKIT_TEST_REDLOCK_URL",
    "LOCKKIT_TEST_REDIS_CLUSTER_URL",
    "LOCKKIT_TEST_ETCD_URL",
    "LOCKKIT_TEST_ZK_URL",
];

fn example(name: &str) -> PathBuf {
    let test = std::env::current_exe().unwrap();
    let path = test
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        path.is_file(),
        "{} is not built: run `cargo build --all-features --examples` (cargo test builds it unless --test picks targets)",
        path.display()
    );
    path
}

fn url(var: &str) -> Option<String> {
    let url = endpoint(var);
    if url.is_none() {
        backend_missing(var);
    }
    url
}

/// `example` with exactly the tiers of `tiers` (variable, URL): no other variable, and an
/// empty compose directory so that no endpoints file fills in the others.
fn with_tiers(example_name: &str, tiers: &[(&str, &str)]) -> (Command, tempdir::Dir) {
    let dir = tempdir::Dir::new();
    let mut command = Command::new(example(example_name));
    command
        .env("LOCKKIT_COMPOSE_DIR", &dir.0)
        .env_remove("LOCKKIT_REQUIRE_BACKENDS");
    for var in TIER_VARIABLES {
        command.env_remove(var);
    }
    for (var, url) in tiers {
        command.env(var, url);
    }
    (command, dir)
}

mod tempdir {
    /// A fresh directory, removed on drop.
    pub(crate) struct Dir(pub(crate) std::path::PathBuf);

    impl Dir {
        pub(crate) fn new() -> Dir {
            let path =
                std::env::temp_dir().join(format!("lk-examples-{:08x}", rand::random::<u32>()));
            std::fs::create_dir_all(&path).unwrap();
            Dir(path)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn fencing_refuses_the_paused_writers_stale_write(var: &str) {
    let Some(url) = url(var) else { return };
    let output = Command::new(example("fencing")).arg(&url).output().unwrap();
    let (stdout, stderr) = text(&output);
    assert!(
        output.status.success(),
        "fencing {url} failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("is paused (SIGSTOP)"), "{stdout}");
    assert!(stdout.contains("B writes: stored"), "{stdout}");
    assert!(
        stdout.contains("refused, the storage has seen a newer token"),
        "{stdout}"
    );
}

#[test]
fn fencing_on_redis_refuses_the_paused_writers_stale_write() {
    fencing_refuses_the_paused_writers_stale_write("LOCKKIT_TEST_REDIS_URL");
}

#[test]
fn fencing_on_sentinel_refuses_the_paused_writers_stale_write() {
    fencing_refuses_the_paused_writers_stale_write("LOCKKIT_TEST_SENTINEL_URL");
}

#[test]
fn fencing_on_redlock_refuses_the_paused_writers_stale_write() {
    fencing_refuses_the_paused_writers_stale_write("LOCKKIT_TEST_REDLOCK_URL");
}

#[test]
fn fencing_on_etcd_refuses_the_paused_writers_stale_write() {
    fencing_refuses_the_paused_writers_stale_write("LOCKKIT_TEST_ETCD_URL");
}

#[test]
fn fencing_on_zookeeper_refuses_the_paused_writers_stale_write() {
    fencing_refuses_the_paused_writers_stale_write("LOCKKIT_TEST_ZK_URL");
}

/// `cron_dedup --quick --elected URL`: 5 ticks, each run once; the leader killed after tick 1
/// and another instance, in a higher term, running the ticks after it.
fn the_elected_scheduler_runs_each_tick_once_and_hands_over(url: &str) {
    let output = Command::new(example("cron_dedup"))
        .args(["--quick", "--elected", url])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert!(
        output.status.success(),
        "cron_dedup --elected {url} failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("5 of 5 ticks ran exactly once"), "{stdout}");
    assert!(stdout.contains("killed the leader, instance "), "{stdout}");
    // "| tick | 1 | instance (term) |  |"
    let ran: Vec<(String, u64)> = stdout
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains(" | 1 | "))
        .map(|l| {
            let by = l.split(" | ").nth(2).unwrap();
            let (instance, term) = by.split_once(" (").unwrap();
            (
                instance.to_owned(),
                term.trim_end_matches(')').parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(ran.len(), 5, "{stdout}");
    assert_eq!(ran[0], ran[1], "one leader before the kill: {stdout}");
    assert_ne!(
        ran[1].0, ran[2].0,
        "another instance after the kill: {stdout}"
    );
    assert!(
        ran[2].1 > ran[1].1,
        "a higher term after the kill: {stdout}"
    );
    assert!(ran[2..].iter().all(|r| *r == ran[2]), "{stdout}");
    assert!(
        stdout.contains(&format!("term {} (\"instance-{}\")", ran[2].1, ran[2].0)),
        "the observer saw the new leader: {stdout}"
    );
}

#[test]
fn the_elected_scheduler_on_memory_runs_each_tick_once_and_hands_over() {
    the_elected_scheduler_runs_each_tick_once_and_hands_over("memory://");
}

#[test]
fn the_elected_scheduler_on_redis_runs_each_tick_once_and_hands_over() {
    let Some(url) = url("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    the_elected_scheduler_runs_each_tick_once_and_hands_over(&url);
}

#[test]
fn the_elected_scheduler_on_sentinel_runs_each_tick_once_and_hands_over() {
    let Some(url) = url("LOCKKIT_TEST_SENTINEL_URL") else {
        return;
    };
    the_elected_scheduler_runs_each_tick_once_and_hands_over(&url);
}

#[test]
fn the_elected_scheduler_on_etcd_runs_each_tick_once_and_hands_over() {
    let Some(url) = url("LOCKKIT_TEST_ETCD_URL") else {
        return;
    };
    the_elected_scheduler_runs_each_tick_once_and_hands_over(&url);
}

#[test]
fn the_elected_scheduler_on_zookeeper_runs_each_tick_once_and_hands_over() {
    let Some(url) = url("LOCKKIT_TEST_ZK_URL") else {
        return;
    };
    the_elected_scheduler_runs_each_tick_once_and_hands_over(&url);
}

#[test]
fn seckill_reports_an_unreachable_tier_in_its_table_and_runs_the_other_strategies() {
    let Some(redis) = url("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    let dead_etcd = format!("etcd://{DEAD}");
    let (mut command, _dir) = with_tiers(
        "seckill",
        &[
            ("LOCKKIT_TEST_REDIS_URL", &redis),
            ("LOCKKIT_TEST_ETCD_URL", &dead_etcd),
        ],
    );
    let output = command.arg("--quick").output().unwrap();
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("| read-then-write under a lock: etcd-3 | FAILED: etcd: "),
        "{stdout}"
    );
    for after in [
        "| read-then-write under a lock: redis | 10 | 0 |",
        "| Lua check-and-decrement | 10 | 0 |",
        "| quota list LPOP + per-user SADD | 10 | 0 | 0 |",
    ] {
        assert!(stdout.contains(after), "no row {after:?} in\n{stdout}");
    }
}

#[test]
fn compare_reports_an_unreachable_tier_in_its_table_and_runs_the_other_tiers() {
    let Some(redis) = url("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    let dead_zk = format!("zk://{DEAD}");
    let (mut command, _dir) = with_tiers(
        "compare",
        &[
            ("LOCKKIT_TEST_REDIS_URL", &redis),
            ("LOCKKIT_TEST_ZK_URL", &dead_zk),
        ],
    );
    let output = command.args(["--quick", "--speed-only"]).output().unwrap();
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("| zk-3 | FAILED | n/a |"), "{stdout}");
    assert!(stdout.contains("- zk-3 connect FAILED: zk: "), "{stdout}");
    // The tiers before and after it ran; their W2 kept every update.
    for row in ["| memory | local | ", "| redis | single | "] {
        let line = stdout.lines().find(|l| l.starts_with(row));
        assert!(line.is_some(), "no row {row:?} in\n{stdout}");
        assert!(!line.unwrap().contains("FAILED"), "{stdout}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cron_dedup_reports_failed_try_locks_in_the_tick_rows_and_exits_with_1() {
    let Some(redis) = url("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    let host = redis
        .split_once("://")
        .map_or(redis.as_str(), |(_, rest)| rest)
        .split(['/', '?'])
        .next()
        .unwrap()
        .to_owned();
    assert!(!host.contains('@'), "a Redis URL without credentials");
    let proxy = FaultProxy::start(&[host]).await.unwrap();
    let mut child = tokio::process::Command::new(example("cron_dedup"))
        .args(["--quick", &format!("redis://{}", proxy.hosts()[0])])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let connected = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            if line.contains("instances connected") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(connected, Ok(true), "cron_dedup never connected");
    // Ticks fire every 200 ms from 200 ms on: the later ones meet a dead network.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.set(Direction::Both, Fault::Blackhole);
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("cron_dedup did not end within 60 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("| tick | runs | by instance | errors |"),
        "{stdout}"
    );
    let last = stdout
        .lines()
        .find(|l| l.starts_with("| 4 |"))
        .unwrap_or_else(|| panic!("no row for the last tick in\n{stdout}"));
    assert!(last.contains("instance "), "{stdout}");
    assert!(stdout.contains("try_lock calls failed"), "{stdout}");
}
