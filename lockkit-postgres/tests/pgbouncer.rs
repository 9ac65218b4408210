//! The core conformance suite through PgBouncer in transaction pooling (`compose/up.sh
//! pgbouncer`): every statement may run on another server connection, so nothing may depend on
//! a session. `LISTEN` cannot pass transaction pooling, so the clients listen on the server
//! itself (`listen_hosts`), as the crate documentation tells users to; and a client with
//! `listen = false`, whose waiters poll, locks through PgBouncer too.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod support;

use lockkit_core::testing;
use lockkit_postgres::{PostgresBackend, PostgresConfig};
use support::harness::PostgresHarness;

async fn pgbouncer_harness() -> Option<PostgresHarness> {
    let Some(url) = testing::endpoint("LOCKKIT_TEST_PGBOUNCER_URL") else {
        testing::backend_missing("PgBouncer (LOCKKIT_TEST_PGBOUNCER_URL)");
        return None;
    };
    let mut config = PostgresConfig::from_url(&url).expect("a valid URL");
    let server = testing::endpoint("LOCKKIT_TEST_POSTGRES_URL")
        .and_then(|url| PostgresConfig::from_url(&url).ok())?;
    config.listen_hosts = server.hosts;
    if let Err(e) = PostgresBackend::connect(config.clone()).await {
        testing::backend_missing(&format!("PgBouncer at {url} ({e})"));
        return None;
    }
    PostgresHarness::connect(config).await.ok()
}

lockkit_core::conformance_tests!(pgbouncer_harness);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_do_not_listen_poll_through_pgbouncer() {
    use std::sync::Arc;
    use std::time::Duration;

    let Some(url) = testing::endpoint("LOCKKIT_TEST_PGBOUNCER_URL") else {
        return testing::backend_missing("PgBouncer (LOCKKIT_TEST_PGBOUNCER_URL)");
    };
    let mut config = PostgresConfig::from_url(&url).expect("a valid URL");
    config.listen = false;
    let ns = format!("lk-poll-{:08x}", rand::random::<u32>());
    let client = || async {
        let backend = PostgresBackend::connect(config.clone())
            .await
            .expect("connect");
        lockkit_core::LockClient::with_options(
            Arc::new(backend),
            &ns,
            lockkit_core::LockOptions::default(),
        )
        .expect("a client")
    };
    let (first, second) = (client().await, client().await);
    let held = first.mutex("job").unwrap().lock().await.unwrap();
    let waiter = tokio::spawn(async move {
        second
            .mutex("job")
            .unwrap()
            .lock_timeout(Duration::from_secs(20))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let first_token = held.fencing_token();
    assert!(held.release().await.unwrap());
    let next = waiter.await.unwrap().unwrap();
    assert!(next.fencing_token() > first_token);
    assert!(next.release().await.unwrap());
}
