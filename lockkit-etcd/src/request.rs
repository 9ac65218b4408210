//! Requests to etcd: sending one again after a failure that allows it (within the request
//! timeout), and the transaction helpers every file uses.

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnResponse};
use lockkit_core::backend::Lease;
use lockkit_core::{ErrorKind, Result};

use crate::backend::EtcdBackend;
use crate::error;

/// The pause before sending a request again.
const RESEND_PAUSE: Duration = Duration::from_millis(10);

/// Which failures of a request [`EtcdBackend::send`] sends it again after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Only a failure before it reached any member: a request that may not be applied twice.
    IfNeverSent,
    /// Any failure a retry can cure (a broken connection, a member without a leader): a
    /// read, or a write whose guard makes a second application a no-op.
    IfRetryable,
}

impl Resend {
    fn allows(self, error: &etcd_client::Error) -> bool {
        match self {
            Resend::IfNeverSent => error::never_sent(error),
            Resend::IfRetryable => error::kind(error) == ErrorKind::Unavailable,
        }
    }
}

/// What [`EtcdBackend::send`] got.
pub(crate) struct Sent<T> {
    /// The last send's answer.
    pub(crate) answer: Result<T, etcd_client::Error>,
    /// A send before the last failed in a way that may have left it applied.
    pub(crate) resent: bool,
}

impl EtcdBackend {
    /// Sends one request, again within the request timeout after a failure `resend` allows
    /// (the balancer may pick a member that is down and refuses the connection; a
    /// connection may break under the request). `None` when the timeout passed.
    pub(crate) async fn send<T, Fut>(
        &self,
        resend: Resend,
        mut request: impl FnMut(Client) -> Fut,
    ) -> Option<Sent<T>>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + self.inner.config.request_timeout;
        let mut resent = false;
        let answer = async {
            loop {
                match request(self.client()).await {
                    Err(e)
                        if resend.allows(&e)
                            && tokio::time::Instant::now() + RESEND_PAUSE < deadline =>
                    {
                        resent |= !error::never_sent(&e);
                        tokio::time::sleep(RESEND_PAUSE).await;
                    }
                    answer => return answer,
                }
            }
        };
        let answer = tokio::time::timeout_at(deadline, answer).await.ok()?;
        Some(Sent { answer, resent })
    }

    /// [`send`](Self::send) of a request that may not be applied twice, with errors mapped
    /// for `what`.
    pub(crate) async fn call<T, Fut>(
        &self,
        what: &str,
        request: impl FnMut(Client) -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_with(Resend::IfNeverSent, what, request)
            .await
            .map(|sent| sent.0)
    }

    /// [`send`](Self::send) of a read, which may be sent again after any failure a retry can
    /// cure, with errors mapped for `what`.
    pub(crate) async fn read<T, Fut>(
        &self,
        what: &str,
        request: impl FnMut(Client) -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_with(Resend::IfRetryable, what, request)
            .await
            .map(|sent| sent.0)
    }

    /// [`send`](Self::send) with errors mapped for `what`: the answer, and whether a send
    /// before it may have been applied.
    pub(crate) async fn call_with<T, Fut>(
        &self,
        resend: Resend,
        what: &str,
        request: impl FnMut(Client) -> Fut,
    ) -> Result<(T, bool)>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        match self.send(resend, request).await {
            Some(Sent {
                answer: Ok(value),
                resent,
            }) => Ok((value, resent)),
            Some(Sent { answer: Err(e), .. }) => Err(error::map(what, e)),
            None => Err(error::timed_out(what, self.inner.config.request_timeout)),
        }
    }
}

/// A request that runs `txn`.
pub(crate) fn txn_of(
    txn: &Txn,
) -> impl FnMut(
    Client,
) -> std::pin::Pin<
    Box<dyn Future<Output = Result<TxnResponse, etcd_client::Error>> + Send>,
> + '_ {
    |mut client| {
        let txn = txn.clone();
        Box::pin(async move { client.txn(txn).await })
    }
}

/// The compares that hold while `lease` holds the lock at `key`: the key exists with the
/// grant's create revision (its fencing token). That names the grant alone: one transaction
/// created the key at that revision, for one owner, and a key deleted and put again under
/// the same name has a new one. The value is not compared: an election's leader adds its
/// proclaimed value to the owner digest there.
pub(crate) fn held_by(key: &str, lease: &Lease) -> Vec<Compare> {
    let token = i64::try_from(lease.fencing_token().get()).unwrap_or(-1);
    vec![Compare::create_revision(key, CompareOp::Equal, token)]
}
