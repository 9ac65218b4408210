//! Renewal ticks against the ensemble: what one `renew_many` asks of the server, and that it
//! reports exactly the leases whose nodes are gone as lost.

mod support;

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::backend::{Lease, LockBackend, Renewal, lease_of};
use lockkit_core::{LockClient, LockOptions, MutexGuard};
use lockkit_zk::{ZkBackend, ZkConfig};
use support::server::four_letter_word;
use support::{TEST_CHROOT, admin, test_config};
use zookeeper_client as zk;

fn namespace() -> String {
    format!("lk-zk-renew-{:08x}", rand::random::<u32>())
}

/// `count` locks held in a fresh namespace, with a TTL long enough that the scheduler does
/// not renew them while the test does.
async fn hold(config: &ZkConfig, count: usize) -> (ZkBackend, String, Vec<MutexGuard>) {
    let backend = ZkBackend::connect(config.clone()).await.expect("connect");
    let ns = namespace();
    let locks = LockClient::with_options(
        Arc::new(backend.clone()),
        &ns,
        LockOptions::default().with_ttl(Duration::from_secs(30)),
    )
    .expect("client");
    let mut guards = Vec::new();
    for i in 0..count {
        let mutex = locks.mutex(&format!("held-{i}")).expect("key");
        guards.push(mutex.lock().await.expect("lock"));
    }
    (backend, ns, guards)
}

fn leases(guards: &[MutexGuard]) -> Vec<Lease> {
    guards.iter().map(|g| lease_of(g).clone()).collect()
}

/// The requests the servers have received from `session` so far (`cons`, over every
/// server of the ensemble: the session is connected to one of them).
fn requests_received(config: &ZkConfig, session: i64) -> u64 {
    let sid = format!("sid=0x{session:x},");
    config
        .hosts
        .iter()
        .flat_map(|host| {
            four_letter_word(host, "cons")
                .lines()
                .filter(|l| l.contains(&sid))
                .filter_map(|l| l.split("recved=").nth(1)?.split(',').next()?.parse().ok())
                .collect::<Vec<u64>>()
        })
        .sum()
}

/// The node of a held lease, as the admin client (rooted at the chroot) names it.
async fn node_of(admin: &zk::Client, lease: &Lease) -> String {
    let parent = format!("/{}/{}", lease.key().namespace(), lease.key().name());
    let sequence = lease.handle().expect("a zk lease has a handle");
    let children = admin.list_children(&parent).await.expect("list the lock");
    let name = children
        .iter()
        .find(|c| c.ends_with(&format!("-lock-{sequence}")))
        .expect("the lease's node");
    format!("{parent}/{name}")
}

/// One tick renews every lease of the session in one round trip: a `sync` and one
/// multi-read, not a `sync` and an `exists` per lease (400 requests for these 200).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_of_200_leases_is_one_sync_and_one_multi_read() {
    let Some(config) = test_config() else { return };
    let (backend, _ns, guards) = hold(&config, 200).await;
    let leases = leases(&guards);
    let session = backend.session_id();
    let before = requests_received(&config, session);
    let answers = backend.renew_many(&leases).await;
    let after = requests_received(&config, session);
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Ok(Renewal::Extended(_)))),
        "{answers:?}"
    );
    assert!(before > 0, "cons does not show session {session:#x}");
    // The two requests of the tick, and room for a ping or a sweep of the clean-up task
    // that happen to fall in between.
    let sent = after - before;
    assert!(sent <= 6, "{sent} requests for one tick of 200 leases");
    for guard in guards {
        assert!(guard.release().await.expect("release"));
    }
}

/// A node deleted behind the holder's back (an operator, another client) makes exactly
/// its lease lost in a tick; the others in the same tick are extended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_with_one_deleted_node_reports_exactly_that_lease_lost() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let (backend, _ns, guards) = hold(&config, 5).await;
    let leases = leases(&guards);
    admin
        .delete(&node_of(&admin, &leases[2]).await, None)
        .await
        .expect("delete the node");
    let answers = backend.renew_many(&leases).await;
    for (i, answer) in answers.iter().enumerate() {
        match (i, answer) {
            (2, Ok(Renewal::Lost)) => {}
            (2, other) => panic!("the deleted node's lease: {other:?}"),
            (_, Ok(Renewal::Extended(_))) => {}
            (i, other) => panic!("lease {i}: {other:?}"),
        }
    }
    for (i, guard) in guards.into_iter().enumerate() {
        assert_eq!(guard.release().await.expect("release"), i != 2);
    }
}

/// After the session expired, no lease of it is extended by a tick, on the new session or
/// otherwise: their nodes went with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_after_the_session_expired_reports_every_lease_lost() {
    let Some(config) = test_config() else { return };
    let (backend, _ns, guards) = hold(&config, 5).await;
    let leases = leases(&guards);
    let old = backend.session_id();
    backend.expire_session().await.expect("expire");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while backend.session_id() == old {
        assert!(tokio::time::Instant::now() < deadline, "no new session");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let answers = backend.renew_many(&leases).await;
    assert!(
        answers.iter().all(|a| matches!(a, Ok(Renewal::Lost))),
        "{answers:?}"
    );
    assert!(guards.iter().all(MutexGuard::is_lost));
}
