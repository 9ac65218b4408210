//! Read-write locks on the compose cluster: readers share and a writer excludes, a queued
//! writer keeps later readers out, a mix of readers and writers served in queue order, tries
//! and dropped acquisitions that leave no key, write tokens above every earlier token,
//! waiters woken by their watches alone, a writer's release that wakes only the readers it
//! grants, and where the keys live. None of these disturb the cluster.

mod support;

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::backend::lease_of;
use lockkit_core::testing::Recording;
use lockkit_core::{FencingToken, LockClient, LockOptions, ReadGuard, RwLock, WriteGuard};
use lockkit_etcd::{EtcdBackend, EtcdConfig};
use tokio::sync::mpsc;

/// The TTL of every client: no session may end while a test checks the queue's order (one
/// that does rightly takes its keys out of the queue).
const QUEUE_TTL: Duration = Duration::from_secs(30);
/// How long a grant that is due may take on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(20);
/// How long a grant that is not due must stay away, to count as not granted.
const NOT_YET: Duration = Duration::from_millis(300);

/// Client options: only a watch can wake a waiter (the polling cap is far beyond a test).
fn options() -> LockOptions {
    LockOptions::default()
        .with_ttl(QUEUE_TTL)
        .with_backoff(Duration::from_millis(5), Duration::from_secs(300))
}

/// A client with its own connection and sessions, as another process has.
async fn client(config: &EtcdConfig, ns: &str) -> LockClient {
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    LockClient::with_options(Arc::new(backend), ns, options()).expect("client")
}

/// A client like [`client`] whose calls are recorded.
async fn recorded_client(config: &EtcdConfig, ns: &str) -> (LockClient, Arc<Recording>) {
    let backend = EtcdBackend::connect(config.clone()).await.expect("connect");
    let recording = Arc::new(Recording::new(Arc::new(backend)));
    let client = LockClient::with_options(recording.clone(), ns, options()).expect("client");
    (client, recording)
}

/// A read or a write lock, as a waiter reports it.
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

    async fn release(self) {
        let released = match self {
            Held::Read(guard) => guard.release().await,
            Held::Write(guard) => guard.release().await,
        };
        assert!(released.expect("release"), "a release was refused");
    }
}

/// Queues waiter `index` on `lock` for a read or a write (after the ones before it: its key
/// is the `keys`-th under the namespace) and sends its lock on `granted` once it has it.
async fn queue_waiter(
    admin: &EtcdBackend,
    ns: &str,
    keys: usize,
    index: usize,
    writes: bool,
    lock: RwLock,
    granted: &mpsc::UnboundedSender<(usize, Held)>,
) {
    let granted = granted.clone();
    tokio::spawn(async move {
        let wait = Duration::from_secs(120);
        let held = if writes {
            lock.write_timeout(wait).await.map(Held::Write)
        } else {
            lock.read_timeout(wait).await.map(Held::Read)
        };
        let held = held.unwrap_or_else(|e| panic!("waiter {index}: {}", e.display_chain()));
        let _ = granted.send((index, held));
    });
    support::until_keys(admin, ns, keys, PATIENCE).await;
}

/// The next grants, which must be those of the waiters `expected` (in any order), and then
/// none for [`NOT_YET`].
async fn next_grants(
    granted: &mut mpsc::UnboundedReceiver<(usize, Held)>,
    expected: &[usize],
) -> Vec<Held> {
    let mut got: Vec<(usize, Held)> = Vec::new();
    while got.len() < expected.len() {
        match tokio::time::timeout(PATIENCE, granted.recv()).await {
            Ok(Some((index, held))) => {
                assert!(
                    expected.contains(&index),
                    "waiter {index} was granted where {expected:?} were next in the queue"
                );
                got.push((index, held));
            }
            Ok(None) => panic!("the waiters are gone"),
            Err(_) => panic!(
                "waiters {expected:?} were not all granted (only {:?})",
                got.iter().map(|(i, _)| *i).collect::<Vec<_>>()
            ),
        }
    }
    expect_no_grant(granted).await;
    got.sort_by_key(|(index, _)| *index);
    got.into_iter().map(|(_, held)| held).collect()
}

/// No grant comes for [`NOT_YET`].
async fn expect_no_grant(granted: &mut mpsc::UnboundedReceiver<(usize, Held)>) {
    if let Ok(Some((index, _))) = tokio::time::timeout(NOT_YET, granted.recv()).await {
        panic!("waiter {index} was granted out of turn");
    }
}

