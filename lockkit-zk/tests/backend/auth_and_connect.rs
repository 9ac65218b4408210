//! Connecting: wrong digest credentials are refused with `Auth`, the lock nodes' ACLs keep
//! strangers out, and an unreachable ensemble is `Unavailable` within the connect timeout.

use std::time::{Duration, Instant};

use lockkit_core::ErrorKind;
use lockkit_zk::{ZkBackend, ZkConfig};
use zookeeper_client as zk;

use crate::support::{admin, test_config};
use crate::{assert_no_znodes, client, lock_node, namespace};

/// (6) Wrong digest credentials are refused with `Auth`, and a client without credentials
/// can neither list nor delete a held lock node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_auth_and_acls_protect_the_locks() {
    let Some(mut config) = test_config() else {
        return;
    };
    config.chroot = format!("/lockkit-auth-{:08x}", rand::random::<u32>());
    config.username = Some("lockkit".into());
    config.password = Some("right-password".into());
    let ns = namespace();
    let (_, owner) = client(&config, &ns).await;
    let guard = owner.mutex("guarded").unwrap().lock().await.unwrap();

    let mut wrong = config.clone();
    wrong.password = Some("wrong-password".into());
    let err = ZkBackend::connect(wrong)
        .await
        .expect_err("wrong password admitted");
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert!(!format!("{err} {err:?}").contains("password"), "{err:?}");
    let debug = format!("{:?} {:?}", guard, owner.backend());
    let owner_token = lockkit_core::backend::lease_of(&guard).owner().expose_hex();
    assert!(!debug.contains(&owner_token[..8]), "{debug}");
    assert!(!debug.contains("right-password"), "{debug}");

    let stranger = zk::Client::connect(&config.hosts.join(",")).await.unwrap();
    let root = admin_with_credentials(&config).await;
    let node = lock_node(
        &root,
        &config.chroot,
        lockkit_core::backend::lease_of(&guard),
    )
    .await;
    let parent = node.rsplit_once('/').unwrap().0.to_owned();
    assert_eq!(stranger.delete(&node, None).await, Err(zk::Error::NoAuth));
    assert_eq!(
        stranger.list_children(&parent).await,
        Err(zk::Error::NoAuth)
    );
    assert!(guard.is_held().await.unwrap(), "a stranger broke the lock");
    assert!(guard.release().await.unwrap());

    let admin = admin(&config, &config.chroot).await;
    assert_no_znodes(&admin, &ns).await;
    let _ = admin.delete(&format!("/{ns}"), None).await;
    drop(admin);
    root.delete(&config.chroot, None).await.unwrap();
}

async fn admin_with_credentials(config: &ZkConfig) -> zk::Client {
    zk::Client::connector()
        .with_auth("digest", b"lockkit:right-password")
        .connect(&config.hosts.join(","))
        .await
        .expect("admin with credentials")
}

/// No server listening: connect fails with `Unavailable` within its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_ensemble_is_unavailable_within_the_timeout() {
    let mut config = ZkConfig::default();
    config.hosts = vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()];
    config.connect_timeout = Duration::from_secs(2);
    let started = Instant::now();
    let err = ZkBackend::connect(config)
        .await
        .expect_err("nothing listens");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}
