//! Failover to the synchronous standby of `compose/up.sh postgres-ha`: the primary is killed
//! while a client holds locks, the standby promoted; the grants survive (they were on the
//! standby before the client heard of them), their holders renew them on the new primary, the
//! fencing tokens go on increasing, and then the whole conformance suite passes on the
//! promoted server. The test brings the pair up first (`compose/up.sh postgres-ha`), since a
//! run before it leaves a promoted standby and a dead primary.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod support;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lockkit_core::{LockClient, LockOptions, Tier, testing};
use lockkit_postgres::{PostgresBackend, PostgresConfig};
use support::harness::PostgresHarness;

const COMPOSE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../compose");

fn compose(script: &str, args: &[&str]) -> String {
    let output = Command::new(format!("{COMPOSE}/{script}"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{script} {args:?}: {e}"));
    assert!(
        output.status.success(),
        "{script} {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_survive_the_promotion_of_the_synchronous_standby() {
    let Some(url) = testing::endpoint("LOCKKIT_TEST_POSTGRES_HA_URL") else {
        testing::backend_missing("PostgreSQL with a standby (LOCKKIT_TEST_POSTGRES_HA_URL)");
        return;
    };
    compose("up.sh", &["postgres-ha"]);
    let config = PostgresConfig::from_url(&url).unwrap();
    let ttl = Duration::from_secs(6);
    let client = || async {
        let backend = PostgresBackend::connect(config.clone()).await.unwrap();
        LockClient::with_options(
            Arc::new(backend),
            &format!("failover-{:08x}", rand::random::<u32>()),
            LockOptions::default().with_ttl(ttl),
        )
        .unwrap()
    };
    let holder = client().await;
    assert_eq!(holder.backend().tier(), Tier::Replicated);
    let guard = holder.mutex("job").unwrap().lock().await.unwrap();
    let permit = holder
        .semaphore("slots", 1)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let before = guard.fencing_token().max(permit.fencing_token());

    compose("member.sh", &["kill", "pg-primary"]);
    compose("member.sh", &["promote", "pg-standby"]);

    let other = LockClient::with_options(
        holder.backend().clone(),
        holder.namespace(),
        LockOptions::default().with_ttl(ttl),
    )
    .unwrap();
    let fresh = client().await;
    let same_ns = LockClient::with_options(
        fresh.backend().clone(),
        holder.namespace(),
        LockOptions::default().with_ttl(ttl),
    )
    .unwrap();
    assert!(
        same_ns
            .mutex("job")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_none(),
        "the promoted standby forgot the lock"
    );
    assert!(
        same_ns
            .semaphore("slots", 1)
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "the promoted standby forgot the permit"
    );
    // Past a TTL after the failover the holder renewed on the new primary.
    tokio::time::sleep(ttl + Duration::from_secs(1)).await;
    assert!(
        !guard.is_lost() && !permit.is_lost(),
        "a grant the new primary kept was lost"
    );
    assert!(guard.release().await.unwrap() && permit.release().await.unwrap());
    let next = other.mutex("job").unwrap().lock().await.unwrap();
    assert!(
        next.fencing_token() > before,
        "{} after {before}",
        next.fencing_token()
    );
    next.release().await.unwrap();
    drop((holder, other, fresh, same_ns));

    // The whole conformance suite on the promoted server.
    let harness = PostgresHarness::connect(config).await.unwrap();
    let names: Vec<&str> = testing::SCENARIOS.iter().map(|(name, _)| *name).collect();
    let failures: Vec<String> = futures_util::stream::iter(names)
        .map(|name| {
            let harness = &harness;
            async move {
                testing::run_scenario(harness, name)
                    .await
                    .err()
                    .map(|failure| format!("{name}: {failure}"))
            }
        })
        .buffer_unordered(4)
        .filter_map(|failure| async move { failure })
        .collect()
        .await;
    assert!(failures.is_empty(), "after the promotion: {failures:#?}");
}
