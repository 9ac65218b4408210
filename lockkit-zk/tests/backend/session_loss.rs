//! A holder whose session expires or whose connection is blackholed learns it lost the lock
//! before anyone else is granted; a disconnection within the validity keeps the lock.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};

use crate::support::{TEST_CHROOT, admin, test_config};
use crate::{assert_no_znodes, client, client_with_ttl, lock_node, namespace};

/// (1) The holder's session is expired by the server: its lost signal fires, the next waiter
/// is granted, and the stale holder's release leaves the new holder's node alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_session_fires_lost_and_grants_the_next_waiter() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (holder_backend, holder) = client(&config, &ns).await;
    let (_, waiter) = client(&config, &ns).await;
    let old = holder.mutex("expiring").unwrap().lock().await.unwrap();
    let waiting = tokio::spawn(async move {
        waiter
            .mutex("expiring")
            .unwrap()
            .lock_timeout(Duration::from_secs(20))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the waiter got a held lock");

    holder_backend.expire_session().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), old.lost())
        .await
        .expect("the expired holder's lost signal did not fire");
    let new = waiting
        .await
        .unwrap()
        .expect("the next waiter was not granted");
    assert!(new.fencing_token() > old.fencing_token());

    assert!(
        !old.is_held().await.unwrap(),
        "the stale holder still holds"
    );
    assert!(
        !old.release().await.unwrap(),
        "the stale release claimed the lock"
    );
    let node = lock_node(&admin, "", lockkit_core::backend::lease_of(&new)).await;
    assert!(
        admin.check_stat(&node).await.unwrap().is_some(),
        "the stale release deleted the new holder's node"
    );
    assert!(new.is_held().await.unwrap());
    // The expired backend opened a new session and works again.
    let info = holder.inspect("expiring").await.unwrap().expect("held");
    assert_eq!(info.fencing_token, new.fencing_token());
    assert!(new.release().await.unwrap());
    let again = holder
        .mutex("expiring")
        .unwrap()
        .lock_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(again.release().await.unwrap());
    assert_no_znodes(&admin, &ns).await;
}

/// (3) A holder whose connection is blackholed longer than the session timeout reports the
/// lock lost before the servers expire its session and grant the lock to another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_holder_reports_lost_before_anyone_else_is_granted() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let proxy = FaultProxy::start(&config.hosts)
        .await
        .expect("a fault proxy");
    let mut proxied = config.clone();
    proxied.hosts = proxy.hosts();
    let (_, holder) = client_with_ttl(&proxied, &ns, Duration::from_secs(60)).await;
    let (_, other) = client(&config, &ns).await;
    let held = holder.mutex("cut-off").unwrap().lock().await.unwrap();
    let granted_at = Arc::new(StdMutex::new(None));
    let waiting = {
        let granted_at = granted_at.clone();
        tokio::spawn(async move {
            let guard = other
                .mutex("cut-off")
                .unwrap()
                .lock_timeout(Duration::from_secs(30))
                .await;
            *granted_at.lock().unwrap() = Some(Instant::now());
            guard
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cut_at = Instant::now();
    proxy.set(Direction::Both, Fault::Blackhole);
    tokio::time::timeout(Duration::from_secs(20), held.lost())
        .await
        .expect("the cut-off holder's lost signal did not fire");
    let lost_at = Instant::now();
    assert!(
        granted_at.lock().unwrap().is_none(),
        "another client was granted before the holder knew it had lost the lock"
    );
    let new = waiting
        .await
        .unwrap()
        .expect("the other client was never granted");
    let granted_at = granted_at.lock().unwrap().expect("granted");
    assert!(lost_at < granted_at);
    eprintln!(
        "blackholed at 0: holder lost after {:?}, other client granted after {:?}",
        lost_at - cut_at,
        granted_at - cut_at
    );
    proxy.heal();
    assert!(!held.release().await.unwrap_or(false));
    assert!(new.release().await.unwrap());
    assert_no_znodes(&admin, &ns).await;
}

/// A disconnection that ends while the lock is still trusted is ridden out: the holder keeps
/// its lock and its lost signal stays quiet. 10 s session: a grant or renewal is trusted for
/// 3 s and renewed every second; the network goes silent for 0.8 s, then the stuck
/// connections are reset, so the client sees the disconnection, reconnects at once within the
/// session watcher's grace, and the next renewal succeeds before the validity runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnection_within_the_validity_keeps_the_lock() {
    let Some(mut config) = test_config() else {
        return;
    };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let proxy = FaultProxy::start(&config.hosts)
        .await
        .expect("a fault proxy");
    let direct = config.clone();
    config.hosts = proxy.hosts();
    config.session_timeout = Duration::from_secs(10);
    let (_, holder) = client_with_ttl(&config, &ns, Duration::from_secs(10)).await;
    let (_, other) = client(&direct, &ns).await;
    let held = holder.mutex("flaky").unwrap().lock().await.unwrap();
    proxy.set(Direction::Both, Fault::Blackhole);
    tokio::time::sleep(Duration::from_millis(800)).await;
    proxy.heal();
    proxy.reset();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !held.is_held().await.unwrap_or(false) {
        assert!(Instant::now() < deadline, "the holder did not reconnect");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Three more renewal periods: renewals go on over the new connection.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !held.is_lost(),
        "a disconnection within the validity fired lost"
    );
    assert!(
        other
            .mutex("flaky")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_none()
    );
    assert!(held.release().await.unwrap());
    assert_no_znodes(&admin, &ns).await;
}
