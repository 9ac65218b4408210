//! Lock workers: separate OS processes (so that SIGSTOP freezes their renewals exactly as a
//! GC pause would) that take a lock, write to the fenced resource under it, release it, and
//! record every step to a history file.
//!
//! With [`WorkerSpec::elect`] a worker is an election candidate instead: it campaigns for the
//! election of the same name with its own name as the value, and while it leads it writes
//! with its term as the fencing token and resigns where a lock worker releases. Its history
//! records leaderships as grants (the term as the token) and their loss as a lost lock, so
//! the same checker judges both. With [`WorkerSpec::permits`] it takes a permit of the
//! semaphore of that name, with [`WorkerSpec::read`] or [`WorkerSpec::write`] a read or the
//! write lock of the read-write lock of that name; its grants say their kind, which the
//! checker judges them by. [`WorkerSpec::until_told`] makes a worker hold its grant until
//! the driver tells it to let go ([`Worker::tell`]).
//!
//! The worker side is [`run`], started as `lockkit-campaign worker ARGS`; the driver side is
//! [`Worker`]. A worker also prints each step on stdout (`granted 42`, `checked`, `idle`...)
//! so the driver can time its faults; once done it prints `idle` and keeps its sessions open
//! until its stdin closes, so that leaks are looked for while every client is still alive.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lockkit::backend::validity_floor;
use lockkit::{
    Election, Leadership, LockClient, LockkitConfig, Mutex as LockMutex, MutexGuard, Permit,
    ReadGuard, RwLock, Semaphore, WriteGuard,
};
use lockkit_core::testing::fenced::FencedClient;
use lockkit_core::testing::history::{GrantKind, HistoryWriter, What};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use crate::CampaignError;

/// What one worker does.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerSpec {
    /// The worker's name in the histories.
    #[arg(long)]
    pub name: String,
    /// The lock service.
    #[arg(long)]
    pub url: String,
    /// The lock's name.
    #[arg(long)]
    pub key: String,
    /// The lock's TTL, in milliseconds.
    #[arg(long)]
    pub ttl_ms: u64,
    /// Where the history goes.
    #[arg(long)]
    pub history: PathBuf,
    /// The fenced resource's `host:port`.
    #[arg(long)]
    pub resource: String,
    /// How many grants to get; a failed acquire is retried after 100 ms.
    #[arg(long, default_value_t = 1)]
    pub iterations: u32,
    /// When to give up on the remaining grants, in milliseconds from the start.
    #[arg(long, default_value_t = 120_000)]
    pub deadline_ms: u64,
    /// How long to hold the lock each time, in milliseconds, spread over the writes.
    #[arg(long, default_value_t = 0)]
    pub hold_ms: u64,
    /// How many writes to make under each grant.
    #[arg(long, default_value_t = 1)]
    pub writes: u32,
    /// Write without checking the lost signal first (as a careless service would).
    #[arg(long)]
    pub naive: bool,
    /// Stop (SIGSTOP) itself right after the first check that it still holds the lock, before
    /// the write that check was for.
    #[arg(long)]
    pub stop_after_check: bool,
    /// How long one acquire may wait, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub acquire_timeout_ms: u64,
    /// The pause between iterations, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub between_ms: u64,
    /// Test only: present fencing token 1 instead of the grant's, as a client that does not
    /// pass its token along would; the campaign must catch it.
    #[arg(long, hide = true)]
    pub break_fencing: bool,
    /// Be a candidate of the election `key` instead of a taker of the lock `key`: campaign
    /// with the worker's name as the value, write with the term, resign instead of release.
    #[arg(long)]
    pub elect: bool,
    /// Take a permit of the semaphore `key` of this many permits instead of the lock `key`.
    #[arg(long, conflicts_with_all = ["elect", "read", "write"])]
    pub permits: Option<u32>,
    /// Take a read lock of the read-write lock `key` instead of the lock `key`.
    #[arg(long, conflicts_with_all = ["elect", "write"])]
    pub read: bool,
    /// Take the write lock of the read-write lock `key` instead of the lock `key`.
    #[arg(long, conflicts_with = "elect")]
    pub write: bool,
    /// Hold each grant until the driver says a line on stdin (instead of `hold_ms`).
    #[arg(long)]
    pub until_told: bool,
}

