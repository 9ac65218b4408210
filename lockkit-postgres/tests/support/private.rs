//! A private PostgreSQL server for tests that must not touch the shared one (TLS settings, a
//! restart): made with `initdb` in a folder of its own, started on a free port of a range the
//! test names, stopped and removed on drop, also when the test panics. As root, the folder
//! goes to the user `postgres` and the server runs as that user (it refuses root).

use std::path::{Path, PathBuf};
use std::process::Command;

use lockkit_core::testing;

const BIN: &str = "/usr/lib/postgresql/15/bin";

/// The superuser's password over TCP.
pub const PASSWORD: &str = "lockkit-private";

pub struct PrivatePostgres {
    pub dir: PathBuf,
    pub port: u16,
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
}

fn as_server_user(program: &str) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--", &format!("{BIN}/{program}")]);
        command
    } else {
        Command::new(format!("{BIN}/{program}"))
    }
}

fn run(mut command: Command, what: &str) {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A port of `ports` that nothing listens on now.
pub fn free_port(ports: std::ops::Range<u16>) -> u16 {
    let start = ports.start + (std::process::id() % u32::from(ports.end - ports.start)) as u16;
    (start..ports.end)
        .chain(ports.start..start)
        .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .expect("a free port")
}

impl PrivatePostgres {
    /// Makes and starts a server in a fresh folder named `name`, with `settings` (lines of
    /// `postgresql.conf`) and `hba` (the lines of `pg_hba.conf` for TCP; its socket trusts
    /// everyone), or returns `None` (after `backend_missing`) without PostgreSQL. `files` are
    /// copied into the data folder first (certificates, keys), readable by the server alone.
    pub fn start(
        name: &str,
        ports: std::ops::Range<u16>,
        settings: &str,
        hba: &str,
        files: &[&Path],
    ) -> Option<PrivatePostgres> {
        if !Path::new(BIN).join("postgres").exists() {
            testing::backend_missing("PostgreSQL's binaries (/usr/lib/postgresql/15/bin)");
            return None;
        }
        let port = free_port(ports);
        let dir = PathBuf::from("/tmp").join(format!("lk-pg-{name}-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a folder");
        let root = is_root();
        if root {
            run(
                {
                    let mut c = Command::new("chown");
                    c.args(["postgres:postgres"]).arg(&dir);
                    c
                },
                "chown",
            );
        }
        std::fs::write(dir.join("pwfile"), format!("{PASSWORD}\n")).expect("pwfile");
        let data = dir.join("data");
        let mut initdb = as_server_user("initdb");
        initdb
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "--auth-host=scram-sha-256",
                "--auth-local=trust",
            ])
            .arg(format!("--pwfile={}", dir.join("pwfile").display()))
            .args(["-E", "UTF8", "--no-locale", "--no-instructions"]);
        run(initdb, "initdb");
        for file in files {
            let target = data.join(file.file_name().expect("a file name"));
            std::fs::copy(file, &target).expect("copy a file");
            run(
                {
                    let mut c = Command::new("chmod");
                    c.arg("600").arg(&target);
                    c
                },
                "chmod",
            );
            if root {
                run(
                    {
                        let mut c = Command::new("chown");
                        c.arg("postgres:postgres").arg(&target);
                        c
                    },
                    "chown",
                );
            }
        }
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).expect("postgresql.conf");
        text.push_str(settings);
        std::fs::write(&conf, text).expect("postgresql.conf");
        std::fs::write(
            data.join("pg_hba.conf"),
            format!("local all all trust\n{hba}\n"),
        )
        .expect("pg_hba.conf");
        let server = PrivatePostgres { dir, port };
        server.pg_ctl_start();
        let mut createdb = as_server_user("createdb");
        createdb.args(["-h"]).arg(&server.dir).args([
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
            "lockkit",
        ]);
        run(createdb, "createdb");
        Some(server)
    }

    fn pg_ctl_start(&self) {
        let mut start = as_server_user("pg_ctl");
        start
            .arg("-D")
            .arg(self.dir.join("data"))
            .arg("-o")
            .arg(format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1",
                self.port,
                self.dir.display()
            ))
            .arg("-l")
            .arg(self.dir.join("log"))
            .args(["-w", "start"]);
        run(start, "pg_ctl start");
    }

    /// Stops the server with `mode` (`fast`, `immediate`: a crash) and starts it again.
    pub fn restart(&self, mode: &str) {
        self.stop(mode);
        self.pg_ctl_start();
    }

    fn stop(&self, mode: &str) {
        let mut stop = as_server_user("pg_ctl");
        stop.arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", mode, "-w", "stop"]);
        let _ = stop.output();
    }

    /// The URL of the database `lockkit` as the superuser.
    pub fn url(&self, query: &str) -> String {
        format!(
            "postgres://postgres:{PASSWORD}@127.0.0.1:{}/lockkit{query}",
            self.port
        )
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.stop("immediate");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
