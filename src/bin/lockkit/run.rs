//! `lockkit run`: a command under a lock, that never runs without it (see [`crate::child`]
//! and [`crate::signals`]).

use std::io::Write;
use std::os::unix::process::ExitStatusExt;

use lockkit::{ErrorKind, LockClient, LockkitConfig, MutexGuard};
use serde_json::json;

use crate::child::{self, CLOSE_BOUND, grant_env, interrupted};
use crate::signals::Signals;
use crate::{Failure, RunArgs};

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
        received = signals.recv() => return Err(interrupted(received, "connecting")),
    };
    let guard = tokio::select! {
        guard = acquire(&locks, &args) => guard?,
        received = signals.recv() => {
            // Dropping the acquisition abandons it in the background: what it queued on the
            // server is removed; close() waits for that, so the next waiter is not held up.
            let failure = interrupted(received, &format!("waiting for {}", args.key));
            let _ = tokio::time::timeout(CLOSE_BOUND, locks.close()).await;
            return Err(failure);
        }
    };
    let mut env = vec![
        ("LOCKKIT_KEY", args.key.clone()),
        (
            "LOCKKIT_FENCING_TOKEN",
            guard.fencing_token().get().to_string(),
        ),
    ];
    env.extend(grant_env(&config, &guard));
    let child = match child::spawn(&args.command, &env, json) {
        Ok(child) => child,
        Err(failure) => {
            let _ = guard.release().await;
            return Err(failure);
        }
    };
    tracing::info!(key = %args.key, fencing_token = %guard.fencing_token(), "running the command under the lock");
    let finished = child::supervise(
        child,
        guard.lost(),
        &format!("the lock on {}", args.key),
        args.grace,
        signals,
    )
    .await?;
    let fencing_token = guard.fencing_token().get();
    let released = if finished.lost {
        drop(guard);
        false
    } else {
        guard.release().await.unwrap_or(false)
    };
    // A lost lock's guard is released in the background: let that finish (it removes what
    // may be left on the server) before the process exits, within a bound.
    let _ = tokio::time::timeout(CLOSE_BOUND, locks.close()).await;
    let code = finished.exit_code();
    if json {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "{}",
            json!({
                "key": args.key,
                "fencing_token": fencing_token,
                "command_exit": finished.status.code(),
                "command_signal": finished.status.signal(),
                "lost": finished.lost,
                "released": released,
                "exit_code": code,
            })
        );
    }
    Ok(code)
}
