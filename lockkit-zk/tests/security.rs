//! Digest ACLs and secrets against the ensemble, each test under a chroot of its own: every
//! node lockkit creates (chroot, namespace, lock parent, lock node) carries the creator-only
//! ACL, so clients without the credentials cannot read, change, delete or jump the queue; and
//! no password or owner token shows in `Debug`, errors or `tracing` output.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

#[allow(dead_code)] // the helpers the other test files need too
mod support;

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::testing::{TraceCapture, assert_nothing_shown, exercise, secret_spellings};
use lockkit_core::{ErrorKind, LockClient, LockOptions};
use lockkit_zk::{ZkBackend, ZkConfig};
use support::test_config;
use zookeeper_client as zk;

const USER: &str = "lockkit";

/// The test configuration with digest credentials (a random password) and a fresh chroot.
fn secured_config() -> Option<ZkConfig> {
    let mut config = test_config()?;
    config.chroot = format!("/lockkit-sec-{:08x}", rand::random::<u32>());
    config.username = Some(USER.into());
    config.password = Some(format!("pw-{:032x}", rand::random::<u128>()));
    Some(config)
}

/// A client of the ensemble (not rooted) with `credentials`, if any.
async fn client_with(config: &ZkConfig, credentials: Option<&str>) -> zk::Client {
    let connector = match credentials {
        Some(credentials) => zk::Client::connector().with_auth("digest", credentials.as_bytes()),
        None => zk::Client::connector(),
    };
    connector
        .with_session_timeout(Duration::from_secs(10))
        .connect(&config.hosts.join(","))
        .await
        .expect("a raw client")
}

/// Deletes the test's chroot (and what is left under it) when dropped, also after a panic:
/// only the credentials can, so nothing else would.
struct RemoveChroot(ZkConfig);

impl Drop for RemoveChroot {
    fn drop(&mut self) {
        let config = self.0.clone();
        let credentials = format!(
            "{}:{}",
            config.username.clone().unwrap_or_default(),
            config.password.clone().unwrap_or_default()
        );
        let removal = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to clean up");
            runtime.block_on(async {
                let root = client_with(&config, Some(&credentials)).await;
                remove_tree(&root, &config.chroot).await;
            });
        });
        let _ = removal.join();
    }
}

async fn remove_tree(client: &zk::Client, path: &str) {
    let mut stack = vec![(path.to_owned(), false)];
    while let Some((node, expanded)) = stack.pop() {
        if expanded {
            let _ = client.delete(&node, None).await;
            continue;
        }
        stack.push((node.clone(), true));
        for child in client.list_children(&node).await.unwrap_or_default() {
            stack.push((format!("{node}/{child}"), false));
        }
    }
}

/// The chroot, the namespace node, the lock's parent and the lock node all carry exactly the
/// creator-only ACL of the configured digest user. A client without credentials, and one with
/// the right user but a wrong password, can neither read nor list them, change their data or
/// ACL, delete them, nor create a node in the lock's queue (a node there with a lower sequence
/// number would take the lock); the holder keeps it throughout. Wrong credentials given to
/// lockkit are `Auth` at connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_acls_cover_every_lock_node_and_its_parents() {
    let Some(config) = secured_config() else {
        return;
    };
    let _cleanup = RemoveChroot(config.clone());
    let locks = LockClient::with_options(
        Arc::new(ZkBackend::connect(config.clone()).await.unwrap()),
        "ns",
        LockOptions::default(),
    )
    .unwrap();
    let guard = locks.mutex("job").unwrap().lock().await.unwrap();

    let password = config.password.clone().unwrap();
    let owner = client_with(&config, Some(&format!("{USER}:{password}"))).await;
    let parent = format!("{}/ns/job", config.chroot);
    let children = owner.list_children(&parent).await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    let node = format!("{parent}/{}", children[0]);
    let levels = [
        config.chroot.clone(),
        format!("{}/ns", config.chroot),
        parent.clone(),
        node.clone(),
    ];
    for path in &levels {
        let (acls, _) = owner.get_acl(path).await.unwrap();
        assert_eq!(acls.len(), 1, "{path}: {acls:?}");
        assert_eq!(acls[0].scheme(), "digest", "{path}: {acls:?}");
        assert!(
            acls[0].id().starts_with(&format!("{USER}:")),
            "{path}: {acls:?}"
        );
        assert!(
            !acls[0].id().contains(&password),
            "{path}: the ACL shows the password"
        );
        assert_eq!(
            acls[0].permission(),
            zk::Permission::ALL,
            "{path}: {acls:?}"
        );
    }

    let stranger = client_with(&config, None).await;
    let impostor = client_with(&config, Some(&format!("{USER}:not-{password}"))).await;
    for (who, client) in [
        ("no credentials", &stranger),
        ("a wrong password", &impostor),
    ] {
        for path in &levels {
            assert_eq!(
                client.get_data(path).await.map(|_| ()),
                Err(zk::Error::NoAuth),
                "{who}: read {path}"
            );
            assert_eq!(
                client.list_children(path).await.map(|_| ()),
                Err(zk::Error::NoAuth),
                "{who}: list {path}"
            );
            assert_eq!(
                client.set_data(path, b"x", None).await.map(|_| ()),
                Err(zk::Error::NoAuth),
                "{who}: write {path}"
            );
            assert_eq!(
                client
                    .set_acl(path, &zk::Acls::anyone_all(), None)
                    .await
                    .map(|_| ()),
                Err(zk::Error::NoAuth),
                "{who}: set the ACL of {path}"
            );
        }
        assert_eq!(
            client.delete(&node, None).await,
            Err(zk::Error::NoAuth),
            "{who}: delete the lock node"
        );
        let jump = format!("{parent}/_c_00000000-0000-0000-0000-000000000000-lock-0000000000");
        assert_eq!(
            client
                .create(
                    &jump,
                    &[],
                    &zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all())
                )
                .await
                .map(|_| ()),
            Err(zk::Error::NoAuth),
            "{who}: jump the queue"
        );
        assert_eq!(
            client
                .create(
                    &format!("{}/ns/other", config.chroot),
                    &[],
                    &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
                )
                .await
                .map(|_| ()),
            Err(zk::Error::NoAuth),
            "{who}: create a lock in the namespace"
        );
    }
    assert!(guard.is_held().await.unwrap(), "a stranger broke the lock");
    assert!(guard.release().await.unwrap());

    let mut wrong = config.clone();
    wrong.password = Some(format!("not-{password}"));
    let err = ZkBackend::connect(wrong)
        .await
        .expect_err("a wrong password connects");
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert!(!err.is_retryable());
}

