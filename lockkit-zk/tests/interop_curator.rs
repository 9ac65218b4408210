//! Interop with Apache Curator (docs/interop.md): a Java service that takes Curator 5's
//! `InterProcessMutex` on `/{namespace}/{key}` under lockkit's chroot and lockkit clients
//! locking `key` in `namespace` exclude each other, agree on who is next, and share one
//! sequence of fencing tokens (the czxid of the holder's node).
//!
//! Needs the ensemble (`LOCKKIT_TEST_ZK_URL`), `java` and `javac` (`default-jdk-headless`) and
//! Curator's jar (`libcurator-recipes-java`, or `LOCKKIT_TEST_CURATOR_JAR`); without one of
//! them the test skips with a notice, or fails when `LOCKKIT_REQUIRE_BACKENDS=1`.

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::testing::sections::Sections;
use lockkit_core::{LockClient, LockOptions};
use lockkit_zk::{ZkBackend, ZkConfig};
use support::curator::{Curator, compile, curator_classpath};
use support::server::{self, ZkServer};
use support::{TEST_CHROOT, admin, test_config, znodes_under};
use zookeeper_client as zk;

/// How long each critical section holds the lock: long enough that an overlap is all but
/// certain to lose an update.
const HOLD: Duration = Duration::from_millis(20);
const CURATOR_SECTIONS: u64 = 20;
const LOCKKIT_CONTENDERS: u64 = 2;
const SECTIONS_EACH: u64 = 10;
/// The private server of the chroot test (this file's range: 21700-21749).
const PORTS: std::ops::Range<u16> = 21700..21750;

/// What a Curator user passes to lock what lockkit calls `key` in `namespace`
/// (docs/interop.md): the connect string with lockkit's chroot, and the path
/// `/{namespace}/{key}`. Curator does not create a chroot that is missing: lockkit does.
fn curator_target(config: &ZkConfig, namespace: &str, key: &str) -> (String, String) {
    (
        format!("{}{}", config.hosts.join(","), config.chroot),
        format!("/{namespace}/{key}"),
    )
}

/// The same lock for a Curator client without a chroot: `{chroot}/{namespace}/{key}`.
/// Curator then creates a missing chroot, as a container node (see the chroot test).
fn curator_absolute_path(config: &ZkConfig, namespace: &str, key: &str) -> String {
    format!("{}/{namespace}/{key}", config.chroot)
}

async fn lockkit_client(config: &ZkConfig, namespace: &str) -> LockClient {
    let backend = ZkBackend::connect(config.clone()).await.expect("connect");
    LockClient::with_options(Arc::new(backend), namespace, LockOptions::default()).expect("client")
}

