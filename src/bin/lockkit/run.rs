//! `lockkit run`: a command under a lock (or one of a semaphore's permits, with
//! `--permits`, or a read-write lock's read or write lock, with `--read` / `--write`), that
//! never runs without it (see [`crate::child`] and [`crate::signals`]).

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use lockkit::{ErrorKind, LockClient, LockkitConfig, MutexGuard, Permit, ReadGuard, WriteGuard};
use serde_json::json;

use crate::child::{self, CLOSE_BOUND, grant_env, interrupted};
use crate::signals::Signals;
use crate::{Failure, RunArgs};

/// What KEY is and what the command holds of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Under {
    /// The mutex KEY.
    Lock,
    /// One of the permits of the semaphore KEY.
    Permit(u32),
    /// A read lock of the read-write lock KEY.
    Read,
    /// The write lock of the read-write lock KEY.
    Write,
}

impl Under {
    fn of(args: &RunArgs) -> Self {
        match (args.permits, args.read, args.write) {
            (Some(permits), _, _) => Under::Permit(permits),
            (None, true, _) => Under::Read,
            (None, false, true) => Under::Write,
            (None, false, false) => Under::Lock,
        }
    }

    /// The `mode` of the JSON report and of `LOCKKIT_MODE`.
    fn mode(self) -> &'static str {
        match self {
            Under::Lock => "lock",
            Under::Permit(_) => "permit",
            Under::Read => "read",
            Under::Write => "write",
        }
    }

    /// Why the command did not run: KEY was taken (`--no-wait`, `waited == None`) or stayed
    /// taken until the wait (`waited`, or an unknown one) ran out.
    fn not_free(self, key: &str, waited: Option<Option<Duration>>) -> String {
        let (now, then) = match self {
            Under::Lock | Under::Write => (
                format!("{key} is held by someone else"),
                format!("{key} was not free"),
            ),
            Under::Permit(permits) => (
                format!("no permit of {key} (of {permits}) is free"),
                format!("no permit of {key} (of {permits}) was free"),
            ),
            Under::Read => (
                format!("{key} is held by a writer, or a writer waits for it"),
                format!("{key} was not free for readers"),
            ),
        };
        match waited {
            None => now,
            Some(Some(wait)) => format!("{then} within {wait:?}"),
            Some(None) => format!("{then} in time"),
        }
    }
}

/// What the command runs under.
enum Held {
    Lock(MutexGuard),
    Permit(Permit),
    Read(ReadGuard),
    Write(WriteGuard),
}

impl Held {
    /// The grant underneath: its token, TTL, validity and lost signal.
    fn guard(&self) -> &MutexGuard {
        match self {
            Held::Lock(guard) => guard,
            Held::Permit(permit) => permit.as_guard(),
            Held::Read(read) => read.as_guard(),
            Held::Write(write) => write.as_guard(),
        }
    }

    async fn release(self) -> lockkit::Result<bool> {
        match self {
            Held::Lock(guard) => guard.release().await,
            Held::Permit(permit) => permit.release().await,
            Held::Read(read) => read.release().await,
            Held::Write(write) => write.release().await,
        }
    }
}

/// How long `lockkit run` waits: not at all (`--no-wait`), at most `--wait` (or the
/// configuration's wait timeout), or as long as it takes.
#[derive(Debug, Clone, Copy)]
enum Patience {
    None,
    AtMost(Duration),
    Forever,
}

/// Takes `$what` of `$primitive` with its `$try` / `$timeout` / `$forever` methods, as
/// `$patience` says; `lockkit::Result<Option<Held>>`, `Ok(None)` when `--no-wait` found it
/// taken, the wait's own error (a timeout) as it is.
macro_rules! take {
    ($primitive:expr, $patience:expr, $try:ident, $timeout:ident, $forever:ident, $held:path) => {{
        let primitive = $primitive;
        let taken = match $patience {
            Patience::None => primitive.$try().await,
            Patience::AtMost(wait) => primitive.$timeout(wait).await.map(Some),
            Patience::Forever => primitive.$forever().await.map(Some),
        };
        taken.map(|held| held.map($held))
    }};
}

async fn acquire(locks: &LockClient, args: &RunArgs) -> Result<Held, Failure> {
    let under = Under::of(args);
    // The configuration's lock options, with --ttl and --fair / --no-fair on top.
    let mut options = locks.options().clone();
    if let Some(ttl) = args.ttl {
        options = options.with_ttl(ttl);
    }
    if args.fair || args.no_fair {
        options = options.with_fair(args.fair);
    }
    let patience = if args.no_wait {
        Patience::None
    } else {
        args.wait.map_or(Patience::Forever, Patience::AtMost)
    };
    let taken = match under {
        Under::Lock => {
            let mutex = locks.mutex(&args.key)?.with_options(options)?;
            take!(mutex, patience, try_lock, lock_timeout, lock, Held::Lock)
        }
        Under::Permit(permits) => {
            let semaphore = locks.semaphore(&args.key, permits)?.with_options(options)?;
            take!(
                semaphore,
                patience,
                try_acquire,
                acquire_timeout,
                acquire,
                Held::Permit
            )
        }
        Under::Read | Under::Write => {
            let rwlock = locks.rwlock(&args.key)?.with_options(options)?;
            if under == Under::Read {
                take!(rwlock, patience, try_read, read_timeout, read, Held::Read)
            } else {
                take!(
                    rwlock,
                    patience,
                    try_write,
                    write_timeout,
                    write,
                    Held::Write
                )
            }
        }
    };
    let not_acquired = |why: String| Failure {
        code: args.conflict_exit_code,
        message: why,
    };
    match taken {
        Ok(Some(held)) => Ok(held),
        Ok(None) => Err(not_acquired(under.not_free(&args.key, None))),
        Err(e) if e.kind() == ErrorKind::Timeout => {
            let waited = args.wait.or(locks.options().wait_timeout);
            Err(not_acquired(under.not_free(&args.key, Some(waited))))
        }
        Err(e) => Err(e.into()),
    }
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
    let under = Under::of(&args);
    env.push(("LOCKKIT_MODE", under.mode().to_owned()));
    if let Under::Permit(permits) = under {
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
                "mode": under.mode(),
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
