//! Read-write locks on etcd: one queue of keys ordered by create revision, each entry a
//! reader's or a writer's, with the mutex's sessions, key names, clean-up and orphan sweep.
//!
//! # Keys
//! An entry is `<rwlock_prefix>read/<lease-hex>-<n>` or `<rwlock_prefix>write/<lease-hex>-<n>`
//! on the session lease, its value the owner digest ([`EtcdBackend::rwlock_prefix`] is
//! `<prefix>/<namespace>/../rwlock/<name>/`). The kind is a segment of the key, so one range
//! read asks "the newest write entry created before mine" (the `write/` part, at most the
//! revision before mine, sorted by create revision descending, limit 1) and one asks "the
//! newest entry of any kind created before mine" (the whole range, the same options).
//!
//! # Grant
//! The entries *ahead* of an entry are those created before it that can keep it out: for a
//! reader the write entries, for a writer every entry. An entry with nothing ahead holds: a
//! reader when no write entry was created before it, a writer when no entry was. Its create
//! revision is its fencing token. A grant is read in one transaction that saw the own key on
//! the live session lease, as for the mutex and the semaphore.
//!
//! Keys are added only at the end (a new key has the store's newest revision) and removed
//! anywhere (release, abandon, the end of a session lease), so **the set of entries ahead of
//! an entry never grows**: a holder stays one for as long as its key exists (renewal and
//! release are the mutex's, unchanged), and a waiter's condition can only come true.
//!
//! Why this is a read-write lock with writer preference.
//! - *A writer excludes everyone*: while a write entry `w` holds, nothing was created before
//!   it; every later entry has `w` ahead (a reader: `w` is a write entry; a writer: `w` is an
//!   entry), so none holds until `w`'s key goes.
//! - *Readers share*: readers do not count as ahead of readers.
//! - *A waiting writer blocks new readers*: a reader that queues after a write entry has it
//!   ahead, whether that writer holds or waits, so it is granted only after the writer went;
//!   a stream of readers cannot starve a writer, and everyone is served in queue order.
//! - *Fencing*: let `w` be a write grant, read at revision `r_w`, and `g` a grant read before
//!   it (at `r_g < r_w`). Were `g` created after `w`, then `w` would be ahead of `g` (`w` is a
//!   write entry, and a writer has every entry ahead), so `w`'s key was gone at `r_g`; but it
//!   existed at `r_w`, after `r_g`, and a key that is gone does not come back under the same
//!   create revision. So `g` was created before `w`, and its token, its create revision, is
//!   below `w`'s. Revisions come from the cluster's one revision counter, as the mutex's and
//!   the semaphore's tokens do: they never repeat, also after a key expires. Readers' tokens
//!   are in queue order among themselves, although readers may learn of their grants in any
//!   order.
//!
//! `try_read` and `try_write` (`wait == false`) put their entry only in a transaction that
//! sees nothing ahead (no `write/` key, or no key at all), so a refused try leaves nothing.
//!
//! # Waiting without a herd
//! A waiter watches only the nearest of the entries ahead of it (the one the attempt read),
//! for its deletion: a reader the nearest earlier write entry, a writer its predecessor of
//! any kind. While that key exists the waiter cannot hold, whatever happens elsewhere in the
//! queue, so no event it does not watch can grant it; when it goes, the waiter reads its
//! entries ahead afresh and holds, or watches the next nearest. The window between the
//! attempt's read (revision `r`) and the watch's start (revision `w`) is closed as the
//! mutex's is (`wait_for_delete` in `wait.rs`): the watch starts at `w`, and if `w > r` a read
//! after the start checks that the key is still there with the create revision the attempt
//! saw. A broken watch, connection or session ends the wait.
//!
//! So a writer's release wakes the readers queued behind it up to the next write entry, each
//! of which is granted, and the writer behind them only when the entry just ahead of it goes:
//! with readers released in queue order, the newest reader's departure alone. A reader's
//! release wakes at most the one writer just behind it, never another reader. Every wake is
//! one read-only transaction and, if still blocked, one new watch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp};
use lockkit_core::backend::{AcquireRequest, Attempt, Contention, Grant, Hold, Lease};
use lockkit_core::{Error, ErrorKind, Result};

