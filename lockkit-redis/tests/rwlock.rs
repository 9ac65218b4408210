//! What the conformance suite cannot see of Redis read-write locks: the waiting writer's
//! record (made only by a writer that waits, removed by its grant and by an abandon, gone by
//! itself one TTL after a writer that vanished), write tokens above every earlier grant's
//! (also after the fence counter is lost), waiters woken by notifications and not by
//! polling (every waiting reader of a process, and a writer waiting for the last reader),
//! the keys vanishing by their TTL, the minimal ACL, `min_replicas`, and Redlock's refusal.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockkit_core::backend::{AcquireRequest, Attempt, Hold, OwnerToken, SharedBackend};
use lockkit_core::{ErrorKind, FencingToken, LockClient, LockKey, LockOptions};
use lockkit_redis::{RedisBackend, RedisConfig};
use redis::aio::MultiplexedConnection;

/// Patience for what should happen at once: generous, for a busy machine.
const PATIENCE: Duration = Duration::from_secs(10);

fn namespace() -> String {
    format!("lk-test-{:08x}", rand::random::<u32>())
}

/// The rwlock keys of `key`, as the crate documents them.
fn rw_key(key: &LockKey, suffix: &str) -> String {
    format!("{}:rw:{suffix}", common::lock_key(key))
}

/// One attempt of `owner` at `hold` of `key`'s rwlock, straight to the backend: nothing
/// retries, renews or releases what it gets.
async fn attempt(
    backend: &SharedBackend,
    key: &LockKey,
    owner: &OwnerToken,
    hold: Hold,
    ttl: Duration,
    wait: bool,
) -> Option<FencingToken> {
    let request = AcquireRequest::new(key.clone(), owner.clone(), ttl, wait).with_hold(hold);
    match backend.try_acquire(&request).await.unwrap() {
        Attempt::Granted(grant) => Some(grant.fencing_token),
        Attempt::Contended(_) => None,
    }
}

/// Removes whatever `owner`'s request of `hold` left (a grant or a waiting record).
async fn abandon(backend: &SharedBackend, key: &LockKey, owner: &OwnerToken, hold: Hold) {
    let request = AcquireRequest::new(key.clone(), owner.clone(), Duration::from_secs(1), true)
        .with_hold(hold);
    backend.abandon(&request).await.unwrap();
}

/// The namespace's keys on `con`, but the fence counters (which outlive their holders by
/// design, with a TTL of their own).
async fn keys_but_fences(con: &mut MultiplexedConnection, ns: &str) -> Vec<String> {
    let mut keys = common::keys_of(con, ns).await.unwrap();
    keys.retain(|k| !k.ends_with(":fence"));
    keys.sort();
    keys
}

/// How many waiting writers `key`'s rwlock records.
async fn waiting_writers(con: &mut MultiplexedConnection, key: &LockKey) -> i64 {
    redis::cmd("ZCARD")
        .arg(rw_key(key, "waiting"))
        .query_async(con)
        .await
        .unwrap()
}

async fn pttl(con: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(con).await.unwrap()
}

