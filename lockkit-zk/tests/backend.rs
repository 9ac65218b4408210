//! The ZooKeeper backend's own behaviour against the ensemble: session expiry, a
//! blackholed connection, one wake-up per release, digest auth and ACLs, bounded connects.
//! None of these disturb the ensemble, so they run in parallel.

mod support;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use lockkit_core::backend::{AcquireRequest, Attempt, Lease, LockBackend, OwnerToken, Renewal};
use lockkit_core::testing::proxy::{Direction, Fault, FaultProxy};
use lockkit_core::{ErrorKind, LockClient, LockKey, LockOptions};
use lockkit_zk::{ZkBackend, ZkConfig};
use support::{TEST_CHROOT, admin, test_config, znodes_under};
use zookeeper_client as zk;

fn namespace() -> String {
    format!("lk-zk-{:08x}", rand::random::<u32>())
}

async fn client(config: &ZkConfig, ns: &str) -> (ZkBackend, LockClient) {
    client_with_ttl(config, ns, Duration::from_secs(2)).await
}

async fn client_with_ttl(config: &ZkConfig, ns: &str, ttl: Duration) -> (ZkBackend, LockClient) {
    let backend = ZkBackend::connect(config.clone()).await.expect("connect");
    let client = LockClient::with_options(
        Arc::new(backend.clone()),
        ns,
        LockOptions::default().with_ttl(ttl),
    )
    .expect("client");
    (backend, client)
}

/// The znode of a held lease under `root` (the chroot, or `""` for a client rooted there):
/// the child of `{root}/{ns}/{key}` whose name ends with the lease's handle (the sequence
/// number). Its name must not carry the owner token, in hex or in UUID form.
async fn lock_node(client: &zk::Client, root: &str, lease: &Lease) -> String {
    let parent = format!("{root}/{}/{}", lease.key().namespace(), lease.key().name());
    let sequence = lease.handle().expect("a zk lease has a handle");
    let children = client.list_children(&parent).await.expect("list the lock");
    let name = children
        .iter()
        .find(|c| c.ends_with(&format!("-lock-{sequence}")))
        .unwrap_or_else(|| panic!("no node for sequence {sequence} in {children:?}"));
    let hex = lease.owner().expose_hex();
    assert!(
        !name.replace('-', "").contains(&hex[..8]),
        "the node name shows the owner token"
    );
    format!("{parent}/{name}")
}

async fn assert_no_znodes(admin: &zk::Client, ns: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = znodes_under(admin, ns).await.expect("list");
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "znodes left under /{ns}: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// (1) The holder's session is expired by the server: its lost signal fires, the next waiter
/// is granted, and the stale holder's release leaves the new holder's node alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_session_fires_lost_and_grants_the_next_waiter() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (holder_backend, holder) = client(&config, &ns).await;
    let (_, waiter) = client(&config, &ns).await;
    let old = holder.mutex("expiring").unwrap().lock().await.unwrap();
    let waiting = tokio::spawn(async move {
        waiter
            .mutex("expiring")
            .unwrap()
            .lock_timeout(Duration::from_secs(20))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the waiter got a held lock");

    holder_backend.expire_session().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), old.lost())
        .await
        .expect("the expired holder's lost signal did not fire");
    let new = waiting
        .await
        .unwrap()
        .expect("the next waiter was not granted");
    assert!(new.fencing_token() > old.fencing_token());

    assert!(
        !old.is_held().await.unwrap(),
        "the stale holder still holds"
    );
    assert!(
        !old.release().await.unwrap(),
        "the stale release claimed the lock"
    );
    let node = lock_node(&admin, "", lockkit_core::backend::lease_of(&new)).await;
    assert!(
        admin.check_stat(&node).await.unwrap().is_some(),
        "the stale release deleted the new holder's node"
    );
    assert!(new.is_held().await.unwrap());
    // The expired backend opened a new session and works again.
    let info = holder.inspect("expiring").await.unwrap().expect("held");
    assert_eq!(info.fencing_token, new.fencing_token());
    assert!(new.release().await.unwrap());
    let again = holder
        .mutex("expiring")
        .unwrap()
        .lock_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(again.release().await.unwrap());
    assert_no_znodes(&admin, &ns).await;
}

