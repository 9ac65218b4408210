//! One acquisition attempt on etcd: the transaction that queues the own key (or finds it
//! again) and reads, at the same revision, who holds the lock.

use std::sync::Arc;
use std::time::Instant;

use etcd_client::{
    Compare, CompareOp, PutOptions, SortOrder, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use lockkit_core::backend::{AcquireRequest, Attempt, Contention, Grant};
use lockkit_core::{Error, ErrorKind, Result};

use crate::backend::{EtcdBackend, Resend, txn_of};
use crate::cleanup::Entry;
use crate::error::{self, NAME};
use crate::naming::{by_create, key_of, owner_of, predecessor_of, token_of};
use crate::session::Session;

impl EtcdBackend {
    /// The key of `request` on `session` (the one of an earlier attempt, or a new one) and
    /// its create revision if known; marks an attempt as in flight.
    pub(crate) fn entry_for(
        &self,
        request: &AcquireRequest,
        session: &Arc<Session>,
        prefix: &str,
    ) -> (String, Option<i64>) {
        let mut entries = self.entries();
        let fresh = || {
            let claim = self.inner.names.claim(prefix, session.lease_id);
            Entry {
                claim,
                session: session.clone(),
                create_revision: None,
                maybe_on_server: false,
                in_flight: false,
                predecessor: None,
            }
        };
        let entry = entries.entry(request.owner.clone()).or_insert_with(fresh);
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
    /// link), its put may still land, at any time, and the session's orphan sweep then comes
    /// for it. A lease the server no longer knows ends the session.
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
                    NAME,
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

    /// One acquisition attempt (see [`LockBackend::try_acquire`](lockkit_core::backend::LockBackend::try_acquire)).
    pub(crate) async fn attempt(&self, request: &AcquireRequest) -> Result<Attempt> {
        let started = Instant::now();
        let session = self.session_for(request.ttl).await?;
        let prefix = self.lock_prefix(&request.key);
        let (own, own_revision) = self.entry_for(request, &session, &prefix);
        let owner_digest = request.owner.digest_hex();
        let put = TxnOp::put(
            own.clone(),
            owner_digest.clone(),
            Some(PutOptions::new().with_lease(session.lease_id)),
        );
        // Right after the put the own key is the newest: it holds the lock when no key was
        // created before it, and otherwise the one just before it is the predecessor.
        let newest_two = TxnOp::get(prefix.clone(), Some(by_create(SortOrder::Descend, 2)));
        let mut otherwise = vec![
            TxnOp::get(own.clone(), None),
            TxnOp::get(prefix.clone(), Some(by_create(SortOrder::Ascend, 1))),
        ];
        if let Some(revision) = own_revision.filter(|_| request.wait) {
            otherwise.push(TxnOp::get(prefix.clone(), Some(predecessor_of(revision))));
        }
        let put_if = if request.wait {
            Compare::create_revision(own.clone(), CompareOp::Equal, 0)
        } else {
            // try_lock queues only on a free lock, so contention leaves nothing behind.
            Compare::create_revision(prefix.clone(), CompareOp::Equal, 0).with_prefix()
        };
        // After a wait the own key is normally still there, and then only reads decide: a
        // read-only txn of the same reads answers at one revision, linearizably, without the
        // raft write (a disk sync on a majority) that a txn holding a put costs even when the
        // put is not taken. Without the own key, the full txn queues it again.
        let mut read_only = own_revision.is_some() && request.wait;
        let full = Txn::new()
            .when([put_if])
            .and_then([put, newest_two])
            .or_else(otherwise.clone());
        let response = loop {
            let txn = if read_only {
                Txn::new().and_then(otherwise.clone())
            } else {
                full.clone()
            };
            let response = self.send_attempt(&session, &txn, !read_only).await?;
            let own_missing = || match response.op_responses().into_iter().next() {
                Some(TxnOpResponse::Get(get)) => get.kvs().is_empty(),
                _ => true,
            };
            if read_only && own_missing() {
                read_only = false;
                continue;
            }
            break response;
        };
        let put_taken = !read_only && response.succeeded();
        let revision = response.header().map_or(0, |h| h.revision());
        let mut reads = response.op_responses().into_iter().map(|op| match op {
            TxnOpResponse::Get(mut get) => get.take_kvs(),
            _ => Vec::new(),
        });
        let (own_revision, ours, predecessor) = if put_taken {
            let _put = reads.next();
            let mut newest = reads.next().unwrap_or_default().into_iter();
            let newest_is_own = newest.next().is_some_and(|kv| kv.key() == own.as_bytes());
            let predecessor = newest.next().map(|kv| (key_of(&kv), kv.create_revision()));
            (
                Some(revision),
                newest_is_own && predecessor.is_none(),
                predecessor,
            )
        } else {
            let own_kv = reads.next().and_then(|kvs| kvs.into_iter().next());
            if let Some(stale) = own_kv
                .as_ref()
                .filter(|kv| owner_of(kv.value()) != owner_digest.as_bytes())
            {
                return Err(self.move_off_stale_key(request, &session, &prefix, stale.value()));
            }
            let holder = reads.next().and_then(|kvs| kvs.into_iter().next());
            let predecessor = reads
                .next()
                .and_then(|kvs| kvs.into_iter().next())
                .map(|kv| (key_of(&kv), kv.create_revision()));
            let ours = holder.is_some_and(|kv| kv.key() == own.as_bytes());
            (own_kv.map(|kv| kv.create_revision()), ours, predecessor)
        };
        if let Some(entry) = self.entries().get_mut(&request.owner) {
            entry.in_flight = false;
            entry.maybe_on_server = own_revision.is_some();
            entry.create_revision = own_revision;
            entry.predecessor = predecessor.clone();
        }
        match own_revision {
            Some(own_revision) if ours => {
                // Re-verified: the own key was the lowest at one revision, on this session's
                // lease, and the session is still alive.
                if session.lost.is_cancelled() {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        NAME,
                        "the session was lost while acquiring; the next attempt starts a new one",
                    ));
                }
                Ok(Attempt::Granted(
                    Grant::new(token_of(own_revision), session.valid_from(started))
                        .with_handle(own)
                        .with_session(session.lost.clone()),
                ))
            }
            _ => {
                let mut contention = Contention::new();
                contention.revision = Some(revision);
                if let Some((predecessor, _)) = predecessor {
                    contention = contention.with_predecessor(predecessor, Some(revision));
                }
                Ok(Attempt::Contended(contention))
            }
        }
    }
}