/// Polls `until` every 20 ms for at most `patience`; whether it came true.
async fn eventually<F, Fut>(patience: Duration, mut until: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + patience;
    loop {
        if until().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client of `backend` in `ns` with `ttl`.
fn client(backend: SharedBackend, ns: &str, ttl: Duration) -> LockClient {
    LockClient::with_options(backend, ns, LockOptions::default().with_ttl(ttl)).unwrap()
}

/// Whether a reader of `client`'s rwlock `name` gets in at once (and leaves again).
async fn reader_gets_in(client: &LockClient, name: &str) -> bool {
    match client.rwlock(name).unwrap().try_read().await.unwrap() {
        Some(guard) => {
            assert!(guard.release().await.unwrap());
            true
        }
        None => false,
    }
}

/// Readers share and a writer excludes everyone, by raw requests to the backend and through
/// the `RwLock` API; a repeated attempt of one owner finds its grant instead of taking a
/// second; nothing is left afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_excludes_everyone() {
    let Some(harness) = common::single().await else {
        return;
    };
    let backend = harness.backend().await.unwrap();
    let ns = namespace();
    let key = LockKey::new(&ns, "raw").unwrap();
    let ttl = Duration::from_secs(5);
    let (r1, r2, w) = (
        OwnerToken::generate().unwrap(),
        OwnerToken::generate().unwrap(),
        OwnerToken::generate().unwrap(),
    );
    let first = attempt(&backend, &key, &r1, Hold::Read, ttl, false).await;
    let second = attempt(&backend, &key, &r2, Hold::Read, ttl, false).await;
    assert!(first.is_some() && second.is_some(), "readers did not share");
    assert_eq!(
        attempt(&backend, &key, &r1, Hold::Read, ttl, false).await,
        first,
        "a repeated attempt got another grant"
    );
    assert_eq!(
        attempt(&backend, &key, &w, Hold::Write, ttl, false).await,
        None,
        "a writer was granted beside readers"
    );
    abandon(&backend, &key, &r1, Hold::Read).await;
    assert_eq!(
        attempt(&backend, &key, &w, Hold::Write, ttl, false).await,
        None,
        "a writer was granted beside a reader"
    );
    abandon(&backend, &key, &r2, Hold::Read).await;
    let written = attempt(&backend, &key, &w, Hold::Write, ttl, false).await;
    assert!(written.is_some(), "the writer was refused with nobody in");
    let late = OwnerToken::generate().unwrap();
    for hold in [Hold::Read, Hold::Write] {
        assert_eq!(
            attempt(&backend, &key, &late, hold, ttl, false).await,
            None,
            "{hold:?} granted beside a writer"
        );
    }
    abandon(&backend, &key, &w, Hold::Write).await;

    let (a, b) = (
        client(harness.backend().await.unwrap(), &ns, ttl),
        client(harness.backend().await.unwrap(), &ns, ttl),
    );
    let read_a = a.rwlock("api").unwrap().read().await.unwrap();
    let read_b = b.rwlock("api").unwrap().read().await.unwrap();
    assert!(
        b.rwlock("api")
            .unwrap()
            .try_write()
            .await
            .unwrap()
            .is_none()
    );
    assert!(read_a.is_held().await.unwrap() && read_b.is_held().await.unwrap());
    assert!(read_a.release().await.unwrap());
    assert!(read_b.release().await.unwrap());
    let written = b.rwlock("api").unwrap().write().await.unwrap();
    assert!(written.is_held().await.unwrap());
    assert!(
        !reader_gets_in(&a, "api").await,
        "a reader got in beside a writer"
    );
    assert!(
        a.rwlock("api")
            .unwrap()
            .try_write()
            .await
            .unwrap()
            .is_none()
    );
    assert!(!stranger_releases(&b, "api", Hold::Write).await);
    assert!(written.is_held().await.unwrap());
    assert!(written.release().await.unwrap());
    assert!(reader_gets_in(&a, "api").await);

    let mut con = harness.servers().await.unwrap().remove(0);
    assert_eq!(keys_but_fences(&mut con, &ns).await, Vec::<String>::new());
}

/// Whether a release of `hold` of `name` by an owner that never held it is taken as ours.
async fn stranger_releases(client: &LockClient, name: &str, hold: Hold) -> bool {
    let lease = lockkit_core::backend::Lease::new(
        client.key(name).unwrap(),
        OwnerToken::generate().unwrap(),
        FencingToken(1),
        Duration::from_secs(1),
        Instant::now(),
    )
    .with_hold(hold);
    client.backend().release(&lease).await.unwrap()
}

/// While a reader holds, a writer that waits is recorded and keeps a new reader's `try_read`
/// out; once the reader leaves the writer is granted (its record goes), with a token above
/// the reader's; after the writer's release readers are admitted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_blocks_new_readers_until_it_has_written() {
    let Some(harness) = common::single().await else {
        return;
    };
    let ns = namespace();
    let ttl = Duration::from_secs(5);
    let clients = [
        client(harness.backend().await.unwrap(), &ns, ttl),
        client(harness.backend().await.unwrap(), &ns, ttl),
        client(harness.backend().await.unwrap(), &ns, ttl),
    ];
    let key = clients[0].key("doc").unwrap();
    let mut con = harness.servers().await.unwrap().remove(0);
    let reading = clients[0].rwlock("doc").unwrap().read().await.unwrap();
    assert!(
        reader_gets_in(&clients[2], "doc").await,
        "readers do not share"
    );
    let writer = clients[1].rwlock("doc").unwrap();
    let writing = tokio::spawn(async move { writer.write_timeout(PATIENCE).await });
    assert!(
        eventually(PATIENCE, || async {
            waiting_writers(&mut con.clone(), &key).await == 1
        })
        .await,
        "the waiting writer did not record itself"
    );
    assert!(
        !reader_gets_in(&clients[2], "doc").await,
        "a new reader got in ahead of a waiting writer"
    );
    let read_token = reading.fencing_token();
    assert!(reading.release().await.unwrap());
    let written = tokio::time::timeout(PATIENCE, writing)
        .await
        .expect("the writer was not granted after the reader left")
        .unwrap()
        .unwrap();
    assert!(written.fencing_token() > read_token);
    assert_eq!(
        waiting_writers(&mut con, &key).await,
        0,
        "the granted writer is still recorded as waiting"
    );
    assert!(!reader_gets_in(&clients[2], "doc").await);
    assert!(written.release().await.unwrap());
    assert!(
        reader_gets_in(&clients[2], "doc").await,
        "readers were not admitted after the writer left"
    );
    assert_eq!(keys_but_fences(&mut con, &ns).await, Vec::<String>::new());
}

