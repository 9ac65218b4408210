//! The one attempt of every kind of grant on etcd (a mutex, a permit, a read or a write
//! lock): the transaction that queues the own key (or finds it again) and reads, at the same
//! revision, where it stands; then the grant, or what to wait for.
//!
//! It is Curator's `LockInternals` loop, as lockkit-zk's `attempt` is: the attempt and the
//! grant are the same for every kind, and a [`Kind`] decides only where the own key queues,
//! which keys keep it out and what a waiter watches (the proofs are in `semaphore.rs` and
//! `rwlock.rs`). A mutex is a writer over its own range: it holds when no key of its range
//! was created before its own.
//!
//! Every put also compares the session's epoch key (see [`Session::epoch`]): a put that an
//! attempt sent and never heard of cannot land after the session's clean-up settled it.

use std::sync::Arc;
use std::time::Instant;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};
use lockkit_core::backend::{AcquireRequest, Attempt, Contention, Grant, Hold, Lease};
use lockkit_core::{Error, ErrorKind, Result};

use crate::backend::EtcdBackend;
use crate::cleanup::Pending;
use crate::error::{self, BACKEND};
use crate::naming::{by_create, key_of, owner_of, predecessor_of, token_of};
use crate::request::{Resend, txn_of};
use crate::rwlock::RwLayout;
use crate::semaphore::{Layout, Rank};
use crate::session::Session;

/// How many times one attempt reads and writes again when the queue changed under it (its
/// key appeared or went between two of its transactions, or the session's epoch moved)
/// before it reports the attempt as failed, retryably.
pub(crate) const MAX_ROUNDS: usize = 4;

/// What decides a grant for one kind of request: where the own key queues, which keys keep
/// it out, and what a waiter watches.
#[derive(Debug)]
pub(crate) enum Kind {
    /// Held once no key of `blockers` was created before the own key, which queues under
    /// `part`: a mutex (both are its range), a reader (the read-write lock's `write/` part
    /// keeps it out), a writer (the whole read-write lock does).
    First { part: String, blockers: String },
    /// Held while fewer than `permits` keys of the semaphore were created before it.
    Permit(Layout),
}

/// Where the own key stands at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Place {
    /// It holds; `touch`: a key queued behind it may be watching for the moment it holds.
    Holds { touch: bool },
    /// It waits, for this.
    Waits(Watch),
}

/// What a waiting key waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Watch {
    /// The deletion of this key (created at this revision): the nearest key that keeps it
    /// out.
    Deleted(String, i64),
    /// The deletion or the touch of this key (created at this revision): a semaphore
    /// waiter's predecessor, which may hold next.
    Changed(String, i64),
    /// A departure ahead of the own key: the semaphore's first waiter.
    Departure,
}

impl Watch {
    /// The key watched, if one.
    fn key(&self) -> Option<&str> {
        match self {
            Watch::Deleted(key, _) | Watch::Changed(key, _) => Some(key),
            Watch::Departure => None,
        }
    }
}

impl Kind {
    /// The kind of `hold` on `key` of `backend`.
    pub(crate) fn of(
        backend: &EtcdBackend,
        key: &lockkit_core::LockKey,
        hold: Hold,
    ) -> Result<Kind> {
        Ok(match hold {
            Hold::Exclusive => {
                let range = backend.lock_prefix(key);
                Kind::First {
                    part: range.clone(),
                    blockers: range,
                }
            }
            Hold::Read | Hold::Write => {
                let layout = RwLayout::under(backend.rwlock_prefix(key));
                Kind::First {
                    part: layout.part(hold).to_owned(),
                    blockers: layout.blockers(hold).to_owned(),
                }
            }
            Hold::Permit { permits } => {
                Kind::Permit(Layout::under(backend.semaphore_prefix(key), permits))
            }
            other => return Err(other.unsupported(BACKEND)),
        })
    }

