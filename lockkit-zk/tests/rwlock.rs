//! Read-write locks on the ensemble: readers share and a writer excludes, a queued writer
//! blocks later readers, a mixed queue granted in order with each release waking only the
//! waiters it unblocks, tries and dropped acquisitions that leave no node, a write token
//! above every earlier grant's, a holder's expired session, and the node layout (Curator's
//! names, apart from the mutex and the semaphore). None of these disturb the ensemble.

mod support;

use std::time::{Duration, Instant};

use lockkit_core::{FencingToken, LockClient, ReadGuard, WriteGuard};
use support::{TEST_CHROOT, admin, children_via_leader, test_config, watched_client, znodes_under};
use tokio::sync::mpsc;
use zookeeper_client as zk;

const PATIENCE: Duration = Duration::from_secs(30);

fn namespace() -> String {
    format!("lk-zk-rw-{:08x}", rand::random::<u32>())
}

/// The nodes of the rwlock `name`, in queue order, as the leader sees them (the admin's
/// server may lag behind the clients').
async fn rw_nodes(admin: &zk::Client, ns: &str, name: &str) -> Vec<String> {
    let parent = format!("/{ns}/{name}/rwlock");
    let mut nodes = children_via_leader(admin, &parent).await;
    nodes.sort_by_key(|n| n[n.len().saturating_sub(10)..].to_owned());
    nodes
}