/// A chroot deleted under a live session (the server deletes one that another client created
/// as a container, docs/interop.md "The chroot") comes back, on the next lock, with the ACL
/// it gets at session start: creator-only for the digest user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chroot_deleted_under_the_session_comes_back_creator_only() {
    let Some(config) = secured_config() else {
        return;
    };
    let _cleanup = RemoveChroot(config.clone());
    let locks = LockClient::with_options(
        Arc::new(ZkBackend::connect(config.clone()).await.unwrap()),
        "ns",
        LockOptions::default(),
    )
    .unwrap();
    let password = config.password.clone().unwrap();
    let owner = client_with(&config, Some(&format!("{USER}:{password}"))).await;
    owner.delete(&config.chroot, None).await.unwrap();

    let guard = locks.mutex("job").unwrap().lock().await.unwrap();
    let (acls, _) = owner.get_acl(&config.chroot).await.unwrap();
    assert_eq!(acls.len(), 1, "{acls:?}");
    assert_eq!(acls[0].scheme(), "digest", "{acls:?}");
    assert!(acls[0].id().starts_with(&format!("{USER}:")), "{acls:?}");
    assert_eq!(acls[0].permission(), zk::Permission::ALL, "{acls:?}");
    let stranger = client_with(&config, None).await;
    assert_eq!(
        stranger.list_children(&config.chroot).await.map(|_| ()),
        Err(zk::Error::NoAuth)
    );
    assert!(guard.release().await.unwrap());
}

/// No password and no owner token in the `Debug` of the configuration, the backend, clients,
/// guards and leases, in the error of a wrong password, or in a TRACE capture of a whole cycle
/// (the ZooKeeper client's own events, which show request paths, included): lock nodes are
/// named after a digest of the token, never the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_and_owner_tokens_stay_out_of_output_and_traces() {
    let capture = TraceCapture::install();
    let Some(config) = secured_config() else {
        return;
    };
    let _cleanup = RemoveChroot(config.clone());
    let password = config.password.clone().unwrap();
    let ns = format!("sec-{:08x}", rand::random::<u32>());
    let ttl = Duration::from_secs(2);
    let connect = || async {
        let backend = ZkBackend::connect(config.clone()).await.unwrap();
        LockClient::with_options(Arc::new(backend), &ns, LockOptions::default().with_ttl(ttl))
            .unwrap()
    };
    let (locks, other) = (connect().await, connect().await);
    let mut shown = vec![format!("{config:?}")];

    let (mut secrets, more) = exercise(&locks, &other, ttl).await;
    shown.extend(more);

    let mut wrong = config.clone();
    wrong.password = Some(format!("wrong-{:032x}", rand::random::<u128>()));
    let err = ZkBackend::connect(wrong.clone())
        .await
        .expect_err("a wrong password");
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    shown.push(format!("{err} {err:?} {wrong:?}"));

    for secret in [
        password.clone(),
        format!("{USER}:{password}"),
        wrong.password.clone().unwrap(),
    ] {
        secrets.extend(secret_spellings(&secret));
    }
    assert_nothing_shown(&capture, &ns, &shown, &secrets);
}
