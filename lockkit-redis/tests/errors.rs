//! Bad input and unreachable servers: typed errors, bounded in time.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::time::{Duration, Instant};

use lockkit_core::backend::LockBackend;
use lockkit_core::{ErrorKind, LockClient};
use lockkit_redis::{
    RedisBackend, RedisClusterBackend, RedisConfig, RedlockBackend, RedlockConfig,
};

/// A TCP server that accepts connections and never answers.
async fn blackhole() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (addr, task)
}

/// A port on loopback where nothing listens.
async fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    addr
}

#[tokio::test]
async fn refused_connection_is_unavailable_at_once() {
    let mut config = RedisConfig::from_url(&format!("redis://{}", closed_port().await)).unwrap();
    config.connect_timeout = Duration::from_millis(500);
    let started = Instant::now();
    let err = RedisBackend::connect(config).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}

/// The cluster backend's own refusals: no cluster node answering (bounded, retryable), a
/// plain server named as a cluster (a configuration error, said as such), and each backend
/// given the other's configuration.
#[tokio::test]
async fn cluster_misconfigurations_are_typed_and_bounded() {
    let mut config =
        RedisConfig::from_url(&format!("redis+cluster://{}", closed_port().await)).unwrap();
    config.connect_timeout = Duration::from_millis(300);
    config.response_timeout = Duration::from_millis(300);
    let started = Instant::now();
    let err = RedisClusterBackend::connect(config).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );

    let plain = RedisConfig::from_url("redis://127.0.0.1:6379").unwrap();
    let err = RedisClusterBackend::connect(plain).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    let cluster = RedisConfig::from_url("redis+cluster://127.0.0.1:6379").unwrap();
    let err = RedisBackend::connect(cluster).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.message().contains("RedisClusterBackend"), "{err}");

    let Some(harness) = common::single().await else {
        return;
    };
    let common::Topology::Single(single) = &harness.topology else {
        panic!("the single harness runs on one server");
    };
    let not_a_cluster =
        RedisConfig::from_url(&format!("redis+cluster://{}", single.hosts[0])).unwrap();
    let err = RedisClusterBackend::connect(not_a_cluster)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.message().contains("not a Redis Cluster node"), "{err}");
}

/// Names with braces hash as Redis hashes them (up to the first `}`), so such a lock works on
/// a cluster like any other; a namespace that starts with `}` leaves a lock's keys without a
/// common hash tag and is refused before anything is sent.
#[tokio::test]
async fn braces_in_names_on_a_cluster() {
    let Some(harness) = common::cluster().await else {
        return;
    };
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let backend = harness.backend().await.unwrap();
    let locks = LockClient::with_options(backend.clone(), &namespace, Default::default()).unwrap();
    for name in ["a}b", "{x}", "}"] {
        let guard = locks.mutex(name).unwrap().lock().await.unwrap();
        assert!(
            locks
                .mutex(name)
                .unwrap()
                .try_lock()
                .await
                .unwrap()
                .is_none()
        );
        assert!(guard.release().await.unwrap(), "{name}");
    }
    let untagged = LockClient::with_options(backend, "}ns", Default::default()).unwrap();
    let err = untagged.mutex("a").unwrap().try_lock().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidKey, "{err}");
}

#[tokio::test]
async fn silent_server_is_unavailable_within_the_timeouts() {
    let (addr, server) = blackhole().await;
    let mut config = RedisConfig::from_url(&format!("redis://{addr}")).unwrap();
    config.connect_timeout = Duration::from_millis(300);
    config.response_timeout = Duration::from_millis(300);
    let started = Instant::now();
    let err = RedisBackend::connect(config).await.unwrap_err();
    let took = started.elapsed();
    server.abort();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        took < Duration::from_millis(300 + 300 + 500),
        "took {took:?}"
    );
}

