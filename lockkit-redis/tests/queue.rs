//! The waiters' queue of a mutex on a single Redis node: waiters are granted in the order they
//! queued, each release hands the lock straight to the next waiter (no moment where a
//! `try_lock` could take it), a waiter that gives up takes its entry with it, and the entry
//! of a waiter that vanished keeps the lock from others only until it lapses. A non-fair
//! waiter does not queue: a release hands over to the fair waiters queued, and frees the
//! lock for the non-fair one when none is.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common;

use std::time::Duration;

use lockkit_core::{FencingToken, LockClient, LockKey, LockOptions, MutexGuard, Result};
use redis::aio::MultiplexedConnection;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Long enough that no holder expires and no waiter's wait runs out during a test.
fn options() -> LockOptions {
    LockOptions::default()
        .with_ttl(Duration::from_secs(30))
        .with_backoff(Duration::from_millis(20), Duration::from_secs(5))
}

struct Setup {
    raw: MultiplexedConnection,
    queue: String,
    entries: String,
    lock: String,
    clients: Vec<LockClient>,
}

async fn setup(clients: usize) -> Option<Setup> {
    let harness = common::single().await?;
    let raw = harness.servers().await.expect("raw connection").remove(0);
    let namespace = format!("lk-test-{:08x}", rand::random::<u32>());
    let lock = common::lock_key(&LockKey::new(&namespace, "k").unwrap());
    let mut all = Vec::new();
    for _ in 0..clients {
        let backend = harness.backend().await.expect("connect");
        all.push(LockClient::with_options(backend, &namespace, options()).expect("client"));
    }
    Some(Setup {
        raw,
        queue: format!("{lock}:queue"),
        entries: format!("{lock}:queue:entries"),
        lock,
        clients: all,
    })
}

impl Setup {
    /// How many waiters are in the queue.
    async fn queued(&mut self) -> usize {
        redis::cmd("ZCARD")
            .arg(&self.queue)
            .query_async(&mut self.raw)
            .await
            .unwrap()
    }

    /// Waits (up to 10 s) until `n` waiters are in the queue.
    async fn until_queued(&mut self, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.queued().await != n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} waiters queued after 10 s, not {n}",
                self.queued().await
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Client `i`'s `lock()`, in a task that sends the guard when granted.
    fn waiter(&self, i: usize) -> (JoinHandle<Result<()>>, oneshot::Receiver<MutexGuard>) {
        let mutex = self.clients[i].mutex("k").unwrap();
        let (granted, guard) = oneshot::channel();
        let task = tokio::spawn(async move {
            let _ = granted.send(mutex.lock().await?);
            Ok(())
        });
        (task, guard)
    }

    /// Whether client `i`'s `try_lock` gets the lock now (given back at once).
    async fn free_for(&self, i: usize) -> bool {
        match self.clients[i]
            .mutex("k")
            .unwrap()
            .try_lock()
            .await
            .unwrap()
        {
            Some(guard) => guard.release().await.unwrap(),
            None => false,
        }
    }

