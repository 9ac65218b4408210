//! Security against the compose servers: lockkit under the minimal ACL of the README (a user
//! limited to its namespace's keys and release channels), another user that cannot touch
//! those keys, and no password or owner token in `Debug`, `Display`, errors or `tracing`
//! output. Each test creates its own ACL users (random names) and deletes them.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{AclUser, LOCKKIT_COMMANDS, NOTIFY_COMMANDS, SENTINEL_COMMANDS, Topology};
use lockkit_core::backend::LockBackend;
use lockkit_core::testing::{
    TraceCapture, assert_nothing_shown, exercise, owner_token_spellings, secret_spellings,
};
use lockkit_core::{ErrorKind, LockClient, LockOptions, WaitStrategy};
use lockkit_redis::{
    RedisBackend, RedisClusterBackend, RedisConfig, RedlockBackend, RedlockConfig,
};

fn namespace() -> String {
    format!("lk-sec-{:08x}", rand::random::<u32>())
}

fn commands(extra: &[&[&'static str]]) -> Vec<&'static str> {
    let mut all = LOCKKIT_COMMANDS.to_vec();
    for more in extra {
        all.extend_from_slice(more);
    }
    all
}

/// The single server's address and a configuration that logs in as `user`.
fn single_as(harness: &common::RedisHarness, user: &AclUser) -> (String, RedisConfig) {
    let Topology::Single(config) = &harness.topology else {
        panic!("the single harness runs on one server");
    };
    let mut config = config.clone();
    config.username = Some(user.name.clone());
    config.password = Some(user.password.clone());
    (config.hosts[0].clone(), config)
}

/// lockkit works as a user with exactly the README's ACL: acquire, contention, renewal past
/// the TTL, a waiter woken by a release notification (not polling), release. The server logs
/// no ACL denial for the user, so nothing was silently refused and worked around.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockkit_works_under_the_minimal_acl() {
    let Some(harness) = common::single().await else {
        return;
    };
    let ns = namespace();
    let addr = match &harness.topology {
        Topology::Single(c) => c.hosts[0].clone(),
        _ => unreachable!(),
    };
    let user = AclUser::create(&addr, &ns, &commands(&[NOTIFY_COMMANDS])).await;
    let (_, config) = single_as(&harness, &user);
    let ttl = Duration::from_secs(2);
    let options = LockOptions::default().with_ttl(ttl);
    // The waiter re-checks only when the holder's TTL would have run out (1.3-2 s), never at
    // `backoff_max`: only the notification wakes it well within that.
    let waiting = options
        .clone()
        .with_backoff(Duration::from_millis(10), Duration::from_secs(60));
    let holder_backend = Arc::new(RedisBackend::connect(config.clone()).await.unwrap());
    let waiter_backend = Arc::new(RedisBackend::connect(config).await.unwrap());
    assert_eq!(holder_backend.capabilities().wait, WaitStrategy::Notify);
    let holder = LockClient::with_options(holder_backend, &ns, options).unwrap();
    let waiter = LockClient::with_options(waiter_backend.clone(), &ns, waiting).unwrap();

    let guard = holder.mutex("job").unwrap().lock().await.unwrap();
    assert!(
        waiter
            .mutex("job")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_none()
    );
    let info = waiter.inspect("job").await.unwrap().expect("held");
    assert_eq!(info.fencing_token, guard.fencing_token());
    let queued = tokio::spawn(async move {
        let next: lockkit_core::Result<lockkit_core::MutexGuard> = waiter
            .mutex("job")?
            .lock_timeout(Duration::from_secs(10))
            .await;
        next.map(|guard| (guard, Instant::now()))
    });
    tokio::time::sleep(ttl * 2).await;
    assert!(!guard.is_lost(), "renewal failed under the ACL");
    assert!(guard.is_held().await.unwrap());
    guard.extend().await.unwrap();
    let released_at = Instant::now();
    assert!(guard.release().await.unwrap());
    let (next, granted_at) = queued.await.unwrap().unwrap();
    let woke_after = granted_at - released_at;
    assert!(next.release().await.unwrap());

    // The idle subscription is dropped after a linger of 2 s: UNSUBSCRIBE is needed too.
    let channel = format!("lockkit:released:{{{ns}/job}}");
    let mut admin = common::connect(&addr).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, subscribers): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(&mut admin)
            .await
            .unwrap();
        if subscribers == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the waiter never unsubscribed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(waiter_backend);
    assert_eq!(
        user.denials().await,
        [],
        "the server refused lockkit something"
    );
    // A release notification wakes the waiter at once (500 ms leave a loaded machine room);
    // a re-check would come up to 2 s later.
    assert!(woke_after < ttl / 4, "the waiter took {woke_after:?}");
}

/// A second application with the same ACL on another namespace cannot read, overwrite,
/// extend, delete or release the first one's lock, nor forge its release notification, not
/// with plain commands and not through lockkit's own scripts: every attempt is `NOPERM`
/// (lockkit: a typed `Auth` error at once, no retry loop, no hang), and the lock and its
/// value are untouched. The lock user is refused the same way outside its namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_acl_user_cannot_touch_the_lock_keys() {
    let Some(harness) = common::single().await else {
        return;
    };
    let ns = namespace();
    let other_ns = namespace();
    let all = commands(&[NOTIFY_COMMANDS]);
    let addr = match &harness.topology {
        Topology::Single(c) => c.hosts[0].clone(),
        _ => unreachable!(),
    };
    let owner = AclUser::create(&addr, &ns, &all).await;
    let intruder = AclUser::create(&addr, &other_ns, &all).await;
    let (_, owner_config) = single_as(&harness, &owner);
    let (_, intruder_config) = single_as(&harness, &intruder);

    let locks = LockClient::new(RedisBackend::connect(owner_config.clone()).await.unwrap());
    let locks =
        LockClient::with_options(locks.backend().clone(), &ns, LockOptions::default()).unwrap();
    let guard = locks.mutex("job").unwrap().lock().await.unwrap();
    let lock_key = format!("{{{ns}/job}}");
    let fence_key = format!("{lock_key}:fence");
    let mut admin = common::connect(&addr).await.unwrap();
    let value_before: String = redis::cmd("GET")
        .arg(&lock_key)
        .query_async(&mut admin)
        .await
        .unwrap();

    let mut raw = intruder_connection(&addr, &intruder).await;
    let attempts: Vec<(&str, redis::Cmd)> = vec![
        ("GET lock", redis::cmd("GET").arg(&lock_key).clone()),
        ("GET fence", redis::cmd("GET").arg(&fence_key).clone()),
        (
            "SET lock",
            redis::cmd("SET").arg(&lock_key).arg("mine").clone(),
        ),
        (
            "SET fence",
            redis::cmd("SET").arg(&fence_key).arg(0).clone(),
        ),
        ("DEL lock", redis::cmd("DEL").arg(&lock_key).clone()),
        (
            "PEXPIRE lock",
            redis::cmd("PEXPIRE").arg(&lock_key).arg(1).clone(),
        ),
        ("INCR fence", redis::cmd("INCR").arg(&fence_key).clone()),
        (
            "PUBLISH release",
            redis::cmd("PUBLISH")
                .arg(format!("lockkit:released:{lock_key}"))
                .arg("x")
                .clone(),
        ),
    ];
    for (what, command) in attempts {
        let err = command
            .query_async::<redis::Value>(&mut raw)
            .await
            .expect_err(what);
        assert_eq!(err.code(), Some("NOPERM"), "{what}: {err}");
    }

    let stolen = LockClient::with_options(
        Arc::new(RedisBackend::connect(intruder_config).await.unwrap()),
        &ns,
        LockOptions::default(),
    )
    .unwrap();
    let started = Instant::now();
    for err in [
        stolen
            .mutex("job")
            .unwrap()
            .try_lock()
            .await
            .map(|_| ())
            .unwrap_err(),
        stolen
            .mutex("job")
            .unwrap()
            .lock_timeout(Duration::from_secs(10))
            .await
            .map(|_| ())
            .unwrap_err(),
        stolen.inspect("job").await.map(|_| ()).unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
        assert!(!err.is_retryable(), "{err}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refusals took {:?}",
        started.elapsed()
    );

    let outside =
        LockClient::with_options(locks.backend().clone(), &other_ns, LockOptions::default())
            .unwrap();
    let err = outside
        .mutex("job")
        .unwrap()
        .lock_timeout(Duration::from_secs(10))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");

    let value_after: String = redis::cmd("GET")
        .arg(&lock_key)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(value_before, value_after, "the lock's value changed");
    assert!(guard.is_held().await.unwrap());
    assert!(guard.release().await.unwrap());
    assert!(
        intruder
            .denials()
            .await
            .iter()
            .any(|(reason, object)| reason == "key" && object == &lock_key),
        "the server did not log the intruder's refusals: {:?}",
        intruder.denials().await
    );
}

async fn intruder_connection(addr: &str, user: &AclUser) -> redis::aio::MultiplexedConnection {
    let client =
        redis::Client::open(format!("redis://{}:{}@{addr}", user.name, user.password)).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// Sentinel: the primary needs `ROLE` and, with `min_replicas`, `WAIT` on top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_primary_works_under_the_minimal_acl() {
    let Some(harness) = common::sentinel().await else {
        return;
    };
    let Topology::Sentinel(config) = &harness.topology else {
        panic!("the sentinel harness runs on Sentinel");
    };
    let ns = namespace();
    let primary = common::primary_addr(config).await.unwrap();
    let user = AclUser::create(
        &primary,
        &ns,
        &commands(&[NOTIFY_COMMANDS, SENTINEL_COMMANDS]),
    )
    .await;
    let mut config = config.clone();
    config.username = Some(user.name.clone());
    config.password = Some(user.password.clone());
    config.min_replicas = 1;
    config.replica_timeout = Duration::from_secs(2);
    config.response_timeout = Duration::from_secs(5);
    let locks = LockClient::with_options(
        Arc::new(RedisBackend::connect(config).await.unwrap()),
        &ns,
        LockOptions::default(),
    )
    .unwrap();
    let guard = locks.mutex("job").unwrap().lock().await.unwrap();
    guard.extend().await.unwrap();
    assert!(guard.release().await.unwrap());
    assert_eq!(
        user.denials().await,
        [],
        "the primary refused lockkit something"
    );
}

/// Redlock: the same ACL on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_works_under_the_minimal_acl() {
    let Some(harness) = common::redlock().await else {
        return;
    };
    let Topology::Redlock(config) = &harness.topology else {
        panic!("the redlock harness runs on Redlock");
    };
    let ns = namespace();
    let (users, config) = redlock_users(config, &ns).await;
    let locks = LockClient::with_options(
        Arc::new(RedlockBackend::connect(config).await.unwrap()),
        &ns,
        LockOptions::default(),
    )
    .unwrap();
    let guard = locks.mutex("job").unwrap().lock().await.unwrap();
    guard.extend().await.unwrap();
    assert!(guard.release().await.unwrap());
    for user in &users {
        assert_eq!(user.denials().await, [], "a node refused lockkit something");
    }
}