    /// Where the own key lives.
    pub(crate) fn part(&self) -> &str {
        match self {
            Kind::First { part, .. } => part,
            Kind::Permit(layout) => layout.part(),
        }
    }

    /// What must hold for the own key's put: it is not on the server; for a try of a
    /// [`Kind::First`], nothing keeps it out (a refused try leaves nothing); for a permit, no
    /// entry of the semaphore has another count.
    fn put_guard(&self, own: &str, wait: bool) -> Vec<Compare> {
        let mut guard = vec![Compare::create_revision(own, CompareOp::Equal, 0)];
        match self {
            Kind::First { blockers, .. } if !wait => {
                guard.push(
                    Compare::create_revision(blockers.as_str(), CompareOp::Equal, 0).with_prefix(),
                );
            }
            Kind::First { .. } => {}
            Kind::Permit(layout) => guard.extend(layout.no_other_count()),
        }
        guard
    }

    /// Read with the put: the newest keys that can keep the own key out, enough to tell its
    /// place (the own key is the newest of all).
    fn newest(&self) -> TxnOp {
        match self {
            Kind::First { blockers, .. } => TxnOp::get(
                blockers.as_str(),
                Some(by_create(SortOrder::Descend, 2).with_keys_only()),
            ),
            Kind::Permit(layout) => layout.newest(),
        }
    }

    /// The place of a key just put, from [`Kind::newest`]: nobody is queued behind it.
    fn place_after_put(&self, newest: Vec<KeyValue>, own: &str) -> Place {
        let ahead: Vec<KeyValue> = newest
            .into_iter()
            .filter(|kv| kv.key() != own.as_bytes())
            .collect();
        self.place_of(ahead, false)
    }

    /// Read with a known own key (created at `own_revision`): what tells its place.
    pub(crate) fn reads(&self, own_revision: i64) -> Vec<TxnOp> {
        match self {
            Kind::First { blockers, .. } => vec![TxnOp::get(
                blockers.as_str(),
                Some(predecessor_of(own_revision).with_keys_only()),
            )],
            Kind::Permit(layout) => {
                vec![layout.ahead_of(own_revision), layout.behind(own_revision)]
            }
        }
    }

    /// The place the answers to [`Kind::reads`] tell.
    pub(crate) fn place(&self, reads: Vec<Vec<KeyValue>>) -> Place {
        let mut reads = reads.into_iter();
        let ahead = reads.next().unwrap_or_default();
        let behind = reads.next().is_some_and(|kvs| !kvs.is_empty());
        self.place_of(ahead, behind)
    }

    /// The place of a key with `ahead` (newest first, as read) before it, and a key
    /// `behind` it or not.
    fn place_of(&self, ahead: Vec<KeyValue>, behind: bool) -> Place {
        match self {
            Kind::First { .. } => match ahead.first() {
                None => Place::Holds { touch: false },
                Some(kv) => Place::Waits(Watch::Deleted(key_of(kv), kv.create_revision())),
            },
            Kind::Permit(layout) => match Rank::of(&ahead, layout.permits) {
                Rank::Holder => Place::Holds { touch: behind },
                Rank::First => Place::Waits(Watch::Departure),
                Rank::Behind(key, created) => Place::Waits(Watch::Changed(key, created)),
            },
        }
    }

    /// Read when the put was not taken, after the own key: what tells why.
    fn else_reads(&self) -> Vec<TxnOp> {
        match self {
            Kind::First { .. } => Vec::new(),
            Kind::Permit(layout) => layout.other_count(),
        }
    }

    /// Why a put was not taken with the own key absent and the session's epoch unchanged:
    /// `Some(Ok(()))` a try that something keeps out (it put nothing), `Some(Err(_))` a
    /// semaphore in use with another count; `None` the queue changed between the rounds.
    fn refused(&self, request: &AcquireRequest, reads: Vec<Vec<KeyValue>>) -> Option<Result<()>> {
        match self {
            Kind::First { .. } => (!request.wait).then_some(Ok(())),
            Kind::Permit(layout) => reads
                .into_iter()
                .find_map(|kvs| kvs.into_iter().next())
                .map(|other| Err(layout.mismatch(request, &other))),
        }
    }
}