/// Waits until the rwlock `name` has `count` nodes.
async fn until_queued(admin: &zk::Client, ns: &str, name: &str, count: usize) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let nodes = rw_nodes(admin, ns, name).await;
        if nodes.len() == count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{count} nodes were expected in the queue, not {nodes:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

/// `client`'s read lock `name`, waiting for it.
async fn read(client: &LockClient, name: &str) -> lockkit_core::Result<ReadGuard> {
    client.rwlock(name)?.read_timeout(PATIENCE).await
}

/// `client`'s write lock `name`, waiting for it.
async fn write(client: &LockClient, name: &str) -> lockkit_core::Result<WriteGuard> {
    client.rwlock(name)?.write_timeout(PATIENCE).await
}

/// A granted read or write lock.
enum Held {
    Read(ReadGuard),
    Write(WriteGuard),
}

impl Held {
    fn token(&self) -> FencingToken {
        match self {
            Held::Read(guard) => guard.fencing_token(),
            Held::Write(guard) => guard.fencing_token(),
        }
    }

    async fn release(self) -> bool {
        match self {
            Held::Read(guard) => guard.release().await,
            Held::Write(guard) => guard.release().await,
        }
        .expect("release")
    }
}

type Grants = mpsc::UnboundedReceiver<(&'static str, Held)>;

/// Queues a waiter `label` of `client` on the rwlock `name` (a writer when `write`), and
/// waits until its node is in the queue (`queued` nodes then). It reports `(label, lock)`
/// on `granted` when granted.
#[allow(clippy::too_many_arguments)]
async fn queue_waiter(
    admin: &zk::Client,
    client: &LockClient,
    ns: &str,
    name: &str,
    label: &'static str,
    write: bool,
    queued: usize,
    granted: &mpsc::UnboundedSender<(&'static str, Held)>,
) {
    let rwlock = client.rwlock(name).expect("rwlock");
    let granted = granted.clone();
    tokio::spawn(async move {
        let held = if write {
            rwlock
                .write_timeout(Duration::from_secs(60))
                .await
                .map(Held::Write)
        } else {
            rwlock
                .read_timeout(Duration::from_secs(60))
                .await
                .map(Held::Read)
        };
        let held = held.unwrap_or_else(|e| panic!("waiter {label}: {}", e.display_chain()));
        let _ = granted.send((label, held));
    });
    until_queued(admin, ns, name, queued).await;
}

async fn next_grant(grants: &mut Grants) -> (&'static str, Held) {
    tokio::time::timeout(Duration::from_secs(20), grants.recv())
        .await
        .expect("no waiter was granted after a release")
        .expect("the waiters' channel closed")
}

/// Nothing more is granted, after a pause long enough for a wrong grant to show.
async fn assert_no_more_grants(grants: &mut Grants, when: &str) {
    tokio::time::sleep(Duration::from_millis(400)).await;
    if let Ok((label, _)) = grants.try_recv() {
        panic!("{label} was granted {when}");
    }
}

/// Two readers of two clients hold at once; a writer can neither try nor wait its way in
/// while they do, and is granted once both are gone, with a token above both of theirs;
/// while it holds, nobody reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_excludes_them() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, first) = watched_client(&config, &ns).await;
    let (_, second) = watched_client(&config, &ns).await;
    let (_, writer) = watched_client(&config, &ns).await;
    let one = read(&first, "share").await.expect("a free read lock");
    let two = read(&second, "share")
        .await
        .expect("a second reader shares");
    let rwlock = writer.rwlock("share").expect("rwlock");
    assert!(rwlock.try_write().await.expect("try_write").is_none());
    let writing = tokio::spawn(async move { rwlock.write_timeout(PATIENCE).await });
    until_queued(&admin, &ns, "share", 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writing.is_finished(), "a writer got in beside two readers");
    let earlier = one.fencing_token().max(two.fencing_token());
    assert!(one.release().await.expect("release"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writing.is_finished(), "a writer got in beside a reader");
    assert!(two.release().await.expect("release"));
    let written = writing
        .await
        .expect("the writer panicked")
        .unwrap_or_else(|e| panic!("the writer was not granted: {}", e.display_chain()));
    assert!(
        written.fencing_token() > earlier,
        "the write's token {} is not above the readers' {earlier}",
        written.fencing_token()
    );
    assert!(written.is_held().await.expect("is_held"));
    let reader = first.rwlock("share").expect("rwlock");
    assert!(reader.try_read().await.expect("try_read").is_none());
    assert!(
        reader
            .read_timeout(Duration::from_millis(300))
            .await
            .is_err(),
        "a reader got in beside a writer"
    );
    assert!(written.release().await.expect("release"));
    assert_no_znodes(&admin, &ns).await;
}

/// While a reader holds, a queued writer keeps a later reader out (its try is refused, its
/// acquire waits); the writer goes first when the reader leaves, then the later reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_writer_blocks_a_later_reader() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, holder) = watched_client(&config, &ns).await;
    let (_, waiters) = watched_client(&config, &ns).await;
    let first = read(&holder, "turn").await.expect("a free read lock");
    let (granted, mut grants) = mpsc::unbounded_channel();
    queue_waiter(&admin, &waiters, &ns, "turn", "writer", true, 2, &granted).await;
    let later = holder.rwlock("turn").expect("rwlock");
    assert!(
        later.try_read().await.expect("try_read").is_none(),
        "a reader tried its way past a queued writer"
    );
    assert_eq!(
        rw_nodes(&admin, &ns, "turn").await.len(),
        2,
        "the try left a node"
    );
    queue_waiter(&admin, &waiters, &ns, "turn", "reader", false, 3, &granted).await;
    assert_no_more_grants(&mut grants, "while the first reader held").await;
    assert!(first.release().await.expect("release"));
    let (label, written) = next_grant(&mut grants).await;
    assert_eq!(
        label, "writer",
        "the later reader went before the queued writer"
    );
    assert_no_more_grants(&mut grants, "beside the writer").await;
    assert!(written.release().await);
    let (label, read) = next_grant(&mut grants).await;
    assert_eq!(label, "reader");
    assert!(read.release().await);
    assert_no_znodes(&admin, &ns).await;
}

/// W1 holds; R2 and R3, then W4, then R5 queue. Only a watch can wake a waiter (the
/// polling cap is ten minutes), and each release wakes exactly the waiters it unblocks:
/// W1's wakes R2 and R3, granted together; R2's wakes nobody; R3's wakes W4, whose token
/// is above every earlier grant's; W4's wakes R5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_queue_is_granted_in_order_each_release_waking_only_whom_it_unblocks() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, holder) = watched_client(&config, &ns).await;
    let (backend, waiters) = watched_client(&config, &ns).await;
    let w1 = write(&holder, "mix").await.expect("a free write lock");
    let (granted, mut grants) = mpsc::unbounded_channel();
    let queue = [("R2", false), ("R3", false), ("W4", true), ("R5", false)];
    for (i, (label, write)) in queue.into_iter().enumerate() {
        queue_waiter(&admin, &waiters, &ns, "mix", label, write, i + 2, &granted).await;
    }
    assert_no_more_grants(&mut grants, "while W1 held").await;
    assert_eq!(
        backend.watch_events(),
        0,
        "a waiter woke while nothing changed"
    );
    let nodes = rw_nodes(&admin, &ns, "mix").await;
    let kinds: Vec<&str> = nodes
        .iter()
        .map(|n| &n[n.len() - 18..n.len() - 10])
        .collect();
    assert_eq!(
        kinds,
        ["__WRIT__", "__READ__", "__READ__", "__WRIT__", "__READ__"]
    );

    let mut earlier = w1.fencing_token();
    assert!(w1.release().await.expect("release"));
    let mut readers = Vec::new();
    for _ in 0..2 {
        let (label, read) = next_grant(&mut grants).await;
        assert!(
            label == "R2" || label == "R3",
            "{label} was granted after W1"
        );
        readers.push((label, read));
    }
    readers.sort_by_key(|(label, _)| *label);
    assert_no_more_grants(&mut grants, "beside R2 and R3").await;
    assert_eq!(backend.watch_events(), 2, "waiters woken by W1's release");
    earlier = earlier.max(readers[0].1.token()).max(readers[1].1.token());

    let (_, r3) = readers.pop().expect("R3");
    let (_, r2) = readers.pop().expect("R2");
    assert!(r2.release().await);
    assert_no_more_grants(&mut grants, "beside R3").await;
    assert_eq!(backend.watch_events(), 2, "waiters woken by R2's release");
    assert!(r3.release().await);
    let (label, w4) = next_grant(&mut grants).await;
    assert_eq!(label, "W4");
    assert!(
        w4.token() > earlier,
        "W4's token {} is not above the earlier grants' {earlier}",
        w4.token()
    );
    assert_no_more_grants(&mut grants, "beside W4").await;
    assert_eq!(backend.watch_events(), 3, "waiters woken by R3's release");
    assert!(w4.release().await);
    let (label, r5) = next_grant(&mut grants).await;
    assert_eq!(label, "R5");
    assert_eq!(backend.watch_events(), 4, "waiters woken by W4's release");
    assert!(r5.release().await);
    assert_no_znodes(&admin, &ns).await;
}

/// A try that is refused leaves no node, whoever holds: a writer refuses both kinds, a
/// reader refuses a writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_tries_leave_no_node() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, holder) = watched_client(&config, &ns).await;
    let (_, other) = watched_client(&config, &ns).await;
    let rwlock = other.rwlock("try").expect("rwlock");
    let written = holder.rwlock("try").expect("rwlock");
    let written = written.try_write().await;
    let written = written.expect("try_write").expect("a free write lock");
    let held = rw_nodes(&admin, &ns, "try").await;
    assert_eq!(held.len(), 1);
    assert!(rwlock.try_read().await.expect("try_read").is_none());
    assert!(rwlock.try_write().await.expect("try_write").is_none());
    assert_eq!(
        rw_nodes(&admin, &ns, "try").await,
        held,
        "a refused try left a node"
    );
    assert!(written.release().await.expect("release"));

    let read = holder.rwlock("try").expect("rwlock");
    let read = read.try_read().await;
    let read = read.expect("try_read").expect("a free read lock");
    let held = rw_nodes(&admin, &ns, "try").await;
    assert!(rwlock.try_write().await.expect("try_write").is_none());
    let shared = rwlock.try_read().await.expect("try_read");
    let shared = shared.expect("a second reader shares");
    assert_eq!(rw_nodes(&admin, &ns, "try").await.len(), 2);
    assert!(shared.release().await.expect("release"));
    assert_eq!(
        rw_nodes(&admin, &ns, "try").await,
        held,
        "a refused try left a node"
    );
    assert!(read.release().await.expect("release"));
    assert_no_znodes(&admin, &ns).await;
}

