//! `lockkit elect` and `lockkit leader` end to end: the command runs while its `lockkit`
//! leads and sees its term, two candidates never run their commands at once and the second
//! takes over when the first's command exits, a leadership broken by an operator terminates
//! the command, `leader --watch --json` prints every change, and a backend without elections
//! fails as unsupported. Cross-process tests run on the single Redis, etcd and ZooKeeper of
//! `compose/up.sh`; the memory backend serves what one process shows.
#![cfg(all(feature = "cli", feature = "redis", feature = "etcd", feature = "zk"))]
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

#[macro_use]
mod cli_env;

use std::process::Stdio;
use std::time::{Duration, Instant};

use cli_env::{Env, Process, is_dead, signal, wait_exit};
use nix::sys::signal::Signal;

/// The name of every election of these tests (each test has its own namespace).
const NAME: &str = "scheduler";

/// The script of a candidate whose value is V: while it leads it holds the directory
/// `inside` (a second holder records an overlap), writes its term and pid to `term-V` and
/// `pid-V`, says `ready-V`, and exits 0 once `stop-V` exists.
fn candidate_script(env: &Env) -> String {
    format!(
        "cd {dir} || exit 9; mkdir inside || echo \"$LOCKKIT_VALUE\" >> overlaps; \
         echo \"$LOCKKIT_TERM\" > \"term-$LOCKKIT_VALUE\"; echo $$ > \"pid-$LOCKKIT_VALUE\"; \
         touch \"ready-$LOCKKIT_VALUE\"; \
         while [ ! -e \"stop-$LOCKKIT_VALUE\" ]; do sleep 0.05; done; rmdir inside; exit 0",
        dir = env.dir.display()
    )
}

/// `lockkit elect --value VALUE [extra] NAME -- sh -c CANDIDATE` in the background.
fn candidate(env: &Env, value: &str, extra: &[&str]) -> Process {
    Process(
        env.lockkit()
            .args(["elect", "--value", value])
            .args(extra)
            .args([NAME, "--", "sh", "-c", &candidate_script(env)])
            .spawn()
            .unwrap(),
    )
}

/// As [`candidate`], returning once the candidate campaigns (says so in its log).
fn campaigning(env: &Env, value: &str, extra: &[&str]) -> Process {
    let mut child = Process(
        env.lockkit()
            .args(["-v", "elect", "--value", value])
            .args(extra)
            .args([NAME, "--", "sh", "-c", &candidate_script(env)])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.stderr.take().unwrap();
    let (send, campaigns) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)) {
            let Ok(line) = line else { return };
            eprintln!("{line}");
            if line.contains("campaigning") {
                let _ = send.send(());
            }
        }
    });
    campaigns
        .recv_timeout(Duration::from_secs(15))
        .expect("the candidate never campaigned");
    child
}

fn stop(env: &Env, value: &str) {
    std::fs::write(env.file(&format!("stop-{value}")), "").unwrap();
}

fn term_of(env: &Env, value: &str) -> u64 {
    env.read(&format!("term-{value}")).trim().parse().unwrap()
}

