//! Redlock's renewals: one pipeline per node renewing every lease due, all nodes at once; a
//! lease is extended when a majority extended it, lost when more than N - majority nodes say
//! it is not ours (or it was held for `max_hold`), and an error otherwise. Its validity is
//! counted from the pipeline's bound, which grows with the batch.

use std::sync::Arc;
use std::time::Duration;

use lockkit_core::Result;
use lockkit_core::backend::{Lease, Renewal};
use redis::Value;

use super::fanout::NodeResult;
use super::{BACKEND, RedlockBackend};
use crate::error::unexpected;
use crate::scripts;

/// What a renewal pipeline may take per lease on top of the node timeout.
const RENEWAL_TIME_PER_LEASE: Duration = Duration::from_micros(20);

impl RedlockBackend {
    /// Renews `leases`: those past `max_hold` are lost, the others go to every node.
    pub(super) async fn renew_leases(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        let (expired, live): (Vec<usize>, Vec<usize>) =
            (0..leases.len()).partition(|&i| self.past_max_hold(&leases[i]));
        let live_leases: Vec<Lease> = live.iter().map(|&i| leases[i].clone()).collect();
        let mut renewed = if live_leases.is_empty() {
            Vec::new()
        } else {
            self.renew_on_all(&live_leases).await
        };
        let mut results: Vec<Option<Result<Renewal>>> = (0..leases.len()).map(|_| None).collect();
        for i in expired {
            results[i] = Some(Ok(Renewal::Lost));
        }
        for i in live.into_iter().rev() {
            results[i] = renewed.pop();
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(unexpected(BACKEND, "a renewal"))))
            .collect()
    }

    /// One pipeline per node renewing every lease, all nodes at once; per lease, how many
    /// nodes extended it, how many said it is not ours, and the failures.
    async fn renew_on_all(&self, leases: &[Lease]) -> Vec<Result<Renewal>> {
        let pipe = Arc::new(scripts::renew_pipeline(leases, self.config.fence_ttl, None));
        // A node runs the pipeline's scripts one after the other: 10,000 leases did not fit in
        // the 100 ms node timeout, and every renewal of the tick failed. The validity of the
        // answers is counted with the longer bound.
        let timeout = u32::try_from(leases.len())
            .ok()
            .and_then(|n| RENEWAL_TIME_PER_LEASE.checked_mul(n))
            .and_then(|batch| self.config.node_timeout.checked_add(batch))
            .unwrap_or(Duration::MAX);
        let replies = self
            .on_all(timeout, true, move |mut con| {
                let pipe = pipe.clone();
                async move { scripts::query_reloading(&pipe, &mut con).await }
            })
            .await;
        leases
            .iter()
            .enumerate()
            .map(|(i, lease)| {
                let answers: Vec<NodeResult<Value>> = replies
                    .iter()
                    .map(|node| match node {
                        Ok(values) => values
                            .get(i)
                            .cloned()
                            .ok_or_else(|| unexpected(BACKEND, "a renewal pipeline")),
                        Err(e) => Err(crate::error::repeat(e)),
                    })
                    .collect();
                let extended = answers
                    .iter()
                    .filter(|a| matches!(a, Ok(Value::Int(1))))
                    .count();
                let refused = answers
                    .iter()
                    .filter(|a| matches!(a, Ok(Value::Int(0))))
                    .count();
                if extended >= self.quorum() {
                    Ok(Renewal::Extended(lease.ttl().saturating_sub(timeout)))
                } else if refused > self.nodes.len() - self.quorum() {
                    Ok(Renewal::Lost)
                } else {
                    Err(self.quorum_error("renewing", extended, &answers))
                }
            })
            .collect()
    }

    /// Whether `lease` has been held for `max_hold` (then it is lost, not renewed).
    fn past_max_hold(&self, lease: &Lease) -> bool {
        self.config
            .max_hold
            .is_some_and(|max| lease.acquired_at().elapsed() >= max)
    }
}