/// (3) A holder whose connection is blackholed longer than the session timeout reports the
/// lock lost before the servers expire its session and grant the lock to another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_holder_reports_lost_before_anyone_else_is_granted() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let proxy = FaultProxy::start(&config.hosts)
        .await
        .expect("a fault proxy");
    let mut proxied = config.clone();
    proxied.hosts = proxy.hosts();
    let (_, holder) = client_with_ttl(&proxied, &ns, Duration::from_secs(60)).await;
    let (_, other) = client(&config, &ns).await;
    let held = holder.mutex("cut-off").unwrap().lock().await.unwrap();
    let granted_at = Arc::new(StdMutex::new(None));
    let waiting = {
        let granted_at = granted_at.clone();
        tokio::spawn(async move {
            let guard = other
                .mutex("cut-off")
                .unwrap()
                .lock_timeout(Duration::from_secs(30))
                .await;
            *granted_at.lock().unwrap() = Some(Instant::now());
            guard
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cut_at = Instant::now();
    proxy.set(Direction::Both, Fault::Blackhole);
    tokio::time::timeout(Duration::from_secs(20), held.lost())
        .await
        .expect("the cut-off holder's lost signal did not fire");
    let lost_at = Instant::now();
    assert!(
        granted_at.lock().unwrap().is_none(),
        "another client was granted before the holder knew it had lost the lock"
    );
    let new = waiting
        .await
        .unwrap()
        .expect("the other client was never granted");
    let granted_at = granted_at.lock().unwrap().expect("granted");
    assert!(lost_at < granted_at);
    eprintln!(
        "blackholed at 0: holder lost after {:?}, other client granted after {:?}",
        lost_at - cut_at,
        granted_at - cut_at
    );
    proxy.heal();
    assert!(!held.release().await.unwrap_or(false));
    assert!(new.release().await.unwrap());
    assert_no_znodes(&admin, &ns).await;
}

/// A disconnection that ends while the lock is still trusted is ridden out: the holder keeps
/// its lock and its lost signal stays quiet. 10 s session: a grant or renewal is trusted for
/// 3 s and renewed every second; the network goes silent for 0.8 s, then the stuck
/// connections are reset, so the client sees the disconnection, reconnects at once within the
/// session watcher's grace, and the next renewal succeeds before the validity runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnection_within_the_validity_keeps_the_lock() {
    let Some(mut config) = test_config() else {
        return;
    };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let proxy = FaultProxy::start(&config.hosts)
        .await
        .expect("a fault proxy");
    let direct = config.clone();
    config.hosts = proxy.hosts();
    config.session_timeout = Duration::from_secs(10);
    let (_, holder) = client_with_ttl(&config, &ns, Duration::from_secs(10)).await;
    let (_, other) = client(&direct, &ns).await;
    let held = holder.mutex("flaky").unwrap().lock().await.unwrap();
    proxy.set(Direction::Both, Fault::Blackhole);
    tokio::time::sleep(Duration::from_millis(800)).await;
    proxy.heal();
    proxy.reset();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !held.is_held().await.unwrap_or(false) {
        assert!(Instant::now() < deadline, "the holder did not reconnect");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Three more renewal periods: renewals go on over the new connection.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !held.is_lost(),
        "a disconnection within the validity fired lost"
    );
    assert!(
        other
            .mutex("flaky")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
            .is_none()
    );
    assert!(held.release().await.unwrap());
    assert_no_znodes(&admin, &ns).await;
}

/// A backend reaching the ensemble through a fault proxy, and a request for a key whose
/// parent exists and is kept (a persistent child), so that a test sees only its own nodes.
struct Queue {
    admin: zk::Client,
    ns: String,
    proxy: FaultProxy,
    backend: ZkBackend,
    request: AcquireRequest,
    parent: String,
}

async fn key_behind_a_proxy(name: &str) -> Option<Queue> {
    let mut config = test_config()?;
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let proxy = FaultProxy::start(&config.hosts)
        .await
        .expect("a fault proxy");
    config.hosts = proxy.hosts();
    config.request_timeout = Duration::from_millis(500);
    let backend = ZkBackend::connect(config).await.expect("connect");
    let request = AcquireRequest::new(
        LockKey::new(&ns, name).expect("a valid key"),
        OwnerToken::generate().expect("an owner token"),
        Duration::from_secs(10),
        true,
    );
    // First use of the key: create the parent with an ordinary attempt, then give it back.
    assert!(matches!(
        backend.try_acquire(&request).await.expect("an attempt"),
        Attempt::Granted(_)
    ));
    backend.abandon(&request).await.expect("abandon");
    let parent = format!("/{ns}/{name}");
    admin
        .create(
            &format!("{parent}/keep-parent"),
            &[],
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .expect("the kept child");
    Some(Queue {
        admin,
        ns,
        proxy,
        backend,
        request,
        parent,
    })
}

/// A create whose reply is lost (the request reached the ensemble, the answer did not
/// come back) leaves a node; the next attempt of the same acquisition finds it by the digest
/// of the owner token in its name instead of queueing a second one behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_lost_create_reply_finds_its_own_node() {
    let Some(Queue {
        admin,
        ns,
        proxy,
        backend,
        request,
        parent,
    }) = key_behind_a_proxy("lost-reply").await
    else {
        return;
    };
    proxy.set(Direction::Replies, Fault::Drop);
    let err = backend
        .try_acquire(&request)
        .await
        .expect_err("the reply was dropped");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !admin
        .list_children(&parent)
        .await
        .unwrap()
        .iter()
        .any(|c| c.contains("-lock-"))
    {
        assert!(
            Instant::now() < deadline,
            "the create never reached the ensemble"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.heal();

    let deadline = Instant::now() + Duration::from_secs(15);
    let grant = loop {
        match backend.try_acquire(&request).await {
            Ok(Attempt::Granted(grant)) => break grant,
            Ok(Attempt::Contended(_)) => panic!("the retry queued behind its own node"),
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the retry failed: {e}"),
        }
    };
    let nodes: Vec<String> = admin
        .list_children(&parent)
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.contains("-lock-"))
        .collect();
    assert_eq!(nodes.len(), 1, "an orphan was left: {nodes:?}");
    assert!(nodes[0].ends_with(grant.handle.as_deref().unwrap()));
    backend.abandon(&request).await.unwrap();
    admin
        .delete(&format!("{parent}/keep-parent"), None)
        .await
        .unwrap();
    drop(backend);
    assert_no_znodes(&admin, &ns).await;
}

/// (4) Fifty waiters queue on one key; every release wakes exactly one of them, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_release_wakes_exactly_one_of_fifty_waiters() {
    const WAITERS: u64 = 50;
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, holder) = client(&config, &ns).await;
    let waiters_backend = ZkBackend::connect(config.clone()).await.unwrap();
    // Only a watch can wake a waiter: the polling cap is far beyond the test.
    let waiters = LockClient::with_options(
        Arc::new(waiters_backend.clone()),
        &ns,
        LockOptions::default().with_backoff(Duration::from_millis(1), Duration::from_secs(600)),
    )
    .unwrap();
    let first = holder.mutex("herd").unwrap().lock().await.unwrap();
    let wakes_at_grant = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..WAITERS {
        let (waiters, backend, wakes) = (
            waiters.clone(),
            waiters_backend.clone(),
            wakes_at_grant.clone(),
        );
        tasks.spawn(async move {
            let guard = waiters.mutex("herd").unwrap().lock().await.unwrap();
            wakes.lock().unwrap().push(backend.watch_events());
            tokio::time::sleep(Duration::from_millis(2)).await;
            assert!(guard.release().await.unwrap());
        });
    }
    let parent = format!("/{ns}/herd");
    let deadline = Instant::now() + Duration::from_secs(30);
    while admin.list_children(&parent).await.map_or(0, |c| c.len()) < WAITERS as usize + 1 {
        assert!(Instant::now() < deadline, "the waiters did not all queue");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let every waiter set its watch on its predecessor.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        waiters_backend.watch_events(),
        0,
        "a waiter woke while nothing changed"
    );
    assert!(first.release().await.unwrap());
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let wakes = wakes_at_grant.lock().unwrap().clone();
    let expected: Vec<u64> = (1..=WAITERS).collect();
    assert_eq!(
        wakes, expected,
        "watch events seen by each grant, in grant order"
    );
    assert_eq!(waiters_backend.watch_events(), WAITERS);
    assert_no_znodes(&admin, &ns).await;
}

