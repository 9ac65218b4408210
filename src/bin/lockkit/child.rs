//! The command that `run` and `elect` start under a grant (a lock, a leadership): started
//! through the trampoline so that it dies with lockkit, given the signals lockkit receives,
//! and terminated when the grant is lost (see [`crate::signals`]).

use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockkit::{LockkitConfig, MutexGuard};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::signals::{Received, Signals, trampoline_args};
use crate::{Failure, exit};

/// How long lockkit waits, before it exits, for what it left on the server to be removed (an
/// abandoned queue entry or candidate, the release of a lost grant).
pub(crate) const CLOSE_BOUND: Duration = Duration::from_secs(5);

/// The variables every command under a grant sees: the backend, the grant's TTL, and when
/// the grant would expire if lockkit stopped renewing it now.
pub(crate) fn grant_env(config: &LockkitConfig, guard: &MutexGuard) -> Vec<(&'static str, String)> {
    let valid_until = SystemTime::now() + guard.remaining();
    let valid_until_ms = valid_until
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    vec![
        ("LOCKKIT_BACKEND", config.backend.as_str().to_owned()),
        ("LOCKKIT_TTL_MS", guard.ttl().as_millis().to_string()),
        ("LOCKKIT_VALID_UNTIL_MS", valid_until_ms.to_string()),
    ]
}

/// Starts `command` (the program and its arguments) with `env` added, as a child that dies
/// with lockkit. `json`: its stdout is lockkit's stderr, so that lockkit's report is alone on
/// stdout.
pub(crate) fn spawn(
    command: &[String],
    env: &[(&'static str, String)],
    json: bool,
) -> Result<Child, Failure> {
    let (program, rest) = command.split_first().ok_or_else(|| Failure {
        code: exit::USAGE,
        message: "no command given".into(),
    })?;
    let cannot = |e: std::io::Error| Failure {
        code: exit::SOFTWARE,
        message: format!("cannot start {program}: {e}"),
    };
    // This very binary, even if it was replaced on disk since lockkit started (an upgrade):
    // current_exe() would then name a deleted file.
    let mut child = Command::new("/proc/self/exe");
    child
        .args(trampoline_args(program, rest))
        .envs(env.iter().map(|(name, value)| (name, value)))
        .kill_on_drop(true);
    if json {
        let stderr = std::io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .map_err(cannot)?;
        child.stdout(Stdio::from(stderr));
    }
    // Forked from the main thread (the runtime's block_on), which lives as long as lockkit:
    // the kernel's parent-death signal follows the thread that forked.
    child.spawn().map_err(cannot)
}

/// How the command ended.
pub(crate) struct Finished {
    /// Its exit status.
    pub(crate) status: ExitStatus,
    /// Whether the grant was lost while it ran (it was then terminated).
    pub(crate) lost: bool,
}

impl Finished {
    /// lockkit's exit code: the command's (128+N when it died of signal N), or
    /// [`exit::LOST`] when the grant was lost.
    pub(crate) fn exit_code(&self) -> u8 {
        if self.lost {
            return exit::LOST;
        }
        match (self.status.code(), self.status.signal()) {
            (Some(code), _) => u8::try_from(code).unwrap_or(exit::SOFTWARE),
            (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(exit::SOFTWARE),
            (None, None) => exit::SOFTWARE,
        }
    }
}

/// Waits for `child` to exit, passing on the signals lockkit receives (each reaches it once),
/// and terminates it when `lost` fires: SIGTERM, then SIGKILL after `grace`. `grant` names
/// what was lost in the message ("the lock on KEY").
pub(crate) async fn supervise(
    mut child: Child,
    lost: impl Future<Output = ()>,
    grant: &str,
    grace: Duration,
    signals: &mut Signals,
) -> Result<Finished, Failure> {
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let send = |sig: Signal| {
        if let Some(pid) = pid {
            let _ = kill(pid, sig);
        }
    };
    tokio::pin!(lost);
    let mut lost_grant = false;
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
            () = &mut lost, if !lost_grant => {
                lost_grant = true;
                eprintln!("lockkit: lost {grant}: terminating the command");
                send(Signal::SIGTERM);
                if tokio::time::timeout(grace, child.wait()).await.is_err() {
                    eprintln!("lockkit: the command outlived the {grace:?} grace period: killing it");
                    send(Signal::SIGKILL);
                }
            }
        }
    };
    let status = status.map_err(|e| Failure {
        code: exit::SOFTWARE,
        message: format!("waiting for the command: {e}"),
    })?;
    Ok(Finished {
        status,
        lost: lost_grant,
    })
}

/// The failure of a wait (connecting, acquiring) that a signal interrupted: 128 + the
/// signal's number.
pub(crate) fn interrupted(received: std::io::Result<Received>, during: &str) -> Failure {
    match received {
        Ok(received) => Failure {
            code: 128 + received.signal as u8,
            message: format!("{} while {during}: gave up", received.signal.as_str()),
        },
        Err(e) => Failure {
            code: exit::SOFTWARE,
            message: format!("cannot read signals: {e}"),
        },
    }
}
