//! `lockkit run --permits N` end to end: at most N commands run at once, each seeing its
//! permit, a run with no free permit is skipped with the conflict exit code, a run that
//! disagrees on N is refused, and Redlock, which has no semaphores, says so. Cross-process
//! tests run on the single Redis, etcd and ZooKeeper of `compose/up.sh`.
#![cfg(all(feature = "cli", feature = "redis", feature = "etcd", feature = "zk"))]
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

#[macro_use]
mod cli_env;

use std::process::Stdio;
use std::time::{Duration, Instant};

use cli_env::{Env, Process, wait_exit};

/// A command that, while it holds a permit, holds a directory `in-PID` beside the others',
/// writes how many it sees (a lower bound of the commands running at once) to `counts`, and
/// its LOCKKIT_PERMITS and LOCKKIT_FENCING_TOKEN to `seen`.
fn counting_script(env: &Env) -> String {
    format!(
        "cd {dir} || exit 9; mkdir in-$$; ls -d in-* | wc -l >> counts; \
         echo \"$LOCKKIT_PERMITS $LOCKKIT_FENCING_TOKEN\" >> seen; sleep 1.5; rmdir in-$$",
        dir = env.dir.display()
    )
}

on_every_server!(at_most_n_commands_run_at_once);
fn at_most_n_commands_run_at_once(var: &str) {
    const RUNS: usize = 4;
    let Some(env) = Env::new(var) else {
        return;
    };
    let script = counting_script(&env);
    let runs: Vec<Process> = (0..RUNS)
        .map(|_| {
            Process(
                env.lockkit()
                    .args(["run", "--permits", "2", "--wait", "60s", "pool", "--"])
                    .args(["sh", "-c", &script])
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    for mut run in runs {
        assert_eq!(wait_exit(&mut run.0, Duration::from_secs(60)), 0);
    }
    let counts: Vec<usize> = env
        .read("counts")
        .lines()
        .map(|line| line.trim().parse().unwrap())
        .collect();
    assert_eq!(counts.len(), RUNS, "not every command ran: {counts:?}");
    assert!(
        counts.iter().all(|&n| n <= 2),
        "more than 2 commands held a permit of 2 at once: {counts:?}"
    );
    let seen = env.read("seen");
    let mut tokens: Vec<u64> = seen
        .lines()
        .map(|line| {
            let (permits, token) = line.split_once(' ').unwrap();
            assert_eq!(permits, "2", "LOCKKIT_PERMITS: {seen}");
            token.parse().unwrap()
        })
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), RUNS, "fencing tokens repeated: {seen}");
}

on_every_server!(a_run_with_no_free_permit_is_skipped_and_a_disagreeing_one_refused);
fn a_run_with_no_free_permit_is_skipped_and_a_disagreeing_one_refused(var: &str) {
    let Some(env) = Env::new(var) else {
        return;
    };
    let ready = env.file("ready");
    let stop = env.file("stop");
    let holder_script = format!(
        "touch {ready}-$$; while [ ! -e {stop} ]; do sleep 0.05; done",
        ready = ready.display(),
        stop = stop.display()
    );
    let holders: Vec<Process> = (0..2)
        .map(|_| {
            Process(
                env.lockkit()
                    .args(["run", "--permits", "2", "pool", "--"])
                    .args(["sh", "-c", &holder_script])
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    let by = Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(&env.dir)
        .unwrap()
        .filter(|entry| {
            let name = entry.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("ready-")
        })
        .count()
        < 2
    {
        assert!(Instant::now() < by, "the two holders never both ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ran = env.file("ran");
    let try_run = |extra: &[&str]| {
        let out = env
            .lockkit()
            .arg("run")
            .args(extra)
            .args(["pool", "--", "touch"])
            .arg(&ran)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = try_run(&["--permits", "2", "--no-wait", "--conflict-exit-code", "9"]);
    assert_eq!(code, Some(9), "{stderr}");
    assert!(
        stderr.contains("no permit of pool (of 2) is free"),
        "{stderr}"
    );
    let (code, stderr) = try_run(&["--permits", "2", "--wait", "200ms"]);
    assert_eq!(code, Some(75), "{stderr}");
    assert!(stderr.contains("was free within 200ms"), "{stderr}");
    let (code, stderr) = try_run(&["--permits", "3", "--no-wait"]);
    assert_eq!(code, Some(78), "{stderr}");
    assert!(stderr.contains("2 permits"), "{stderr}");
    let (code, stderr) = try_run(&["--permits", "0"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(!ran.exists(), "a run without a permit ran its command");

    std::fs::write(&stop, "").unwrap();
    for mut holder in holders {
        assert_eq!(wait_exit(&mut holder.0, Duration::from_secs(15)), 0);
    }
    let (code, stderr) = try_run(&["--permits", "3", "--no-wait"]);
    assert_eq!(
        code,
        Some(0),
        "a free semaphore refused a new count: {stderr}"
    );
    assert!(ran.exists());
}

#[test]
fn redlock_refuses_permits_and_says_why() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDLOCK_URL") else {
        return;
    };
    let ran = env.file("ran");
    let out = env
        .lockkit()
        .args(["run", "--permits", "2", "pool", "--", "touch"])
        .arg(&ran)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("semaphores are not supported"), "{stderr}");
    assert!(!ran.exists());
}