/// A writer that only tries (`try_write`, or a raw request with `wait == false`) against a
/// reader leaves no record: a reader right after gets in, and no waiting key exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_write_against_a_reader_records_nothing() {
    let Some(harness) = common::single().await else {
        return;
    };
    let ns = namespace();
    let ttl = Duration::from_secs(5);
    let (a, b) = (
        client(harness.backend().await.unwrap(), &ns, ttl),
        client(harness.backend().await.unwrap(), &ns, ttl),
    );
    let key = a.key("tried").unwrap();
    let mut con = harness.servers().await.unwrap().remove(0);
    let reading = a.rwlock("tried").unwrap().read().await.unwrap();
    assert!(
        b.rwlock("tried")
            .unwrap()
            .try_write()
            .await
            .unwrap()
            .is_none()
    );
    let raw = OwnerToken::generate().unwrap();
    assert_eq!(
        attempt(b.backend(), &key, &raw, Hold::Write, ttl, false).await,
        None
    );
    let exists: i64 = redis::cmd("EXISTS")
        .arg(rw_key(&key, "waiting"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(exists, 0, "a writer that only tried left a waiting record");
    assert!(
        reader_gets_in(&b, "tried").await,
        "a writer that only tried kept a reader out"
    );
    assert!(reading.release().await.unwrap());
    assert_eq!(keys_but_fences(&mut con, &ns).await, Vec::<String>::new());
}

/// A waiting writer that vanished (its one attempt recorded it; it never attempts again nor
/// abandons) keeps readers out for about its TTL (1 s), then no longer: a reader waiting
/// meanwhile gets in, and the record is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_waiting_writer_stops_blocking_readers_after_its_ttl() {
    let Some(harness) = common::single().await else {
        return;
    };
    let backend = harness.backend().await.unwrap();
    let ns = namespace();
    let key = LockKey::new(&ns, "vanished").unwrap();
    let mut con = harness.servers().await.unwrap().remove(0);
    let reader = OwnerToken::generate().unwrap();
    let long = Duration::from_secs(30);
    assert!(
        attempt(&backend, &key, &reader, Hold::Read, long, false)
            .await
            .is_some()
    );
    let ttl = Duration::from_secs(1);
    let sent = Instant::now();
    let vanished = OwnerToken::generate().unwrap();
    assert_eq!(
        attempt(&backend, &key, &vanished, Hold::Write, ttl, true).await,
        None
    );
    assert_eq!(waiting_writers(&mut con, &key).await, 1);
    let readers = client(harness.backend().await.unwrap(), &ns, long);
    assert!(
        !reader_gets_in(&readers, "vanished").await,
        "a reader got in ahead of a waiting writer"
    );
    let waiting = readers.rwlock("vanished").unwrap();
    let granted = waiting.read_timeout(PATIENCE).await.unwrap();
    let blocked_for = sent.elapsed();
    assert!(
        blocked_for >= ttl / 2,
        "the waiting writer stopped blocking after {blocked_for:?}, before its TTL of {ttl:?}"
    );
    assert_eq!(waiting_writers(&mut con, &key).await, 0);
    assert!(granted.release().await.unwrap());
    abandon(&backend, &key, &reader, Hold::Read).await;
    assert_eq!(keys_but_fences(&mut con, &ns).await, Vec::<String>::new());
}

