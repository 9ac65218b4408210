//! The waiting writer's record: made only by a writer that waits, keeping new readers out
//! while it waits, removed by its grant and by an abandon, gone by itself one TTL after a
//! writer that vanished.

use std::time::{Duration, Instant};

use lockkit_core::backend::{Hold, OwnerToken};
use lockkit_core::{LockClient, LockKey, LockOptions};

use crate::{
    PATIENCE, abandon, attempt, client, common, eventually, keys_but_fences, listeners, namespace,
    reader_gets_in, rw_key, waiting_writers,
};

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
