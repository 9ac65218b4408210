//! A ZooKeeper server process of this test, for tests that secure, slow down or restart a
//! server: never the shared compose ensemble. On 127.0.0.1, on ports the caller names;
//! stopped by its PID when dropped (also when the test panics).
#![allow(dead_code, unreachable_pub)] // each test file uses a part

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lockkit_core::testing::backend_missing;
use nix::sys::signal::Signal;

const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// Debian's zookeeper.jar lists its other jars in its manifest, all but a logging binding.
pub const CLASSPATH: &str = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar";
/// A standalone server.
pub const STANDALONE: &str = "org.apache.zookeeper.server.ZooKeeperServerMain";
/// A member of an ensemble.
pub const QUORUM_PEER: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
/// How long a stopped server may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(10);

/// Whether Java and ZooKeeper are installed; `false` after `backend_missing`.
pub fn installed() -> bool {
    let installed = Path::new(ZOOKEEPER_JAR).is_file()
        && Command::new("java")
            .arg("-version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !installed {
        backend_missing("ZooKeeper (java and /usr/share/java/zookeeper.jar)");
    }
    installed
}

/// The first port of `ports` that is free on 127.0.0.1.
pub fn free_port(ports: std::ops::Range<u16>) -> u16 {
    ports
        .clone()
        .find(|p| TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .unwrap_or_else(|| panic!("no free port in {ports:?}"))
}

/// One ZooKeeper JVM: `zoo.cfg`, its data and its log (`zk.log`, over all its runs) in `dir`.
pub struct ZkServer {
    child: Option<Child>,
    dir: PathBuf,
    main_class: &'static str,
    classpath: String,
    jvm_flags: Vec<String>,
}

impl ZkServer {
    /// Writes `config` as `dir/zoo.cfg` and starts `main_class` on it, with a small heap.
    /// Does not wait for it to serve.
    pub fn start(dir: &Path, config: &str, main_class: &'static str, classpath: &str) -> Self {
        ZkServer::start_with(dir, config, main_class, classpath, &[])
    }

    /// As [`ZkServer::start`], with extra JVM flags (system properties that zoo.cfg cannot
    /// set, such as `-Dznode.container.checkIntervalMs=200`).
    pub fn start_with(
        dir: &Path,
        config: &str,
        main_class: &'static str,
        classpath: &str,
        jvm_flags: &[&str],
    ) -> Self {
        std::fs::create_dir_all(dir).expect("server dir");
        std::fs::write(dir.join("zoo.cfg"), config).expect("zoo.cfg");
        let mut server = ZkServer {
            child: None,
            dir: dir.to_owned(),
            main_class,
            classpath: classpath.to_owned(),
            jvm_flags: jvm_flags.iter().map(|f| (*f).to_owned()).collect(),
        };
        server.launch();
        server
    }

    /// A standalone server on a free port of `ports` (plain client port, data in
    /// `dir/data`, the settings of the compose servers), serving once this returns.
    pub fn standalone(dir: &Path, ports: std::ops::Range<u16>) -> (ZkServer, u16) {
        ZkServer::standalone_with(dir, ports, &[])
    }

    /// As [`ZkServer::standalone`], with extra JVM flags.
    pub fn standalone_with(
        dir: &Path,
        ports: std::ops::Range<u16>,
        jvm_flags: &[&str],
    ) -> (ZkServer, u16) {
        let port = free_port(ports);
        let config = format!(
            "tickTime=500\n\
             minSessionTimeout=1000\n\
             maxSessionTimeout=60000\n\
             dataDir={data}\n\
             clientPortAddress=127.0.0.1\n\
             clientPort={port}\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=srvr,wchs\n\
             forceSync=no\n",
            data = dir.join("data").display(),
        );
        let mut server = ZkServer::start_with(dir, &config, STANDALONE, CLASSPATH, jvm_flags);
        server.serving(port);
        (server, port)
    }

    /// Waits (up to 30 s) until the server on `port` serves (`srvr` shows its mode).
    pub fn serving(&mut self, port: u16) {
        let by = Instant::now() + Duration::from_secs(30);
        while !srvr(port).contains("Mode: ") {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("ZooKeeper exited ({status}): {}", self.log());
            }
            assert!(
                Instant::now() < by,
                "ZooKeeper did not serve on {port} within 30 s: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the process has been started and has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends `signal` to the server (by its PID) and waits for it to exit, killing it if it
    /// has not after a grace period.
    pub fn stop(&mut self, signal: Signal) {
        if let Some(child) = self.child.take() {
            lockkit_core::testing::stop_child(child, signal, EXIT_GRACE);
        }
    }

    /// Starts the stopped server again, on the same configuration and data.
    pub fn launch(&mut self) {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("zk.log"))
            .expect("log");
        let child = Command::new("java")
            .args([
                "-Xms32m",
                "-Xmx128m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-XX:-UsePerfData",
                "-Djava.net.preferIPv4Stack=true",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            ])
            .args(&self.jvm_flags)
            .args(["-cp", &self.classpath, self.main_class])
            .arg(self.dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start java");
        self.child = Some(child);
    }

    /// What the server logged, over all its runs.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("zk.log")).unwrap_or_default()
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The `srvr` four-letter word's answer, or "" when the server does not answer.
pub fn srvr(port: u16) -> String {
    four_letter_word(&format!("127.0.0.1:{port}"), "srvr")
}

/// A four-letter word's answer from the server at `addr` (`host:port`), or "" when it does
/// not answer.
pub fn four_letter_word(addr: &str, word: &str) -> String {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.write_all(word.as_bytes());
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}