/// A writer that keeps waiting keeps its record, and so readers out, for as long as it
/// waits: with a TTL of 1 s and a backoff cap of a minute behind a reader of 30 s, its
/// record is refreshed in time (its wait is at most a third of its TTL), three TTLs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_waiting_writer_keeps_readers_out_past_its_ttl() {
    let Some(harness) = common::single().await else {
        return;
    };
    let backend = harness.backend().await.unwrap();
    let ns = namespace();
    let key = LockKey::new(&ns, "live").unwrap();
    let mut con = harness.servers().await.unwrap().remove(0);
    let reader = OwnerToken::generate().unwrap();
    let long = Duration::from_secs(30);
    assert!(
        attempt(&backend, &key, &reader, Hold::Read, long, false)
            .await
            .is_some()
    );
    let ttl = Duration::from_secs(1);
    let patient = LockOptions::default()
        .with_ttl(ttl)
        .with_backoff(Duration::from_millis(5), Duration::from_secs(60));
    let writers = LockClient::with_options(harness.backend().await.unwrap(), &ns, patient).unwrap();
    let writer = writers.rwlock("live").unwrap();
    let writing = tokio::spawn(async move { writer.write().await });
    assert!(
        eventually(PATIENCE, || async {
            waiting_writers(&mut con.clone(), &key).await == 1
        })
        .await,
        "the waiting writer did not record itself"
    );
    let readers = client(harness.backend().await.unwrap(), &ns, long);
    let until = Instant::now() + ttl * 3;
    while Instant::now() < until {
        assert!(
            !reader_gets_in(&readers, "live").await,
            "a reader got in while a writer waited: its record lapsed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    abandon(&backend, &key, &reader, Hold::Read).await;
    let written = tokio::time::timeout(PATIENCE, writing)
        .await
        .expect("the writer was not granted after the reader left")
        .unwrap()
        .unwrap();
    assert!(written.release().await.unwrap());
    assert_eq!(keys_but_fences(&mut con, &ns).await, Vec::<String>::new());
}

/// A waiting writer whose acquisition is dropped (its task aborted) stops blocking readers at
/// once: its TTL is 30 s, and a reader that waited behind it (with a backoff cap of a
/// minute) is woken by the abandon's notification and gets in within a few seconds, as does
/// a reader that only tries; nothing of the writer is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_waiting_writer_stops_blocking_readers_at_once() {
    let Some(harness) = common::single().await else {
        return;
    };
    let ns = namespace();
    let ttl = Duration::from_secs(30);
    let (a, b, c) = (
        client(harness.backend().await.unwrap(), &ns, ttl),
        client(harness.backend().await.unwrap(), &ns, ttl),
        client(harness.backend().await.unwrap(), &ns, ttl),
    );
    let patient = LockOptions::default()
        .with_ttl(ttl)
        .with_backoff(Duration::from_millis(5), Duration::from_secs(60));
    let waiters = LockClient::with_options(harness.backend().await.unwrap(), &ns, patient).unwrap();
    let key = a.key("dropped").unwrap();
    let mut con = harness.servers().await.unwrap().remove(0);
    let reading = a.rwlock("dropped").unwrap().read().await.unwrap();
    let writer = b.rwlock("dropped").unwrap();
    let writing = tokio::spawn(async move { writer.write().await });
    assert!(
        eventually(PATIENCE, || async {
            waiting_writers(&mut con.clone(), &key).await == 1
        })
        .await,
        "the waiting writer did not record itself"
    );
    assert!(!reader_gets_in(&c, "dropped").await);
    let reader = waiters.rwlock("dropped").unwrap();
    let waiting_reader = tokio::spawn(async move { reader.read().await });
    let channel = format!("lockkit:released:{}:rw:readers", common::lock_key(&key));
    assert!(
        eventually(PATIENCE, || async {
            listeners(&mut con.clone(), &channel).await >= 1
        })
        .await,
        "the waiting reader never subscribed"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting_reader.is_finished());
    writing.abort();
    let woken = tokio::time::timeout(Duration::from_secs(5), waiting_reader)
        .await
        .expect("a reader waiting behind an abandoned writer was not woken within 5 s (the writer's TTL is 30 s)")
        .unwrap()
        .unwrap();
    assert!(
        reader_gets_in(&c, "dropped").await,
        "an abandoned waiting writer kept readers out"
    );
    assert_eq!(waiting_writers(&mut con, &key).await, 0);
    assert!(woken.release().await.unwrap());
    assert!(reading.release().await.unwrap());
    assert_eq!(keys_but_fences(&mut con, &ns).await, Vec::<String>::new());
}

