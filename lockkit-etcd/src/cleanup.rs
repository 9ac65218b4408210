//! Clean-up on etcd: deleting the key of an acquisition that ended (released or
//! abandoned), in the background when it cannot be done at once, and keys that a cancelled
//! attempt put after its clean-up looked.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, KeyValue, LeaseTimeToLiveOptions, PutOptions, Txn, TxnOp,
    TxnResponse,
};
use lockkit_core::backend::cleanup::{Retry, Sweep, Unfinished};
use lockkit_core::backend::{AcquireRequest, Backoff, CancellationToken, Lease, runtime};
use lockkit_core::{Error, ErrorKind, Result};

use crate::acquire::Watch;
use crate::backend::EtcdBackend;
use crate::error::{self, BACKEND};
use crate::naming::{Claim, KeyNames};
use crate::request::{Resend, held_by, txn_of};
use crate::session::Session;

/// The pause before a failed clean-up is tried again.
pub(crate) const SWEEP_RETRY: Duration = Duration::from_millis(200);

/// The key of one acquisition, from its first attempt until it is released or abandoned.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) claim: Claim,
    pub(crate) session: Arc<Session>,
    pub(crate) create_revision: Option<i64>,
    /// A put of the key may have reached the server.
    pub(crate) maybe_on_server: bool,
    /// An attempt was sent and not answered: it may still put the key.
    pub(crate) in_flight: bool,
    /// What the last attempt found the key waiting for (a key with its create revision:
    /// names are reused, so only the revision tells that key from a later one of that name).
    pub(crate) watch: Option<Watch>,
}

impl EtcdBackend {
    /// Spawns guarded deletes of `key`, one after each of the `pauses` in turn, each retried
    /// until it succeeds or the session (and the key with it) is gone; then frees `claim`, if
    /// given (also when the session ends first: its names are never used again).
    pub(crate) fn reap(
        &self,
        key: String,
        guard: Vec<Compare>,
        session: Arc<Session>,
        pauses: Vec<Duration>,
        claim: Option<Claim>,
    ) {
        let client = self.client();
        let limit = self.inner.config.request_timeout;
        let shutdown = self.inner.shutdown.clone();
        let freed = claim.map(|claim| FreeOnDrop(self.inner.names.clone(), claim));
        let mut pauses = pauses.into_iter();
        let Some(first) = pauses.next() else {
            return;
        };
        let txn = Txn::new().when(guard).and_then([TxnOp::delete(key, None)]);
        self.inner.sweeps.spawn(
            "deleting a lock key",
            session.lost.clone(),
            first,
            Retry::new(SWEEP_RETRY, SWEEP_RETRY),
            move || {
                let _name = &freed;
                let (mut client, txn, shutdown) = (client.clone(), txn.clone(), shutdown.clone());
                let next = pauses.next();
                async move {
                    if shutdown.is_cancelled() {
                        return Ok(Sweep::Done);
                    }
                    match tokio::time::timeout(limit, client.txn(txn)).await {
                        Ok(Ok(_)) => Ok(next.map_or(Sweep::Done, Sweep::Again)),
                        Ok(Err(e)) => {
                            Err(error::map("deleting a lock key", e).with_retryable(true))
                        }
                        Err(_) => Err(error::timed_out("deleting a lock key", limit)),
                    }
                }
            },
        );
    }

    /// A guarded delete of a lock key. If it fails, or its future is dropped before the
    /// answer (the core does not retry a dropped release), the delete is finished in the
    /// background: the shared session lease would otherwise keep the key for as long as the
    /// process lives. Once it is done, the key's name is freed for reuse, if `claim` is given.
    ///
    /// The delete is sent again after the failures `resend` allows; the answer says whether
    /// a send before it may have been applied.
    pub(crate) async fn delete_now_or_later(
        &self,
        resend: Resend,
        what: &str,
        key: String,
        guard: Vec<Compare>,
        session: Arc<Session>,
        claim: Option<Claim>,
    ) -> Result<(TxnResponse, bool)> {
        let txn = Txn::new()
            .when(guard.clone())
            .and_then([TxnOp::delete(key.clone(), None)]);
        let backend = self.clone();
        let later_claim = claim.clone();
        let later = Unfinished::new(move || {
            backend.reap(key, guard, session, vec![Duration::ZERO], later_claim);
        });
        let answer = self.call_with(resend, what, txn_of(&txn)).await;
        if answer.is_ok() {
            later.done();
            if let Some(claim) = claim {
                self.inner.names.free(&claim);
            }
        }
        answer
    }

