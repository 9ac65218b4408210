//! The peers: the fastest real alternative to lockkit on a tier, measured in the same rounds
//! as lockkit and its raw floor, so that every ratio has a real client next to it.
//!
//! - Redis, one node, and Redlock-5: `rslock` 0.10 (the fastest Rust Redlock crate), over the
//!   same servers (one node, or the same five Redlock nodes), as shipped: its default retry
//!   (3 attempts, each after a random pause of 0-200 ms) inside `LockManager::acquire`, which
//!   starts again when the retries run out, as a user's loop would. Each W2 worker has its
//!   own `LockManager`, so its own connections.
//! - Other tiers: no peer here (Curator, the ZooKeeper peer, is a JVM library). On
//!   PostgreSQL, what the usual lock libraries do is session-level advisory locks: the
//!   advisory-lock floor (`postgres_floors.rs`) is that, by hand, with nothing on top.

use std::time::Duration;

use rslock::{LockGuard, LockManager};

use crate::floors::BoxError;

/// The holder's TTL, as lockkit's default and the floors'.
const TTL: Duration = Duration::from_secs(10);

/// How long one acquire may take before the run fails: `LockManager::acquire` loops forever
/// when the servers are gone (it sees an error as a refusal).
const GIVE_UP: Duration = Duration::from_secs(60);

/// The peer of one tier: the servers it locks on.
pub(crate) struct Peer {
    hosts: Vec<String>,
}

impl Peer {
    /// The peer for a target of the suite, or `None` where there is none.
    pub(crate) fn for_target(target: &str, url: &str) -> Result<Option<Peer>, BoxError> {
        Ok(match target {
            "redis" | "redlock-5" => Some(Peer {
                hosts: crate::floor_servers::url_hosts(url)?,
            }),
            _ => None,
        })
    }

    /// What the peer is, for the table.
    pub(crate) fn describe(&self) -> &'static str {
        "rslock 0.10"
    }

    /// A client of its own (its own connections, made before it is timed) for `key`.
    pub(crate) async fn client(&self, key: &str) -> Result<PeerClient, BoxError> {
        let mut clients = Vec::new();
        for host in &self.hosts {
            clients.push(redis::Client::open(format!("redis://{host}"))?);
        }
        let manager = LockManager::from_clients(clients);
        // Connects to every server (rslock connects on first use).
        manager.query_redis_for_key_value(key.as_bytes()).await?;
        Ok(PeerClient {
            manager,
            key: key.to_owned(),
            held: None,
        })
    }
}

/// One rslock client and the lock it holds.
pub(crate) struct PeerClient {
    manager: LockManager,
    key: String,
    held: Option<LockGuard>,
}

impl PeerClient {
    /// Takes the lock, retrying as `LockManager::acquire` does.
    pub(crate) async fn lock(&mut self) -> Result<(), BoxError> {
        let guard = tokio::time::timeout(GIVE_UP, self.manager.acquire(self.key.as_str(), TTL))
            .await
            .map_err(|_| format!("rslock: no grant in {GIVE_UP:?}"))??;
        self.held = Some(guard);
        Ok(())
    }

    /// Releases the lock taken by [`PeerClient::lock`] (best effort, as rslock releases).
    pub(crate) async fn unlock(&mut self) -> Result<(), BoxError> {
        self.held.take().ok_or("not held")?.release().await;
        Ok(())
    }

    /// One acquire+release.
    pub(crate) async fn cycle(&mut self) -> Result<(), BoxError> {
        self.lock().await?;
        self.unlock().await
    }
}
