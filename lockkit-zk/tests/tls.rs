//! TLS (`zks://`, cargo feature `tls`) against a private standalone ZooKeeper that has only a
//! `secureClientPort`, with a CA and a server certificate made at test time. It listens on a
//! free port in 21100-21199 and is stopped by its PID. ZooKeeper's default
//! `ssl.clientAuth=need` is kept, so a client also needs a certificate from the CA.
//! The configured CA and a client certificate give working locks, also on the new session
//! that replaces an expired one; an unknown CA, a missing
//! client certificate and a plaintext client are refused with `Unavailable` within the
//! connect timeout; bad files are `InvalidConfig` before any connection is tried.
#![cfg(feature = "tls")]

#[allow(dead_code)] // the helpers the other test files need too
mod support;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::backend::url::ConnectionUrl;
use lockkit_core::{ErrorKind, LockClient, LockOptions, testing};
use lockkit_zk::{ZkBackend, ZkConfig};
use nix::sys::signal::Signal;
use support::server::{self, ZkServer};

/// The secure port needs the Netty server, whose TLS handler lives in netty-codec. Debian's
/// zookeeper.jar manifest does not list that jar, so it is added here (it comes with the
/// zookeeper package, through libnetty-java).
const TLS_CLASSPATH: &str = "/usr/share/java/netty-codec.jar";
/// This test's port range (the compose topologies use 20000-20300).
const PORTS: std::ops::Range<u16> = 21100..21200;
/// How long a refused connection may take to fail: it must not wait for anything.
const REFUSAL_BOUND: Duration = Duration::from_secs(5);

/// A fresh folder of certificates, or `None` (after `backend_missing`) without openssl.
fn certificates(name: &str) -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("lk-zk-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    testing::tls_certificates(&dir).map(|()| dir)
}

/// A standalone ZooKeeper with only a TLS port; killed by its PID and its folder removed on
/// drop, also when the test panics.
struct TlsZooKeeper {
    server: ZkServer,
    dir: PathBuf,
    port: u16,
}

