//! What the conformance suite cannot see of Redis semaphores: the keys vanish by their own TTL
//! when nobody releases, the server holds owner digests and never owner tokens, a repeated
//! attempt of one owner takes no second permit, the minimal ACL (plus the semaphore's
//! commands) suffices, and Redlock refuses semaphores saying why.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::backend::{AcquireRequest, Attempt, Hold, OwnerToken, SharedBackend};
use lockkit_core::testing::owner_token_spellings;
use lockkit_core::{ErrorKind, FencingToken, LockClient, LockKey, LockOptions};
use lockkit_redis::{RedisBackend, RedisConfig};
use redis::aio::MultiplexedConnection;

fn namespace() -> String {
    format!("lk-test-{:08x}", rand::random::<u32>())
}

/// The semaphore keys of `key`, as the crate documents them.
fn holders_key(key: &LockKey) -> String {
    format!("{}:sem:holders", common::lock_key(key))
}

fn tokens_key(key: &LockKey) -> String {
    format!("{}:sem:tokens", common::lock_key(key))
}

/// One attempt of `owner` at a permit of `key`'s semaphore of `permits`, straight to the
/// backend: nothing renews or releases what it gets.
async fn attempt(
    backend: &SharedBackend,
    key: &LockKey,
    owner: &OwnerToken,
    permits: u32,
    ttl: Duration,
) -> Option<FencingToken> {
    let request = AcquireRequest::new(key.clone(), owner.clone(), ttl, false)
        .with_hold(Hold::Permit { permits });
    match backend.try_acquire(&request).await.unwrap() {
        Attempt::Granted(grant) => Some(grant.fencing_token),
        Attempt::Contended(_) => None,
    }
}

/// The namespace's keys on `con`, but the fence counters (which outlive their holders by
/// design, with a TTL of their own).
async fn keys_but_fences(con: &mut MultiplexedConnection, ns: &str) -> Vec<String> {
    let mut keys = common::keys_of(con, ns).await.unwrap();
    keys.retain(|k| !k.ends_with(":fence"));
    keys.sort();
    keys
}

async fn pttl(con: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(con).await.unwrap()
}

/// Two holders that crash (never renew, never release), one with a short TTL and one with a
/// longer: every key of the semaphore lives as long as the longer holder, with no call to the
/// server after the grants, and then vanishes by its own TTL; the fence counter keeps a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_semaphore_vanishes_after_its_longest_holder_ttl() {
    let Some(harness) = common::single().await else {
        return;
    };
    let backend = harness.backend().await.unwrap();
    let ns = namespace();
    let key = LockKey::new(&ns, "crashed").unwrap();
    let (short, long) = (Duration::from_millis(500), Duration::from_secs(4));
    assert!(
        attempt(&backend, &key, &OwnerToken::generate().unwrap(), 3, short)
            .await
            .is_some()
    );
    let long_sent = Instant::now();
    assert!(
        attempt(&backend, &key, &OwnerToken::generate().unwrap(), 3, long)
            .await
            .is_some()
    );
    drop(backend);

    let mut con = harness.servers().await.unwrap().remove(0);
    let keys = keys_but_fences(&mut con, &ns).await;
    assert_eq!(
        keys.len(),
        3,
        "holders, tokens and permits while held: {keys:?}"
    );
    for k in &keys {
        let left = pttl(&mut con, k).await;
        assert!(
            left > short.as_millis() as i64 && left <= long.as_millis() as i64,
            "{k} lives {left} ms, not as long as the longer holder"
        );
    }
    let fence = format!("{}:sem:fence", common::lock_key(&key));
    assert!(pttl(&mut con, &fence).await > long.as_millis() as i64);

    let deadline = long_sent + long + Duration::from_secs(10);
    let gone_at = loop {
        if keys_but_fences(&mut con, &ns).await.is_empty() {
            break Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "the semaphore's keys outlived their TTL"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        gone_at - long_sent >= long,
        "the keys vanished after {:?}, before the longer holder's TTL",
        gone_at - long_sent
    );
    assert!(
        pttl(&mut con, &fence).await > 0,
        "the fence counter has no TTL"
    );
}

