//! The reservation that bounds how long a mutex waiter is overtaken, against a single Redis
//! node: a waiter that has waited past `OVERTAKEN_AFTER` reserves the lock, and the release
//! keeps it for that waiter, not for a `try_lock` that asks first; a waiter that gives up
//! deletes its reservation; a reservation left by a waiter that vanished keeps the free lock
//! from others only until it expires.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::time::{Duration, Instant};

use lockkit_core::{LockClient, LockKey, LockOptions, MutexGuard, Result};
use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;

/// Long enough that a holder never expires during a test, short enough that a waiter's
/// attempts (at least one per `backoff_max`) come often.
fn options() -> LockOptions {
    LockOptions::default()
        .with_ttl(Duration::from_secs(10))
        .with_backoff(Duration::from_millis(20), Duration::from_millis(100))
}

struct Setup {
    raw: MultiplexedConnection,
    reservation: String,
    holder: LockClient,
    waiter: LockClient,
    other: LockClient,
}

async fn setup() -> Option<Setup> {
    let harness = common::single().await?;
    let raw = harness.servers().await.expect("raw connection").remove(0);
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let key = LockKey::new(&namespace, "k").unwrap();
    let mut clients = Vec::new();
    for _ in 0..3 {
        let backend = harness.backend().await.expect("connect");
        clients.push(LockClient::with_options(backend, &namespace, options()).expect("client"));
    }
    let other = clients.pop().unwrap();
    let waiter = clients.pop().unwrap();
    let holder = clients.pop().unwrap();
    Some(Setup {
        raw,
        reservation: format!("{}:next", common::lock_key(&key)),
        holder,
        waiter,
        other,
    })
}

impl Setup {
    /// The holder's guard, and the waiter's acquisition queued behind it, once the waiter has
    /// reserved the lock.
    async fn reserved_behind_a_holder(&mut self) -> (MutexGuard, JoinHandle<Result<MutexGuard>>) {
        let held = self.holder.mutex("k").unwrap().lock().await.unwrap();
        let mutex = self.waiter.mutex("k").unwrap();
        let waiting =
            tokio::spawn(async move { mutex.lock_timeout(Duration::from_secs(20)).await });
        until_reservation(&mut self.raw, &self.reservation, true).await;
        (held, waiting)
    }

    /// Whether a third client's `try_lock` gets the lock now (given back at once).
    async fn free_for_others(&self) -> bool {
        match self.other.mutex("k").unwrap().try_lock().await.unwrap() {
            Some(guard) => guard.release().await.unwrap(),
            None => false,
        }
    }
}

/// Waits (up to 10 s) until the reservation key exists, or, with `present` false, is gone.
async fn until_reservation(raw: &mut MultiplexedConnection, key: &str, present: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let exists: bool = redis::cmd("EXISTS")
            .arg(key)
            .query_async(raw)
            .await
            .unwrap();
        if exists == present {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the reservation {} after 10 s",
            if present {
                "never came"
            } else {
                "is still there"
            }
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_keeps_the_lock_for_the_waiter_that_reserved_it() {
    let Some(mut s) = setup().await else {
        return;
    };
    let (held, waiting) = s.reserved_behind_a_holder().await;
    assert!(held.release().await.unwrap());
    // Asked right after the release, before the waiter (woken by a message) can ask.
    assert!(
        !s.free_for_others().await,
        "a try_lock took the lock reserved for the waiter"
    );
    let guard = waiting.await.unwrap().expect("the waiter's grant");
    until_reservation(&mut s.raw, &s.reservation, false).await;
    assert!(guard.release().await.unwrap());
    assert!(
        s.free_for_others().await,
        "the lock is free for anyone after the reserved grant"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_takes_its_reservation_with_it() {
    let Some(mut s) = setup().await else {
        return;
    };
    let (held, waiting) = s.reserved_behind_a_holder().await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    // Its clean-up runs in the background.
    until_reservation(&mut s.raw, &s.reservation, false).await;
    assert!(held.release().await.unwrap());
    assert!(
        s.free_for_others().await,
        "the lock stayed kept for a waiter that left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_of_a_vanished_waiter_keeps_the_lock_only_until_it_expires() {
    let Some(mut s) = setup().await else {
        return;
    };
    let life = Duration::from_millis(500);
    let planted = Instant::now();
    let () = redis::cmd("SET")
        .arg(&s.reservation)
        .arg("0123456789abcdef0123456789abcdef")
        .arg("PX")
        .arg(life.as_millis().to_string())
        .query_async(&mut s.raw)
        .await
        .unwrap();
    assert!(
        !s.free_for_others().await,
        "a try_lock took a lock reserved for another"
    );
    let guard = s
        .waiter
        .mutex("k")
        .unwrap()
        .lock_timeout(Duration::from_secs(10))
        .await
        .expect("granted once the reservation expired");
    assert!(
        planted.elapsed() >= life,
        "granted {:?} after the reservation was planted, before it expired",
        planted.elapsed()
    );
    assert!(guard.release().await.unwrap());
}
