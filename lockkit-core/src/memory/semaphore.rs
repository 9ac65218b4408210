//! The in-process semaphore: the live holders of each key with their expiry, apart from the
//! key's mutex.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::MemoryBackend;
use crate::backend::{AcquireRequest, Attempt, Contention, Grant, Hold, Renewal};
use crate::error::Result;
use crate::key::LockKey;
use crate::lease::Lease;
use crate::token::{FencingToken, OwnerToken};

/// A semaphore's holders, and the permits they agreed on.
#[derive(Debug, Default)]
pub(super) struct PermitSlot {
    permits: u32,
    holders: Vec<PermitHolder>,
    /// Notified when a holder goes.
    changed: Arc<Notify>,
}

#[derive(Debug)]
struct PermitHolder {
    owner: OwnerToken,
    fencing_token: FencingToken,
    expires_at: Instant,
}

impl PermitSlot {
    fn prune(&mut self, now: Instant) {
        self.holders.retain(|h| h.expires_at > now);
    }

    fn has_holders(&self, now: Instant) -> bool {
        self.holders.iter().any(|h| h.expires_at > now)
    }

    pub(super) fn is_idle(&self, now: Instant) -> bool {
        !self.has_holders(now) && Arc::strong_count(&self.changed) == 1
    }

    fn holder_mut(&mut self, owner: &OwnerToken, now: Instant) -> Option<&mut PermitHolder> {
        self.holders
            .iter_mut()
            .find(|h| h.owner == *owner && h.expires_at > now)
    }

    fn remove(&mut self, owner: &OwnerToken, now: Instant) -> bool {
        let ours = self.holder_mut(owner, now).is_some();
        self.holders.retain(|h| h.owner != *owner);
        if ours {
            self.changed.notify_waiters();
        }
        ours
    }
}

fn permits_of(hold: Hold) -> u32 {
    match hold {
        Hold::Permit { permits } => permits,
        _ => 1,
    }
}

impl MemoryBackend {
    fn with_permits<T>(
        &self,
        f: impl FnOnce(&mut HashMap<LockKey, PermitSlot>, Instant) -> T,
    ) -> T {
        self.with_state(|state, now| {
            let out = f(&mut state.semaphores, now);
            state.semaphores.retain(|_, slot| !slot.is_idle(now));
            out
        })
    }

    pub(super) fn try_acquire_permit(&self, request: &AcquireRequest) -> Result<Attempt> {
        let asked = permits_of(request.hold);
        self.with_permits(|slots, now| {
            let slot = slots.entry(request.key.clone()).or_default();
            slot.prune(now);
            if slot.holders.is_empty() {
                slot.permits = asked;
            } else if slot.permits != asked {
                return Err(Hold::permits_mismatch(
                    "memory",
                    &request.key,
                    asked,
                    slot.permits,
                ));
            }
            if let Some(holder) = slot.holder_mut(&request.owner, now) {
                let left = holder.expires_at - now;
                return Ok(Attempt::Granted(Grant::new(holder.fencing_token, left)));
            }
            if slot.holders.len() < slot.permits as usize {
                let fencing_token = self.next_token();
                slot.holders.push(PermitHolder {
                    owner: request.owner.clone(),
                    fencing_token,
                    expires_at: now + request.ttl,
                });
                return Ok(Attempt::Granted(Grant::new(fencing_token, request.ttl)));
            }
            let first_expiry = slot.holders.iter().map(|h| h.expires_at - now).min();
            let contention = Contention::new().with_nothing_left();
            Ok(Attempt::Contended(match first_expiry {
                Some(left) => contention.with_retry_after(left),
                None => contention,
            }))
        })
    }

    pub(super) async fn wait_for_permit(
        &self,
        request: &AcquireRequest,
        max_wait: Duration,
    ) -> Result<()> {
        let (changed, first_expiry) = self.with_permits(|slots, now| {
            let slot = slots.entry(request.key.clone()).or_default();
            let first_expiry = slot.holders.iter().map(|h| h.expires_at - now).min();
            (slot.changed.clone(), first_expiry)
        });
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // A holder may have left before `enable`.
        let full = self.with_permits(|slots, now| {
            slots.get_mut(&request.key).is_some_and(|slot| {
                slot.prune(now);
                slot.holders.len() >= slot.permits as usize
            })
        });
        if !full {
            return Ok(());
        }
        // An expiry is announced by nobody: wake when the first holder's lease ends.
        let max_wait = first_expiry.map_or(max_wait, |left| left.min(max_wait));
        let _ = tokio::time::timeout(max_wait, notified).await;
        Ok(())
    }

    pub(super) fn renew_permit(&self, lease: &Lease) -> Renewal {
        self.with_permits(|slots, now| {
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

    pub(super) fn release_permit(&self, key: &LockKey, owner: &OwnerToken) -> bool {
        self.with_permits(|slots, now| {
            slots
                .get_mut(key)
                .is_some_and(|slot| slot.remove(owner, now))
        })
    }

    pub(super) fn holds_permit(&self, lease: &Lease) -> bool {
        self.with_permits(|slots, now| {
            slots
                .get_mut(lease.key())
                .and_then(|slot| slot.holder_mut(lease.owner(), now))
                .is_some_and(|holder| holder.fencing_token == lease.fencing_token())
        })
    }

    /// The keys of `namespace` whose semaphores have holders right now.
    pub(super) fn keys_with_permits(&self, namespace: &str) -> Vec<LockKey> {
        self.with_permits(|slots, now| {
            slots
                .iter()
                .filter(|(key, slot)| key.namespace() == namespace && slot.has_holders(now))
                .map(|(key, _)| key.clone())
                .collect()
        })
    }
}
