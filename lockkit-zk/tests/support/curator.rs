//! A Java service that locks with Curator 5's `InterProcessMutex` (or its
//! `InterProcessReadWriteLock`)
//! (`tests/interop/CuratorContender.java`), compiled with `javac` into the test's target
//! directory and run as its own process: the other side of the interop tests
//! (`tests/interop_curator.rs`, and the facade's `tests/interop.rs`, which includes this file).
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lockkit_core::testing::{backend_missing, endpoint};

const CURATOR_JAR: &str = "/usr/share/java/curator-recipes.jar";
/// Silences Curator's logging (slf4j warns on stderr without a binding).
const SLF4J_NOP: &str = "/usr/share/java/slf4j-nop.jar";

/// The Java source, from lockkit-zk's tests or from the workspace root's (the facade's).
fn source() -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    ["tests/interop", "lockkit-zk/tests/interop"]
        .iter()
        .map(|dir| root.join(dir).join("CuratorContender.java"))
        .find(|path| path.is_file())
        .expect("CuratorContender.java under tests/interop of lockkit-zk")
}

/// Curator's class path, when Java and Curator are installed; `None` after `backend_missing`.
pub fn curator_classpath() -> Option<String> {
    let jar = endpoint("LOCKKIT_TEST_CURATOR_JAR").unwrap_or_else(|| CURATOR_JAR.to_owned());
    let runs = |tool: &str| {
        Command::new(tool)
            .arg("-version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !(Path::new(&jar).is_file() && runs("java") && runs("javac")) {
        backend_missing(&format!(
            "Curator ({jar}, from libcurator-recipes-java) with java and javac (default-jdk-headless)"
        ));
        return None;
    }
    // The jar's manifest names the rest (curator-framework, curator-client, guava, zookeeper).
    let mut classpath = jar;
    if Path::new(SLF4J_NOP).is_file() {
        classpath = format!("{classpath}:{SLF4J_NOP}");
    }
    Some(classpath)
}

/// Compiles the Java contender into `classes`.
pub fn compile(classpath: &str, classes: &Path) {
    let source = source();
    std::fs::create_dir_all(classes).expect("the classes directory");
    let status = Command::new("javac")
        .args(["-d".as_ref(), classes.as_os_str()])
        .args(["-cp".as_ref(), classpath.as_ref(), source.as_os_str()])
        .status()
        .expect("run javac");
    assert!(
        status.success(),
        "javac {} failed: {status}",
        source.display()
    );
}

/// The Java process, killed (by its own PID) if the test ends before it does.
pub struct Curator {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Curator {
    /// Starts the contender and waits until it is connected.
    pub fn start(classpath: &str, classes: &Path, args: &[String]) -> Curator {
        let mut child = Command::new("java")
            .args([
                "-Xmx64m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-cp",
            ])
            .arg(format!("{classpath}:{}", classes.display()))
            .arg("CuratorContender")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start java");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("java's stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut curator = Curator {
            child,
            stdin,
            lines,
        };
        curator.expect_line("ready", Duration::from_secs(60));
        curator
    }

    fn expect_line(&mut self, want: &str, within: Duration) {
        match self.lines.recv_timeout(within) {
            Ok(line) if line == want => {}
            Ok(line) => panic!("the Curator contender said {line:?}, expected {want:?}"),
            Err(e) => panic!(
                "the Curator contender did not say {want:?} within {within:?} ({e}; exit: {:?})",
                self.child.try_wait()
            ),
        }
    }

    /// The next line the contender prints, within `within`.
    pub fn next_line(&mut self, within: Duration) -> String {
        self.lines.recv_timeout(within).unwrap_or_else(|e| {
            panic!(
                "the Curator contender said nothing within {within:?} ({e}; exit: {:?})",
                self.child.try_wait()
            )
        })
    }

    pub fn go(&mut self) {
        let mut stdin = self.stdin.take().expect("started once");
        stdin
            .write_all(b"go\n")
            .expect("start the Curator contender");
    }

    /// Waits for the contender to finish its sections and exit.
    pub async fn finish(mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("java's status") {
                assert!(status.success(), "the Curator contender failed: {status}");
                self.expect_line("done", Duration::from_secs(1));
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the Curator contender did not finish within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Curator {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
