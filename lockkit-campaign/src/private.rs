//! Servers a scenario starts for itself, where the compose topologies cannot show the fault:
//! a Redis with an fsync'd append-only file, and a Sentinel topology whose primary can be cut
//! off from its replica and Sentinels while a client still reaches it.
//!
//! They listen on free loopback ports, keep their data under the run's directory, and are
//! killed (by the PID this process started) when dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lockkit_core::testing::proxy::FaultProxy;

use crate::CampaignError;

/// A free loopback port (the listener is closed again before the server binds it).
fn free_port() -> Result<u16, CampaignError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| CampaignError(format!("no free port: {e}")))
}

/// One `redis-server` process (a server or a Sentinel) started by this process.
#[derive(Debug)]
pub struct RedisProcess {
    /// Its port.
    pub port: u16,
    config: PathBuf,
    sentinel: bool,
    child: Option<Child>,
}

impl RedisProcess {
    /// Writes `config` (with `port`, `bind` and `dir` added) to `dir/NAME.conf` and starts it.
    fn start(dir: &Path, name: &str, config: &str, sentinel: bool) -> Result<Self, CampaignError> {
        let port = free_port()?;
        let data = dir.join(name);
        std::fs::create_dir_all(&data).map_err(|e| CampaignError(format!("{name}: {e}")))?;
        // Absolute: the server changes into `dir` before it opens its log.
        let data = data
            .canonicalize()
            .map_err(|e| CampaignError(format!("{name}: {e}")))?;
        let path = data.join("redis.conf");
        let full = format!(
            "bind 127.0.0.1\nport {port}\ndaemonize no\nlogfile \"{}\"\ndir {}\n{config}",
            data.join("log").display(),
            data.display()
        );
        std::fs::write(&path, full).map_err(|e| CampaignError(format!("{name}: {e}")))?;
        let mut process = RedisProcess {
            port,
            config: path,
            sentinel,
            child: None,
        };
        process.spawn()?;
        Ok(process)
    }

    fn spawn(&mut self) -> Result<(), CampaignError> {
        let mut command = Command::new("redis-server");
        command.arg(&self.config);
        if self.sentinel {
            command.arg("--sentinel");
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| CampaignError(format!("cannot start redis-server: {e}")))?;
        self.child = Some(child);
        self.wait_answering()
    }

    /// Runs `redis-cli -p PORT ARGS` and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    }

    fn wait_answering(&self) -> Result<(), CampaignError> {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if self.cli(&["ping"]) == "PONG" {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(CampaignError(format!(
            "redis-server on port {} did not answer within 10 s",
            self.port
        )))
    }

    /// Kills it (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again with its data and config.
    ///
    /// # Errors
    /// When it does not answer within 10 s.
    pub fn restart(&mut self) -> Result<(), CampaignError> {
        self.kill();
        self.spawn()
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis that appends every write to its log and fsyncs it before answering.
///
/// # Errors
/// When it cannot be started.
pub fn persistent_redis(dir: &Path) -> Result<RedisProcess, CampaignError> {
    RedisProcess::start(
        dir,
        "redis-aof",
        "save \"\"\nappendonly yes\nappendfsync always\n",
        false,
    )
}

/// A primary, a replica and three Sentinels, where the replica and the Sentinels reach the
/// primary only through [`SplitSentinel::proxy`]: blackholing it isolates the primary from
/// them while a client that talks to the primary's own port still reaches it.
#[derive(Debug)]
pub struct SplitSentinel {
    /// The primary.
    pub primary: RedisProcess,
    /// The replica, promoted when the primary is cut off.
    pub replica: RedisProcess,
    /// The Sentinels.
    pub sentinels: Vec<RedisProcess>,
    /// The proxy in front of the primary.
    pub proxy: FaultProxy,
}

/// The master name the split topology's Sentinels monitor.
pub const SPLIT_MASTER: &str = "lksplit";

impl SplitSentinel {
    /// Starts the topology and waits until the Sentinels know each other and the replica.
    ///
    /// # Errors
    /// When a server cannot be started or the topology does not settle within 30 s.
    pub async fn start(dir: &Path) -> Result<SplitSentinel, CampaignError> {
        let plain = "save \"\"\nappendonly no\nrepl-diskless-sync-delay 0\n";
        let primary = RedisProcess::start(dir, "primary", plain, false)?;
        let proxy = FaultProxy::start(&[format!("127.0.0.1:{}", primary.port)])
            .await
            .map_err(|e| CampaignError(format!("a fault proxy: {e}")))?;
        let via = proxy.hosts()[0].clone();
        let (host, port) = via.split_once(':').unwrap_or(("127.0.0.1", "0"));
        let replica = RedisProcess::start(
            dir,
            "replica",
            &format!("{plain}replicaof {host} {port}\n"),
            false,
        )?;
        let mut sentinels = Vec::new();
        for i in 1..=3 {
            sentinels.push(RedisProcess::start(
                dir,
                &format!("sentinel-{i}"),
                &format!(
                    "sentinel monitor {SPLIT_MASTER} {host} {port} 2\n\
                     sentinel down-after-milliseconds {SPLIT_MASTER} 1000\n\
                     sentinel failover-timeout {SPLIT_MASTER} 3000\n\
                     sentinel parallel-syncs {SPLIT_MASTER} 1\n"
                ),
                true,
            )?);
        }
        let topology = SplitSentinel {
            primary,
            replica,
            sentinels,
            proxy,
        };
        topology.wait_settled().await?;
        Ok(topology)
    }

    async fn wait_settled(&self) -> Result<(), CampaignError> {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            let settled = self.sentinels.iter().all(|s| {
                let master = s.cli(&["sentinel", "master", SPLIT_MASTER]);
                let field = |name: &str| {
                    let lines: Vec<&str> = master.lines().collect();
                    lines
                        .iter()
                        .position(|l| *l == name)
                        .and_then(|i| lines.get(i + 1).copied())
                        .unwrap_or_default()
                        .to_owned()
                };
                field("num-other-sentinels") == "2" && field("num-slaves") == "1"
            }) && self
                .replica
                .cli(&["info", "replication"])
                .contains("master_link_status:up");
            if settled {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(CampaignError(
            "the split Sentinel topology did not settle within 30 s".into(),
        ))
    }

    /// The Sentinel URL clients use.
    pub fn sentinel_url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{SPLIT_MASTER}", hosts.join(","))
    }

    /// The URL of the primary's own port (a client on the primary's side of the partition).
    pub fn primary_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.primary.port)
    }

    /// Waits until the Sentinels name the replica as the master.
    ///
    /// # Errors
    /// When they have not within `within`.
    pub async fn wait_promoted(&self, within: Duration) -> Result<(), CampaignError> {
        let started = Instant::now();
        let replica = self.replica.port.to_string();
        while started.elapsed() < within {
            let addr =
                self.sentinels[0].cli(&["sentinel", "get-master-addr-by-name", SPLIT_MASTER]);
            if addr.lines().nth(1) == Some(replica.as_str()) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(CampaignError(format!(
            "the Sentinels did not promote the replica within {within:?}"
        )))
    }
}