/// The holders ZSET and the tokens HASH name each holder by the digest of its owner token;
/// no spelling of the token itself is stored in any key of the semaphore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_holds_owner_digests_never_owner_tokens() {
    let Some(harness) = common::single().await else {
        return;
    };
    let ns = namespace();
    let locks = LockClient::with_options(
        harness.backend().await.unwrap(),
        &ns,
        LockOptions::default(),
    )
    .unwrap();
    let pool = locks.semaphore("digests", 2).unwrap();
    let permit = pool.acquire().await.unwrap();
    let key = locks.key("digests").unwrap();
    let owner = lockkit_core::backend::lease_of(permit.as_guard()).owner();

    let mut con = harness.servers().await.unwrap().remove(0);
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(holders_key(&key))
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(members, [owner.digest_hex()]);
    let tokens: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(tokens_key(&key))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        tokens,
        [(owner.digest_hex(), permit.fencing_token().to_string())]
    );
    let mut stored = String::new();
    for k in common::keys_of(&mut con, &ns).await.unwrap() {
        let dump: Vec<u8> = redis::cmd("DUMP")
            .arg(&k)
            .query_async(&mut con)
            .await
            .unwrap();
        stored.push_str(&format!("{k} {}\n", String::from_utf8_lossy(&dump)));
    }
    for secret in owner_token_spellings(owner) {
        assert!(
            !stored.contains(&secret),
            "a spelling of the owner token is stored on the server"
        );
    }
    assert!(permit.release().await.unwrap());
}

/// An attempt sent again by the same owner (its first reply lost, say) finds its grant, with
/// the same fencing token and its expiry extended, instead of taking a second permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_attempt_of_one_owner_takes_no_second_permit() {
    let Some(harness) = common::single().await else {
        return;
    };
    let backend = harness.backend().await.unwrap();
    let ns = namespace();
    let key = LockKey::new(&ns, "repeat").unwrap();
    let ttl = Duration::from_secs(5);
    let owner = OwnerToken::generate().unwrap();
    let first = attempt(&backend, &key, &owner, 2, ttl).await.unwrap();
    let again = attempt(&backend, &key, &owner, 2, ttl).await.unwrap();
    assert_eq!(again, first, "the repeated attempt got another grant");

    let mut con = harness.servers().await.unwrap().remove(0);
    let holders: i64 = redis::cmd("ZCARD")
        .arg(holders_key(&key))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(holders, 1, "one owner holds {holders} permits");
    let other = OwnerToken::generate().unwrap();
    let second = attempt(&backend, &key, &other, 2, ttl).await;
    assert!(
        second.is_some_and(|t| t > first),
        "the second permit was not free"
    );
    let third = attempt(&backend, &key, &OwnerToken::generate().unwrap(), 2, ttl).await;
    assert_eq!(third, None, "a third permit of two was granted");

    for owner in [owner, other] {
        let request = AcquireRequest::new(key.clone(), owner, ttl, false)
            .with_hold(Hold::Permit { permits: 2 });
        backend.abandon(&request).await.unwrap();
    }
    assert_eq!(keys_but_fences(&mut con, &ns).await, Vec::<String>::new());
}

/// Under the README's minimal ACL plus the semaphore's commands, permits are taken, waited
/// for (woken by a release notification), renewed and given back, and the server logs no
/// denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_work_under_the_minimal_acl() {
    let Some(harness) = common::single().await else {
        return;
    };
    let common::Topology::Single(config) = &harness.topology else {
        panic!("the single harness runs on one server");
    };
    let ns = namespace();
    let commands: Vec<&str> = [common::LOCKKIT_COMMANDS, common::NOTIFY_COMMANDS].concat();
    let user = common::AclUser::create(&config.hosts[0], &ns, &commands).await;
    let mut limited: RedisConfig = config.clone();
    limited.username = Some(user.name.clone());
    limited.password = Some(user.password.clone());
    let ttl = Duration::from_millis(600);
    let client = || async {
        LockClient::with_options(
            Arc::new(RedisBackend::connect(limited.clone()).await.unwrap()),
            &ns,
            LockOptions::default().with_ttl(ttl),
        )
        .unwrap()
    };
    let (a, b) = (client().await, client().await);
    let held = a.semaphore("acl", 1).unwrap().acquire().await.unwrap();
    let waiter = b.semaphore("acl", 1).unwrap();
    let waiting = tokio::spawn(async move { waiter.acquire().await });
    tokio::time::sleep(ttl * 2).await;
    assert!(!waiting.is_finished(), "a full semaphore granted a waiter");
    assert!(
        held.is_held().await.unwrap(),
        "the renewed permit is not held"
    );
    assert!(held.release().await.unwrap());
    let granted = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter was not woken")
        .unwrap()
        .unwrap();
    assert!(granted.release().await.unwrap());
    assert_eq!(user.denials().await, []);
}

