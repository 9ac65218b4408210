//! `lockkit list` and `lockkit release --force` end to end on every backend of
//! `compose/up.sh`: the held locks of the namespace by prefix, the confirmation, and the
//! broken holder (a `lockkit run`) that notices at its next renewal and stops its command.
#![cfg(all(feature = "cli", feature = "redis", feature = "etcd", feature = "zk"))]
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod cli_env;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use cli_env::{Env, signal, wait_exit};
use nix::sys::signal::Signal;

fn listed(env: &Env, prefix: &str) -> BTreeMap<String, serde_json::Value> {
    let out = env.run(&["--json", "list", prefix]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let lock: serde_json::Value = serde_json::from_str(line).unwrap();
            (lock["key"].as_str().unwrap().to_owned(), lock)
        })
        .collect()
}

fn operators_see_and_break_locks(var: &str) {
    let Some(env) = Env::new(var) else { return };
    let mut broken = env.spawn_holder("ops-a", &["--ttl", "2s", "--grace", "1s"], "");
    let mut other = env.spawn_holder("ops-b", &[], "");
    let mut unrelated = env.spawn_holder("misc", &[], "");

    let locks = listed(&env, "ops-");
    assert_eq!(
        locks.keys().collect::<Vec<_>>(),
        ["ops-a", "ops-b"],
        "{locks:?}"
    );
    for (name, lock) in &locks {
        let status = env.status(name);
        assert_eq!(lock["fencing_token"], status["fencing_token"], "{name}");
    }
    assert_eq!(listed(&env, "").len(), 3);
    let out = env.run(&["list", "ops-"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ops-a: held, fencing token"), "{text}");
    assert!(!text.contains("misc"), "{text}");

    // Declined at the prompt: nothing happens.
    let mut release = env
        .lockkit()
        .args(["release", "--force", "ops-a"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    release.stdin.take().unwrap().write_all(b"n\n").unwrap();
    let out = release.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let prompt = String::from_utf8_lossy(&out.stderr);
    assert!(prompt.contains("checks tokens"), "{prompt}");
    assert!(prompt.contains("[y/N]"), "{prompt}");
    assert_eq!(env.status("ops-a")["held"], true);

    let out = env.run(&["--json", "release", "--force", "--yes", "ops-a"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["was_held"], true);
    assert_eq!(report["fencing_token"], locks["ops-a"]["fencing_token"]);
    // The broken holder's guard reports the lock lost at its next renewal: lockkit run
    // terminates its command and exits 76.
    assert_eq!(wait_exit(&mut broken, Duration::from_secs(20)), 76);
    assert_eq!(
        listed(&env, "ops-").keys().collect::<Vec<_>>(),
        ["ops-b"],
        "after the break"
    );

    let out = env.run(&["--json", "release", "--force", "--yes", "never-held"]);
    assert_eq!(out.status.code(), Some(0));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["was_held"], false);
    let out = env.run(&["release", "ops-b"]);
    assert_eq!(out.status.code(), Some(2), "release without --force");

    for holder in [&mut other, &mut unrelated] {
        signal(holder.id(), Signal::SIGTERM);
        wait_exit(holder, Duration::from_secs(10));
    }
    assert!(listed(&env, "").is_empty());
}

#[test]
fn operators_see_and_break_locks_on_redis() {
    operators_see_and_break_locks("LOCKKIT_TEST_REDIS_URL");
}

#[test]
fn operators_see_and_break_locks_on_sentinel() {
    operators_see_and_break_locks("LOCKKIT_TEST_SENTINEL_URL");
}

#[test]
fn operators_see_and_break_locks_on_redis_cluster() {
    operators_see_and_break_locks("LOCKKIT_TEST_REDIS_CLUSTER_URL");
}

#[test]
fn operators_see_and_break_locks_on_redlock() {
    operators_see_and_break_locks("LOCKKIT_TEST_REDLOCK_URL");
}

#[test]
fn operators_see_and_break_locks_on_etcd() {
    operators_see_and_break_locks("LOCKKIT_TEST_ETCD_URL");
}

#[test]
fn operators_see_and_break_locks_on_zookeeper() {
    operators_see_and_break_locks("LOCKKIT_TEST_ZK_URL");
}

#[cfg(feature = "postgres")]
#[test]
fn operators_see_and_break_locks_on_postgres() {
    operators_see_and_break_locks("LOCKKIT_TEST_POSTGRES_URL");
}