/// A Redis Cluster: the README's ACL with sharded pub/sub, on every node. A waiter is woken by
/// the hand-over's announcement on a shard channel (not by polling, which would take 20 s
/// here), an idle shard channel is unsubscribed, and no node logs a denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_works_under_the_minimal_acl() {
    let Some(harness) = common::cluster().await else {
        return;
    };
    let Topology::Cluster(cluster) = &harness.topology else {
        panic!("the cluster harness runs on a cluster");
    };
    let ns = namespace();
    let (users, config) =
        common::cluster_users(cluster, &ns, &common::cluster_commands(true)).await;
    let options = LockOptions::default()
        .with_ttl(Duration::from_secs(60))
        .with_backoff(Duration::from_millis(10), Duration::from_secs(20));
    let backend = Arc::new(RedisClusterBackend::connect(config.clone()).await.unwrap());
    assert_eq!(backend.capabilities().wait, WaitStrategy::Notify);
    let holder = LockClient::with_options(backend, &ns, options.clone()).unwrap();
    let waiter = LockClient::with_options(
        Arc::new(RedisClusterBackend::connect(config).await.unwrap()),
        &ns,
        options,
    )
    .unwrap();
    let guard = holder.mutex("job").unwrap().lock().await.unwrap();
    let queued = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.mutex("job")?.lock().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    guard.extend().await.unwrap();
    assert!(guard.release().await.unwrap());
    let next = tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .expect("the waiter was not woken by the hand-over")
        .unwrap()
        .unwrap();
    assert!(next.release().await.unwrap());

    // The idle inbox channel is dropped after a linger of 2 s: SUNSUBSCRIBE is needed too.
    let suffix = format!(":{{{ns}/job}}");
    let deadline = Instant::now() + Duration::from_secs(10);
    'idle: loop {
        for node in common::cluster_nodes(cluster).await {
            let mut admin = common::connect(&node.addr).await.unwrap();
            let channels: Vec<String> = redis::cmd("PUBSUB")
                .arg("SHARDCHANNELS")
                .arg("lockkit:*")
                .query_async(&mut admin)
                .await
                .unwrap();
            if channels.iter().any(|c| c.ends_with(&suffix)) {
                assert!(Instant::now() < deadline, "the waiter never unsubscribed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue 'idle;
            }
        }
        break;
    }
    holder.close().await;
    waiter.close().await;
    for user in &users {
        assert_eq!(user.denials().await, [], "a node refused lockkit something");
    }
}