use crate::backend::{EtcdBackend, txn_of};
use crate::error::NAME;
use crate::naming::{by_create, key_of, owner_of, predecessor_of, token_of};
use crate::semaphore::{abandoned, reads_of};
use crate::session::Session;
use crate::wait::FAR_FUTURE;

/// How many times one attempt reads and writes again when the queue changed under it (its
/// key appeared or went between two of its transactions) before it reports the attempt as
/// failed, retryably.
const ROUNDS: usize = 4;

/// The keys of one read-write lock.
#[derive(Debug)]
pub(crate) struct RwLayout {
    /// The whole range: every entry.
    all: String,
    /// The readers' part.
    reads: String,
    /// The writers' part.
    writes: String,
}

impl RwLayout {
    fn under(all: String) -> RwLayout {
        RwLayout {
            reads: format!("{all}read/"),
            writes: format!("{all}write/"),
            all,
        }
    }

    /// Where the entries of `hold` live.
    fn part(&self, hold: Hold) -> &str {
        if hold == Hold::Write {
            &self.writes
        } else {
            &self.reads
        }
    }

    /// The range of the entries that can keep an entry of `hold` out.
    fn blockers(&self, hold: Hold) -> &str {
        if hold == Hold::Write {
            &self.all
        } else {
            &self.writes
        }
    }

    /// The nearest entry ahead of the entry of `hold` created at `own_revision`.
    fn ahead_of(&self, hold: Hold, own_revision: i64) -> TxnOp {
        TxnOp::get(
            self.blockers(hold),
            Some(predecessor_of(own_revision).with_keys_only()),
        )
    }

    /// Right after the own key's put: the newest two keys of the range that can keep it out
    /// (the own key among them for a writer), enough to find the nearest one ahead.
    fn newest_blockers(&self, hold: Hold) -> TxnOp {
        let options = by_create(etcd_client::SortOrder::Descend, 2).with_keys_only();
        TxnOp::get(self.blockers(hold), Some(options))
    }
}

/// What an attempt learned of the own entry.
struct Found {
    own_revision: i64,
    /// The nearest entry ahead (its key and create revision); `None`: the entry holds.
    ahead: Option<(String, i64)>,
    /// The store revision of the read.
    revision: i64,
}

/// The nearest entry ahead among `read` (newest first), leaving out the own key `own`.
fn nearest(read: Vec<KeyValue>, own: &str) -> Option<(String, i64)> {
    read.into_iter()
        .find(|kv| kv.key() != own.as_bytes())
        .map(|kv| (key_of(&kv), kv.create_revision()))
}

impl EtcdBackend {
    /// The etcd key range (`<prefix>/<namespace>/../rwlock/<name>/`) under which the readers
    /// and the writers of the read-write lock `key` keep their keys, in a part per kind
    /// (`read/`, `write/`). It is apart from the mutex and the semaphore of that name: no
    /// lock name is `..`, and the semaphores are under `../semaphore/`.
    pub fn rwlock_prefix(&self, key: &lockkit_core::LockKey) -> String {
        format!(
            "{}/{}/{}/{}/",
            self.inner.config.prefix,
            key.namespace(),
            crate::naming::RWLOCKS,
            key.name()
        )
    }

    fn rw_layout(&self, key: &lockkit_core::LockKey) -> RwLayout {
        RwLayout::under(self.rwlock_prefix(key))
    }

