//! Semaphores on etcd: a queue of keys ordered by create revision, the first `permits` of
//! which hold a permit, with the mutex's sessions, key names, clean-up and orphan sweep.
//!
//! # Keys
//! An entry is `<semaphore_prefix><permits>/<lease-hex>-<n>` on the session lease, its value
//! the owner digest ([`EtcdBackend::semaphore_prefix`] is
//! `<prefix>/<namespace>/../semaphore/<name>/`). The permit count is a segment of the key,
//! not only part of its value, so that one transaction can refuse a disagreeing count: the
//! put of a new entry is guarded by "the semaphore's range has no key outside my part"
//! (two range compares, [`Layout::no_other_count`]). So at every revision the entries of a
//! semaphore all carry one count, a request with another count gets
//! [`Hold::permits_mismatch`] and **leaves nothing** (its put was never applied), and the
//! count is free again once the last holder or waiter is gone.
//!
//! # Grant
//! Let an entry's *place* be the number of the semaphore's keys created before it. An entry
//! at a place below `permits` holds a permit, and its create revision is its fencing token.
//! Keys are added only at the end (a new key has the store's newest revision) and removed
//! anywhere (release, abandon, the end of a session lease), so **a place never grows**: a
//! holder stays one for as long as its key exists (renewal and release are the mutex's,
//! unchanged), and at most `permits` keys hold at any revision. The server makes keys holders
//! in create order, so tokens increase with every grant (a client may learn of its grant
//! after a later key's client learned of its own). A grant is read in one transaction that
//! saw the own key on the live session lease, as for the mutex.
//!
//! # Waiting without a herd
//! A waiter at place `k >= permits` (its attempt read it at revision `r`) waits for what can
//! change its place's meaning:
//! - the **first waiter** (`k == permits`) watches the semaphore's range for deletions of keys
//!   created before its own (the deleted key's previous version says when it was created):
//!   the first departure ahead makes it a holder;
//! - a **later waiter** (`k > permits`) watches only its predecessor's key, for a delete or a
//!   put;
//! - a waiter that finds itself holding with a key queued behind it *touches* its key (puts
//!   it again: same value, same lease, guarded by its create revision) before it reports the
//!   grant, so that the waiter behind it learns that it is now the first waiter.
//!
//! Why no change is missed. Let `e` be a later waiter and `d` its predecessor
//! (`k_d = k_e - 1 >= permits`). While `d` exists, `k_e = k_d + 1`, so `e` becomes the first
//! waiter (or a holder) exactly when `d` becomes a holder; and `e`'s predecessor changes only
//! when `d` goes. Both are events on `d`'s key: its touch, its delete. `d` learns that it holds
//! (and touches) by the same argument one place ahead, down to the first waiter, who watches
//! every departure ahead of it. `d` does touch: `e` watches `d` only once `e`'s key exists, so
//! the read in which `d` finds itself holding (a read of a known key, after `e`'s put) shows
//! `e`'s key behind it, whatever `d`'s earlier attempts saw or failed to hear (a put whose
//! reply was lost is adopted by the next attempt, which still reads what is behind it). A
//! grant read in the round that put the own key has nobody behind it. A woken waiter reads its place afresh and watches what its new
//! place needs. The window between the attempt's read (revision `r`) and the watch's start
//! (revision `w`) is closed as the mutex's is: the watch starts at `w` (a start in the past
//! would join the server's unsynced watchers, caught up only every 100 ms), and if `w > r` a
//! read after the start checks that nothing happened in between (the first waiter's place is
//! still `permits`; the predecessor still exists with its create revision and has not been
//! written since `r`). A broken watch, connection or session ends the wait, as for the mutex.
//!
//! The waits are in `wait.rs`, beside the mutex's. So a release wakes two waiters however long
//! the queue is: the first waiter, which holds
//! now, and through its touch the one behind it, which becomes the first waiter. A waiter that
//! leaves wakes only the one behind it.
//!
//! What it cannot promise: a waiter that becomes a holder while its process is hung or cut
//! off does not touch, so the waiter behind it learns its new place only when that key goes
//! with its session lease, within the session TTL. Safety does not depend on it: a grant is
//! always read from the server.

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, Txn, TxnOp, TxnOpResponse,
};
use lockkit_core::backend::{AcquireRequest, Attempt, Contention, Hold};
use lockkit_core::{Error, ErrorKind, Result};

use crate::acquire::{abandoned, reads_of};
use crate::backend::EtcdBackend;
use crate::error::BACKEND;
use crate::naming::{by_create, key_of, prefix_end};
use crate::request::{Resend, txn_of};
use crate::session::Session;

