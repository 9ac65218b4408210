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
//! The attempt, the grant and the waits are every kind's (`acquire.rs`, `wait.rs`): a
//! reader and a writer are [`Kind::First`](crate::acquire::Kind::First) with these ranges.
//!
//! So a writer's release wakes the readers queued behind it up to the next write entry, each
//! of which is granted, and the writer behind them only when the entry just ahead of it goes:
//! with readers released in queue order, the newest reader's departure alone. A reader's
//! release wakes at most the one writer just behind it, never another reader. Every wake is
//! one read-only transaction and, if still blocked, one new watch.

use lockkit_core::backend::Hold;

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
    /// The layout of the read-write lock whose range is `all`.
    pub(crate) fn under(all: String) -> RwLayout {
        RwLayout {
            reads: format!("{all}read/"),
            writes: format!("{all}write/"),
            all,
        }
    }

    /// Where the entries of `hold` live.
    pub(crate) fn part(&self, hold: Hold) -> &str {
        if hold == Hold::Write {
            &self.writes
        } else {
            &self.reads
        }
    }

    /// The range of the entries that can keep an entry of `hold` out.
    pub(crate) fn blockers(&self, hold: Hold) -> &str {
        if hold == Hold::Write {
            &self.all
        } else {
            &self.writes
        }
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
