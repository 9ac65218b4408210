//! Why fencing tokens: a writer paused past its TTL wakes up believing it holds the lock and
//! writes; the storage, which remembers the highest token it has seen, refuses the write.
//!
//! ```sh
//! cargo run --example fencing                                        # in-process (memory)
//! cargo run --features redis --example fencing -- redis://127.0.0.1:6379
//! cargo run --all-features --example fencing -- etcd://127.0.0.1:2379
//! ```
//!
//! On a server tier, writer A is a real process: this program run again as `fencing --writer`.
//! A takes the lock and is then stopped with `SIGSTOP` (as a GC pause or a VM stall would
//! freeze it, renewal and session keepalive included) until its lease or session has expired
//! and B has been granted the lock and written. Then A is resumed (`SIGCONT`) and writes with
//! its old token. The storage is [`lockkit_core::testing::fenced::FencedResource`], a small
//! service on loopback that A and B write to over TCP.
//!
//! The memory tier cannot be shared between processes: there A lives in this process, and
//! the pause is simulated by a lock that is not renewed while A sleeps past its TTL.
//!
//! Exits with 0 when the stale write was refused, 1 when the storage accepted it.

use std::process::Stdio;
use std::time::{Duration, Instant};

use lockkit::{LockOptions, LockkitConfig, MutexGuard};
use lockkit_core::testing::fenced::{FencedClient, FencedResource};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The lock's TTL. A ZooKeeper lock lasts as long as its session (the `[zk]` table's
/// `session_timeout`, 10 s by default), so there B waits longer.
const TTL: Duration = Duration::from_secs(2);

/// The key everybody writes to, in the storage and as the lock's name.
const LEDGER: &str = "ledger";

fn failure(message: String) -> lockkit::Error {
    lockkit::Error::new(lockkit::ErrorKind::Backend, "fencing", message)
}

fn config(url: &str, namespace: &str) -> lockkit::Result<LockkitConfig> {
    let mut config = LockkitConfig::from_url(url)?;
    config.namespace = namespace.to_owned();
    config.lock = LockOptions::default().with_ttl(TTL);
    Ok(config)
}

/// The variable that gives writer A's process the URL: not an argument, which every user of
/// the machine can read in the process list, and a URL may carry a password.
const URL_VARIABLE: &str = "FENCING_WRITER_URL";

/// Writer A's process (`fencing --writer NAMESPACE STORAGE`, the URL in [`URL_VARIABLE`]):
/// takes the lock, says `held TOKEN`, and waits for a line on stdin, its cue that it woke up
/// from its pause. Then it says `lost BOOL` and writes with its token, naively, saying
/// `stored` or `refused`.
async fn writer(url: &str, namespace: &str, storage: &str) -> lockkit::Result<()> {
    let locks = lockkit::connect(&config(url, namespace)?).await?;
    let mut storage = FencedClient::connect(storage, "A")
        .await
        .map_err(|e| failure(format!("the storage: {e}")))?;
    let guard = locks.mutex(LEDGER)?.lock().await?;
    let token = guard.fencing_token().get();
    say(&format!("held {token}"));
    tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new()))
        .await
        .map_err(|e| failure(format!("stdin: {e}")))?
        .map_err(|e| failure(format!("stdin: {e}")))?;
    say(&format!("lost {}", guard.is_lost()));
    let stored = storage
        .write(LEDGER, token)
        .await
        .map_err(|e| failure(format!("the storage: {e}")))?;
    say(if stored { "stored" } else { "refused" });
    // Not ours any more: the release finds somebody else's lock and leaves it alone.
    let _ = guard.release().await;
    Ok(())
}

fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Writer A, from the point of view of this program.
enum PausedWriter {
    /// A separate process, stopped with `SIGSTOP`.
    Process {
        child: Box<Child>,
        stdin: ChildStdin,
        said: Lines<BufReader<ChildStdout>>,
        token: u64,
    },
    /// A lock in this process that is not renewed (memory tier only).
    Simulated { guard: MutexGuard },
}