/// Where an entry stands in its semaphore's queue at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Rank {
    /// Fewer than `permits` keys ahead: the entry holds a permit.
    Holder,
    /// Exactly `permits` keys ahead: the next departure ahead frees a permit for it.
    First,
    /// More keys ahead; the one just ahead (its key and create revision) waits too.
    Behind(String, i64),
}

impl Rank {
    /// The rank of an entry whose keys ahead are `ahead`, newest first, as
    /// [`Layout::ahead_of`] reads them (at most `permits + 1`).
    pub(crate) fn of(ahead: &[KeyValue], permits: u32) -> Rank {
        let predecessor = ahead.first().map(|kv| (key_of(kv), kv.create_revision()));
        Rank::at(ahead.len(), predecessor, permits)
    }

    /// The rank of an entry with `ahead` keys ahead of it (counted up to `permits + 1`), the
    /// nearest of them being `predecessor`.
    fn at(ahead: usize, predecessor: Option<(String, i64)>, permits: u32) -> Rank {
        let permits = usize::try_from(permits).unwrap_or(usize::MAX);
        match predecessor {
            Some((key, created)) if ahead > permits => Rank::Behind(key, created),
            _ if ahead >= permits => Rank::First,
            _ => Rank::Holder,
        }
    }
}

/// The keys of one semaphore as a request with `permits` sees them.
#[derive(Debug)]
pub(crate) struct Layout {
    /// The semaphore's whole range.
    pub(crate) all: String,
    /// The part of the entries with this request's count.
    mine: String,
    pub(crate) permits: u32,
}

impl Layout {
    /// The layout of the semaphore whose range is `all`, for a request of `permits`.
    pub(crate) fn under(all: String, permits: u32) -> Layout {
        let mine = format!("{all}{permits}/");
        Layout { all, mine, permits }
    }

    /// Where this request's entries live.
    pub(crate) fn part(&self) -> &str {
        &self.mine
    }

    /// The two ranges of the semaphore outside `mine`: before it and after it.
    fn others(&self) -> [(Vec<u8>, Vec<u8>); 2] {
        [
            (self.all.as_bytes().to_vec(), self.mine.as_bytes().to_vec()),
            (
                prefix_end(self.mine.as_bytes()),
                prefix_end(self.all.as_bytes()),
            ),
        ]
    }

    /// Holds while no entry of the semaphore has another count.
    pub(crate) fn no_other_count(&self) -> Vec<Compare> {
        self.others()
            .into_iter()
            .map(|(from, to)| Compare::create_revision(from, CompareOp::Equal, 0).with_range(to))
            .collect()
    }

    /// Reads one key of each range outside `mine`.
    pub(crate) fn other_count(&self) -> Vec<TxnOp> {
        self.others()
            .into_iter()
            .map(|(from, to)| {
                let options = GetOptions::new()
                    .with_range(to)
                    .with_keys_only()
                    .with_limit(1);
                TxnOp::get(from, Some(options))
            })
            .collect()
    }

    /// The keys just ahead of the entry created at `own_revision`, newest first, enough of
    /// them to tell its [`Rank`].
    pub(crate) fn ahead_of(&self, own_revision: i64) -> TxnOp {
        let options = by_create(SortOrder::Descend, i64::from(self.permits) + 1)
            .with_max_create_revision(own_revision - 1)
            .with_keys_only();
        TxnOp::get(self.all.clone(), Some(options))
    }

    /// The first key created after the entry created at `own_revision`, if any: a holder
    /// with one behind it touches its key (see the module docs).
    pub(crate) fn behind(&self, own_revision: i64) -> TxnOp {
        let options = by_create(SortOrder::Ascend, 1)
            .with_min_create_revision(own_revision + 1)
            .with_keys_only();
        TxnOp::get(self.all.clone(), Some(options))
    }

    /// Right after the own key's put: the newest keys, the own key first, then enough of
    /// those ahead to tell its [`Rank`].
    pub(crate) fn newest(&self) -> TxnOp {
        let options = by_create(SortOrder::Descend, i64::from(self.permits) + 2).with_keys_only();
        TxnOp::get(self.all.clone(), Some(options))
    }

    /// The count recorded by a key of the semaphore (the segment after [`Layout::all`]).
    fn count_of(&self, key: &[u8]) -> Option<u32> {
        let rest = key.strip_prefix(self.all.as_bytes())?;
        let end = rest.iter().position(|b| *b == b'/')?;
        std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
    }