impl WorkerSpec {
    /// The command-line arguments that make a worker do this.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "worker".to_owned(),
            format!("--name={}", self.name),
            format!("--url={}", self.url),
            format!("--key={}", self.key),
            format!("--ttl-ms={}", self.ttl_ms),
            format!("--history={}", self.history.display()),
            format!("--resource={}", self.resource),
            format!("--iterations={}", self.iterations),
            format!("--deadline-ms={}", self.deadline_ms),
            format!("--hold-ms={}", self.hold_ms),
            format!("--writes={}", self.writes),
            format!("--acquire-timeout-ms={}", self.acquire_timeout_ms),
            format!("--between-ms={}", self.between_ms),
        ];
        if self.naive {
            args.push("--naive".to_owned());
        }
        if self.stop_after_check {
            args.push("--stop-after-check".to_owned());
        }
        if self.break_fencing {
            args.push("--break-fencing".to_owned());
        }
        if self.elect {
            args.push("--elect".to_owned());
        }
        if let Some(permits) = self.permits {
            args.push(format!("--permits={permits}"));
        }
        for (set, flag) in [
            (self.read, "--read"),
            (self.write, "--write"),
            (self.until_told, "--until-told"),
        ] {
            if set {
                args.push(flag.to_owned());
            }
        }
        args
    }
}

type Shared = Arc<Mutex<HistoryWriter>>;

fn record(history: &Shared, key: &str, what: What) -> Result<(), CampaignError> {
    history
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .record(key, what)
        .map(drop)
        .map_err(|e| CampaignError(format!("cannot write the history: {e}")))
}

/// Records and says that an acquire (or the connection it needed) failed with `error`.
fn failed(history: &Shared, key: &str, error: &lockkit::Error) -> Result<(), CampaignError> {
    record(
        history,
        key,
        What::Failed {
            error: format!("{:?}", error.kind()),
        },
    )?;
    say("failed");
    Ok(())
}

fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// How a worker obtains its grants: as a lock taker, an election candidate, a semaphore's
/// permit taker, or a reader or writer of a read-write lock.
enum Contender {
    Lock(LockMutex),
    Candidate { election: Election, value: String },
    Permit(Semaphore),
    Read(RwLock),
    Write(RwLock),
}

/// A grant: a lock's guard, a leadership (whose guard is that of the election's lock, and
/// whose fencing token is its term), a permit, a read or a write lock.
enum Held {
    Lock(MutexGuard),
    Leader(Leadership),
    Permit(Permit),
    Read(ReadGuard),
    Write(WriteGuard),
}

impl Contender {
    fn new(locks: &LockClient, spec: &WorkerSpec) -> Result<Contender, lockkit::Error> {
        let ttl = Duration::from_millis(spec.ttl_ms);
        Ok(if spec.elect {
            Contender::Candidate {
                election: locks.election(&spec.key)?.with_ttl(ttl)?,
                value: spec.name.clone(),
            }
        } else if let Some(permits) = spec.permits {
            Contender::Permit(locks.semaphore(&spec.key, permits)?.with_ttl(ttl)?)
        } else if spec.read {
            Contender::Read(locks.rwlock(&spec.key)?.with_ttl(ttl)?)
        } else if spec.write {
            Contender::Write(locks.rwlock(&spec.key)?.with_ttl(ttl)?)
        } else {
            Contender::Lock(locks.mutex(&spec.key)?.with_ttl(ttl)?)
        })
    }

    /// What its grants let others hold beside them.
    fn kind(&self) -> GrantKind {
        match self {
            Contender::Lock(_) | Contender::Candidate { .. } => GrantKind::Exclusive,
            Contender::Permit(semaphore) => GrantKind::Permit {
                permits: semaphore.permits(),
            },
            Contender::Read(_) => GrantKind::Read,
            Contender::Write(_) => GrantKind::Write,
        }
    }

    async fn obtain(&self, timeout: Duration) -> Result<Held, lockkit::Error> {
        match self {
            Contender::Lock(mutex) => mutex.lock_timeout(timeout).await.map(Held::Lock),
            Contender::Candidate { election, value } => election
                .campaign_timeout(value.as_str(), timeout)
                .await
                .map(Held::Leader),
            Contender::Permit(semaphore) => {
                semaphore.acquire_timeout(timeout).await.map(Held::Permit)
            }
            Contender::Read(rwlock) => rwlock.read_timeout(timeout).await.map(Held::Read),
            Contender::Write(rwlock) => rwlock.write_timeout(timeout).await.map(Held::Write),
        }
    }
}

impl Held {
    fn guard(&self) -> &MutexGuard {
        match self {
            Held::Lock(guard) => guard,
            Held::Leader(leadership) => leadership.guard(),
            Held::Permit(permit) => permit.as_guard(),
            Held::Read(read) => read.as_guard(),
            Held::Write(write) => write.as_guard(),
        }
    }

