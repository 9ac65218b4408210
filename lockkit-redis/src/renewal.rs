//! Renewals on one Redis server or a Sentinel primary: the leases due at one tick go out as
//! one pipeline of compare-and-`PEXPIRE` scripts (a permit's and a read-write lock's, the
//! semaphore's renew script), on the connection reserved for renewals, followed with
//! `min_replicas` by one `WAIT` for the whole batch.

use lockkit_core::backend::{Lease, Renewal};
use lockkit_core::{Error, ErrorKind, Result};
use redis::Value;

use crate::backend::RedisBackend;
use crate::error::{BACKEND, refused_in_pipeline, unexpected};
use crate::scripts::{self, millis};

impl RedisBackend {
    /// One pipelined round trip of compare-and-`PEXPIRE`s (plus `WAIT` with `min_replicas`).
    pub(crate) async fn renew_batch(&self, leases: &[Lease]) -> Result<Vec<Renewal>> {
        let mut pipe =
            scripts::renew_pipeline(leases, self.config.fence_ttl, Some(&self.proclaimed));
        if self.config.min_replicas > 0 {
            pipe.cmd("WAIT")
                .arg(self.config.min_replicas)
                .arg(millis(self.config.replica_timeout));
        }
        let pipe = &pipe;
        let mut replies = self
            .primary
            .request_on(
                "renewing",
                |epoch| epoch.renewals.clone(),
                |mut con| async move {
                    let replies = scripts::query_reloading(pipe, &mut con).await?;
                    scripts::primary_moved(&replies).map_or(Ok(replies), Err)
                },
            )
            .await?;
        if self.config.min_replicas > 0 {
            let acked = match replies.pop() {
                Some(Value::Int(n)) => usize::try_from(n).unwrap_or(0),
                _ => return Err(unexpected(BACKEND, "WAIT")),
            };
            let need = self.config.min_replicas as usize;
            if acked < need {
                return Err(Error::new(
                    ErrorKind::QuorumNotReached { got: acked, need },
                    BACKEND,
                    format!("a renewal reached {acked} replica(s), min_replicas = {need}"),
                )
                .with_retryable(true));
            }
        }
        if replies.len() != leases.len() {
            return Err(unexpected(BACKEND, "a renewal pipeline"));
        }
        replies
            .iter()
            .zip(leases)
            .map(|(reply, lease)| match (scripts::renewed(reply), reply) {
                (Some(true), _) => Ok(Renewal::Extended(lease.ttl())),
                (Some(false), _) => {
                    self.proclaimed.forget(lease);
                    Ok(Renewal::Lost)
                }
                (None, Value::ServerError(e)) => Err(refused_in_pipeline("renewal", e)),
                (None, _) => Err(Error::new(
                    ErrorKind::Backend,
                    BACKEND,
                    format!("renewal failed: {reply:?}"),
                )
                .with_retryable(true)),
            })
            .collect()
    }
}