    /// The server's clock, in ms.
    async fn server_ms(&mut self) -> u64 {
        let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut self.raw).await.unwrap();
        s * 1000 + us / 1000
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_the_order_they_queued_with_no_gap_between_grants() {
    let Some(mut s) = setup(5).await else {
        return;
    };
    let held = s.clients[0].mutex("k").unwrap().lock().await.unwrap();
    let mut last: FencingToken = held.fencing_token();
    let mut waiters = Vec::new();
    for i in 1..4 {
        waiters.push(s.waiter(i));
        s.until_queued(i).await;
    }
    assert!(held.release().await.unwrap());
    for (i, (task, granted)) in waiters.into_iter().enumerate() {
        // The lock went straight from each holder to the next waiter in line.
        assert!(
            !s.free_for(4).await,
            "a try_lock took the lock after release {i}"
        );
        let guard = tokio::time::timeout(Duration::from_secs(10), granted)
            .await
            .unwrap_or_else(|_| panic!("waiter {} was not granted in 10 s", i + 1))
            .unwrap();
        assert!(guard.fencing_token() > last, "tokens go up with each grant");
        last = guard.fencing_token();
        assert_eq!(
            s.queued().await,
            2 - i,
            "waiter {} was granted out of turn",
            i + 1
        );
        assert!(guard.release().await.unwrap());
        task.await.unwrap().unwrap();
    }
    assert!(
        s.free_for(4).await,
        "the lock is free once the queue is empty"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_takes_its_entry_with_it() {
    let Some(mut s) = setup(3).await else {
        return;
    };
    let held = s.clients[0].mutex("k").unwrap().lock().await.unwrap();
    let (waiting, _granted) = s.waiter(1);
    s.until_queued(1).await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    // Its clean-up runs in the background.
    s.until_queued(0).await;
    assert!(held.release().await.unwrap());
    assert!(
        s.free_for(2).await,
        "the lock went to a waiter that had left"
    );
    let entries: bool = redis::cmd("EXISTS")
        .arg(&s.entries)
        .query_async(&mut s.raw)
        .await
        .unwrap();
    assert!(!entries || s.queued().await == 0, "an entry was left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_entry_of_a_vanished_waiter_keeps_the_lock_only_until_it_lapses() {
    let Some(mut s) = setup(3).await else {
        return;
    };
    let held = s.clients[0].mutex("k").unwrap().lock().await.unwrap();
    // A waiter that queued and vanished: its entry lapses 700 ms from now, and its inbox
    // has no listener.
    let lapses_at = s.server_ms().await + 700;
    let owner = "0123456789abcdef0123456789abcdef";
    let () = redis::pipe()
        .cmd("ZADD")
        .arg(&s.queue)
        .arg(1)
        .arg(owner)
        .ignore()
        .cmd("HSET")
        .arg(&s.entries)
        .arg(owner)
        .arg(format!(
            "{lapses_at} fedcba9876543210fedcba9876543210 lockkit:inbox:nobody"
        ))
        .ignore()
        .query_async(&mut s.raw)
        .await
        .unwrap();
    assert!(held.release().await.unwrap());
    let holder: Option<String> = redis::cmd("GET")
        .arg(&s.lock)
        .query_async(&mut s.raw)
        .await
        .unwrap();
    assert!(
        holder.is_some_and(|h| h.starts_with(owner)),
        "the release handed the lock to the first waiter in line"
    );
    assert!(
        !s.free_for(2).await,
        "a try_lock took a lock handed to another"
    );
    let guard = s.clients[1]
        .mutex("k")
        .unwrap()
        .lock_timeout(Duration::from_secs(10))
        .await
        .expect("granted once the vanished waiter's entry lapsed");
    let granted_at = s.server_ms().await;
    assert!(
        granted_at >= lapses_at,
        "granted {} ms before the vanished waiter's entry lapsed",
        lapses_at - granted_at
    );
    assert!(guard.release().await.unwrap());
}

/// However many lapsed entries are ahead of a live waiter (their waiters vanished), a
/// release hands the lock to that waiter: never frees it without telling anyone, and never
/// lets a caller who asks next take it ahead of the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapsed_entries_ahead_never_let_a_late_caller_take_the_lock_from_a_live_waiter() {
    let Some(mut s) = setup(3).await else {
        return;
    };
    let held = s.clients[0].mutex("k").unwrap().lock().await.unwrap();
    // 250 entries of waiters that vanished: turns 1-250, each lapsed a minute ago.
    let lapsed = s.server_ms().await - 60_000;
    for turn in 1..=250_u32 {
        let owner = format!("{turn:032x}");
        let _: () = redis::pipe()
            .cmd("ZADD")
            .arg(&s.queue)
            .arg(turn)
            .arg(&owner)
            .ignore()
            .cmd("HSET")
            .arg(&s.entries)
            .arg(&owner)
            .arg(format!("{lapsed} d "))
            .ignore()
            .query_async(&mut s.raw)
            .await
            .unwrap();
    }
    for key in [&s.queue, &s.entries] {
        let _: () = redis::cmd("PEXPIRE")
            .arg(key)
            .arg(60_000)
            .query_async(&mut s.raw)
            .await
            .unwrap();
    }
    let (_task, granted) = s.waiter(1);
    s.until_queued(251).await;
    assert!(held.release().await.unwrap());
    assert!(
        !s.free_for(2).await,
        "a caller took the lock ahead of the live waiter behind 250 lapsed entries"
    );
    let guard = tokio::time::timeout(Duration::from_secs(5), granted)
        .await
        .expect("the live waiter behind 250 lapsed entries was not granted")
        .unwrap();
    assert!(guard.release().await.unwrap());
    assert_eq!(s.queued().await, 0, "lapsed entries are left in the queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_fair_waiter_keeps_nothing_queued_and_takes_the_lock_when_a_release_frees_it() {
    let Some(mut s) = setup(3).await else {
        return;
    };
    let held = s.clients[0].mutex("k").unwrap().lock().await.unwrap();
    let barging = s.clients[1]
        .mutex("k")
        .unwrap()
        .with_options(options().with_fair(false))
        .unwrap();
    let (barged, mut barger) = oneshot::channel();
    let barging = tokio::spawn(async move {
        let _ = barged.send(barging.lock().await?);
        Ok::<_, lockkit_core::Error>(())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.queued().await, 0, "a non-fair waiter queued");

    // A fair waiter that came later queues, and the release hands the lock to it.
    let (fair_task, fair) = s.waiter(2);
    s.until_queued(1).await;
    assert!(held.release().await.unwrap());
    let handed = tokio::time::timeout(Duration::from_secs(10), fair)
        .await
        .expect("the release did not hand the lock to the queued fair waiter")
        .unwrap();
    assert!(
        barger.try_recv().is_err(),
        "the non-fair waiter took a lock handed over to a fair one"
    );

    // Nobody queued: its release frees the lock, and the non-fair waiter takes it.
    let handed_token = handed.fencing_token();
    assert!(handed.release().await.unwrap());
    let taken = tokio::time::timeout(Duration::from_secs(10), barger)
        .await
        .expect("the non-fair waiter did not take the freed lock")
        .unwrap();
    assert!(taken.fencing_token() > handed_token);
    assert!(taken.release().await.unwrap());
    fair_task.await.unwrap().unwrap();
    barging.await.unwrap().unwrap();
}
