//! `lockkit elect`: a command that runs while this process leads an election, and never
//! without the leadership (as `run`'s command never runs without its lock, see
//! [`crate::child`]); and `lockkit leader`: who leads, and every change.

use std::io::Write;
use std::os::unix::process::ExitStatusExt;

use futures_util::StreamExt;
use lockkit::{Leader, LockkitConfig};
use serde_json::json;

use crate::child::{self, CLOSE_BOUND, grant_env, interrupted};
use crate::signals::Signals;
use crate::{ElectArgs, Failure, connect};

/// The value a candidate proclaims when `--value` is not given: `HOSTNAME:PID`.
fn default_value() -> String {
    // The kernel's node name, which gethostname(2) reads too (the CLI is Linux-only).
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

/// Campaigns for `args.name`, runs `args.command` while leading, resigns when it exits and
/// exits with its code; exits with 76 after terminating it when the leadership is lost.
/// `json`: print the report on stdout, and give the command lockkit's stderr as its stdout.
pub(crate) async fn elect(
    config: LockkitConfig,
    args: ElectArgs,
    json: bool,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let locks = tokio::select! {
        locks = lockkit::connect(&config) => locks?,
        received = signals.recv() => return Err(interrupted(received, "connecting")),
    };
    let mut election = locks.election(&args.name)?;
    if let Some(ttl) = args.ttl {
        election = election.with_ttl(ttl)?;
    }
    let value = args.value.clone().unwrap_or_else(default_value);
    tracing::info!(election = %args.name, "campaigning");
    let leadership = tokio::select! {
        leadership = election.campaign(value) => leadership?,
        received = signals.recv() => {
            // A dropped campaign withdraws its candidate in the background; close() waits
            // for that, so the next candidate is not held up.
            let failure = interrupted(received, &format!("campaigning for {}", args.name));
            let _ = tokio::time::timeout(CLOSE_BOUND, locks.close()).await;
            return Err(failure);
        }
    };
    let term = leadership.term().get();
    let mut env = vec![
        ("LOCKKIT_ELECTION", args.name.clone()),
        ("LOCKKIT_TERM", term.to_string()),
        ("LOCKKIT_VALUE", leadership.value()),
    ];
    env.extend(grant_env(&config, leadership.guard()));
    let child = match child::spawn(&args.command, &env, json) {
        Ok(child) => child,
        Err(failure) => {
            let _ = leadership.resign().await;
            return Err(failure);
        }
    };
    tracing::info!(election = %args.name, %term, "running the command as the leader");
    let finished = child::supervise(
        child,
        leadership.lost(),
        &format!("the leadership of {} (term {term})", args.name),
        args.grace,
        signals,
    )
    .await?;
    let value = leadership.value();
    let resigned = if finished.lost {
        drop(leadership);
        false
    } else {
        leadership.resign().await.unwrap_or(false)
    };
    let _ = tokio::time::timeout(CLOSE_BOUND, locks.close()).await;
    let code = finished.exit_code();
    if json {
        let _ = writeln!(
            std::io::stdout().lock(),
            "{}",
            json!({
                "election": args.name,
                "term": term,
                "value": value,
                "command_exit": finished.status.code(),
                "command_signal": finished.status.signal(),
                "lost": finished.lost,
                "resigned": resigned,
                "exit_code": code,
            })
        );
    }
    Ok(code)
}

fn leader_json(name: &str, leader: Option<&Leader>) -> serde_json::Value {
    json!({
        "election": name,
        "leader": leader.map(|leader| json!({
            "term": leader.term.get(),
            "value": leader.value,
        })),
    })
}

fn leader_text(name: &str, leader: Option<&Leader>) -> String {
    match leader {
        Some(Leader {
            term,
            value: Some(value),
            ..
        }) => format!("{name}: led in term {term} by {value:?}"),
        Some(leader) => format!(
            "{name}: led in term {} (no value proclaimed yet)",
            leader.term
        ),
        None => format!("{name}: no leader"),
    }
}

/// Prints who leads `name`; with `watch`, then every change, one line each, until stdout
/// closes or lockkit is interrupted.
pub(crate) async fn leader(
    config: &LockkitConfig,
    name: &str,
    watch: bool,
    json: bool,
) -> Result<u8, Failure> {
    let locks = connect(config).await?;
    let election = locks.election(name)?;
    let print = |leader: Option<&Leader>| {
        let line = if json {
            leader_json(name, leader).to_string()
        } else {
            leader_text(name, leader)
        };
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}").and_then(|()| out.flush())
    };
    if !watch {
        let leader = election.leader().await?;
        let _ = print(leader.as_ref());
        return Ok(0);
    }
    let mut changes = election.observe();
    let mut printed = false;
    while let Some(change) = changes.next().await {
        match change {
            Ok(leader) => {
                printed = true;
                if print(leader.as_ref()).is_err() {
                    // The reader went away (`| head -1`): nothing left to watch for.
                    break;
                }
            }
            // Before the first answer, an error is an answer: the backend cannot be read.
            Err(e) if !printed => return Err(e.into()),
            Err(e) => {
                tracing::warn!(election = %name, error = %e.display_chain(), "cannot read the leader; retrying");
            }
        }
    }
    Ok(0)
}