/// Redlock refuses semaphores at creation, and a request sent to it directly, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_semaphores_and_says_why() {
    let Some(harness) = common::redlock().await else {
        return;
    };
    let backend = harness.backend().await.unwrap();
    let ns = namespace();
    let locks = LockClient::with_options(backend.clone(), &ns, LockOptions::default()).unwrap();
    let err = locks.semaphore("pool", 2).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("majority"), "{err}");
    let request = AcquireRequest::new(
        LockKey::new(&ns, "pool").unwrap(),
        OwnerToken::generate().unwrap(),
        Duration::from_secs(1),
        false,
    )
    .with_hold(Hold::Permit { permits: 2 });
    let err = backend.try_acquire(&request).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("majority"), "{err}");
    let mut servers = harness.servers().await.unwrap();
    for con in &mut servers {
        assert_eq!(
            common::keys_of(con, &ns).await.unwrap(),
            Vec::<String>::new()
        );
    }
}

/// A request sent to the backend directly (past the core's check) with 0 permits or more
/// than `MAX_PERMITS` is refused as invalid, and leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_count_out_of_range_is_refused_by_the_backend_too() {
    let Some(harness) = common::single().await else {
        return;
    };
    let backend = harness.backend().await.unwrap();
    let ns = namespace();
    for permits in [0, lockkit_core::MAX_PERMITS + 1] {
        let request = AcquireRequest::new(
            LockKey::new(&ns, "range").unwrap(),
            OwnerToken::generate().unwrap(),
            Duration::from_secs(1),
            false,
        )
        .with_hold(Hold::Permit { permits });
        let err = backend.try_acquire(&request).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{permits}: {err}");
    }
    let mut con = harness.servers().await.unwrap().remove(0);
    assert_eq!(
        common::keys_of(&mut con, &ns).await.unwrap(),
        Vec::<String>::new()
    );
}

/// With `min_replicas`, a permit is granted once the replica acknowledged it; a grant fewer
/// replicas acknowledged (2 asked, the group has 1) is refused with `QuorumNotReached` and
/// given back, leaving nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_applies_to_permits() {
    let Some(harness) = common::sentinel().await else {
        return;
    };
    let common::Topology::Sentinel(config) = &harness.topology else {
        panic!("the sentinel harness runs on Sentinel");
    };
    let ns = namespace();
    let client = |min_replicas: u32| {
        let mut config = config.clone();
        config.min_replicas = min_replicas;
        // Room for a starved replica to acknowledge (the refusals below wait for all of it),
        // inside the request's own timeout.
        config.replica_timeout = Duration::from_secs(2);
        config.response_timeout = Duration::from_secs(5);
        let ns = ns.clone();
        async move {
            let backend = Arc::new(RedisBackend::connect(config).await.unwrap());
            LockClient::with_options(backend, &ns, LockOptions::default()).unwrap()
        }
    };
    let acked = client(1).await;
    let permit = acked
        .semaphore("replicated", 2)
        .unwrap()
        .try_acquire()
        .await;
    let permit = permit.unwrap().expect("a free permit was refused");
    assert!(permit.release().await.unwrap());

    let unacked = client(2).await;
    let refused = unacked
        .semaphore("replicated", 2)
        .unwrap()
        .try_acquire()
        .await;
    match refused {
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::QuorumNotReached { got: 1, need: 2 }),
            "{e}"
        ),
        Ok(granted) => panic!("granted with one replica of two: {granted:?}"),
    }
    let mut con = harness.servers().await.unwrap().remove(0);
    assert_eq!(keys_but_fences(&mut con, &ns).await, Vec::<String>::new());
}
