//! Redlock's operator operations: listing held locks node by node, and breaking a lock on
//! every node.

use futures_util::future::join_all;
use lockkit_core::backend::LockPage;
use lockkit_core::{Error, LockKey, Result};
use redis::Value;

use super::{BACKEND, RedlockBackend};
use crate::error::{from_redis, timed_out, unexpected};
use crate::listing;
use crate::scripts::{self, Keys, millis};

/// How long a listing waits for a node's scan: an operator's read, not on any lock's path,
/// so it may wait for a busy node longer than an acquisition does.
const LIST_BOUND: std::time::Duration = std::time::Duration::from_secs(1);

/// `node:scan:skipped` (or `node:scan` from before skips were counted).
fn parse_cursor(text: &str) -> Option<(usize, u64, usize)> {
    let mut parts = text.split(':');
    let node = parts.next()?.parse().ok()?;
    let scan = parts.next()?.parse().ok()?;
    let skipped = match parts.next() {
        Some(skipped) => skipped.parse().ok()?,
        None => 0,
    };
    parts.next().is_none().then_some((node, scan, skipped))
}

impl RedlockBackend {
    /// Scans one node at a time (the cursor is `node:scan-cursor:skipped`). A lock key found
    /// on a node is listed there unless an earlier node has it too (it was listed with that
    /// node), and only if a majority holds it
    /// ([`inspect`](lockkit_core::backend::LockBackend::inspect)). A node that does not answer
    /// within [`LIST_BOUND`] (or the node timeout, if longer) is skipped, since a held lock is
    /// on a majority of the nodes; but once more nodes were skipped than may fail, a lock may
    /// have been on none of the nodes scanned, and the listing fails with the error instead
    /// of answering with pages that may miss locks.
    pub(super) async fn list_page(
        &self,
        namespace: &str,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        lockkit_core::backend::validate_listing(namespace, prefix, limit)?;
        let (node, scan, mut skipped) = match cursor {
            None => (0, 0, 0),
            Some(text) => parse_cursor(text)
                .filter(|(node, _, _)| *node < self.nodes.len())
                .ok_or_else(|| {
                    Error::invalid_config(format!("{text:?} is not a redlock listing cursor"))
                })?,
        };
        let bound = self.config.node_timeout.max(LIST_BOUND);
        let mut con = self.nodes[node].connection.clone();
        let scanned = tokio::time::timeout(
            bound,
            listing::scan(&mut con, namespace, prefix, scan, limit),
        )
        .await;
        let scanned = match scanned {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(e)) => Err(from_redis(BACKEND, e)),
            Err(_) => Err(timed_out(BACKEND, "listing", bound)),
        };
        let (keys, next_scan) = match scanned {
            Ok(found) => found,
            Err(error) => {
                skipped += 1;
                if skipped > self.nodes.len() - self.quorum() {
                    return Err(error);
                }
                tracing::warn!(node = %self.nodes[node].addr, error = %error, "listing: skipping a node");
                (Vec::new(), 0)
            }
        };
        let next = match (next_scan, node + 1 < self.nodes.len()) {
            (0, true) => Some(format!("{}:0:{skipped}", node + 1)),
            (0, false) => None,
            (scan, _) => Some(format!("{node}:{scan}:{skipped}")),
        };
        let fresh = join_all(keys.into_iter().map(|key| async move {
            let seen = join_all(
                self.nodes[..node]
                    .iter()
                    .map(|earlier| self.exists_on(earlier.connection.clone(), &key)),
            )
            .await;
            (!seen.contains(&true)).then_some(key)
        }))
        .await;
        let fresh: Vec<LockKey> = fresh.into_iter().flatten().collect();
        let infos = join_all(
            fresh
                .iter()
                .map(|key| lockkit_core::backend::LockBackend::inspect(self, key)),
        )
        .await;
        let mut locks = Vec::with_capacity(fresh.len());
        for (key, info) in fresh.into_iter().zip(infos) {
            if let Some(info) = info? {
                locks.push((key, info));
            }
        }
        Ok(LockPage::new(locks, next))
    }

    /// Whether a node has the lock key; a node that does not answer counts as not having it
    /// (the lock may then be listed twice, which a listing allows).
    async fn exists_on(&self, mut con: redis::aio::ConnectionManager, key: &LockKey) -> bool {
        let lock = Keys::of(key).lock;
        let asked = tokio::time::timeout(
            self.config.node_timeout,
            redis::cmd("EXISTS").arg(lock).query_async::<i64>(&mut con),
        )
        .await;
        matches!(asked, Ok(Ok(1)))
    }

    /// Deletes the lock key on every node (not the fence counters) and wakes the waiters of
    /// every node. Held means: some node had the key. Fewer than a majority answering is an
    /// error: the lock may still be held on a majority.
    pub(super) async fn break_lock(&self, key: &LockKey) -> Result<bool> {
        let keys = Keys::of(key);
        let fence_ttl = millis(self.config.fence_ttl);
        let proposed = super::proposed_token();
        let replies = self
            .on_all(self.config.node_timeout, false, move |mut con| {
                let keys = keys.clone();
                async move {
                    scripts::classic()
                        .force_release
                        .key(&keys.release()[..4])
                        .arg("")
                        .arg(fence_ttl)
                        .arg(proposed)
                        .invoke_async::<Value>(&mut con)
                        .await
                }
            })
            .await;
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        if answered < self.quorum() {
            return Err(self.quorum_error("breaking the lock", answered, &replies));
        }
        let mut held = false;
        for reply in replies.iter().flatten() {
            match reply {
                Value::Int(1) => held = true,
                Value::Int(0) => {}
                _ => return Err(unexpected(BACKEND, "the force-release script")),
            }
        }
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_cursor;

    #[test]
    fn a_listing_cursor_carries_the_nodes_skipped() {
        assert_eq!(parse_cursor("2:17:1"), Some((2, 17, 1)));
        assert_eq!(parse_cursor("1:0"), Some((1, 0, 0)));
        assert_eq!(parse_cursor("1:0:2:3"), None);
        assert_eq!(parse_cursor("x:0"), None);
    }
}
