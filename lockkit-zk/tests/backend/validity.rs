//! How long a grant is trusted: a fraction of the session timeout whatever the TTL, and a TTL
//! below the minimum is raised to it so that renewals stay few.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::backend::{AcquireRequest, Attempt, Lease, LockBackend, OwnerToken, Renewal};
use lockkit_core::{LockClient, LockKey, LockOptions};
use lockkit_zk::ZkBackend;

use crate::support::{TEST_CHROOT, admin, test_config};
use crate::{assert_no_znodes, namespace};

/// A grant and a renewal are trusted for 0.3 of the session timeout (with the default grace),
/// however long the lock's ttl: long enough to renew in time, short enough that the leader
/// cannot have expired the session while the holder still trusts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_and_renewals_are_trusted_for_part_of_the_session_timeout() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let backend = ZkBackend::connect(config).await.unwrap();
    let bound = backend.session_timeout().mul_f64(0.3);
    let ttl = Duration::from_secs(60);
    let request = AcquireRequest::new(
        LockKey::new(&ns, "trusted").unwrap(),
        OwnerToken::generate().unwrap(),
        ttl,
        true,
    );
    let Attempt::Granted(grant) = backend.try_acquire(&request).await.unwrap() else {
        panic!("a free lock was not granted");
    };
    assert!(
        grant.valid_for <= bound,
        "granted for {:?}, beyond {bound:?}",
        grant.valid_for
    );
    let lease = Lease::new(
        request.key.clone(),
        request.owner.clone(),
        grant.fencing_token,
        ttl,
        Instant::now(),
    )
    .with_handle(grant.handle.clone().unwrap());
    match backend.renew(&lease).await.unwrap() {
        Renewal::Extended(valid_for) => {
            assert!(
                valid_for <= bound,
                "renewed for {valid_for:?}, beyond {bound:?}"
            );
        }
        Renewal::Lost => panic!("the holder's renewal was refused"),
    }
    assert!(backend.release(&lease).await.unwrap());
    assert_no_znodes(&admin, &ns).await;
}

/// A 10 ms TTL would have the renewal scheduler `sync` with the leader every few
/// milliseconds for each lock. It is raised to the documented minimum, so a lock held for a
/// second is renewed a handful of times, not hundreds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_below_the_minimum_is_raised_to_it() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let backend = ZkBackend::connect(config).await.expect("connect");
    let recording = Arc::new(lockkit_core::testing::Recording::new(Arc::new(backend)));
    let locks = LockClient::with_options(
        recording.clone(),
        &ns,
        LockOptions::default().with_ttl(Duration::from_millis(10)),
    )
    .expect("client");
    let guard = locks
        .mutex("short")
        .expect("key")
        .lock()
        .await
        .expect("lock");
    assert_eq!(guard.ttl(), lockkit_zk::MIN_TTL);
    let held_for = Duration::from_secs(1);
    tokio::time::sleep(held_for).await;
    assert!(!guard.is_lost());
    let renewals = recording.count("renew_many") + recording.count("renew");
    // A third of the 1 s validity apart: about three. A 10 ms TTL made it about 300.
    assert!(
        renewals <= 10,
        "{renewals} renewals in {held_for:?} for one lock"
    );
    assert!(guard.release().await.expect("release"));
    assert_no_znodes(&admin, &ns).await;
}
