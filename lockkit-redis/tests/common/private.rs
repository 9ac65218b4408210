//! A private redis-server for tests that restart, kill or reconfigure a server: never the
//! shared compose servers. On 127.0.0.1, ports 21300-21399 only; stopped by its PID.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lockkit_core::testing::backend_missing;

/// The ports these tests may use.
const PORTS: std::ops::Range<u16> = 21300..21400;

/// Reserves `port` for this process's server until the returned reservation is dropped,
/// across test processes (nextest runs each test in a process of its own), also while the
/// server is down for a restart: a test starting its own server must not take the port of one
/// that is coming back. `None` when a live process holds it.
fn reserve(port: u16) -> Option<Reservation> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("lk-redis-ports");
    std::fs::create_dir_all(&dir).expect("a folder for the port reservations");
    let path = dir.join(format!("{port}.pid"));
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut file) => {
                use std::io::Write;
                file.write_all(std::process::id().to_string().as_bytes())
                    .expect("a port reservation");
                return Some(Reservation(path));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // A reservation whose process is gone (a test killed mid-way) is stale.
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                if holder.is_empty() || PathBuf::from(format!("/proc/{holder}")).exists() {
                    return None;
                }
                let _ = std::fs::remove_file(&path);
            }
            Err(e) => panic!("cannot reserve port {port}: {e}"),
        }
    }
    None
}

/// A port reserved by [`reserve`]: its file, removed when dropped.
struct Reservation(PathBuf);

impl Drop for Reservation {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A redis-server of this test process, killed (by its PID) when dropped.
pub struct PrivateRedis {
    child: Option<Child>,
    pub port: u16,
    /// The port's reservation ([`reserve`]), given back when the server is dropped.
    _reservation: Reservation,
    args: Vec<String>,
    dir: PathBuf,
}

/// Whether this machine has the redis-server command; if not, says so ([`backend_missing`]:
/// a failure under `LOCKKIT_REQUIRE_BACKENDS=1`).
pub fn redis_server_installed() -> bool {
    let installed = Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok();
    if !installed {
        backend_missing("the redis-server command");
    }
    installed
}

impl PrivateRedis {
    /// Starts a redis-server with `args` on a free port, or `None` (after
    /// [`backend_missing`]) when there is no redis-server command.
    pub fn start(args: &[&str]) -> Option<PrivateRedis> {
        if !redis_server_installed() {
            return None;
        }
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        // Tests of this crate run in parallel: start at a random port and move on when one is
        // reserved or taken (also when another program took it between the check and the
        // start).
        let offset = rand::random::<u16>() % PORTS.len() as u16;
        for i in 0..PORTS.len() as u16 {
            let port = PORTS.start + (offset + i) % PORTS.len() as u16;
            let Some(reservation) = reserve(port) else {
                continue;
            };
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
                continue;
            }
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("lk-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("a folder for the private redis-server");
            let mut server = PrivateRedis {
                child: None,
                port,
                _reservation: reservation,
                args: args.clone(),
                dir,
            };
            if server.launch() {
                return Some(server);
            }
            // `server` is dropped here, which gives the port back.
        }
        panic!("no free port in {PORTS:?} for a private redis-server");
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `host:port`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL, by PID), waits `down`, and starts it again on the same
    /// port (empty, unless its arguments turn persistence on).
    pub fn restart(&mut self, down: Duration) {
        self.kill();
        std::thread::sleep(down);
        let by = Instant::now() + Duration::from_secs(10);
        while !self.launch() {
            assert!(
                Instant::now() < by,
                "the private redis-server did not restart"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the server (by its PID) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process and waits until it answers; false if it exited (port taken).
    fn launch(&mut self) -> bool {
        let mut child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let by = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            if serves(self.port, child.id()) {
                self.child = Some(child);
                return true;
            }
            if Instant::now() >= by {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the private redis-server on {} did not answer", self.port);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Whether a redis-server answers PING on `port`.
/// Whether the redis-server answering on `port` is the process `pid`, not another program's
/// server that took the port.
pub fn serves(port: u16, pid: u32) -> bool {
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}")) else {
        return false;
    };
    client
        .get_connection_with_timeout(Duration::from_millis(200))
        .and_then(|mut con| redis::cmd("INFO").arg("server").query::<String>(&mut con))
        .is_ok_and(|info| {
            info.lines()
                .any(|line| line.trim() == format!("process_id:{pid}"))
        })
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