    /// One attempt to take a read or a write lock (see the module docs).
    pub(crate) async fn attempt_rw(&self, request: &AcquireRequest) -> Result<Attempt> {
        let started = Instant::now();
        let session = self.session_for(request.ttl).await?;
        let layout = self.rw_layout(&request.key);
        let (own, known) = self.entry_for(request, &session, layout.part(request.hold));
        let found = self
            .queue_rw_entry(request, &session, &layout, &own, known)
            .await;
        {
            let mut entries = self.entries();
            let Some(entry) = entries.get_mut(&request.owner) else {
                return Err(abandoned());
            };
            match &found {
                Ok(Some(found)) => {
                    entry.in_flight = false;
                    entry.maybe_on_server = true;
                    entry.create_revision = Some(found.own_revision);
                    entry.predecessor.clone_from(&found.ahead);
                }
                // A try that saw something ahead: its put was not applied.
                Ok(None) => {
                    entry.in_flight = false;
                    entry.maybe_on_server = false;
                    entry.create_revision = None;
                    entry.predecessor = None;
                }
                // The entry is left as it may be: an unanswered put may still land, and
                // clean-up must know.
                Err(_) => {}
            }
        }
        let Some(found) = found? else {
            return Ok(Attempt::Contended(Contention::new()));
        };
        if let Some((ahead, _)) = found.ahead {
            let mut contention = Contention::new();
            contention.revision = Some(found.revision);
            return Ok(Attempt::Contended(
                contention.with_predecessor(ahead, Some(found.revision)),
            ));
        }
        if session.lost.is_cancelled() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                NAME,
                "the session was lost while acquiring; the next attempt starts a new one",
            ));
        }
        Ok(Attempt::Granted(
            Grant::new(token_of(found.own_revision), session.valid_from(started))
                .with_handle(own)
                .with_session(session.lost.clone()),
        ))
    }

    /// Puts the own entry if it is not on the server (for a try, only if nothing is ahead)
    /// and reads the nearest entry ahead, in one transaction while nothing changes under it.
    /// `None`: a try that saw an entry ahead and put nothing.
    async fn queue_rw_entry(
        &self,
        request: &AcquireRequest,
        session: &Arc<Session>,
        layout: &RwLayout,
        own: &str,
        mut known: Option<i64>,
    ) -> Result<Option<Found>> {
        let hold = request.hold;
        let digest = request.owner.digest_hex();
        for _ in 0..ROUNDS {
            if let Some(own_revision) = known {
                // The own key is normally there after a wait: reads alone decide, without a
                // raft write.
                let txn = Txn::new()
                    .and_then([TxnOp::get(own, None), layout.ahead_of(hold, own_revision)]);
                let response = self.send_attempt(session, &txn, false).await?;
                let revision = response.header().map_or(0, |h| h.revision());
                let mut reads = reads_of(response).into_iter();
                match reads.next().and_then(|kvs| kvs.into_iter().next()) {
                    None => known = None,
                    Some(kv) if owner_of(kv.value()) != digest.as_bytes() => {
                        return Err(self.move_off_stale_key(
                            request,
                            session,
                            layout.part(hold),
                            kv.value(),
                        ));
                    }
                    Some(kv) if kv.create_revision() != own_revision => {
                        known = Some(kv.create_revision());
                    }
                    Some(_) => {
                        return Ok(Some(Found {
                            own_revision,
                            ahead: nearest(reads.next().unwrap_or_default(), own),
                            revision,
                        }));
                    }
                }
                continue;
            }
            let put = TxnOp::put(
                own,
                digest.clone(),
                Some(PutOptions::new().with_lease(session.lease_id)),
            );
            let mut put_if = vec![Compare::create_revision(own, CompareOp::Equal, 0)];
            if !request.wait {
                // try_read / try_write queue only with nothing ahead: a refusal leaves nothing.
                put_if.push(
                    Compare::create_revision(layout.blockers(hold), CompareOp::Equal, 0)
                        .with_prefix(),
                );
            }
            let txn = Txn::new()
                .when(put_if)
                .and_then([put, layout.newest_blockers(hold)])
                .or_else([TxnOp::get(own, None)]);
            let response = self.send_attempt(session, &txn, true).await?;
            let revision = response.header().map_or(0, |h| h.revision());
            let succeeded = response.succeeded();
            let mut reads = reads_of(response).into_iter();
            if succeeded {
                let _put = reads.next();
                return Ok(Some(Found {
                    own_revision: revision,
                    ahead: nearest(reads.next().unwrap_or_default(), own),
                    revision,
                }));
            }
            match reads.next().and_then(|kvs| kvs.into_iter().next()) {
                Some(kv) if owner_of(kv.value()) != digest.as_bytes() => {
                    return Err(self.move_off_stale_key(
                        request,
                        session,
                        layout.part(hold),
                        kv.value(),
                    ));
                }
                // An earlier attempt's put landed; its answer was lost.
                Some(kv) => known = Some(kv.create_revision()),
                None => return Ok(None),
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            NAME,
            "the read-write lock's queue changed under every round of the attempt; trying again",
        ))
    }

    /// Waits until the nearest entry ahead of `request`'s, as its attempt read it, is deleted,
    /// or `max_wait` passes (see the module docs).
    pub(crate) async fn wait_for_rw(
        &self,
        request: &AcquireRequest,
        contention: &Contention,
        max_wait: Duration,
    ) -> Result<()> {
        let now = tokio::time::Instant::now();
        let deadline = now.checked_add(max_wait).unwrap_or(now + FAR_FUTURE);
        let known = self
            .entries()
            .get(&request.owner)
            .and_then(|entry| entry.predecessor.clone());
        match (&contention.predecessor, known, contention.revision) {
            (Some(name), Some((ahead, created)), Some(revision)) if *name == ahead => {
                let what = if request.hold == Hold::Write {
                    "watching the entry ahead"
                } else {
                    "watching the writer ahead"
                };
                self.wait_for_delete(what, &ahead, created, revision, deadline)
                    .await
            }
            // The attempt's answer and the entry disagree (another attempt ran between), or
            // a try saw contention: the next attempt reads afresh.
            _ => Ok(()),
        }
    }

    /// Whether `lease` holds its read or write lock: its key exists with the grant's create
    /// revision and owner, and nothing is ahead of it, read in one read-only transaction.
    pub(crate) async fn holds_rw(&self, lease: &Lease) -> Result<bool> {
        let Some(key) = lease.handle() else {
            return Ok(false);
        };
        let Ok(token) = i64::try_from(lease.fencing_token().get()) else {
            return Ok(false);
        };
        let layout = self.rw_layout(lease.key());
        let txn =
            Txn::new().and_then([TxnOp::get(key, None), layout.ahead_of(lease.hold(), token)]);
        let response = self.read("checking the rwlock", txn_of(&txn)).await?;
        let mut reads = reads_of(response).into_iter();
        let own = reads.next().and_then(|kvs| kvs.into_iter().next());
        let ours = own.is_some_and(|kv| {
            kv.create_revision() == token
                && owner_of(kv.value()) == lease.owner().digest_hex().as_bytes()
        });
        let ahead = reads.next().unwrap_or_default();
        Ok(ours && ahead.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_is_kept_out_by_writers_and_a_writer_by_everyone() {
        let layout = RwLayout::under("lk/ns/../rwlock/table/".into());
        assert_eq!(layout.part(Hold::Read), "lk/ns/../rwlock/table/read/");
        assert_eq!(layout.part(Hold::Write), "lk/ns/../rwlock/table/write/");
        assert_eq!(layout.blockers(Hold::Read), layout.part(Hold::Write));
        assert_eq!(layout.blockers(Hold::Write), "lk/ns/../rwlock/table/");
        for hold in [Hold::Read, Hold::Write] {
            assert!(layout.part(hold).starts_with(layout.blockers(Hold::Write)));
        }
        assert!(!"lk/ns/../rwlock/table0/write/".starts_with(layout.blockers(Hold::Write)));
    }
}