/// (6) Wrong digest credentials are refused with `Auth`, and a client without credentials
/// can neither list nor delete a held lock node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_auth_and_acls_protect_the_locks() {
    let Some(mut config) = test_config() else {
        return;
    };
    config.chroot = format!("/lockkit-auth-{:08x}", rand::random::<u32>());
    config.username = Some("lockkit".into());
    config.password = Some("right-password".into());
    let ns = namespace();
    let (_, owner) = client(&config, &ns).await;
    let guard = owner.mutex("guarded").unwrap().lock().await.unwrap();

    let mut wrong = config.clone();
    wrong.password = Some("wrong-password".into());
    let err = ZkBackend::connect(wrong)
        .await
        .expect_err("wrong password admitted");
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    assert!(!format!("{err} {err:?}").contains("password"), "{err:?}");
    let debug = format!("{:?} {:?}", guard, owner.backend());
    let owner_token = lockkit_core::backend::lease_of(&guard).owner().expose_hex();
    assert!(!debug.contains(&owner_token[..8]), "{debug}");
    assert!(!debug.contains("right-password"), "{debug}");

    let stranger = zk::Client::connect(&config.hosts.join(",")).await.unwrap();
    let root = admin_with_credentials(&config).await;
    let node = lock_node(
        &root,
        &config.chroot,
        lockkit_core::backend::lease_of(&guard),
    )
    .await;
    let parent = node.rsplit_once('/').unwrap().0.to_owned();
    assert_eq!(stranger.delete(&node, None).await, Err(zk::Error::NoAuth));
    assert_eq!(
        stranger.list_children(&parent).await,
        Err(zk::Error::NoAuth)
    );
    assert!(guard.is_held().await.unwrap(), "a stranger broke the lock");
    assert!(guard.release().await.unwrap());

    let admin = admin(&config, &config.chroot).await;
    assert_no_znodes(&admin, &ns).await;
    let _ = admin.delete(&format!("/{ns}"), None).await;
    drop(admin);
    root.delete(&config.chroot, None).await.unwrap();
}