/// What an attempt found.
enum Queued {
    /// The own key, where it stands, and the store revision of the read.
    Found {
        own_revision: i64,
        place: Place,
        revision: i64,
    },
    /// A try that something keeps out: it put nothing.
    KeptOut,
}

/// The key-values of each get of a transaction's answer, in order.
pub(crate) fn reads_of(response: TxnResponse) -> Vec<Vec<KeyValue>> {
    response
        .op_responses()
        .into_iter()
        .map(|op| match op {
            TxnOpResponse::Get(mut get) => get.take_kvs(),
            _ => Vec::new(),
        })
        .collect()
}

impl EtcdBackend {
    /// The key of `request` on `session` (the one of an earlier attempt, or a new one under
    /// `part`) and its create revision if known; marks an attempt as in flight.
    pub(crate) fn pending_for(
        &self,
        request: &AcquireRequest,
        session: &Arc<Session>,
        part: &str,
    ) -> (String, Option<i64>) {
        let mut pending = self.pending();
        let fresh = || Pending {
            claim: self.inner.names.claim(part, session.lease_id),
            session: session.clone(),
            create_revision: None,
            maybe_on_server: false,
            in_flight: false,
            watch: None,
        };
        let entry = pending.entry(request.owner.clone()).or_insert_with(fresh);
        if !Arc::ptr_eq(&entry.session, session) {
            // The earlier key went with its session's lease: queue again on the new session.
            self.inner.names.free(&entry.claim);
            *entry = fresh();
        }
        entry.maybe_on_server = true;
        entry.in_flight = true;
        (entry.claim.key.clone(), entry.create_revision)
    }

    /// Sends one attempt's transaction on `session`. One that may put (`puts`) stays in the
    /// session's ledger until it is answered: unanswered (cancelled, timed out, a broken
    /// link), its put may still land, until the session's clean-up settles it. A lease the
    /// server no longer knows ends the session.
    pub(crate) async fn send_attempt(
        &self,
        session: &Session,
        txn: &Txn,
        puts: bool,
    ) -> Result<TxnResponse> {
        let sending = puts.then(|| session.ledger.send());
        let answer = self
            .send(Resend::IfNeverSent, txn_of(txn))
            .await
            .map(|sent| sent.answer);
        if let (Some(sending), Some(Ok(_))) = (sending, &answer) {
            sending.answered();
        }
        match answer {
            Some(Ok(response)) => Ok(response),
            Some(Err(e)) if error::is_lease_gone(&e) => {
                session.lose("the server says the session lease is gone");
                Err(Error::new(
                    ErrorKind::Unavailable,
                    BACKEND,
                    "the session lease expired; the next attempt starts a new session",
                )
                .with_source(e))
            }
            Some(Err(e)) => Err(error::map("acquiring", e)),
            None => Err(error::timed_out(
                "acquiring",
                self.inner.config.request_timeout,
            )),
        }
    }

