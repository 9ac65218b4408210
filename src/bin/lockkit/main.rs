//! `lockkit`: run a command under a distributed lock or while leading an election, show a
//! lock's holder or an election's leader, check a configuration. See `lockkit --help` and the README's "Command line" section.

#[cfg(not(target_os = "linux"))]
compile_error!(
    "the lockkit command-line tool needs Linux: `run` ties its command's life to its own with \
     PR_SET_PDEATHSIG and reads signals from a signalfd (the library builds everywhere)"
);

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand};
use lockkit::{Error, ErrorKind, LockClient, LockkitConfig};
use serde_json::json;

mod child;
mod docs;
mod elect;
mod logging;
mod operator;
mod run;
mod signals;

/// Exit codes (besides the command's own, which `run` passes through).
mod exit {
    /// `release --force` was declined at its confirmation prompt.
    pub(crate) const DECLINED: u8 = 1;
    /// Bad usage (clap's own code).
    pub(crate) const USAGE: u8 = 2;
    /// Something else went wrong (an unexpected backend error).
    pub(crate) const SOFTWARE: u8 = 70;
    /// The backend did not answer (or no quorum did).
    pub(crate) const UNAVAILABLE: u8 = 69;
    /// The lock was not acquired: held by someone else with `--no-wait`, or not free within
    /// `--wait` (the default of `--conflict-exit-code`).
    pub(crate) const NOT_ACQUIRED: u8 = 75;
    /// The lock (the leadership, for `elect`) was lost while the command ran; the command
    /// was terminated.
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

/// Distributed locks over Redis, etcd, ZooKeeper and PostgreSQL, from the command line.
///
/// The backend comes from --config FILE, --url URL, or the environment (LOCKKIT_CONFIG,
/// LOCKKIT_URL, LOCKKIT_* overrides).
///
/// Exit codes: 0 success; 1 `release --force` declined; `run` and `elect` pass the command's
/// code through (128+N when it died of signal N); 2 usage; 69 backend unavailable; 70
/// unexpected error; 75 lock not acquired; 76 lock or leadership lost while the command ran
/// (it was terminated); 77 authentication refused; 78 invalid configuration or key, or a
/// backend without elections; 126/127 command not executable / not found; 128+N signal N
/// interrupted lockkit before the command started.
#[derive(Debug, Parser)]
#[command(name = "lockkit", version)]
struct Cli {
    #[command(flatten)]
    source: Source,
    /// Print machine-readable JSON instead of text, on stdout. With `run` and `elect`, stdout
    /// carries only lockkit's report: the command's stdout goes to lockkit's stderr.
    #[arg(long, global = true)]
    json: bool,
    /// Log more to stderr: -v info, -vv debug, -vvv trace (default: warnings, such as
    /// failed renewals). RUST_LOG (e.g. `lockkit_redis=debug,warn`) overrides it.
    #[arg(short, long, global = true, action = ArgAction::Count)]
    verbose: u8,
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
    /// Run a command while holding a lock (or one of a semaphore's permits).
    ///
    /// Acquires KEY, runs CMD while holding it (renewing it), releases it when CMD exits and
    /// exits with CMD's code. With --permits N, KEY is a semaphore of N permits: up to N
    /// commands run at once, each holding one permit (everything below holds for a permit as
    /// for the lock; CMD also sees LOCKKIT_PERMITS). Every process using the semaphore must
    /// give the same N: another N while it is in use fails with 78, as does --permits on a
    /// backend without semaphores (Redlock). With --read or --write, KEY is a read-write
    /// lock: --read runs share it, a --write run holds it alone (and --read runs that come
    /// while it waits wait behind it). CMD also sees LOCKKIT_MODE (lock, permit, read or
    /// write).
    ///
    /// CMD sees LOCKKIT_KEY, LOCKKIT_FENCING_TOKEN, LOCKKIT_BACKEND, LOCKKIT_TTL_MS (the
    /// lock's TTL) and LOCKKIT_VALID_UNTIL_MS (when the lock would expire, in milliseconds
    /// since the Unix epoch, if lockkit stopped renewing it at CMD's start; lockkit renews it
    /// while CMD runs).
    ///
    /// CMD never runs without the lock: if the lock is lost, CMD gets SIGTERM, then SIGKILL
    /// after --grace, and lockkit exits with 76; if lockkit dies (even of SIGKILL), the
    /// kernel kills CMD (processes CMD started itself are not covered).
    ///
    /// SIGINT, SIGTERM, SIGHUP and SIGQUIT: while lockkit waits for the lock, they abandon
    /// the wait cleanly (exit 128+N); while CMD runs, each reaches CMD once (one sent by the
    /// terminal already reached CMD and is not sent again; one sent to lockkit by a process
    /// is passed on).
    Run(RunArgs),
    /// Run a command while leading an election.
    ///
    /// Campaigns for the election NAME (waiting while another candidate leads), then runs
    /// CMD while this process leads, renewing the leadership; when CMD exits, resigns (the
    /// next candidate takes over at once) and exits with CMD's code. The election NAME is
    /// the lock NAME: `status`, `list` and `release --force` see it.
    ///
    /// CMD sees LOCKKIT_ELECTION (NAME), LOCKKIT_TERM (the term: a fencing token, higher for
    /// every new leader; pass it with every write CMD makes), LOCKKIT_VALUE (the value this
    /// leader proclaimed), LOCKKIT_BACKEND, LOCKKIT_TTL_MS and LOCKKIT_VALID_UNTIL_MS (as for
    /// `run`).
    ///
    /// CMD never runs without the leadership: if it is lost, CMD gets SIGTERM, then SIGKILL
    /// after --grace, and lockkit exits with 76 (it does not campaign again: let the
    /// supervisor restart it); if lockkit dies (even of SIGKILL), the kernel kills CMD.
    /// Signals are handled as by `run`: during the campaign they withdraw the candidate
    /// (exit 128+N), while CMD runs each reaches CMD once. Backends without elections
    /// (Redlock) fail with 78.
    Elect(ElectArgs),
    /// Show who leads an election.
    ///
    /// Prints the leader's term and the value it proclaimed, or that nobody leads. With
    /// --watch, prints the current state and then every change (a new leader, a new value,
    /// a vacancy), one line each, until interrupted: a slow reader may miss intermediate
    /// leaders, but always ends on the current one, and terms never go backwards. With
    /// --json, one JSON object per line: {"election":NAME,"leader":{"term":N,"value":V}},
    /// or {"election":NAME,"leader":null} when nobody leads (a value is null between a new
    /// leader's grant and its proclamation). Backends without elections (Redlock) fail
    /// with 78.
    Leader {
        /// Print every change after the current state, until interrupted.
        #[arg(long)]
        watch: bool,
        /// The election name.
        name: String,
    },
    /// Show whether a lock is held.
    ///
    /// Prints the holder's fencing token, its remaining TTL and the backend's tier.
    Status {
        /// The lock name.
        key: String,
    },
    /// Check the configuration and the backend.
    ///
    /// Loads the configuration, prints it (secrets redacted) with its tier and the primitives
    /// its backend has (mutex, election, semaphore, rwlock: "supported", or "unsupported:
    /// why"), and
    /// checks that the backend answers.
    Check,
    /// List the held locks of the namespace.
    ///
    /// Prints each held lock whose name starts with PREFIX (all of them without one): its
    /// name, fencing token, remaining TTL and queued waiters, where the backend knows them.
    /// With --json, one JSON object per line. The backend is read a page at a time; locks
    /// taken or released meanwhile may or may not be listed.
    List {
        /// Only locks whose names start with this.
        #[arg(default_value = "")]
        prefix: String,
    },
    /// Break a lock an operator knows is stale: `release --force KEY`.
    ///
    /// Removes the current holder's grant whoever it is, and wakes the waiters. The holder
    /// is not told: its guard reports the lock lost at its next renewal (`lockkit run`
    /// then terminates its command), and until then it may still act; a fencing token keeps
    /// it harmless only where the protected resource checks tokens. Asks for confirmation
    /// on stdin unless --yes; exits 1 when declined.
    Release {
        /// Required: a lock is released by its holder; this breaks it for someone else.
        #[arg(long, required = true)]
        force: bool,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
        /// The lock name.
        key: String,
    },
    /// Print a shell completion script.
    ///
    /// For example: `lockkit completions bash > /etc/bash_completion.d/lockkit`,
    /// `lockkit completions zsh > "${fpath[1]}/_lockkit"`,
    /// `lockkit completions fish > ~/.config/fish/completions/lockkit.fish`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page, in roff: `lockkit man > lockkit.1`.
    ///
    /// With a subcommand, its own page: `lockkit man run > lockkit-run.1`.
    Man {
        /// A subcommand whose page to print instead.
        subcommand: Option<String>,
    },
}

#[derive(Debug, Args)]
struct RunArgs {
    /// How long the lock lives without renewal (default: the configuration's lock.ttl).
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Option<Duration>,
    /// Wait at most this long for the lock (default: the configuration's
    /// lock.wait_timeout; as long as it takes when that is not set).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Fail at once, with the conflict exit code, if the lock is held (no permit is free).
    #[arg(long)]
    no_wait: bool,
    /// Wait in line: a release hands the lock to the longest waiting run (the default, or
    /// the configuration's lock.fair).
    #[arg(long, overrides_with = "no_fair")]
    fair: bool,
    /// Do not wait in line: a release frees the lock and whoever asks first takes it (a run
    /// can be passed over; not faster under contention, see docs/measurements.md). etcd,
    /// ZooKeeper and PostgreSQL locks stay fair.
    #[arg(long, overrides_with = "fair")]
    no_fair: bool,
    /// KEY is a semaphore of N permits (1 to 1024): run CMD holding one of them.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(lockkit::MAX_PERMITS)))]
    permits: Option<u32>,
    /// KEY is a read-write lock: run CMD holding a read lock, shared with other --read runs
    /// (it waits while a writer holds KEY or waits for it).
    #[arg(long, conflicts_with_all = ["permits", "write"])]
    read: bool,
    /// KEY is a read-write lock: run CMD holding its write lock, alone (readers that come
    /// while it waits wait behind it).
    #[arg(long, conflicts_with = "permits")]
    write: bool,
    /// The exit code when the lock is not acquired (held with --no-wait, or not free within
    /// the wait), like `flock -E`: tells a skipped run from a failed one.
    #[arg(long, value_name = "N", default_value_t = exit::NOT_ACQUIRED)]
    conflict_exit_code: u8,
    /// After the lock is lost: how long CMD has between SIGTERM and SIGKILL.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// The lock name.
    key: String,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

#[derive(Debug, Args)]
struct ElectArgs {
    /// What this candidate proclaims while it leads, for `lockkit leader` and CMD's
    /// LOCKKIT_VALUE, e.g. its address (default: HOSTNAME:PID).
    #[arg(long)]
    value: Option<String>,
    /// How long the leadership lives without renewal: how long a crashed leader keeps the
    /// others waiting (default: the configuration's lock.ttl).
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Option<Duration>,
    /// After the leadership is lost: how long CMD has between SIGTERM and SIGKILL.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// The election name.
    name: String,
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
    let mut args = std::env::args_os();
    if args
        .nth(1)
        .is_some_and(|first| first == signals::TRAMPOLINE)
    {
        return signals::exec_child(args);
    }
    let cli = Cli::parse();
    let json = cli.json;
    if let Err(message) = logging::init(cli.verbose) {
        eprintln!("lockkit: {message}");
        return ExitCode::from(exit::USAGE);
    }
    // Before the runtime starts its threads, so that they all inherit the mask.
    if matches!(cli.command, Command_::Run(_) | Command_::Elect(_))
        && let Err(e) = signals::block()
    {
        eprintln!("lockkit: cannot take over signals: {e}");
        return ExitCode::from(exit::SOFTWARE);
    }
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
    match &cli.command {
        Command_::Completions { shell } => return Ok(docs::completions(*shell)),
        Command_::Man { subcommand } => return docs::man(subcommand.as_deref()),
        _ => {}
    }
    let config = load_config(&cli.source)?;
    match cli.command {
        Command_::Check => check(&config, cli.json).await,
        Command_::Status { key } => status(&config, &key, cli.json).await,
        Command_::List { prefix } => operator::list(&config, &prefix, cli.json).await,
        Command_::Release { key, yes, .. } => {
            operator::force_release(&config, &key, yes, cli.json).await
        }
        Command_::Completions { .. } | Command_::Man { .. } => Ok(0),
        Command_::Leader { name, watch } => elect::leader(&config, &name, watch, cli.json).await,
        Command_::Run(args) => run::run(config, args, cli.json, &mut listen()?).await,
        Command_::Elect(args) => elect::elect(config, args, cli.json, &mut listen()?).await,
    }
}

fn listen() -> Result<signals::Signals, Failure> {
    signals::Signals::new().map_err(|e| Failure {
        code: exit::SOFTWARE,
        message: format!("cannot listen for signals: {e}"),
    })
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
    let capabilities = locks.capabilities();
    let primitives = [
        ("mutex", lockkit::Support::Supported),
        ("election", capabilities.election),
        ("semaphore", capabilities.semaphore),
        ("rwlock", capabilities.rwlock),
    ];
    let said = |support: lockkit::Support| match support {
        lockkit::Support::Unsupported(why) => format!("unsupported: {why}"),
        _ => "supported".to_owned(),
    };
    if json {
        let primitives: serde_json::Map<String, serde_json::Value> = primitives
            .iter()
            .map(|(name, support)| ((*name).to_owned(), said(*support).into()))
            .collect();
        println!(
            "{}",
            json!({
                "backend": config.backend.as_str(),
                "tier": tier.as_str(),
                "namespace": config.namespace,
                "primitives": primitives,
                "config": format!("{config:?}"),
                "ok": true,
            })
        );
    } else {
        println!("configuration: {config:#?}");
        println!("backend {} (tier {tier}) answers", config.backend);
        for (name, support) in primitives {
            println!("{name}: {}", said(support));
        }
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
