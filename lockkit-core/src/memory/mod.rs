//! The in-process backend: real lock semantics inside one process, no server.
//!
//! Every kind of grant lives in one shape, a [`Slot`] of live holders per key and kind, the
//! way a server backend keeps them: the kind decides only who may join the holders
//! ([`Slot::blocked_until`]). So one attempt, one wait, one renewal and one release serve the
//! mutex, the semaphore and the read-write lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::backend::{
    AcquireRequest, Attempt, Contention, Grant, Hold, LockBackend, LockInfo, LockPage, Renewal,
};
use crate::capabilities::{Capabilities, FencingGuarantee, Support, Tier, WaitStrategy};
use crate::election::Leader;
use crate::error::Result;
use crate::key::LockKey;
use crate::lease::Lease;
use crate::token::{FencingToken, OwnerToken};

/// A lock backend that lives in this process: TTL expiry, a fencing counter, owner-checked
/// release and renewal, and release notifications, exactly as the server backends behave, but
/// excluding only the tasks of this process ([`Tier::Local`]).
///
/// Use it as the embedded default of a single-instance service, in tests and in examples.
/// Clones share the same locks.
///
/// ```
/// use lockkit_core::{LockClient, MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockkit_core::Result<()> {
/// let locks = LockClient::new(MemoryBackend::new());
/// let first = locks.mutex("job")?.lock().await?;
/// assert!(locks.mutex("job")?.try_lock().await?.is_none());
/// drop(first);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    slots: StdMutex<HashMap<(Kind, LockKey), Slot>>,
    /// One counter for all keys: strictly increasing per key, and slots of free keys can be
    /// dropped without forgetting where their tokens were.
    fence: AtomicU64,
}

/// Which primitive a slot belongs to: the mutex, the semaphore and the read-write lock of
/// one name are independent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Mutex,
    Semaphore,
    RwLock,
}

impl Kind {
    fn of(hold: Hold) -> Kind {
        match hold {
            Hold::Permit { .. } => Kind::Semaphore,
            Hold::Read | Hold::Write => Kind::RwLock,
            _ => Kind::Mutex,
        }
    }
}

/// The live grants of one key and kind, the semaphore's agreed permits, and who queues: the
/// writers waiting for a read-write lock, the waiters of a fair mutex or semaphore.
///
/// A queued waiter is recorded with an expiry of one TTL, refreshed by each of its attempts
/// (its wait is cut to half a TTL so that it attempts in time), keeping its place. While a
/// writer is recorded, readers wait: a stream of readers cannot starve a writer. A writer or
/// a fair mutex is granted only to the first live waiter of its queue (or to anyone when
/// nobody queues), a fair semaphore's free permits only to as many of its first live waiters:
/// first come, first served. A waiter that went away without abandoning holds up
/// the others for at most its TTL.
#[derive(Debug, Default)]
struct Slot {
    holders: Vec<Holder>,
    permits: u32,
    queued: Vec<(OwnerToken, Instant)>,
    /// Notified when a holder or a waiting writer goes, or a leader proclaims.
    changed: Arc<Notify>,
}

#[derive(Debug)]
struct Holder {
    owner: OwnerToken,
    fencing_token: FencingToken,
    expires_at: Instant,
    writes: bool,
    /// What the holder proclaimed, as an election's leader.
    value: Option<String>,
}

impl Slot {
    fn prune(&mut self, now: Instant) {
        self.holders.retain(|h| h.expires_at > now);
        self.queued.retain(|(_, at)| *at > now);
    }

    fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.queued.is_empty() && Arc::strong_count(&self.changed) == 1
    }

    fn holder_mut(&mut self, owner: &OwnerToken) -> Option<&mut Holder> {
        self.holders.iter_mut().find(|h| h.owner == *owner)
    }

    /// When the first of what keeps `request` out ends by itself (its lease or queue entry
    /// runs out): for a mutex or a writer, any holder, and for a writer or a fair mutex also
    /// the waiters queued ahead of it (all of them when it has no place yet); for a permit, the holders
    /// of a semaphore that they and (fair) the waiters ahead fill; for a reader, the writers
    /// holding or waiting. `None` when nothing keeps it out.
    fn blocked_until(&self, request: &AcquireRequest) -> Option<Instant> {
        let hold = request.hold;
        let holders = self
            .holders
            .iter()
            .filter(|h| hold != Hold::Read || h.writes);
        let ahead: Vec<Instant> = match hold {
            Hold::Read => self
                .queued
                .iter()
                .filter(|(writer, _)| *writer != request.owner)
                .map(|(_, at)| *at)
                .collect(),
            _ if queues(request) => self
                .queued
                .iter()
                .take_while(|(waiter, _)| *waiter != request.owner)
                .map(|(_, at)| *at)
                .collect(),
            _ => Vec::new(),
        };
        if matches!(hold, Hold::Permit { .. })
            && self.holders.len() + ahead.len() < self.permits as usize
        {
            return None;
        }
        holders.map(|h| h.expires_at).chain(ahead).min()
    }

    /// Removes `owner`'s grant and its place in the queue; whether it held.
    fn remove(&mut self, owner: &OwnerToken) -> bool {
        let held = self.holders.iter().any(|h| h.owner == *owner);
        let waited = self.queued.iter().any(|(w, _)| w == owner);
        self.holders.retain(|h| h.owner != *owner);
        self.queued.retain(|(w, _)| w != owner);
        if held || waited {
            self.changed.notify_waiters();
        }
        held
    }
}

