//! Shell completions and man pages, generated from the clap definition: every subcommand is
//! in them, the bash script parses, the man page renders. No server needed.
#![cfg(feature = "cli")]
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::io::Write;
use std::process::{Command, Output, Stdio};

const SUBCOMMANDS: [&str; 9] = [
    "run",
    "elect",
    "leader",
    "status",
    "check",
    "list",
    "release",
    "completions",
    "man",
];

fn lockkit(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_lockkit"))
        .args(args)
        .env_remove("LOCKKIT_URL")
        .env_remove("LOCKKIT_CONFIG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "lockkit {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Feeds `input` to `program args` and returns its output.
fn pipe(program: &str, args: &[&str], input: &[u8]) -> Option<Output> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    child.stdin.take().unwrap().write_all(input).unwrap();
    Some(child.wait_with_output().unwrap())
}

#[test]
fn completions_cover_every_subcommand_without_a_configuration() {
    for (shell, marker) in [
        ("bash", "_lockkit()"),
        ("zsh", "#compdef lockkit"),
        ("fish", "complete -c lockkit"),
    ] {
        let script = String::from_utf8(lockkit(&["completions", shell]).stdout).unwrap();
        assert!(script.contains(marker), "{shell}: {marker} missing");
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{shell}: {sub} missing");
        }
        assert!(
            script.contains("conflict-exit-code"),
            "{shell}: run's flags"
        );
    }
    let bash = lockkit(&["completions", "bash"]).stdout;
    if let Some(parsed) = pipe("bash", &["-n"], &bash) {
        assert!(
            parsed.status.success(),
            "the bash script does not parse: {}",
            String::from_utf8_lossy(&parsed.stderr)
        );
    }
}

#[test]
fn man_pages_list_every_subcommand_and_render() {
    let page = String::from_utf8(lockkit(&["man"]).stdout).unwrap();
    assert!(page.contains(".TH lockkit 1"), "{page}");
    for sub in SUBCOMMANDS {
        assert!(page.contains(sub), "{sub} missing from lockkit.1");
    }
    let run = String::from_utf8(lockkit(&["man", "run"]).stdout).unwrap();
    assert!(run.contains(".TH lockkit-run 1"), "{run}");
    assert!(run.contains("conflict\\-exit\\-code"), "{run}");
    assert!(run.contains("LOCKKIT_VALID_UNTIL_MS"), "{run}");
    let elect = String::from_utf8(lockkit(&["man", "elect"]).stdout).unwrap();
    assert!(elect.contains(".TH lockkit-elect 1"), "{elect}");
    assert!(elect.contains("LOCKKIT_TERM"), "{elect}");
    let leader = String::from_utf8(lockkit(&["man", "leader"]).stdout).unwrap();
    assert!(leader.contains("\\-\\-watch"), "{leader}");

    if let Some(rendered) = pipe("groff", &["-man", "-Tutf8", "-ww"], page.as_bytes()) {
        assert!(rendered.status.success());
        let warnings = String::from_utf8_lossy(&rendered.stderr);
        assert!(warnings.trim().is_empty(), "groff warns: {warnings}");
    }

    let unknown = Command::new(env!("CARGO_BIN_EXE_lockkit"))
        .args(["man", "nope"])
        .output()
        .unwrap();
    assert_eq!(unknown.status.code(), Some(2));
}
