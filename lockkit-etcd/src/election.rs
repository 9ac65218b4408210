//! Elections on etcd, in the shape of etcd's own `concurrency.Election`: an election is the
//! lock of its name, so its candidates are the lock's keys under `<prefix>/<namespace>/<name>/`
//! on their session leases, the key with the lowest create revision leads, and its create
//! revision is the term.
//!
//! # Where the value lives
//! In the leader's own lock key, after the owner digest and a newline
//! ([`stored_value`]), as etcd's recipe keeps it in the leader's key. A side key was the
//! alternative; it would have needed its own clean-up on every path that ends a grant
//! (release, forced release, an operator's delete, lease expiry), a tie to one grant so that
//! `leader()` never pairs it with another, and filtering out of the queue ranges and
//! `list`. In the key itself all of that holds by construction:
//! - it is written only while the grant holds: `proclaim` is one transaction, a put on the
//!   own key guarded by its create revision (the fencing token) and its lease (the session's),
//!   that keeps the key on its lease;
//! - it never shows with another grant: one key, one read;
//! - it goes with the grant: whatever deletes the key (release, `force_release`, the session
//!   lease's revocation or expiry) deletes the value;
//! - nothing new appears in the key space, so the queue, `list` and the orphan sweep see
//!   what they saw before.
//!
//! The readers of the owner digest compare only the part before the newline
//! ([`owner_of`](crate::naming::owner_of)); the guards of release and
//! [`EtcdBackend::txn_if_held`] compare the create revision alone, which names the grant by
//! itself (see [`held_by`]). A plain mutex holder's key has no newline, so an election shows
//! it as a leader without a value.
//!
//! # Reading and observing
//! [`LockBackend::leader`](lockkit_core::backend::LockBackend::leader) is one linearizable
//! range read of the lowest key, sorted by create revision with a limit of one: holder, term
//! and value at one revision.
//!
//! A wait for a change reads afresh and returns at once if that differs from what the caller
//! saw. Otherwise it watches what alone can change the answer: the leader's key (a new value,
//! or its deletion, after which the next candidate leads or nobody), or, with nobody leading,
//! puts in the lock's range (a new candidate). Candidates that join behind a leader wake no
//! observer. The watch starts at the current revision, as the queue's waits do (a start
//! revision in the past would put it among the server's unsynced watchers, caught up only
//! every 100 ms); if the store moved between the read and the watch's start, a second read
//! after the start closes that window. A watch that breaks (a reset connection, a member that
//! loses its leader) ends the wait without an error, and the core reads again. Dropping the
//! wait drops the watch's gRPC stream, and the server its watch.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, WatchFilterType, WatchOptions};
use lockkit_core::backend::Lease;
use lockkit_core::{Leader, LockKey, Result};
use tokio::time::Instant;

use crate::backend::EtcdBackend;
use crate::naming::{key_of, proclaimed_of, stored_value, token_of};
use crate::request::{held_by, txn_of};
use crate::wait::{FAR_FUTURE, until_event};

/// One read of an election: its leader (the leader's key and what it shows) and the store
/// revision the read saw.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct LeaderRead {
    pub(crate) leader: Option<(String, Leader)>,
    pub(crate) revision: i64,
}

impl EtcdBackend {
    /// Puts `value` into `lease`'s key beside its owner digest, in one transaction with the
    /// check that the key is still the grant's, on its session lease. `false` when it is not,
    /// or the session is known to be lost.
    pub(crate) async fn proclaim_value(&self, lease: &Lease, value: &str) -> Result<bool> {
        let Some((key, session)) = self.local_check(lease) else {
            return Ok(false);
        };
        let mut guard = held_by(&key, lease);
        guard.push(Compare::lease(
            key.clone(),
            CompareOp::Equal,
            session.lease_id,
        ));
        let stored = stored_value(&lease.owner().digest_hex(), Some(value));
        // A put without the lease would detach the key from it: it would outlive the session.
        let put = TxnOp::put(
            key,
            stored,
            Some(PutOptions::new().with_lease(session.lease_id)),
        );
        let txn = Txn::new().when(guard).and_then([put]);
        let response = self.call("proclaiming", txn_of(&txn)).await?;
        Ok(response.succeeded())
    }

    /// The leader of the election `key` and its value, in one linearizable read.
    pub(crate) async fn read_leader(&self, key: &LockKey) -> Result<LeaderRead> {
        let response = self.read_holder(key, "reading the leader").await?;
        let revision = response.header().map_or(0, |h| h.revision());
        let leader = response.kvs().first().map(|kv| {
            let leader = Leader::new(token_of(kv.create_revision()), proclaimed_of(kv.value()));
            (key_of(kv), leader)
        });
        Ok(LeaderRead { leader, revision })
    }

    /// Waits until the leader of `key` may differ from `seen`, or `max_wait` passes (see the
    /// module docs).
    pub(crate) async fn wait_for_leader(
        &self,
        key: &LockKey,
        seen: Option<&Leader>,
        max_wait: Duration,
    ) -> Result<()> {
        let now = Instant::now();
        let deadline = now.checked_add(max_wait).unwrap_or(now + FAR_FUTURE);
        let read = match tokio::time::timeout_at(deadline, self.read_leader(key)).await {
            Ok(read) => read?,
            Err(_) => return Ok(()),
        };
        if read.leader.as_ref().map(|(_, leader)| leader) != seen {
            return Ok(());
        }
        let (watched, options) = match &read.leader {
            Some((leader_key, _)) => (leader_key.clone(), WatchOptions::new()),
            None => (
                self.lock_prefix(key),
                WatchOptions::new()
                    .with_prefix()
                    .with_filters([WatchFilterType::NoDelete]),
            ),
        };
        let opened = self
            .open_watch("watching the leader", &watched, options, deadline)
            .await?;
        let Some((mut watch, watched_from)) = opened else {
            return Ok(());
        };
        // The store moved between the read and the watch: read again, after the watch
        // started, so that a change in between is seen by the one or the other.
        if watched_from > read.revision {
            match tokio::time::timeout_at(deadline, self.read_leader(key)).await {
                Ok(Ok(again)) if again.leader == read.leader => {}
                Ok(Ok(_)) | Err(_) => return Ok(()),
                Ok(Err(e)) => return Err(e),
            }
        }
        if let Err(e) = until_event(&mut watch, deadline, |_| true).await {
            tracing::debug!(%key, error = %e, "the watch of the leader broke; reading the leader again");
        }
        Ok(())
    }
}