    /// A cancelled acquisition's put landed after its clean-up, at the name `request` reuses:
    /// deletes that key (by its value) and gives `request` a new name.
    pub(crate) fn move_off_stale_key(
        &self,
        request: &AcquireRequest,
        session: &Arc<Session>,
        prefix: &str,
        stale_value: &[u8],
    ) -> Error {
        let stale_claim = self.pending().get_mut(&request.owner).map(|entry| {
            let claim = self.inner.names.claim(prefix, session.lease_id);
            entry.create_revision = None;
            entry.maybe_on_server = false;
            entry.in_flight = false;
            std::mem::replace(&mut entry.claim, claim)
        });
        if let Some(stale) = stale_claim {
            let guard = vec![Compare::value(
                stale.key.clone(),
                CompareOp::Equal,
                stale_value.to_vec(),
            )];
            self.reap(
                stale.key.clone(),
                guard,
                session.clone(),
                vec![Duration::ZERO],
                Some(stale),
            );
        }
        Error::new(
            ErrorKind::Unavailable,
            BACKEND,
            "a stale key of a cancelled acquisition held this acquisition's key name; retrying under another",
        )
    }

    /// Removes what `request` left (see [`LockBackend::abandon`](lockkit_core::backend::LockBackend::abandon)).
    pub(crate) async fn abandon_request(&self, request: &AcquireRequest) -> Result<()> {
        let Some(entry) = self.pending().remove(&request.owner) else {
            return Ok(());
        };
        if !entry.maybe_on_server {
            self.inner.names.free(&entry.claim);
            return Ok(());
        }
        let key = entry.claim.key.clone();
        let guard = vec![Compare::value(
            key.clone(),
            CompareOp::Equal,
            request.owner.digest_hex(),
        )];
        let mut claim = Some(entry.claim);
        if entry.in_flight {
            // The cancelled attempt may still be applied after the delete below (it may even
            // go to another member): delete again soon, and once more when it must have been
            // applied or dropped, and only then reuse the name.
            let pauses = vec![
                Duration::from_millis(50),
                Duration::from_millis(450),
                self.inner.config.request_timeout * 2,
            ];
            self.reap(
                key.clone(),
                guard.clone(),
                entry.session.clone(),
                pauses,
                claim.take(),
            );
        }
        // An abandoned attempt's caller is told at once; the background finishes the delete.
        self.delete_now_or_later(
            Resend::IfNeverSent,
            "abandoning an acquisition",
            key,
            guard,
            entry.session,
            claim,
        )
        .await
        .map(|_| ())
    }

    /// Deletes `lease`'s key if it is still ours (see [`LockBackend::release`](lockkit_core::backend::LockBackend::release)).
    ///
    /// A delete sent again after its connection broke that finds the key gone cannot tell
    /// whether its first send deleted it (the answer was lost) or the lock was gone before:
    /// that is an error saying so, not "not ours", which would report a released lock lost.
    pub(crate) async fn release_lease(&self, lease: &Lease) -> Result<bool> {
        let Some(key) = lease.handle() else {
            return Ok(false);
        };
        let entry = {
            let mut pending = self.pending();
            match pending.get(lease.owner()) {
                Some(entry) if entry.claim.key == key => pending.remove(lease.owner()),
                _ => None,
            }
        };
        let guard = held_by(key, lease);
        let released = match entry {
            Some(entry) => {
                // The guard makes a second delete a no-op: a broken connection costs no release.
                self.delete_now_or_later(
                    Resend::IfRetryable,
                    "releasing",
                    entry.claim.key.clone(),
                    guard,
                    entry.session,
                    Some(entry.claim),
                )
                .await
            }
            // Not an acquisition of this backend: nothing to finish in the background.
            None => {
                let txn = Txn::new().when(guard).and_then([TxnOp::delete(key, None)]);
                self.call_with(Resend::IfRetryable, "releasing", txn_of(&txn))
                    .await
            }
        };
        match released? {
            (response, _) if response.succeeded() => Ok(true),
            (_, false) => Ok(false),
            (_, true) => Err(Error::new(
                ErrorKind::Unavailable,
                BACKEND,
                "the release was sent again after its connection broke and found the lock gone: the first send may have released it, or the lock was lost before",
            )),
        }
    }
}

