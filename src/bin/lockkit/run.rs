//! `lockkit run`: a command under a lock, that never runs without it (see [`crate::signals`]).

use std::io::Write;
use std::os::fd::AsFd;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockkit::{ErrorKind, LockClient, LockkitConfig, MutexGuard};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;
use tokio::process::Command;

use crate::signals::{Received, Signals, trampoline_args};
use crate::{Failure, RunArgs, exit};

/// How long lockkit waits, before it exits, for what it left on the server to be removed (an
/// abandoned queue entry, the release of a lost lock).
const CLOSE_BOUND: Duration = Duration::from_secs(5);

fn interrupted(signal: Signal, during: &str) -> Failure {
    Failure {
        code: 128 + signal as u8,
        message: format!("{} while {during}: gave up", signal.as_str()),
    }
}

async fn acquire(locks: &LockClient, args: &RunArgs) -> Result<MutexGuard, Failure> {
    let mut mutex = locks.mutex(&args.key)?;
    if let Some(ttl) = args.ttl {
        mutex = mutex.with_ttl(ttl)?;
    }
    let not_acquired = |why: String| Failure {
        code: args.conflict_exit_code,
        message: why,
    };
    if args.no_wait {
        return mutex
            .try_lock()
            .await?
            .ok_or_else(|| not_acquired(format!("{} is held by someone else", args.key)));
    }
    let waited = match args.wait {
        Some(wait) => mutex.lock_timeout(wait).await,
        None => mutex.lock().await,
    };
    waited.map_err(|e| match e.kind() {
        ErrorKind::Timeout => not_acquired(match args.wait.or(locks.options().wait_timeout) {
            Some(wait) => format!("{} was not free within {wait:?}", args.key),
            None => format!("{} was not free in time", args.key),
        }),
        _ => e.into(),
    })
}

/// Runs `args.command` under the lock. `json`: print the report on stdout, and give the
/// command lockkit's stderr as its stdout so that nothing else is printed there.
pub(crate) async fn run(
    config: LockkitConfig,
    args: RunArgs,
    json: bool,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let locks = tokio::select! {
        locks = lockkit::connect(&config) => locks?,
        received = signals.recv() => return Err(signal_failure(received, "connecting")),
    };
    let guard = tokio::select! {
        guard = acquire(&locks, &args) => guard?,
        received = signals.recv() => {
            // Dropping the acquisition abandons it in the background: what it queued on the
            // server is removed; close() waits for that, so the next waiter is not held up.
            let failure = signal_failure(received, &format!("waiting for {}", args.key));
            let _ = tokio::time::timeout(CLOSE_BOUND, locks.close()).await;
            return Err(failure);
        }
    };
    let (program, rest) = args.command.split_first().ok_or_else(|| Failure {
        code: exit::USAGE,
        message: "no command given".into(),
    })?;
    let child = spawn(&config, &args, &guard, program, rest, json);
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            let _ = guard.release().await;
            return Err(Failure {
                code: exit::SOFTWARE,
                message: format!("cannot start {program}: {e}"),
            });
        }
    };
    tracing::info!(key = %args.key, fencing_token = %guard.fencing_token(), "running the command under the lock");
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let send = |sig: Signal| {
        if let Some(pid) = pid {
            let _ = kill(pid, sig);
        }
    };
    let lost = guard.lost();
    tokio::pin!(lost);
    let mut lost_lock = false;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            received = signals.recv() => match received {
                Ok(Received { from_kernel: true, signal }) => {
                    tracing::debug!(%signal, "from the terminal: the command got it too");
                }
                Ok(Received { signal, .. }) => send(signal),
                Err(e) => tracing::warn!("cannot read signals: {e}"),
            },
            () = &mut lost, if !lost_lock => {
                lost_lock = true;
                eprintln!("lockkit: lost the lock on {}: terminating the command", args.key);
                send(Signal::SIGTERM);
                if tokio::time::timeout(args.grace, child.wait()).await.is_err() {
                    eprintln!("lockkit: the command outlived the {:?} grace period: killing it", args.grace);
                    send(Signal::SIGKILL);
                }
            }
        }
    };
    let status = status.map_err(|e| Failure {
        code: exit::SOFTWARE,
        message: format!("waiting for the command: {e}"),
    })?;
    let fencing_token = guard.fencing_token().get();
    let released = if lost_lock {
        drop(guard);
        false
    } else {
        guard.release().await.unwrap_or(false)
    };
    // A lost lock's guard is released in the background: let that finish (it removes what
    // may be left on the server) before the process exits, within a bound.
    let _ = tokio::time::timeout(CLOSE_BOUND, locks.close()).await;
    let code = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(code), _) => u8::try_from(code).unwrap_or(exit::SOFTWARE),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(exit::SOFTWARE),
        (None, None) => exit::SOFTWARE,
    };
    let code = if lost_lock { exit::LOST } else { code };
    if json {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "{}",
            json!({
                "key": args.key,
                "fencing_token": fencing_token,
                "command_exit": status.code(),
                "command_signal": std::os::unix::process::ExitStatusExt::signal(&status),
                "lost": lost_lock,
                "released": released,
                "exit_code": code,
            })
        );
    }
    Ok(code)
}

fn signal_failure(received: std::io::Result<Received>, during: &str) -> Failure {
    match received {
        Ok(received) => interrupted(received.signal, during),
        Err(e) => Failure {
            code: exit::SOFTWARE,
            message: format!("cannot read signals: {e}"),
        },
    }
}

fn spawn(
    config: &LockkitConfig,
    args: &RunArgs,
    guard: &MutexGuard,
    program: &str,
    rest: &[String],
    json: bool,
) -> std::io::Result<tokio::process::Child> {
    let valid_until = SystemTime::now() + guard.remaining();
    let valid_until_ms = valid_until
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    // This very binary, even if it was replaced on disk since lockkit started (an upgrade):
    // current_exe() would then name a deleted file.
    let mut command = Command::new("/proc/self/exe");
    command
        .args(trampoline_args(program, rest))
        .env("LOCKKIT_KEY", &args.key)
        .env(
            "LOCKKIT_FENCING_TOKEN",
            guard.fencing_token().get().to_string(),
        )
        .env("LOCKKIT_BACKEND", config.backend.as_str())
        .env("LOCKKIT_TTL_MS", guard.ttl().as_millis().to_string())
        .env("LOCKKIT_VALID_UNTIL_MS", valid_until_ms.to_string())
        .kill_on_drop(true);
    if json {
        command.stdout(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?));
    }
    // Forked from the main thread (the runtime's block_on), which lives as long as lockkit:
    // the kernel's parent-death signal follows the thread that forked.
    command.spawn()
}