/// A writer waiting behind a reader, dropped once its node is queued, leaves nothing: its
/// node goes while the reader still holds, and new readers are not kept out by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiting_acquisition_leaves_no_node() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, holder) = watched_client(&config, &ns).await;
    let (_, contender) = watched_client(&config, &ns).await;
    let read = read(&holder, "drop").await.expect("a free read lock");
    let holder_node = rw_nodes(&admin, &ns, "drop").await;
    let rwlock = contender.rwlock("drop").expect("rwlock");
    let writing = tokio::spawn(async move { rwlock.write().await.map(drop) });
    until_queued(&admin, &ns, "drop", 2).await;
    writing.abort();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let nodes = rw_nodes(&admin, &ns, "drop").await;
        if nodes == holder_node {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dropped writer left {nodes:?} (the reader's is {holder_node:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let next = contender.rwlock("drop").expect("rwlock");
    let next = next.try_read().await;
    let next = next.expect("try_read").expect("a reader beside the reader");
    assert!(next.release().await.expect("release"));
    assert!(read.release().await.expect("release"));
    assert_no_znodes(&admin, &ns).await;
}

/// Of two readers, the first's session is expired by the server: its lost signal fires, it
/// is not held any more, its release claims nothing, and a waiting writer still waits for
/// the second reader, then is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_whose_session_expires_loses_its_lock() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (expiring_backend, expiring) = watched_client(&config, &ns).await;
    let (_, steady) = watched_client(&config, &ns).await;
    let (_, writer) = watched_client(&config, &ns).await;
    let old = read(&expiring, "expiry").await.expect("a free read lock");
    let kept = read(&steady, "expiry").await.expect("a second reader");
    let (granted, mut grants) = mpsc::unbounded_channel();
    queue_waiter(&admin, &writer, &ns, "expiry", "writer", true, 3, &granted).await;

    expiring_backend
        .expire_session()
        .await
        .expect("expire the session");
    tokio::time::timeout(Duration::from_secs(5), old.lost())
        .await
        .expect("the expired reader's lost signal did not fire");
    let earlier = kept.fencing_token().max(old.fencing_token());
    assert!(
        !old.is_held().await.expect("is_held"),
        "the expired reader holds"
    );
    assert!(
        !old.release().await.expect("release"),
        "the expired reader's release claimed the lock"
    );
    assert_eq!(rw_nodes(&admin, &ns, "expiry").await.len(), 2);
    assert_no_more_grants(&mut grants, "beside the second reader").await;
    assert!(kept.is_held().await.expect("is_held"));
    assert!(kept.release().await.expect("release"));
    let (_, written) = next_grant(&mut grants).await;
    assert!(written.token() > earlier);
    assert!(written.release().await);
    assert_no_znodes(&admin, &ns).await;
}