/// Settles `session`'s unanswered attempts, each time one goes unanswered (cancelled in
/// flight, timed out, cut off): its put may land at any later time (a member can forward it
/// late), and would then sit on the shared, always-renewed lease, holding the lock for good.
///
/// A settlement writes the session's epoch key first: every attempt's put compares the epoch
/// key's mod revision with the epoch it last saw, so no put sent before that write can land
/// after it. Then the keys on the session's lease that no acquisition uses are deleted (a put
/// that landed before), and the attempts sent before the settlement began are settled. It
/// ends when nothing unanswered is left, and starts again at the next unanswered attempt: a
/// session whose attempts are answered costs nothing. Attempts that were in flight meanwhile
/// find the new epoch in their answer and put again under it.
pub(crate) fn settle_orphans(
    session: Arc<Session>,
    client: Client,
    names: Arc<KeyNames>,
    shutdown: CancellationToken,
    request_timeout: Duration,
) {
    runtime::spawn(async move {
        let orphans = Orphans {
            session,
            client,
            names,
            request_timeout,
        };
        let ledger = orphans.session.ledger.clone();
        let mut failed = Backoff::new(SWEEP_RETRY, orphans.session.ttl);
        loop {
            tokio::select! {
                () = ledger.unsettled_request() => {}
                () = orphans.session.lost.cancelled() => return,
                () = shutdown.cancelled() => return,
            }
            let mark = ledger.mark();
            let settled = tokio::select! {
                settled = orphans.settle() => settled,
                () = orphans.session.lost.cancelled() => return,
                () = shutdown.cancelled() => return,
            };
            match settled {
                Ok(()) => {
                    ledger.settle(mark);
                    failed.reset();
                    // At most one settlement per request timeout, however many attempts
                    // time out meanwhile.
                    tokio::time::sleep(orphans.request_timeout).await;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "settling a session's unanswered attempts failed; retrying");
                    tokio::time::sleep(failed.next_delay()).await;
                }
            }
        }
    });
}

/// Frees a key name when the last clean-up that may touch the key is over.
struct FreeOnDrop(Arc<KeyNames>, Claim);

impl Drop for FreeOnDrop {
    fn drop(&mut self) {
        self.0.free(&self.1);
    }
}

/// What [`settle_orphans`] works with.
struct Orphans {
    session: Arc<Session>,
    client: Client,
    names: Arc<KeyNames>,
    request_timeout: Duration,
}

impl Orphans {
    /// One settlement: the epoch moves, then what landed before is deleted.
    async fn settle(&self) -> Result<()> {
        let mut client = self.client.clone();
        let lease_id = self.session.lease_id;
        let put = client.put(
            self.session.epoch_key.as_str(),
            "",
            Some(PutOptions::new().with_lease(lease_id)),
        );
        let written = match tokio::time::timeout(self.request_timeout, put).await {
            Ok(Ok(written)) => written,
            Ok(Err(e)) => return Err(error::map("moving the session's epoch", e)),
            Err(_) => {
                return Err(error::timed_out(
                    "moving the session's epoch",
                    self.request_timeout,
                ));
            }
        };
        if let Some(header) = written.header() {
            self.session.saw_epoch(header.revision());
        }
        self.delete().await
    }

    async fn delete(&self) -> Result<()> {
        let mut client = self.client.clone();
        let lease_id = self.session.lease_id;
        let listing =
            client.lease_time_to_live(lease_id, Some(LeaseTimeToLiveOptions::new().with_keys()));
        let keys = match tokio::time::timeout(self.request_timeout, listing).await {
            Ok(Ok(listed)) => listed.keys().to_vec(),
            Ok(Err(e)) => return Err(error::map("listing the session's keys", e)),
            Err(_) => {
                return Err(error::timed_out(
                    "listing the session's keys",
                    self.request_timeout,
                ));
            }
        };
        // Only lock keys of this session (`.../<lease-hex>-<n>`) that no acquisition uses.
        let ours = format!("/{lease_id:016x}-");
        let candidates = keys
            .into_iter()
            .map(|key| String::from_utf8_lossy(&key).into_owned())
            .filter(|key| key.rfind('/').is_some_and(|i| key[i..].starts_with(&ours)))
            .filter(|key| !self.names.is_claimed(key));
        for key in candidates {
            let read = client.get(key.clone(), None);
            let created = match tokio::time::timeout(self.request_timeout, read).await {
                Ok(Ok(found)) => found.kvs().first().map(KeyValue::create_revision),
                Ok(Err(e)) => return Err(error::map("reading a stray key", e)),
                Err(_) => {
                    return Err(error::timed_out(
                        "reading a stray key",
                        self.request_timeout,
                    ));
                }
            };
            // Claimed since: the acquisition finds the key itself (and moves off it). The
            // delete compares the create revision, so a key put anew under the name stays.
            let Some(created) = created.filter(|_| !self.names.is_claimed(&key)) else {
                continue;
            };
            let txn = Txn::new()
                .when([Compare::create_revision(
                    key.clone(),
                    CompareOp::Equal,
                    created,
                )])
                .and_then([TxnOp::delete(key.clone(), None)]);
            match tokio::time::timeout(self.request_timeout, client.txn(txn)).await {
                Ok(Ok(deleted)) if deleted.succeeded() => {
                    tracing::warn!(key = %key, "deleted a lock key that a cancelled attempt put after its clean-up");
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(error::map("deleting a stray key", e)),
                Err(_) => {
                    return Err(error::timed_out(
                        "deleting a stray key",
                        self.request_timeout,
                    ));
                }
            }
        }
        Ok(())
    }
}
