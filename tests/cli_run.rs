//! `lockkit run` keeps its promise, end to end against the servers of `compose/up.sh`: the
//! command dies with lockkit, an interrupted wait leaves nothing queued, each signal reaches
//! the command once, `--json` keeps stdout for itself, and the cron-friendly flags.
#![cfg(all(feature = "cli", feature = "redis"))]
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod cli_env;

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use cli_env::{Env, is_dead, signal, wait_exit};
use nix::sys::signal::Signal;

#[test]
fn the_command_dies_within_a_second_when_lockkit_is_killed() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    let pid_file = env.file("pid");
    let script = format!("echo $$ > {}; exec sleep 30", pid_file.display());
    let mut lockkit = env
        .lockkit()
        .args(["run", "--ttl", "3s", "k", "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    let by = Instant::now() + Duration::from_secs(10);
    let command: u32 = loop {
        if let Ok(pid) = env.read("pid").trim().parse() {
            break pid;
        }
        assert!(Instant::now() < by, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(!is_dead(command));
    lockkit.kill().unwrap(); // SIGKILL: no handler, no clean-up in lockkit
    lockkit.wait().unwrap();
    let killed = Instant::now();
    while !is_dead(command) {
        assert!(
            killed.elapsed() < Duration::from_secs(1),
            "the command outlived lockkit by a second"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A holder of `key`, a waiter interrupted by `sig`, and a waiter queued behind it: when the
/// holder ends, the second waiter is granted at once, not after the first one's entry
/// expires with its lease or session (the TTL, 10 s here).
fn an_interrupted_wait_leaves_nothing_queued(var: &str, sig: Signal) {
    let Some(env) = Env::new(var) else { return };
    let mut holder = env.spawn_holder("q", &["--ttl", "10s"], "");
    let waiter = |name: &str| {
        let ran = env.file(name);
        env.lockkit()
            .args(["run", "--ttl", "10s", "--wait", "60s", "q", "--", "touch"])
            .arg(&ran)
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut first = waiter("first");
    env.wait_status("q", "had a waiter", |s| s["waiters"] == 1);
    let mut second = waiter("second");
    env.wait_status("q", "had two waiters", |s| s["waiters"] == 2);

    signal(first.id(), sig);
    assert_eq!(
        wait_exit(&mut first, Duration::from_secs(10)),
        128 + sig as i32,
        "the interrupted waiter's exit code"
    );
    env.wait_status("q", "lost the interrupted waiter", |s| s["waiters"] == 1);
    signal(holder.id(), Signal::SIGTERM);
    wait_exit(&mut holder, Duration::from_secs(10));
    let released = Instant::now();
    assert_eq!(wait_exit(&mut second, Duration::from_secs(30)), 0);
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "the next waiter was granted {:?} after the release (the TTL is 10 s)",
        released.elapsed()
    );
    assert!(env.file("second").exists());
    assert!(!env.file("first").exists(), "the interrupted waiter ran");
}

#[cfg(feature = "etcd")]
#[test]
fn sigint_while_waiting_on_etcd_abandons_the_queue_entry() {
    an_interrupted_wait_leaves_nothing_queued("LOCKKIT_TEST_ETCD_URL", Signal::SIGINT);
}

#[cfg(feature = "zk")]
#[test]
fn sigint_while_waiting_on_zookeeper_abandons_the_queue_entry() {
    an_interrupted_wait_leaves_nothing_queued("LOCKKIT_TEST_ZK_URL", Signal::SIGINT);
}

#[cfg(feature = "postgres")]
#[test]
fn sigint_while_waiting_on_postgres_abandons_the_queue_entry() {
    an_interrupted_wait_leaves_nothing_queued("LOCKKIT_TEST_POSTGRES_URL", Signal::SIGINT);
}

#[cfg(feature = "etcd")]
#[test]
fn sigterm_while_waiting_on_etcd_abandons_the_queue_entry() {
    an_interrupted_wait_leaves_nothing_queued("LOCKKIT_TEST_ETCD_URL", Signal::SIGTERM);
}

/// The command's trap counts the SIGINTs it gets for a second after the first, and ends
/// the first wait itself (a SIGINT that lands between `touch` and `wait` would otherwise
/// leave the shell waiting 30 s for a sleep that ignores it); it exits 5.
fn counting_script(env: &Env) -> String {
    format!(
        "trap 'echo int >> {count}; kill $p 2>/dev/null' INT; sleep 30 & p=$!; touch {ready}; \
         wait $p; sleep 1 & q=$!; wait $q; wait $q; exit 5",
        count = env.file("count").display(),
        ready = env.file("ready").display(),
    )
}

fn wait_ready(env: &Env) {
    let by = Instant::now() + Duration::from_secs(10);
    while !env.file("ready").exists() {
        assert!(Instant::now() < by, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_terminal_ctrl_c_reaches_the_command_once() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    // lockkit in a session of its own whose controlling terminal is a pty: ^C written to the
    // master makes the terminal driver send SIGINT to the foreground process group.
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = || Stdio::from(pty.slave.try_clone().unwrap());
    let mut lockkit = std::process::Command::new("setsid")
        .arg("--ctty")
        .arg("env")
        .args(cli_env::DEFAULT_SIGNALS)
        .arg(env!("CARGO_BIN_EXE_lockkit"))
        .args(["run", "tty", "--", "sh", "-c", &counting_script(&env)])
        .env_remove("LOCKKIT_CONFIG")
        .env("LOCKKIT_URL", &env.url)
        .env("LOCKKIT_NAMESPACE", &env.namespace)
        .stdin(slave())
        .stdout(slave())
        .stderr(slave())
        .spawn()
        .unwrap();
    wait_ready(&env);
    let mut master = std::fs::File::from(pty.master.try_clone().unwrap());
    master.write_all(b"\x03").unwrap();
    assert_eq!(wait_exit(&mut lockkit, Duration::from_secs(10)), 5);
    assert_eq!(env.read("count"), "int\n", "SIGINTs the command got");
    assert_eq!(env.status("tty")["held"], false);
}

#[test]
fn a_sigint_sent_to_lockkit_reaches_the_command_once() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    let mut lockkit = env
        .lockkit()
        .args(["run", "sent", "--", "sh", "-c", &counting_script(&env)])
        .spawn()
        .unwrap();
    wait_ready(&env);
    signal(lockkit.id(), Signal::SIGINT);
    assert_eq!(wait_exit(&mut lockkit, Duration::from_secs(10)), 5);
    assert_eq!(env.read("count"), "int\n", "SIGINTs the command got");
}

#[test]
fn json_owns_stdout_while_the_command_prints() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    let out = env.run(&[
        "--json",
        "run",
        "chatty",
        "--",
        "sh",
        "-c",
        "echo '{not json'; echo to-stderr >&2; exit 4",
    ]);
    assert_eq!(out.status.code(), Some(4));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(report["command_exit"], 4);
    assert_eq!(report["released"], true);
    assert!(report["fencing_token"].as_u64().unwrap() > 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("{not json"), "{stderr}");
    assert!(stderr.contains("to-stderr"), "{stderr}");
}

#[test]
fn a_skipped_run_has_the_conflict_exit_code() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    let mut holder = env.spawn_holder("cron", &[], "");
    let ran = env.file("ran");
    let code = |extra: &[&str], config_wait: Option<&str>| {
        let mut command = env.lockkit();
        if let Some(wait) = config_wait {
            command.env("LOCKKIT_LOCK_WAIT_TIMEOUT", wait);
        }
        let out = command
            .arg("run")
            .args(extra)
            .args(["cron", "--", "touch"])
            .arg(&ran)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (exit, stderr) = code(&["--no-wait", "--conflict-exit-code", "9"], None);
    assert_eq!(exit, Some(9), "{stderr}");
    assert!(stderr.contains("held by someone else"), "{stderr}");
    let (exit, stderr) = code(&["--wait", "200ms", "--conflict-exit-code", "0"], None);
    assert_eq!(exit, Some(0), "{stderr}");
    assert!(stderr.contains("not free within 200ms"), "{stderr}");
    // Without --wait, the configuration's lock.wait_timeout applies, as --help says...
    let started = Instant::now();
    let (exit, stderr) = code(&[], Some("300ms"));
    assert_eq!(exit, Some(75), "{stderr}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    // ... and --wait overrides it.
    let (exit, stderr) = code(&["--wait", "100ms"], Some("1h"));
    assert_eq!(exit, Some(75), "{stderr}");
    assert!(stderr.contains("not free within 100ms"), "{stderr}");
    assert!(!ran.exists(), "a run without the lock ran its command");

    signal(holder.id(), Signal::SIGTERM);
    wait_exit(&mut holder, Duration::from_secs(10));
    let (exit, stderr) = code(&["--no-wait", "--conflict-exit-code", "9"], None);
    assert_eq!(exit, Some(0), "{stderr}");
    assert!(ran.exists());
}

#[test]
fn the_command_sees_the_remaining_validity() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let out = env.run(&[
        "run",
        "--ttl",
        "7s",
        "valid",
        "--",
        "sh",
        "-c",
        "echo $LOCKKIT_TTL_MS $LOCKKIT_VALID_UNTIL_MS",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let seen = String::from_utf8_lossy(&out.stdout);
    let values: Vec<u64> = seen
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(values.len(), 2, "{seen:?}");
    assert_eq!(values[0], 7000);
    assert!(values[1] > before, "{seen:?}");
    assert!(values[1] <= before + 7000 + 1000, "{seen:?}");
}

#[test]
fn verbose_and_rust_log_log_to_stderr() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    let out = env.run(&["run", "logged", "--", "true"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = env.run(&["-v", "run", "logged", "--", "true"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("running the command under the lock"),
        "{stderr}"
    );

    let out = env
        .lockkit()
        .env("RUST_LOG", "lockkit=info")
        .args(["run", "logged", "--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("running the command under the lock"),
        "{stderr}"
    );

    let out = env
        .lockkit()
        .env("RUST_LOG", "lockkit=loud")
        .args(["check"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("RUST_LOG"));
}

#[test]
fn a_run_whose_binary_was_replaced_while_it_waited_still_starts_its_command() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDIS_URL") else {
        return;
    };
    // A package upgrade replaces the binary while a run waits for its lock.
    let copy = env.file("lockkit-old");
    std::fs::copy(env!("CARGO_BIN_EXE_lockkit"), &copy).unwrap();
    let mut holder = env.spawn_holder("upgrade", &[], "");
    let ran = env.file("ran");
    let mut waiter = std::process::Command::new(&copy)
        .args(["run", "--wait", "30s", "upgrade", "--", "touch"])
        .arg(&ran)
        .env_remove("LOCKKIT_CONFIG")
        .env("LOCKKIT_URL", &env.url)
        .env("LOCKKIT_NAMESPACE", &env.namespace)
        .spawn()
        .unwrap();
    // spawn() returns once the copy runs; the holder keeps it waiting until after this.
    std::fs::remove_file(&copy).unwrap();
    signal(holder.id(), Signal::SIGTERM);
    wait_exit(&mut holder, Duration::from_secs(10));
    assert_eq!(wait_exit(&mut waiter, Duration::from_secs(20)), 0);
    assert!(ran.exists(), "the command did not run");
}
