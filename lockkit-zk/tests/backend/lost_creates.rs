//! A create whose reply was lost never leaves the acquisition a second node: the retry finds
//! its own node, and strays with the acquisition's name are deleted.

use std::time::{Duration, Instant};

use lockkit_core::backend::{AcquireRequest, Attempt, Grant, Lease, LockBackend, OwnerToken};
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{ErrorKind, LockKey};
use lockkit_zk::ZkBackend;
use zookeeper_client as zk;

use crate::support::{TEST_CHROOT, admin, test_config};
use crate::{Queue, assert_no_znodes, client, key_behind_a_proxy, let_go, namespace, nodes_named};

/// A create whose reply is lost (the request reached the ensemble, the answer did not
/// come back) leaves a node; the next attempt of the same acquisition finds it by the digest
/// of the owner token in its name instead of queueing a second one behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_lost_create_reply_finds_its_own_node() {
    let Some(Queue {
        admin,
        ns,
        proxy,
        backend,
        request,
        parent,
    }) = key_behind_a_proxy("lost-reply").await
    else {
        return;
    };
    let (_, grant) = granted_after_a_lost_create(&admin, &proxy, &backend, &request, &parent).await;
    let nodes: Vec<String> = admin
        .list_children(&parent)
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.contains("-lock-"))
        .collect();
    assert_eq!(nodes.len(), 1, "an orphan was left: {nodes:?}");
    assert!(nodes[0].ends_with(grant.handle.as_deref().unwrap()));
    backend.abandon(&request).await.unwrap();
    let_go(&admin, &ns, &parent, backend).await;
}

/// A create whose reply was lost can commit after the retry looked, leaving a second node
/// with the acquisition's own name and a higher sequence (made here by a second client with
/// that name). The next round of the acquisition deletes it, and nothing is left to block
/// the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strays_with_the_acquisitions_own_name_are_deleted() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, holder) = client(&config, &ns).await;
    let backend = ZkBackend::connect(config).await.unwrap();
    let first = holder.mutex("strays").unwrap().lock().await.unwrap();
    let ttl = Duration::from_secs(10);
    let request = AcquireRequest::new(
        LockKey::new(&ns, "strays").unwrap(),
        OwnerToken::generate().unwrap(),
        ttl,
        true,
    );
    assert!(matches!(
        backend.try_acquire(&request).await.unwrap(),
        Attempt::Contended(_)
    ));
    let parent = format!("/{ns}/strays");
    let holders = format!(
        "-lock-{}",
        lockkit_core::backend::lease_of(&first).handle().unwrap()
    );
    admin.sync(&parent).await.expect("sync the lock");
    let ours: Vec<String> = admin
        .list_children(&parent)
        .await
        .unwrap()
        .into_iter()
        .filter(|c| !c.ends_with(&holders))
        .collect();
    assert_eq!(ours.len(), 1, "{ours:?}");
    let prefix = ours[0][..ours[0].rfind("-lock-").unwrap() + "-lock-".len()].to_owned();
    stray(&admin, &parent, &prefix).await;
    assert_eq!(nodes_named(&admin, &parent, &prefix).await.len(), 2);
    assert!(matches!(
        backend.try_acquire(&request).await.unwrap(),
        Attempt::Contended(_)
    ));
    assert_eq!(
        nodes_named(&admin, &parent, &prefix).await,
        ours,
        "the waiting round left the stray"
    );

    assert!(first.release().await.unwrap());
    let Attempt::Granted(grant) = backend.try_acquire(&request).await.unwrap() else {
        panic!("the next in line was not granted");
    };
    assert!(backend.release(&lease_of(&request, &grant)).await.unwrap());
    assert_no_znodes(&admin, &ns).await;
}

/// While a create of the acquisition is unsettled (its reply lost), a node with its name can
/// still appear after the grant (the create committing late, made here by a second client
/// with that name): the release lists the lock through the leader and deletes it too. (With
/// every create answered no such node can exist, and the release sends only its delete.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stray_of_an_unsettled_create_goes_with_the_release() {
    let Some(Queue {
        admin,
        ns,
        proxy,
        backend,
        request,
        parent,
    }) = key_behind_a_proxy("late-stray").await
    else {
        return;
    };
    let lost_at = Instant::now();
    let (node, grant) =
        granted_after_a_lost_create(&admin, &proxy, &backend, &request, &parent).await;
    // A session timeout after the lost create, a background sweep settles it (deleting what
    // it left): a stray made after that could not have come from it.
    assert!(
        lost_at.elapsed() < backend.session_timeout(),
        "the retry took {:?}, longer than the session timeout: the sweep may have settled the create",
        lost_at.elapsed()
    );
    let prefix = node[..node.rfind("-lock-").unwrap() + "-lock-".len()].to_owned();
    stray(&admin, &parent, &prefix).await;
    assert_eq!(nodes_named(&admin, &parent, &prefix).await.len(), 2);
    assert!(backend.release(&lease_of(&request, &grant)).await.unwrap());
    assert_eq!(
        nodes_named(&admin, &parent, &prefix).await,
        Vec::<String>::new(),
        "the release left the stray"
    );
    let_go(&admin, &ns, &parent, backend).await;
}

/// Loses the reply of `request`'s create (the request reaches the ensemble, the answer does
/// not come back), then retries until granted: the retry must find its own node rather than
/// queue behind it. Answers the node the lost create made, and the grant.
async fn granted_after_a_lost_create(
    admin: &zk::Client,
    proxy: &FaultProxy,
    backend: &ZkBackend,
    request: &AcquireRequest,
    parent: &str,
) -> (String, Grant) {
    proxy.set(Direction::Replies, Fault::Drop);
    let err = backend
        .try_acquire(request)
        .await
        .expect_err("the reply was dropped");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    let deadline = Instant::now() + Duration::from_secs(5);
    let node = loop {
        let found = admin
            .list_children(parent)
            .await
            .expect("list the lock")
            .into_iter()
            .find(|c| c.contains("-lock-"));
        if let Some(node) = found {
            break node;
        }
        assert!(
            Instant::now() < deadline,
            "the create never reached the ensemble"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    proxy.heal();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match backend.try_acquire(request).await {
            Ok(Attempt::Granted(grant)) => return (node, grant),
            Ok(Attempt::Contended(_)) => panic!("the retry queued behind its own node"),
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the retry failed: {e}"),
        }
    }
}

/// A node named `prefix…` under `parent`, made by the admin client: what a create of the
/// acquisition that commits late leaves.
async fn stray(admin: &zk::Client, parent: &str, prefix: &str) {
    admin
        .create(
            &format!("{parent}/{prefix}"),
            &[],
            &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .expect("create a stray");
}

/// The lease of `grant`, as the core would hold it.
fn lease_of(request: &AcquireRequest, grant: &Grant) -> Lease {
    let lease = Lease::new(
        request.key.clone(),
        request.owner.clone(),
        grant.fencing_token,
        request.ttl,
        Instant::now(),
    );
    match &grant.handle {
        Some(handle) => lease.with_handle(handle.clone()),
        None => lease,
    }
}