    /// One attempt of any kind (see the module docs and
    /// [`LockBackend::try_acquire`](lockkit_core::backend::LockBackend::try_acquire)).
    pub(crate) async fn attempt(&self, request: &AcquireRequest) -> Result<Attempt> {
        let started = Instant::now();
        let kind = Kind::of(self, &request.key, request.hold)?;
        let session = self.session_for(request.ttl).await?;
        if let Kind::Permit(layout) = &kind
            && !request.wait
            && !self.pending().contains_key(&request.owner)
        {
            // A try queues only on a semaphore with a permit free, so a full one costs one
            // read and leaves nothing behind.
            if let Some(refused) = self.check_free(request, layout).await? {
                return refused;
            }
        }
        let (own, known) = self.pending_for(request, &session, kind.part());
        let queued = self.queue_key(request, &session, &kind, &own, known).await;
        self.record(request, &queued)?;
        match queued? {
            Queued::KeptOut => Ok(Attempt::Contended(Contention::new())),
            Queued::Found {
                own_revision,
                place: Place::Holds { touch },
                ..
            } => {
                self.grant(request, &session, own, own_revision, touch, started)
                    .await
            }
            Queued::Found {
                place: Place::Waits(watch),
                revision,
                ..
            } => {
                let mut contention = Contention::new();
                contention.revision = Some(revision);
                if let Some(key) = watch.key() {
                    contention = contention.with_predecessor(key, Some(revision));
                }
                Ok(Attempt::Contended(contention))
            }
        }
    }

    /// Puts the own key if it is not on the server (as [`Kind::put_guard`] allows) and reads
    /// where it stands, in as few transactions as the queue allows: one while nothing
    /// changes under it.
    async fn queue_key(
        &self,
        request: &AcquireRequest,
        session: &Arc<Session>,
        kind: &Kind,
        own: &str,
        mut known: Option<i64>,
    ) -> Result<Queued> {
        let digest = request.owner.digest_hex();
        for _ in 0..MAX_ROUNDS {
            if let Some(own_revision) = known {
                // The own key is normally there after a wait: reads alone decide, without a
                // raft write (a disk sync on a majority).
                let mut reads = vec![TxnOp::get(own, None)];
                reads.extend(kind.reads(own_revision));
                let txn = Txn::new().and_then(reads);
                let response = self.send_attempt(session, &txn, false).await?;
                let revision = response.header().map_or(0, |h| h.revision());
                let mut reads = reads_of(response).into_iter();
                match reads.next().and_then(|kvs| kvs.into_iter().next()) {
                    None => known = None,
                    Some(kv) if owner_of(kv.value()) != digest.as_bytes() => {
                        return Err(self.move_off_stale_key(
                            request,
                            session,
                            kind.part(),
                            kv.value(),
                        ));
                    }
                    Some(kv) if kv.create_revision() != own_revision => {
                        known = Some(kv.create_revision());
                    }
                    Some(_) => {
                        return Ok(Queued::Found {
                            own_revision,
                            place: kind.place(reads.collect()),
                            revision,
                        });
                    }
                }
                continue;
            }
            let epoch = session.epoch();
            let put = TxnOp::put(
                own,
                digest.clone(),
                Some(PutOptions::new().with_lease(session.lease_id)),
            );
            let mut guard = kind.put_guard(own, request.wait);
            guard.push(Compare::mod_revision(
                session.epoch_key.as_str(),
                CompareOp::Equal,
                epoch,
            ));
            let mut otherwise = vec![TxnOp::get(own, None)];
            otherwise.extend(kind.else_reads());
            otherwise.push(TxnOp::get(
                session.epoch_key.as_str(),
                Some(GetOptions::new().with_keys_only()),
            ));
            let txn = Txn::new()
                .when(guard)
                .and_then([put, kind.newest()])
                .or_else(otherwise);
            let response = self.send_attempt(session, &txn, true).await?;
            let revision = response.header().map_or(0, |h| h.revision());
            let succeeded = response.succeeded();
            let mut reads = reads_of(response);
            if succeeded {
                let newest = reads.pop().unwrap_or_default();
                return Ok(Queued::Found {
                    own_revision: revision,
                    place: kind.place_after_put(newest, own),
                    revision,
                });
            }
            let now_epoch = reads
                .pop()
                .and_then(|kvs| kvs.into_iter().next())
                .map_or(0, |kv| kv.mod_revision());
            let mut reads = reads.into_iter();
            match reads.next().and_then(|kvs| kvs.into_iter().next()) {
                Some(kv) if owner_of(kv.value()) != digest.as_bytes() => {
                    return Err(self.move_off_stale_key(request, session, kind.part(), kv.value()));
                }
                // An earlier attempt's put landed; its answer was lost.
                Some(kv) => known = Some(kv.create_revision()),
                // The session's clean-up moved the epoch: put again under the new one.
                None if now_epoch != epoch => session.saw_epoch(now_epoch),
                None => match kind.refused(request, reads.collect()) {
                    Some(Ok(())) => return Ok(Queued::KeptOut),
                    Some(Err(refused)) => return Err(refused),
                    None => {}
                },
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            BACKEND,
            "the queue changed under every round of the attempt; trying again",
        ))
    }

