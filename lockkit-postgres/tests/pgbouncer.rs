//! The core conformance suite through PgBouncer in transaction pooling (`compose/up.sh
//! pgbouncer`): every statement may run on another server connection, so nothing may depend on
//! a session. `LISTEN` cannot pass transaction pooling, so the clients set `listen = false`
//! and their waiters poll, as the crate documentation tells users to.

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
    config.listen = false;
    if let Err(e) = PostgresBackend::connect(config.clone()).await {
        testing::backend_missing(&format!("PgBouncer at {url} ({e})"));
        return None;
    }
    PostgresHarness::connect(config).await.ok()
}

lockkit_core::conformance_tests!(pgbouncer_harness);