/// Curator's `InterProcessMutex` on `/{namespace}/{key}`, connected with lockkit's chroot,
/// and two lockkit clients on `key` run 40 critical sections between them: never two at
/// once (no section finds another running, no update of the shared counter is lost), the
/// lock passes between Java and lockkit again and again, and the fencing tokens (lockkit's,
/// and the czxid of Curator's node) strictly increase in the order the sections ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_interprocess_mutex_and_lockkit_exclude_each_other() {
    let Some(config) = test_config() else { return };
    let Some(classpath) = curator_classpath() else {
        return;
    };
    let started = Instant::now();
    let namespace = format!("lk-curator-{:08x}", rand::random::<u32>());
    let key = "shared-job";
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("interop-{namespace}"));
    let classes = tmp.join("classes");
    compile(&classpath, &classes);
    let sections = Sections::new(&tmp, "sections");

    // lockkit first: it creates the chroot should it be missing, Curator would not.
    let mut contenders = Vec::new();
    for i in 1..=LOCKKIT_CONTENDERS {
        contenders.push((i, lockkit_client(&config, &namespace).await));
    }
    let (connect, path) = curator_target(&config, &namespace, key);
    let args = [
        connect,
        path,
        CURATOR_SECTIONS.to_string(),
        HOLD.as_millis().to_string(),
        sections.dir().display().to_string(),
        "curator".to_owned(),
    ];
    let mut curator = Curator::start(&classpath, &classes, &args);
    curator.go();
    let tasks: Vec<_> = contenders
        .into_iter()
        .map(|(i, client)| {
            let sections = sections.clone();
            tokio::spawn(async move {
                let mutex = client.mutex(key).expect("key");
                for _ in 0..SECTIONS_EACH {
                    let guard = mutex
                        .lock_timeout(Duration::from_secs(60))
                        .await
                        .expect("lockkit granted");
                    sections
                        .run(&format!("lockkit-{i}"), guard.fencing_token().get(), HOLD)
                        .await;
                    assert!(guard.release().await.expect("release"), "held to the end");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a lockkit contender");
    }
    curator.finish(Duration::from_secs(60)).await;

    let outcome = sections.outcome();
    outcome.assert_exclusive(CURATOR_SECTIONS + LOCKKIT_CONTENDERS * SECTIONS_EACH, 4);
    eprintln!(
        "curator interop: {} sections, the lock passed between Curator and lockkit {} times, {:?} in all (javac and JVM start included)",
        outcome.history.len(),
        outcome.handovers_between_sides(),
        started.elapsed()
    );

    let admin = admin(&config, TEST_CHROOT).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<String> = znodes_under(&admin, &namespace)
            .await
            .expect("list")
            .into_iter()
            .filter(|node| node.matches('/').count() > 2)
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "lock nodes left: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// lockkit's semaphore of a name queues under `semaphore`, a child of the lock's parent that
/// Curator sorts after every lock node (it compares what follows `lock-`, or the whole name):
/// with two of its permits held, Curator's `InterProcessMutex` and a lockkit client on the
/// lock of the same name still exclude each other with increasing tokens, and the permits
/// stay held throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_of_the_same_name_does_not_disturb_curators_mutex() {
    const SECTIONS: u64 = 10;
    let Some(config) = test_config() else { return };
    let Some(classpath) = curator_classpath() else {
        return;
    };
    let namespace = format!("lk-curator-sem-{:08x}", rand::random::<u32>());
    let key = "shared-name";
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("interop-{namespace}"));
    let classes = tmp.join("classes");
    compile(&classpath, &classes);
    let sections = Sections::new(&tmp, "sections");
    let holder = lockkit_client(&config, &namespace).await;
    let semaphore = holder.semaphore(key, 2).expect("semaphore");
    let first = semaphore.acquire_timeout(Duration::from_secs(10)).await;
    let second = semaphore.acquire_timeout(Duration::from_secs(10)).await;
    let permits = [first.expect("a permit"), second.expect("a permit")];

    let contender = lockkit_client(&config, &namespace).await;
    let (connect, path) = curator_target(&config, &namespace, key);
    let args = [
        connect,
        path,
        SECTIONS.to_string(),
        HOLD.as_millis().to_string(),
        sections.dir().display().to_string(),
        "curator".to_owned(),
    ];
    let mut curator = Curator::start(&classpath, &classes, &args);
    // lockkit holds first and Curator's first acquisition queues behind it, so the lock
    // passes between the sides however slowly a loaded machine runs the JVM's first steps
    // (before, lockkit once ran all its sections before Curator asked).
    let mutex = contender.mutex(key).expect("key");
    let mut first = Some(
        mutex
            .lock_timeout(Duration::from_secs(60))
            .await
            .expect("lockkit granted"),
    );
    let admin = admin(&config, TEST_CHROOT).await;
    let before = znodes_under(&admin, &namespace)
        .await
        .expect("znodes")
        .len();
    curator.go();
    let by = Instant::now() + Duration::from_secs(60);
    while znodes_under(&admin, &namespace)
        .await
        .expect("znodes")
        .len()
        <= before
    {
        assert!(Instant::now() < by, "Curator did not queue for the lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..SECTIONS {
        let guard = match first.take() {
            Some(guard) => guard,
            None => mutex
                .lock_timeout(Duration::from_secs(60))
                .await
                .expect("lockkit granted"),
        };
        sections
            .run("lockkit", guard.fencing_token().get(), HOLD)
            .await;
        assert!(guard.release().await.expect("release"), "held to the end");
    }
    curator.finish(Duration::from_secs(60)).await;
    sections.outcome().assert_exclusive(2 * SECTIONS, 2);
    for permit in permits {
        assert!(
            permit.is_held().await.expect("is_held"),
            "a permit was lost"
        );
        assert!(permit.release().await.expect("release"));
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// docs/interop.md, "The chroot": Curator creates missing parents as container nodes, and
/// ZooKeeper deletes an empty container that once had children. When a Curator service is
/// the first to use lockkit's chroot, the chroot is such a container; once the last lock
/// under it is gone the server deletes it. A lockkit client connected before that still
/// takes the lock: it creates the chroot again, as the persistent node it creates at session
/// start, on the session it has. On a private server (ports 21700-21749) that checks its
/// containers every 100 ms instead of 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chroot_that_curator_created_and_zookeeper_deleted_does_not_stop_lockkit() {
    if !server::installed() {
        return;
    }
    let Some(classpath) = curator_classpath() else {
        return;
    };
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("interop-chroot-{:08x}", rand::random::<u32>()));
    let (_server, port) = tokio::task::block_in_place(|| {
        ZkServer::standalone_with(
            &tmp.join("zk"),
            PORTS,
            &["-Dznode.container.checkIntervalMs=100"],
        )
    });
    let hosts = format!("127.0.0.1:{port}");
    let classes = tmp.join("classes");
    compile(&classpath, &classes);
    let sections = Sections::new(&tmp, "sections");
    let chroot = "/lk-interop";
    let mut config = ZkConfig::from_url(&format!("zk://{hosts}{chroot}")).expect("url");
    config.session_timeout = Duration::from_secs(4);
    let (namespace, key) = ("ns", "job");
    let args = [
        hosts.clone(),
        curator_absolute_path(&config, namespace, key),
        "1".to_owned(),
        "1500".to_owned(),
        sections.dir().display().to_string(),
        "curator".to_owned(),
    ];
    let mut curator = Curator::start(&classpath, &classes, &args);
    curator.go();
    let admin = zk::Client::connect(&hosts).await.expect("admin client");
    let lock_parent = format!("{chroot}/{namespace}/{key}");
    let by = Instant::now() + Duration::from_secs(20);
    while admin
        .list_children(&lock_parent)
        .await
        .map_or(true, |c| c.is_empty())
    {
        assert!(Instant::now() < by, "Curator did not lock {lock_parent}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let client = lockkit_client(&config, namespace).await;
    let mutex = client.mutex(key).expect("key");
    let guard = mutex
        .lock_timeout(Duration::from_secs(20))
        .await
        .expect("granted after Curator");
    assert!(guard.release().await.expect("release"));
    curator.finish(Duration::from_secs(20)).await;
    let by = Instant::now() + Duration::from_secs(20);
    while admin.check_stat(chroot).await.expect("stat").is_some() {
        assert!(
            Instant::now() < by,
            "the server did not delete the chroot Curator created: the premise does not hold"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let again = mutex.lock_timeout(Duration::from_secs(10)).await;
    let _ = std::fs::remove_dir_all(&tmp);
    let guard = again.expect("lockkit locks again after the server deleted the chroot");
    assert!(guard.release().await.expect("release"));

    // Persistent, not a container: the chroot stays once empty (a stat cannot tell the two
    // apart). It is empty when the server has deleted the namespace node, a container.
    let namespace_node = format!("{chroot}/{namespace}");
    let by = Instant::now() + Duration::from_secs(20);
    while admin
        .check_stat(&namespace_node)
        .await
        .expect("stat")
        .is_some()
    {
        assert!(Instant::now() < by, "{namespace_node} stayed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    container_checks_ran(&admin).await;
    assert!(
        admin.check_stat(chroot).await.expect("stat").is_some(),
        "lockkit created the chroot again as a container: the server deleted it once empty"
    );
}

/// Returns once the server has run its container check twice since the call, so a
/// container that was empty at the call is gone: each run deletes a probe container emptied
/// before it began, and the first run's deletes are applied before the second's.
async fn container_checks_ran(admin: &zk::Client) {
    for _ in 0..2 {
        let probe = format!("/lk-probe-{:08x}", rand::random::<u32>());
        let child = format!("{probe}/child");
        let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
        let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        admin.create(&probe, &[], &container).await.expect("probe");
        admin.create(&child, &[], &persistent).await.expect("child");
        admin.delete(&child, None).await.expect("delete the child");
        let by = Instant::now() + Duration::from_secs(20);
        while admin.check_stat(&probe).await.expect("stat").is_some() {
            assert!(
                Instant::now() < by,
                "the server kept the empty container {probe}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A Curator client with lockkit's chroot as its namespace (`.namespace("lockkit-test")`) and
/// the path `/{namespace}/{key}` locks the same thing too. While it holds the lock, lockkit's
/// `inspect` reports the czxid of the Curator node as the holder's fencing token, and the
/// lockkit client granted after it gets a higher one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_holder_shows_in_inspect_with_its_czxid_and_the_next_token_is_higher() {
    let Some(config) = test_config() else { return };
    let Some(classpath) = curator_classpath() else {
        return;
    };
    let namespace = format!("lk-curator-{:08x}", rand::random::<u32>());
    let key = "inspected";
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("interop-{namespace}"));
    let classes = tmp.join("classes");
    compile(&classpath, &classes);
    let sections = Sections::new(&tmp, "sections");
    let client = lockkit_client(&config, &namespace).await;

    let args = [
        config.hosts.join(","),
        format!("/{namespace}/{key}"),
        "1".to_owned(),
        "1500".to_owned(),
        sections.dir().display().to_string(),
        "curator".to_owned(),
        config.chroot.trim_start_matches('/').to_owned(),
    ];
    let mut curator = Curator::start(&classpath, &classes, &args);
    curator.go();
    let by = Instant::now() + Duration::from_secs(20);
    let info = loop {
        if let Some(info) = client.inspect(key).await.expect("inspect") {
            break info;
        }
        assert!(Instant::now() < by, "Curator did not take the lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let guard = client
        .mutex(key)
        .expect("key")
        .lock_timeout(Duration::from_secs(20))
        .await
        .expect("granted after Curator");
    let next = guard.fencing_token().get();
    assert!(guard.release().await.expect("release"));
    curator.finish(Duration::from_secs(20)).await;

    let outcome = sections.outcome();
    let [(tag, curator_token)] = outcome.history.as_slice() else {
        panic!("one Curator section expected: {:?}", outcome.history);
    };
    assert_eq!(tag, "curator");
    assert_eq!(
        info.fencing_token.get(),
        *curator_token,
        "inspect reports the Curator node's czxid"
    );
    assert!(
        next > *curator_token,
        "the next holder's token {next} is above Curator's {curator_token}"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

/// The nodes of the read-write lock `key` (Curator's and lockkit's alike), as the leader sees
/// them.
async fn rwlock_nodes(admin: &zk::Client, namespace: &str, key: &str) -> Vec<String> {
    let parent = format!("/{namespace}/{key}/rwlock");
    match admin.sync(&parent).await {
        Ok(()) | Err(zk::Error::NoNode) => {}
        Err(e) => panic!("sync {parent}: {e}"),
    }
    match admin.list_children(&parent).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(e) => panic!("list {parent}: {e}"),
    }
}

/// The token in a line `{prefix}{token}` of the contender.
fn token_in(line: &str, prefix: &str) -> u64 {
    line.strip_prefix(prefix)
        .and_then(|token| token.parse().ok())
        .unwrap_or_else(|| panic!("the Curator contender said {line:?}, expected {prefix}TOKEN"))
}

/// Curator's `InterProcessReadWriteLock` on `/{namespace}/{key}/rwlock` (lockkit's chroot in
/// the connect string) and lockkit's read-write lock `key` are one lock: while Curator's
/// writer holds (5 s), lockkit's `try_read` and `try_write` are refused; lockkit's reader
/// waits, watching Curator's node, and is granted once it is gone, with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_writer_keeps_lockkit_readers_and_writers_out() {
    let Some(config) = test_config() else { return };
    let Some(classpath) = curator_classpath() else {
        return;
    };
    let namespace = format!("lk-curator-rw-{:08x}", rand::random::<u32>());
    let key = "shared-rw";
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("interop-{namespace}"));
    let classes = tmp.join("classes");
    compile(&classpath, &classes);
    let client = lockkit_client(&config, &namespace).await;
    let admin = admin(&config, TEST_CHROOT).await;
    let (connect, path) = curator_target(&config, &namespace, key);
    let args = [
        "rwlock".to_owned(),
        connect,
        format!("{path}/rwlock"),
        "write".to_owned(),
        "5000".to_owned(),
    ];
    let mut curator = Curator::start(&classpath, &classes, &args);
    curator.go();
    let curator_token = token_in(&curator.next_line(Duration::from_secs(30)), "held ");
    let rwlock = client.rwlock(key).expect("rwlock");
    assert!(
        rwlock.try_read().await.expect("try_read").is_none(),
        "lockkit read while Curator's writer held"
    );
    assert!(
        rwlock.try_write().await.expect("try_write").is_none(),
        "lockkit wrote while Curator's writer held"
    );
    let read = rwlock
        .read_timeout(Duration::from_secs(30))
        .await
        .expect("lockkit's reader granted after Curator's writer");
    let nodes = rwlock_nodes(&admin, &namespace, key).await;
    assert!(
        !nodes.iter().any(|n| n.contains("__WRIT__")),
        "lockkit read beside Curator's writer: {nodes:?}"
    );
    assert!(read.fencing_token().get() > curator_token);
    assert!(read.release().await.expect("release"));
    curator.finish(Duration::from_secs(30)).await;
    assert_eq!(
        rwlock_nodes(&admin, &namespace, key).await,
        Vec::<String>::new()
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

/// While lockkit's writer holds `key`, Curator's read lock on `/{namespace}/{key}/rwlock`
/// times out (1.5 s); Curator's next read acquire waits, watching lockkit's node, and is
/// granted once lockkit releases, with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lockkit_writer_keeps_curators_reader_out() {
    let Some(config) = test_config() else { return };
    let Some(classpath) = curator_classpath() else {
        return;
    };
    let namespace = format!("lk-curator-rw-{:08x}", rand::random::<u32>());
    let key = "shared-rw";
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("interop-{namespace}"));
    let classes = tmp.join("classes");
    compile(&classpath, &classes);
    let client = lockkit_client(&config, &namespace).await;
    let admin = admin(&config, TEST_CHROOT).await;
    let written = client
        .rwlock(key)
        .expect("rwlock")
        .write_timeout(Duration::from_secs(10))
        .await
        .expect("a free write lock");
    let (connect, path) = curator_target(&config, &namespace, key);
    let args = [
        "rwlock".to_owned(),
        connect,
        format!("{path}/rwlock"),
        "read".to_owned(),
        "1500".to_owned(),
    ];
    let mut curator = Curator::start(&classpath, &classes, &args);
    curator.go();
    let line = curator.next_line(Duration::from_secs(30));
    assert_eq!(line, "refused", "Curator read while lockkit's writer held");
    let token = written.fencing_token().get();
    assert!(written.release().await.expect("release"));
    let curator_token = token_in(&curator.next_line(Duration::from_secs(30)), "granted ");
    assert!(curator_token > token);
    curator.finish(Duration::from_secs(30)).await;
    assert_eq!(
        rwlock_nodes(&admin, &namespace, key).await,
        Vec::<String>::new()
    );
    let _ = std::fs::remove_dir_all(&tmp);
}
