//! What the conformance suite cannot see of Redis read-write locks: the waiting writer's
//! record (made only by a writer that waits, removed by its grant and by an abandon, gone by
//! itself one TTL after a writer that vanished), write tokens above every earlier grant's
//! (also after the fence counter is lost), waiters woken by notifications and not by
//! polling (every waiting reader of a process, and a writer waiting for the last reader),
//! the keys vanishing by their TTL, the minimal ACL, `min_replicas`, and Redlock's refusal.
//! One test binary, its tests in modules by topic; the helpers they share are here.
#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

#[path = "../common/mod.rs"]
mod common;

mod deployments;
mod grants;
mod key_ttls;
mod waiting_writer;
mod wake_ups;

use std::time::{Duration, Instant};

use lockkit_core::backend::{AcquireRequest, Attempt, Hold, OwnerToken, SharedBackend};
use lockkit_core::{FencingToken, LockClient, LockKey, LockOptions};
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
