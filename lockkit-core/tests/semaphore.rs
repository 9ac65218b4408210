//! `Semaphore::with_permit` on the memory backend: a section runs under a permit, and one
//! whose permit is lost is cut short with `Lost`, its permit free again.

use std::time::Duration;

use lockkit_core::{ErrorKind, LockClient, LockOptions, MemoryBackend};

#[tokio::test]
async fn with_permit_runs_the_section_under_a_permit() {
    let locks = LockClient::new(MemoryBackend::new());
    let pool = locks.semaphore("pool", 1).expect("semaphore");
    let inside = pool
        .with_permit(async |permit| {
            let other = pool.try_acquire().await.expect("try_acquire");
            (permit.fencing_token(), other.is_none())
        })
        .await
        .expect("a protected section");
    assert!(
        inside.1,
        "a second permit of 1 was granted during the section"
    );
    assert!(
        pool.try_acquire().await.expect("try_acquire").is_some(),
        "the permit was not given back"
    );
}

#[tokio::test]
async fn with_permit_cuts_the_section_short_when_the_permit_is_lost() {
    let options = LockOptions::default()
        .with_ttl(Duration::from_millis(200))
        .with_auto_renew(false);
    let locks = LockClient::with_options(std::sync::Arc::new(MemoryBackend::new()), "ns", options)
        .expect("client");
    let pool = locks.semaphore("pool", 1).expect("semaphore");
    let outcome = pool
        .with_permit(async |_permit| {
            tokio::time::sleep(Duration::from_secs(30)).await;
        })
        .await;
    let error = outcome.expect_err("the section outlived its permit");
    assert_eq!(error.into_parts().0.kind(), ErrorKind::Lost);
    // The lost permit is given back in the background, and expires by its TTL anyway.
    let freed = pool
        .acquire_timeout(Duration::from_secs(5))
        .await
        .expect("the lost permit stayed taken");
    assert!(freed.release().await.expect("release"));
}
