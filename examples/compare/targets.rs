//! The server tiers the examples run on: the compose topologies this build contains whose
//! servers are up (URLs from `LOCKKIT_TEST_*_URL` or `compose/up.sh`'s endpoints file).

use lockkit::BackendKind;

/// Every server tier: its name in the tables, the variable naming its URL, its backend.
const SERVER_TIERS: [(&str, &str, BackendKind); 7] = [
    ("redis", "LOCKKIT_TEST_REDIS_URL", BackendKind::Redis),
    (
        "redis-sentinel",
        "LOCKKIT_TEST_SENTINEL_URL",
        BackendKind::RedisSentinel,
    ),
    (
        "redis-cluster",
        "LOCKKIT_TEST_REDIS_CLUSTER_URL",
        BackendKind::RedisCluster,
    ),
    (
        "redlock-5",
        "LOCKKIT_TEST_REDLOCK_URL",
        BackendKind::Redlock,
    ),
    ("etcd-3", "LOCKKIT_TEST_ETCD_URL", BackendKind::Etcd),
    ("zk-3", "LOCKKIT_TEST_ZK_URL", BackendKind::Zk),
    (
        "postgres",
        "LOCKKIT_TEST_POSTGRES_URL",
        BackendKind::Postgres,
    ),
];

/// `(name, url)` of every server tier compiled in and reachable, or of those among them that
/// `only` names (`memory` may be among those names: it has no servers). A tier whose servers
/// are missing is reported (a failure under `LOCKKIT_REQUIRE_BACKENDS=1`) and left out.
///
/// # Errors
/// A name in `only` that is no tier's, with the list of names.
pub(crate) fn server_tiers(only: Option<&[String]>) -> Result<Vec<(&'static str, String)>, String> {
    if let Some(unknown) = only.into_iter().flatten().find(|name| {
        name.as_str() != "memory" && !SERVER_TIERS.iter().any(|(tier, ..)| tier == name)
    }) {
        let names: Vec<&str> = SERVER_TIERS.iter().map(|(tier, ..)| *tier).collect();
        return Err(format!(
            "unknown tier {unknown:?}: the tiers are memory, {}",
            names.join(", ")
        ));
    }
    Ok(SERVER_TIERS
        .into_iter()
        .filter(|(name, _, kind)| {
            only.is_none_or(|only| only.iter().any(|o| o == name)) && kind.is_compiled_in()
        })
        .filter_map(|(name, var, _)| {
            let url = lockkit_core::testing::endpoint(var);
            if url.is_none() {
                lockkit_core::testing::backend_missing(&format!("{name} ({var})"));
            }
            url.map(|url| (name, url))
        })
        .collect())
}