async fn admin_with_credentials(config: &ZkConfig) -> zk::Client {
    zk::Client::connector()
        .with_auth("digest", b"lockkit:right-password")
        .connect(&config.hosts.join(","))
        .await
        .expect("admin with credentials")
}

/// No server listening: connect fails with `Unavailable` within its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_ensemble_is_unavailable_within_the_timeout() {
    let mut config = ZkConfig::default();
    config.hosts = vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()];
    config.connect_timeout = Duration::from_secs(2);
    let started = Instant::now();
    let err = ZkBackend::connect(config)
        .await
        .expect_err("nothing listens");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

/// A release that cannot reach the ensemble fails, and still forgets the acquisition: the
/// backend does not keep one entry per failed release for as long as it lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_release_forgets_the_acquisition() {
    let Some(mut config) = test_config() else {
        return;
    };
    let proxy = FaultProxy::start(&config.hosts)
        .await
        .expect("a fault proxy");
    config.hosts = proxy.hosts();
    config.request_timeout = Duration::from_millis(300);
    let ns = namespace();
    let (backend, client) = client_with_ttl(&config, &ns, Duration::from_secs(60)).await;
    let guard = client.mutex("unreleased").unwrap().lock().await.unwrap();
    assert!(
        format!("{backend:?}").contains("acquisitions: 1"),
        "{backend:?}"
    );
    proxy.set(Direction::Both, Fault::Blackhole);
    guard
        .release()
        .await
        .expect_err("the ensemble was unreachable");
    assert!(
        format!("{backend:?}").contains("acquisitions: 0"),
        "{backend:?}"
    );
}

