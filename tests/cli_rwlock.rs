//! `lockkit run --read` / `--write` end to end: read runs share KEY, a write run holds it
//! alone, a write run that waits keeps new read runs out, every run sees its mode and
//! token, and Redlock, which has no read-write locks, says so. Cross-process tests run on the
//! single Redis, etcd and ZooKeeper of `compose/up.sh`.
#![cfg(all(feature = "cli", feature = "redis", feature = "etcd", feature = "zk"))]
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

#[macro_use]
mod cli_env;

use std::process::Stdio;
use std::time::{Duration, Instant};

use cli_env::{Env, Process, wait_exit};

/// `lockkit run MODE [extra] table -- sh -c ...` in the background: its command writes its
/// LOCKKIT_MODE and LOCKKIT_FENCING_TOKEN to `seen-NAME`, touches `ready-NAME` and holds
/// until `stop-NAME` exists.
fn holder(env: &Env, name: &str, mode: &str, extra: &[&str]) -> Process {
    let script = format!(
        "cd {dir} || exit 9; echo \"$LOCKKIT_MODE $LOCKKIT_FENCING_TOKEN\" > seen-{name}; \
         touch ready-{name}; while [ ! -e stop-{name} ]; do sleep 0.05; done",
        dir = env.dir.display()
    );
    Process(
        env.lockkit()
            .args(["run", mode])
            .args(extra)
            .args(["table", "--", "sh", "-c", &script])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// The mode and token a holder's command saw.
fn seen(env: &Env, name: &str) -> (String, u64) {
    let seen = env.read(&format!("seen-{name}"));
    let (mode, token) = seen.trim().split_once(' ').unwrap();
    (mode.to_owned(), token.parse().unwrap())
}

/// `lockkit run [extra] table -- touch ran` in the foreground: its exit code and stderr.
fn try_run(env: &Env, extra: &[&str]) -> (Option<i32>, String) {
    let out = env
        .lockkit()
        .arg("run")
        .args(extra)
        .args(["table", "--", "touch"])
        .arg(env.file("ran"))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

on_every_server!(readers_share_and_a_waiting_writer_goes_before_new_readers);
fn readers_share_and_a_waiting_writer_goes_before_new_readers(var: &str) {
    let Some(env) = Env::new(var) else {
        return;
    };
    let readers: Vec<Process> = ["r1", "r2", "r3"]
        .iter()
        .map(|name| holder(&env, name, "--read", &[]))
        .collect();
    for name in ["r1", "r2", "r3"] {
        env.wait_file(&format!("ready-{name}"));
    }
    let (code, stderr) = try_run(&env, &["--write", "--no-wait"]);
    assert_eq!(code, Some(75), "a write ran beside three reads: {stderr}");
    assert!(stderr.contains("held by someone else"), "{stderr}");

    let mut writer = holder(&env, "w", "--write", &["--wait", "60s"]);
    let by = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, stderr) = try_run(&env, &["--read", "--no-wait"]);
        if code == Some(75) {
            assert!(stderr.contains("a writer waits for it"), "{stderr}");
            break;
        }
        assert_eq!(code, Some(0), "{stderr}");
        assert!(
            Instant::now() < by,
            "a waiting write run never kept new reads out"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !env.file("ready-w").exists(),
        "the write run ran while reads held"
    );
    let mut late_reader = holder(&env, "r4", "--read", &["--wait", "60s"]);
    for name in ["r1", "r2", "r3"] {
        std::fs::write(env.file(&format!("stop-{name}")), "").unwrap();
    }
    for mut reader in readers {
        assert_eq!(wait_exit(&mut reader.0, Duration::from_secs(15)), 0);
    }
    env.wait_file("ready-w");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !env.file("ready-r4").exists(),
        "a read run ran beside the write run"
    );
    std::fs::write(env.file("stop-w"), "").unwrap();
    assert_eq!(wait_exit(&mut writer.0, Duration::from_secs(15)), 0);
    env.wait_file("ready-r4");
    std::fs::write(env.file("stop-r4"), "").unwrap();
    assert_eq!(wait_exit(&mut late_reader.0, Duration::from_secs(15)), 0);

    let (mode, written) = seen(&env, "w");
    assert_eq!(mode, "write");
    for name in ["r1", "r2", "r3"] {
        let (mode, read) = seen(&env, name);
        assert_eq!(mode, "read");
        assert!(
            written > read,
            "the write's token {written} is not above an earlier read's {read}"
        );
    }
}

#[test]
fn the_modes_exclude_each_other_and_permits() {
    let env = Env::memory();
    for extra in [
        &["--read", "--write"][..],
        &["--read", "--permits", "2"],
        &["--write", "--permits", "2"],
    ] {
        let (code, stderr) = try_run(&env, extra);
        assert_eq!(code, Some(2), "{extra:?}: {stderr}");
    }
    assert!(!env.file("ran").exists());
    let (code, stderr) = try_run(&env, &["--read"]);
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn redlock_refuses_read_write_locks_and_says_why() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDLOCK_URL") else {
        return;
    };
    for mode in ["--read", "--write"] {
        let (code, stderr) = try_run(&env, &[mode]);
        assert_eq!(code, Some(78), "{stderr}");
        assert!(
            stderr.contains("read-write locks are not supported"),
            "{stderr}"
        );
    }
    assert!(!env.file("ran").exists());
}