    /// Releases the lock, or resigns the leadership.
    async fn release(self) -> Result<bool, lockkit::Error> {
        match self {
            Held::Lock(guard) => guard.release().await,
            Held::Leader(leadership) => leadership.resign().await,
            Held::Permit(permit) => permit.release().await,
            Held::Read(read) => read.release().await,
            Held::Write(write) => write.release().await,
        }
    }
}

/// The worker process: does what `spec` says, then waits for its stdin to close.
///
/// # Errors
/// When the history cannot be written, the URL is not a lock service, or the resource
/// cannot be reached. Lock errors are recorded, not returned.
pub async fn run(spec: WorkerSpec) -> Result<(), CampaignError> {
    let history: Shared = Arc::new(Mutex::new(
        HistoryWriter::create(&spec.history, &spec.name)
            .map_err(|e| CampaignError(format!("{}: {e}", spec.history.display())))?,
    ));
    let config = LockkitConfig::from_url(&spec.url)?;
    let mut resource = FencedClient::connect(&spec.resource, &spec.name)
        .await
        .map_err(|e| CampaignError(format!("the fenced resource: {e}")))?;
    let key = spec.key.as_str();
    let pause = Duration::from_millis(spec.hold_ms) / spec.writes.max(1);
    let mut stop_pending = spec.stop_after_check;
    let mut told = stdin_lines();
    say("ready");
    let deadline = Instant::now() + Duration::from_millis(spec.deadline_ms);
    // A server that cannot be reached at the start is a failed acquire too.
    let locks = loop {
        match lockkit::connect(&config).await {
            Ok(locks) => break Some(locks),
            Err(_) if Instant::now() >= deadline => break None,
            Err(e) => {
                record(&history, key, What::Invoke)?;
                failed(&history, key, &e)?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let contender = match &locks {
        Some(locks) => Some(Contender::new(locks, &spec)?),
        None => None,
    };
    let mut grants = 0;
    while let Some(contender) = &contender
        && grants < spec.iterations
        && Instant::now() < deadline
    {
        record(&history, key, What::Invoke)?;
        let held = match contender
            .obtain(Duration::from_millis(spec.acquire_timeout_ms))
            .await
        {
            Ok(held) => held,
            Err(e) => {
                failed(&history, key, &e)?;
                tokio::time::sleep(Duration::from_millis(spec.between_ms.max(100))).await;
                continue;
            }
        };
        grants += 1;
        let guard = held.guard();
        let token = if spec.break_fencing {
            1
        } else {
            guard.fencing_token().get()
        };
        let remaining_ms = u64::try_from(guard.granted_validity().as_millis()).unwrap_or(u64::MAX);
        let floor = locks.as_ref().map_or(Duration::ZERO, |locks| {
            validity_floor(locks.backend().max_validity(guard.ttl()))
        });
        record(
            &history,
            key,
            What::Granted {
                token,
                remaining_ms,
                floor_ms: u64::try_from(floor.as_millis()).unwrap_or(u64::MAX),
                kind: contender.kind(),
            },
        )?;
        say(&format!("granted {token}"));
        let watcher = {
            let (lost, history, key) = (guard.lost(), history.clone(), key.to_owned());
            tokio::spawn(async move {
                lost.await;
                let _ = record(&history, &key, What::Lost { token });
                say("lost");
            })
        };
        // The first write goes out at once: presenting the new token to the resource is what
        // fences the previous holder off.
        for i in 0..spec.writes {
            if i > 0 {
                tokio::time::sleep(pause).await;
            }
            if !spec.naive && guard.is_lost() {
                break;
            }
            if stop_pending {
                stop_pending = false;
                record(&history, key, What::Checked { token })?;
                say("checked");
                nix::sys::signal::raise(Signal::SIGSTOP)
                    .map_err(|e| CampaignError(format!("cannot stop myself: {e}")))?;
            }
            let stored = resource
                .write(key, token)
                .await
                .map_err(|e| CampaignError(format!("the fenced resource: {e}")))?;
            say(if stored { "stored" } else { "refused" });
        }
        if spec.until_told {
            told.recv().await;
        } else {
            tokio::time::sleep(pause).await;
        }
        if spec.naive {
            // A careless holder also renews by hand, lost or not: it must not get the lock
            // back from whoever holds it now.
            let outcome = match guard.extend().await {
                Ok(()) => "ok".to_owned(),
                Err(e) => format!("{:?}", e.kind()),
            };
            record(&history, key, What::Extended { token, outcome })?;
        }
        record(&history, key, What::Release { token })?;
        let valid_until = held.guard().valid_until();
        let outcome = match held.release().await {
            Ok(true) => "ok".to_owned(),
            // Answered after the lease's validity ran out: its expiry explains the answer.
            Ok(false) if Instant::now() >= valid_until => "expired".to_owned(),
            Ok(false) => "not_held".to_owned(),
            Err(e) => format!("{:?}", e.kind()),
        };
        watcher.abort();
        record(&history, key, What::Released { token, outcome })?;
        say("released");
        tokio::time::sleep(Duration::from_millis(spec.between_ms)).await;
    }
    say("idle");
    while told.recv().await.is_some() {}
    Ok(())
}

/// The lines the driver says on stdin; the channel closes with stdin.
fn stdin_lines() -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The driver's handle on a worker process. Dropping it kills the process.
#[derive(Debug)]
pub struct Worker {
    /// The worker's name.
    pub name: String,
    /// Its history file.
    pub history: PathBuf,
    child: Child,
    stdin: Option<ChildStdin>,
    said: mpsc::UnboundedReceiver<String>,
    pid: Pid,
    idle: bool,
}

impl Worker {
    /// Starts `exe worker ...` doing `spec`, and waits until it is connected.
    ///
    /// # Errors
    /// When it cannot be started or does not get ready within 30 s.
    pub async fn spawn(exe: &Path, spec: &WorkerSpec) -> Result<Worker, CampaignError> {
        let mut child = Command::new(exe)
            .args(spec.to_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| CampaignError(format!("cannot start {}: {e}", exe.display())))?;
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw)
            .ok_or_else(|| CampaignError("the worker exited at once".into()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| CampaignError("the worker has no stdout".into()))?;
        let (tx, said) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut worker = Worker {
            name: spec.name.clone(),
            history: spec.history.clone(),
            stdin: child.stdin.take(),
            child,
            said,
            pid,
            idle: false,
        };
        worker.wait_for("ready", Duration::from_secs(30)).await?;
        Ok(worker)
    }

    /// Waits until the worker says a line starting with `prefix`, and returns it.
    ///
    /// # Errors
    /// When it does not within `within`, or exits first.
    pub async fn wait_for(
        &mut self,
        prefix: &str,
        within: Duration,
    ) -> Result<String, CampaignError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.said.recv()).await {
                Ok(Some(line)) => {
                    self.idle |= line == "idle";
                    if line.starts_with(prefix) {
                        return Ok(line);
                    }
                }
                Ok(None) => {
                    return Err(CampaignError(format!(
                        "{} exited before saying {prefix:?}",
                        self.name
                    )));
                }
                Err(_) => {
                    return Err(CampaignError(format!(
                        "{} did not say {prefix:?} within {within:?}",
                        self.name
                    )));
                }
            }
        }
    }

    /// Waits until the worker is done with its iterations (at once if it already said so).
    ///
    /// # Errors
    /// When it is not within `within`, or exits first.
    pub async fn wait_idle(&mut self, within: Duration) -> Result<(), CampaignError> {
        if !self.idle {
            self.wait_for("idle", within).await?;
        }
        Ok(())
    }

    /// Tells a worker started with [`WorkerSpec::until_told`] to let its grant go.
    ///
    /// # Errors
    /// When its stdin is closed.
    pub async fn tell(&mut self) -> Result<(), CampaignError> {
        use tokio::io::AsyncWriteExt;
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| CampaignError(format!("{} has no stdin", self.name)))?;
        stdin
            .write_all(b"go\n")
            .await
            .map_err(|e| CampaignError(format!("cannot tell {}: {e}", self.name)))
    }

    /// Sends `signal` to the worker.
    ///
    /// # Errors
    /// When it is gone.
    pub fn signal(&self, signal: Signal) -> Result<(), CampaignError> {
        nix::sys::signal::kill(self.pid, signal)
            .map_err(|e| CampaignError(format!("cannot signal {}: {e}", self.name)))
    }

    /// Waits until the worker has stopped itself (SIGSTOP).
    ///
    /// # Errors
    /// When it has not within `within`.
    pub async fn wait_stopped(&self, within: Duration) -> Result<(), CampaignError> {
        let stat = format!("/proc/{}/stat", self.pid);
        let started = Instant::now();
        while started.elapsed() < within {
            let state = std::fs::read_to_string(&stat).unwrap_or_default();
            // The state follows the parenthesised command name.
            if state
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Err(CampaignError(format!(
            "{} did not stop within {within:?}",
            self.name
        )))
    }

    /// Kills the worker (SIGKILL) and reaps it.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// Lets an idle worker exit (closes its stdin) and reaps it; kills it if it does not exit
    /// within 10 s.
    pub async fn finish(mut self) {
        self.stdin = None;
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            self.kill().await;
        }
    }
}
