//! `lockkit`: run a command under a distributed lock, show a lock's holder, check a
//! configuration. See `lockkit --help` and the README's "Command line" section.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use lockkit::{Error, ErrorKind, LockClient, LockkitConfig, MutexGuard};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};

/// Exit codes (besides the command's own, which `run` passes through).
mod exit {
    /// Bad usage (clap's own code).
    pub(crate) const USAGE: u8 = 2;
    /// Something else went wrong (an unexpected backend error).
    pub(crate) const SOFTWARE: u8 = 70;
    /// The backend did not answer (or no quorum did).
    pub(crate) const UNAVAILABLE: u8 = 69;
    /// The lock was not acquired: held by someone else with `--no-wait`, or not free within
    /// `--wait`.
    pub(crate) const NOT_ACQUIRED: u8 = 75;
    /// The lock was lost while the command ran; the command was terminated.
    pub(crate) const LOST: u8 = 76;
    /// The backend refused the credentials.
    pub(crate) const AUTH: u8 = 77;
    /// The configuration (or a key name) is invalid.
    pub(crate) const CONFIG: u8 = 78;
    /// The command could not be started: not executable.
    pub(crate) const NOT_EXECUTABLE: u8 = 126;
    /// The command could not be started: not found.
    pub(crate) const NOT_FOUND: u8 = 127;
}

/// Distributed locks over Redis, etcd and ZooKeeper, from the command line.
///
/// The backend comes from --config FILE, --url URL, or the environment (LOCKKIT_CONFIG,
/// LOCKKIT_URL, LOCKKIT_* overrides).
///
/// Exit codes: 0 success; `run` passes the command's code through (128+N when it died of
/// signal N); 2 usage; 69 backend unavailable; 70 unexpected error; 75 lock not acquired;
/// 76 lock lost while the command ran (it was terminated); 77 authentication refused;
/// 78 invalid configuration or key; 126/127 command not executable / not found.
#[derive(Debug, Parser)]
#[command(name = "lockkit", version)]
struct Cli {
    #[command(flatten)]
    source: Source,
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command_,
}

#[derive(Debug, Args)]
struct Source {
    /// A lockkit TOML configuration file (default: $LOCKKIT_CONFIG).
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "url")]
    config: Option<PathBuf>,
    /// A backend URL, e.g. redis://127.0.0.1:6379 (default: $LOCKKIT_URL).
    #[arg(long, global = true, value_name = "URL")]
    url: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command_ {
    /// Run a command while holding a lock.
    ///
    /// Acquires KEY, runs CMD while holding it (renewing it), releases it when CMD exits and
    /// exits with CMD's code. CMD sees LOCKKIT_KEY, LOCKKIT_FENCING_TOKEN and LOCKKIT_BACKEND.
    /// If the lock is lost, CMD gets SIGTERM, then SIGKILL after --grace, and lockkit exits
    /// with 76. SIGINT and SIGTERM sent to lockkit are forwarded to CMD.
    Run(RunArgs),
    /// Show whether a lock is held.
    ///
    /// Prints the holder's fencing token, its remaining TTL and the backend's tier.
    Status {
        /// The lock name.
        key: String,
    },
    /// Check the configuration and the backend.
    ///
    /// Loads the configuration, prints it (secrets redacted) with its tier, and checks that
    /// the backend answers.
    Check,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// How long the lock lives without renewal (default: the configuration's lock.ttl).
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Option<Duration>,
    /// Wait at most this long for the lock (default: as long as it takes).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Fail at once (exit 75) if the lock is held.
    #[arg(long)]
    no_wait: bool,
    /// After the lock is lost: how long CMD has between SIGTERM and SIGKILL.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// The lock name.
    key: String,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

/// A failure that ends the process with a code and a message.
struct Failure {
    code: u8,
    message: String,
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        let code = match error.kind() {
            ErrorKind::InvalidConfig | ErrorKind::InvalidKey | ErrorKind::Unsupported => {
                exit::CONFIG
            }
            ErrorKind::Auth => exit::AUTH,
            ErrorKind::Unavailable | ErrorKind::QuorumNotReached { .. } => exit::UNAVAILABLE,
            ErrorKind::Timeout => exit::NOT_ACQUIRED,
            ErrorKind::Lost => exit::LOST,
            _ => exit::SOFTWARE,
        };
        Failure {
            code,
            message: error.display_chain().to_string(),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = cli.json;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("lockkit: cannot start a runtime: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            if json {
                println!(
                    "{}",
                    json!({ "error": failure.message, "exit_code": failure.code })
                );
            } else {
                eprintln!("lockkit: {}", failure.message);
            }
            ExitCode::from(failure.code)
        }
    }
}

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    let config = load_config(&cli.source)?;
    match cli.command {
        Command_::Check => check(&config, cli.json).await,
        Command_::Status { key } => status(&config, &key, cli.json).await,
        Command_::Run(args) => run(config, args, cli.json).await,
    }
}

fn load_config(source: &Source) -> Result<LockkitConfig, Failure> {
    let mut vars: Vec<(String, String)> = std::env::vars().collect();
    let mut set = |name: &str, value: String| {
        vars.retain(|(k, _)| k != "LOCKKIT_CONFIG" && k != "LOCKKIT_URL");
        vars.push((name.to_owned(), value));
    };
    if let Some(path) = &source.config {
        set("LOCKKIT_CONFIG", path.display().to_string());
    }
    if let Some(url) = &source.url {
        set("LOCKKIT_URL", url.clone());
    }
    Ok(LockkitConfig::load_from(vars)?)
}