    /// Records what the attempt found in the acquisition's pending record. A refused count
    /// and a try kept out were answered and put nothing; other errors leave the record as it
    /// may be (an unanswered put may still land, and clean-up must know).
    fn record(&self, request: &AcquireRequest, queued: &Result<Queued>) -> Result<()> {
        let mut pending = self.pending();
        let Some(entry) = pending.get_mut(&request.owner) else {
            return Err(abandoned());
        };
        match queued {
            Ok(Queued::Found {
                own_revision,
                place,
                ..
            }) => {
                entry.in_flight = false;
                entry.maybe_on_server = true;
                entry.create_revision = Some(*own_revision);
                entry.watch = match place {
                    Place::Waits(watch) => Some(watch.clone()),
                    Place::Holds { .. } => None,
                };
            }
            Ok(Queued::KeptOut) => {
                entry.in_flight = false;
                entry.maybe_on_server = false;
                entry.create_revision = None;
                entry.watch = None;
            }
            Err(e) if e.kind() == ErrorKind::InvalidConfig => {
                entry.in_flight = false;
                entry.maybe_on_server = false;
                entry.create_revision = None;
            }
            Err(_) => {}
        }
        Ok(())
    }

    /// The grant of the own key, read holding at one revision on the live session lease;
    /// with `touch`, its key is put again first, to tell the waiter behind it.
    async fn grant(
        &self,
        request: &AcquireRequest,
        session: &Session,
        own: String,
        own_revision: i64,
        touch: bool,
        started: Instant,
    ) -> Result<Attempt> {
        if session.lost.is_cancelled() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                BACKEND,
                "the session was lost while acquiring; the next attempt starts a new one",
            ));
        }
        if touch {
            self.touch(request, session, &own, own_revision).await?;
        }
        Ok(Attempt::Granted(
            Grant::new(token_of(own_revision), session.valid_from(started))
                .with_handle(own)
                .with_session(session.lost.clone()),
        ))
    }

    /// Whether `lease` still holds: its key exists with the grant's create revision and
    /// owner, and its kind's reads say it holds, in one read-only transaction.
    pub(crate) async fn holds(&self, lease: &Lease) -> Result<bool> {
        let Some(key) = lease.handle() else {
            return Ok(false);
        };
        let Ok(token) = i64::try_from(lease.fencing_token().get()) else {
            return Ok(false);
        };
        let kind = Kind::of(self, lease.key(), lease.hold())?;
        let mut reads = vec![TxnOp::get(key, None)];
        reads.extend(kind.reads(token));
        let response = self
            .read("checking the lock", txn_of(&Txn::new().and_then(reads)))
            .await?;
        let mut reads = reads_of(response).into_iter();
        let own = reads.next().and_then(|kvs| kvs.into_iter().next());
        let ours = own.is_some_and(|kv| {
            kv.create_revision() == token
                && owner_of(kv.value()) == lease.owner().digest_hex().as_bytes()
        });
        Ok(ours && matches!(kind.place(reads.collect()), Place::Holds { .. }))
    }
}

/// The error of an attempt whose acquisition was abandoned while it ran.
pub(crate) fn abandoned() -> Error {
    Error::new(
        ErrorKind::Unavailable,
        BACKEND,
        "the acquisition was abandoned while its attempt ran",
    )
}