/// One user, with one name and password, on every Redlock node.
async fn redlock_users(config: &RedlockConfig, ns: &str) -> (Vec<AclUser>, RedlockConfig) {
    let name = format!("lk-test-{:08x}", rand::random::<u32>());
    let password = format!("pw-{:032x}", rand::random::<u128>());
    let mut users = Vec::new();
    for node in &config.nodes {
        users.push(
            AclUser::create_as(
                node,
                name.clone(),
                password.clone(),
                ns,
                &commands(&[NOTIFY_COMMANDS]),
            )
            .await,
        );
    }
    let mut config = config.clone();
    config.username = Some(name);
    config.password = Some(password);
    (users, config)
}

/// Neither the password nor an owner token shows in the `Debug` of configurations, backends,
/// clients, guards and leases, in the errors of a wrong password or a missing permission, or
/// anywhere in a TRACE capture of a whole cycle and of those failures (single server and
/// Redlock). The test reads the lock's value from the server first, so it searches for what
/// is really stored there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_and_owner_tokens_stay_out_of_output_and_traces() {
    let capture = TraceCapture::install();
    let (Some(single), Some(redlock)) = (common::single().await, common::redlock().await) else {
        return;
    };
    let ttl = Duration::from_millis(600);
    let options = LockOptions::default().with_ttl(ttl);
    let ns = namespace();
    let addr = match &single.topology {
        Topology::Single(c) => c.hosts[0].clone(),
        _ => unreachable!(),
    };
    let user = AclUser::create(&addr, &ns, &commands(&[NOTIFY_COMMANDS])).await;
    let (_, config) = single_as(&single, &user);
    let mut shown = vec![format!("{config:?}")];
    let connect = |config: RedisConfig| {
        let options = options.clone();
        let ns = ns.clone();
        async move {
            let backend = Arc::new(RedisBackend::connect(config).await.unwrap());
            LockClient::with_options(backend, &ns, options).unwrap()
        }
    };
    let (locks, other) = (connect(config.clone()).await, connect(config.clone()).await);

    let probe = locks.mutex("stored").unwrap().lock().await.unwrap();
    let mut admin = common::connect(&addr).await.unwrap();
    let stored: String = redis::cmd("GET")
        .arg(format!("{{{ns}/stored}}"))
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(
        stored.contains(&lockkit_core::backend::lease_of(&probe).owner().expose_hex()),
        "the server stores {stored:?}, not the token this test searches for"
    );
    let mut secrets = owner_token_spellings(lockkit_core::backend::lease_of(&probe).owner());
    assert!(probe.release().await.unwrap());

    let (tokens, more) = exercise(&locks, &other, ttl).await;
    secrets.extend(tokens);
    shown.extend(more);

    let mut wrong = config.clone();
    wrong.password = Some(format!("wrong-{:032x}", rand::random::<u128>()));
    let err = RedisBackend::connect(wrong.clone()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert!(!err.is_retryable(), "{err}");
    shown.push(format!("{err} {err:?} {wrong:?}"));
    let outside =
        LockClient::with_options(locks.backend().clone(), "elsewhere", options.clone()).unwrap();
    let err = outside.mutex("job").unwrap().try_lock().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    shown.push(format!("{err} {err:?}"));
    let mut passwords = vec![user.password.clone(), wrong.password.clone().unwrap()];

    let Topology::Redlock(redlock_config) = &redlock.topology else {
        unreachable!()
    };
    let (users, redlock_config) = redlock_users(redlock_config, &ns).await;
    shown.push(format!("{redlock_config:?}"));
    let redlock_locks = |config: RedlockConfig| {
        let options = options.clone();
        let ns = ns.clone();
        async move {
            let backend = Arc::new(RedlockBackend::connect(config).await.unwrap());
            LockClient::with_options(backend, &ns, options).unwrap()
        }
    };
    let (tokens, more) = exercise(
        &redlock_locks(redlock_config.clone()).await,
        &redlock_locks(redlock_config.clone()).await,
        Duration::from_millis(1000),
    )
    .await;
    secrets.extend(tokens);
    shown.extend(more);
    for user in &users {
        assert_eq!(user.denials().await, []);
    }
    let mut wrong = redlock_config.clone();
    wrong.password = Some(format!("wrong-{:032x}", rand::random::<u128>()));
    let err = RedlockBackend::connect(wrong.clone()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    shown.push(format!("{err} {err:?} {wrong:?}"));
    passwords.push(redlock_config.password.clone().unwrap());
    passwords.push(wrong.password.clone().unwrap());

    secrets.extend(passwords.iter().flat_map(|p| secret_spellings(p)));
    assert_nothing_shown(&capture, &ns, &shown, &secrets);
}