async fn connect(config: &LockkitConfig) -> Result<LockClient, Failure> {
    Ok(lockkit::connect(config).await?)
}

async fn check(config: &LockkitConfig, json: bool) -> Result<u8, Failure> {
    let locks = connect(config).await?;
    locks.ping().await?;
    let tier = locks.tier();
    if json {
        println!(
            "{}",
            json!({
                "backend": config.backend.as_str(),
                "tier": tier.as_str(),
                "namespace": config.namespace,
                "config": format!("{config:?}"),
                "ok": true,
            })
        );
    } else {
        println!("configuration: {config:#?}");
        println!("backend {} (tier {tier}) answers", config.backend);
    }
    Ok(0)
}

async fn status(config: &LockkitConfig, key: &str, json: bool) -> Result<u8, Failure> {
    let locks = connect(config).await?;
    let info = locks.inspect(key).await?;
    let tier = locks.tier();
    if json {
        println!(
            "{}",
            json!({
                "key": key,
                "held": info.is_some(),
                "fencing_token": info.as_ref().map(|i| i.fencing_token.get()),
                "remaining_ttl_ms": info.as_ref().and_then(|i| i.remaining_ttl).map(|d| d.as_millis() as u64),
                "waiters": info.as_ref().and_then(|i| i.waiters),
                "backend": config.backend.as_str(),
                "tier": tier.as_str(),
            })
        );
    } else {
        match info {
            Some(info) => {
                print!("{key}: held, fencing token {}", info.fencing_token);
                if let Some(ttl) = info.remaining_ttl {
                    print!(", {ttl:?} left without renewal");
                }
                if let Some(waiters) = info.waiters {
                    print!(", {waiters} waiting");
                }
                println!(" ({} tier {tier})", config.backend);
            }
            None => println!("{key}: free ({} tier {tier})", config.backend),
        }
    }
    Ok(0)
}

async fn acquire(locks: &LockClient, args: &RunArgs) -> Result<MutexGuard, Failure> {
    let mut mutex = locks.mutex(&args.key)?;
    if let Some(ttl) = args.ttl {
        mutex = mutex.with_ttl(ttl)?;
    }
    let not_acquired = |why: String| Failure {
        code: exit::NOT_ACQUIRED,
        message: why,
    };
    if args.no_wait {
        return mutex
            .try_lock()
            .await?
            .ok_or_else(|| not_acquired(format!("{} is held by someone else", args.key)));
    }
    match args.wait {
        Some(wait) => mutex.lock_timeout(wait).await.map_err(|e| match e.kind() {
            ErrorKind::Timeout => {
                not_acquired(format!("{} was not free within {wait:?}", args.key))
            }
            _ => e.into(),
        }),
        None => Ok(mutex.lock().await?),
    }
}

async fn run(config: LockkitConfig, args: RunArgs, json: bool) -> Result<u8, Failure> {
    let locks = connect(&config).await?;
    let guard = acquire(&locks, &args).await?;
    let (program, rest) = args.command.split_first().ok_or_else(|| Failure {
        code: exit::USAGE,
        message: "no command given".into(),
    })?;
    // Listening before the command starts: a signal that arrives right after the spawn is
    // forwarded instead of killing lockkit and orphaning the command.
    let (mut interrupts, mut terminations) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        _ => {
            let _ = guard.release().await;
            return Err(Failure {
                code: exit::SOFTWARE,
                message: "cannot listen for signals".into(),
            });
        }
    };
    let child = Command::new(program)
        .args(rest)
        .env("LOCKKIT_KEY", &args.key)
        .env(
            "LOCKKIT_FENCING_TOKEN",
            guard.fencing_token().get().to_string(),
        )
        .env("LOCKKIT_BACKEND", config.backend.as_str())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            let _ = guard.release().await;
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::NOT_EXECUTABLE,
            };
            return Err(Failure {
                code,
                message: format!("cannot run {program}: {e}"),
            });
        }
    };
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let forward = |sig: Signal| {
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
            _ = interrupts.recv() => forward(Signal::SIGINT),
            _ = terminations.recv() => forward(Signal::SIGTERM),
            () = &mut lost, if !lost_lock => {
                lost_lock = true;
                eprintln!("lockkit: lost the lock on {}: terminating the command", args.key);
                forward(Signal::SIGTERM);
                if tokio::time::timeout(args.grace, child.wait()).await.is_err() {
                    eprintln!("lockkit: the command outlived the {:?} grace period: killing it", args.grace);
                    forward(Signal::SIGKILL);
                }
            }
        }
    };
    let status = status.map_err(|e| Failure {
        code: exit::SOFTWARE,
        message: format!("waiting for the command: {e}"),
    })?;
    let released = if lost_lock {
        drop(guard);
        false
    } else {
        guard.release().await.unwrap_or(false)
    };
    // A lost lock's guard is released in the background: let that finish (it removes what
    // may be left on the server) before the process exits, within a bound.
    let _ = tokio::time::timeout(Duration::from_secs(5), locks.close()).await;
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
                "command_exit": status.code(),
                "lost": lost_lock,
                "released": released,
                "exit_code": code,
            })
        );
    }
    Ok(code)
}
