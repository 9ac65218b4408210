//! Authentication, RBAC, TLS and secrets, each against a one-member etcd the test starts on
//! free ports in 21200-21299 and stops by its PID, so the shared compose cluster keeps running
//! without authentication.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::testing::{
    TraceCapture, assert_nothing_shown, exercise, owner_token_spellings, secret_spellings,
};
use lockkit_core::{ErrorKind, LockClient, LockOptions, testing};
use lockkit_etcd::EtcdBackend;
use lockkit_etcd::etcd_client::{self, ConnectOptions, GetOptions, Permission};
use support::private::PrivateEtcd;

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
    let Some(etcd) = PrivateEtcd::start("lk-auth", 21200..21220, None) else {
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
        21220..21240,
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

    let mut unknown_ca = tls.clone();
    unknown_ca.ca_file = Some(certs.join("other.pem"));
    let started = Instant::now();
    let err = EtcdBackend::connect(unknown_ca)
        .await
        .expect_err("a member certificate from an unknown CA connects");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    let mut missing = tls.clone();
    missing.ca_file = Some(certs.join("no-such-ca.pem"));
    let err = EtcdBackend::connect(missing)
        .await
        .expect_err("a missing CA file connects");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    drop(etcd);
    let _ = std::fs::remove_dir_all(&certs);
}

/// A private etcd with authentication on: `root`, a user `locker` whose role may read and
/// write `locks-a/` (with the slash) and nothing else, and a user `intruder` whose role covers
/// `other-b/` only. Passwords are random.
struct RbacEtcd {
    etcd: PrivateEtcd,
    root_password: String,
    locker_password: String,
    intruder_password: String,
}

const LOCK_PREFIX: &str = "locks-a";
const OTHER_PREFIX: &str = "other-b";

impl RbacEtcd {
    async fn start(name: &str, ports: std::ops::Range<u16>) -> Option<RbacEtcd> {
        let etcd = PrivateEtcd::start(name, ports, None)?;
        let secret = || format!("pw-{:032x}", rand::random::<u128>());
        let rbac = RbacEtcd {
            root_password: secret(),
            locker_password: secret(),
            intruder_password: secret(),
            etcd,
        };
        let mut admin = rbac.etcd.ready(&rbac.etcd.config()).await.client();
        admin
            .user_add("root", rbac.root_password.as_str(), None)
            .await
            .unwrap();
        admin.user_grant_role("root", "root").await.unwrap();
        for (user, password, role, prefix) in [
            ("locker", &rbac.locker_password, "lk-locks", LOCK_PREFIX),
            (
                "intruder",
                &rbac.intruder_password,
                "lk-other",
                OTHER_PREFIX,
            ),
        ] {
            admin.role_add(role).await.unwrap();
            admin
                .role_grant_permission(
                    role,
                    Permission::read_write(format!("{prefix}/")).with_prefix(),
                )
                .await
                .unwrap();
            admin.user_add(user, password.as_str(), None).await.unwrap();
            admin.user_grant_role(user, role).await.unwrap();
        }
        admin.auth_enable().await.unwrap();
        Some(rbac)
    }

    /// lockkit's configuration as `user` with `prefix`.
    fn config(&self, user: &str, password: &str, prefix: &str) -> lockkit_etcd::EtcdConfig {
        let mut config = self.etcd.config();
        config.user = Some(user.into());
        config.password = Some(password.into());
        config.prefix = prefix.into();
        config
    }

    fn locker(&self) -> lockkit_etcd::EtcdConfig {
        self.config("locker", &self.locker_password, LOCK_PREFIX)
    }

    /// A raw etcd client logged in as `user`.
    async fn raw(&self, user: &str, password: &str) -> etcd_client::Client {
        etcd_client::Client::connect(
            [format!("127.0.0.1:{}", self.etcd.client_port)],
            Some(
                ConnectOptions::new()
                    .with_user(user, password)
                    .with_timeout(Duration::from_secs(2)),
            ),
        )
        .await
        .unwrap()
    }
}

fn permission_denied(result: Result<impl std::fmt::Debug, etcd_client::Error>, what: &str) {
    let err = result.map(|_| ()).expect_err(what);
    assert!(
        err.to_string().contains("permission denied"),
        "{what}: expected permission denied, got {err}"
    );
}

