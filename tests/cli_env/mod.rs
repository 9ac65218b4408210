//! The `lockkit` binary as the end-to-end CLI tests drive it: one backend (by the variable
//! that names its test URL), a random namespace, a scratch directory.
#![allow(dead_code)] // each test file uses its own part

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use lockkit_core::testing::{backend_missing, endpoint};

/// Tests `$test(var)` on every server backend with the primitive a test file is about (the
/// single Redis, etcd, ZooKeeper and PostgreSQL), one test each, by the variable naming its
/// URL.
#[allow(unused_macros)] // not every test file that uses this module has per-server tests
macro_rules! on_every_server {
    ($test:ident) => {
        mod $test {
            #[test]
            fn redis() {
                super::$test("LOCKKIT_TEST_REDIS_URL");
            }

            #[test]
            fn etcd() {
                super::$test("LOCKKIT_TEST_ETCD_URL");
            }

            #[test]
            fn zookeeper() {
                super::$test("LOCKKIT_TEST_ZK_URL");
            }

            #[cfg(feature = "postgres")]
            #[test]
            fn postgres() {
                super::$test("LOCKKIT_TEST_POSTGRES_URL");
            }
        }
    };
}

/// Arguments of `env` that start a program with SIGINT and SIGQUIT at their defaults. A test
/// run started in the background by a non-interactive shell (`cargo test &` in a script)
/// inherits both ignored, and an ignored signal stays ignored across `exec`: the commands
/// `lockkit run` starts could not be interrupted, and the signal tests would test that
/// instead. (Resetting them in this process would take `unsafe`, which the workspace forbids.)
pub(crate) const DEFAULT_SIGNALS: &[&str] = &["--default-signal=INT,QUIT"];

/// A `lockkit` process of a test, killed (and its command with it) if the test ends first.
pub(crate) struct Process(pub(crate) Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Process {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Process {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

pub(crate) struct Env {
    pub(crate) url: String,
    pub(crate) namespace: String,
    pub(crate) dir: PathBuf,
}

impl Env {
    /// The backend whose URL is in `var` (`LOCKKIT_TEST_ETCD_URL`, ...), or `None` after
    /// [`backend_missing`] when it is not there.
    pub(crate) fn new(var: &str) -> Option<Env> {
        let Some(url) = endpoint(var) else {
            backend_missing(var);
            return None;
        };
        let namespace = format!("lk-cli-{:08x}", rand::random::<u32>());
        let dir = std::env::temp_dir().join(&namespace);
        std::fs::create_dir_all(&dir).unwrap();
        Some(Env {
            url,
            namespace,
            dir,
        })
    }

    /// The in-process memory backend: each `lockkit` process has its own, empty one.
    pub(crate) fn memory() -> Env {
        let namespace = format!("lk-cli-{:08x}", rand::random::<u32>());
        let dir = std::env::temp_dir().join(&namespace);
        std::fs::create_dir_all(&dir).unwrap();
        Env {
            url: "memory://".to_owned(),
            namespace,
            dir,
        }
    }

    /// The `lockkit` binary with the test's backend and namespace, started with SIGINT and
    /// SIGQUIT at their defaults (see [`DEFAULT_SIGNALS`]).
    pub(crate) fn lockkit(&self) -> Command {
        let mut command = Command::new("env");
        command
            .args(DEFAULT_SIGNALS)
            .arg(env!("CARGO_BIN_EXE_lockkit"))
            .env_remove("LOCKKIT_CONFIG")
            .env_remove("RUST_LOG")
            .env("LOCKKIT_URL", &self.url)
            .env("LOCKKIT_NAMESPACE", &self.namespace);
        command
    }

    pub(crate) fn run(&self, args: &[&str]) -> Output {
        self.lockkit().args(args).output().unwrap()
    }

    pub(crate) fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub(crate) fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.file(name)).unwrap_or_default()
    }

    /// `lockkit --json status KEY`, parsed.
    pub(crate) fn status(&self, key: &str) -> serde_json::Value {
        let out = self.run(&["--json", "status", key]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Waits until the file `name` exists.
    pub(crate) fn wait_file(&self, name: &str) {
        let by = Instant::now() + Duration::from_secs(15);
        while !self.file(name).exists() {
            assert!(Instant::now() < by, "{name} never appeared");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until `check` holds for the status of `key`.
    pub(crate) fn wait_status(
        &self,
        key: &str,
        what: &str,
        check: impl Fn(&serde_json::Value) -> bool,
    ) {
        let by = Instant::now() + Duration::from_secs(15);
        loop {
            let status = self.status(key);
            if check(&status) {
                return;
            }
            assert!(Instant::now() < by, "{key} never {what}: {status}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts `lockkit run [extra] KEY -- sh -c SCRIPT` in the background with a command that
    /// runs `setup` (its traps) and then says it is ready, and waits until the command is
    /// ready and holds `key`.
    pub(crate) fn spawn_holder(&self, key: &str, extra: &[&str], setup: &str) -> Child {
        let ready = self.file(&format!("ready-{key}"));
        let script = format!("{setup} touch {}; sleep 30 & wait", ready.display());
        let mut args = vec!["run"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[key, "--", "sh", "-c", &script]);
        let child = self
            .lockkit()
            .args(&args)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let by = Instant::now() + Duration::from_secs(15);
        while !ready.exists() || self.status(key)["held"] != true {
            assert!(Instant::now() < by, "lockkit run never took {key}");
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends `signal` to the process `pid` (one this test started).
pub(crate) fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).unwrap();
}

/// Waits for `child` to exit and returns its code (-1 when a signal killed it).
pub(crate) fn wait_exit(child: &mut Child, within: Duration) -> i32 {
    let by = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        assert!(
            Instant::now() < by,
            "lockkit did not exit within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the process `pid` is gone (or a zombie nobody reaped yet: it runs no more).
pub(crate) fn is_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name in parentheses: "123 (sleep) Z ...".
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}