/// Three clients read at once; a writer can neither try nor wait its way in while they do,
/// and is granted once they are gone; while it writes, nobody reads or writes.
#[tokio::test]
async fn readers_share_and_a_writer_excludes() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("rw-share");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let mut readers = Vec::new();
    for _ in 0..3 {
        let reader = client(&config, &ns).await;
        let guard = reader.rwlock("table").unwrap().try_read().await;
        readers.push(guard.expect("try_read").expect("a reader beside readers"));
    }
    let writer = client(&config, &ns).await;
    let table = writer.rwlock("table").unwrap();
    assert!(table.try_write().await.expect("try_write").is_none());
    let waited = table.write_timeout(NOT_YET).await;
    assert!(waited.is_err(), "a writer was granted beside three readers");
    for reader in readers {
        assert!(reader.release().await.expect("release"));
    }
    let written = table.write_timeout(PATIENCE).await.expect("write");
    let other = client(&config, &ns).await;
    let lock = other.rwlock("table").unwrap();
    assert!(lock.try_read().await.expect("try_read").is_none());
    assert!(lock.try_write().await.expect("try_write").is_none());
    assert!(written.is_held().await.expect("is_held"));
    assert!(written.release().await.expect("release"));
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}

/// A reader holds, a writer queues, then a reader queues behind the writer: the writer is
/// granted when the first reader leaves, and the reader behind it only once the writer left
/// (a waiting writer blocks new readers).
#[tokio::test]
async fn a_queued_writer_blocks_a_later_reader() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("rw-block");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let first = client(&config, &ns).await;
    let reading = first.rwlock("block").unwrap().read().await.expect("read");
    let (sender, mut granted) = mpsc::unbounded_channel();
    let writer = client(&config, &ns).await;
    let lock = writer.rwlock("block").unwrap();
    queue_waiter(&admin, &ns, 2, 0, true, lock, &sender).await;
    let reader = client(&config, &ns).await;
    let lock = reader.rwlock("block").unwrap();
    queue_waiter(&admin, &ns, 3, 1, false, lock, &sender).await;
    expect_no_grant(&mut granted).await;
    assert!(
        first
            .rwlock("block")
            .unwrap()
            .try_read()
            .await
            .expect("try_read")
            .is_none(),
        "a new reader was granted beside a waiting writer"
    );
    let read_token = reading.fencing_token();
    assert!(reading.release().await.expect("release"));
    let [written] = <[Held; 1]>::try_from(next_grants(&mut granted, &[0]).await)
        .ok()
        .unwrap();
    assert!(written.token() > read_token);
    written.release().await;
    let [read] = <[Held; 1]>::try_from(next_grants(&mut granted, &[1]).await)
        .ok()
        .unwrap();
    read.release().await;
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}

/// W1 holds; R2 and R3 queue, then W4, then R5. W1's release grants R2 and R3 together, W4
/// is granted only after both left, R5 only after W4 left; every write token is above every
/// token granted before it.
#[tokio::test]
async fn a_mix_of_readers_and_writers_is_served_in_queue_order() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("rw-fifo");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let holder = client(&config, &ns).await;
    let w1 = holder.rwlock("fifo").unwrap().write().await.expect("write");
    let (sender, mut granted) = mpsc::unbounded_channel();
    let kinds = [(2, false), (3, false), (4, true), (5, false)];
    let mut waiters = Vec::new();
    for (keys, (index, writes)) in (2..).zip(kinds) {
        let waiter = client(&config, &ns).await;
        let lock = waiter.rwlock("fifo").unwrap();
        queue_waiter(&admin, &ns, keys, index, writes, lock, &sender).await;
        waiters.push(waiter);
    }
    expect_no_grant(&mut granted).await;
    let mut highest = w1.fencing_token();
    assert!(w1.release().await.expect("release"));
    let readers = next_grants(&mut granted, &[2, 3]).await;
    for reader in &readers {
        assert!(reader.token() > highest);
    }
    highest = readers.iter().map(Held::token).max().unwrap();
    let mut readers = readers.into_iter();
    readers.next().unwrap().release().await;
    expect_no_grant(&mut granted).await;
    readers.next().unwrap().release().await;
    let [w4] = <[Held; 1]>::try_from(next_grants(&mut granted, &[4]).await)
        .ok()
        .unwrap();
    assert!(
        w4.token() > highest,
        "the write's token is not above the reads'"
    );
    w4.release().await;
    let [r5] = <[Held; 1]>::try_from(next_grants(&mut granted, &[5]).await)
        .ok()
        .unwrap();
    r5.release().await;
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}

