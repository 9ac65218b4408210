//! Elections on one Redis server or a Sentinel-managed primary: the leader is the holder of
//! the election's lock, its term the grant's fencing token.
//!
//! - **proclaim**: one script that checks that the lock still holds this very grant (owner
//!   and token) and sets the value key `{namespace/name}:value` to `token:value`, expiring
//!   with the lock; renewals of a grant that proclaimed extend it with the lock (the backend
//!   remembers which: [`Proclaimed`]), release and force-release delete it.
//!   It publishes `proclaimed` on the lock's release channel. With `min_replicas`, a `WAIT`
//!   follows in the same pipeline, as for a grant.
//! - **leader**: `MGET` of the lock and the value key, one atomic read; the value counts
//!   only if its token is the holder's, so a holder is never shown with another grant's value.
//! - **observe**: observers share the backend's pub/sub subscription of the release channel
//!   with the lock waiters, but every observer is woken by every release and proclamation
//!   (a lock waiter is woken one at a time). An expiry publishes nothing: the core's wait
//!   bound (`backoff_max`) covers it.
//!
//! The guarantees are the lock's: on Sentinel a failover can lose the lock and its value
//! (the replicated tier's hole), and a second leader may then be elected while the first
//! still believes it leads, until its next renewal tells it; terms are best-effort fencing
//! tokens, which a failover can make repeat (see the crate docs).

use std::collections::HashSet;
use std::sync::{Mutex as StdMutex, PoisonError};
use std::time::Duration;

use lockkit_core::backend::{Leader, Lease};
use lockkit_core::{Error, ErrorKind, LockKey, Result};
use redis::Value;
use redis::aio::ConnectionManager;

use crate::backend::RedisBackend;
use crate::connection::Epoch;
use crate::error::{BACKEND, refused_in_pipeline, unexpected};
use crate::scripts::{self, Keys, millis};

/// The grants of this backend that proclaimed a value, by lock key and token: only their
/// renewals name the value key. It exists only after a proclamation, and a Cluster refuses a
/// script that names a missing key (`TRYAGAIN`) for as long as the key's slot migrates, so a
/// renewal naming it for every lock could lose every lease of a migrating slot.
#[derive(Debug, Default)]
pub(crate) struct Proclaimed(StdMutex<HashSet<(String, u64)>>);

impl Proclaimed {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<(String, u64)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn id(lease: &Lease) -> (String, u64) {
        (Keys::of(lease.key()).lock, lease.fencing_token().get())
    }

    /// Whether `lease` proclaimed a value.
    pub(crate) fn contains(&self, lease: &Lease) -> bool {
        self.set().contains(&Proclaimed::id(lease))
    }

    /// `lease` ended (released, or found lost): its value went with it.
    pub(crate) fn forget(&self, lease: &Lease) {
        self.set().remove(&Proclaimed::id(lease));
    }
}

impl RedisBackend {
    /// See [`LockBackend::proclaim`](lockkit_core::backend::LockBackend::proclaim).
    pub(crate) async fn proclaim_value(&self, lease: &Lease, value: &str) -> Result<bool> {
        let keys = Keys::of(lease.key());
        let need = self.config.min_replicas;
        let mut pipe = redis::pipe();
        // Error replies in place, so that a NOSCRIPT (a restart, a failover to a replica
        // that never saw the script) is reloaded by `query_reloading`.
        pipe.ignore_errors();
        pipe.cmd("EVALSHA")
            .arg(self.publishing().proclaim.get_hash())
            .arg(2)
            .arg(&keys.lock)
            .arg(&keys.value)
            .arg(lease.owner().expose_hex())
            .arg(lease.fencing_token().0)
            .arg(value)
            .arg(&keys.channel);
        if need > 0 {
            pipe.cmd("WAIT")
                .arg(need)
                .arg(millis(self.config.replica_timeout));
        }
        // WAIT counts the writes of its own connection, the one reserved for it.
        let pick: fn(&Epoch) -> ConnectionManager = if need > 0 {
            |epoch| epoch.replication.clone()
        } else {
            Epoch::for_caller
        };
        let pipe = &pipe;
        let replies = self
            .primary
            .request_on("proclaiming", pick, |mut con| async move {
                scripts::query_reloading(pipe, &mut con).await
            })
            .await?;
        let stored = match replies.first() {
            Some(Value::Int(1)) => {
                self.proclaimed.set().insert(Proclaimed::id(lease));
                true
            }
            Some(Value::Int(0)) => return Ok(false),
            Some(Value::ServerError(e)) => {
                return Err(refused_in_pipeline("the proclaim script", e));
            }
            _ => return Err(unexpected(BACKEND, "the proclaim script")),
        };
        if need > 0 {
            let acked = match replies.get(1) {
                Some(Value::Int(n)) => usize::try_from(*n).unwrap_or(0),
                _ => return Err(unexpected(BACKEND, "WAIT")),
            };
            if acked < need as usize {
                return Err(Error::new(
                    ErrorKind::QuorumNotReached {
                        got: acked,
                        need: need as usize,
                    },
                    BACKEND,
                    format!(
                        "the proclaimed value reached {acked} replica(s), min_replicas = {need}"
                    ),
                )
                .with_retryable(true));
            }
        }
        Ok(stored)
    }

    /// See [`LockBackend::leader`](lockkit_core::backend::LockBackend::leader).
    pub(crate) async fn read_leader(&self, key: &LockKey) -> Result<Option<Leader>> {
        let keys = &Keys::of(key);
        let reply: Value = self
            .primary
            .request("reading the leader", |mut con| async move {
                redis::cmd("MGET")
                    .arg(&keys.lock)
                    .arg(&keys.value)
                    .query_async(&mut con)
                    .await
            })
            .await?;
        scripts::leader_reply(BACKEND, &reply)
    }

    /// See [`LockBackend::wait_for_leader_change`](lockkit_core::backend::LockBackend::wait_for_leader_change).
    pub(crate) async fn wait_for_leader(
        &self,
        key: &LockKey,
        seen: Option<&Leader>,
        max_wait: Duration,
    ) -> Result<()> {
        let keys = Keys::of(key);
        let Some(subscription) = self.listen(&keys.channel, None).await? else {
            tokio::time::sleep(max_wait).await;
            return Ok(());
        };
        let changed = subscription.leader_changes().notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        // Subscribed and listening: a change after this read is seen, one before it is here.
        if self.read_leader(key).await?.as_ref() != seen {
            return Ok(());
        }
        let _ = tokio::time::timeout(max_wait, changed).await;
        Ok(())
    }
}
