//! A one-member etcd of this test process, for tests that reconfigure, secure or restart a
//! server: never the shared compose cluster. On 127.0.0.1, on ports the caller names; stopped
//! by its PID, and its data removed, when dropped (also when the test panics).

use std::ffi::OsString;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lockkit_core::testing;
use lockkit_etcd::{EtcdBackend, EtcdConfig};
use nix::sys::signal::Signal;

/// How long a stopped member may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(10);
/// How long a (re)started member may take to answer.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// A one-member etcd started by this test.
pub struct PrivateEtcd {
    child: Option<Child>,
    dir: PathBuf,
    args: Vec<OsString>,
    /// The port clients connect to (the peer port is the next one).
    pub client_port: u16,
}

impl PrivateEtcd {
    /// Starts etcd with two free ports from `ports`, serving plain HTTP or, with `tls`, the
    /// certificate pair in `tls`. `None` (after `backend_missing`) without an etcd binary.
    pub fn start(
        name: &str,
        ports: std::ops::Range<u16>,
        tls: Option<(&Path, &Path)>,
    ) -> Option<Self> {
        if Command::new("etcd").arg("--version").output().is_err() {
            testing::backend_missing("the etcd binary (apt-get install etcd-server)");
            return None;
        }
        let (client_port, peer_port) = ports
            .step_by(2)
            .find(|p| {
                TcpListener::bind(("127.0.0.1", *p)).is_ok()
                    && TcpListener::bind(("127.0.0.1", p + 1)).is_ok()
            })
            .map(|p| (p, p + 1))
            .expect("two free ports");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{client_port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("data dir");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut args: Vec<OsString> = [
            "--name",
            name,
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &format!("{name}={peer_url}"),
        ]
        .iter()
        .map(OsString::from)
        .collect();
        args.extend(["--data-dir".into(), dir.join("data").into_os_string()]);
        if let Some((cert, key)) = tls {
            args.extend([
                "--cert-file".into(),
                cert.as_os_str().to_owned(),
                "--key-file".into(),
                key.as_os_str().to_owned(),
            ]);
        }
        let mut etcd = PrivateEtcd {
            child: None,
            dir,
            args,
            client_port,
        };
        etcd.launch();
        Some(etcd)
    }

    /// A configuration of this member with short timeouts.
    pub fn config(&self) -> EtcdConfig {
        let mut config =
            EtcdConfig::from_url(&format!("etcd://127.0.0.1:{}", self.client_port)).expect("url");
        config.request_timeout = Duration::from_secs(2);
        config.connect_timeout = Duration::from_secs(1);
        config
    }

    /// Waits until `config` connects (etcd takes a moment to elect itself).
    pub async fn ready(&self, config: &EtcdConfig) -> EtcdBackend {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            match EtcdBackend::connect(config.clone()).await {
                Ok(backend) => return backend,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("the private etcd did not come up: {e}; log: {}", self.log()),
            }
        }
    }

    /// Stops the member with `signal` (by its PID; SIGKILL after a grace period) and starts
    /// it again on the same data dir and ports once `down` has passed; returns when it
    /// answers. Its data, the leases among it, survive: etcd syncs every commit to disk.
    pub async fn restart(&mut self, signal: Signal, down: Duration) {
        tokio::task::block_in_place(|| self.stop(signal));
        tokio::time::sleep(down).await;
        self.launch();
        self.ready(&self.config()).await;
    }

    /// Sends `signal` to the member (by its PID) and waits for it to exit, killing it if it
    /// has not after a grace period.
    pub fn stop(&mut self, signal: Signal) {
        if let Some(child) = self.child.take() {
            lockkit_core::testing::stop_child(child, signal, EXIT_GRACE);
        }
    }

    /// What the member logged, over all its runs.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
    }

    fn launch(&mut self) {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .expect("log");
        let child = Command::new("etcd")
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
    }
}

impl Drop for PrivateEtcd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
