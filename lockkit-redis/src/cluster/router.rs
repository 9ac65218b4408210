//! How [`RedisClusterBackend`] finds the primary of a lock's slot: the cluster's map
//! (`CLUSTER SLOTS`, read again after a failover), one [`RedisBackend`] per primary, and
//! [`RedisClusterBackend::on_key`], which runs a request there and follows the slot when it
//! moved, is migrating, or its primary failed.

use std::collections::HashMap;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use lockkit_core::{Error, ErrorKind, LockKey, Result};

use super::RedisClusterBackend;
use super::route::Reroute;
use super::slots::{Addr, SlotMap, slot_of};
use crate::backend::RedisBackend;
use crate::connection::sharded_pubsub_in;
use crate::error::BACKEND;
use crate::scripts::PubSub;

/// The pause between two tries of a request that met a slot's migration (`ASK`, `TRYAGAIN`,
/// a second `MOVED`); the tries go on for the request bound at most, then the caller's own
/// retries (a waiting `lock()`'s error budget) take over.
const MIGRATION_PAUSE: Duration = Duration::from_millis(10);

/// Reading the cluster's map more often than this does not find a failover faster.
const REFRESH_INTERVAL: Duration = Duration::from_millis(100);

impl RedisClusterBackend {
    /// Whether the primary at `addr` has sharded pub/sub.
    pub(super) async fn has_sharded_pubsub(&self, addr: &Addr) -> bool {
        let mut info = redis::cmd("INFO");
        info.arg("server");
        sharded_pubsub_in(self.ask(addr, "reading the server's version", &info).await)
    }

    /// `command` to the node at `addr`, on a connection of its own.
    pub(super) async fn ask<T: redis::FromRedisValue>(
        &self,
        addr: &Addr,
        what: &str,
        command: &redis::Cmd,
    ) -> Result<T> {
        let dialer = &self.inner.dialer;
        let client =
            dialer.client(dialer.info(&addr.0, addr.1, redis::ProtocolVersion::RESP2)?)?;
        dialer
            .bounded(what, async move {
                let mut con = client.get_multiplexed_async_connection().await?;
                command.query_async(&mut con).await
            })
            .await
    }

    /// The primary each queued mutex waiter last attempted on (see `Inner::waiters`).
    pub(super) fn waiters(&self) -> std::sync::MutexGuard<'_, HashMap<String, RedisBackend>> {
        self.inner
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The primary that serves `slot`, as the map says now.
    pub(super) fn owner(&self, slot: u16) -> Option<Addr> {
        self.inner
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .owner(slot)
            .cloned()
    }

