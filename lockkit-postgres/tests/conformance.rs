//! The core conformance suite against the server of `compose/up.sh postgres`.

mod support;

use support::harness::PostgresHarness;

async fn postgres_harness() -> Option<PostgresHarness> {
    let config = support::server_config().await?;
    PostgresHarness::connect(config).await.ok()
}

lockkit_core::conformance_tests!(postgres_harness);