/// lockkit works as a user whose role covers only `<prefix>/`: acquire, contention, a queued
/// waiter woken by the release, renewal past the TTL, release. The same user cannot write
/// outside that prefix (not even `<prefix>-x/`), and lockkit configured with another prefix is
/// refused with `Auth` at connect. A user whose role covers another prefix is refused with
/// `Auth` on this one, and can neither read, overwrite nor delete the lock's key nor revoke
/// its session lease (whose id is in the key's name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_on_the_lock_prefix_is_enough_and_keeps_others_out() {
    let Some(rbac) = RbacEtcd::start("lk-rbac", 21240..21260).await else {
        return;
    };
    let ttl = Duration::from_secs(2);
    let options = LockOptions::default().with_ttl(ttl);
    let connect = || async {
        let backend = EtcdBackend::connect(rbac.locker())
            .await
            .expect("locker connects");
        LockClient::with_options(Arc::new(backend), "ns", options.clone()).unwrap()
    };
    let (holder, waiter) = (connect().await, connect().await);
    let guard = holder.mutex("job").unwrap().lock().await.unwrap();
    assert!(
        waiter
            .mutex("job")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_none()
    );
    let queued = tokio::spawn(async move {
        let next: lockkit_core::Result<lockkit_core::MutexGuard> = waiter
            .mutex("job")?
            .lock_timeout(Duration::from_secs(15))
            .await;
        next
    });
    tokio::time::sleep(ttl + ttl / 2).await;
    assert!(!guard.is_lost(), "renewal failed under the role");
    assert!(guard.is_held().await.unwrap());
    let lock_key = lockkit_core::backend::lease_of(&guard)
        .handle()
        .expect("an etcd lease names its key")
        .to_owned();
    assert!(
        lock_key.starts_with(&format!("{LOCK_PREFIX}/ns/job/")),
        "{lock_key}"
    );

    let mut locker = rbac.raw("locker", &rbac.locker_password).await;
    for key in ["outside/x", "locks-a-x/y", "other-b/x"] {
        permission_denied(
            locker.put(key, "v", None).await,
            &format!("locker puts {key}"),
        );
    }
    let elsewhere = rbac.config("locker", &rbac.locker_password, OTHER_PREFIX);
    let err = EtcdBackend::connect(elsewhere)
        .await
        .expect_err("a prefix outside the role");
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");

    let intruder_config = rbac.config("intruder", &rbac.intruder_password, LOCK_PREFIX);
    let err = EtcdBackend::connect(intruder_config)
        .await
        .expect_err("the intruder connects");
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert!(!err.is_retryable());
    let own = rbac.config("intruder", &rbac.intruder_password, OTHER_PREFIX);
    let theirs = LockClient::new(EtcdBackend::connect(own).await.expect("own prefix"));
    assert!(
        theirs
            .mutex("job")
            .unwrap()
            .lock()
            .await
            .unwrap()
            .release()
            .await
            .unwrap()
    );

    let mut intruder = rbac.raw("intruder", &rbac.intruder_password).await;
    permission_denied(
        intruder.get(lock_key.as_str(), None).await,
        "intruder reads the lock",
    );
    permission_denied(
        intruder
            .get(
                format!("{LOCK_PREFIX}/"),
                Some(GetOptions::new().with_prefix()),
            )
            .await,
        "intruder lists the locks",
    );
    permission_denied(
        intruder.put(lock_key.as_str(), "mine", None).await,
        "intruder overwrites",
    );
    permission_denied(
        intruder.delete(lock_key.as_str(), None).await,
        "intruder deletes",
    );
    permission_denied(
        intruder.lease_revoke(support::lease_of(&lock_key)).await,
        "intruder revokes the holder's session",
    );
    assert!(
        guard.is_held().await.unwrap(),
        "the intruder broke the lock"
    );

    assert!(guard.release().await.unwrap());
    let next = queued.await.unwrap().expect("the waiter is granted");
    assert!(next.release().await.unwrap());
}

/// No password and no owner token (read back from the key's value first) in the `Debug` of
/// configurations, backends, clients, guards and leases, in the errors of a wrong password and
/// of a missing permission, or in a TRACE capture of a whole cycle and those failures, the
/// client library's and gRPC's own events included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_and_owner_tokens_stay_out_of_output_and_traces() {
    let capture = TraceCapture::install();
    let Some(rbac) = RbacEtcd::start("lk-secrets", 21260..21280).await else {
        return;
    };
    let ttl = Duration::from_secs(2);
    let ns = format!("sec-{:08x}", rand::random::<u32>());
    let config = rbac.locker();
    let mut shown = vec![format!("{config:?}")];
    let connect = || async {
        let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
        LockClient::with_options(Arc::new(backend), &ns, LockOptions::default().with_ttl(ttl))
            .unwrap()
    };
    let (locks, other) = (connect().await, connect().await);
    let guard = locks.mutex("job").unwrap().lock().await.unwrap();
    let mut root = rbac.raw("root", &rbac.root_password).await;
    let key = lockkit_core::backend::lease_of(&guard)
        .handle()
        .unwrap()
        .to_owned();
    let stored = root.get(key.as_str(), None).await.unwrap();
    let stored = String::from_utf8_lossy(stored.kvs()[0].value()).into_owned();
    assert_eq!(
        stored,
        lockkit_core::backend::lease_of(&guard).owner().digest_hex(),
        "the key holds {stored:?}, not the owner token's digest"
    );
    let mut secrets = owner_token_spellings(lockkit_core::backend::lease_of(&guard).owner());
    assert!(guard.release().await.unwrap());
    let (tokens, more) = exercise(&locks, &other, ttl).await;
    secrets.extend(tokens);
    shown.extend(more);

    let mut wrong = config.clone();
    wrong.password = Some(format!("wrong-{:032x}", rand::random::<u128>()));
    let err = EtcdBackend::connect(wrong.clone())
        .await
        .expect_err("a wrong password");
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    shown.push(format!("{err} {err:?} {wrong:?}"));
    let elsewhere = rbac.config("locker", &rbac.locker_password, OTHER_PREFIX);
    let err = EtcdBackend::connect(elsewhere)
        .await
        .expect_err("outside the role");
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    shown.push(format!("{err} {err:?}"));

    for password in [
        &rbac.locker_password,
        &rbac.root_password,
        wrong.password.as_ref().unwrap(),
    ] {
        secrets.extend(secret_spellings(password));
    }
    assert_nothing_shown(&capture, &ns, &shown, &secrets);
}
