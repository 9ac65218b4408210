//! The `lockkit` command-line tool end to end against the single Redis of `compose/up.sh`:
//! exit codes, the child's environment, the child terminated when the lock is taken away,
//! signals forwarded, bad configuration and unreachable servers.
#![cfg(all(feature = "cli", feature = "redis"))]
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod cli_env;

use std::process::Command;
use std::time::{Duration, Instant};

use cli_env::{Env, wait_exit};

/// Deletes the Redis key of the lock `key` behind its holder's back.
fn redis_del(env: &Env, key: &str) {
    let port = env.url.rsplit(':').next().unwrap();
    let out = Command::new("redis-cli")
        .args(["-p", port, "DEL", &format!("{{{}/{key}}}", env.namespace)])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "1",
        "the lock key was not there"
    );
}

#[test]
fn run_passes_the_environment_and_the_exit_code_and_releases() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    let out_file = env.file("env");
    let script = format!(
        "printf '%s %s %s' \"$LOCKKIT_KEY\" \"$LOCKKIT_FENCING_TOKEN\" \"$LOCKKIT_BACKEND\" > {}; exit 3",
        out_file.display()
    );
    let out = env.run(&["run", "job", "--", "sh", "-c", &script]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = env.read("env");
    let parts: Vec<&str> = seen.split(' ').collect();
    assert_eq!(parts.len(), 3, "{seen:?}");
    assert_eq!(parts[0], "job");
    assert!(parts[1].parse::<u64>().unwrap() > 0, "{seen:?}");
    assert_eq!(parts[2], "redis");
    assert_eq!(
        env.status("job")["held"],
        false,
        "the lock was not released"
    );

    let out = env.run(&["--json", "run", "job", "--", "true"]);
    assert_eq!(out.status.code(), Some(0));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["released"], true);
    assert_eq!(report["lost"], false);
}

#[test]
fn a_held_lock_is_not_acquired_with_no_wait_or_within_wait() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    let mut holder = env.spawn_holder("busy", &[], "");
    let status = env.status("busy");
    assert_eq!(status["tier"], "single");
    assert!(status["fencing_token"].as_u64().unwrap() > 0);
    assert!(status["remaining_ttl_ms"].as_u64().unwrap() > 0);

    let out = env.run(&["run", "--no-wait", "busy", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let started = Instant::now();
    let out = env.run(&["run", "--wait", "300ms", "busy", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not free within"));

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(holder.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let code = wait_exit(&mut holder, Duration::from_secs(10));
    assert_eq!(code, 128 + 15, "sh died of the forwarded SIGTERM");
    assert_eq!(
        env.status("busy")["held"],
        false,
        "released after the signal"
    );
}

#[test]
fn signals_are_forwarded_to_the_command_and_the_lock_released() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    let marker = env.file("got-int");
    let setup = format!("trap 'echo int > {}; exit 7' INT;", marker.display());
    let mut holder = env.spawn_holder("signalled", &[], &setup);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(holder.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(10)), 7);
    assert_eq!(env.read("got-int").trim(), "int");
    assert_eq!(env.status("signalled")["held"], false);
}

#[test]
fn the_command_is_terminated_when_the_lock_is_taken_away() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    let marker = env.file("got-term");
    let setup = format!("trap 'echo term > {}; exit 0' TERM;", marker.display());
    let mut holder = env.spawn_holder("stolen", &["--ttl", "900ms"], &setup);
    redis_del(&env, "stolen");
    let started = Instant::now();
    assert_eq!(
        wait_exit(&mut holder, Duration::from_secs(10)),
        76,
        "exit code for a lost lock"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "noticed after {:?}",
        started.elapsed()
    );
    assert_eq!(env.read("got-term").trim(), "term");

    // A command that ignores SIGTERM is killed after the grace period.
    let mut holder = env.spawn_holder(
        "stubborn",
        &["--ttl", "900ms", "--grace", "300ms"],
        "trap '' TERM;",
    );
    redis_del(&env, "stubborn");
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(10)), 76);
}

#[test]
fn bad_input_and_unreachable_servers_have_their_exit_codes() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    let out = env
        .lockkit()
        .args(["--url", "redis://h:notaport", "check"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(78),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = env
        .lockkit()
        .env("LOCKKIT_LOCK_TTL", "banana")
        .args(["check"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(78),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = env.run(&["run", "bad/key", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(78),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A 3,000-year lease would let a crashed holder block the key for good.
    let out = env.run(&["run", "--ttl", "99999999999s", "k", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(78),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lock.ttl must be at most"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = env.run(&["run", "k", "--", "/nonexistent/program"]);
    assert_eq!(
        out.status.code(),
        Some(127),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        env.status("k")["held"],
        false,
        "released after a failed start"
    );

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let started = Instant::now();
    let out = env
        .lockkit()
        .args([
            "--json",
            "--url",
            &format!("redis://127.0.0.1:{port}"),
            "check",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(69),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["exit_code"], 69);
    let error = report["error"].as_str().unwrap_or_default();
    assert_eq!(
        error.matches("Connection refused").count(),
        1,
        "the cause is named once: {error}"
    );

    let out = env
        .lockkit()
        .args(["--url", "redis://:hunter2-secret@127.0.0.1:1/0", "check"])
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !all.contains("hunter2-secret"),
        "the password leaked: {all}"
    );

    let out = env.run(&["--json", "check"]);
    assert_eq!(out.status.code(), Some(0));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["tier"], "single");
    for primitive in ["mutex", "election", "semaphore", "rwlock"] {
        assert_eq!(report["primitives"][primitive], "supported", "{report}");
    }
}

/// `--no-fair` waits without a place in line and `--fair` with one: a fair run that came
/// later is handed the lock first, and the non-fair one takes it when nobody queues.
#[test]
fn no_fair_runs_do_not_queue_and_fair_ones_are_handed_the_lock_first() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    let port = env.url.rsplit(':').next().unwrap().to_owned();
    let queued = || {
        let out = Command::new("redis-cli")
            .args(["-p", &port, "ZCARD"])
            .arg(format!("{{{}/line}}:queue", env.namespace))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u32>()
            .unwrap()
    };
    let order = env.file("order");
    let append = |who: &str| format!("echo {who} >> {}", order.display());
    let mut holder = env.spawn_holder("line", &[], "");
    let spawn = |flag: &str, who: &str| {
        env.lockkit()
            .args(["run", flag, "line", "--", "sh", "-c", &append(who)])
            .spawn()
            .unwrap()
    };
    let mut barging = spawn("--no-fair", "non-fair");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(queued(), 0, "a --no-fair run queued");
    let mut fair = spawn("--fair", "fair");
    let by = Instant::now() + Duration::from_secs(15);
    while queued() != 1 {
        assert!(Instant::now() < by, "the --fair run never queued");
        std::thread::sleep(Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(holder.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_exit(&mut holder, Duration::from_secs(10));
    assert_eq!(wait_exit(&mut fair, Duration::from_secs(15)), 0);
    assert_eq!(wait_exit(&mut barging, Duration::from_secs(15)), 0);
    assert_eq!(env.read("order"), "fair\nnon-fair\n");
}