/// A refused `try_read` or `try_write` puts no key, not even for a moment that a later
/// listing could see: with a writer holding, neither tries get in, and with a reader
/// holding, a try_write does not; the namespace keeps only the holder's key.
#[tokio::test]
async fn refused_tries_leave_no_key() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("rw-try");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let holder = client(&config, &ns).await;
    let other = client(&config, &ns).await;
    let lock = other.rwlock("try").unwrap();
    let written = holder.rwlock("try").unwrap().write().await.expect("write");
    for _ in 0..3 {
        assert!(lock.try_read().await.expect("try_read").is_none());
        assert!(lock.try_write().await.expect("try_write").is_none());
        let keys = support::keys_under(&admin, &ns).await.expect("list keys");
        assert_eq!(keys.len(), 1, "a refused try left a key: {keys:?}");
    }
    assert!(written.release().await.expect("release"));
    let read = holder.rwlock("try").unwrap().read().await.expect("read");
    for _ in 0..3 {
        assert!(lock.try_write().await.expect("try_write").is_none());
        let keys = support::keys_under(&admin, &ns).await.expect("list keys");
        assert_eq!(keys.len(), 1, "a refused try_write left a key: {keys:?}");
    }
    let shared = lock.try_read().await.expect("try_read");
    assert!(shared.is_some(), "a try_read was refused beside a reader");
    drop(shared);
    assert!(read.release().await.expect("release"));
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}

/// A writer holds; a reader and a writer queue behind it, and their acquisitions are
/// dropped while they wait: their keys go (in the background, long before the TTL), and
/// once the writer leaves, nothing is left.
#[tokio::test]
async fn a_dropped_waiting_acquisition_leaves_no_key() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("rw-drop");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let holder = client(&config, &ns).await;
    let written = holder.rwlock("drop").unwrap().write().await.expect("write");
    let waiter = client(&config, &ns).await;
    let reader = waiter.rwlock("drop").unwrap();
    let writer = waiter.rwlock("drop").unwrap();
    let reading = tokio::spawn(async move { reader.read().await.map(drop) });
    support::until_keys(&admin, &ns, 2, PATIENCE).await;
    let writing = tokio::spawn(async move { writer.write().await.map(drop) });
    support::until_keys(&admin, &ns, 3, PATIENCE).await;
    reading.abort();
    writing.abort();
    support::until_keys(&admin, &ns, 1, PATIENCE).await;
    let other = client(&config, &ns).await;
    assert!(written.release().await.expect("release"));
    let read = other.rwlock("drop").unwrap().try_read().await;
    assert!(
        read.expect("try_read").is_some(),
        "the dropped writer blocks readers"
    );
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}

/// Rounds of two readers and a writer queued behind them, with a try_read refused while the
/// writer waits: each write token is above every token granted before it (the readers', the
/// writer's before it), readers' tokens are above the write before them, and no token repeats.
#[tokio::test]
async fn a_write_token_is_above_every_earlier_token() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("rw-token");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let readers = [client(&config, &ns).await, client(&config, &ns).await];
    let writer = client(&config, &ns).await;
    let lock = writer.rwlock("token").unwrap();
    let mut highest = FencingToken(0);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..5 {
        let mut reads = Vec::new();
        for reader in &readers {
            let read = reader.rwlock("token").unwrap().read().await.expect("read");
            assert!(
                read.fencing_token() > highest,
                "a read below the write before it"
            );
            assert!(seen.insert(read.fencing_token()), "a token repeated");
            reads.push(read);
        }
        let lock = lock.clone();
        let writing = tokio::spawn(async move { lock.write_timeout(PATIENCE).await });
        support::until_keys(&admin, &ns, 3, PATIENCE).await;
        let probe = readers[0].rwlock("token").unwrap();
        assert!(probe.try_read().await.expect("try_read").is_none());
        highest = reads.iter().map(ReadGuard::fencing_token).max().unwrap();
        for read in reads {
            assert!(read.release().await.expect("release"));
        }
        let written = writing.await.expect("writer").expect("write");
        assert!(
            written.fencing_token() > highest,
            "a write token {} is not above {highest}",
            written.fencing_token()
        );
        assert!(seen.insert(written.fencing_token()), "a token repeated");
        highest = written.fencing_token();
        assert!(written.release().await.expect("release"));
    }
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}

/// With backoff far beyond the test (300 s), a writer waiting for a reader and a reader
/// waiting for that writer are each granted promptly after the release they wait for: only
/// their watches can have woken them.
#[tokio::test]
async fn a_waiter_is_woken_by_its_watch() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("rw-watch");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let holder = client(&config, &ns).await;
    let reading = holder.rwlock("watch").unwrap().read().await.expect("read");
    let (sender, mut granted) = mpsc::unbounded_channel();
    let writer = client(&config, &ns).await;
    let lock = writer.rwlock("watch").unwrap();
    queue_waiter(&admin, &ns, 2, 0, true, lock, &sender).await;
    let reader = client(&config, &ns).await;
    let lock = reader.rwlock("watch").unwrap();
    queue_waiter(&admin, &ns, 3, 1, false, lock, &sender).await;
    // Both are in their waits (their watches open) before the release.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(reading.release().await.expect("release"));
    let [written] = <[Held; 1]>::try_from(next_grants(&mut granted, &[0]).await)
        .ok()
        .unwrap();
    written.release().await;
    let [read] = <[Held; 1]>::try_from(next_grants(&mut granted, &[1]).await)
        .ok()
        .unwrap();
    read.release().await;
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}