/// A grant and a renewal are trusted for 0.3 of the session timeout (with the default grace),
/// however long the lock's ttl: long enough to renew in time, short enough that the leader
/// cannot have expired the session while the holder still trusts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_and_renewals_are_trusted_for_part_of_the_session_timeout() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let backend = ZkBackend::connect(config).await.unwrap();
    let bound = backend.session_timeout().mul_f64(0.3);
    let ttl = Duration::from_secs(60);
    let request = AcquireRequest::new(
        LockKey::new(&ns, "trusted").unwrap(),
        OwnerToken::generate().unwrap(),
        ttl,
        true,
    );
    let Attempt::Granted(grant) = backend.try_acquire(&request).await.unwrap() else {
        panic!("a free lock was not granted");
    };
    assert!(
        grant.valid_for <= bound,
        "granted for {:?}, beyond {bound:?}",
        grant.valid_for
    );
    let lease = Lease::new(
        request.key.clone(),
        request.owner.clone(),
        grant.fencing_token,
        ttl,
        Instant::now(),
    )
    .with_handle(grant.handle.clone().unwrap());
    match backend.renew(&lease).await.unwrap() {
        Renewal::Extended(valid_for) => {
            assert!(
                valid_for <= bound,
                "renewed for {valid_for:?}, beyond {bound:?}"
            );
        }
        Renewal::Lost => panic!("the holder's renewal was refused"),
    }
    assert!(backend.release(&lease).await.unwrap());
    assert_no_znodes(&admin, &ns).await;
}

/// The lock nodes under `parent` whose name starts with `prefix`.
async fn nodes_named(admin: &zk::Client, parent: &str, prefix: &str) -> Vec<String> {
    // The admin's server may be a follower behind the one the backend wrote through.
    admin.sync(parent).await.expect("sync the lock");
    let mut nodes: Vec<String> = admin
        .list_children(parent)
        .await
        .expect("list the lock")
        .into_iter()
        .filter(|c| c.starts_with(prefix))
        .collect();
    nodes.sort();
    nodes
}

/// A create whose reply was lost can commit after the retry looked, leaving a second node
/// with the acquisition's own name and a higher sequence (made here by a second client with
/// that name). The next round of the acquisition deletes it, a stray that appears while the
/// lock is held goes with the release, and nothing is left to block the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strays_with_the_acquisitions_own_name_are_deleted() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, holder) = client(&config, &ns).await;
    let backend = ZkBackend::connect(config).await.unwrap();
    let first = holder.mutex("strays").unwrap().lock().await.unwrap();
    let ttl = Duration::from_secs(10);
    let request = AcquireRequest::new(
        LockKey::new(&ns, "strays").unwrap(),
        OwnerToken::generate().unwrap(),
        ttl,
        true,
    );
    assert!(matches!(
        backend.try_acquire(&request).await.unwrap(),
        Attempt::Contended(_)
    ));
    let parent = format!("/{ns}/strays");
    let holders = format!(
        "-lock-{}",
        lockkit_core::backend::lease_of(&first).handle().unwrap()
    );
    admin.sync(&parent).await.expect("sync the lock");
    let ours: Vec<String> = admin
        .list_children(&parent)
        .await
        .unwrap()
        .into_iter()
        .filter(|c| !c.ends_with(&holders))
        .collect();
    assert_eq!(ours.len(), 1, "{ours:?}");
    let prefix = ours[0][..ours[0].rfind("-lock-").unwrap() + "-lock-".len()].to_owned();
    let stray = || async {
        admin
            .create(
                &format!("{parent}/{prefix}"),
                &[],
                &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
            )
            .await
            .unwrap();
    };

    stray().await;
    assert_eq!(nodes_named(&admin, &parent, &prefix).await.len(), 2);
    assert!(matches!(
        backend.try_acquire(&request).await.unwrap(),
        Attempt::Contended(_)
    ));
    assert_eq!(
        nodes_named(&admin, &parent, &prefix).await,
        ours,
        "the waiting round left the stray"
    );

    assert!(first.release().await.unwrap());
    let Attempt::Granted(grant) = backend.try_acquire(&request).await.unwrap() else {
        panic!("the next in line was not granted");
    };
    stray().await;
    let lease = Lease::new(
        request.key.clone(),
        request.owner.clone(),
        grant.fencing_token,
        ttl,
        Instant::now(),
    )
    .with_handle(grant.handle.clone().unwrap());
    assert!(backend.release(&lease).await.unwrap());
    assert_eq!(
        nodes_named(&admin, &parent, &prefix).await,
        Vec::<String>::new(),
        "the release left the stray"
    );
    assert_no_znodes(&admin, &ns).await;
}