impl TlsZooKeeper {
    /// Starts it with the certificates in `certs`, or returns `None` (after
    /// `backend_missing`) when Java or ZooKeeper is not installed.
    fn start(certs: &Path) -> Option<Self> {
        if !server::installed() {
            return None;
        }
        let port = server::free_port(PORTS);
        let dir = certs.join(format!("zk-{port}"));
        std::fs::create_dir_all(dir.join("data")).expect("data dir");
        // A PEM key store holds the private key and the certificate in one file.
        let key_store = [
            std::fs::read_to_string(certs.join("server.key")).expect("server.key"),
            std::fs::read_to_string(certs.join("server.pem")).expect("server.pem"),
        ]
        .concat();
        std::fs::write(dir.join("keystore.pem"), key_store).expect("key store");
        let config = format!(
            "tickTime=500\n\
             minSessionTimeout=1000\n\
             maxSessionTimeout=60000\n\
             dataDir={data}\n\
             secureClientPortAddress=127.0.0.1\n\
             secureClientPort={port}\n\
             serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
             ssl.keyStore.location={key_store}\n\
             ssl.keyStore.type=PEM\n\
             ssl.trustStore.location={ca}\n\
             ssl.trustStore.type=PEM\n\
             admin.enableServer=false\n\
             forceSync=no\n",
            data = dir.join("data").display(),
            key_store = dir.join("keystore.pem").display(),
            ca = certs.join("ca.pem").display(),
        );
        let classpath = format!("{}:{TLS_CLASSPATH}", server::CLASSPATH);
        let server = ZkServer::start(&dir, &config, server::STANDALONE, &classpath);
        let mut zk = TlsZooKeeper { server, dir, port };
        // No `srvr` over a TLS-only port: a listening port is the sign of life.
        let by = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(zk.server.is_running(), "ZooKeeper exited: {}", zk.log());
            assert!(
                Instant::now() < by,
                "ZooKeeper did not listen within 30 s: {}",
                zk.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(zk)
    }

    fn log(&self) -> String {
        self.server.log()
    }

    /// `zks://` to this server, trusting `ca.pem` and presenting `server.pem` as the client
    /// certificate (the test CA signed it without usage restrictions).
    fn config(&self, certs: &Path) -> ZkConfig {
        let mut config = ZkConfig::default();
        config.ca_file = Some(certs.join("ca.pem"));
        config.cert_file = Some(certs.join("server.pem"));
        config.key_file = Some(certs.join("server.key"));
        config
            .apply_url(
                &ConnectionUrl::parse(&format!("zks://127.0.0.1:{}/lockkit-tls", self.port))
                    .expect("url"),
            )
            .expect("valid TLS configuration");
        config.session_timeout = Duration::from_secs(4);
        config.connect_timeout = Duration::from_secs(3);
        config.request_timeout = Duration::from_secs(2);
        config
    }

    /// The first backend: the server may accept connections a moment before it serves.
    async fn ready(&self, config: &ZkConfig) -> ZkBackend {
        let by = Instant::now() + Duration::from_secs(30);
        loop {
            match ZkBackend::connect(config.clone()).await {
                Ok(backend) => return backend,
                Err(e) if Instant::now() < by => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("no TLS session within 30 s: {e}; log: {}", self.log()),
            }
        }
    }
}

impl Drop for TlsZooKeeper {
    fn drop(&mut self) {
        self.server.stop(Signal::SIGKILL);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Connecting with `config` fails with `Unavailable`, well within the bound.
async fn refused(config: ZkConfig, what: &str) {
    let started = Instant::now();
    let err = ZkBackend::connect(config)
        .await
        .err()
        .unwrap_or_else(|| panic!("{what} connected"));
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{what}: {err}");
    assert!(
        started.elapsed() < REFUSAL_BOUND,
        "{what}: refused only after {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_the_ca_and_a_client_certificate_locks_and_everything_else_is_refused() {
    let Some(certs) = certificates("tls") else {
        return;
    };
    let Some(server) = TlsZooKeeper::start(&certs) else {
        let _ = std::fs::remove_dir_all(&certs);
        return;
    };
    let config = server.config(&certs);
    assert!(config.tls);

    let holder = LockClient::new(server.ready(&config).await);
    let waiter = LockClient::new(
        ZkBackend::connect(config.clone())
            .await
            .expect("a second TLS session"),
    );
    let first = holder
        .mutex("tls")
        .expect("key")
        .lock()
        .await
        .expect("lock over TLS");
    assert!(
        waiter
            .mutex("tls")
            .expect("key")
            .try_lock()
            .await
            .expect("try_lock over TLS")
            .is_none(),
        "a held lock is free for another session"
    );
    let queued = tokio::spawn(async move {
        waiter
            .mutex("tls")
            .expect("key")
            .lock_timeout(Duration::from_secs(10))
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first_token = first.fencing_token();
    assert!(first.release().await.expect("release over TLS"));
    let second = tokio::time::timeout(Duration::from_secs(15), queued)
        .await
        .expect("the waiter hangs")
        .expect("waiter task")
        .expect("the waiter is granted after the release");
    assert!(
        second.fencing_token() > first_token,
        "{:?} after {first_token:?}",
        second.fencing_token()
    );
    assert!(second.release().await.expect("release over TLS"));

    // An expired session is replaced by a new one, over TLS again.
    let backend = Arc::new(
        ZkBackend::connect(config.clone())
            .await
            .expect("TLS session"),
    );
    let locks = LockClient::with_options(backend.clone(), "expiry", LockOptions::default())
        .expect("client");
    let held = locks.mutex("tls").expect("key").lock().await.expect("lock");
    backend
        .expire_session()
        .await
        .expect("expire the session over TLS");
    tokio::time::timeout(Duration::from_secs(10), held.lost())
        .await
        .expect("lost fires after the session expired");
    drop(held);
    let again = locks
        .mutex("tls")
        .expect("key")
        .lock_timeout(Duration::from_secs(15))
        .await
        .expect("a lock on the new TLS session");
    assert!(again.release().await.expect("release"));
    drop(locks);

    let mut unknown_ca = config.clone();
    unknown_ca.ca_file = Some(certs.join("other.pem"));
    refused(unknown_ca, "a server certificate from an unknown CA").await;

    let mut no_client_certificate = config.clone();
    no_client_certificate.cert_file = None;
    no_client_certificate.key_file = None;
    refused(
        no_client_certificate,
        "a client without a certificate (ssl.clientAuth=need)",
    )
    .await;

    let mut plaintext = config.clone();
    plaintext.tls = false;
    plaintext.ca_file = None;
    plaintext.cert_file = None;
    plaintext.key_file = None;
    refused(plaintext, "plaintext to the secure port").await;

    drop(server);
    let _ = std::fs::remove_dir_all(&certs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_malformed_or_mismatched_tls_files_are_invalid_config() {
    let Some(certs) = certificates("files") else {
        return;
    };
    let mut good = ZkConfig::default();
    good.ca_file = Some(certs.join("ca.pem"));
    good.cert_file = Some(certs.join("server.pem"));
    good.key_file = Some(certs.join("server.key"));
    // Nothing listens there: every case must fail before connecting.
    good.apply_url(&ConnectionUrl::parse("zks://127.0.0.1:21199").expect("url"))
        .expect("valid");
    good.connect_timeout = Duration::from_secs(30);
    /// Makes one file of a valid configuration unusable.
    type Break = fn(&mut ZkConfig, &Path);
    let cases: [(&str, Break, &str); 4] = [
        (
            "a missing CA file",
            |c, d| c.ca_file = Some(d.join("no-such-ca.pem")),
            "no-such-ca.pem",
        ),
        (
            "a CA file without certificates",
            |c, d| c.ca_file = Some(d.join("san.ext")),
            "san.ext",
        ),
        (
            "a key that is not the certificate's",
            |c, d| c.key_file = Some(d.join("other.key")),
            "does not fit",
        ),
        (
            "a key file without a key",
            |c, d| c.key_file = Some(d.join("server.pem")),
            "server.pem",
        ),
    ];
    for (what, break_it, needle) in cases {
        let mut config = good.clone();
        break_it(&mut config, &certs);
        let started = Instant::now();
        let err = ZkBackend::connect(config)
            .await
            .err()
            .unwrap_or_else(|| panic!("{what} connected"));
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{what}: {err}");
        assert!(
            err.message().contains(needle),
            "{what}: {err} lacks {needle:?}"
        );
        assert!(
            started.elapsed() < REFUSAL_BOUND,
            "{what}: took {:?}",
            started.elapsed()
        );
    }
    let _ = std::fs::remove_dir_all(&certs);
}
