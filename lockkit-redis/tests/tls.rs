//! TLS (`rediss://`, cargo feature `tls`) against a private Redis started with a CA and a
//! server certificate made at test time: the configured CA is trusted, plaintext and an
//! unknown CA are refused, all within the timeouts; with mutual TLS, the client certificate
//! is presented, and a client without one (or with a key that is not its) is refused.
#![cfg(feature = "tls")]
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lockkit_core::{ErrorKind, LockClient};
use lockkit_redis::{RedisBackend, RedisConfig};

/// A fresh folder with test certificates, or `None` without openssl.
fn certificates() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "lk-redis-tls-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
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

/// Whether the server asks clients for a certificate signed by its CA (mutual TLS).
#[derive(Clone, Copy)]
enum ClientAuth {
    No,
    Required,
}

fn start(certs: &Path, client_auth: ClientAuth) -> TlsRedis {
    // This project's tests start private servers on 21200-21299 only. The two tests here
    // run at once: each picks from its own range, so neither finds the other's port free
    // before that server binds it.
    let ports = match client_auth {
        ClientAuth::No => 21280..21290,
        ClientAuth::Required => 21290..21300,
    };
    let port = ports
        .clone()
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .unwrap_or_else(|| panic!("a free port in {ports:?}"));
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
            match client_auth {
                ClientAuth::No => "no",
                ClientAuth::Required => "yes",
            },
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
    if !common::private::redis_server_installed() {
        return;
    }
    let Some(certs) = certificates() else {
        return;
    };
    let server = start(&certs, ClientAuth::No);

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_presents_the_client_certificate() {
    if !common::private::redis_server_installed() {
        return;
    }
    let Some(certs) = certificates() else {
        return;
    };
    let server = start(&certs, ClientAuth::Required);

    let mut config = RedisConfig::from_url(&format!("rediss://127.0.0.1:{}", server.port)).unwrap();
    config.tls_ca_file = Some(certs.join("ca.pem"));
    config.connect_timeout = Duration::from_millis(500);
    config.response_timeout = Duration::from_millis(500);

    let mut with_identity = config.clone();
    with_identity.tls_cert_file = Some(certs.join("client.pem"));
    with_identity.tls_key_file = Some(certs.join("client.key"));
    let locks = LockClient::new(
        RedisBackend::connect(with_identity.clone())
            .await
            .expect("mutual TLS with the client certificate"),
    );
    let guard = locks.mutex("mtls").unwrap().lock().await.unwrap();
    assert!(guard.release().await.unwrap());

    // Without a certificate, and with a key that does not belong to it: refused, in time.
    let mut wrong_key = with_identity.clone();
    wrong_key.tls_key_file = Some(certs.join("other.key"));
    for (what, refused) in [
        ("no client certificate", config),
        ("a wrong key", wrong_key),
    ] {
        let started = Instant::now();
        let err = RedisBackend::connect(refused).await.expect_err(what);
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{what}: took {:?}",
            started.elapsed()
        );
        assert_ne!(err.kind(), ErrorKind::Backend, "{what}: {err}");
    }

    drop(server);
    let _ = std::fs::remove_dir_all(&certs);
}
