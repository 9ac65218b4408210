//! A server that may evict lock keys (a `maxmemory` limit with an evicting policy) is refused
//! at connect time unless the configuration accepts it, on every Redis tier; a user that may
//! not read the policy gets a warning, not a refusal. Against private servers: the test sets
//! their memory policy.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use common::private::PrivateRedis;
use lockkit_core::testing::TraceCapture;
use std::sync::Arc;

use lockkit_core::{ErrorKind, LockClient, LockOptions};
use lockkit_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};

const EVICTING: &[&str] = &["--maxmemory", "100mb", "--maxmemory-policy", "volatile-ttl"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_may_evict_lock_keys_is_refused_unless_accepted() {
    let Some(server) = PrivateRedis::start(EVICTING) else {
        return;
    };
    let config = RedisConfig::from_url(&server.url()).unwrap();
    let err = RedisBackend::connect(config.clone()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    for named in ["maxmemory-policy", "volatile-ttl", "redis.allow_eviction"] {
        assert!(err.message().contains(named), "{named} not in: {err}");
    }

    let mut accepting = config;
    accepting.allow_eviction = true;
    let locks = LockClient::new(RedisBackend::connect(accepting).await.unwrap());
    let guard = locks.mutex("evictable").unwrap().lock().await.unwrap();
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_evict_is_accepted() {
    for args in [
        &["--maxmemory", "100mb", "--maxmemory-policy", "noeviction"][..],
        &["--maxmemory", "0", "--maxmemory-policy", "volatile-ttl"][..],
    ] {
        let Some(server) = PrivateRedis::start(args) else {
            return;
        };
        let config = RedisConfig::from_url(&server.url()).unwrap();
        RedisBackend::connect(config).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redlock_node_that_may_evict_is_refused() {
    let mut servers = Vec::new();
    for evicting in [false, false, true] {
        let args = if evicting { EVICTING } else { &[][..] };
        let Some(server) = PrivateRedis::start(args) else {
            return;
        };
        servers.push(server);
    }
    let nodes: Vec<String> = servers.iter().map(PrivateRedis::addr).collect();
    let config = RedlockConfig::from_url(&format!("redlock://{}", nodes.join(","))).unwrap();
    let err = RedlockBackend::connect(config.clone()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.message().contains(&nodes[2]), "{err}");
    assert!(err.message().contains("redlock.allow_eviction"), "{err}");
    let mut accepting = config;
    accepting.allow_eviction = true;
    RedlockBackend::connect(accepting).await.unwrap();
}

/// `INFO` refused (an ACL user without it, as managed services' users often are): the policy
/// cannot be read, so connect logs a warning and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_that_may_not_read_the_policy_gets_a_warning() {
    let Some(server) = PrivateRedis::start(EVICTING) else {
        return;
    };
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let commands: Vec<&str> = common::LOCKKIT_COMMANDS
        .iter()
        .copied()
        .filter(|c| *c != "+info")
        .collect();
    let user = common::AclUser::create(&server.addr(), &namespace, &commands).await;
    let mut config = RedisConfig::from_url(&server.url()).unwrap();
    config.username = Some(user.name.clone());
    config.password = Some(user.password.clone());
    let capture = TraceCapture::install();
    let backend = RedisBackend::connect(config).await.unwrap();
    let warnings: Vec<String> = capture
        .lines_with(&server.addr())
        .into_iter()
        .filter(|line| line.contains("WARN"))
        .collect();
    assert!(
        warnings
            .iter()
            .any(|line| line.contains("cannot check whether the server may evict")),
        "no warning: {warnings:?}"
    );
    let locks =
        LockClient::with_options(Arc::new(backend), &namespace, LockOptions::default()).unwrap();
    let guard = locks.mutex("unchecked").unwrap().lock().await.unwrap();
    assert!(guard.release().await.unwrap());
}