impl PausedWriter {
    /// Starts A's process, waits until it holds the lock, and stops it.
    async fn process(url: &str, namespace: &str, storage: &str) -> lockkit::Result<Self> {
        let exe = std::env::current_exe().map_err(|e| failure(format!("current_exe: {e}")))?;
        let mut child = Command::new(exe)
            .args(["--writer", namespace, storage])
            .env(URL_VARIABLE, url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| failure(format!("cannot start writer A: {e}")))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(failure("writer A has no stdin or stdout".into()));
        };
        let mut said = BufReader::new(stdout).lines();
        let token = match said_next(&mut said, Duration::from_secs(60))
            .await?
            .as_deref()
        {
            Some(line) if line.starts_with("held ") => line["held ".len()..]
                .parse()
                .map_err(|_| failure(format!("writer A said {line:?}")))?,
            other => {
                return Err(failure(format!(
                    "writer A did not take the lock: {other:?}"
                )));
            }
        };
        let writer = PausedWriter::Process {
            child: Box::new(child),
            stdin,
            said,
            token,
        };
        writer.signal(nix::sys::signal::Signal::SIGSTOP)?;
        Ok(writer)
    }

    fn token(&self) -> u64 {
        match self {
            PausedWriter::Process { token, .. } => *token,
            PausedWriter::Simulated { guard } => guard.fencing_token().get(),
        }
    }

    fn signal(&self, signal: nix::sys::signal::Signal) -> lockkit::Result<()> {
        let PausedWriter::Process { child, .. } = self else {
            return Ok(());
        };
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| failure("writer A has exited".into()))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
            .map_err(|e| failure(format!("cannot signal writer A: {e}")))
    }

    /// Resumes A, which writes with its old token: whether its guard said the lock was lost,
    /// and whether the storage took the write.
    async fn resume_and_write(self, storage: &FencedResource) -> lockkit::Result<(bool, bool)> {
        self.signal(nix::sys::signal::Signal::SIGCONT)?;
        match self {
            PausedWriter::Process {
                mut child,
                mut stdin,
                mut said,
                ..
            } => {
                stdin
                    .write_all(b"wake up\n")
                    .await
                    .map_err(|e| failure(format!("writer A: {e}")))?;
                let within = Duration::from_secs(30);
                let lost = said_next(&mut said, within).await?;
                let wrote = said_next(&mut said, within).await?;
                let _ = tokio::time::timeout(within, child.wait()).await;
                match (lost.as_deref(), wrote.as_deref()) {
                    (Some(lost), Some(wrote @ ("stored" | "refused"))) => {
                        Ok((lost == "lost true", wrote == "stored"))
                    }
                    other => Err(failure(format!("writer A said {other:?}"))),
                }
            }
            PausedWriter::Simulated { guard } => {
                let stored = storage.write("A", LEDGER, guard.fencing_token().get());
                Ok((guard.is_lost(), stored))
            }
        }
    }
}

async fn said_next(
    said: &mut Lines<BufReader<ChildStdout>>,
    within: Duration,
) -> lockkit::Result<Option<String>> {
    match tokio::time::timeout(within, said.next_line()).await {
        Ok(Ok(line)) => Ok(line),
        Ok(Err(e)) => Err(failure(format!("writer A: {e}"))),
        Err(_) => Err(failure(format!("writer A said nothing within {within:?}"))),
    }
}

#[tokio::main]
async fn main() -> lockkit::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, namespace, storage] = args.as_slice()
        && mode == "--writer"
    {
        let url = std::env::var(URL_VARIABLE)
            .map_err(|_| failure(format!("--writer needs the URL in {URL_VARIABLE}")))?;
        return writer(&url, namespace, storage).await;
    }
    let url = args
        .first()
        .cloned()
        .unwrap_or_else(|| "memory://".to_owned());
    let namespace = format!("fencing-{:08x}", rand::random::<u32>());
    let config = config(&url, &namespace)?;
    let storage = FencedResource::start()
        .await
        .map_err(|e| failure(format!("the storage: {e}")))?;
    let b = lockkit::connect(&config).await?;

    let a = if config.backend == lockkit::BackendKind::Memory {
        let guard = b
            .mutex(LEDGER)?
            .with_options(LockOptions::default().with_ttl(TTL).with_auto_renew(false))?
            .lock()
            .await?;
        PausedWriter::Simulated { guard }
    } else {
        PausedWriter::process(&url, &namespace, storage.address()).await?
    };
    let old_token = a.token();
    let paused_at = Instant::now();
    println!(
        "A holds the lock with token {old_token} (TTL {TTL:?}), reads the ledger, and is paused{}",
        match a {
            PausedWriter::Process { .. } => " (SIGSTOP)",
            PausedWriter::Simulated { .. } => " (no renewal)",
        }
    );

    let b_guard = b
        .mutex(LEDGER)?
        .lock_timeout(Duration::from_secs(60))
        .await?;
    let new_token = b_guard.fencing_token().get();
    println!(
        "B got the lock {:.1} s later, once A's {} had expired: token {new_token}",
        paused_at.elapsed().as_secs_f64(),
        if config.backend == lockkit::BackendKind::Zk {
            "session"
        } else {
            "lease"
        }
    );
    let b_stored = storage.write("B", LEDGER, new_token);
    println!("B writes: {}", if b_stored { "stored" } else { "refused" });

    let (lost, a_stored) = a.resume_and_write(&storage).await?;
    println!("A wakes up; its guard says lost = {lost} (a careful writer checks this first)");
    println!(
        "A writes anyway with token {old_token}: {}",
        if a_stored {
            "STORED, the ledger is corrupted"
        } else {
            "refused, the storage has seen a newer token"
        }
    );
    b_guard.release().await?;
    if a_stored || !b_stored {
        std::process::exit(1);
    }
    Ok(())
}
