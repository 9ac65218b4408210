//! Renewal checks on etcd: the session's keep-alive keeps every key of a session alive, so a
//! renewal only reads each lease's key back (with its create revision and owner) and answers
//! with what is left of the session lease.

use std::sync::Arc;
use std::time::Instant;

use etcd_client::{KeyValue, Txn, TxnOp, TxnOpResponse};
use lockkit_core::backend::{Lease, Renewal, runtime};
use lockkit_core::{Error, ErrorKind, Result};

use crate::backend::EtcdBackend;
use crate::error::BACKEND;
use crate::naming::owner_of;
use crate::request::txn_of;
use crate::session::Session;

/// etcd's default `--max-txn-ops`: the most operations one transaction may carry.
const MAX_TXN_OPS: usize = 128;

impl EtcdBackend {
    /// Every lease's key is read back in transactions of up to 128 reads (etcd's default
    /// `--max-txn-ops`), all sent at once: they travel side by side on the client's HTTP/2
    /// connection, so a tick is one round trip however many transactions it takes, where one
    /// after the other they would be one round trip per 128 leases (docs/measurements.md,
    /// "10,000 held locks, measured").
    pub(crate) async fn renew_batch(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        let sent_at = Instant::now();
        let checks: Vec<Option<(String, Arc<Session>)>> =
            leases.iter().map(|lease| self.local_check(lease)).collect();
        let reads: Vec<_> = checks
            .chunks(MAX_TXN_OPS)
            .map(|checks| {
                let reads: Vec<TxnOp> = checks
                    .iter()
                    .flatten()
                    .map(|(key, _)| TxnOp::get(key.clone(), None))
                    .collect();
                let backend = self.clone();
                // On lockkit's runtime, so that the transactions are all sent before the
                // first answer is awaited (and a dropped tick leaves only reads behind).
                runtime::spawn(async move { backend.read_keys(reads).await })
            })
            .collect();
        let mut answers: Vec<Result<Renewal>> = Vec::with_capacity(leases.len());
        for ((leases, checks), read) in leases
            .chunks(MAX_TXN_OPS)
            .zip(checks.chunks(MAX_TXN_OPS))
            .zip(reads)
        {
            let found = read.await.unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorKind::Backend,
                    BACKEND,
                    "checking held locks panicked",
                ))
            });
            let mut found = match found {
                Ok(found) => found.into_iter(),
                Err(e) => {
                    for _ in leases {
                        answers.push(Err(Error::new(e.kind(), BACKEND, e.message().to_owned())
                            .with_retryable(e.is_retryable())));
                    }
                    continue;
                }
            };
            for (lease, check) in leases.iter().zip(checks) {
                let Some((_, session)) = check else {
                    answers.push(Ok(Renewal::Lost));
                    continue;
                };
                let still_ours = found.next().flatten().is_some_and(|kv| {
                    kv.create_revision() == i64::try_from(lease.fencing_token().get()).unwrap_or(-1)
                        && kv.lease() == session.lease_id
                        && owner_of(kv.value()) == lease.owner().digest_hex().as_bytes()
                });
                answers.push(Ok(if still_ours {
                    Renewal::Extended(session.valid_from(sent_at))
                } else {
                    Renewal::Lost
                }));
            }
        }
        answers
    }

    /// The key and session of `lease`, as this backend's acquisitions know them, while its
    /// session is alive: `None` is a lease that is lost without asking the server.
    pub(crate) fn local_check(&self, lease: &Lease) -> Option<(String, Arc<Session>)> {
        if lease.session_alive() != Some(true) {
            return None;
        }
        let key = lease.handle()?;
        let pending = self.pending();
        let entry = pending.get(lease.owner())?;
        (entry.claim.key == key && !entry.session.lost.is_cancelled())
            .then(|| (entry.claim.key.clone(), entry.session.clone()))
    }

    /// The key-values of `reads` (get operations), in order: `None` for a missing key.
    async fn read_keys(&self, reads: Vec<TxnOp>) -> Result<Vec<Option<KeyValue>>> {
        if reads.is_empty() {
            return Ok(Vec::new());
        }
        let response = self
            .read("checking held locks", txn_of(&Txn::new().and_then(reads)))
            .await?;
        Ok(response
            .op_responses()
            .into_iter()
            .map(|op| match op {
                TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
                _ => None,
            })
            .collect())
    }
}