/// A writer holds, twenty readers queue behind it and one writer behind them, each its own
/// client with its calls recorded. The writer's release grants the twenty readers, with one
/// attempt each, and does not wake the writer behind them; the readers' releases in queue
/// order wake nobody until the newest reader (the writer's predecessor) leaves, which
/// grants the writer with one attempt.
#[tokio::test]
async fn a_writers_release_wakes_only_the_readers_it_grants() {
    const READERS: usize = 20;
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("rw-herd");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let holder = client(&config, &ns).await;
    let first = holder.rwlock("herd").unwrap().write().await.expect("write");
    let (sender, mut granted) = mpsc::unbounded_channel();
    let mut recordings = Vec::new();
    let mut clients = Vec::new();
    for index in 0..=READERS {
        let (waiter, recording) = recorded_client(&config, &ns).await;
        let lock = waiter.rwlock("herd").unwrap();
        let writes = index == READERS;
        queue_waiter(&admin, &ns, 2 + index, index, writes, lock, &sender).await;
        recordings.push(recording);
        clients.push(waiter);
    }
    // Every waiter is in its wait (its watch open) before the release.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before: Vec<usize> = recordings.iter().map(|r| r.count("try_acquire")).collect();
    let attempts_since = |index: usize| recordings[index].count("try_acquire") - before[index];
    assert!(first.release().await.expect("release"));
    let readers: Vec<usize> = (0..READERS).collect();
    let reads = next_grants(&mut granted, &readers).await;
    // Room for any stray wake to show before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let attempts: Vec<usize> = (0..=READERS).map(attempts_since).collect();
    let mut expected = vec![1; READERS];
    expected.push(0);
    assert_eq!(
        attempts, expected,
        "attempts per waiter after the writer's release"
    );
    let mut reads = reads.into_iter();
    for read in reads.by_ref().take(READERS - 1) {
        read.release().await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        attempts_since(READERS),
        0,
        "the writer woke at a release of a reader it does not wait for"
    );
    reads.next().unwrap().release().await;
    let [written] = <[Held; 1]>::try_from(next_grants(&mut granted, &[READERS]).await)
        .ok()
        .unwrap();
    assert_eq!(
        attempts_since(READERS),
        1,
        "the writer's attempts to its grant"
    );
    written.release().await;
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}

/// A read lock's key is `<prefix>/<namespace>/../rwlock/<name>/read/<lease-hex>-<n>`, a write
/// lock's under `write/`, its grant's handle; the mutex of the same name keeps its key apart,
/// and after every release nothing is left.
#[tokio::test]
async fn the_keys_live_under_the_rwlocks_range_and_go_with_the_grants() {
    let Some(config) = support::cluster_config().await else {
        return;
    };
    let ns = support::namespace("rw-keys");
    let admin = EtcdBackend::connect(config.clone()).await.expect("connect");
    let locks = client(&config, &ns).await;
    let key = locks.key("layout").unwrap();
    let range = admin.rwlock_prefix(&key);
    assert_eq!(range, format!("{}/{ns}/../rwlock/layout/", support::PREFIX));
    let lock = locks.rwlock("layout").unwrap();
    let read = lock.read().await.expect("read");
    let handle = |held: &lockkit_core::MutexGuard| {
        lease_of(held)
            .handle()
            .expect("an etcd grant names its key")
            .to_owned()
    };
    let read_key = handle(read.as_guard());
    let lease = format!("{:016x}", support::lease_of(&read_key));
    assert_eq!(read_key, format!("{range}read/{lease}-0"));
    let mutex = locks.mutex("layout").unwrap().lock().await.expect("lock");
    let keys = support::keys_under(&admin, &ns).await.expect("list keys");
    assert_eq!(
        keys,
        [
            format!("{range}read/{lease}-0"),
            format!("{}/{ns}/layout/{lease}-0", support::PREFIX)
        ],
    );
    assert!(read.release().await.expect("release"));
    assert!(mutex.release().await.expect("release"));
    let write = lock.write().await.expect("write");
    assert_eq!(handle(write.as_guard()), format!("{range}write/{lease}-0"));
    assert!(
        locks
            .backend()
            .is_held(lease_of(write.as_guard()))
            .await
            .expect("is_held")
    );
    assert!(write.release().await.expect("release"));
    support::expect_no_keys(&admin, &ns, PATIENCE).await;
}