/// Whether `request` keeps a place in its slot's queue while it waits: a writer, or a fair
/// mutex's or semaphore's waiter.
fn queues(request: &AcquireRequest) -> bool {
    request.hold == Hold::Write
        || (request.fair && matches!(request.hold, Hold::Exclusive | Hold::Permit { .. }))
}

impl MemoryBackend {
    /// An empty backend.
    pub fn new() -> Self {
        MemoryBackend::default()
    }

    /// Runs `f` on the live state of `key`'s slot of `kind` (created empty if missing), and
    /// forgets slots that hold nothing and that nobody waits on.
    fn with_slot<T>(
        &self,
        kind: Kind,
        key: &LockKey,
        f: impl FnOnce(&mut Slot, Instant) -> T,
    ) -> T {
        self.with_slots(|slots, now| {
            let slot = slots.entry((kind, key.clone())).or_default();
            slot.prune(now);
            f(slot, now)
        })
    }

    fn with_slots<T>(
        &self,
        f: impl FnOnce(&mut HashMap<(Kind, LockKey), Slot>, Instant) -> T,
    ) -> T {
        let mut slots = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let out = f(&mut slots, now);
        slots.retain(|_, slot| {
            slot.prune(now);
            !slot.is_idle()
        });
        out
    }

    fn next_token(&self) -> FencingToken {
        FencingToken(self.inner.fence.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Removes the holder of `key` without telling it, as an operator (or an expiry) would:
    /// the holder's renewal then fails and its guard reports the lock lost. Returns whether
    /// the key was held.
    pub fn force_release(&self, key: &LockKey) -> bool {
        self.with_slot(Kind::Mutex, key, |slot, _| {
            let was_held = !slot.holders.is_empty();
            slot.holders.clear();
            slot.changed.notify_waiters();
            was_held
        })
    }

    /// The keys held right now in `namespace`: mutexes with a holder or a queued waiter,
    /// then semaphores with a holder, then read-write locks with a holder or a waiting
    /// writer (a key can be in all).
    pub fn held_keys(&self, namespace: &str) -> Vec<LockKey> {
        let mut held: Vec<(Kind, LockKey)> = self.with_slots(|slots, _| {
            slots
                .iter()
                .filter(|((_, key), slot)| {
                    key.namespace() == namespace
                        && !(slot.holders.is_empty() && slot.queued.is_empty())
                })
                .map(|(id, _)| id.clone())
                .collect()
        });
        held.sort_by_key(|(kind, _)| *kind as u8);
        held.into_iter().map(|(_, key)| key).collect()
    }

    /// The holder of `key`'s mutex, as `f` sees it.
    fn mutex_holder<T>(&self, key: &LockKey, f: impl FnOnce(&Holder, Instant) -> T) -> Option<T> {
        self.with_slot(Kind::Mutex, key, |slot, now| {
            slot.holders.first().map(|h| f(h, now))
        })
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn tier(&self) -> Tier {
        Tier::Local
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(FencingGuarantee::Monotonic, WaitStrategy::Notify)
            .with_election(Support::Supported)
            .with_semaphore(Support::Supported)
            .with_rwlock(Support::Supported)
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Attempt> {
        let hold = request.hold;
        self.with_slot(Kind::of(hold), &request.key, |slot, now| {
            if let Hold::Permit { permits } = hold {
                if slot.holders.is_empty() {
                    slot.permits = permits;
                } else if slot.permits != permits {
                    return Err(Hold::permits_mismatch(
                        "memory",
                        &request.key,
                        permits,
                        slot.permits,
                    ));
                }
            } else {
                slot.permits = 1;
            }
            if let Some(holder) = slot.holder_mut(&request.owner) {
                let left = holder.expires_at - now;
                return Ok(Attempt::Granted(Grant::new(holder.fencing_token, left)));
            }
            let Some(until) = slot.blocked_until(request) else {
                let fencing_token = self.next_token();
                slot.queued.retain(|(w, _)| *w != request.owner);
                slot.holders.push(Holder {
                    owner: request.owner.clone(),
                    fencing_token,
                    expires_at: now + request.ttl,
                    writes: hold == Hold::Write,
                    value: None,
                });
                return Ok(Attempt::Granted(Grant::new(fencing_token, request.ttl)));
            };
            let contention = Contention::new().with_retry_after(until - now);
            if queues(request) && request.wait {
                match slot.queued.iter_mut().find(|(w, _)| *w == request.owner) {
                    Some((_, expiry)) => *expiry = now + request.ttl,
                    None => slot.queued.push((request.owner.clone(), now + request.ttl)),
                }
                return Ok(Attempt::Contended(contention));
            }
            Ok(Attempt::Contended(contention.with_nothing_left()))
        })
    }

    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        _contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        let kind = Kind::of(request.hold);
        let (changed, until) = self.with_slot(kind, &request.key, |slot, now| {
            let until = slot.blocked_until(request);
            (slot.changed.clone(), until.map(|at| at - now))
        });
        let Some(until) = until else {
            return Ok(None);
        };
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // What blocked it may have gone before `enable`.
        let blocked = self.with_slot(kind, &request.key, |slot, _| {
            slot.blocked_until(request).is_some()
        });
        if !blocked {
            return Ok(None);
        }
        // Expiries are announced by nobody: wake when the first blocker's lease ends. A
        // waiting writer also refreshes its record in time.
        let mut max_wait = max_wait.min(until);
        if queues(request) {
            max_wait = max_wait.min(request.ttl / 2);
        }
        let _ = tokio::time::timeout(max_wait, notified).await;
        Ok(None)
    }

    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        self.with_slot(Kind::of(request.hold), &request.key, |slot, _| {
            slot.remove(&request.owner)
        });
        Ok(())
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        Ok(
            self.with_slot(Kind::of(lease.hold()), lease.key(), |slot, now| match slot
                .holder_mut(lease.owner())
            {
                Some(holder) => {
                    holder.expires_at = now + lease.ttl();
                    Renewal::Extended(lease.ttl())
                }
                None => Renewal::Lost,
            }),
        )
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        Ok(
            self.with_slot(Kind::of(lease.hold()), lease.key(), |slot, _| {
                slot.remove(lease.owner())
            }),
        )
    }

    async fn is_held(&self, lease: &Lease) -> Result<bool> {
        Ok(
            self.with_slot(Kind::of(lease.hold()), lease.key(), |slot, _| {
                slot.holder_mut(lease.owner())
                    .is_some_and(|holder| holder.fencing_token == lease.fencing_token())
            }),
        )
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        Ok(self.mutex_holder(key, |holder, now| {
            LockInfo::new(holder.fencing_token).with_remaining_ttl(holder.expires_at - now)
        }))
    }

    async fn ping(&self) -> Result<()> {
        Ok(())
    }

    /// The cursor is the last name of the page before: names sort, and a page lists the
    /// next `limit` names after it.
    async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        crate::backend::validate_listing(namespace, prefix, limit)?;
        let mut held: Vec<(LockKey, LockInfo)> = self.with_slots(|slots, now| {
            slots
                .iter()
                .filter(|((kind, key), _)| {
                    *kind == Kind::Mutex
                        && key.namespace() == namespace
                        && key.name().starts_with(prefix)
                        && cursor.is_none_or(|after| key.name() > after)
                })
                .filter_map(|((_, key), slot)| {
                    let holder = slot.holders.iter().find(|h| h.expires_at > now)?;
                    let info = LockInfo::new(holder.fencing_token)
                        .with_remaining_ttl(holder.expires_at - now);
                    Some((key.clone(), info))
                })
                .collect()
        });
        held.sort_by(|a, b| a.0.name().cmp(b.0.name()));
        let more = held.len() > limit;
        held.truncate(limit);
        let next = more
            .then(|| held.last().map(|(key, _)| key.name().to_owned()))
            .flatten();
        Ok(LockPage::new(held, next))
    }

    async fn force_release(&self, key: &LockKey) -> Result<bool> {
        Ok(MemoryBackend::force_release(self, key))
    }

    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool> {
        Ok(self.with_slot(Kind::Mutex, lease.key(), |slot, _| {
            match slot.holder_mut(lease.owner()) {
                Some(holder) if holder.fencing_token == lease.fencing_token() => {
                    holder.value = Some(value.to_owned());
                    slot.changed.notify_waiters();
                    true
                }
                _ => false,
            }
        }))
    }

    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>> {
        Ok(self.mutex_holder(key, |holder, _| {
            Leader::new(holder.fencing_token, holder.value.clone())
        }))
    }

    async fn wait_for_leader_change(
        &self,
        key: &LockKey,
        seen: Option<&Leader>,
        max_wait: Duration,
    ) -> Result<()> {
        let (changed, expires_in) = self.with_slot(Kind::Mutex, key, |slot, now| {
            let expires_in = slot.holders.first().map(|h| h.expires_at - now);
            (slot.changed.clone(), expires_in)
        });
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // The leader may have changed before `enable`.
        if self.leader(key).await?.as_ref() != seen {
            return Ok(());
        }
        // An expiry is announced by nobody: wake when the holder's lease ends.
        let max_wait = expires_in.map_or(max_wait, |left| left.min(max_wait));
        let _ = tokio::time::timeout(max_wait, notified).await;
        Ok(())
    }
}
