//! A crash of the server (`pg_ctl stop -m immediate`, then a start: crash recovery) on a
//! private server (ports 22220-22240): a grant was on disk before the client heard of it, so
//! it survives; its holder reconnects and keeps renewing it; the next grant's fencing token
//! is above every earlier one.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod support;

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::{LockClient, LockOptions};
use lockkit_postgres::{PostgresBackend, PostgresConfig};
use support::private::PrivatePostgres;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_and_the_fencing_order_survive_a_crash_of_the_server() {
    let Some(server) = PrivatePostgres::start(
        "restart",
        22220..22240,
        "",
        "host all all 127.0.0.1/32 scram-sha-256",
        &[],
    ) else {
        return;
    };
    let config = PostgresConfig::from_url(&server.url("")).unwrap();
    let ttl = Duration::from_secs(6);
    let client = || async {
        let backend = PostgresBackend::connect(config.clone()).await.unwrap();
        LockClient::with_options(
            Arc::new(backend),
            "restart",
            LockOptions::default().with_ttl(ttl),
        )
        .unwrap()
    };
    let (holder, other) = (client().await, client().await);
    // Earlier grants, so that the sequence has handed out numbers ahead of its last WAL record.
    let mut last = 0;
    for _ in 0..40 {
        let guard = other.mutex("warm-up").unwrap().lock().await.unwrap();
        last = guard.fencing_token().get();
        guard.release().await.unwrap();
    }
    let guard = holder.mutex("job").unwrap().lock().await.unwrap();
    assert!(guard.fencing_token().get() > last);
    let held_token = guard.fencing_token();

    server.restart("immediate");

    assert!(
        other
            .mutex("job")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_none(),
        "the grant did not survive the crash"
    );
    // The holder's renewals reach the server again: past a TTL after the crash it holds.
    tokio::time::sleep(ttl + Duration::from_secs(1)).await;
    assert!(!guard.is_lost(), "the holder lost a grant the server kept");
    assert!(
        guard.is_held().await.unwrap(),
        "the server no longer has the grant"
    );
    assert!(guard.release().await.unwrap());
    let next = other.mutex("job").unwrap().lock().await.unwrap();
    assert!(
        next.fencing_token() > held_token,
        "token {} after {held_token}",
        next.fencing_token()
    );
    next.release().await.unwrap();
}
