//! The listing of a namespace shows its mutexes and leaves out its semaphores, in pages of
//! any size.

use lockkit_etcd::EtcdBackend;
use tokio::sync::mpsc;

use crate::{PATIENCE, client, next_grant, queue_waiter, support};

/// A namespace with a held mutex and a semaphore with holders and a waiter: the listing, in
/// pages of one key or in one page, shows the mutex alone, and ends.
#[tokio::test]
async fn the_listing_of_a_namespace_shows_its_mutexes_not_its_semaphores() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("sem-list");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let locks = client(&config, &ns).await;
    let pool = locks.semaphore("jobs", 2).expect("semaphore");
    let permits = [
        pool.acquire().await.expect("permit"),
        pool.acquire().await.expect("permit"),
    ];
    let (sender, mut granted) = mpsc::unbounded_channel();
    let waiter = client(&config, &ns).await;
    queue_waiter(
        &admin,
        &ns,
        3,
        0,
        waiter.semaphore("jobs", 2).unwrap(),
        &sender,
    )
    .await;
    let guard = locks.mutex("jobs").unwrap().lock().await.expect("lock");
    for limit in [1, 100] {
        let mut names = Vec::new();
        let mut cursor = None;
        for _ in 0..10 {
            let page = locks
                .list_page("", cursor.as_deref(), limit)
                .await
                .expect("list");
            names.extend(page.locks.iter().map(|(key, _)| key.name().to_owned()));
            cursor = page.next;
            if cursor.is_none() {
                break;
            }
        }
        assert!(
            cursor.is_none(),
            "the listing did not end in 10 pages of {limit}"
        );
        assert_eq!(names, ["jobs"], "pages of {limit}");
    }
    assert!(guard.release().await.expect("release"));
    for permit in permits {
        assert!(permit.release().await.expect("release"));
    }
    let last = next_grant(&mut granted, 0).await;
    assert!(last.release().await.expect("release"));
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}
