//! Hand-overs, against the server of `compose/up.sh postgres`: a mutex's release grants the
//! first row behind and notifies it, and the waiter takes that as its grant only with the
//! proof the server made (anybody who may connect may `NOTIFY`).
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod support;

use std::time::{Duration, Instant};

use lockkit_core::LockKey;
use lockkit_core::backend::{AcquireRequest, Attempt, Contention, Lease, LockBackend, OwnerToken};
use lockkit_postgres::PostgresBackend;

const TTL: Duration = Duration::from_secs(10);

/// Two clients of the test server, a fresh key, and the first one's grant on it.
async fn held() -> Option<(PostgresBackend, PostgresBackend, LockKey, Lease)> {
    let config = support::server_config().await?;
    let holder = PostgresBackend::connect(config.clone()).await.unwrap();
    let waiter = PostgresBackend::connect(config).await.unwrap();
    let key = LockKey::new("lk-handover", &format!("{:016x}", rand::random::<u64>())).unwrap();
    let first = AcquireRequest::new(key.clone(), OwnerToken::generate().unwrap(), TTL, true);
    let sent = Instant::now();
    let Attempt::Granted(grant) = holder.try_acquire(&first).await.unwrap() else {
        panic!("the first attempt on a fresh key is not granted");
    };
    let lease = Lease::new(key.clone(), first.owner, grant.fencing_token, TTL, sent);
    Some((holder, waiter, key, lease))
}

/// A waiting request of `waiter` on `key`, and the contention of its last attempt, made
/// once the client listens to the key's channel: a wait that lasts its whole (short) time
/// says so, where one that ends early was cut short by the subscription, or was a poll while
/// the client's listener was still connecting.
async fn queued(waiter: &PostgresBackend, key: &LockKey) -> (AcquireRequest, Contention) {
    const QUIET: Duration = Duration::from_millis(400);
    let request = AcquireRequest::new(key.clone(), OwnerToken::generate().unwrap(), TTL, true);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let Attempt::Contended(contention) = waiter.try_acquire(&request).await.unwrap() else {
            panic!("the second attempt is granted while the first holds");
        };
        let started = Instant::now();
        let handed = waiter
            .wait_for_change(&request, &contention, QUIET)
            .await
            .unwrap();
        assert!(handed.is_none(), "handed over while the holder holds");
        if started.elapsed() >= QUIET {
            let Attempt::Contended(contention) = waiter.try_acquire(&request).await.unwrap() else {
                panic!("the second attempt is granted while the first holds");
            };
            return (request, contention);
        }
        assert!(
            Instant::now() < deadline,
            "the client never listened to the key"
        );
    }
}

/// The release hands the mutex over: the waiter's wait ends with the grant, one token higher
/// than the holder's at least, live on the server, without another attempt.
#[tokio::test]
async fn a_release_hands_the_mutex_over_to_the_waiter() {
    let Some((holder, waiter, key, lease)) = held().await else {
        return;
    };
    let (request, contention) = queued(&waiter, &key).await;
    let (handed, released) = tokio::join!(
        waiter.wait_for_change(&request, &contention, Duration::from_secs(5)),
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            holder.release(&lease).await
        }
    );
    assert!(
        released.unwrap(),
        "the holder's release found no live grant"
    );
    let grant = handed
        .unwrap()
        .expect("the wait ended without the hand-over");
    assert!(grant.fencing_token > lease.fencing_token());
    assert_eq!(grant.valid_for, TTL);
    let next = Lease::new(key, request.owner, grant.fencing_token, TTL, Instant::now());
    assert!(
        waiter.release(&next).await.unwrap(),
        "the handed-over grant is not live"
    );
}

/// A hand-over notification that anybody can send, naming the waiter's row with a proof made
/// without its owner's digest, grants nothing; the holder still holds.
#[tokio::test]
async fn a_forged_handover_grants_nothing() {
    let Some((holder, waiter, key, lease)) = held().await else {
        return;
    };
    let config = support::server_config().await.unwrap();
    let admin = support::admin(&config).await;
    let (request, contention) = queued(&waiter, &key).await;
    let name = format!("0/{}/{}", key.namespace(), key.name());
    let channel: String = admin
        .query_one("SELECT lockkit.channel($1)", &[&name])
        .await
        .unwrap()
        .get(0);
    let row = contention.entry.expect("a queued attempt names its row");
    let forged = format!("h {row} {:032x} {name}", rand::random::<u128>());
    let (handed, ()) = tokio::join!(
        waiter.wait_for_change(&request, &contention, Duration::from_secs(2)),
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            admin
                .execute("SELECT pg_notify($1, $2)", &[&channel, &forged])
                .await
                .unwrap();
        }
    );
    assert!(
        handed.unwrap().is_none(),
        "a forged hand-over was taken as a grant"
    );
    assert!(
        holder.release(&lease).await.unwrap(),
        "the holder lost its grant"
    );
    waiter.abandon(&request).await.unwrap();
}