/// `lockkit --json leader NAME`, parsed.
fn leader(env: &Env) -> serde_json::Value {
    let out = env.run(&["--json", "leader", NAME]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn elect_runs_the_command_with_its_term_and_value_and_exits_with_its_code() {
    let env = Env::memory();
    let script = format!(
        "printf '%s %s %s %s' \"$LOCKKIT_ELECTION\" \"$LOCKKIT_TERM\" \"$LOCKKIT_VALUE\" \
         \"$LOCKKIT_TTL_MS\" > {}; exit 3",
        env.file("env").display()
    );
    let lockkit = env
        .lockkit()
        .args(["elect", "--ttl", "7s", NAME, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    let pid = lockkit.id();
    let out = lockkit.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "CMD's exit code");
    let seen = env.read("env");
    let parts: Vec<&str> = seen.split(' ').collect();
    assert_eq!(parts.len(), 4, "{seen:?}");
    assert_eq!(parts[0], NAME);
    assert!(parts[1].parse::<u64>().unwrap() > 0, "a term: {seen:?}");
    assert!(
        parts[2].ends_with(&format!(":{pid}")) && parts[2].len() > format!(":{pid}").len(),
        "the default value is HOSTNAME:PID: {seen:?}"
    );
    assert_eq!(parts[3], "7000");

    let out = env.run(&[
        "--json",
        "elect",
        "--value",
        "node-a",
        NAME,
        "--",
        "echo",
        "to-stderr",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(report["election"], NAME);
    assert_eq!(report["value"], "node-a");
    assert_eq!(report["resigned"], true);
    assert_eq!(report["lost"], false);
    assert!(report["term"].as_u64().unwrap() > 0);
    assert!(String::from_utf8_lossy(&out.stderr).contains("to-stderr"));

    let out = env.run(&["elect", NAME, "--", "/nonexistent/program"]);
    assert_eq!(out.status.code(), Some(127));
}

#[test]
fn leader_says_when_nobody_leads() {
    let env = Env::memory();
    let out = env.run(&["leader", NAME]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{NAME}: no leader\n")
    );
    assert_eq!(
        leader(&env),
        serde_json::json!({ "election": NAME, "leader": null })
    );
}

on_every_server!(two_candidates_never_run_at_once_and_the_second_takes_over_when_the_first_exits);
fn two_candidates_never_run_at_once_and_the_second_takes_over_when_the_first_exits(var: &str) {
    let Some(env) = Env::new(var) else { return };
    // A TTL far above the hand-over bound below: the second takes over on the resign, not
    // on the first's expiry.
    let mut a = candidate(&env, "a", &["--ttl", "30s"]);
    env.wait_file("ready-a");
    let led = leader(&env);
    assert_eq!(led["leader"]["value"], "a", "{led}");
    assert_eq!(led["leader"]["term"], term_of(&env, "a"), "{led}");
    let text = String::from_utf8_lossy(&env.run(&["leader", NAME]).stdout).into_owned();
    assert_eq!(
        text,
        format!("{NAME}: led in term {} by \"a\"\n", term_of(&env, "a"))
    );

    let mut b = campaigning(&env, "b", &["--ttl", "30s"]);
    std::thread::sleep(Duration::from_millis(200));
    assert!(!env.file("ready-b").exists(), "b ran while a leads");

    stop(&env, "a");
    assert_eq!(wait_exit(&mut a, Duration::from_secs(10)), 0);
    let resigned = Instant::now();
    env.wait_file("ready-b");
    assert!(
        resigned.elapsed() < Duration::from_secs(15),
        "b took over {:?} after a resigned (the TTL is 30 s)",
        resigned.elapsed()
    );
    assert!(term_of(&env, "b") > term_of(&env, "a"));
    assert_eq!(leader(&env)["leader"]["value"], "b");
    stop(&env, "b");
    assert_eq!(wait_exit(&mut b, Duration::from_secs(10)), 0);
    assert_eq!(env.read("overlaps"), "", "candidates that ran at once");
    assert_eq!(leader(&env)["leader"], serde_json::Value::Null);
}

on_every_server!(a_signal_during_the_campaign_withdraws_the_candidate_without_running_its_command);
fn a_signal_during_the_campaign_withdraws_the_candidate_without_running_its_command(var: &str) {
    let Some(env) = Env::new(var) else { return };
    let mut a = candidate(&env, "a", &[]);
    env.wait_file("ready-a");
    let mut b = campaigning(&env, "b", &[]);
    signal(b.id(), Signal::SIGTERM);
    assert_eq!(
        wait_exit(&mut b, Duration::from_secs(10)),
        128 + Signal::SIGTERM as i32
    );
    assert_eq!(leader(&env)["leader"]["value"], "a");
    stop(&env, "a");
    assert_eq!(wait_exit(&mut a, Duration::from_secs(10)), 0);
    assert_eq!(leader(&env)["leader"], serde_json::Value::Null);
    assert!(!env.file("ready-b").exists(), "the withdrawn candidate ran");
}

on_every_server!(the_command_is_terminated_when_an_operator_breaks_the_leadership);
fn the_command_is_terminated_when_an_operator_breaks_the_leadership(var: &str) {
    let Some(env) = Env::new(var) else { return };
    let mut a = Process(
        env.lockkit()
            .args([
                "elect", "--value", "a", "--ttl", "2s", "--grace", "1s", NAME,
            ])
            .args(["--", "sh", "-c", &candidate_script(&env)])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    env.wait_file("ready-a");
    let command: u32 = env.read("pid-a").trim().parse().unwrap();
    let out = env.run(&["--json", "release", "--force", "--yes", NAME]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The broken leader's guard reports the leadership lost at its next renewal (within
    // the 2 s TTL): lockkit terminates the command and exits 76.
    assert_eq!(wait_exit(&mut a, Duration::from_secs(20)), 76);
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut a.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains(&format!("lost the leadership of {NAME}")),
        "{stderr}"
    );
    let by = Instant::now() + Duration::from_secs(5);
    while !is_dead(command) {
        assert!(Instant::now() < by, "the command outlived its leadership");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(leader(&env)["leader"], serde_json::Value::Null);
}

/// The lines of `lockkit --json leader --watch NAME`, as they come.
struct Watcher {
    /// Killed when the watcher is dropped.
    _child: Process,
    lines: std::sync::mpsc::Receiver<serde_json::Value>,
}

impl Watcher {
    fn start(env: &Env) -> Watcher {
        let mut child = Process(
            env.lockkit()
                .args(["--json", "leader", "--watch", NAME])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
                let line = line.unwrap();
                let parsed = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                if send.send(parsed).is_err() {
                    return;
                }
            }
        });
        Watcher {
            _child: child,
            lines,
        }
    }

    /// The lines up to the first for which `until` holds, that one included.
    fn until(
        &self,
        what: &str,
        until: impl Fn(&serde_json::Value) -> bool,
    ) -> Vec<serde_json::Value> {
        let mut seen = Vec::new();
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|e| panic!("no line showing {what} ({e}) after {seen:?}"));
            let done = until(&line);
            seen.push(line);
            if done {
                return seen;
            }
        }
    }
}

on_every_server!(leader_watch_json_prints_every_change_in_term_order);
fn leader_watch_json_prints_every_change_in_term_order(var: &str) {
    let Some(env) = Env::new(var) else { return };
    let watcher = Watcher::start(&env);
    let vacant = |line: &serde_json::Value| line["leader"].is_null();
    let led_by =
        |value: &'static str| move |line: &serde_json::Value| line["leader"]["value"] == value;
    let first = watcher.until("the vacancy", vacant);
    assert_eq!(
        first,
        [serde_json::json!({ "election": NAME, "leader": null })]
    );

    let mut a = candidate(&env, "a", &[]);
    let mut lines = watcher.until("a leading", led_by("a"));
    env.wait_file("ready-a");
    let mut b = campaigning(&env, "b", &[]);
    stop(&env, "a");
    lines.extend(watcher.until("b leading", led_by("b")));
    env.wait_file("ready-b");
    stop(&env, "b");
    lines.extend(watcher.until("the vacancy after b", vacant));
    assert_eq!(wait_exit(&mut a, Duration::from_secs(10)), 0);
    assert_eq!(wait_exit(&mut b, Duration::from_secs(10)), 0);

    assert_eq!(
        lines
            .iter()
            .find(|l| l["leader"]["value"] == "a")
            .map(|l| l["leader"]["term"].clone()),
        Some(term_of(&env, "a").into()),
        "{lines:?}"
    );
    assert_eq!(
        lines
            .iter()
            .find(|l| l["leader"]["value"] == "b")
            .map(|l| l["leader"]["term"].clone()),
        Some(term_of(&env, "b").into()),
        "{lines:?}"
    );
    let terms: Vec<u64> = lines
        .iter()
        .filter_map(|l| l["leader"]["term"].as_u64())
        .collect();
    assert!(terms.is_sorted(), "terms went backwards: {lines:?}");
    for pair in lines.windows(2) {
        assert_ne!(pair[0], pair[1], "a line repeated: {lines:?}");
    }
    for line in &lines {
        assert_eq!(line["election"], NAME, "{line}");
    }
}

#[test]
fn elect_and_leader_fail_as_unsupported_on_redlock() {
    let Some(env) = Env::new("LOCKKIT_TEST_REDLOCK_URL") else {
        return;
    };
    for args in [
        &["leader", NAME][..],
        &["leader", "--watch", NAME],
        &["elect", NAME, "--", "touch", "ran"],
    ] {
        let out = env
            .lockkit()
            .current_dir(&env.dir)
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{args:?}: {stderr}");
        assert!(
            stderr.contains("elections are not supported"),
            "{args:?}: {stderr}"
        );
    }
    assert!(!env.file("ran").exists());
    let out = env.run(&["--json", "leader", NAME]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["exit_code"], 78);
}
