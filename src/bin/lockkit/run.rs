//! `lockkit run`: a command under a lock (or one of a semaphore's permits, with
//! `--permits`), that never runs without it (see [`crate::child`] and [`crate::signals`]).

use std::io::Write;
use std::os::unix::process::ExitStatusExt;

use lockkit::{ErrorKind, LockClient, LockkitConfig, MutexGuard, Permit};
use serde_json::json;

use crate::child::{self, CLOSE_BOUND, grant_env, interrupted};
use crate::signals::Signals;
use crate::{Failure, RunArgs};

/// What the command runs under: the lock, or one of the semaphore's permits.
enum Held {
    Lock(MutexGuard),
    Permit(Permit),
}

impl Held {
    /// The grant underneath: its token, TTL, validity and lost signal.
    fn guard(&self) -> &MutexGuard {
        match self {
            Held::Lock(guard) => guard,
            Held::Permit(permit) => permit.as_guard(),
        }
    }

    async fn release(self) -> lockkit::Result<bool> {
        match self {
            Held::Lock(guard) => guard.release().await,
            Held::Permit(permit) => permit.release().await,
        }
    }
}

async fn acquire(locks: &LockClient, args: &RunArgs) -> Result<Held, Failure> {
    let not_acquired = |why: String| Failure {
        code: args.conflict_exit_code,
        message: why,
    };
    let waited = match args.permits {
        Some(permits) => acquire_permit(locks, args, permits).await?,
        None => acquire_lock(locks, args).await?,
    };
    let what = match args.permits {
        Some(permits) => format!("no permit of {} (of {permits})", args.key),
        None => args.key.clone(),
    };
    match waited {
        Ok(Some(held)) => Ok(held),
        Ok(None) => Err(not_acquired(match args.permits {
            Some(_) => format!("{what} is free"),
            None => format!("{what} is held by someone else"),
        })),
        Err(e) if e.kind() == ErrorKind::Timeout => {
            let free = match args.permits {
                Some(_) => format!("{what} was free"),
                None => format!("{what} was not free"),
            };
            Err(not_acquired(
                match args.wait.or(locks.options().wait_timeout) {
                    Some(wait) => format!("{free} within {wait:?}"),
                    None => format!("{free} in time"),
                },
            ))
        }
        Err(e) => Err(e.into()),
    }
}

/// The lock, or `Ok(None)` when `--no-wait` found it held; the wait's own error (a timeout)
/// inside, for [`acquire`] to word.
async fn acquire_lock(
    locks: &LockClient,
    args: &RunArgs,
) -> Result<lockkit::Result<Option<Held>>, Failure> {
    let mut mutex = locks.mutex(&args.key)?;
    if let Some(ttl) = args.ttl {
        mutex = mutex.with_ttl(ttl)?;
    }
    let held = if args.no_wait {
        mutex.try_lock().await
    } else {
        match args.wait {
            Some(wait) => mutex.lock_timeout(wait).await.map(Some),
            None => mutex.lock().await.map(Some),
        }
    };
    Ok(held.map(|guard| guard.map(Held::Lock)))
}

/// As [`acquire_lock`], for one of the `permits` permits of the semaphore KEY.
async fn acquire_permit(
    locks: &LockClient,
    args: &RunArgs,
    permits: u32,
) -> Result<lockkit::Result<Option<Held>>, Failure> {
    let mut semaphore = locks.semaphore(&args.key, permits)?;
    if let Some(ttl) = args.ttl {
        semaphore = semaphore.with_ttl(ttl)?;
    }
    let held = if args.no_wait {
        semaphore.try_acquire().await
    } else {
        match args.wait {
            Some(wait) => semaphore.acquire_timeout(wait).await.map(Some),
            None => semaphore.acquire().await.map(Some),
        }
    };
    Ok(held.map(|permit| permit.map(Held::Permit)))
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
    let held = tokio::select! {
        held = acquire(&locks, &args) => held?,
        received = signals.recv() => {
            // Dropping the acquisition abandons it in the background: what it queued on the
            // server is removed; close() waits for that, so the next waiter is not held up.
            let failure = interrupted(received, &format!("waiting for {}", args.key));
            let _ = tokio::time::timeout(CLOSE_BOUND, locks.close()).await;
            return Err(failure);
        }
    };
    let guard = held.guard();
    let mut env = vec![
        ("LOCKKIT_KEY", args.key.clone()),
        (
            "LOCKKIT_FENCING_TOKEN",
            guard.fencing_token().get().to_string(),
        ),
    ];
    if let Some(permits) = args.permits {
        env.push(("LOCKKIT_PERMITS", permits.to_string()));
    }
    env.extend(grant_env(&config, guard));
    let child = match child::spawn(&args.command, &env, json) {
        Ok(child) => child,
        Err(failure) => {
            let _ = held.release().await;
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
        drop(held);
        false
    } else {
        held.release().await.unwrap_or(false)
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
                "permits": args.permits,
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