/// A write's token is above every earlier grant's, read or write; and tokens keep increasing
/// after the rwlock's fence counter is deleted (they follow the server clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_tokens_are_above_every_earlier_grant_even_after_the_counter_is_lost() {
    let Some(harness) = common::single().await else {
        return;
    };
    let backend = harness.backend().await.unwrap();
    let ns = namespace();
    let key = LockKey::new(&ns, "fenced").unwrap();
    let ttl = Duration::from_secs(5);
    let mut con = harness.servers().await.unwrap().remove(0);
    let mut highest = FencingToken(0);
    for round in 0..3 {
        let readers: Vec<OwnerToken> = (0..3).map(|_| OwnerToken::generate().unwrap()).collect();
        for reader in &readers {
            let token = attempt(&backend, &key, reader, Hold::Read, ttl, false)
                .await
                .unwrap();
            highest = highest.max(token);
        }
        for reader in &readers {
            abandon(&backend, &key, reader, Hold::Read).await;
        }
        if round == 1 {
            let deleted: i64 = redis::cmd("DEL")
                .arg(rw_key(&key, "fence"))
                .query_async(&mut con)
                .await
                .unwrap();
            assert_eq!(deleted, 1, "the rwlock has no fence counter of its own");
        }
        let writer = OwnerToken::generate().unwrap();
        let written = attempt(&backend, &key, &writer, Hold::Write, ttl, false)
            .await
            .unwrap();
        assert!(
            written > highest,
            "round {round}: the write's token {written} is not above {highest}"
        );
        highest = written;
        abandon(&backend, &key, &writer, Hold::Write).await;
    }
    assert!(pttl(&mut con, &rw_key(&key, "fence")).await > 0);
    assert_eq!(keys_but_fences(&mut con, &ns).await, Vec::<String>::new());
}

/// How many connections of the server at `con` listen on `channel`.
async fn listeners(con: &mut MultiplexedConnection, channel: &str) -> i64 {
    let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(con)
        .await
        .unwrap_or_default();
    counts.first().map_or(0, |(_, n)| *n)
}

