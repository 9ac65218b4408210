//! The in-process backend: real lock semantics inside one process, no server.

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

mod rwlock;
mod semaphore;

#[derive(Debug, Default)]
struct Inner {
    state: StdMutex<State>,
    /// One counter for all keys: strictly increasing per key, and slots of free keys can be
    /// dropped without forgetting where their tokens were.
    fence: AtomicU64,
}

/// The mutexes and, apart from them, the semaphores and the read-write locks.
#[derive(Debug, Default)]
struct State {
    slots: HashMap<LockKey, Slot>,
    semaphores: HashMap<LockKey, semaphore::PermitSlot>,
    rwlocks: HashMap<LockKey, rwlock::RwSlot>,
}

#[derive(Debug, Default)]
struct Slot {
    holder: Option<Holder>,
    /// Notified when the holder goes or proclaims a value.
    changed: Arc<Notify>,
}

#[derive(Debug)]
struct Holder {
    owner: OwnerToken,
    fencing_token: FencingToken,
    expires_at: Instant,
    /// What the holder proclaimed, as an election's leader.
    value: Option<String>,
}

impl Slot {
    fn live_holder(&self, now: Instant) -> Option<&Holder> {
        self.holder.as_ref().filter(|h| h.expires_at > now)
    }

    fn is_idle(&self, now: Instant) -> bool {
        self.live_holder(now).is_none() && Arc::strong_count(&self.changed) == 1
    }
}

