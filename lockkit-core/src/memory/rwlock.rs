//! The in-process read-write lock: the live holders of each key (readers, or one writer) and
//! the writers waiting for it, apart from the key's mutex and semaphore.
//!
//! A waiting writer is recorded with an expiry of one TTL, refreshed by each of its
//! attempts (its wait is cut to half a TTL so that it attempts in time); while one is
//! recorded, readers wait. So a stream of readers cannot starve a writer, and a writer that
//! went away without abandoning blocks readers for at most its TTL.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::MemoryBackend;
use crate::backend::{AcquireRequest, Attempt, Contention, Grant, Hold, Renewal};
use crate::key::LockKey;
use crate::lease::Lease;
use crate::token::{FencingToken, OwnerToken};

/// A read-write lock's holders and waiting writers.
#[derive(Debug, Default)]
pub(super) struct RwSlot {
    holders: Vec<RwHolder>,
    waiting_writers: Vec<(OwnerToken, Instant)>,
    /// Notified when a holder or a waiting writer goes.
    changed: Arc<Notify>,
}

#[derive(Debug)]
struct RwHolder {
    owner: OwnerToken,
    fencing_token: FencingToken,
    expires_at: Instant,
    writes: bool,
}

impl RwSlot {
    fn prune(&mut self, now: Instant) {
        self.holders.retain(|h| h.expires_at > now);
        self.waiting_writers
            .retain(|(_, expires_at)| *expires_at > now);
    }

    pub(super) fn is_idle(&self, now: Instant) -> bool {
        !self.holders.iter().any(|h| h.expires_at > now)
            && !self.waiting_writers.iter().any(|(_, at)| *at > now)
            && Arc::strong_count(&self.changed) == 1
    }

    fn holder_mut(&mut self, owner: &OwnerToken, now: Instant) -> Option<&mut RwHolder> {
        self.holders
            .iter_mut()
            .find(|h| h.owner == *owner && h.expires_at > now)
    }

    /// When the first of what keeps a request of `hold` out ends by itself: for a reader,
    /// the writers (holding or waiting); for a writer, every holder. `None` when nothing
    /// keeps it out.
    fn blocked_until(&self, hold: Hold, owner: &OwnerToken) -> Option<Instant> {
        let holders = self
            .holders
            .iter()
            .filter(|h| hold == Hold::Write || h.writes)
            .map(|h| h.expires_at);
        let waiting = self
            .waiting_writers
            .iter()
            .filter(|(waiter, _)| hold == Hold::Read && waiter != owner)
            .map(|(_, at)| *at);
        holders.chain(waiting).min()
    }

    /// Removes `owner`'s grant and waiting record; whether it held.
    fn remove(&mut self, owner: &OwnerToken, now: Instant) -> bool {
        let held = self.holder_mut(owner, now).is_some();
        let waited = self.waiting_writers.iter().any(|(w, _)| w == owner);
        self.holders.retain(|h| h.owner != *owner);
        self.waiting_writers.retain(|(w, _)| w != owner);
        if held || waited {
            self.changed.notify_waiters();
        }
        held
    }
}

impl MemoryBackend {
    fn with_rwlocks<T>(&self, f: impl FnOnce(&mut HashMap<LockKey, RwSlot>, Instant) -> T) -> T {
        self.with_state(|state, now| {
            let out = f(&mut state.rwlocks, now);
            state.rwlocks.retain(|_, slot| !slot.is_idle(now));
            out
        })
    }

    pub(super) fn try_acquire_rw(&self, request: &AcquireRequest) -> Attempt {
        self.with_rwlocks(|slots, now| {
            let slot = slots.entry(request.key.clone()).or_default();
            slot.prune(now);
            if let Some(holder) = slot.holder_mut(&request.owner, now) {
                let left = holder.expires_at - now;
                return Attempt::Granted(Grant::new(holder.fencing_token, left));
            }
            match slot.blocked_until(request.hold, &request.owner) {
                None => {
                    let fencing_token = self.next_token();
                    slot.waiting_writers.retain(|(w, _)| *w != request.owner);
                    slot.holders.push(RwHolder {
                        owner: request.owner.clone(),
                        fencing_token,
                        expires_at: now + request.ttl,
                        writes: request.hold == Hold::Write,
                    });
                    Attempt::Granted(Grant::new(fencing_token, request.ttl))
                }
                Some(until) => {
                    let contention = Contention::new().with_retry_after(until - now);
                    if request.hold == Hold::Write && request.wait {
                        slot.waiting_writers.retain(|(w, _)| *w != request.owner);
                        slot.waiting_writers
                            .push((request.owner.clone(), now + request.ttl));
                        Attempt::Contended(contention)
                    } else {
                        Attempt::Contended(contention.with_nothing_left())
                    }
                }
            }
        })
    }

    pub(super) async fn wait_for_rw(&self, request: &AcquireRequest, max_wait: Duration) {
        let (changed, until) = self.with_rwlocks(|slots, now| {
            let slot = slots.entry(request.key.clone()).or_default();
            slot.prune(now);
            let until = slot.blocked_until(request.hold, &request.owner);
            (slot.changed.clone(), until.map(|at| at - now))
        });
        let Some(until) = until else {
            return;
        };
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // What blocked it may have gone before `enable`.
        let still_blocked = self.with_rwlocks(|slots, now| {
            slots.get_mut(&request.key).is_some_and(|slot| {
                slot.prune(now);
                slot.blocked_until(request.hold, &request.owner).is_some()
            })
        });
        if !still_blocked {
            return;
        }
        // Expiries are announced by nobody; a waiting writer refreshes its record in time.
        let mut max_wait = max_wait.min(until);
        if request.hold == Hold::Write {
            max_wait = max_wait.min(request.ttl / 2);
        }
        let _ = tokio::time::timeout(max_wait, notified).await;
    }

    pub(super) fn renew_rw(&self, lease: &Lease) -> Renewal {
        self.with_rwlocks(|slots, now| {
            match slots
                .get_mut(lease.key())
                .and_then(|slot| slot.holder_mut(lease.owner(), now))
            {
                Some(holder) => {
                    holder.expires_at = now + lease.ttl();
                    Renewal::Extended(lease.ttl())
                }
                None => Renewal::Lost,
            }
        })
    }

    pub(super) fn release_rw(&self, key: &LockKey, owner: &OwnerToken) -> bool {
        self.with_rwlocks(|slots, now| {
            slots
                .get_mut(key)
                .is_some_and(|slot| slot.remove(owner, now))
        })
    }

    pub(super) fn holds_rw(&self, lease: &Lease) -> bool {
        self.with_rwlocks(|slots, now| {
            slots
                .get_mut(lease.key())
                .and_then(|slot| slot.holder_mut(lease.owner(), now))
                .is_some_and(|holder| holder.fencing_token == lease.fencing_token())
        })
    }

    /// The keys of `namespace` whose read-write locks have holders or waiting writers.
    pub(super) fn keys_with_rwlocks(&self, namespace: &str) -> Vec<LockKey> {
        self.with_rwlocks(|slots, now| {
            slots
                .iter_mut()
                .filter(|(key, _)| key.namespace() == namespace)
                .filter_map(|(key, slot)| {
                    slot.prune(now);
                    let busy = !slot.holders.is_empty() || !slot.waiting_writers.is_empty();
                    busy.then(|| key.clone())
                })
                .collect()
        })
    }
}