/// Three readers of one process waiting for a writer (a minute's TTL, a backoff cap of a
/// minute) are all granted right after its release, woken by its notification (each reader
/// granted passes the wake-up on), not by the cap or the writer's TTL; and a writer waiting
/// for those readers is woken by the last one's release.
async fn waiters_are_woken_by_releases(harness: common::RedisHarness) {
    let ns = namespace();
    let ttl = Duration::from_secs(60);
    let cap = Duration::from_secs(60);
    let patient = LockOptions::default()
        .with_ttl(ttl)
        .with_backoff(Duration::from_millis(5), cap);
    let holder = client(harness.backend().await.unwrap(), &ns, ttl);
    let waiters =
        LockClient::with_options(harness.backend().await.unwrap(), &ns, patient.clone()).unwrap();
    let key = holder.key("woken").unwrap();
    let mut con = harness.servers().await.unwrap().remove(0);
    let written = holder.rwlock("woken").unwrap().write().await.unwrap();
    let mut readers = Vec::new();
    for _ in 0..3 {
        let lock = waiters.rwlock("woken").unwrap();
        readers.push(tokio::spawn(async move {
            let guard = lock.read().await.unwrap();
            (guard, Instant::now())
        }));
    }
    let readers_channel = format!("lockkit:released:{}:rw:readers", common::lock_key(&key));
    assert!(
        eventually(PATIENCE, || async {
            listeners(&mut con.clone(), &readers_channel).await >= 1
        })
        .await,
        "the readers never subscribed"
    );
    // Let every reader settle into its wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(readers.iter().all(|r| !r.is_finished()));
    let released = Instant::now();
    assert!(written.release().await.unwrap());
    let mut guards = Vec::new();
    for reader in readers {
        let (guard, granted) = tokio::time::timeout(PATIENCE, reader)
            .await
            .expect("a waiting reader slept through the writer's release")
            .unwrap();
        assert!(granted.duration_since(released) < PATIENCE);
        guards.push(guard);
    }

    let writers = LockClient::with_options(harness.backend().await.unwrap(), &ns, patient).unwrap();
    let lock = writers.rwlock("woken").unwrap();
    let writing = tokio::spawn(async move {
        let guard = lock.write().await.unwrap();
        (guard, Instant::now())
    });
    assert!(
        eventually(PATIENCE, || async {
            waiting_writers(&mut con.clone(), &key).await == 1
        })
        .await,
        "the writer did not record itself"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let last = guards.pop().unwrap();
    for guard in guards {
        assert!(guard.release().await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!writing.is_finished(), "a writer got in beside a reader");
    let released = Instant::now();
    assert!(last.release().await.unwrap());
    // The writer's own wait is at most a third of its TTL (20 s): well past the patience.
    let (guard, granted) = tokio::time::timeout(PATIENCE, writing)
        .await
        .expect("the waiting writer slept through the last reader's release")
        .unwrap();
    assert!(granted.duration_since(released) < PATIENCE);
    assert!(guard.release().await.unwrap());
    assert_eq!(keys_but_fences(&mut con, &ns).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_releases_not_by_polling() {
    let Some(harness) = common::single().await else {
        return;
    };
    waiters_are_woken_by_releases(harness).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_releases_on_the_sentinel_primary() {
    let Some(harness) = common::sentinel().await else {
        return;
    };
    waiters_are_woken_by_releases(harness).await;
}

/// A reader and a writer that crash (a raw write grant of 1 s, then a raw read grant and a
/// waiting writer's record of 3 s): every key lives no longer than what it holds, with no
/// call to the server after the grants, and then vanishes by its own TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_rwlock_vanishes_by_its_ttls() {
    let Some(harness) = common::single().await else {
        return;
    };
    let backend = harness.backend().await.unwrap();
    let ns = namespace();
    let (short, long) = (Duration::from_millis(1000), Duration::from_secs(3));
    let mut con = harness.servers().await.unwrap().remove(0);

    let written = LockKey::new(&ns, "written").unwrap();
    let writer = OwnerToken::generate().unwrap();
    assert!(
        attempt(&backend, &written, &writer, Hold::Write, short, false)
            .await
            .is_some()
    );
    let read = LockKey::new(&ns, "read").unwrap();
    assert!(
        attempt(
            &backend,
            &read,
            &OwnerToken::generate().unwrap(),
            Hold::Read,
            long,
            false
        )
        .await
        .is_some()
    );
    let long_sent = Instant::now();
    assert_eq!(
        attempt(
            &backend,
            &read,
            &OwnerToken::generate().unwrap(),
            Hold::Write,
            long,
            true
        )
        .await,
        None
    );
    drop(backend);

    let mut expected = vec![
        rw_key(&read, "holders"),
        rw_key(&read, "tokens"),
        rw_key(&read, "waiting"),
        rw_key(&written, "holders"),
        rw_key(&written, "tokens"),
        rw_key(&written, "writer"),
    ];
    expected.sort();
    assert_eq!(keys_but_fences(&mut con, &ns).await, expected);
    for k in &expected {
        let left = pttl(&mut con, k).await;
        let bound = if k.contains("written") { short } else { long };
        assert!(
            left > 0 && left <= bound.as_millis() as i64,
            "{k} lives {left} ms, longer than what it holds ({bound:?})"
        );
    }
    let deadline = long_sent + long + PATIENCE;
    while !keys_but_fences(&mut con, &ns).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the rwlock's keys outlived their TTL"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(pttl(&mut con, &rw_key(&read, "fence")).await > 0);
}

/// Under the README's minimal ACL plus the semaphore's commands, read and write locks are
/// taken, a writer waits (recorded, and woken by a release notification), grants are renewed
/// and given back, and the server logs no denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlocks_work_under_the_minimal_acl() {
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
    let connect = || async {
        client(
            Arc::new(RedisBackend::connect(limited.clone()).await.unwrap()),
            &ns,
            ttl,
        )
    };
    let (a, b) = (connect().await, connect().await);
    let reading = a.rwlock("acl").unwrap().read().await.unwrap();
    let writer = b.rwlock("acl").unwrap();
    let writing = tokio::spawn(async move { writer.write().await });
    tokio::time::sleep(ttl * 2).await;
    assert!(!writing.is_finished(), "a writer got in beside a reader");
    assert!(!reader_gets_in(&a, "acl").await);
    assert!(
        reading.is_held().await.unwrap(),
        "the renewed read lock is not held"
    );
    assert!(reading.release().await.unwrap());
    let written = tokio::time::timeout(PATIENCE, writing)
        .await
        .expect("the writer was not woken")
        .unwrap()
        .unwrap();
    assert!(written.release().await.unwrap());
    assert_eq!(user.denials().await, []);
}

/// With `min_replicas`, a grant is made once the replica acknowledged it; one that fewer
/// replicas acknowledged (2 asked, the group has 1) is refused with `QuorumNotReached` and
/// given back, leaving nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_applies_to_rwlocks() {
    let Some(harness) = common::sentinel().await else {
        return;
    };
    let common::Topology::Sentinel(config) = &harness.topology else {
        panic!("the sentinel harness runs on Sentinel");
    };
    let ns = namespace();
    let replicated = |min_replicas: u32| {
        let mut config = config.clone();
        config.min_replicas = min_replicas;
        config.replica_timeout = Duration::from_millis(200);
        let ns = ns.clone();
        async move {
            let backend = Arc::new(RedisBackend::connect(config).await.unwrap());
            LockClient::with_options(backend, &ns, LockOptions::default()).unwrap()
        }
    };
    let acked = replicated(1).await;
    let read = acked.rwlock("replicated").unwrap().try_read().await;
    let read = read.unwrap().expect("a free read lock was refused");
    assert!(read.release().await.unwrap());

    let unacked = replicated(2).await;
    for refused in [
        unacked
            .rwlock("replicated")
            .unwrap()
            .try_read()
            .await
            .map(drop),
        unacked
            .rwlock("replicated")
            .unwrap()
            .try_write()
            .await
            .map(drop),
    ] {
        match refused {
            Err(e) => assert!(
                matches!(e.kind(), ErrorKind::QuorumNotReached { got: 1, need: 2 }),
                "{e}"
            ),
            Ok(()) => panic!("granted with one replica of two"),
        }
    }
    let mut con = harness.servers().await.unwrap().remove(0);
    assert_eq!(keys_but_fences(&mut con, &ns).await, Vec::<String>::new());
}

/// Redlock refuses read-write locks at creation, and a request sent to it directly, saying
/// why (the waiting-writer records and fencing counters of independent nodes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_rwlocks_and_says_why() {
    let Some(harness) = common::redlock().await else {
        return;
    };
    let backend = harness.backend().await.unwrap();
    let ns = namespace();
    let locks = LockClient::with_options(backend.clone(), &ns, LockOptions::default()).unwrap();
    let err = locks.rwlock("table").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("waiting-writer records"), "{err}");
    for hold in [Hold::Read, Hold::Write] {
        let request = AcquireRequest::new(
            LockKey::new(&ns, "table").unwrap(),
            OwnerToken::generate().unwrap(),
            Duration::from_secs(1),
            true,
        )
        .with_hold(hold);
        let err = backend.try_acquire(&request).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        assert!(err.to_string().contains("waiting-writer records"), "{err}");
    }
    for con in &mut harness.servers().await.unwrap() {
        assert_eq!(
            common::keys_of(con, &ns).await.unwrap(),
            Vec::<String>::new()
        );
    }
}