impl MemoryBackend {
    /// An empty backend.
    pub fn new() -> Self {
        MemoryBackend::default()
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State, Instant) -> T) -> T {
        let mut state = self
            .inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        f(&mut state, Instant::now())
    }

    fn with_slots<T>(&self, f: impl FnOnce(&mut HashMap<LockKey, Slot>, Instant) -> T) -> T {
        self.with_state(|state, now| {
            let out = f(&mut state.slots, now);
            state.slots.retain(|_, slot| !slot.is_idle(now));
            out
        })
    }

    fn next_token(&self) -> FencingToken {
        FencingToken(self.inner.fence.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Removes the holder of `key` without telling it, as an operator (or an expiry) would:
    /// the holder's renewal then fails and its guard reports the lock lost. Returns whether
    /// the key was held.
    pub fn force_release(&self, key: &LockKey) -> bool {
        self.with_slots(|slots, now| {
            let Some(slot) = slots.get_mut(key) else {
                return false;
            };
            let was_held = slot.live_holder(now).is_some();
            slot.holder = None;
            slot.changed.notify_waiters();
            was_held
        })
    }

    /// The keys held right now in `namespace`: mutexes with a holder, then semaphores with
    /// one, then read-write locks with a holder or a waiting writer (a key can be in all).
    pub fn held_keys(&self, namespace: &str) -> Vec<LockKey> {
        let mut held: Vec<LockKey> = self.with_slots(|slots, now| {
            slots
                .iter()
                .filter(|(key, slot)| {
                    key.namespace() == namespace && slot.live_holder(now).is_some()
                })
                .map(|(key, _)| key.clone())
                .collect()
        });
        held.extend(self.keys_with_permits(namespace));
        held.extend(self.keys_with_rwlocks(namespace));
        held
    }

    fn release_if_owner(&self, key: &LockKey, owner: &OwnerToken) -> bool {
        self.with_slots(|slots, now| {
            let Some(slot) = slots.get_mut(key) else {
                return false;
            };
            let ours = slot.live_holder(now).is_some_and(|h| h.owner == *owner);
            if ours {
                slot.holder = None;
                slot.changed.notify_waiters();
            }
            ours
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
        match request.hold {
            Hold::Read | Hold::Write => return Ok(self.try_acquire_rw(request)),
            Hold::Permit { .. } => return self.try_acquire_permit(request),
            Hold::Exclusive => {}
        }
        Ok(self.with_slots(|slots, now| {
            let slot = slots.entry(request.key.clone()).or_default();
            match slot.live_holder(now) {
                Some(holder) if holder.owner == request.owner => {
                    Attempt::Granted(Grant::new(holder.fencing_token, holder.expires_at - now))
                }
                Some(holder) => Attempt::Contended(
                    Contention::new()
                        .with_retry_after(holder.expires_at - now)
                        .with_nothing_left(),
                ),
                None => {
                    let fencing_token = self.next_token();
                    slot.holder = Some(Holder {
                        owner: request.owner.clone(),
                        fencing_token,
                        expires_at: now + request.ttl,
                        value: None,
                    });
                    Attempt::Granted(Grant::new(fencing_token, request.ttl))
                }
            }
        }))
    }

    async fn wait_for_change(
        &self,
        request: &AcquireRequest,
        _contention: &Contention,
        max_wait: Duration,
    ) -> Result<Option<Grant>> {
        match request.hold {
            Hold::Read | Hold::Write => {
                self.wait_for_rw(request, max_wait).await;
                return Ok(None);
            }
            Hold::Permit { .. } => {
                return self.wait_for_permit(request, max_wait).await.map(|()| None);
            }
            Hold::Exclusive => {}
        }
        let released = self.with_slots(|slots, now| {
            let slot = slots.entry(request.key.clone()).or_default();
            let holder_left = slot.live_holder(now).map(|h| h.expires_at - now);
            (slot.changed.clone(), holder_left)
        });
        let (notify, holder_left) = released;
        let Some(holder_left) = holder_left else {
            return Ok(None);
        };
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // The holder may have released between the check above and `enable`.
        if self.inspect(&request.key).await?.is_none() {
            return Ok(None);
        }
        let _ = tokio::time::timeout(max_wait.min(holder_left), notified).await;
        Ok(None)
    }

    async fn abandon(&self, request: &AcquireRequest) -> Result<()> {
        match request.hold {
            Hold::Read | Hold::Write => self.release_rw(&request.key, &request.owner),
            Hold::Permit { .. } => self.release_permit(&request.key, &request.owner),
            Hold::Exclusive => self.release_if_owner(&request.key, &request.owner),
        };
        Ok(())
    }

    async fn renew(&self, lease: &Lease) -> Result<Renewal> {
        match lease.hold() {
            Hold::Read | Hold::Write => return Ok(self.renew_rw(lease)),
            Hold::Permit { .. } => return Ok(self.renew_permit(lease)),
            Hold::Exclusive => {}
        }
        Ok(self.with_slots(|slots, now| {
            match slots
                .get_mut(lease.key())
                .and_then(|slot| slot.holder.as_mut())
            {
                Some(holder) if holder.expires_at > now && holder.owner == *lease.owner() => {
                    holder.expires_at = now + lease.ttl();
                    Renewal::Extended(lease.ttl())
                }
                _ => Renewal::Lost,
            }
        }))
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        match lease.hold() {
            Hold::Read | Hold::Write => return Ok(self.release_rw(lease.key(), lease.owner())),
            Hold::Permit { .. } => return Ok(self.release_permit(lease.key(), lease.owner())),
            Hold::Exclusive => {}
        }
        Ok(self.release_if_owner(lease.key(), lease.owner()))
    }

    async fn is_held(&self, lease: &Lease) -> Result<bool> {
        match lease.hold() {
            Hold::Read | Hold::Write => return Ok(self.holds_rw(lease)),
            Hold::Permit { .. } => return Ok(self.holds_permit(lease)),
            Hold::Exclusive => {}
        }
        let info = self.inspect(lease.key()).await?;
        Ok(info.is_some_and(|info| info.fencing_token == lease.fencing_token()))
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        Ok(self.with_slots(|slots, now| {
            slots
                .get(key)
                .and_then(|slot| slot.live_holder(now))
                .map(|holder| {
                    LockInfo::new(holder.fencing_token).with_remaining_ttl(holder.expires_at - now)
                })
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
                .filter(|(key, _)| {
                    key.namespace() == namespace
                        && key.name().starts_with(prefix)
                        && cursor.is_none_or(|after| key.name() > after)
                })
                .filter_map(|(key, slot)| {
                    let holder = slot.live_holder(now)?;
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
        Ok(self.with_slots(|slots, now| {
            let Some(slot) = slots.get_mut(lease.key()) else {
                return false;
            };
            match slot.holder.as_mut() {
                Some(holder)
                    if holder.expires_at > now
                        && holder.owner == *lease.owner()
                        && holder.fencing_token == lease.fencing_token() =>
                {
                    holder.value = Some(value.to_owned());
                    slot.changed.notify_waiters();
                    true
                }
                _ => false,
            }
        }))
    }

    async fn leader(&self, key: &LockKey) -> Result<Option<Leader>> {
        Ok(self.with_slots(|slots, now| {
            let holder = slots.get(key)?.live_holder(now)?;
            Some(Leader::new(holder.fencing_token, holder.value.clone()))
        }))
    }

    async fn wait_for_leader_change(
        &self,
        key: &LockKey,
        seen: Option<&Leader>,
        max_wait: Duration,
    ) -> Result<()> {
        let (changed, expires_in) = self.with_slots(|slots, now| {
            let slot = slots.entry(key.clone()).or_default();
            let expires_in = slot.live_holder(now).map(|h| h.expires_at - now);
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