    /// The refusal of a request whose count disagrees with the entry `other`'s.
    pub(crate) fn mismatch(&self, request: &AcquireRequest, other: &KeyValue) -> Error {
        match self.count_of(other.key()) {
            Some(recorded) => Hold::permits_mismatch(BACKEND, &request.key, self.permits, recorded),
            None => Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                format!(
                    "semaphore {} has a key {:?} that is not a lockkit entry",
                    request.key,
                    key_of(other)
                ),
            ),
        }
    }
}

impl EtcdBackend {
    /// For a try: `Some` answer when the semaphore has no permit free (contended) or is in
    /// use with another count (refused), from one read-only transaction.
    pub(crate) async fn check_free(
        &self,
        request: &AcquireRequest,
        layout: &Layout,
    ) -> Result<Option<Result<Attempt>>> {
        let count = TxnOp::get(
            layout.all.clone(),
            Some(GetOptions::new().with_prefix().with_count_only()),
        );
        let mut reads = vec![count];
        reads.extend(layout.other_count());
        let txn = Txn::new().and_then(reads);
        let response = self.read("acquiring", txn_of(&txn)).await?;
        let taken = match response.op_responses().first() {
            Some(TxnOpResponse::Get(get)) => get.count(),
            _ => 0,
        };
        let mut reads = reads_of(response).into_iter().skip(1);
        if let Some(other) = reads.find_map(|kvs| kvs.into_iter().next()) {
            return Ok(Some(Err(layout.mismatch(request, &other))));
        }
        Ok((taken >= i64::from(layout.permits)).then(|| Ok(Attempt::Contended(Contention::new()))))
    }

    /// Puts the own key again, unchanged, to tell the waiter behind it that this entry holds
    /// a permit now (see the module docs). Guarded by the key's create revision and lease: a
    /// key that is not ours any more is left alone, and the attempt queues again.
    pub(crate) async fn touch(
        &self,
        request: &AcquireRequest,
        session: &Session,
        own: &str,
        own_revision: i64,
    ) -> Result<()> {
        let guard = [
            Compare::create_revision(own, CompareOp::Equal, own_revision),
            Compare::lease(own, CompareOp::Equal, session.lease_id),
        ];
        let put = TxnOp::put(
            own,
            request.owner.digest_hex(),
            Some(PutOptions::new().with_lease(session.lease_id)),
        );
        let txn = Txn::new().when(guard).and_then([put]);
        // A second application only wakes the waiter behind once more.
        let (response, _) = self
            .call_with(Resend::IfRetryable, "telling the next waiter", txn_of(&txn))
            .await?;
        if response.succeeded() {
            return Ok(());
        }
        let mut pending = self.pending();
        let Some(entry) = pending.get_mut(&request.owner) else {
            return Err(abandoned());
        };
        entry.create_revision = None;
        Err(Error::new(
            ErrorKind::Unavailable,
            BACKEND,
            "the permit's queue key went as it was granted; queueing again",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_holds_below_permits_waits_first_at_permits_and_behind_its_predecessor_above() {
        assert_eq!(Rank::at(0, None, 2), Rank::Holder);
        assert_eq!(Rank::at(1, Some(("a".into(), 5)), 2), Rank::Holder);
        assert_eq!(Rank::at(2, Some(("b".into(), 6)), 2), Rank::First);
        assert_eq!(
            Rank::at(3, Some(("c".into(), 7)), 2),
            Rank::Behind("c".into(), 7)
        );
        assert_eq!(Rank::at(1, Some(("a".into(), 5)), 1), Rank::First);
    }

    #[test]
    fn the_ranges_outside_a_count_cover_every_other_count_and_only_those() {
        let layout = Layout::under("lk/ns/../semaphore/jobs/".into(), 3);
        let [(before_from, before_to), (after_from, after_to)] = layout.others();
        let within =
            |key: &str, from: &[u8], to: &[u8]| key.as_bytes() >= from && key.as_bytes() < to;
        let outside = |key: &str| {
            within(key, &before_from, &before_to) || within(key, &after_from, &after_to)
        };
        assert!(!outside("lk/ns/../semaphore/jobs/3/00000000000000ab-0"));
        for other in ["2", "30", "4", "1024"] {
            let key = format!("lk/ns/../semaphore/jobs/{other}/00000000000000ab-0");
            assert!(outside(&key), "{key} is not seen as another count");
            assert_eq!(layout.count_of(key.as_bytes()), other.parse().ok());
        }
        assert!(!outside("lk/ns/../semaphore/jobs0/2/00000000000000ab-0"));
        assert!(!outside("lk/ns/../semaphore/job/2/00000000000000ab-0"));
        assert!(!outside("lk/ns/jobs/00000000000000ab-0"));
    }
}