    /// A copy of the cluster's map as it is now.
    pub(super) fn map(&self) -> SlotMap {
        self.inner
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The backend of the primary at `addr`, connecting to it first if need be.
    pub(super) async fn node(&self, addr: &Addr) -> Result<RedisBackend> {
        let cell = self
            .inner
            .nodes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(addr.clone())
            .or_default()
            .clone();
        let node = cell
            .get_or_try_init(|| {
                RedisBackend::cluster_node(
                    self.inner.dialer.clone(),
                    self.inner.config.clone(),
                    addr.clone(),
                    self.inner.pubsub.get().copied().unwrap_or(PubSub::Classic),
                    self.inner.proclaimed.clone(),
                )
            })
            .await?;
        Ok(node.clone())
    }

    /// Reads the map again, asking the primaries it names and the configured nodes at once
    /// (`failed`, a primary that did not answer, only if no other does), and takes the first
    /// answer; forgets the primaries that are no longer in it. Skipped when it was read after
    /// `since` (another request's read found what this one would) or less than
    /// [`REFRESH_INTERVAL`] ago.
    pub(super) async fn refresh(
        &self,
        since: Option<Instant>,
        failed: Option<&Addr>,
    ) -> Result<()> {
        let mut refreshed = self.inner.refreshed.lock().await;
        if let (Some(last), Some(since)) = (*refreshed, since)
            && (last > since || last.elapsed() < REFRESH_INTERVAL)
        {
            return Ok(());
        }
        let mut candidates = self.map().primaries();
        for seed in &self.inner.seeds {
            if !candidates.contains(seed) {
                candidates.push(seed.clone());
            }
        }
        if let Some(failed) = failed
            && candidates.len() > 1
        {
            candidates.retain(|c| c != failed);
        }
        let mut reads: FuturesUnordered<_> = candidates
            .iter()
            .map(|addr| async move { (addr, self.read_map(addr).await) })
            .collect();
        let mut failures = Vec::new();
        while let Some((addr, read)) = reads.next().await {
            match read {
                Ok(map) => {
                    let primaries = map.primaries();
                    *self
                        .inner
                        .map
                        .write()
                        .unwrap_or_else(PoisonError::into_inner) = map;
                    // A primary that left (demoted, removed) takes its connections with it
                    // once the requests in flight there are done.
                    self.inner
                        .nodes
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .retain(|addr, _| primaries.contains(addr));
                    *refreshed = Some(Instant::now());
                    return Ok(());
                }
                Err(e) => failures.push((format!("{}:{}", addr.0, addr.1), e)),
            }
        }
        // Every node refusing the same way (credentials, a server that is no cluster node) is
        // that error, not an outage.
        Err(crate::error::none_answered(
            BACKEND,
            "no node of the cluster answered CLUSTER SLOTS",
            &failures,
        ))
    }

    /// `CLUSTER SLOTS` from the node at `addr`, on a connection of its own.
    pub(super) async fn read_map(&self, addr: &Addr) -> Result<SlotMap> {
        let mut slots = redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let reply: redis::Value = self
            .ask(addr, "reading the cluster's slots", &slots)
            .await
            .map_err(|e| {
                if e.message().contains("cluster support disabled") {
                    Error::new(
                        ErrorKind::InvalidConfig,
                        BACKEND,
                        "not a Redis Cluster node (cluster support disabled): use a redis:// URL",
                    )
                } else {
                    e
                }
            })?;
        SlotMap::parse(&reply, &addr.0)
    }

    /// Runs `request` on the primary of `key`'s slot, following the slot when it moved or
    /// is migrating and the map when the primary failed, within the request bound (and one
    /// more request, on a replica promoted meanwhile). `request` learns whether an earlier
    /// try may have run on a primary that failed since (its answer never came).
    pub(super) async fn on_key<T, F, Fut>(&self, key: &LockKey, what: &str, request: F) -> Result<T>
    where
        F: Fn(RedisBackend, bool) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let slot = slot_of(key).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidKey,
                BACKEND,
                format!("{key}: a namespace that starts with '}}' has no hash tag in a Redis Cluster (its keys would land in different slots)"),
            )
        })?;
        let bound = self.inner.dialer.request_bound();
        let started = Instant::now();
        let mut may_have_run = false;
        let mut moves = 0u32;
        loop {
            let Some(owner) = self.owner(slot) else {
                self.refresh(Some(Instant::now()), None).await?;
                if self.owner(slot).is_none() {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        BACKEND,
                        format!("{what}: no primary serves slot {slot} (of {key})"),
                    )
                    .with_retryable(true));
                }
                continue;
            };
            let outcome = match self.node(&owner).await {
                Ok(node) => request(node, may_have_run).await,
                Err(e) => Err(e),
            };
            let error = match outcome {
                Ok(value) => return Ok(value),
                Err(e) => e,
            };
            let Some(reroute) = Reroute::of(&error) else {
                return Err(error);
            };
            match reroute {
                Reroute::Moved(to) => {
                    // "MOVED <slot> :<port>": the host is the one that answered.
                    let to = if to.0.is_empty() {
                        (owner.0.clone(), to.1)
                    } else {
                        to
                    };
                    self.inner
                        .map
                        .write()
                        .unwrap_or_else(PoisonError::into_inner)
                        .moved(slot, to);
                    // Two nodes can send a request back and forth while a migration is being
                    // finalized (each has yet to learn the other's `SETSLOT ... NODE`).
                    moves += 1;
                    if moves > 1 {
                        tokio::time::sleep(MIGRATION_PAUSE).await;
                    }
                }
                Reroute::Migrating => tokio::time::sleep(MIGRATION_PAUSE).await,
                Reroute::Unreachable => {
                    may_have_run = true;
                    // Until a replica serves the slot, or the bound: the map is read again
                    // (not the dead primary asked again, which costs a timeout each time).
                    loop {
                        let _ = self.refresh(Some(Instant::now()), Some(&owner)).await;
                        if self.owner(slot).is_some_and(|now| now != owner) {
                            break;
                        }
                        if started.elapsed() + REFRESH_INTERVAL >= bound {
                            return Err(unavailable(what, Some(slot), error));
                        }
                        tokio::time::sleep(REFRESH_INTERVAL).await;
                    }
                    continue;
                }
            }
            if started.elapsed() >= bound {
                return Err(unavailable(what, Some(slot), error));
            }
        }
    }
}

/// A release that found nothing, sent again after its first send went to a primary that
/// failed before answering: the first send may have released the lock (and the replica
/// learned it), or the grant never reached the replica. Which one, nobody can tell: not
/// `Ok(false)`, which would say the lock was lost before its release.
pub(super) fn gone_when_sent_again(released: Result<bool>, resent: bool) -> Result<bool> {
    match released {
        Ok(false) if resent => Err(Error::new(
            ErrorKind::Unavailable,
            BACKEND,
            "the release was sent again after a failover and found the lock gone: the first send may have released it, or the grant was lost in the failover",
        )),
        other => other,
    }
}

/// The error of a request whose slot had no primary to run it within the bound: the slot
/// moving, migrating, or its primary failing over. Retryable: it will have one.
pub(super) fn unavailable(what: &str, slot: Option<u16>, error: Error) -> Error {
    let slot = slot.map_or_else(|| "a lock's slot".to_owned(), |slot| format!("slot {slot}"));
    Error::new(
        ErrorKind::Unavailable,
        BACKEND,
        format!(
            "{what}: {slot} had no primary to answer (moving, migrating or failing over): {}",
            error.message()
        ),
    )
    .with_retryable(true)
    .with_source(error)
}