#[tokio::test]
async fn redlock_with_a_silent_majority_fails_with_quorum_not_reached() {
    let (a, server_a) = blackhole().await;
    let (b, server_b) = blackhole().await;
    let c = closed_port().await;
    let mut config = RedlockConfig::from_url(&format!("redlock://{a},{b},{c}")).unwrap();
    config.node_timeout = Duration::from_millis(100);
    config.connect_timeout = Duration::from_millis(200);
    let started = Instant::now();
    let err = RedlockBackend::connect(config).await.unwrap_err();
    let took = started.elapsed();
    server_a.abort();
    server_b.abort();
    assert!(
        matches!(err.kind(), ErrorKind::QuorumNotReached { got: 0, need: 2 }),
        "{err}"
    );
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

#[tokio::test]
async fn invalid_configurations_are_refused_before_connecting() {
    type Breakage = fn(&mut RedisConfig);
    let cases: &[(&str, Breakage)] = &[
        ("no hosts", |c| c.hosts.clear()),
        ("two hosts without Sentinel", |c| {
            c.hosts.push("127.0.0.1:1".into())
        }),
        ("min_replicas without Sentinel", |c| c.min_replicas = 1),
        ("bad host", |c| c.hosts = vec!["no-port".into()]),
        ("zero timeout", |c| c.response_timeout = Duration::ZERO),
        ("negative database", |c| c.db = -1),
        ("a Sentinel password without Sentinel", |c| {
            c.sentinel_password = Some("pw".into())
        }),
        ("a client certificate without its key", |c| {
            c.tls = true;
            c.tls_cert_file = Some("client.pem".into());
        }),
        ("a client key without its certificate", |c| {
            c.tls = true;
            c.tls_key_file = Some("client.key".into());
        }),
        ("a client certificate without TLS", |c| {
            c.tls_cert_file = Some("client.pem".into());
            c.tls_key_file = Some("client.key".into());
        }),
        ("a client certificate that cannot be read", |c| {
            c.tls = true;
            c.tls_cert_file = Some("/nonexistent/client.pem".into());
            c.tls_key_file = Some("/nonexistent/client.key".into());
        }),
    ];
    for (what, break_it) in cases {
        let mut config = RedisConfig::default();
        break_it(&mut config);
        let err = RedisBackend::connect(config).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{what}: {err}");
    }
    for url in [
        "redis://h/notanumber",
        "redis+sentinel://h1,h2",
        "redis://h?x=1",
        "etcd://h",
    ] {
        let err = RedisConfig::from_url(url).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
    }
    for url in [
        "redlock://h1,h2",
        "redlock://h1,h1,h2",
        "redlock://h1,h2,h3/0",
    ] {
        let err = RedlockConfig::from_url(url)
            .and_then(|c| c.validate())
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
    }
}

#[test]
fn passwords_stay_out_of_debug_output() {
    let config = RedisConfig::from_url("redis://app:s3cr3t-pw@127.0.0.1:6379/2").unwrap();
    assert_eq!(config.db, 2);
    assert_eq!(config.password.as_deref(), Some("s3cr3t-pw"));
    assert!(!format!("{config:?}").contains("s3cr3t-pw"));
    let config = RedlockConfig::from_url("redlock://:s3cr3t-pw@a,b,c").unwrap();
    assert!(!format!("{config:?}").contains("s3cr3t-pw"));
    let mut sentinel = RedisConfig::from_url("redis+sentinel://s1,s2:1234/primary/3").unwrap();
    sentinel.sentinel_password = Some("s3nt1nel-pw".into());
    assert!(!format!("{sentinel:?}").contains("s3nt1nel-pw"));
    assert_eq!(sentinel.hosts, ["s1:26379", "s2:1234"]);
    assert_eq!(sentinel.sentinel_master.as_deref(), Some("primary"));
    assert_eq!(sentinel.db, 3);
}

/// A Sentinel group that does not know the master name is a configuration error, not an
/// outage to retry.
#[tokio::test]
async fn unknown_sentinel_master_is_invalid_config() {
    let Some(harness) = common::sentinel().await else {
        return;
    };
    let common::Topology::Sentinel(config) = &harness.topology else {
        panic!("the sentinel harness runs on Sentinel");
    };
    let mut config = config.clone();
    config.sentinel_master = Some("no-such-master".into());
    let err = RedisBackend::connect(config).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(!err.is_retryable());
    assert!(err.message().contains("no-such-master"), "{err}");
}

/// The Sentinels are asked with their own credentials: an ACL user made on every Sentinel
/// of the group, with only what the README lists, is accepted with its password (and each
/// Sentinel has the backend subscribed to its failover announcements under it) and refused
/// (`Auth`, not an outage to retry) with another.
#[tokio::test]
async fn sentinels_are_asked_with_their_own_credentials() {
    let Some(harness) = common::sentinel().await else {
        return;
    };
    let common::Topology::Sentinel(config) = &harness.topology else {
        panic!("the sentinel harness runs on Sentinel");
    };
    let name = format!("lk-sentinel-{:08x}", rand::random::<u32>());
    let password = format!("pw-{:032x}", rand::random::<u128>());
    let users = common::SentinelUser::create(&config.hosts, &name, &password).await;

    let mut asked = config.clone();
    asked.sentinel_username = Some(name.clone());
    asked.sentinel_password = Some(password.clone());
    let backend = RedisBackend::connect(asked.clone())
        .await
        .expect("the Sentinels accept their user");
    let locks = lockkit_core::LockClient::new(backend);
    let guard = locks.mutex("sentinel-auth").unwrap().lock().await.unwrap();
    assert!(guard.release().await.unwrap());
    for sentinel in &config.hosts {
        let by = Instant::now() + Duration::from_secs(30);
        loop {
            let mut admin = common::connect(sentinel).await.unwrap();
            let clients: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(&mut admin)
                .await
                .unwrap();
            let subscribed = clients.lines().any(|client| {
                client.contains(&format!(" user={name} ")) && client.contains(" sub=1 ")
            });
            if subscribed {
                break;
            }
            assert!(
                Instant::now() < by,
                "{sentinel} has no subscription of the backend's Sentinel user:\n{clients}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    asked.sentinel_password = Some(format!("{password}-wrong"));
    let err = RedisBackend::connect(asked).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert!(!err.is_retryable(), "{err}");
    assert!(!err.to_string().contains(&password), "{err}");
    drop(users);
}

/// A user without `SUBSCRIBE` still gets its locks: waiters fall back to polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_subscriptions_fall_back_to_polling() {
    let Some(harness) = common::single().await else {
        return;
    };
    let namespace = format!("lk-ns-{:08x}", rand::random::<u32>());
    let common::Topology::Single(config) = &harness.topology else {
        panic!("the single harness runs on one server");
    };
    let user =
        common::AclUser::create(&config.hosts[0], &namespace, common::LOCKKIT_COMMANDS).await;
    let mut config = config.clone();
    config.username = Some(user.name.clone());
    config.password = Some(user.password.clone());
    let backend = RedisBackend::connect(config).await.expect("connect");
    expect_polling_works(std::sync::Arc::new(backend), &namespace).await;
}

/// The same on Redlock, whose waiters listen on one node: with every node refusing, they
/// poll with the core's backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_subscriptions_on_every_redlock_node_fall_back_to_polling() {
    let Some(harness) = common::redlock().await else {
        return;
    };
    let namespace = format!("lk-ns-{:08x}", rand::random::<u32>());
    let common::Topology::Redlock(config) = &harness.topology else {
        panic!("the redlock harness runs on Redlock nodes");
    };
    let (name, password) = (
        format!("lk-test-{:08x}", rand::random::<u32>()),
        format!("pw-{:032x}", rand::random::<u128>()),
    );
    let mut users = Vec::new();
    for node in &config.nodes {
        users.push(
            common::AclUser::create_as(
                node,
                name.clone(),
                password.clone(),
                &namespace,
                common::LOCKKIT_COMMANDS,
            )
            .await,
        );
    }
    let mut config = config.clone();
    config.username = Some(name);
    config.password = Some(password);
    let backend = RedlockBackend::connect(config).await.expect("connect");
    expect_polling_works(std::sync::Arc::new(backend), &namespace).await;
    drop(users);
}

/// The same on a Redis Cluster whose nodes refuse `SSUBSCRIBE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_shard_subscriptions_on_a_cluster_fall_back_to_polling() {
    let Some(harness) = common::cluster().await else {
        return;
    };
    let namespace = format!("lk-ns-{:08x}", rand::random::<u32>());
    let common::Topology::Cluster(config) = &harness.topology else {
        panic!("the cluster harness runs on a cluster");
    };
    let (users, config) =
        common::cluster_users(config, &namespace, &common::cluster_commands(false)).await;
    let backend = RedisClusterBackend::connect(config).await.expect("connect");
    expect_polling_works(std::sync::Arc::new(backend), &namespace).await;
    drop(users);
}

/// A waiter on `backend` (whose server refuses SUBSCRIBE) is granted soon after the release,
/// and the backend says it polls.
async fn expect_polling_works(backend: std::sync::Arc<dyn LockBackend>, namespace: &str) {
    let outcome: lockkit_core::Result<(lockkit_core::WaitStrategy, Duration)> = async {
        let options = lockkit_core::LockOptions::default().with_ttl(Duration::from_secs(5));
        let locks = LockClient::with_options(backend.clone(), namespace, options)?;
        let held = locks.mutex("polled")?.lock().await?;
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let guard: lockkit_core::Result<lockkit_core::MutexGuard> =
                    async { locks.mutex("polled")?.lock().await }.await;
                guard
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let polls = backend.capabilities().wait;
        held.release().await?;
        let started = Instant::now();
        let next = tokio::time::timeout(Duration::from_secs(3), waiter)
            .await
            .expect("the waiter was never granted")
            .expect("join")?;
        let waited = started.elapsed();
        next.release().await?;
        Ok::<_, lockkit_core::Error>((polls, waited))
    }
    .await;
    let (polls, waited) = outcome.expect("locks work without SUBSCRIBE");
    assert_eq!(polls, lockkit_core::WaitStrategy::Poll);
    assert!(
        waited < Duration::from_secs(2),
        "the poller took {waited:?}"
    );
}

/// A database number the server does not have is a configuration error (the CLI's exit 78),
/// not an unexpected backend error, and the message says which setting to fix.
#[tokio::test]
async fn a_database_the_server_does_not_have_is_invalid_config() {
    let Some(harness) = common::single().await else {
        return;
    };
    let common::Topology::Single(config) = &harness.topology else {
        panic!("the single harness runs on one server");
    };
    let mut config = config.clone();
    config.db = 99;
    let err = RedisBackend::connect(config).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(!err.is_retryable());
    assert!(err.message().contains("99"), "{err}");
    assert!(err.message().contains("databases"), "{err}");
}
