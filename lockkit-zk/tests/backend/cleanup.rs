//! What a failed release or acquisition leaves is cleaned up: the backend forgets a failed
//! release, a lost create is swept when its clean-up fails, a dropped backend's nodes go.

use std::time::{Duration, Instant};

use lockkit_core::backend::LockBackend;
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use zookeeper_client as zk;

use crate::support::test_config;
use crate::{
    Queue, assert_no_znodes, client_with_ttl, key_behind_a_proxy, let_go, namespace, nodes_named,
};

/// A release that cannot reach the ensemble fails, and still forgets the acquisition: the
/// backend does not keep one entry per failed release for as long as it lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_release_forgets_the_acquisition() {
    let Some(mut config) = test_config() else {
        return;
    };
    let proxy = FaultProxy::start(&config.hosts)
        .await
        .expect("a fault proxy");
    config.hosts = proxy.hosts();
    config.request_timeout = Duration::from_millis(300);
    let ns = namespace();
    let (backend, client) = client_with_ttl(&config, &ns, Duration::from_secs(60)).await;
    let guard = client.mutex("unreleased").unwrap().lock().await.unwrap();
    assert!(
        format!("{backend:?}").contains("acquisitions: 1"),
        "{backend:?}"
    );
    proxy.set(Direction::Both, Fault::Blackhole);
    guard
        .release()
        .await
        .expect_err("the ensemble was unreachable");
    assert!(
        format!("{backend:?}").contains("acquisitions: 0"),
        "{backend:?}"
    );
}

/// The node of a create whose reply was lost is removed in the background when the clean-up
/// after the failed acquisition cannot reach the ensemble either (its reply is lost too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_create_is_swept_when_the_clean_up_fails() {
    let Some(Queue {
        admin,
        ns,
        proxy,
        backend,
        request,
        parent,
    }) = key_behind_a_proxy("swept").await
    else {
        return;
    };

    proxy.set(Direction::Replies, Fault::Drop);
    backend
        .try_acquire(&request)
        .await
        .expect_err("the reply was dropped");
    let deadline = Instant::now() + Duration::from_secs(5);
    while nodes_named(&admin, &parent, "_c_").await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the create never reached the ensemble"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    backend
        .abandon(&request)
        .await
        .expect_err("the clean-up's reply was dropped");
    proxy.heal();
    // The proxy dropped bytes of the stream: make the client reconnect.
    proxy.reset();

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = nodes_named(&admin, &parent, "_c_").await;
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lost create was left: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let_go(&admin, &ns, &parent, backend).await;
}

/// A backend dropped while a clean-up waits in the background (for a create whose reply came
/// too late) closes its session at once, and the session's nodes go with it: the clean-up
/// must not keep the backend, and its session, alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_backend_closes_its_session_with_clean_ups_pending() {
    let Some(Queue {
        admin,
        ns,
        proxy,
        backend,
        request,
        parent,
    }) = key_behind_a_proxy("dropped").await
    else {
        return;
    };
    proxy.set(
        Direction::Replies,
        Fault::Delay {
            base: Duration::from_millis(1500),
            jitter: Duration::ZERO,
        },
    );
    backend
        .try_acquire(&request)
        .await
        .expect_err("the reply came after the request timeout");
    let deadline = Instant::now() + Duration::from_secs(5);
    while nodes_named(&admin, &parent, "_c_").await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the create never reached the ensemble"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.heal();
    drop(backend);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left = nodes_named(&admin, &parent, "_c_").await;
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the node outlived its dropped backend (its session stayed open): {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The parent was in use when the backend was dropped, so its janitor left it: a container,
    // which the server removes on its own only every `znode.container.checkIntervalMs` (60 s).
    admin
        .delete(&format!("{parent}/keep-parent"), None)
        .await
        .unwrap();
    match admin.delete(&parent, None).await {
        Ok(()) | Err(zk::Error::NoNode) => {}
        Err(e) => panic!("delete the parent: {e}"),
    }
    assert_no_znodes(&admin, &ns).await;
}