/// The node of a create whose reply was lost is removed in the background when the clean-up
/// after the failed acquisition cannot reach the ensemble either (its reply is lost too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_create_is_swept_when_the_clean_up_fails() {
    let Some(Queue {
        admin,
        ns,
        proxy,
        backend,
        request,
        parent,
    }) = key_behind_a_proxy("swept").await
    else {
        return;
    };

    proxy.set(Direction::Replies, Fault::Drop);
    backend
        .try_acquire(&request)
        .await
        .expect_err("the reply was dropped");
    let deadline = Instant::now() + Duration::from_secs(5);
    while nodes_named(&admin, &parent, "_c_").await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the create never reached the ensemble"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    backend
        .abandon(&request)
        .await
        .expect_err("the clean-up's reply was dropped");
    proxy.heal();
    // The proxy dropped bytes of the stream: make the client reconnect.
    proxy.reset();

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = nodes_named(&admin, &parent, "_c_").await;
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lost create was left: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    admin
        .delete(&format!("{parent}/keep-parent"), None)
        .await
        .unwrap();
    drop(backend);
    assert_no_znodes(&admin, &ns).await;
}

/// A 10 ms TTL would have the renewal scheduler `sync` with the leader every few
/// milliseconds for each lock. It is raised to the documented minimum, so a lock held for a
/// second is renewed a handful of times, not hundreds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_below_the_minimum_is_raised_to_it() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let backend = ZkBackend::connect(config).await.expect("connect");
    let recording = Arc::new(lockkit_core::testing::Recording::new(Arc::new(backend)));
    let locks = LockClient::with_options(
        recording.clone(),
        &ns,
        LockOptions::default().with_ttl(Duration::from_millis(10)),
    )
    .expect("client");
    let guard = locks
        .mutex("short")
        .expect("key")
        .lock()
        .await
        .expect("lock");
    assert_eq!(guard.ttl(), lockkit_zk::MIN_TTL);
    let held_for = Duration::from_secs(1);
    tokio::time::sleep(held_for).await;
    assert!(!guard.is_lost());
    let renewals = recording.count("renew_many") + recording.count("renew");
    // A third of the 1 s validity apart: about three. A 10 ms TTL made it about 300.
    assert!(
        renewals <= 10,
        "{renewals} renewals in {held_for:?} for one lock"
    );
    assert!(guard.release().await.expect("release"));
    assert_no_znodes(&admin, &ns).await;
}

/// A backend dropped while a clean-up waits in the background (for a create whose reply came
/// too late) closes its session at once, and the session's nodes go with it: the clean-up
/// must not keep the backend, and its session, alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_backend_closes_its_session_with_clean_ups_pending() {
    let Some(Queue {
        admin,
        ns,
        proxy,
        backend,
        request,
        parent,
    }) = key_behind_a_proxy("dropped").await
    else {
        return;
    };
    proxy.set(
        Direction::Replies,
        Fault::Delay {
            base: Duration::from_millis(1500),
            jitter: Duration::ZERO,
        },
    );
    backend
        .try_acquire(&request)
        .await
        .expect_err("the reply came after the request timeout");
    let deadline = Instant::now() + Duration::from_secs(5);
    while nodes_named(&admin, &parent, "_c_").await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the create never reached the ensemble"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.heal();
    drop(backend);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left = nodes_named(&admin, &parent, "_c_").await;
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the node outlived its dropped backend (its session stayed open): {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The parent was in use when the backend was dropped, so its janitor left it: a container,
    // which the server removes on its own only every `znode.container.checkIntervalMs` (60 s).
    admin
        .delete(&format!("{parent}/keep-parent"), None)
        .await
        .unwrap();
    match admin.delete(&parent, None).await {
        Ok(()) | Err(zk::Error::NoNode) => {}
        Err(e) => panic!("delete the parent: {e}"),
    }
    assert_no_znodes(&admin, &ns).await;
}
