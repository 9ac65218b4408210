//! Who is granted beside whom (readers share, a writer excludes everyone, a repeated attempt
//! finds its own grant, a stranger cannot release), and the tokens grants carry.

use std::time::{Duration, Instant};

use lockkit_core::backend::{Hold, OwnerToken};
use lockkit_core::{FencingToken, LockClient, LockKey};

use crate::{
    abandon, attempt, client, common, keys_but_fences, namespace, pttl, reader_gets_in, rw_key,
};

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
