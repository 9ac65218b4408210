//! TLS (`rediss://`, cargo feature `tls`) against a private Redis started with a CA and a
//! server certificate made at test time: the configured CA is trusted, plaintext and an
//! unknown CA are refused, all within the timeouts.
#![cfg(feature = "tls")]
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lockkit_core::testing::backend_missing;
use lockkit_core::{ErrorKind, LockClient};
use lockkit_redis::{RedisBackend, RedisConfig};

/// A fresh folder with test certificates, or `None` without openssl.
fn certificates() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("lk-redis-tls-{}", std::process::id()));
    lockkit_core::testing::tls_certificates(&dir).map(|()| dir)
}

/// A redis-server with only a TLS port, stopped (by its PID) when dropped.
struct TlsRedis {
    child: Child,
    port: u16,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(certs: &Path) -> TlsRedis {
    // This project's tests start private servers on 21200-21299 only.
    let port = (21280..21300)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port in 21280-21299");
    let child = Command::new("redis-server")
        .args([
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
        ])
        .arg("--tls-cert-file")
        .arg(certs.join("server.pem"))
        .arg("--tls-key-file")
        .arg(certs.join("server.key"))
        .arg("--tls-ca-cert-file")
        .arg(certs.join("ca.pem"))
        .args([
            "--tls-auth-clients",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(certs)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server");
    let server = TlsRedis { child, port };
    let by = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < by, "the TLS redis-server did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_trusts_the_configured_ca_and_refuses_plaintext_and_unknown_cas() {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        backend_missing("the redis-server command");
        return;
    }
    let Some(certs) = certificates() else {
        return;
    };
    let server = start(&certs);

    let mut config = RedisConfig::from_url(&format!("rediss://127.0.0.1:{}", server.port)).unwrap();
    assert!(config.tls);
    config.tls_ca_file = Some(certs.join("ca.pem"));
    config.connect_timeout = Duration::from_millis(500);
    config.response_timeout = Duration::from_millis(500);
    let locks = LockClient::new(
        RedisBackend::connect(config.clone())
            .await
            .expect("TLS with the CA"),
    );
    let guard = locks.mutex("tls").unwrap().lock().await.unwrap();
    assert!(
        locks
            .mutex("tls")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_none()
    );
    assert!(guard.release().await.unwrap());

    let mut unknown_ca = config.clone();
    unknown_ca.tls_ca_file = Some(certs.join("other.pem"));
    let started = Instant::now();
    let err = RedisBackend::connect(unknown_ca)
        .await
        .expect_err("a certificate from an unknown CA");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert_ne!(err.kind(), ErrorKind::Backend, "{err}");

    let mut plaintext = config.clone();
    plaintext.tls = false;
    plaintext.tls_ca_file = None;
    let started = Instant::now();
    let err = RedisBackend::connect(plaintext)
        .await
        .expect_err("plaintext to a TLS port");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );

    drop(server);
    let _ = std::fs::remove_dir_all(&certs);
}
