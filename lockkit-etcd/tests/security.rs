//! Authentication and TLS, each against a one-member etcd this test starts on a free port in
//! 20900-20999 and stops by its PID, so the shared compose cluster keeps running without
//! authentication.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lockkit_core::{ErrorKind, LockClient, testing};
use lockkit_etcd::{EtcdBackend, EtcdConfig};

/// A one-member etcd started by this test; killed (by PID) and its data removed on drop.
struct PrivateEtcd {
    child: Child,
    dir: PathBuf,
    client_port: u16,
}

impl PrivateEtcd {
    /// Starts etcd with two free ports from `ports`, serving plain HTTP or, with `tls`, the
    /// certificate pair in `tls`. `None` (after `backend_missing`) without an etcd binary.
    fn start(name: &str, ports: std::ops::Range<u16>, tls: Option<(&Path, &Path)>) -> Option<Self> {
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
        let mut command = Command::new("etcd");
        command
            .args(["--name", name, "--data-dir"])
            .arg(dir.join("data"))
            .args([
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args(["--initial-cluster", &format!("{name}={peer_url}")])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("etcd.log")).expect("log"))
            .stderr(Stdio::from(
                std::fs::File::options()
                    .append(true)
                    .open(dir.join("etcd.log"))
                    .expect("log"),
            ));
        if let Some((cert, key)) = tls {
            command
                .arg("--cert-file")
                .arg(cert)
                .arg("--key-file")
                .arg(key);
        }
        let child = command.spawn().expect("start etcd");
        Some(PrivateEtcd {
            child,
            dir,
            client_port,
        })
    }

    fn config(&self) -> EtcdConfig {
        let mut config =
            EtcdConfig::from_url(&format!("etcd://127.0.0.1:{}", self.client_port)).expect("url");
        config.request_timeout = Duration::from_secs(2);
        config.connect_timeout = Duration::from_secs(1);
        config
    }

    /// Waits until `config` connects (etcd takes a moment to elect itself).
    async fn ready(&self, config: &EtcdConfig) -> EtcdBackend {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match EtcdBackend::connect(config.clone()).await {
                Ok(backend) => return backend,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!(
                    "the private etcd did not come up: {e}; log: {}",
                    std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
                ),
            }
        }
    }
}

impl Drop for PrivateEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn lock_and_release(backend: EtcdBackend) {
    let locks = LockClient::new(backend);
    let guard = locks
        .mutex("secured")
        .expect("key")
        .lock()
        .await
        .expect("lock");
    assert!(guard.release().await.expect("release"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_an_auth_error_and_the_right_one_locks() {
    let Some(etcd) = PrivateEtcd::start("lk-auth", 20900..20950, None) else {
        return;
    };
    let open = etcd.config();
    let mut admin = etcd.ready(&open).await.client();
    admin
        .user_add("root", "right-password", None)
        .await
        .expect("add root");
    admin
        .user_grant_role("root", "root")
        .await
        .expect("grant root");
    admin.auth_enable().await.expect("enable auth");

    let mut wrong = open.clone();
    wrong.user = Some("root".into());
    wrong.password = Some("wrong-password".into());
    let err = EtcdBackend::connect(wrong)
        .await
        .expect_err("a wrong password connects");
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert!(!err.is_retryable());
    assert!(
        !format!("{err} {err:?}").contains("wrong-password"),
        "{err:?}"
    );

    let err = EtcdBackend::connect(open.clone())
        .await
        .expect_err("no credentials on a cluster with authentication");
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");

    let mut right = open;
    right.user = Some("root".into());
    right.password = Some("right-password".into());
    lock_and_release(
        EtcdBackend::connect(right)
            .await
            .expect("the right password connects"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connects_with_the_configured_ca_and_plaintext_is_refused() {
    let certs = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("lk-tls-certs-{}", std::process::id()));
    if testing::tls_certificates(&certs).is_none() {
        return;
    }
    let Some(etcd) = PrivateEtcd::start(
        "lk-tls",
        20950..21000,
        Some((&certs.join("server.pem"), &certs.join("server.key"))),
    ) else {
        return;
    };
    let mut tls = etcd.config();
    tls.tls = true;
    tls.ca_file = Some(certs.join("ca.pem"));
    lock_and_release(etcd.ready(&tls).await).await;

    let err = EtcdBackend::connect(etcd.config())
        .await
        .expect_err("plaintext to a TLS member connects");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    let mut missing = tls.clone();
    missing.ca_file = Some(certs.join("no-such-ca.pem"));
    let err = EtcdBackend::connect(missing)
        .await
        .expect_err("a missing CA file connects");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    drop(etcd);
    let _ = std::fs::remove_dir_all(&certs);
}