/// A reader's and a writer's nodes are Curator's `InterProcessReadWriteLock` names under
/// `{key}/rwlock`, nothing else is created (the key's node holds only the `rwlock` parent),
/// the lock of the same name is not inspected, listed or broken, and nothing remains after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_named_as_curators_under_their_own_parent_and_nothing_remains() {
    let Some(config) = test_config() else { return };
    let admin = admin(&config, TEST_CHROOT).await;
    let ns = namespace();
    let (_, holder) = watched_client(&config, &ns).await;
    let (_, waiters) = watched_client(&config, &ns).await;
    let read = read(&holder, "layout").await.expect("a free read lock");
    let (granted, mut grants) = mpsc::unbounded_channel();
    queue_waiter(&admin, &waiters, &ns, "layout", "writer", true, 2, &granted).await;
    let nodes = rw_nodes(&admin, &ns, "layout").await;
    for (node, kind) in nodes.iter().zip(["__READ__", "__WRIT__"]) {
        let (owner, sequence) = node.split_once(kind).expect("a reader's or writer's name");
        let uuid = owner
            .strip_prefix("_c_")
            .and_then(|o| o.strip_suffix('-'))
            .expect("a protected name");
        let groups: Vec<usize> = uuid.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{node}");
        assert!(uuid.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit()));
        assert_eq!(sequence.len(), 10, "{node}");
        assert!(sequence.bytes().all(|b| b.is_ascii_digit()), "{node}");
    }
    let mut all = znodes_under(&admin, &ns).await.expect("list");
    all.sort();
    let mut expected = vec![format!("/{ns}/layout"), format!("/{ns}/layout/rwlock")];
    expected.extend(nodes.iter().map(|n| format!("/{ns}/layout/rwlock/{n}")));
    expected.sort();
    assert_eq!(all, expected);

    assert_eq!(holder.inspect("layout").await.expect("inspect"), None);
    let page = holder.list_page("", None, 10).await.expect("list");
    assert!(
        page.locks.is_empty(),
        "read locks listed as locks: {page:?}"
    );
    assert!(!holder.force_release("layout").await.expect("force_release"));
    assert!(read.is_held().await.expect("is_held"));
    assert!(read.release().await.expect("release"));
    let (_, written) = next_grant(&mut grants).await;
    assert!(written.release().await);
    assert_no_znodes(&admin, &ns).await;
}
